"""``run``: run a study through the one runner (``gpt2-interp run --list``; ``--studies DIR`` adds a study folder)."""

from __future__ import annotations

import argparse
import sys

from . import add_model_args, count


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run an experiment (the analyses behind the findings) with provenance",
        description="Run a registered experiment and write result.json, provenance.json, its tables "
        "and figures to OUT/NAME/MODEL[/TAG]. `gpt2-interp run --list` lists them; "
        "`gpt2-interp run NAME --help-settings` lists an experiment's settings. Studies are found in the folders "
        "given with --studies, then in $GPT2_INTERP_STUDIES, ./analyses and the source checkout's analyses/.",
    )
    p.add_argument("name", nargs="?", help="the experiment (see --list)")
    p.add_argument("--list", action="store_true", help="list the experiments and exit")
    p.add_argument(
        "--studies",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of study modules to look in first (repeatable)",
    )
    p.add_argument("--help-settings", action="store_true", help="list the experiment's settings (--set KEY=VALUE)")
    add_model_args(p)
    p.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the experiment's config (repeatable; lists as a,b,c; none for None)",
    )
    p.add_argument("--quick", action="store_true", help="the small version run by the test suite")
    p.add_argument(
        "--out",
        default="results",
        help="results root (default: ./results)",
    )
    p.add_argument("--tag", default=None, help="a sub-folder for a variant of the run (default: 'quick' with --quick)")
    p.add_argument("--threads", type=count(1), default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--render", action="store_true", help="only redraw the tables and figures of the saved result")
    p.set_defaults(func=run, outputs={"out": ("--out", "dir")})


def _settings(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"--set takes KEY=VALUE, got {pair!r}")
        out[key.strip()] = value
    return out


def run(args: argparse.Namespace) -> int:
    from ..experiments import ExperimentResult, get, load_all, render, result_dir, run_experiment

    if args.list:
        for name, exp in sorted(load_all(args.studies).items()):
            print(f"{name:<24} {exp.summary}")
        return 0
    if not args.name:
        raise ValueError("name an experiment (gpt2-interp run --list shows them)")
    exp = get(args.name, args.studies)
    if args.help_settings:
        print(f"{exp.name}: {exp.summary}\nsettings (--set KEY=VALUE):\n{exp.config.describe()}")
        return 0
    tag = args.tag if args.tag is not None else ("quick" if args.quick else None)
    if args.render:
        d = result_dir(args.out, exp.name, args.model, tag)
        for path in render(ExperimentResult.load(d), d):
            print(f"wrote {path}")
        return 0
    result = run_experiment(
        exp.name,
        args.model,
        quick=args.quick,
        settings=_settings(args.settings),
        out=args.out,
        tag=tag,
        threads=args.threads,
        device=args.device,
        dtype=args.dtype,
        progress=not args.quiet,
        argv=["gpt2-interp", *sys.argv[1:]],
        studies=args.studies,
    )
    print(result.table())
    d = result_dir(args.out, exp.name, result.model, tag)
    print(f"wrote {d} ({result.provenance['time']['wall_seconds']} s)")
    return 0
