"""``graph train|build``: attribution graphs (:mod:`gpt2_interp.graphs`).

``graph train`` trains one transcoder per layer on a text's windows, keeping the last ``--heldout`` share of
them out of training (recorded in the transcoders' config), and reports each layer's variance explained on
those. ``graph build`` builds a prompt's graph from a transcoder folder, prunes it, and writes its JSON and
its interactive page. The checks that need no model (the prompt, the folder and its files' digests, the
output paths) answer before the model loads; transcoders trained on other weights are refused by their
fingerprint.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from . import DEFAULT_MODEL, add_model_args, count, load_model, number
from .features import _check_texts, add_dictionary_args


def register(sub: argparse._SubParsersAction) -> None:

    graph = sub.add_parser("graph", help="attribution graphs: train transcoders, build a prompt's graph and its page")
    cmds = graph.add_subparsers(dest="graph_command", metavar="GRAPH_COMMAND", required=True)

    p = cmds.add_parser(
        "train",
        help="train a transcoder for every layer and save them (circuit-tracer's layout)",
        description="Train one transcoder per layer (MLP input → MLP output) on the windows of --texts, the last "
        "--heldout share of them kept out of training; print each layer's variance explained on those.",
    )
    add_model_args(p)
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write the transcoders to")
    p.add_argument("--steps", type=count(1), default=2000, help="optimiser steps of each layer (default 2000)")
    p.add_argument(
        "--texts",
        default=None,
        help="'brown', 'generated', 'facts' or a .txt file/folder (default: facts for gpt2-facts, its training "
        "text; brown otherwise)",
    )
    p.add_argument("--context", type=count(2), default=64, help="tokens per window, BOS first (default 64)")
    p.add_argument(
        "--heldout",
        type=number(0.0, 0.99),
        default=0.1,
        help="share of the windows (the last ones) kept out of training and measured (default 0.1)",
    )
    p.add_argument("--eval-windows", type=count(1), default=64, help="held-out windows measured (default 64)")
    add_dictionary_args(p, "features")
    p.add_argument("--d-sae", type=count(1), default=None, help="features per layer (overrides --expansion)")
    p.add_argument("--skip", action="store_true", help="add a linear skip W_skip to each transcoder")
    p.add_argument(
        "--cross-layer",
        action="store_true",
        help="train one cross-layer transcoder (each layer's features write to every later MLP output; the "
        "paper's loss) instead of one transcoder per layer",
    )
    p.add_argument("--epochs", type=count(1), default=1, help="passes over the windows (default 1)")
    p.add_argument("--forward-batch", type=count(1), default=32, help="windows per forward pass (default 32)")
    p.add_argument("--checkpoint", default=None, metavar="DIR", help="resumable checkpoints here")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=train, outputs={"out": ("--out", "dir"), "checkpoint": ("--checkpoint", "dir")})

    p = cmds.add_parser(
        "build",
        help="a prompt's attribution graph from saved transcoders: pruned, saved as JSON and as a page",
        description="Build the attribution graph of --prompt's next token with the transcoders in --transcoders, "
        "prune it by influence on the logits, and write its JSON (--out) and its interactive page (--html).",
    )
    add_model_args(p)
    p.set_defaults(model=None)
    for action in p._actions:
        if action.dest == "model":
            action.help = "model name or path (default: the model the transcoders record, else gpt2-facts)"
    p.add_argument("--transcoders", required=True, metavar="DIR", help="a folder `graph train` wrote")
    p.add_argument("--prompt", required=True, help="the text whose next token the graph explains")
    p.add_argument("--out", required=True, help="the graph's JSON file")
    p.add_argument("--html", default=None, help="also write the graph's interactive page here")
    p.add_argument("--node-threshold", type=number(0.0, 1.0), default=0.8, help="share of influence kept (0.8)")
    p.add_argument("--edge-threshold", type=number(0.0, 1.0), default=0.98, help="share of edge score kept (0.98)")
    p.add_argument("--no-prune", action="store_true", help="save the whole graph (the page draws its largest edges)")
    p.add_argument("--max-logits", type=count(1), default=10, help="logit nodes at most (default 10)")
    p.add_argument(
        "--logit-prob", type=number(0.0, 1.0, open_min=True), default=0.95, help="their total probability (0.95)"
    )
    p.add_argument("--batch-size", type=count(1), default=64, help="targets per backward pass (default 64)")
    p.add_argument("--top-logits", type=count(1), default=5, help="tokens a feature promotes/suppresses (5)")
    p.add_argument(
        "--contexts",
        type=count(0),
        default=0,
        help="top-activating contexts per kept feature, from the held-out windows the transcoders' training "
        "record names, or --texts (default 0: none)",
    )
    p.add_argument("--texts", default=None, help="the contexts' text: 'brown', 'generated', 'facts' or a .txt path")
    p.add_argument("--windows", type=count(1), default=128, help="windows the contexts are read from (default 128)")
    p.set_defaults(func=build, outputs={"out": ("--out", "file"), "html": ("--html", "file")})


def _default_texts(args: argparse.Namespace) -> str:
    return args.texts if args.texts is not None else ("facts" if args.model == DEFAULT_MODEL else "brown")


def train(args: argparse.Namespace) -> int:
    from ..analysis.features.sae_train import heldout_windows, split_windows
    from ..graphs.clt import CLTTrainConfig, train_cross_layer_transcoder
    from ..graphs.transcoder import TranscoderTrainConfig, evaluate_transcoders, train_transcoders

    texts = _default_texts(args)
    _check_texts(texts)
    cfg = (CLTTrainConfig if args.cross_layer else TranscoderTrainConfig)(
        d_sae=args.d_sae,
        expansion=args.expansion,
        architecture=args.architecture,
        k=args.k,
        skip=args.skip,
        tokens=args.steps * args.batch_size,
        batch_size=args.batch_size,
        lr=args.lr,
        context_size=args.context,
        buffer_tokens=args.buffer_tokens,
        forward_batch=args.forward_batch,
        epochs=args.epochs,
        seed=args.seed,
    )
    model = load_model(args)
    if args.context > model.cfg.n_ctx:
        raise ValueError(f"--context {args.context} exceeds {model.cfg.name}'s context of {model.cfg.n_ctx} tokens")
    windows, record = split_windows(model, texts, args.context, args.heldout, seed=args.seed)
    have = len(windows) * (args.context - (model.tokenizer.bos_id is not None)) * args.epochs
    if args.cross_layer:
        assert isinstance(cfg, CLTTrainConfig)
        transcoders: Any = train_cross_layer_transcoder(model, cfg, windows, checkpoint=args.checkpoint)
        transcoders.cfg.training = record
        n, d_sae = transcoders.n_layers, transcoders.cfg.d_sae
        what = f"{cfg.architecture} cross-layer transcoder of {n} layers ({d_sae} features per layer"
    else:
        transcoders = train_transcoders(model, cfg, windows, checkpoint=args.checkpoint)
        for t in transcoders:
            t.cfg.training = record
        what = f"{len(transcoders)} {cfg.architecture} transcoders ({transcoders[0].d_sae} features each"
    path = transcoders.save(args.out)
    short = f" (the text gives {have} tokens × epochs: at most {have // args.batch_size})" if have < cfg.tokens else ""
    print(
        f"{what}{', with skips' if args.skip else ''}) of {model.cfg.name} saved to {path}: {args.steps} steps of "
        f"{args.batch_size} activations per layer{short}, from {len(windows)} windows of {texts} "
        f"({args.context} tokens each)"
    )
    if record["heldout_windows"]:
        held = heldout_windows(model, record)[: args.eval_windows]
        m = evaluate_transcoders(model, transcoders, held)
        print(f"on {m.tokens} held-out tokens ({len(held)} windows): layer, variance explained, L0, dead share")
        for L, (ve, l0, dead) in enumerate(zip(m.variance_explained, m.l0, m.dead)):
            print(f"  {L:>3}  {ve:8.3f}  {l0:6.2f}  {dead:6.3f}")
    return 0


def _contexts_windows(args: argparse.Namespace, model: Any, record: dict[str, Any] | None) -> Any:
    """The windows the contexts are read from: ``--texts``'s (cut at the training's context size), else the
    held-out windows of the transcoders' training record (transcoders without any need ``--texts``)."""
    from ..analysis.features.sae_train import heldout_windows, text_source, token_windows

    if args.texts is None:
        if record is None or not record.get("heldout_windows"):
            raise ValueError(
                "--contexts: these transcoders' training held out no windows (or records none); name a text "
                "with --texts"
            )
        return heldout_windows(model, record)[: args.windows]
    ctx = int(record["context_size"]) if record is not None else min(64, model.cfg.n_ctx)
    return token_windows(model, text_source(model, args.texts), ctx)[: args.windows]


def build(args: argparse.Namespace) -> int:
    from ..graphs.annotate import annotate_graph
    from ..graphs.attribution import AttributionConfig, attribute
    from ..graphs.prune import prune_graph
    from ..graphs.transcoder import CONFIG_FILE, LEGACY_CONFIG_FILE, TranscoderSet

    if not args.prompt.strip():
        raise ValueError("--prompt is empty; give the text whose next token the graph explains")
    folder = Path(args.transcoders).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"--transcoders {args.transcoders}: no such folder; give one `graph train --out` wrote")
    if not any((folder / name).is_file() for name in (CONFIG_FILE, LEGACY_CONFIG_FILE)):
        raise FileNotFoundError(f"--transcoders {args.transcoders}: no {CONFIG_FILE}; not a folder `graph train` wrote")
    if args.texts is not None:
        _check_texts(args.texts)
    cfg = AttributionConfig(
        max_n_logits=args.max_logits, desired_logit_prob=args.logit_prob, batch_size=args.batch_size
    )
    transcoders = TranscoderSet.load(folder)  # digests checked before the model loads
    recorded = transcoders[0].cfg.model_name
    if args.model is None:
        args.model = recorded or DEFAULT_MODEL
    model = load_model(args)
    try:
        transcoders.check_model(model)
    except ValueError as e:
        other = f" (they were trained on {recorded}: --model {recorded})" if recorded and recorded != args.model else ""
        raise ValueError(f"--transcoders {args.transcoders}: {e}{other}") from None
    transcoders.to(model.device)
    tokens = model.to_tokens(args.prompt)[0]
    if len(tokens) > model.cfg.n_ctx:
        raise ValueError(f"--prompt is {len(tokens)} tokens; {model.cfg.name}'s context is {model.cfg.n_ctx}")
    graph = attribute(model, transcoders, tokens, cfg)
    if not args.no_prune:
        graph = prune_graph(graph, args.node_threshold, args.edge_threshold)
    windows = _contexts_windows(args, model, transcoders[0].cfg.training) if args.contexts else None
    graph = annotate_graph(
        graph, model, transcoders, windows, n_logits=args.top_logits, n_contexts=max(args.contexts, 1)
    )
    graph.save(args.out)
    kept = graph.n_features if graph.node_mask is None else int(graph.node_mask[: graph.n_features].sum())
    edges = int((graph.adjacency != 0).sum()) if graph.edge_mask is None else int(graph.edge_mask.sum())
    scores = (
        ""
        if graph.replacement_score is None
        else f"; replacement score {graph.replacement_score:.3f}, completeness score {graph.completeness_score:.3f}"
    )
    logits = ", ".join(
        f"{t!r} {float(p):.3f}" for t, p in zip(graph.logit_strs or [], graph.logit_probabilities.tolist())
    )
    print(
        f"graph of {args.prompt!r} on {model.cfg.name}: {graph.n_features} active features, {kept} kept, {edges} "
        f"edges{scores}; logits {logits}"
    )
    print(f"graph saved to {args.out}")
    if args.html:
        graph.view().save(args.html)
        print(f"page saved to {args.html}")
    return 0
