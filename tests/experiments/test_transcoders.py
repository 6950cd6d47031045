"""The transcoders study, run through the runner in its quick mode: the transcoders it saves reload and, evaluated
again on the same held-out windows, give the metrics the result reports; the error terms give the clean loss back."""

from __future__ import annotations

import pytest

from analyses.transcoders import Config
from gpt2_interp.analysis.features.sae_train import text_source, token_windows
from gpt2_interp.experiments import run_experiment
from gpt2_interp.graphs import TranscoderSet, evaluate_transcoders

pytestmark = pytest.mark.slow  # a few steps per layer, two evaluation passes


def test_quick_run_saves_transcoders_whose_metrics_reproduce(facts_model, tmp_path):
    res = run_experiment("transcoders", facts_model, quick=True, out=tmp_path, progress=False)
    d = tmp_path / "transcoders" / "gpt2-facts" / "quick"
    m = res.data["metrics"]
    assert (d / "provenance.json").exists() and len(m["variance_explained"]) == facts_model.cfg.n_layer
    ts = TranscoderSet.load(d / "transcoders", facts_model)
    assert ts[0].d_sae == 2 * facts_model.cfg.d_model
    docs = text_source(facts_model, "facts", n_generated=Config.generated, seed=0)
    held = token_windows(facts_model, docs[-max(1, int(len(docs) * 0.25)) :], 64)[:8]
    again = evaluate_transcoders(facts_model, ts, held)
    for key in ("variance_explained", "l0", "dead"):
        assert getattr(again, key) == pytest.approx(m[key], rel=1e-5, abs=1e-6), key
    assert again.replaced_loss == pytest.approx(m["replaced_loss"], rel=1e-5)
    assert m["replaced_with_errors_loss"] == pytest.approx(m["clean_loss"], abs=1e-4)
    assert "every MLP replaced" in res.tables()["transcoders"]
