"""The Python examples of the documentation site run as written.

Every ```python block of the getting-started and guide pages (and of the experiments and porting pages they link)
is executed, in page order, in one fresh interpreter per page, in a temporary folder, on the embedded model. A
block that needs what a test machine lacks (a download, several processes, a GPU) is fenced ```python notest and
its page says so; those are the only blocks not executed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(
    [*DOCS.glob("getting-started/*.md"), *DOCS.glob("guide/*.md"), DOCS / "experiments.md", DOCS / "porting.md"]
)
FENCE = re.compile(r"^```python( notest)?[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


def blocks(page: Path) -> list[tuple[int, bool, str]]:
    """(line of the block's first code line, runs?, code) for every python block of ``page``."""
    text = page.read_text()
    return [(text.count("\n", 0, m.start(2)) + 1, not m.group(1), m.group(2)) for m in FENCE.finditer(text)]


RUNNABLE = [p for p in PAGES if any(runs for _, runs, _ in blocks(p))]


def test_every_python_fence_is_runnable_or_marked():
    """No other spelling of a python fence slips past the runner (```py, ```python3, ```python skip …)."""
    for page in PAGES:
        for m in re.finditer(r"^```(\S*)(.*)$", page.read_text(), re.M):
            lang, rest = m.group(1), m.group(2).strip()
            if lang.lower().startswith("py"):
                assert lang == "python" and rest in ("", "notest"), f"{page.name}: fence {m.group(0)!r}"


def test_unexecuted_examples_are_few_and_say_so():
    notest = {p.relative_to(DOCS).as_posix(): sum(not runs for _, runs, _ in blocks(p)) for p in PAGES}
    notest = {k: v for k, v in notest.items() if v}
    assert sum(notest.values()) <= 5, notest
    for name in notest:
        assert "not run by the tests" in (DOCS / name).read_text(), f"{name} does not say why an example is not run"


def test_the_tour_page_is_the_readme_tour():
    readme = re.search(r"## A tour in 15 lines\n\n```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    page = blocks(DOCS / "getting-started" / "tour.md")
    assert readme and [code for _, _, code in page] == [readme.group(1)]


@pytest.mark.slow  # loads the model and runs edits, traces and probes: about a minute a page
@pytest.mark.parametrize("page", RUNNABLE, ids=[p.relative_to(DOCS).as_posix() for p in RUNNABLE])
def test_the_page_examples_run(page, tmp_path):
    program = ["import matplotlib", "matplotlib.use('Agg')", "scope = {'__name__': '__main__'}"]
    for line, runs, code in blocks(page):
        if runs:
            name = f"{page.relative_to(ROOT)}:{line}"
            program.append(f"exec(compile({code!r}, {name!r}, 'exec'), scope)")
    env = os.environ | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    run = subprocess.run(
        [sys.executable, "-c", "\n".join(program)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert run.returncode == 0, f"{page.name}: an example failed\n{run.stderr[-4000:]}"
