"""The paper_departures experiment, quick mode through the runner: which options it flips, and its reference and
defaults rows against MEMIT edits made directly with the same settings."""

from __future__ import annotations

import warnings

import pytest

from analyses.mass_editing import mean_scores
from analyses.paper_departures import flips
from gpt2_interp.editing import memit
from gpt2_interp.editing.evaluate import known_cases
from gpt2_interp.editing.stats import key_second_moment
from gpt2_interp.experiments import run_experiment


def test_flips_take_our_value_or_the_other_choice():
    paper = {"key_weighting": "per_context_type", "exact_edit": False, "clamp_factor": 4.0, "a": 1, "b": 2}
    ours = {"key_weighting": "per_context_type", "exact_edit": True, "clamp_factor": 4.0, "a": 1, "b": 3}
    got = flips(paper, ours, [("key_weighting",), ("exact_edit",), ("clamp_factor",), ("a", "b")])
    # equal two-valued option: its other choice; differing: ours; equal number: no row; a group: all its names
    assert got == [{"key_weighting": "uniform"}, {"exact_edit": True}, {"a": 1, "b": 3}]


@pytest.mark.slow  # six two-request MEMIT batches
def test_memit_rows_equal_direct_edits(facts_model, tmp_path):
    settings = {"methods": ["memit"], "options": ["key_weighting", "exact_edit"]}
    res = run_experiment("paper_departures", facts_model, quick=True, settings=settings, out=tmp_path, progress=False)
    rows = {r["row"]: r for r in res.data["rows"]["memit"]}
    paper = memit.MemitHparams.of(facts_model, preset="paper", v_steps=2)
    ours = memit.MemitHparams.of(facts_model, v_steps=2)
    other = {"uniform": "per_context_type", "per_context_type": "uniform"}
    kw_paper, kw_ours = paper.rome.key_weighting, ours.rome.key_weighting
    flipped = kw_ours if kw_ours != kw_paper else other[kw_paper]
    back = kw_paper if kw_ours != kw_paper else flipped
    # each option flipped on the reference (to our value, or the other choice where ours is the paper's), and back
    assert list(rows) == [
        "reference (paper)",
        f"key_weighting={flipped}",
        f"exact_edit={ours.rome.exact_edit}",
        "defaults (no preset)",
        f"defaults, key_weighting={back}",
        f"defaults, exact_edit={paper.rome.exact_edit}",
    ]
    assert rows["defaults (no preset)"]["label"] == "memit"
    assert all(r["label"] == "memit (paper)" for name, r in rows.items() if not name.startswith("defaults"))
    # independent check: the reference and defaults rows are what a direct edit of the same requests scores
    cases = known_cases(facts_model, 2, 0)
    stats = key_second_moment(facts_model, memit.default_layers(facts_model), n_samples=2000, progress=False)
    for hp, row in ((paper, rows["reference (paper)"]), (ours, rows["defaults (no preset)"])):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            e = memit.compute_edits(facts_model, [c.request for c in cases], stats=stats, hparams=hp, progress=False)
        with facts_model.edited(e):
            direct = mean_scores(facts_model, cases)
        assert {k: row[k] for k in ("es", "ps", "ns")} == pytest.approx(direct)
    assert "| reference (paper) |" in res.tables()["paper_departures"]
