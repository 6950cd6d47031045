"""The house's layer order holds: import-linter's contracts (pyproject.toml) and no ``_private`` name
crossing a package boundary."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "gpt2_interp"


def _lint_imports() -> str | None:
    exe = Path(sys.executable).with_name("lint-imports")
    return str(exe) if exe.exists() else shutil.which("lint-imports")


def test_import_linter_contracts_are_kept():
    exe = _lint_imports()
    if exe is None:
        pytest.fail("lint-imports is not installed: `pip install -e .[test]` installs import-linter")
    run = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert "BROKEN" not in run.stdout and "kept" in run.stdout


def _package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2])  # gpt2_interp.<package>


def _module_name(path: Path, package: Path) -> str:
    rel = path.relative_to(package.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def private_crossings(package: Path = PACKAGE) -> list[str]:
    """``from gpt2_interp.x.y import _name`` in a module of another package, and ``model._name``
    (a private attribute of the model) read outside ``gpt2_interp.model``."""
    found = []
    for path in sorted(package.rglob("*.py")):
        module = _module_name(path, package)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _resolve(module, node, path.name == "__init__.py")
                if not source.startswith("gpt2_interp"):
                    continue
                for alias in node.names:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    if private and _package_of(source) != _package_of(module):
                        found.append(f"{module}: from {source} import {alias.name}")
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "model"
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not module.startswith("gpt2_interp.model")
            ):
                found.append(f"{module}: model.{node.attr} (line {node.lineno})")
    return found


def test_no_private_names_cross_packages():
    assert private_crossings() == []


def test_the_private_name_check_can_fail(tmp_path):
    """The checker sees planted violations (so the test above is not vacuous), and allows a private
    name inside its own package."""
    pkg = tmp_path / "gpt2_interp"
    (pkg / "analysis").mkdir(parents=True)
    (pkg / "analysis" / "bad.py").write_text(
        "from gpt2_interp.editing.stats import _secret\nfrom .lens import _fine\nx = model._as_tokens\n"
    )
    found = private_crossings(pkg)
    assert len(found) == 2 and any("import _secret" in f for f in found) and any("model._as_tokens" in f for f in found)
