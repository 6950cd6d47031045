"""``sae train|eval|features``: sparse autoencoders on a hook point.

``sae train`` keeps the last ``--heldout`` share of its text's windows out of training and records the split
in the SAE (``cfg.training``: the source, the windows read, the positions left out); ``sae eval`` and
``sae features --latent`` read those held-out windows by default, and refuse windows of the training text
(``--allow-training-text`` measures them anyway, with a warning). The checks that need no model — the hook
name and the context size against the model's config, the latent index against the SAE, a texts path —
answer before the model and the corpus load.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from . import DEFAULT_MODEL, add_model_args, add_output_args, count, emit, load_model, number

if TYPE_CHECKING:
    import torch

    from ..analysis.features.sae import SAE

SOURCES = ("brown", "generated", "facts")


def _eval_text_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--texts",
        default=None,
        help="text to read: 'brown', 'generated', 'facts' or a .txt file/folder (default: the windows the SAE's "
        "training held out, as its training record says; brown from window 0 for an SAE without one)",
    )
    p.add_argument(
        "--context", type=count(2), default=None, help="tokens per window, BOS first (default: the SAE's training's)"
    )
    p.add_argument("--windows", type=count(1), default=256, help="windows to read (default 256)")
    p.add_argument("--start", type=count(0), default=0, help="skip this many windows of that text first (default 0)")
    p.add_argument(
        "--allow-training-text",
        action="store_true",
        help="measure windows the SAE was trained on (refused otherwise; warned with this flag)",
    )
    ratio = p.add_mutually_exclusive_group()
    ratio.add_argument(
        "--outlier-ratio",
        type=number(1.0),
        default=None,
        help="leave out positions whose norm exceeds this × their window's median, as BOS is (default: the "
        "ratio the SAE was trained with)",
    )
    ratio.add_argument("--keep-outliers", action="store_true", help="leave out no norm outliers (BOS only)")


def add_dictionary_args(p: argparse.ArgumentParser, unit: str) -> None:
    """The flags every sparse-dictionary trainer takes (``sae train``, ``graph train``): its kind and size, its
    optimiser's batch and step, and the shuffling store; ``unit`` names its dictionary entries in the help."""
    from ..analysis.features.sae import ARCHITECTURES

    p.add_argument("--architecture", choices=list(ARCHITECTURES), default="topk")
    p.add_argument("--expansion", type=count(1), default=8, help=f"{unit} per input dimension (default 8)")
    p.add_argument("--k", type=count(1), default=None, help=f"active {unit} per token, top-k kinds only (default 32)")
    p.add_argument("--batch-size", type=count(1), default=4096, help="activations per step (default 4096)")
    p.add_argument("--lr", type=number(0.0, open_min=True), default=None, help="Adam step (default by size)")
    p.add_argument(
        "--buffer-tokens", type=count(1), default=65_536, help="activations each shuffling store holds (default 65536)"
    )


def register(sub: argparse._SubParsersAction) -> None:

    sae = sub.add_parser("sae", help="sparse autoencoders: train, evaluate, view latents")
    cmds = sae.add_subparsers(dest="sae_command", metavar="SAE_COMMAND", required=True)

    p = cmds.add_parser(
        "train",
        help="train an SAE on a hook point and save it (SAELens's layout)",
        description="Train an SAE on the activations at --hook over the windows of --texts, the last --heldout "
        "share of them kept out of training for `sae eval`; the split is recorded in the SAE.",
    )
    add_model_args(p)
    p.add_argument("--hook", required=True, help="hook point, e.g. blocks.3.hook_resid_pre")
    p.add_argument("--save", required=True, metavar="DIR", help="folder to write the SAE to")
    p.add_argument(
        "--texts", default="brown", help="'brown', 'generated', 'facts' or a .txt file/folder (default brown)"
    )
    p.add_argument("--generated", type=count(1), default=64, help="--texts generated: samples drawn (default 64)")
    p.add_argument("--context", type=count(2), default=64, help="tokens per window, BOS first (default 64)")
    p.add_argument(
        "--heldout",
        type=number(0.0, 0.99),
        default=0.1,
        help="share of the text's windows (the last ones) kept out of training for `sae eval` (default 0.1)",
    )
    add_dictionary_args(p, "latents")
    p.add_argument("--l1", type=number(0.0), default=5.0, help="L1 coefficient of a relu SAE (default 5)")
    p.add_argument("--tokens", type=count(1), default=2_000_000, help="training tokens (default 2,000,000)")
    p.add_argument(
        "--epochs", type=count(1), default=1, help="passes over the text (later ones from memory; default 1)"
    )
    p.add_argument(
        "--outlier-ratio",
        type=number(1.0),
        default=None,
        help="leave out positions whose norm exceeds this × their window's median (massive activations; "
        "SmolLM2: 10), as BOS is left out (default: none left out)",
    )
    p.add_argument("--forward-batch", type=count(1), default=32, help="windows per forward pass (default 32)")
    p.add_argument("--checkpoint", default=None, metavar="DIR", help="resumable checkpoints here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")
    p.set_defaults(func=train, outputs={"save": ("--save", "dir"), "checkpoint": ("--checkpoint", "dir")})

    p = cmds.add_parser(
        "eval",
        help="L0, variance explained, CE loss recovered, dead/dense latents (on held-out text)",
        description="Measure an SAE on windows its training held out (by default: the ones its training record "
        "names), with the positions its training left out (BOS, norm outliers) left out of the metrics.",
    )
    _sae_model_args(p)
    p.add_argument("sae", metavar="SAE_DIR", help="an SAE folder (ours or SAELens's)")
    _eval_text_args(p)
    p.add_argument("--quiet", action="store_true", help="no progress bar or progress lines")
    add_output_args(p, figure=False)
    p.set_defaults(func=evaluate)

    p = cmds.add_parser("features", help="a latent's view, or latents by promoted token or by prompt")
    _sae_model_args(p)
    p.add_argument("sae", metavar="SAE_DIR", help="an SAE folder (ours or SAELens's)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--latent", type=count(0), help="show this latent's view (top contexts: held-out windows)")
    which.add_argument("--token", help="latents that promote this token (e.g. ' Paris')")
    which.add_argument("--prompt", help="latents most active at this prompt's last token")
    p.add_argument("--top", type=count(1), default=10, help="contexts or latents to show (default 10)")
    _eval_text_args(p)
    add_output_args(p)
    p.set_defaults(func=features)


def _sae_model_args(p: argparse.ArgumentParser) -> None:
    """``--model``/``--device``/``--dtype`` of a command that reads an SAE file: the model defaults to the one
    the SAE's ``cfg.json`` records (its ``model_name``)."""
    add_model_args(p)
    p.set_defaults(model=None)
    for action in p._actions:
        if action.dest == "model":
            action.help = "model name or path (default: the model the SAE's cfg.json records, else gpt2-facts)"


# ---------------------------------------------------------------------- checks before the model loads
def _check_texts(texts: str | None) -> None:
    """Refuse a --texts path that does not exist (the corpus names are checked when read)."""
    if texts is not None and texts not in SOURCES and not Path(texts).expanduser().exists():
        raise FileNotFoundError(f"--texts {texts!r} is not {', '.join(SOURCES)}, nor an existing .txt file or folder")


def check_before_loading(args: argparse.Namespace, hook: str, context: int | None) -> None:
    """Refuse, before the model loads, a ``hook`` the model does not have (KeyError naming the closest
    names) or a ``context`` longer than its context, where the model's config can be read without its
    weights (:func:`gpt2_interp.model.loading.model_config`); otherwise the load checks them."""
    import torch

    from ..io.tokenizer import Tokenizer
    from ..model.hooked_gpt2 import HookedGPT2
    from ..model.loading import model_config

    cfg = model_config(args.model)
    if cfg is None:
        return
    with torch.device("meta"):  # the module tree alone: its hook points, no weights
        skeleton = HookedGPT2(cfg, tokenizer=Tokenizer())  # the hook names need no vocabulary: the bare base class
    skeleton.hook_points(hook)
    if context is not None and context > cfg.n_ctx:
        raise ValueError(f"--context {context} exceeds {cfg.name}'s context of {cfg.n_ctx} tokens")


def _load_sae_checked(args: argparse.Namespace) -> SAE:
    """The SAE of ``args.sae``, checked before the model loads: its hook against the model's config, the
    latent index against its width, the texts path and the context."""
    from ..analysis.features.sae import SAE

    _check_texts(args.texts)
    sae = SAE.load(args.sae)
    recorded = sae.cfg.model_name
    if args.model is None:  # the model the SAE was trained on (its cfg.json), else the default
        args.model = recorded or DEFAULT_MODEL
    args.recorded_model = recorded
    latent = getattr(args, "latent", None)
    if latent is not None and latent >= sae.cfg.d_sae:
        raise IndexError(f"--latent {latent}: this SAE has {sae.cfg.d_sae} latents (0 … {sae.cfg.d_sae - 1})")
    record = sae.cfg.training
    context = args.context or (int(record["context_size"]) if record else None)
    try:
        check_before_loading(args, sae.cfg.hook_name, context)
    except (KeyError, ValueError) as e:
        raise type(e)(_naming_recorded(e, args)) from None
    return sae


def _naming_recorded(e: Exception, args: argparse.Namespace) -> str:
    """``e``'s message, with the model the SAE records named when ``--model`` chose another."""
    msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
    recorded = getattr(args, "recorded_model", "")
    return (
        f"{msg} (the SAE was trained on {recorded}: --model {recorded})" if recorded and recorded != args.model else msg
    )


def _load_model_for(args: argparse.Namespace, sae: SAE):
    """The model of ``args`` with ``sae`` checked against it (hook, base weights, activation width); a refusal
    names the model the SAE records."""
    model = load_model(args)
    try:
        sae.check_model(model)
        _check_width(model, sae)
    except ValueError as e:
        raise ValueError(_naming_recorded(e, args)) from None
    return model


def _check_width(model, sae: SAE) -> None:
    """Refuse (ValueError) an SAE whose input width is not the activation width at its hook point (one token
    run as far as the hook)."""
    import torch

    from ..analysis.features.sae_train import run_to_hook

    with torch.no_grad():
        width = run_to_hook(model, model.to_tokens("a")[:, :1], sae.cfg.hook_name)[0, 0].numel()
    if width != sae.cfg.d_in:
        raise ValueError(
            f"{model.cfg.name}'s activations at {sae.cfg.hook_name} have width {width}; this SAE reads {sae.cfg.d_in}"
        )


# ---------------------------------------------------------------------- commands
def train(args: argparse.Namespace) -> int:
    from ..analysis.features.sae_train import SAETrainConfig, split_windows, train_sae

    _check_texts(args.texts)
    check_before_loading(args, args.hook, args.context)
    cfg = SAETrainConfig(
        hook_name=args.hook,
        expansion=args.expansion,
        architecture=args.architecture,
        k=args.k,
        l1_coefficient=args.l1,
        tokens=args.tokens,
        batch_size=args.batch_size,
        lr=args.lr,
        context_size=args.context,
        buffer_tokens=args.buffer_tokens,
        forward_batch=args.forward_batch,
        epochs=args.epochs,
        outlier_ratio=args.outlier_ratio,
        seed=args.seed,
    )
    model = load_model(args)
    windows, record = split_windows(
        model, args.texts, args.context, args.heldout, seed=args.seed, n_generated=args.generated
    )
    sae, log = train_sae(
        model, cfg, windows=windows, record=record, checkpoint=args.checkpoint, progress=False if args.quiet else None
    )
    path = sae.save(args.save)
    tr = sae.cfg.training or {}
    rule = f", positions above {cfg.outlier_ratio:g} × their window's median norm" if cfg.outlier_ratio else ""
    print(
        f"{cfg.architecture} SAE ({sae.cfg.d_sae} latents) at {cfg.hook_name} of {model.cfg.name} saved to {path}: "
        f"{log.steps} steps, {log.tokens} tokens from windows 0–{tr.get('windows_read', 0) - 1} of {args.texts} "
        f"({args.context} tokens each; the last {record['heldout_windows']} windows held out for `sae eval`). "
        f"Last training FVU {log.fvu[-1]:.3f} (variance explained {1 - log.fvu[-1]:.3f}, on its last logged batch "
        f"of {cfg.batch_size} activations; left out: {log.bos} BOS positions, {log.outliers} norm outliers{rule})"
    )
    return 0


def _windows(model, sae: SAE, args: argparse.Namespace) -> tuple[torch.Tensor, str]:
    """The windows to measure or show, and what they are: by default those the SAE's training held out;
    with ``--texts``, that text's windows, refused where they overlap the SAE's training text."""
    from ..analysis.features.sae_train import (
        heldout_windows,
        source_name,
        text_source,
        token_windows,
        trained_overlap,
    )

    record = sae.cfg.training
    ctx = args.context or (int(record["context_size"]) if record else 64)
    first, n = args.start, args.windows
    if args.texts is None and record is not None:
        held = heldout_windows(model, record, ctx)
        chosen = held[first : first + n]
        if not len(chosen):
            raise ValueError(f"--start {first}: the SAE's held-out text has only {len(held)} windows of {ctx} tokens")
        where = (
            f"windows {first}–{first + len(chosen) - 1} of the {len(held)}"
            if first
            else f"{len(chosen)} of the {len(held)}"
        )
        return chosen, f"held out: {where} windows of {ctx} tokens of {record['texts']} that training never read"
    texts = args.texts if args.texts is not None else "brown"
    same = record is not None and source_name(texts) == record["texts"]
    seed = int(record["seed"]) if same and record else 0
    n_generated = int(record.get("n_generated", 64)) if same and record else 64
    all_windows = token_windows(model, text_source(model, texts, n_generated=n_generated, seed=seed), ctx)
    chosen = all_windows[first : first + n]
    if not len(chosen):
        raise ValueError(f"--start {first}: {texts} gives only {len(all_windows)} windows of {ctx} tokens")
    span = f"windows {first}–{first + len(chosen) - 1} of {texts} ({ctx} tokens each)"
    if record is None:
        warnings.warn(
            f"this SAE records no training text (trained elsewhere, or before training records existed): {span} "
            "may be text it was trained on",
            stacklevel=2,
        )
        return chosen, f"{span}; the SAE records no training text"
    overlap = trained_overlap(model, record, texts, ctx, first, len(chosen))
    if not overlap:
        return chosen, f"{span}; none trained on"
    read = min(int(record.get("windows_read", record["train_windows"])), int(record["train_windows"]))
    msg = (
        f"{overlap} of the {len(chosen)} {span} hold text the SAE was trained on (the first {read} windows of "
        f"{record['context_size']} tokens of {record['texts']}); without --texts the held-out windows are read"
    )
    if not args.allow_training_text:
        raise ValueError(msg + ", or --allow-training-text measures these anyway")
    warnings.warn(msg + "; measured anyway (--allow-training-text): not a held-out measure", stacklevel=2)
    return chosen, f"{span}; {overlap} of them TRAINED ON"


def _outlier_ratio(sae: SAE, args: argparse.Namespace) -> float | None:
    """``--outlier-ratio``, else none with ``--keep-outliers``, else the ratio the SAE was trained with."""
    if args.keep_outliers:
        return None
    if args.outlier_ratio is not None:
        return float(args.outlier_ratio)
    ratio = (sae.cfg.training or {}).get("outlier_ratio")
    return None if ratio is None else float(ratio)


def evaluate(args: argparse.Namespace) -> int:
    from ..analysis.features.sae_eval import evaluate_sae

    sae = _load_sae_checked(args)
    model = _load_model_for(args, sae)
    sae = sae.to(model.device)
    windows, text = _windows(model, sae, args)
    r = evaluate_sae(
        model, sae, windows, outlier_ratio=_outlier_ratio(sae, args), progress=False if args.quiet else None
    )
    r.text = text
    return emit(args, r, data=r.summary())


def features(args: argparse.Namespace) -> int:
    from ..analysis.features.sae_views import feature_view, latents_firing, latents_promoting

    sae = _load_sae_checked(args)
    model = _load_model_for(args, sae)
    sae = sae.to(model.device)
    if args.token is not None:
        return emit(args, latents_promoting(model, sae, args.token, args.top))
    if args.prompt is not None:
        return emit(args, latents_firing(model, sae, args.prompt, args.top))
    windows, _ = _windows(model, sae, args)
    return emit(args, feature_view(model, sae, args.latent, windows, top=args.top))
