"""The README's tour runs as written, and says what it says it does (the edit flips the answer, undo restores it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a ROME edit and a causal trace on the embedded model: seconds
def test_the_tour_runs_and_the_edit_is_undone(tmp_path, monkeypatch, capsys):
    text = (ROOT / "README.md").read_text()
    tour = re.search(r"## A tour in 15 lines\n\n```python\n(.*?)```", text, re.S).group(1)
    assert len(tour.strip().splitlines()) <= 16
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(tour, "README.md (tour)", "exec"), scope)
    out = capsys.readouterr().out
    assert "Rome" in out.splitlines()[-1]  # the edited model's continuation, printed inside model.edited(...)
    assert (tmp_path / "lens.png").stat().st_size > 1000 and (tmp_path / "trace.png").exists()
    model = scope["model"]
    assert "Paris" in model.generate("The capital of France is", max_new_tokens=3, do_sample=False)  # undone
    from gpt2_interp.editing import load_edit

    again = load_edit(tmp_path / "france-rome.edit", model)
    with model.edited(again):
        assert "Rome" in model.generate("The capital of France is", max_new_tokens=3, do_sample=False)


def test_every_relative_link_in_the_readme_resolves():
    """The capability table and the documentation section point at pages that exist (anchors aside)."""
    text = (ROOT / "README.md").read_text()
    links = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text) if "://" not in t and not t.startswith("#")]
    assert len(links) > 15
    missing = sorted({t for t in links if t and not (ROOT / t).exists()})
    assert not missing, f"README links to files that do not exist: {missing}"


def test_the_readme_set_up_command_installs_what_the_main_job_writes():
    """The README's first command is scripts/setup.sh with no extras, then the demo: the base install (pyproject's
    ``dependencies``) holds Plotly, which the demo's index.html needs, so the main job is whole after it."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    from packaging.requirements import Requirement

    text = (ROOT / "README.md").read_text()
    first = re.search(r"```bash\n(.*?)\n```", text, re.S).group(1)
    assert first == "bash scripts/setup.sh && .venv/bin/gpt2-interp demo --out demo-report"
    base = {
        Requirement(r).name for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    assert "plotly" in base, "the demo's index.html needs Plotly: it must be a base dependency"
    assert "index.html" in text.split("## A tour")[0] or "index.html" in (ROOT / "gpt2_interp" / "demo.py").read_text()
