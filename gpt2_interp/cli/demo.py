"""``demo``: the main job."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="walk through every tool on one fact; writes a report folder")
    p.add_argument("--model", default="gpt2-facts", help="model name or path (default: gpt2-facts)")
    p.add_argument("--device", default=None)
    p.add_argument("--out", default="demo-report", help="report folder (default: demo-report)")
    p.add_argument("--force", action="store_true", help="overwrite an existing report folder")
    p.add_argument("--samples", type=int, default=10, help="noise samples of the causal trace")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    try:
        run_demo(args.model, args.out, force=args.force, device=args.device, samples=args.samples)
    except FileExistsError as e:
        raise ValueError(str(e)) from None
    return 0
