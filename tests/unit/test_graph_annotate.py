"""What a graph's page shows about a feature is what a feature view of that transcoder latent shows: its top
contexts over the same windows and its most promoted and suppressed tokens, for each kept feature only."""

from __future__ import annotations

import pytest
import torch

from gpt2_interp.analysis.features.sae_train import text_source, token_windows
from gpt2_interp.analysis.features.sae_views import feature_view
from gpt2_interp.graphs.annotate import annotate_graph
from gpt2_interp.graphs.attribution import AttributionConfig, attribute
from gpt2_interp.graphs.prune import prune_graph
from gpt2_interp.graphs.transcoder import TranscoderTrainConfig, new_transcoders


def test_annotations_equal_each_kept_features_feature_view(facts_model):
    model = facts_model
    ts = new_transcoders(model, TranscoderTrainConfig(d_sae=64, k=8, seed=1))
    tokens = model.to_tokens("The capital of France is")[0]
    graph = attribute(model, ts, tokens, AttributionConfig(batch_size=48, max_n_logits=3))
    graph = prune_graph(graph, node_threshold=0.99)  # random transcoders: the error nodes carry most influence
    windows = token_windows(model, text_source(model, "facts")[:60], 16)[:24]
    out = annotate_graph(graph, model, ts, windows, n_logits=4, n_contexts=3, context=5)
    assert out.str_tokens == model.to_str_tokens(tokens) and out.logit_strs == graph.logit_strs
    kept = graph.node_mask[: graph.n_features]
    assert out.feature_logits is not None and out.feature_contexts is not None
    assert [v is None for v in out.feature_logits] == (~kept).tolist()
    assert [v is None for v in out.feature_contexts] == (~kept).tolist()
    chosen = kept.nonzero()[:, 0]
    chosen = chosen[torch.linspace(0, len(chosen) - 1, 5).long()].tolist()  # five kept features, low to high layers
    for i in chosen:
        L, _, f = graph.features[i].tolist()
        ref = feature_view(model, ts[L], f, windows, top=3, context=5, n_tokens=4)
        got = out.feature_contexts[i]
        assert [(c["tokens"], c["window"], c["position"]) for c in got] == [
            (c["tokens"], c["window"], c["position"]) for c in ref.contexts
        ]
        for c, r in zip(got, ref.contexts):
            assert c["acts"] == pytest.approx(r["acts"], abs=1e-5) and c["max_act"] == pytest.approx(r["max_act"])
        for name, pairs in (("promoted", ref.promoted), ("suppressed", ref.suppressed)):
            assert [t for t, _ in out.feature_logits[i][name]] == [t for t, _ in pairs]
            assert [v for _, v in out.feature_logits[i][name]] == pytest.approx([v for _, v in pairs], abs=1e-5)
