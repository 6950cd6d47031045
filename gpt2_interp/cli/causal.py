"""``patch`` (activation patching sweep) and ``trace`` (ROME causal tracing)."""

from __future__ import annotations

import argparse

from . import add_model_args, add_output_args, count, emit, load_model, number


def _ints(text: str | None) -> list[int] | None:
    return None if text is None else [int(x) for x in text.split(",") if x.strip()]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("patch", help="activation patching sweep: which (layer, position/head) restores the answer",
                       description="Patch clean activations into the corrupted run (denoise) or the reverse (noise), "
                                   "one component at a time, batched.")
    add_model_args(p)
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
    p.add_argument("--batch-size", type=count(1), default=None, help="patched runs per forward (default: by memory)")
    add_output_args(p)
    p.set_defaults(func=patch_cmd)

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


def patch_cmd(args: argparse.Namespace) -> int:
    from ..analysis import patching as pt

    model = load_model(args)
    kind = args.metric if args.metric != "auto" else ("logit_diff" if args.wrong else "prob")
    if kind == "logit_diff":
        if not args.wrong:
            raise ValueError("--metric logit_diff needs --wrong (the corrupted answer)")
        metric = pt.logit_diff(args.answer, args.wrong)
    elif kind == "prob":
        metric = pt.prob(args.answer)
    else:
        metric = pt.kl_to()
    clean = args.clean[0] if len(args.clean) == 1 else args.clean
    corrupted = args.corrupted[0] if len(args.corrupted) == 1 else args.corrupted
    r = pt.patch(model, clean, corrupted, metric, hook=args.hook, layers=_ints(args.layers), positions=_ints(args.positions),
                 direction=args.direction, normalize=args.normalize, batch_size=args.batch_size, progress=True)
    return emit(args, r)


def trace_cmd(args: argparse.Namespace) -> int:
    from ..analysis import tracing as tr

    model = load_model(args)
    kinds = tr.KINDS if args.kind == "all" else (args.kind,)
    traces = tr.causal_trace_all(model, args.prompt, args.subject, args.target, kinds=kinds, noise=args.noise,
                                 samples=args.samples, window=args.window, seed=args.seed, progress=True)
    return emit(args, traces if len(kinds) > 1 else traces.traces[0])
