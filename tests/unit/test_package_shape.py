"""The package holds the library and the experiment runner; the studies, their reports and their findings live
in ``analyses/`` beside it. No module of ``gpt2_interp/`` writes a markdown table literal, points at the
committed results, or imports a study."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gpt2_interp"
SOURCES = sorted(PACKAGE.rglob("*.py"))
STUDIES = {p.stem for p in (ROOT / "analyses").glob("*.py") if not p.name.startswith("_")}


def _hits(needle: str) -> list[str]:
    return [
        f"{p.relative_to(ROOT)}:{i}"
        for p in SOURCES
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if needle in line
    ]


def test_the_studies_were_found():
    assert len(SOURCES) > 50 and {"logit_lens", "mass_editing", "steering", "probes"} <= STUDIES


def test_no_markdown_table_literal_in_the_package():
    assert not _hits("|" + "---"), "markdown tables belong to the studies (analyses/) or core.tables.markdown_rule"


def test_the_package_does_not_point_at_the_committed_results():
    assert not _hits("analyses" + "/results")


def _imported(path: Path) -> list[str]:
    """Every module (and ``module.name``) the file imports, relative imports resolved."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts if parts[-1] == "__init__" else parts[:-1]
    package = [p for p in package if p != "__init__"]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            out += [base] + [f"{base}.{a.name}" for a in node.names]
    return out


def test_no_module_of_the_package_imports_a_study():
    found = []
    for path in SOURCES:
        for name in _imported(path):
            top = name.partition(".")[0]
            last = name.rsplit(".", 1)[-1]
            if top == "analyses" or (name.startswith("gpt2_interp.experiments.") and last in STUDIES):
                found.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not found, found


def test_the_experiments_package_holds_the_runner_only():
    assert {p.name for p in (PACKAGE / "experiments").glob("*.py")} == {
        "__init__.py",
        "base.py",
        "provenance.py",
        "runner.py",
    }
