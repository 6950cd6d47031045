"""``demo``: the main job."""

from __future__ import annotations

import argparse

from . import add_model_args, count


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="walk through every tool on one fact; writes a report folder")
    add_model_args(p)
    p.add_argument(
        "--out",
        default="demo-report",
        help="report folder (default: demo-report); re-running refreshes the report there",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="also overwrite files named like the report's (report.md, results.json, logit_lens.png, "
        "causal_trace.png, index.html) that the demo did not write; nothing else is touched",
    )
    p.add_argument("--samples", type=count(1), default=10, help="noise samples of the causal trace")
    p.add_argument(
        "--stats-tokens",
        type=count(1),
        default=None,
        help="tokens of ROME's key statistics (default: the model's ROME setting; for a real model they "
        "are sampled from the model itself, slow the first time, then cached)",
    )
    p.set_defaults(func=run, outputs={"out": ("--out", "dir")})


def run(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    run_demo(
        args.model,
        args.out,
        force=args.force,
        device=args.device,
        samples=args.samples,
        dtype=args.dtype,
        stats_tokens=args.stats_tokens,
    )
    return 0
