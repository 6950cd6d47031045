"""``steer``: build a difference-of-means direction from contrast pairs, then generate with it or measure it."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from . import add_model_args, add_output_args, count, emit, load_model, number


def float_list(text: str) -> list[float]:
    """An argparse type: comma-separated finite numbers such as ``0,0.1,0.5``."""
    out = []
    for v in text.split(","):
        try:
            x = float(v)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated numbers such as 0,0.1,0.5, got {text!r} ({v.strip()!r} is not a number)"
            ) from None
        if not math.isfinite(x):
            raise argparse.ArgumentTypeError(f"expected finite numbers, got {v.strip()!r}")
        out.append(x)
    return out


def register(sub: argparse._SubParsersAction) -> None:
    from ..analysis.features.concepts import CONCEPTS

    p = sub.add_parser(
        "steer",
        help="steer with a difference-of-means direction: generate with it, or measure it over scales",
        description="The direction is mean(positive) − mean(negative) of the residual stream after --layer, over "
        "built-in contrast pairs (--concept) or a file of them (--pairs: one 'positive<TAB>negative' per line). "
        "With --prompt, greedy continuations without and with the direction at --scale; with --scales, the "
        "measured curve: P(target words) after held-out prompts, loss and KL drift on Brown passages, and the best "
        "scale within --max-loss-change (or that none raises the target within it).",
    )
    add_model_args(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--concept", choices=list(CONCEPTS), help="built-in contrast pairs, prompts and target words")
    src.add_argument("--pairs", metavar="FILE", help="contrast pairs, one 'positive<TAB>negative' per line")
    p.add_argument("--layer", type=int, default=None, help="steer after this block (default: n_layer // 3)")
    p.add_argument(
        "--position",
        choices=["last", "mean"],
        default="last",
        help="read each text's last token (default, as the steering study and steering-vectors) or its mean",
    )
    p.add_argument("--normalize", action="store_true", help="unit-norm direction (scales are then absolute norms)")
    p.add_argument("--prompt", action="append", default=None, help="a prompt to continue (repeatable)")
    p.add_argument("--scale", type=number(), default=1.0, help="multiple of the direction added (default 1)")
    p.add_argument("--max-new-tokens", type=count(1), default=20, help="tokens to generate (default 20)")
    p.add_argument("--scales", type=float_list, default=None, help="measure the curve at these scales, e.g. 0,0.1,0.2")
    p.add_argument("--target", nargs="+", default=None, help="target tokens for the curve (default: the concept's)")
    p.add_argument("--eval-prompts", metavar="FILE", help="held-out prompts for the curve, one per line")
    p.add_argument("--unrelated", type=count(1), default=16, help="Brown passages for loss and KL (default 16)")
    p.add_argument(
        "--max-loss-change",
        type=number(0, open_min=True),
        default=0.05,
        help="the fluency budget for the best scale: largest relative rise of the loss (default 0.05)",
    )
    add_output_args(p)
    p.set_defaults(func=steer)


def read_pairs(path: str) -> list[tuple[str, str]]:
    """Contrast pairs from a file of ``positive<TAB>negative`` lines (blank lines skipped)."""
    pairs = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not all(s.strip() for s in parts):
            raise ValueError(f"{path}:{i}: expected 'positive<TAB>negative', got {line!r:.80}")
        pairs.append((parts[0], parts[1]))
    if not pairs:
        raise ValueError(f"{path} holds no contrast pairs")
    return pairs


def steer(args: argparse.Namespace) -> int:
    from ..analysis.features.concepts import CONCEPTS, single_tokens
    from ..analysis.features.steering import mean_difference, steering_curve
    from ..io.corpora import brown_texts
    from ..model.steer import Steer

    if args.prompt is None and args.scales is None:
        raise ValueError("give --prompt (generate with the direction) or --scales (measure it), or both")
    model = load_model(args)
    pairs, prompts, words = CONCEPTS[args.concept] if args.concept else (read_pairs(args.pairs), None, None)
    layer = model.check_layer(args.layer if args.layer is not None else model.cfg.n_layer // 3)
    at = f"blocks.{layer}.hook_resid_post"
    v = mean_difference(model, [a for a, _ in pairs], [b for _, b in pairs], at, args.position, args.normalize)
    what = f"difference of means ({args.position}) over {len(pairs)} pairs at {at}, norm {float(v.norm()):.3g}"
    if args.prompt:
        plain = model.generate(args.prompt, max_new_tokens=args.max_new_tokens, do_sample=False)
        steered = model.generate(
            args.prompt, max_new_tokens=args.max_new_tokens, do_sample=False, steer=Steer(v, at, args.scale)
        )
        print(f"steering {model.cfg.name} with the {what}, scale {args.scale:g}, greedy")
        for a, b in zip(plain, steered):
            print(f"  unsteered: {a!r}\n  steered:   {b!r}")
    if args.scales is None:
        return 0
    if args.eval_prompts:
        prompts = [x for x in Path(args.eval_prompts).read_text().splitlines() if x.strip()]
    targets = args.target or (single_tokens(model, words) if words else None)
    if not prompts or not targets:
        raise ValueError("with --pairs, the curve needs --target words and --eval-prompts FILE")
    texts = brown_texts()[:: max(1, 500 // args.unrelated)][: args.unrelated]
    r = steering_curve(
        model, v, at, args.scales, prompts, targets, texts, method=f"difference of means ({args.position})"
    )
    return emit(args, r, lambda: f"{r.table()}\n\n{r.finding(args.max_loss_change)}")
