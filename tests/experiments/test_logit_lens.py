"""The logit_lens experiment, run through the runner in its quick mode, against the model itself."""

from __future__ import annotations

import pytest
import torch

from gpt2_interp.analysis.tokens import target_ids
from gpt2_interp.experiments import run_experiment
from gpt2_interp.facts.base import FactBase

pytestmark = pytest.mark.slow  # a few seconds: the whole quick fact set through the lens


def test_last_layer_accuracy_is_the_models_own_top1(facts_model, tmp_path):
    res = run_experiment("logit_lens", facts_model, quick=True, out=tmp_path, progress=False)
    d = tmp_path / "logit_lens" / "gpt2-facts" / "quick"
    assert (d / "logit_lens.png").stat().st_size > 10000 and (d / "provenance.json").exists()
    data = res.data
    assert len(data["layers"]) == facts_model.cfg.n_layer + 1
    # independent check: at the last boundary the lens is the model's logits, so top-1 accuracy there is the
    # model's own top-1 accuracy on the same prompts (8 facts per relation, first training prompt)
    fb = FactBase.load()
    facts = [f for r in fb.relations for f in fb.facts(r)[:8]]
    with torch.no_grad():
        top = facts_model.last_logits([fb.prompts(f)[0] for f in facts]).argmax(-1).tolist()
    own = sum(t == target_ids(facts_model, f.target)[0] for t, f in zip(top, facts)) / len(facts)
    assert data["splits"]["train"]["n_prompts"] == len(facts)
    assert data["splits"]["train"]["all"]["top1"][-1] == pytest.approx(own, abs=1e-6)
    assert "| layer |" in res.tables()["logit_lens"]
