"""Text tables with a header row: every column named, columns two spaces apart.

Results print their tables through :func:`format_table`, so a table always opens with a row naming
its columns (and their units) and every row has one cell per column: a cell never holds two
spaces in a row outside a quoted token, so the columns can be read back by splitting on them.
"""

from __future__ import annotations

from collections.abc import Sequence


def format_table(
    header: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool] | None = None, indent: str = "  "
) -> list[str]:
    """The header row and the rows, each column padded to its widest cell (right-aligned where
    ``right[i]``, e.g. numbers), two spaces between columns, trailing space trimmed.

    >>> format_table(["layer", "p"], [["L0", "0.25"]], right=[False, True])
    ['  layer     p', '  L0     0.25']
    """
    for r in rows:
        if len(r) != len(header):
            raise ValueError(f"a table row has {len(r)} cells for {len(header)} columns {list(header)}: {list(r)}")
    right = [False] * len(header) if right is None else list(right)
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return (indent + "  ".join(c.rjust(w) if rt else c.ljust(w) for c, w, rt in zip(cells, widths, right))).rstrip()

    return [line(header)] + [line(r) for r in rows]


def markdown_rule(align: str) -> str:
    """The rule under a markdown table's header: one cell per character of ``align``, ``l`` (left, ``---``)
    or ``r`` (right, ``---:``).

    >>> markdown_rule("lr").split("|")
    ['', '---', '---:', '']
    """
    if not align or set(align) - {"l", "r"}:
        raise ValueError(f"align must be a string of 'l' and 'r', one per column, got {align!r}")
    return "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"


__all__ = ["format_table", "markdown_rule"]
