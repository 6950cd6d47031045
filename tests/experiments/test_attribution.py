"""The attribution experiment, run through the runner in its quick mode, against patching done by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpt2_interp.experiments import run_experiment

pytestmark = pytest.mark.slow  # ~20 s: three exact sweeps and nine estimates on 8 pairs


def hand_patched_effect(model, clean: str, corrupted: str, answer: int, wrong: int, layer: int) -> float:
    """Denoising by hand, one pair, no padding: the corrupted run with the clean run's mlp_out of ``layer``
    at the last position; the change of logit[answer] − logit[wrong]."""
    name = f"blocks.{layer}.hook_mlp_out"
    c, k = model.to_tokens(clean), model.to_tokens(corrupted)
    with torch.no_grad():
        _, cache = model.run_with_cache(c, names_filter=[name])
        base = model(k)[0, -1]

        def put(act, hook):
            act = act.clone()
            act[:, -1] = cache[name][:, -1]
            return act

        with model.hooks([(name, put)]):
            patched = model(k)[0, -1]
    return float((patched[answer] - patched[wrong]) - (base[answer] - base[wrong]))


def test_quick_run_agrees_with_patching_by_hand(facts_model, tmp_path):
    res = run_experiment("attribution", facts_model, quick=True, out=tmp_path, progress=False)
    d = tmp_path / "attribution" / "gpt2-facts" / "quick"
    assert (d / "attribution.png").stat().st_size > 1000 and (d / "attribution.md").exists()
    data = res.data
    assert data["pairs"] >= 4 and {r["method"] for r in data["rows"]} == {"atp", "atp*", "ig"}
    assert {r["hook"] for r in data["rows"]} == {"heads (z)", "mlp_out", "residual (resid_pre)"}
    assert all(-1 <= r["spearman"] <= 1 and 0 <= r["recall"] <= 1 for r in data["rows"])
    tok = facts_model.tokenizer
    # every kept pair is known: the model's own top-1 is the clean object on clean, the other object on corrupted
    with torch.no_grad():
        for c, k in data["prompt_pairs"]:
            top_c = int(facts_model(facts_model.to_tokens(c))[0, -1].argmax())
            top_k = int(facts_model(facts_model.to_tokens(k))[0, -1].argmax())
            assert top_c != top_k and tok.decode([top_c]).strip() and tok.decode([top_k]).strip()
    # the exact mean effect of the strongest last-position mlp_out cell, recomputed by hand pair by pair
    row = next(r for r in data["rows"] if r["hook"] == "mlp_out" and r["method"] == "atp")
    P, n_layer = data["positions"], facts_model.cfg.n_layer
    exact = np.array(row["exact_mean"]).reshape(n_layer, P)
    layer = int(np.abs(exact[:, -1]).argmax())
    by_hand = []
    for c, k in data["prompt_pairs"]:
        a = int(facts_model(facts_model.to_tokens(c))[0, -1].argmax().item())
        w = int(facts_model(facts_model.to_tokens(k))[0, -1].argmax().item())
        by_hand.append(hand_patched_effect(facts_model, c, k, a, w, layer))
    assert abs(exact[layer, -1]) > 0.1
    assert exact[layer, -1] == pytest.approx(np.mean(by_hand), rel=1e-3, abs=1e-3)


def test_keep_previous_adds_a_method_to_the_earlier_rows(facts_model, tmp_path):
    common = {"pairs": 4, "hooks": ["mlp_out"]}
    first = run_experiment(
        "attribution", facts_model, settings={**common, "methods": ["atp"]}, out=tmp_path, tag="t", progress=False
    )
    both = run_experiment(
        "attribution",
        facts_model,
        settings={**common, "methods": ["ig"], "keep_previous": True},
        out=tmp_path,
        tag="t",
        progress=False,
    )
    assert [r["method"] for r in both.data["rows"]] == ["atp", "ig"]
    assert both.data["rows"][0] == first.data["rows"][0]
    assert "merged_with" in both.provenance
    with pytest.raises(ValueError, match="keep_previous"):
        run_experiment(
            "attribution",
            facts_model,
            settings={**common, "pairs": 3, "keep_previous": True},
            out=tmp_path,
            tag="t",
            progress=False,
        )


def test_settings_are_checked_by_name():
    from analyses.attribution import Config

    with pytest.raises(ValueError, match=r"hooks.*z-pos"):
        Config.from_settings({"hooks": "z,heads"})
    with pytest.raises(ValueError, match="methods"):
        Config.from_settings({"methods": "atp,eap"})
