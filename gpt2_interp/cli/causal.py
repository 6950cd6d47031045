"""``patch`` (activation patching sweep), ``attribute`` (its gradient estimate: AtP, AtP*, IG) and
``trace`` (ROME causal tracing)."""

from __future__ import annotations

import argparse

from . import add_model_args, add_output_args, count, emit, load_model, number


def _ints(text: str | None) -> list[int] | None:
    return None if text is None else [int(x) for x in text.split(",") if x.strip()]


def _add_patch_args(p: argparse.ArgumentParser) -> None:
    """The arguments ``patch`` and ``attribute`` share: prompts, metric, hook, cells, direction."""
    p.add_argument("--clean", required=True, nargs="+", help="clean prompt(s)")
    p.add_argument("--corrupted", required=True, nargs="+", help="corrupted prompt(s), same token count as each clean one")
    p.add_argument("--answer", required=True, help="the clean answer token, e.g. ' Paris'")
    p.add_argument("--wrong", default=None, help="the corrupted answer token, e.g. ' Rome' (metric: logit difference)")
    p.add_argument("--metric", choices=["auto", "logit_diff", "prob", "kl"], default="auto",
                   help="auto: logit_diff with --wrong, else prob")
    p.add_argument("--hook", default="resid_pre", help="family (resid_pre, attn_out, mlp_out, z, pattern, …) or full hook name")
    p.add_argument("--layers", default=None, help="comma-separated layers (default all)")
    p.add_argument("--positions", default=None, help="comma-separated positions (default all, one by one)")
    p.add_argument("--direction", choices=["denoise", "noise"], default="denoise")
    p.add_argument("--normalize", action="store_true", help="0 = corrupted metric, 1 = clean metric")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("patch", help="activation patching sweep: which (layer, position/head) restores the answer",
                       description="Patch clean activations into the corrupted run (denoise) or the reverse (noise), "
                                   "one component at a time, batched.")
    add_model_args(p)
    _add_patch_args(p)
    p.add_argument("--batch-size", type=count(1), default=None, help="patched runs per forward (default: by memory)")
    add_output_args(p)
    p.set_defaults(func=patch_cmd)

    p = sub.add_parser("attribute", help="estimate a patching sweep from gradients (AtP, AtP*, integrated gradients)",
                       description="Estimate every cell of a patching sweep from a few forward and backward passes "
                                   "(attribution patching), optionally verifying the top cells by exact patching.")
    add_model_args(p)
    _add_patch_args(p)
    p.add_argument("--method", choices=["atp", "atp*", "ig"], default="atp*",
                   help="atp: one gradient; atp*: QK fix for q/k and GradDrop ranking; ig: integrated gradients")
    p.add_argument("--ig-steps", type=count(1), default=5, help="points on the interpolation path for --method ig")
    p.add_argument("--heads", default=None, help="comma-separated heads for per-head hooks (default all)")
    p.add_argument("--verify", type=count(0), default=0, metavar="K",
                   help="patch the estimate's top 2K cells and K random controls exactly; print the verified top K")
    p.add_argument("--batch-size", type=count(1), default=None, help="prompt pairs per pass (default all)")
    add_output_args(p)
    p.set_defaults(func=attribute_cmd)

    p = sub.add_parser("trace", help="ROME causal trace: where a fact is recalled (tokens × layers)",
                       description="Noise the subject's embeddings, restore one clean state per (token, layer), "
                                   "score the target's probability.")
    add_model_args(p)
    p.add_argument("prompt")
    p.add_argument("--subject", required=True, help="the subject as it appears in the prompt")
    p.add_argument("--target", default=None, help="target token (default: the clean top-1)")
    p.add_argument("--kind", choices=["hidden", "mlp", "attn", "all"], default="hidden",
                   help="restore hidden states, MLP or attention outputs; all = ROME's three panels")
    p.add_argument("--noise", type=number(0.0, open_min=True), default=None, help="absolute std of the subject-embedding noise "
                   "(default: ROME's rule, 3 × the std of the subject tokens' embeddings)")
    p.add_argument("--samples", type=count(1), default=10)
    p.add_argument("--window", type=count(1), default=None,
                   help="layers restored together for mlp/attn (default: ROME's 10 of 48 layers, scaled to the depth)")
    p.add_argument("--seed", type=int, default=0)
    add_output_args(p)
    p.set_defaults(func=trace_cmd)


def _metric(args: argparse.Namespace):
    from ..analysis import patching as pt

    kind = args.metric if args.metric != "auto" else ("logit_diff" if args.wrong else "prob")
    if kind == "logit_diff":
        if not args.wrong:
            raise ValueError("--metric logit_diff needs --wrong (the corrupted answer)")
        metric = pt.logit_diff(args.answer, args.wrong)
    elif kind == "prob":
        metric = pt.prob(args.answer)
    else:
        metric = pt.kl_to()
    return metric


def _prompts(args: argparse.Namespace) -> tuple:
    return (args.clean[0] if len(args.clean) == 1 else args.clean,
            args.corrupted[0] if len(args.corrupted) == 1 else args.corrupted)


def patch_cmd(args: argparse.Namespace) -> int:
    from ..analysis import patching as pt

    model = load_model(args)
    clean, corrupted = _prompts(args)
    r = pt.patch(model, clean, corrupted, _metric(args), hook=args.hook, layers=_ints(args.layers),
                 positions=_ints(args.positions), direction=args.direction, normalize=args.normalize,
                 batch_size=args.batch_size, progress=True)
    return emit(args, r)


def attribute_cmd(args: argparse.Namespace) -> int:
    from ..analysis import attribution as at

    model = load_model(args)
    clean, corrupted = _prompts(args)
    r = at.attribute(model, clean, corrupted, _metric(args), hook=args.hook, method=args.method, ig_steps=args.ig_steps,
                     layers=_ints(args.layers), positions=_ints(args.positions), heads=_ints(args.heads),
                     direction=args.direction, normalize=args.normalize, batch_size=args.batch_size, progress=True)
    if not args.verify:
        return emit(args, r)
    v = r.verify(k=args.verify, progress=True)
    # with --out the figure is the verification (estimate vs exact); --json gives both
    return emit(args, v, r.table() + "\n\n" + v.table(), data={**r.to_dict(), "verification": v.to_dict()} if args.json else None)


def trace_cmd(args: argparse.Namespace) -> int:
    from ..analysis import tracing as tr

    model = load_model(args)
    kinds = tr.KINDS if args.kind == "all" else (args.kind,)
    traces = tr.causal_trace_all(model, args.prompt, args.subject, args.target, kinds=kinds, noise=args.noise,
                                 samples=args.samples, window=args.window, seed=args.seed, progress=True)
    return emit(args, traces if len(kinds) > 1 else traces.traces[0])
