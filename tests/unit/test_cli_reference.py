"""The command-line reference page (docs/getting-started/cli.md) lists every command the parser has: each
subcommand, and each subcommand of a command that has its own (``sae train|eval|features``), begins a row
of its table, so a new command cannot be left off the page."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from gpt2_interp.cli import build_parser

PAGE = Path(__file__).resolve().parents[2] / "docs" / "getting-started" / "cli.md"


def commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every leaf command of ``parser`` as its words (``("sae", "eval")``), in the parser's order."""
    found: list[tuple[str, ...]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += commands(sub, (*prefix, name)) or [(*prefix, name)]
    return found


def rows() -> list[str]:
    """The command each row of the page's table shows, after ``gpt2-interp`` (``sae eval my-sae …``)."""
    return re.findall(r"^\| `gpt2-interp ([^`]*)`", PAGE.read_text(), re.M)


def is_documented(command: tuple[str, ...], shown: list[str]) -> bool:
    """Some row's command starts with ``command``'s words."""
    words = " ".join(command)
    return any(row == words or row.startswith(words + " ") for row in shown)


def test_the_parser_has_the_commands_this_test_knows_of():
    found = commands(build_parser())
    assert ("sae", "train") in found and ("steer",) in found and ("demo",) in found and len(found) > 20
    assert not is_documented(("sae", "merge"), rows()) and not is_documented(("sa",), rows())


def test_every_command_of_the_parser_begins_a_row_of_the_reference_page():
    shown = rows()
    missing = [" ".join(c) for c in commands(build_parser()) if not is_documented(c, shown)]
    assert not missing, f"docs/getting-started/cli.md has no row for: {', '.join(missing)}"
