"""The steering experiment, run through the runner in its quick mode, against the model itself."""

from __future__ import annotations

import pytest
import torch

from analyses.steering import CONCEPTS
from gpt2_interp.experiments import run_experiment

pytestmark = pytest.mark.slow  # a few seconds: four pairs, three prompts, two Brown passages


def test_quick_run_measures_the_steered_models_target_probability(facts_model, tmp_path):
    res = run_experiment("steering", facts_model, quick=True, out=tmp_path, progress=False)
    d = tmp_path / "steering" / "gpt2-facts" / "quick"
    assert (d / "steering.png").stat().st_size > 10000 and (d / "provenance.json").exists()
    data = res.data
    curve = data["curve"]
    assert curve["scales"] == [0.0, 0.5] and curve["kl"][0] == 0.0
    # independent check: the same direction built by hand from the first four pairs (the last token of
    # each sentence alone), added at scale 0.5, and the target words' probability read off
    assert data["concept"] == "sentiment" and data["position"] == "last"
    pairs, prompts, words = CONCEPTS["sentiment"]
    at = f"blocks.{data['layer']}.hook_resid_post"

    def last_act(text):
        return facts_model.run_with_cache(text, names_filter=at)[1][at][0, -1]

    with torch.no_grad():
        v = torch.stack([last_act(p) - last_act(n) for p, n in pairs[:4]]).mean(0)
        ids = sorted(
            {facts_model.tokenizer.encode_ids(w)[0] for w in words if len(facts_model.tokenizer.encode_ids(w)) == 1}
        )
        plain = torch.stack([facts_model(x)[0, -1].softmax(-1)[ids].sum() for x in prompts[:3]])
        with facts_model.steer(v, at=at, scale=0.5):
            steered = torch.stack([facts_model(x)[0, -1].softmax(-1)[ids].sum() for x in prompts[:3]])
    p = steered.mean()
    assert curve["direction_norm"] == pytest.approx(float(v.norm()), rel=1e-4)
    assert curve["target_prob"][1] == pytest.approx(float(p), rel=1e-3, abs=1e-7)
    md = res.tables()["steering"]
    assert "Steering gpt2-facts towards sentiment" in md
    # the paired standard error: of the per-prompt differences, not of either arm
    paired = float((steered - plain).std() / 3**0.5)
    assert curve["shift_sem"][1] == pytest.approx(paired, rel=1e-3, abs=1e-7)
    assert f"± {paired:.3g} paired s.e. over 3 prompts" in data["finding"]
    # the finding's verb follows the sign of the shift, and a best scale is named only when it raises the target
    shift = float(p) - curve["baseline_prob"]
    assert ("raises it" in data["finding"] or "which raises" in data["finding"]) == (shift > 0)
    assert ("lowers it" in data["finding"]) == (shift < 0)
    assert (data["best"] is None) == (shift <= 0 or curve["loss_change"][1] >= data["max_loss_change"])
    assert data["finding"] in md
