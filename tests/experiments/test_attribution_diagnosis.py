"""The attribution_diagnosis experiment: its quick mode through the runner, and its hand-written
activation-path IG against IG's completeness (the attributions of a layer sum to the effect of patching
the whole layer)."""

from __future__ import annotations

import pytest
import torch

from analyses.attribution import fact_pairs
from analyses.attribution_diagnosis import layer_ig
from gpt2_interp.experiments import run_experiment

pytestmark = pytest.mark.slow  # ~15 s: an exact sweep and three estimates on 6 pairs


def whole_layer_effect(model, clean: str, corrupted: str, answer: int, wrong: int, layer: int) -> float:
    """The corrupted run with ALL of the clean run's mlp_out at ``layer``: the change of the logit difference."""
    name = f"blocks.{layer}.hook_mlp_out"
    c, k = model.to_tokens(clean), model.to_tokens(corrupted)
    with torch.no_grad():
        _, cache = model.run_with_cache(c, names_filter=[name])
        base = model(k)[0, -1]
        with model.hooks([(name, lambda act, hook: cache[name])]):
            patched = model(k)[0, -1]
    return float((patched[answer] - patched[wrong]) - (base[answer] - base[wrong]))


def test_layer_ig_is_complete_on_each_layer(facts_model):
    fp = fact_pairs(facts_model, 6, 3)
    ig = layer_ig(facts_model, fp, "mlp_out", steps=24)  # [pairs, layer, pos]
    for i in range(len(fp)):
        for layer in range(facts_model.cfg.n_layer):
            by_hand = whole_layer_effect(facts_model, fp.clean[i], fp.corrupted[i], fp.answers[i], fp.wrongs[i], layer)
            assert float(ig[i, layer].sum()) == pytest.approx(by_hand, rel=0.03, abs=0.03), (i, layer)


def test_quick_run(facts_model, tmp_path):
    res = run_experiment("attribution_diagnosis", facts_model, quick=True, out=tmp_path, progress=False)
    d = tmp_path / "attribution_diagnosis" / "gpt2-facts" / "quick"
    assert (d / "attribution_diagnosis.md").exists() and (d / "result.json").exists()
    data = res.data
    assert set(data["estimates"]) == {"layer_ig", "atp", "ig"} and data["ig_pairs"] == data["pairs"] <= 6
    for row in data["estimates"].values():
        assert -1 <= row["rho_mean"] <= 1 and sum(row["err_share_by_layer_third"]) == pytest.approx(1, abs=1e-5)
    assert 0 < data["exact_mass_top20"] <= 1 + 1e-6
