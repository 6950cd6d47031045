"""The mass_editing_stats experiment, quick mode through the runner, against statistics recomputed here."""

from __future__ import annotations

import pytest

from gpt2_interp.editing.stats import key_second_moment
from gpt2_interp.experiments import run_experiment

pytestmark = pytest.mark.slow  # a δ optimisation and two statistics passes


def test_rows_use_statistics_of_each_size_and_measure_distance_to_the_largest(facts_model, tmp_path):
    res = run_experiment("mass_editing_stats", facts_model, quick=True, out=tmp_path, progress=False)
    runs = res.data["runs"]
    assert [r["n_samples"] for r in runs] == [500, 2000] and all(r["count"] == r["n_samples"] for r in runs)
    # the largest size is its own reference; the smaller one's distance recomputed from the statistics directly
    assert runs[-1]["C_rel_distance"] == 0 and runs[-1]["update_rel_distance"] == 0
    C = {
        n: key_second_moment(facts_model, 0, n_samples=n, cache_dir=False, recompute=True, progress=False).C.double()
        for n in (500, 2000)
    }
    assert runs[0]["C_rel_distance"] == pytest.approx(float((C[500] - C[2000]).norm() / C[2000].norm()), rel=1e-4)
    assert runs[0]["update_rel_distance"] > 0
    d = tmp_path / "mass_editing_stats" / "gpt2-facts" / "quick"
    assert (d / "mass_editing_stats.png").stat().st_size > 0
    assert "| 2,000 | 2,000 |" in (d / "mass_editing_stats.md").read_text()
