"""``patch`` (activation patching sweep) and ``trace`` (ROME causal tracing)."""

from __future__ import annotations

import argparse

from . import add_model_args, add_output_args, emit, load_model


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
    p.add_argument("--batch-size", type=int, default=None, help="patched runs per forward (default: by memory)")
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
    p.add_argument("--noise", default="3.0", help="noise std as a multiple of std(W_E), e.g. 3 or 3σ (gpt2-facts' "
                   "vocabulary is mostly untrained, so std(W_E) is small there: try 7, or --noise-abs 0.17)")
    p.add_argument("--noise-abs", type=float, default=None, help="absolute noise std (overrides --noise)")
    p.add_argument("--samples", type=int, default=10)
    p.add_argument("--window", type=int, default=None,
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
    lines = [f"{r.direction} patching of {r.hook}, metric {r.metric}: clean {r.clean_metric:.4g}, corrupted "
             f"{r.corrupted_metric:.4g}{' (values normalised: 0 = corrupted, 1 = clean)' if r.normalized else ''}; "
             "largest effects:"]
    for idx, v in r.top(8):
        parts = [r.layer_labels[idx[0]]]
        for name, i in zip(r.index_names[1:], idx[1:]):
            parts.append(repr(r.position_labels[i]) if name == "pos" else r.head_labels[i])
        lines.append(f"  {' '.join(parts):<28} {v:+.4f}  ({v - r.baseline:+.4f})")
    return emit(args, r, "\n".join(lines))


def trace_cmd(args: argparse.Namespace) -> int:
    from ..analysis import tracing as tr

    model = load_model(args)
    kw = dict(noise=args.noise, noise_abs=args.noise_abs, samples=args.samples, window=args.window, seed=args.seed, progress=True)
    kinds = tr.KINDS if args.kind == "all" else (args.kind,)
    traces = [tr.causal_trace(model, args.prompt, args.subject, args.target, kind=k, **kw) for k in kinds]
    result = tr.TraceSet(traces) if len(traces) > 1 else traces[0]
    t0 = traces[0]
    lines = [f"{args.prompt!r} → {t0.target!r}: clean p = {t0.clean_score:.4f}, corrupted p = {t0.corrupted_score:.4f} "
             f"(noise std {t0.noise_std:.4g}, {t0.samples} samples)"]
    for t in traces:
        tok_, layer, score = t.peak()
        lines.append(f"  {t.kind:<6} peak: restoring {tok_!r} at {layer} gives p = {score:.4f} "
                     f"(indirect effect {score - t.corrupted_score:+.4f})")
    return emit(args, result, "\n".join(lines))
