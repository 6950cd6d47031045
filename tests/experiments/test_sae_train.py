"""The sae_train experiment, run through the runner in its quick mode: the SAE it saves reloads and,
evaluated again on the same held-out text, gives the metrics the result reports."""

from __future__ import annotations

import pytest

from analyses.sae_train import Config
from gpt2_interp.analysis.features.sae import SAE
from gpt2_interp.analysis.features.sae_eval import evaluate_sae
from gpt2_interp.analysis.features.sae_train import text_source, token_windows
from gpt2_interp.experiments import run_experiment

pytestmark = pytest.mark.slow  # a few seconds: generation, a few SAE steps, three evaluation passes


def test_quick_run_saves_an_sae_whose_metrics_reproduce(facts_model, tmp_path):
    res = run_experiment("sae_train", facts_model, quick=True, out=tmp_path, progress=False)
    d = tmp_path / "sae_train" / "gpt2-facts" / "quick"
    data = res.data
    assert data["hook"] == "blocks.3.hook_resid_pre" and (d / "provenance.json").exists()
    sae = SAE.load(d / "sae", facts_model)
    assert sae.cfg.d_sae == 2 * facts_model.cfg.d_model and sae.cfg.k == 8
    docs = text_source(facts_model, "generated", n_generated=Config.generated, seed=0)
    held = token_windows(facts_model, docs[-len(docs) // 4 :], 64)[:8]
    again = evaluate_sae(facts_model, sae, held).summary()
    for key in ("l0", "variance_explained", "ce_recovered", "dead_fraction"):
        assert again[key] == pytest.approx(data["evaluation"][key], abs=1e-5), key
    assert data["timing"]["throughput_ratio"] > 0 and data["step_cost_ratio"] > 0
    assert "ce_recovered" in res.tables()["metrics"]
