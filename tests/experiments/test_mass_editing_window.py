"""The mass_editing_window experiment, quick mode through the runner: windows, sub-batches, merging, and
the one-layer row against a MEMIT edit made directly."""

from __future__ import annotations

import pytest

from analyses.mass_editing import mean_scores
from gpt2_interp.editing.evaluate import known_cases
from gpt2_interp.editing.memit import compute_edits
from gpt2_interp.editing.stats import key_second_moment
from gpt2_interp.experiments import run_experiment

pytestmark = pytest.mark.slow  # two δ optimisations and a dozen re-solved edits


def test_windows_sub_batches_and_the_layer0_row_equal_a_direct_edit(facts_model, tmp_path):

    def run(**s):
        return run_experiment("mass_editing_window", facts_model, quick=True, settings=s, out=tmp_path, progress=False)

    report = run(tops="0,1", sub="2").data
    assert {(t["top"], t["ctx"]) for t in report["targets"]} == {(0, "memit"), (1, "memit")}
    # every window ending at each top layer, whole batch and sub-batches
    assert sorted(((tuple(r["window"]), r["sub"]) for r in report["rows"]), key=lambda x: (x[0], x[1] or 0)) == [
        ((0,), None),
        ((0,), 2),
        ((0, 1), None),
        ((0, 1), 2),
        ((1,), None),
        ((1,), 2),
    ]
    d = tmp_path / "mass_editing_window" / "gpt2-facts" / "quick"
    assert "| [0, 1] | 6 | 100 |" in (d / "mass_editing_window.md").read_text()
    # independent check: window [0] re-solved from layer 0's own targets is the plain one-layer MEMIT edit
    cases = known_cases(facts_model, 8, 0)
    tune = known_cases(facts_model, 4, 1, {(c.relation, c.request.subject) for c in cases})
    stats = key_second_moment(facts_model, [0, 1], n_samples=3000, progress=False)
    e = compute_edits(
        facts_model,
        [c.request for c in tune],
        layers=[0],
        stats=stats,
        hparams={
            "prefix_lengths": (10,),
            "prefixes_per_length": 5,
            "delta_norm": "resid",
            "v_steps": 3,
            "mom2_weight": 100.0,
        },
    )
    with facts_model.edited(e):
        direct = mean_scores(facts_model, tune)
    row = next(r for r in report["rows"] if r["window"] == [0] and r["sub"] is None)
    assert {k: row[k] for k in ("es", "ps", "ns")} == pytest.approx(direct, abs=1e-5)
    # a second run adds the context variants' rows to the same folder; other request sets are refused
    merged = run(tops="0", ctx="rome").data
    assert {(t["top"], t["ctx"]) for t in merged["targets"]} == {(0, "memit"), (1, "memit"), (0, "rome")}
    assert len(merged["rows"]) == len(report["rows"]) + 1
    with pytest.raises(ValueError, match="tune_n"):
        run(tops="0", tune_n="3")
