"""Interventions on attribution graphs: in the frozen replacement model a feature's change moves each downstream
node by exactly the graph's edge weight (and a last-layer feature moves the logits by the closed form through the
final norm and the unembedding); with features free a small change follows the graph's direct and indirect
prediction; in the real model a change of nothing leaves the logits exactly as the plain model's, and a change
is a hand-written hook adding Δ · W_dec to the MLP output. Bad features are refused in one line; two-hop prompts
chain the fact base's own facts."""

from __future__ import annotations

import json

import pytest
import torch

from gpt2_interp.facts import Fact, FactBase, two_hop_cases, two_hop_chains
from gpt2_interp.graphs import AttributionConfig, attribute, intervene, prune_graph, two_hop_check
from tests.unit.transcoder_cases import facts_with_transcoders


def _setup(dtype: torch.dtype, prompt: str = "The capital of France is"):
    model, ts, tokens = facts_with_transcoders(dtype, prompt)
    graph = attribute(model, ts, tokens, AttributionConfig(batch_size=64, max_n_logits=4, desired_logit_prob=0.9999))
    return model, ts, graph


@pytest.fixture(scope="module")
def f64():
    """gpt2-facts and its transcoders in float64: the frozen model's changes are exact to ~1e-12, so a comparison
    with the graph's edges (stored in float32) tests the edges, not float32 rounding."""
    return _setup(torch.float64)


@pytest.fixture(scope="module")
def f32():
    return _setup(torch.float32)


def _key(graph, i: int) -> tuple[int, int, int]:
    L, p, f = graph.features[i].tolist()
    return (L, p, f)


def test_doubling_a_feature_moves_each_downstream_node_by_its_edge_weight(f64):
    model, ts, g = f64
    s = int((g.features[:, 0] == 1).nonzero()[0, 0])  # a layer-1 feature: layers 2..5 downstream
    r = intervene(model, ts, g, _key(g, s), scale=2.0)  # Δ = a_s: the change the edge A[:, s] describes
    edges = g.adjacency[: g.n_features, s].double()
    assert edges.abs().max() > 1e-3
    assert ((r.node_held - edges).abs() <= 1e-4 * edges.abs() + 1e-9).all()
    assert (r.node_held[g.features[:, 0] <= 1] == 0).all()  # nothing in its own or an earlier layer moves
    logit_edges = torch.stack([g.adjacency[g.logit_index(i), s] for i in range(len(g.logit_tokens))]).double()
    assert ((r.frozen_held - logit_edges).abs() <= 1e-4 * logit_edges.abs() + 1e-9).all()
    torch.testing.assert_close(r.graph_direct, logit_edges, rtol=1e-6, atol=1e-12)
    assert r.direct_error <= 1e-4


def test_a_groups_change_is_the_sum_of_its_members_edges_times_their_changes(f64):
    model, ts, g = f64
    members = [int((g.features[:, 0] == L).nonzero()[1, 0]) for L in (0, 2)]
    r = intervene(model, ts, g, [_key(g, i) for i in members], value=0.5)
    # by hand: Σ_s A[t, s] (0.5 − a_s) / a_s over the members, members themselves held (their rows not summed)
    want = sum(
        g.adjacency[: g.n_features, s].double() * (0.5 - g.activations[s].double()) / g.activations[s] for s in members
    )
    assert ((r.node_held - want).abs() <= 1e-4 * want.abs() + 1e-9).all()
    assert r.direct_error <= 1e-4


def test_a_last_layer_feature_moves_the_logits_by_the_closed_form(f64):
    model, ts, g = f64
    last, pos = model.cfg.n_layer - 1, g.n_pos - 1
    at = ((g.features[:, 0] == last) & (g.features[:, 1] == pos)).nonzero()[0, 0]
    L, p, f = _key(g, int(at))
    r = intervene(model, ts, g, (L, p, f), scale=0.0)
    # Δ W_dec[f] enters the final norm at the last position: (v − mean v) / scale · w, then W_U − mean W_U
    _, cache = model.run_with_cache(g.tokens[None], names_filter=["ln_final.hook_scale"])
    s = cache["ln_final.hook_scale"][0, -1]
    v = -float(g.activations[int(at)]) * ts[L].W_dec.detach()[f]
    final = (v - v.mean()) / s * model.ln_final.w.detach()
    W_U = model.unembed.W_U.detach()
    want = final @ (W_U[:, r.tokens] - W_U.mean(1, keepdim=True))
    for got in (r.graph_direct, r.graph_total, r.frozen_held, r.frozen_free):  # nothing downstream to carry it
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-9)


def test_with_features_free_a_small_change_follows_the_graphs_direct_and_indirect_paths(f64):
    model, ts, g = f64
    s = int((g.features[:, 0] == 0).nonzero()[2, 0])
    r = intervene(model, ts, g, _key(g, s), scale=1.01)  # small: no feature enters or leaves a TopK set
    assert (r.node_total - r.node_direct).abs().max() > 1e-6  # indirect paths carry part of it
    torch.testing.assert_close(r.node_free, r.node_total, rtol=1e-4, atol=1e-9)
    torch.testing.assert_close(r.frozen_free, r.graph_total, rtol=1e-4, atol=1e-9)
    # a pruned graph predicts through its kept edges only; the unpruned one through all of them
    pruned = prune_graph(g, 0.8, 0.98)
    rp = intervene(model, ts, pruned, _key(g, s), scale=1.01) if pruned.node_mask[s] else None
    assert r.graph_pruned is None and (rp is None or rp.graph_pruned is not None)


def test_a_change_of_nothing_leaves_the_real_model_exactly_as_it_is(f32):
    model, ts, g = f32
    keys = [_key(g, i) for i in (0, g.n_features // 2, g.n_features - 1)]
    with torch.no_grad():
        plain = model(g.tokens[None])[0, -1].double().softmax(-1)
    for r in (
        intervene(model, ts, g, keys, scale=1.0),
        intervene(model, ts, g, keys[0], value=float(g.activations[0])),
    ):
        assert (r.real == 0).all() and (r.frozen_held == 0).all() and (r.node_held == 0).all()
        assert torch.equal(r.prob_after, plain[r.tokens]) and torch.equal(r.prob_before, plain[r.tokens])


def test_the_real_model_intervention_is_a_hook_adding_the_change_times_the_decoder_row(f32):
    model, ts, g = f32
    i, j = int((g.features[:, 0] == 1).nonzero()[0, 0]), int((g.features[:, 0] == 3).nonzero()[-1, 0])
    (L1, p1, f1), (L2, p2, f2) = _key(g, i), _key(g, j)
    answer = int(model.to_tokens(" Paris", prepend_bos=False)[0, 0])
    r = intervene(model, ts, g, [(L1, p1, f1), (L2, p2, f2)], scale=-1.0, tokens=[answer, 11])
    d1, d2 = -2 * float(g.activations[i]), -2 * float(g.activations[j])

    def hook(layer: int, p: int, f: int, d: float):
        def add(x, hook):
            x = x.clone()
            x[:, p] += d * ts[layer].W_dec.detach()[f]
            return x

        return (f"blocks.{layer}.hook_mlp_out", add)

    with torch.no_grad():
        before = model(g.tokens[None])[0, -1].double()
        with model.hooks([hook(L1, p1, f1, d1), hook(L2, p2, f2, d2)]):
            after = model(g.tokens[None])[0, -1].double()
    ids = torch.tensor([answer, 11])
    want = (after[ids] - after.mean()) - (before[ids] - before.mean())
    assert want.abs().max() > 1e-3
    torch.testing.assert_close(r.real, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(r.prob_after, after.softmax(-1)[ids], rtol=1e-5, atol=1e-9)
    assert r.token_strs == [" Paris", ","] and torch.isnan(r.graph_total[1]) == (11 not in g.logit_tokens.tolist())
    text = r.table()
    assert text.splitlines()[0].startswith(f"intervention: L{L1} p{p1} F{f1}") and "' Paris'" in text


def test_bad_features_are_refused_in_one_line_naming_the_value(f32):
    model, ts, g = f32
    inactive = next(f for f in range(64) if not ((g.features == torch.tensor([2, 3, f])).all(-1)).any())
    cases = [
        ((6, 1, 0), {"scale": 0.0}, "layer 6 is out of range: the graph has layers 0..5"),
        ((1, 9, 0), {"scale": 0.0}, "position 9 is out of range: the prompt has positions 0..5"),
        ((1, 1, 64), {"scale": 0.0}, "feature 64 is out of range: layer 1's transcoder has features 0..63"),
        ((2, 3, inactive), {"scale": 0.0}, rf"\(2, 3, {inactive}\) is not a node of the graph"),
        (_key(g, 0), {}, "give exactly one of scale and value"),
        (_key(g, 0), {"scale": 1.0, "value": 0.0}, "give exactly one of scale and value"),
        ([_key(g, 0), _key(g, 0)], {"scale": 0.0}, "is given twice"),
        (_key(g, 0), {"scale": float("nan")}, "scale must be a finite number"),
        (_key(g, 0), {"scale": 0.0, "tokens": [10**6]}, "token id 1000000 is out of range"),
    ]
    for features, kw, message in cases:
        with pytest.raises(ValueError, match=message) as e:
            intervene(model, ts, g, features, **kw)
        assert "\n" not in str(e.value)
    with pytest.raises(TypeError, match="features"):
        intervene(model, ts, g, "L1 F3")  # type: ignore[arg-type]


def test_two_hop_prompts_chain_a_hand_made_fact_base():
    fb = FactBase(
        [
            Fact("city_country", "Aalborg", "Denmark"),
            Fact("city_country", "Lyon", "France"),
            Fact("city_country", "Paris", "France"),  # the city is the answer: left out
            Fact("city_country", "Monaco Ville", "Monaco"),  # names its bridge: left out
            Fact("city_country", "Tromsø", "Norway"),  # Norway has no capital fact: no chain
            Fact("country_capital", "Denmark", "Copenhagen"),
            Fact("country_capital", "France", "Paris"),
            Fact("country_capital", "Monaco", "Monaco"),
            Fact("country_continent", "France", "Europe"),
        ]
    )
    assert two_hop_chains(fb) == {
        ("city_country", "country_capital"): 4,
        ("city_country", "country_continent"): 2,
        ("country_capital", "city_country"): 1,  # Paris is a capital and a city of the base
    }
    cases = two_hop_cases(fb)
    assert [(c.subject, c.bridge, c.target) for c in cases] == [
        ("Aalborg", "Denmark", " Copenhagen"),
        ("Lyon", "France", " Paris"),
    ]
    assert cases[0].prompt == "The capital of the country that contains Aalborg is"
    assert [c.prompt for c in two_hop_cases(fb, "country_continent")] == [
        "The continent of the country that contains Lyon is",
        "The continent of the country that contains Paris is",  # Paris names neither France nor Europe
    ]
    with pytest.raises(ValueError, match="no two-hop template for city_state → country_capital"):
        two_hop_cases(fb, first="city_state")


def test_two_hop_prompts_of_the_shipped_fact_base_are_its_own_facts():
    fb = FactBase.load()
    cases = two_hop_cases(fb)
    capital = {f.subject: f.object for f in fb.facts("country_capital")}
    assert len(cases) > 500
    for c in cases:
        assert c.first in fb.facts("city_country") and c.second in fb.facts("country_capital")
        assert c.first.subject == c.subject and c.first.object == c.bridge == c.second.subject
        assert capital[c.bridge] == c.second.object and c.bridge not in c.prompt and c.second.object not in c.prompt
    assert any((c.subject, c.bridge, c.target) == ("Aalborg", "Denmark", " Copenhagen") for c in cases)
    assert len(two_hop_cases(fb, n=3)) == 3


def test_two_hop_check_finds_the_features_that_promote_the_bridge_and_suppresses_them(f32):
    model, ts, _ = f32
    case = two_hop_cases(FactBase.load(), n=1)[0]
    g = attribute(model, ts, model.to_tokens(case.prompt)[0], AttributionConfig(batch_size=64, max_n_logits=3))
    check = two_hop_check(model, ts, g, case, rank=200)
    bridge = int(model.to_tokens(" " + case.bridge, prepend_bos=False)[0, 0])
    # by hand: the features among whose 200 most promoted tokens (W_dec row · ln_final gain · W_U) the bridge is
    rows = torch.stack([ts[L].W_dec.detach()[f] for L, _, f in g.features.tolist()])  # [n_features, d_model]
    effect = (rows * model.ln_final.w.detach()) @ model.unembed.W_U.detach()  # [n_features, d_vocab]
    want = g.features[(effect > effect[:, bridge : bridge + 1]).sum(1) < 200].tolist()
    assert want and check.bridge_features.tolist() == want and check.present
    assert check.suppressed is not None and check.suppressed.features.tolist() == want
    assert (check.suppressed.new == 0).all() and check.suppressed.token_strs[1] == " " + case.bridge
    with torch.no_grad():
        p = model(g.tokens[None])[0, -1].double().softmax(-1)
    answer = int(model.to_tokens(case.target, prepend_bos=False)[0, 0])
    assert check.answer_prob == float(p[answer]) and check.answer_rank == int((p > p[answer]).sum())
    assert case.prompt in check.table()
    # the answer (rank 11 in the model) is not a logit node: no graph prediction, None in the JSON
    saved = json.loads(check.to_json())
    assert saved["suppressed"]["graph_total"][0] is None and saved["bridge_features"] == want


def _same_result(a, b) -> None:
    for name in ("features", "old", "new", "tokens", "graph_direct", "graph_total", "frozen_held", "frozen_free"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=1e-9, atol=1e-12, equal_nan=True)
    for name in ("real", "prob_before", "prob_after", "node_direct", "node_held", "node_total", "node_free"):
        torch.testing.assert_close(getattr(a, name), getattr(b, name), rtol=1e-9, atol=1e-12, equal_nan=True)
    assert a.top_before == b.top_before and a.top_after == b.top_after


def test_a_clt_with_zero_cross_layer_decoders_intervenes_as_the_per_layer_transcoders(f64):
    from gpt2_interp.graphs.clt import CrossLayerTranscoder

    model, ts, g = f64
    clt = CrossLayerTranscoder.from_transcoders(ts)
    members = [_key(g, int((g.features[:, 0] == L).nonzero()[0, 0])) for L in (1, 3)]
    want = intervene(model, ts, g, members, scale=3.0)
    assert want.real.abs().max() > 1e-3
    _same_result(intervene(model, clt, g, members, scale=3.0), want)


def test_a_clt_with_zero_cross_layer_decoders_finds_the_per_layer_bridge_features(f32):
    from gpt2_interp.graphs.clt import CrossLayerTranscoder

    model, ts, _ = f32
    case = two_hop_cases(FactBase.load(), n=1)[0]
    g = attribute(model, ts, model.to_tokens(case.prompt)[0], AttributionConfig(batch_size=64, max_n_logits=3))
    want = two_hop_check(model, ts, g, case, rank=200)
    got = two_hop_check(model, CrossLayerTranscoder.from_transcoders(ts), g, case, rank=200)
    assert want.present and torch.equal(got.bridge_features, want.bridge_features)
    assert torch.equal(got.bridge_ranks, want.bridge_ranks)
    assert got.suppressed is not None and want.suppressed is not None
    _same_result(got.suppressed, want.suppressed)
