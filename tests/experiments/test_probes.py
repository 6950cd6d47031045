"""The probes experiment through the runner, in its quick mode, beside a causal_trace result."""

from __future__ import annotations

import json

import pytest

from gpt2_interp.experiments import run_experiment
from gpt2_interp.facts.probing import probing_set

pytestmark = pytest.mark.slow  # two tasks and the last-token probe, 5 folds × 7 boundaries


def _trace(path, n_layer: int) -> dict:
    """A causal_trace result file (runner layout) with distinct numbers in every cell."""
    buckets = [
        "first subject token",
        "middle subject tokens",
        "last subject token",
        "first subsequent token",
        "further tokens",
        "last token",
    ]
    ie = [[[k + b / 10 + l / 100 for l in range(n_layer)] for b in range(6)] for k in range(3)]
    data = {
        "kinds": ["hidden", "mlp", "attn"],
        "buckets": buckets,
        "layer_labels": [f"L{l}" for l in range(n_layer)],
        "indirect_effect": ie,
    }
    path.mkdir(parents=True)
    (path / "result.json").write_text(json.dumps({"experiment": "causal_trace", "model": "gpt2-facts", "data": data}))
    return data


def test_quick_probes_count_the_prompts_and_read_this_models_trace(facts_model, tmp_path):
    trace = _trace(tmp_path / "causal_trace" / "gpt2-facts", facts_model.cfg.n_layer)
    res = run_experiment("probes", facts_model, quick=True, out=tmp_path, progress=False)
    d = tmp_path / "probes" / "gpt2-facts" / "quick"
    assert (d / "probes.png").stat().st_size > 10000 and "decodable from" in (d / "probes.md").read_text()
    data = res.data
    assert set(data["tasks"]) == {"continent", "period", "continent at the last token (own templates)"}
    assert len(data["tasks"]["continent"]["selectivity"]) == facts_model.cfg.n_layer + 1
    # independent check: the prompt and subject counts of the fact base's probing sets
    for task, which in (
        ("continent", "all"),
        ("period", "all"),
        ("continent at the last token (own templates)", "own"),
    ):
        ds = probing_set(task.split()[0], per_subject=2, which=which)
        assert data["tasks"][task]["n_prompts"] == len(ds.prompts)
    assert data["tasks"]["continent"]["n_subjects"] == len(set(probing_set("continent", per_subject=2).subjects))
    # the trace beside the probes is this model's causal_trace result, read at the last subject token / last token
    assert data["causal_trace_source"] == str(tmp_path / "causal_trace" / "gpt2-facts" / "result.json")
    assert data["causal_trace"]["mlp at last subject token"] == trace["indirect_effect"][1][2]
    assert data["causal_trace"]["hidden at last token"] == trace["indirect_effect"][0][5]
    assert "Causal tracing puts the lookup" in data["finding"]
