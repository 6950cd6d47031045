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


def test_a_prompt_of_ones_own_is_graphed_and_its_top_features_switched_off_in_the_real_model(facts_model, tmp_path):
    prompt = "The Eiffel Tower is in the city of"
    res = run_experiment(
        "attribution_graphs",
        facts_model,
        quick=True,
        settings={"n_prompts": 0, "prompts": [prompt], "max_n_logits": 5, "n_interventions": 3},
        out=tmp_path,
        progress=False,
    )
    (g,) = res.data["graphs"]
    tokens = facts_model.to_tokens(prompt)
    with torch.no_grad():
        logits = facts_model(tokens)[0, -1]
    answer = int(logits.argmax())
    assert g["prompt"] == prompt and g["answer"] == facts_model.to_string([answer]) and g["answer_is_logit_node"]
    assert len(g["interventions"]) == 3 and "interventions" in res.tables()
    ts = new_transcoders(facts_model, TranscoderTrainConfig(expansion=2, k=8))
    edges = [abs(i["edge_to_answer"]) for i in g["interventions"]]
    assert edges == sorted(edges, reverse=True)
    for i in g["interventions"]:
        layer, pos, f = i["feature"]
        # the real model with the feature switched off, by hand: −activation × its decoder row added to the MLP output

        def off(act, hook, layer=layer, pos=pos, f=f, a=i["activation"]):
            act = act.clone()
            act[0, pos] -= a * ts[layer].W_dec[f]
            return act

        with torch.no_grad():
            after = facts_model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.hook_mlp_out", off)])[0, -1]
        change = (after[answer] - after.mean()) - (logits[answer] - logits.mean())
        assert abs(float(change) - i["real"]) < 1e-4 * max(1.0, abs(i["real"])), (i, float(change))
        assert abs(float(after.softmax(-1)[answer]) - i["prob_after"]) < 1e-5
