"""The causal_trace experiment through the runner, in its quick mode, against the model's own probabilities."""

from __future__ import annotations

import json

import pytest
import torch

from gpt2_interp.analysis.tokens import target_ids
from gpt2_interp.experiments import ExperimentResult, render, run_experiment
from gpt2_interp.facts.base import FactBase

pytestmark = pytest.mark.slow  # 8 facts × 3 kinds × 3 noise samples


def test_quick_trace_clean_score_is_the_models_probability(facts_model, tmp_path):
    res = run_experiment("causal_trace", facts_model, quick=True, out=tmp_path, progress=False)
    d = tmp_path / "causal_trace" / "gpt2-facts" / "quick"
    assert (d / "causal_trace.png").stat().st_size > 10000 and (d / "causal_trace.md").exists()
    data = res.data
    # 8 facts spread over the 8 relations: one of each (each relation's first training template)
    fb = FactBase.load()
    relation = {f"{fb.prompts(f)[0]} →{f.target}": f.relation for f in fb.facts()}
    assert data["n_facts"] == data["n_known"] == 8  # gpt2-facts knows the 8 facts picked
    assert sorted(relation[x] for x in data["facts"]) == sorted(fb.relations)
    # independent check: the clean score is the mean probability of the object's first token after each prompt
    prompts, targets = zip(*(s.split(" →", 1) for s in data["facts"]))
    with torch.no_grad():
        probs = facts_model.last_logits(list(prompts)).softmax(-1)
    p = [float(probs[i, target_ids(facts_model, t)[0]]) for i, t in enumerate(targets)]
    assert data["clean_score"] == pytest.approx(sum(p) / len(p), abs=1e-4)
    assert data["window"] == 3 and len(data["layer_labels"]) == facts_model.cfg.n_layer
    peak = data["peaks"]["hidden"]
    assert data["indirect_effect"][0][data["buckets"].index(peak["bucket"])][peak["layer"]] == pytest.approx(
        peak["indirect_effect"], abs=1e-4
    )
    assert "last subject token" in data["finding"]
    # the figure and the table are redrawn from the saved result alone
    (d / "causal_trace.png").unlink()
    render(ExperimentResult.load(d), d)
    assert (d / "causal_trace.png").exists() and json.loads((d / "result.json").read_text())["data"]["n_known"] > 0
