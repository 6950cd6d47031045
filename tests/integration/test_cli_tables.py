"""Every table the CLI prints names its columns: a header row, then rows with one cell per column.

Each reading, probing and causal command runs on the embedded model (gpt2-facts, small settings);
the test finds the header row by its column names and reads the rows under it back by splitting on
two or more spaces (quoted tokens kept whole), so a row with a cell more or less than the header
names, or a table without its header, fails.
"""

from __future__ import annotations

import re

import pytest

from gpt2_interp.cli import main

QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


def cells(line: str) -> list[str]:
    """The cells of a table line: split on runs of ≥ 2 spaces, quoted tokens (which may hold spaces) kept whole."""
    return re.split(r"\s{2,}", QUOTED.sub("Q", line).strip())


def table_rows(text: str, header: list[str]) -> list[list[str]]:
    """The rows under every header row ``header`` in ``text`` (up to a blank line or a line indented
    less than the header); asserts the header is there and each row has one cell per column."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if re.split(r"\s{2,}", line.strip()) == header]
    assert starts, f"no header row {header} in:\n{text}"
    out = []
    for i in starts:
        indent = len(lines[i]) - len(lines[i].lstrip())
        rows = []
        for line in lines[i + 1 :]:
            if not line.strip() or len(line) - len(line.lstrip()) < indent:
                break
            rows.append(cells(line))
        assert rows, f"header {header} has no rows under it"
        for r in rows:
            assert len(r) == len(header), f"row {r} has {len(r)} cells for the {len(header)} columns {header}"
        out += rows
    return out


def run(capsys, *argv: str) -> str:
    code = main(list(argv) + (["--quiet"] if argv[0] in ("patch", "attribute", "trace") else []))
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


PAIR = ["--clean", "The capital of France is", "--corrupted", "The capital of Italy is", "--answer", " Paris"]
PATCH_HEADER = ["cell (layer, position)", "patched metric", "effect (patched − baseline)"]


@pytest.mark.parametrize(
    ("argv", "headers", "first_cells"),
    [
        (
            ["lens", "The capital of France is", "Paris is in", "--target", " Paris", "-k", "2"],
            [["layer", "top-1 token (p)", "top-2 token (p)", "p(target)", "rank(target)"]],
            ["embed", "L0"],
        ),
        (["lens", "The capital of France is", "-k", "3"], [["layer"] + [f"top-{i} token (p)" for i in (1, 2, 3)]], []),
        (
            ["dla", "The capital of France is", "--target", " Paris", "--baseline", " Rome"],
            [["component", "direct effect on logit(' Paris') − logit(' Rome')"]],
            ["embed", "pos_embed", "L0.attn"],
        ),
        (
            ["neurons", "--layer", "2", "--top", "3", "-k", "4"],
            [["vector", "end", "tokens (score = v · (w ⊙ W_U[:, t]))"]],
            [],
        ),
        (
            ["neurons", "--promotes", " Paris", "--top", "3", "-k", "3"],
            [["rank", "neuron", "score", "the neuron's top tokens"]],
            ["1"],
        ),
        (
            ["subupdates", "The capital of France is", "--top", "4", "--target", " Paris"],
            [["neuron", "activation m_i", "norm |m_i|·‖v_i‖", "logit(' Paris') effect", "top tokens of m_i·v_i"]],
            [],
        ),
        (
            ["probe", "--folds", "2", "--per-subject", "2"],
            [["layer", "accuracy (held out)", "control (random-labels)", "selectivity (probe − control)"]],
            ["L0"],
        ),
        (["patch", *PAIR, "--wrong", " Rome", "--hook", "mlp_out"], [PATCH_HEADER], []),
        (["patch", "--dataset", "facts:3", "--hook", "attn_out", "--layers", "4,5"], [PATCH_HEADER], []),
        (
            ["attribute", *PAIR, "--hook", "z", "--method", "atp*", "--verify", "2"],
            [
                [
                    "cell (layer, head)",
                    "estimated patched metric",
                    "estimated effect (patched − baseline)",
                    "GradDrop score",
                ],
                ["cell", "estimated effect", "exact effect", "chosen as"],
            ],
            ["L0 H"],
        ),
        (
            ["attribute", *PAIR, "--method", "ig", "--ig-steps", "2"],
            [["cell (layer, position)", "estimated patched metric", "estimated effect (patched − baseline)"]],
            [],
        ),
        (
            ["trace", "--dataset", "facts:2", "--samples", "2", "--kind", "all"],
            [["bucket", "peak layer", "average indirect effect (Δp)", "cells"]],
            ["first subject token"],
        ),
    ],
    ids=lambda x: " ".join(x[:2]) if isinstance(x, list) and x and isinstance(x[0], str) and x[0].isalpha() else "",
)
def test_every_cli_table_names_its_columns(capsys, argv, headers, first_cells):
    out = run(capsys, *argv)
    rows = [r for h in headers for r in table_rows(out, h)]
    firsts = [r[0] for r in rows]
    for c in first_cells:
        assert any(f.startswith(c) for f in firsts), f"no row for {c!r} in {firsts}"


def test_the_parser_fails_on_a_table_without_header_or_with_a_short_row():
    with pytest.raises(AssertionError, match="no header row"):
        table_rows("  L0  +1.0\n  L1  +2.0", ["layer", "value"])
    with pytest.raises(AssertionError, match="cells for the 2 columns"):
        table_rows("  layer  value\n  L0  +1.0\n  L1\n", ["layer", "value"])
    assert table_rows("  layer  top token\n  L0     '  a'  \n", ["layer", "top token"]) == [["L0", "Q"]]
