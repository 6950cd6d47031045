"""``gpt2-interp``: a thin command line over the API (parse, call, print/save).

Each area registers its subcommands in its own module (``model_cmds``, ``reading``,
``causal``, ``editing``, ``demo``) through ``register(subparsers)``; each
subcommand sets ``func(args)``. Commands that produce a result object print it through
:func:`emit` (table, or ``--json``; figure with ``--out``), declared by :func:`add_output_args`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import sys
from typing import Any, Callable

AREAS = ("model_cmds", "reading", "causal", "editing", "demo")
DEFAULT_MODEL = "gpt2-facts"


def add_model_args(p: argparse.ArgumentParser) -> None:
    """``--model``, ``--device``, ``--dtype``: every command that runs a model takes these."""
    p.add_argument("--model", default=DEFAULT_MODEL, help="model name or path (default: the embedded gpt2-facts)")
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1, mps … (default: cpu)")
    p.add_argument("--dtype", default=None, choices=["fp32", "bf16", "fp16"], help="weights dtype (default fp32)")


def load_model(args: argparse.Namespace):
    from .. import load

    return load(args.model, device=args.device, dtype=args.dtype)


def add_output_args(p: argparse.ArgumentParser, figure: bool = True) -> None:
    """``--json`` (and ``--out`` for a figure): how :func:`emit` shows a command's result."""
    if figure:
        p.add_argument("--out", default=None, help="save the figure here (.png/.pdf/.svg)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")


def emit(args: argparse.Namespace, result: Any, text: "str | Callable[[], str] | None" = None,
         data: Any = None) -> int:
    """Show a command's result: save its figure (``--out``), then print ``data`` or the result as
    JSON (``--json``) or else ``text`` (default ``result.table()``). Returns the exit code 0."""
    out = getattr(args, "out", None)
    if out:
        result.save_plot(out)
    if getattr(args, "json", False):
        print(json.dumps(data, indent=1) if data is not None else result.to_json())
        return 0
    print(text() if callable(text) else (result.table() if text is None else text))
    if out:
        print(f"figure saved to {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpt2-interp", description="Take GPT-2 apart and put it back together.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for area in AREAS:
        try:
            module = importlib.import_module(f".{area}", __name__)
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{area}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    from ..core import distributed

    # under torchrun: one process group for the run, each rank on its own GPU (or the CPU with gloo);
    # rank 0 alone prints and writes, the others stay quiet (their errors still reach stderr)
    launched = distributed.init_from_env()
    if launched and getattr(args, "device", "unset") is None:
        args.device = str(distributed.local_device())
    quiet = launched and not distributed.is_main()
    try:
        with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
            if quiet and hasattr(args, "out"):
                args.out = None
            return args.func(args) or 0
    except (ValueError, KeyError, FileNotFoundError, IndexError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        where = f" (rank {distributed.rank()})" if launched else ""
        print(f"gpt2-interp {args.command}{where}: error: {msg}", file=sys.stderr)
        return 2
    finally:
        if launched:
            distributed.shutdown()


if __name__ == "__main__":
    sys.exit(main())
