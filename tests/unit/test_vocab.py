"""MLP value vectors in vocabulary space: against explicit loops, planted neurons, brute force
and the direct logit attribution."""

from __future__ import annotations

import json
import re

import pytest
import torch

import gpt2_interp.analysis.vocab as vocab
import gpt2_interp.cli as cli
from gpt2_interp.analysis.lens import logit_attribution
from gpt2_interp.analysis.vocab import find_neurons, neuron_vocab, project, top_subupdates

PROMPT = "The capital of France is"


@pytest.fixture
def model(tiny):
    """tiny with a non-trivial final LN gain, so that apply_ln matters."""
    with torch.no_grad():
        tiny.ln_final.w.uniform_(0.2, 2.0, generator=torch.Generator().manual_seed(3))
        tiny.ln_final.b.normal_(0, 0.3, generator=torch.Generator().manual_seed(4))
    return tiny


@pytest.mark.parametrize("apply_ln", [True, False])
def test_neuron_vocab_equals_explicit_loop(model, apply_ln, monkeypatch):
    monkeypatch.setattr(vocab, "CHUNK", 7)  # several chunks, one ragged
    neurons = [0, 5, 17, 100, 200, 255, 3, 9, 60, 61, 62, 130, 131, 190, 191, 254]
    r = neuron_vocab(model, 1, neurons, k=6, apply_ln=apply_ln)
    w = model.ln_final.w if apply_ln else torch.ones(model.cfg.d_model)
    with torch.no_grad():
        for row, i in enumerate(neurons):
            v = model.blocks[1].mlp.W_out[i]
            scores = (
                torch.stack([(v * w * model.W_E[t]).sum() for t in range(model.cfg.d_vocab)])
                if row == 0
                else (v * w) @ model.W_E.T
            )
            top, bottom = scores.topk(6), scores.topk(6, largest=False)
            assert r.top_ids[row].tolist() == top.indices.tolist()
            assert r.bottom_ids[row].tolist() == bottom.indices.tolist()
            assert torch.allclose(r.top_scores[row], top.values, atol=1e-6)
            assert torch.allclose(r.bottom_scores[row], bottom.values, atol=1e-6)
    assert r.labels[:2] == ["L1.N0", "L1.N5"] and r.neurons == neurons and r.layer == 1
    assert r.top_tokens[0][0] == model.to_str_tokens(r.top_ids[0, :1])[0]


def test_apply_ln_changes_the_reading(model):
    a, b = neuron_vocab(model, 0, k=10), neuron_vocab(model, 0, k=10, apply_ln=False)
    assert len(a) == model.cfg.d_mlp
    assert not torch.equal(a.top_ids, b.top_ids)


def test_find_neurons_ranks_a_planted_value_vector_first(model):
    t = model.to_single_token(" Paris")
    with torch.no_grad():
        model.blocks[1].mlp.W_out[37] = 1.0 * model.W_E[t]
    hits = find_neurons(model, " Paris", k=5)
    assert (hits[0][0], hits[0][1]) == (1, 37)
    assert hits.top_tokens[0][0] == " Paris"
    # the score is v · (w ⊙ W_U[:, t]), and the list is ranked
    assert hits[0][2] == pytest.approx(float((model.W_E[t] * model.ln_final.w * model.W_E[t]).sum().detach()), rel=1e-5)
    scores = [s for _, _, s in hits]
    assert scores == sorted(scores, reverse=True)
    # brute force over every neuron of every layer
    with torch.no_grad():
        u = model.ln_final.w * model.W_E[t]
        allscores = torch.stack([b.mlp.W_out @ u for b in model.blocks])
    ref = allscores.flatten().topk(5).indices
    assert [(l * model.cfg.d_mlp + i) for l, i, _ in hits] == ref.tolist()
    # restricted to layer 0, the planted neuron is out of reach
    assert all(l == 0 for l, _, _ in find_neurons(model, " Paris", k=5, layers=[0]))


def test_find_neurons_for_a_set_of_tokens(model):
    ids = [model.to_single_token(s) for s in (" Paris", " Rome", " Berlin")]
    contrast = list(range(1000, 1300))
    with torch.no_grad():
        model.blocks[0].mlp.W_out[11] = model.W_E[ids].sum(0)
    for baseline in (None, "vocabulary", "contrast"):
        hits = find_neurons(
            model,
            [" Paris", " Rome", ids[2]],
            k=3,
            relative=baseline == "vocabulary",
            contrast=contrast if baseline == "contrast" else None,
        )
        assert (hits[0][0], hits[0][1]) == (0, 11) and hits.baseline == baseline
        assert hits.tokens == [" Paris", " Rome", " Berlin"]
        with torch.no_grad():  # score = mean over the set of v · (w ⊙ u_t), minus the baseline's mean
            v, w = model.blocks[0].mlp.W_out[11], model.ln_final.w
            all_scores = (v * w) @ model.W_E.T
            ref = torch.stack([(v * w * model.W_E[t]).sum() for t in ids]).mean()
            ref -= {None: 0.0, "vocabulary": all_scores.mean(), "contrast": all_scores[contrast].mean()}[baseline]
        assert hits[0][2] == pytest.approx(float(ref), rel=1e-4)
    assert "L0.N11" in hits.table() and "minus its contrast mean" in hits.table()
    with pytest.raises(ValueError, match="not both"):
        find_neurons(model, " Paris", relative=True, contrast=[1, 2])


def test_project_of_an_embedding_ranks_its_token_first(model):
    for t in (0, 262, 6342, 31228, 50256):
        r = project(model, model.W_E[t], k=3, apply_ln=False)
        assert int(r.top_ids[0, 0]) == t
    many = project(model, model.W_E[[5, 6]], k=2, apply_ln=False)
    assert many.top_ids[:, 0].tolist() == [5, 6] and many.labels == ["vector 0", "vector 1"]
    # same code path as neuron_vocab
    v = model.blocks[0].mlp.W_out[[4, 9]]
    assert torch.equal(project(model, v, k=5).top_ids, neuron_vocab(model, 0, [4, 9], k=5).top_ids)


def test_top_subupdates_against_brute_force(model):
    n, d = model.cfg.n_layer, model.cfg.d_mlp
    r = top_subupdates(model, PROMPT, k=15, target=" Paris")
    _, cache = model.run_with_cache(PROMPT, names_filter=lambda x: x.endswith("mlp.hook_post"))
    with torch.no_grad():
        m = torch.stack([cache["post", l][0, -1] for l in range(n)])  # [n_layer, d_mlp]
        norms = torch.stack([(m[l, :, None] * model.blocks[l].mlp.W_out).norm(dim=-1) for l in range(n)])
    ref = norms.flatten().topk(15)
    assert [l * d + i for l, i in zip(r.layers, r.neurons)] == ref.indices.tolist()
    assert torch.allclose(r.norms, ref.values, rtol=1e-5)
    assert torch.allclose(r.activations, m[r.layers, r.neurons])
    l0, i0 = r.layers[0], r.neurons[0]
    with torch.no_grad():
        first = project(model, m[l0, i0] * model.blocks[l0].mlp.W_out[i0], k=10)
    assert first.top_tokens[0] == r.top_tokens[0] and r.token == " is"


def test_subupdate_effects_add_up_to_the_mlp_attribution(model):
    """Every neuron of a layer + b_out = that layer's MLP part of the direct logit attribution."""
    for layer in range(model.cfg.n_layer):
        r = top_subupdates(model, PROMPT, layer=layer, k=model.cfg.d_mlp, target=" Paris", position=-2)
        a = logit_attribution(model, PROMPT, " Paris", position=-2, per_head=False)
        with torch.no_grad():
            b = model.blocks[layer].mlp.b_out
            u = model.ln_final.w * model.W_U[:, model.to_single_token(" Paris")]
            b_part = ((b - b.mean()) @ u) / a.scale
        assert float(r.target_effects.sum() + b_part) == pytest.approx(
            float(a.parts[a.labels.index(f"L{layer}.mlp")]), abs=1e-4
        )
        assert set(r.layers) == {layer} and sorted(r.neurons) == list(range(model.cfg.d_mlp))


def test_results_render(model, tmp_path):
    nv = neuron_vocab(model, -1, [1, 2, 3], k=4)
    assert (
        nv.layer == model.cfg.n_layer - 1 and nv.table().count("L1.N") == 2 * 3
    )  # a promoted and a suppressed row each
    assert json.loads(nv.to_json())["neurons"] == [1, 2, 3]
    assert nv.strongest(2).neurons == [nv.neurons[i] for i in nv.top_scores[:, 0].argsort(descending=True)[:2]]
    su = top_subupdates(model, PROMPT, k=5, target=" Paris")
    assert "logit(' Paris') effect" in su.table()
    for name, res in {"nv": nv, "su": su, "fn": find_neurons(model, " Paris", k=4)}.items():
        assert res.save_plot(tmp_path / f"{name}.png").stat().st_size > 3000


def test_bad_inputs_say_what_to_do(model):
    with pytest.raises(IndexError, match=r"layer 2 is out of range: the model has 2 layers \(0..1\)"):
        neuron_vocab(model, 2)
    with pytest.raises(IndexError, match=r"layer -3 is out of range"):
        find_neurons(model, " Paris", layers=[-3])
    with pytest.raises(IndexError, match=r"0..255"):
        neuron_vocab(model, 0, [256])
    with pytest.raises(ValueError, match=r"5 tokens \[' Ou', 'ag'"):
        find_neurons(model, [" Paris", " Ouagadougou"])
    with pytest.raises(ValueError, match=r"4 tokens"):
        top_subupdates(model, PROMPT, target=" Naypyidaw")
    with pytest.raises(ValueError, match=r"\[d_model\] or \[n, d_model\] with d_model = 64"):
        project(model, torch.zeros(65))
    with pytest.raises(ValueError, match="no tokens"):
        find_neurons(model, [])


# ------------------------------------------------------------------ the trained fact model
@pytest.mark.slow
def test_cli_neurons_and_subupdates_smoke(facts_model, tmp_path, capsys):
    assert cli.main(["neurons", "--layer", "5", "--top", "4", "-k", "5"]) == 0
    out = capsys.readouterr().out
    assert len(set(re.findall(r"L5\.N\d+", out))) == 4  # four vectors, each on a promoted and a suppressed row
    assert cli.main(["neurons", "--promotes", " Paris", "--top", "3", "--out", str(tmp_path / "n.png")]) == 0
    assert "neurons promoting ' Paris'" in capsys.readouterr().out and (tmp_path / "n.png").exists()
    assert cli.main(["neurons", "--layer", "9"]) == 2
    assert "0..5" in capsys.readouterr().err
    assert cli.main(["subupdates", PROMPT, "--target", " Paris", "--top", "5", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["neurons"]) == 5 and d["target"] == " Paris"


def test_fact_model_has_neurons_that_read_as_an_object_class(facts_model):
    """Searching for neurons that promote a relation's objects (against every corpus token)
    finds value vectors whose top-10 tokens are mostly that class, far above chance."""
    from gpt2_interp.facts.base import FactBase

    fb = FactBase.load()
    corpus = sorted({t for s in fb.sentences("train") for t in facts_model.to_tokens(s, prepend_bos=False)[0].tolist()})
    for rel in ("city_state", "country_language"):
        cls = {facts_model.to_tokens(" " + o, prepend_bos=False)[0, 0].item() for o in fb.objects(rel)}
        hits = find_neurons(facts_model, sorted(cls), k=3, contrast=corpus)
        top = neuron_vocab(facts_model, hits[0][0], [hits[0][1]], k=10).top_ids[0].tolist()
        coherence = sum(t in cls for t in top) / 10
        chance = len(cls & set(corpus)) / len(corpus)
        assert coherence >= 0.5 > 10 * chance, (rel, coherence, chance)
