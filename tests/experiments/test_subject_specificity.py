"""The subject_specificity experiment: its quick mode through the runner, runs appended to an earlier result,
and the keep prompts counted by hand from the fact base."""

from __future__ import annotations

import pytest

from analyses.subject_specificity import Config
from gpt2_interp.editing.evaluate import known_cases
from gpt2_interp.experiments import run_experiment
from gpt2_interp.facts.base import FactBase

pytestmark = pytest.mark.slow  # ROME and MEMIT edits with and without keep prompts: about a minute


@pytest.mark.full  # four edits and their scores (~1.5 min); keep prompts are tested in tests/unit/test_rome.py
def test_quick_run_then_appended_runs(facts_model, tmp_path):
    res = run_experiment("subject_specificity", facts_model, quick=True, out=tmp_path, progress=False)
    d = tmp_path / "subject_specificity" / "gpt2-facts" / "quick"
    report = res.data
    assert [(r["method"], r["keep_factor"]) for r in report["runs"]] == [
        ("rome", None),
        ("rome", 1.0),
        ("memit", None),
        ("memit", 1.0),
    ]
    assert all(r["summary"]["n_ss"] > 0 for r in report["runs"])
    assert (d / "subject_specificity.png").stat().st_size > 0
    # keep prompts counted by hand: each other relation of the edited subject, one training prompt (index 1)
    fb = FactBase.load()
    subjects = [c.request.subject for c in known_cases(facts_model, 3, 0)]
    others = [len({f.relation for f in fb.facts() if f.subject == s}) - 1 for s in subjects]
    assert report["runs"][1]["keep_prompts_mean"] == pytest.approx(sum(others) / len(others), abs=1e-4)
    # more keep prompts, appended to the same result
    again = run_experiment(
        "subject_specificity",
        facts_model,
        quick=True,
        out=tmp_path,
        progress=False,
        settings={"methods": ["rome"], "published": False, "keep_templates": [1, 2], "append": True},
    ).data
    assert again["runs"][:4] == report["runs"] and len(again["runs"]) == 5
    assert again["runs"][4]["keep_templates"] == [1, 2] and again["runs"][4]["keep_factor"] == 1.0
    assert again["runs"][4]["keep_prompts_mean"] == pytest.approx(2 * sum(others) / len(others), abs=1e-4)
    assert "| [1, 2] (" in (d / "subject_specificity.md").read_text()


def test_the_scored_prompt_cannot_be_kept():
    with pytest.raises(ValueError, match="keep_templates"):
        Config.from_settings({"keep_templates": "0,1"})
    with pytest.raises(ValueError, match="methods"):
        Config.from_settings({"methods": "rome,alphaedit"})
