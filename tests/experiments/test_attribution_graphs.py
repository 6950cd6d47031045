"""The attribution_graphs study in its quick mode (fresh transcoders): each graph's feature count is the number of
transcoder features active on the prompt (position 0 left out, as circuit-tracer builds graphs), counted here from
the model's own MLP inputs, and its scores are shares."""

from __future__ import annotations

import pytest
import torch

from gpt2_interp.experiments import run_experiment
from gpt2_interp.graphs import TranscoderTrainConfig, new_transcoders

pytestmark = pytest.mark.slow  # two small graphs


def test_quick_run_counts_the_active_features_of_each_prompt(facts_model, tmp_path):
    res = run_experiment("attribution_graphs", facts_model, quick=True, out=tmp_path, progress=False)
    graphs = res.data["graphs"]
    assert len(graphs) == 2 and "replacement" in res.tables()["attribution_graphs"]
    ts = new_transcoders(facts_model, TranscoderTrainConfig(expansion=2, k=8))
    for g in graphs:
        tokens = facts_model.to_tokens(g["prompt"])
        names = [f"blocks.{layer}.ln2.hook_normalized" for layer in range(facts_model.cfg.n_layer)]
        _, cache = facts_model.run_with_cache(tokens, names_filter=names)
        with torch.no_grad():
            active = sum(int((t.encode(cache[n][0, 1:]) > 0).sum()) for t, n in zip(ts, names))
        assert g["features"] == active and g["tokens"] == tokens.shape[1]
        assert 0 <= g["replacement_score"] <= 1 and 0 <= g["completeness_score"] <= 1
        assert g["nodes_kept"] > 0 and g["edges_kept"] > 0
