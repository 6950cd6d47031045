"""``gpt2-interp``: a thin command line over the API (parse, call, print/save).

Each area registers its subcommands in its own module (``model_cmds``, ``reading``, ``probing``,
``causal``, ``circuits``, ``graphs``, ``editing``, ``demo``, ``experiments``, ``view``) through
``register(subparsers)``; each subcommand sets ``func(args)``. Commands that produce a result object print it
through :func:`emit` (table, or ``--json``; figure with ``--out``), declared by :func:`add_output_args`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any, NoReturn

from .. import __version__
from ..core.checks import check_number

AREAS = (
    "model_cmds",
    "reading",
    "probing",
    "steering",
    "features",
    "causal",
    "circuits",
    "graphs",
    "editing",
    "demo",
    "experiments",
    "view",
)
DEFAULT_MODEL = "gpt2-facts"


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is ONE line on stderr (exit 2), naming the command and pointing to --help."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def count(minimum: int = 1) -> Callable[[str], int]:
    """An argparse type: an integer ≥ ``minimum`` (counts such as --top, -n, --samples)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    parse.__name__ = "count"
    return parse


def number(
    minimum: float | None = None, maximum: float | None = None, open_min: bool = False
) -> Callable[[str], float]:
    """An argparse type: a finite float within [minimum, maximum] (``open_min``: > minimum), by the library's
    one number rule (:func:`~gpt2_interp.core.checks.check_number`)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        try:
            return check_number(value, "the value", minimum, maximum, low_open=open_min)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = "number"
    return parse


def int_list(text: str) -> list[int]:
    """An argparse type: comma-separated integers such as ``0,3,-1`` (every list-of-int flag, so that a
    bad element is reported as ``argument --layers: … 'a' is not an integer``)."""
    parts = [v.strip() for v in text.split(",")]
    if not any(parts):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers such as 0,3,5, got {text!r}")
    out = []
    for v in parts:
        try:
            out.append(int(v))
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated integers such as 0,3,5, got {text!r} ({v!r} is not an integer)"
            ) from None
    return out


FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".svgz", ".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff", ".webp")


def check_output_path(path: str, flag: str, kind: str = "file") -> None:
    """Refuse, before any work, an output path that cannot be written: ``kind`` ``"file"`` (its
    folder is created if missing: the nearest existing one must be writable), ``"figure"`` (a file
    in an existing folder, with a suffix matplotlib writes) or ``"dir"`` (a folder, created if missing);
    the writability test is :func:`~gpt2_interp.core.checks.check_writable`'s."""
    from pathlib import Path

    from ..core.checks import check_writable

    p = Path(path).expanduser()
    if kind == "figure":
        if p.suffix and p.suffix.lower() not in FIGURE_SUFFIXES:
            raise ValueError(
                f"{flag} {path}: a figure is saved as {', '.join(FIGURE_SUFFIXES[:3])} (by suffix), not {p.suffix!r}"
            )
        if not p.exists() and not p.parent.is_dir():
            raise ValueError(f"{flag} {path}: the folder {p.parent} does not exist")
    check_writable(path, flag, "dir" if kind == "dir" else "file")


def check_outputs(args: argparse.Namespace) -> None:
    """Check every output path the command was given (``args.outputs``: dest → (flag, kind); by
    default ``--out`` a figure and ``--save`` a file) before the command does any work."""
    outputs = getattr(args, "outputs", None) or {"out": ("--out", "figure"), "save": ("--save", "file")}
    for dest, (flag, kind) in outputs.items():
        value = getattr(args, dest, None)
        if isinstance(value, str) and value:
            check_output_path(value, flag, kind)


def device_arg(text: str) -> str:
    """An argparse type: a device this machine has (checked before the model is loaded)."""
    from ..core.devices import resolve_device

    try:
        resolve_device(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def add_model_args(p: argparse.ArgumentParser) -> None:
    """``--model``, ``--device``, ``--dtype``: every command that runs a model takes these."""
    from ..core.devices import DTYPES

    p.add_argument("--model", default=DEFAULT_MODEL, help="model name or path (default: the embedded gpt2-facts)")
    p.add_argument("--device", default=None, type=device_arg, help="cpu, cuda, cuda:1, mps … (default: cpu)")
    p.add_argument("--dtype", default=None, choices=list(DTYPES), help="weights dtype (default fp32)")


def load_model(args: argparse.Namespace):
    from .. import load

    return load(args.model, device=args.device, dtype=args.dtype)


def add_output_args(p: argparse.ArgumentParser, figure: bool = True) -> None:
    """``--json`` (and ``--out`` for a figure): how :func:`emit` shows a command's result."""
    if figure:
        p.add_argument("--out", default=None, help="save the figure here (.png/.pdf/.svg)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")


def emit(args: argparse.Namespace, result: Any, text: str | Callable[[], str] | None = None, data: Any = None) -> int:
    """Show a command's result: save its figure (``--out``), then print ``data`` or the result as
    JSON (``--json``: compact, one line per top-level field, so big results stay greppable and
    streamable) or else ``text`` (default ``result.table()``). Returns the exit code 0."""
    out = getattr(args, "out", None)
    if out:
        result.save_plot(out)
    if getattr(args, "json", False):
        print(json_lines(data if data is not None else result.to_dict()))
        return 0
    print(text() if callable(text) else (result.table() if text is None else text))
    if out:
        print(f"figure saved to {out}")
    return 0


def json_lines(data: Any) -> str:
    """Compact JSON: a dict prints one top-level key per line (each value on one line, no indentation);
    still one valid JSON document."""
    if not isinstance(data, dict) or not data:
        return json.dumps(data, separators=(",", ":"))
    rows = [f"{json.dumps(str(k))}:{json.dumps(v, separators=(',', ':'))}" for k, v in data.items()]
    return "{" + ",\n".join(rows) + "}"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="gpt2-interp",
        description="Take GPT-2 apart and put it back together.",
        epilog="Errors print one line; add --debug (anywhere) for the Python traceback.",
    )
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
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


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(
        f"gpt2-interp: warning: {str(message).splitlines()[0] if str(message) else category.__name__}", file=sys.stderr
    )


def error_message(e: BaseException) -> str:
    """One line for an exception: its message (KeyError's without quotes), with the type for
    errors that are not plainly about the input."""
    msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
    msg = " ".join(str(msg).split()) or type(e).__name__
    if not isinstance(e, (ValueError, KeyError, FileNotFoundError, IndexError, TypeError, FileExistsError)):
        msg = f"{type(e).__name__}: {msg}"
    return msg


def main(argv: list[str] | None = None) -> int:
    """Run the CLI. Every error is one line on stderr and a non-zero exit (2: bad input, 1: other
    failures, 130: interrupted); ``--debug`` (anywhere on the line) or GPT2_INTERP_DEBUG=1 re-raises
    to show the traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("GPT2_INTERP_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    with warnings.catch_warnings():
        if not debug:
            warnings.showwarning = _one_line_warning
        return _run(args, debug)


def _run(args: argparse.Namespace, debug: bool) -> int:
    """Check the launch environment and the output paths, set up the process group under torchrun,
    run the command; every failure, from the first check on, is one line on stderr per rank."""
    from ..core import distributed

    launched = False
    where = f" (rank {os.environ['RANK']})" if os.environ.get("RANK") else ""
    try:
        distributed.check_launch_env()  # before the process group: a bad value is one line, not a traceback
        check_outputs(args)  # before the work: a path that cannot be written is refused now, not after training
        # under torchrun: one process group for the run, each rank on its own GPU (or the CPU with gloo);
        # rank 0 alone prints and writes, the others stay quiet (their errors still reach stderr)
        launched = distributed.init_from_env()
        if launched and getattr(args, "device", "unset") is None:
            args.device = str(distributed.local_device())
        quiet = launched and not distributed.is_main()
        with contextlib.redirect_stdout(io.StringIO()) if quiet else contextlib.nullcontext():
            if quiet and hasattr(args, "out"):
                args.out = None
            return args.func(args) or 0
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"gpt2-interp {args.command}{where}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if debug:
            raise
        print(
            f"gpt2-interp {args.command}{where}: error: {error_message(e)} (--debug shows the traceback)",
            file=sys.stderr,
        )
        return (
            2 if isinstance(e, (ValueError, KeyError, FileNotFoundError, IndexError, TypeError, FileExistsError)) else 1
        )
    finally:
        if launched:
            distributed.shutdown()


if __name__ == "__main__":
    sys.exit(main())
