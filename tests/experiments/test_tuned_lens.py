"""The tuned_lens experiment through the runner, in its quick mode."""

from __future__ import annotations

import pytest

from gpt2_interp.experiments import run_experiment

pytestmark = pytest.mark.slow  # generates texts and trains a few steps


def test_quick_tuned_lens_reads_the_last_boundary_as_the_model_does(facts_model, tmp_path):
    res = run_experiment("tuned_lens", facts_model, quick=True, out=tmp_path, progress=False)
    d = tmp_path / "tuned_lens" / "gpt2-facts" / "quick"
    assert (d / "tuned_lens.png").stat().st_size > 10000 and (d / "tuned_lens.md").exists()
    data = res.data
    assert data["labels"] == ["embed"] + [f"L{i}" for i in range(facts_model.cfg.n_layer)]
    assert data["train"]["steps"] == 3 and data["train"]["texts"] == 8
    # independent check (a fact of the construction): the logit lens at the last boundary is the model's own
    # output, so its KL to the final distribution is 0 and it agrees with the final top-1 everywhere
    for evals in data["heldout"].values():
        assert evals["logit lens"]["kl_bits"][-1] < 1e-3
        assert evals["logit lens"]["top1_agreement"][-1] == 1.0
    assert set(data["heldout"]) == {"generated (seed 10000)", "held-out paraphrases"}
    assert data["finding"].startswith("gpt2-facts: on held-out generations")
