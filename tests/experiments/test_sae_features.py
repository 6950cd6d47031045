"""The sae_features experiment in its quick mode: an SAE trained in the run, its latents scored
against the continent labels of the fact base, beside the linear probe on the same folds."""

from __future__ import annotations

import pytest

from gpt2_interp.experiments import run_experiment

pytestmark = pytest.mark.slow  # a few seconds: generation, a small SAE, probes on ~400 prompts


def test_quick_run_reports_latent_aurocs_beside_the_linear_probe(facts_model, tmp_path):
    res = run_experiment("sae_features", facts_model, quick=True, out=tmp_path, progress=False)
    data = res.data
    assert data["hook"] == "blocks.3.hook_resid_pre" and data["sae"]["source"].startswith("trained here")
    t = data["tasks"]["continent"]
    assert len(t["classes"]) == 6 and t["prompts"] == 2 * t["subjects"]
    assert all(0 <= c["auroc"] <= 1 and 0 <= c["latent"] < data["sae"]["d_sae"] for c in t["classes"])
    assert t["best"]["auroc"] == max(c["auroc"] for c in t["classes"])
    # the continent is linearly decodable at this layer of the fact model: far above chance
    assert t["linear_probe_accuracy"] > t["chance"] + 0.2
    assert "linear probe (resid)" in res.tables()["summary"]
    assert (tmp_path / "sae_features" / "gpt2-facts" / "quick" / "latents_continent.md").exists()
