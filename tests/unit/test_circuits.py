"""Edge-level circuits checked against independent references: a hand-written per-edge hook loop,
the corrupted run itself, a metric linear in the patched activations, and the known edge count of
GPT-2 small's graph (the EAP-IG paper's)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import torch

from gpt2_interp.analysis.circuits import (
    Circuit,
    circuit,
    edge_patch,
    edge_scores,
    evaluate,
    faithfulness_curve,
    graph_of,
    greedy_order,
    pairs_of,
    prune,
    run_with_edges,
)
from gpt2_interp.analysis.circuits.graph import Graph
from gpt2_interp.analysis.metrics import logit_diff, prob
from gpt2_interp.io.integrity import IntegrityError, UnverifiedFileWarning
from gpt2_interp.model import GPT2Config, HookedGPT2
from gpt2_interp.model.config import llama_config

V = 64
CONFIGS = {
    "gpt2": GPT2Config(n_layer=2, d_model=32, n_head=4, d_mlp=64, n_ctx=16, d_vocab=V, name="tiny-gpt2"),
    "gqa": llama_config(n_layer=2, d_model=32, n_head=4, n_kv_heads=2, d_mlp=48, n_ctx=16, d_vocab=V),
}


def _model(kind: str) -> HookedGPT2:
    m = HookedGPT2(CONFIGS[kind], seed=0).eval()
    with torch.no_grad():  # larger weights than GPT-2's init, so that edges have visible effects
        for p in m.parameters():
            p.mul_(4.0)
    return m


def _pairs() -> tuple[torch.Tensor, torch.Tensor, object]:
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, V, (3, 6), generator=g)
    corrupted = clean.clone()
    corrupted[:, 2] = (clean[:, 2] + 1 + torch.randint(0, V - 1, (3,), generator=g)) % V
    return clean, corrupted, logit_diff(torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6]))


def _setup(kind: str) -> tuple[HookedGPT2, torch.Tensor, torch.Tensor, Any, Any]:
    """The model of ``kind``, the prompt pairs (clean, corrupted, and as ``pairs_of`` holds them) and its graph."""
    model = _model(kind)
    clean, corrupted, metric = _pairs()
    return model, clean, corrupted, pairs_of(model, clean, corrupted, metric), graph_of(model)


def _sender_out(model: HookedGPT2, cache, sender: str) -> torch.Tensor:
    """A sender's output ``[b, p, d_model]`` in ``cache``, written out from its name (the input embedding, an
    MLP's output, or one head's ``z @ W_O``)."""
    if sender == "input":
        return cache["blocks.0.hook_resid_pre"]
    if sender.startswith("m"):
        return cache[f"blocks.{int(sender[1:])}.hook_mlp_out"]
    l, h = map(int, re.fullmatch(r"a(\d+)\.h(\d+)", sender).groups())
    return cache[f"blocks.{l}.attn.hook_z"][:, :, h] @ model.blocks[l].attn.W_O[h]


def _receiver_hook(n_layer: int, receiver: str) -> tuple[str, int | None]:
    """The hook point a receiver's input passes through, and its head (or key/value head) index there."""
    if receiver == "logits":
        return f"blocks.{n_layer - 1}.hook_resid_post", None
    if receiver.startswith("m"):
        return f"blocks.{int(receiver[1:])}.hook_mlp_in", None
    l, h, kind = re.fullmatch(r"a(\d+)\.h(\d+)<([qkv])>", receiver).groups()
    return f"blocks.{l}.hook_{kind}_input", int(h)


def _hand_loop(model: HookedGPT2, clean: torch.Tensor, corrupted: torch.Tensor, metric, edges: list[str]):
    """The metric change of each edge, one forward pass per edge with one hook written out here."""
    n = model.cfg.n_layer
    names = ["blocks.0.hook_resid_pre"] + [f"blocks.{l}.attn.hook_{x}" for l in range(n) for x in ("z",)]
    names += [f"blocks.{l}.hook_mlp_out" for l in range(n)]
    with torch.no_grad():
        _, c = model.run_with_cache(clean, names_filter=names)
        _, k = model.run_with_cache(corrupted, names_filter=names)
        base = metric(model(clean)[:, -1])

    results = []
    model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(True)
    try:
        for e in edges:
            sender, receiver = e.split("->")
            delta = _sender_out(model, k, sender) - _sender_out(model, c, sender)
            hook, idx = _receiver_hook(n, receiver)

            def fn(act, hook, delta=delta, idx=idx):
                act = act.clone()
                if idx is None:
                    act += delta
                else:
                    act[:, :, idx] += delta
                return act

            with torch.no_grad():
                logits = model.run_with_hooks(clean, fwd_hooks=[(hook, fn)])
            results.append(metric(logits[:, -1]) - base)
    finally:
        model.set_use_split_qkv_input(False)
        model.set_use_hook_mlp_in(False)
    return torch.stack(results)


@pytest.mark.parametrize("kind", ["gpt2", "gqa"])
def test_exact_edge_patching_equals_a_hand_written_hook_loop(kind):
    model, clean, corrupted, pairs, graph = _setup(kind)
    exact = edge_patch(model, graph, pairs)
    assert exact.shape == (graph.n_edges, 3)
    some = list(range(0, graph.n_edges, 3))  # a third of the edges, every receiver kind among them
    ref = _hand_loop(model, clean, corrupted, pairs.metric, [graph.edges[i] for i in some])
    assert ref.abs().max() > 1e-2  # the edges do something
    torch.testing.assert_close(exact[some], ref, atol=1e-5, rtol=0)
    # the general primitive, one edge per row, agrees on every edge
    general = run_with_edges(model, graph, pairs, torch.eye(graph.n_edges)) - pairs.clean_metric
    torch.testing.assert_close(general, exact, atol=1e-5, rtol=0)


def _hand_masked(model: HookedGPT2, clean: torch.Tensor, corrupted: torch.Tensor, metric, patched: dict):
    """The metric with several edges patched in one run, written out edge by edge: ``patched`` maps an
    edge name to the positions it is patched at (None: all). Each receiver's input gets ``corrupted −
    current`` of each of its patched senders, the current output read in the same run."""
    n = model.cfg.n_layer
    with torch.no_grad():
        _, k = model.run_with_cache(corrupted)

    current: dict = {}

    def keep(act, hook):
        current[hook.name] = act.clone()

    def receive(act, hook):
        act = act.clone()
        for e, pos in patched.items():
            sender, receiver = e.split("->")
            name, idx = _receiver_hook(n, receiver)
            if name != hook.name:
                continue
            delta = _sender_out(model, k, sender) - _sender_out(model, current, sender)
            at = slice(None) if pos is None else pos
            if idx is None:
                act[:, at] += delta[:, at]
            else:
                act[:, at, idx] += delta[:, at]
        return act

    senders = ["blocks.0.hook_resid_pre"] + [
        f"blocks.{l}.{x}" for l in range(n) for x in ("attn.hook_z", "hook_mlp_out")
    ]
    receivers = [f"blocks.{l}.hook_{x}" for l in range(n) for x in ("q_input", "k_input", "v_input", "mlp_in")]
    receivers.append(f"blocks.{n - 1}.hook_resid_post")
    model.set_use_split_qkv_input(True)
    model.set_use_hook_mlp_in(True)
    try:
        with torch.no_grad():
            logits = model.run_with_hooks(
                clean, fwd_hooks=[(s, keep) for s in senders] + [(r, receive) for r in receivers]
            )
    finally:
        model.set_use_split_qkv_input(False)
        model.set_use_hook_mlp_in(False)
    return metric(logits[:, -1])


@pytest.mark.parametrize("kind", ["gpt2", "gqa"])
def test_circuits_of_every_size_equal_a_hand_written_hook_loop(kind):
    """Rows from a few edges patched to all but a few (each row takes the cheaper of its two sums)."""
    model, clean, corrupted, pairs, graph = _setup(kind)
    g = torch.Generator().manual_seed(2)
    masks = torch.stack([torch.rand(graph.n_edges, generator=g) < p for p in (0.02, 0.3, 0.7, 0.98)])
    got = run_with_edges(model, graph, pairs, masks)
    ref = torch.stack(
        [
            _hand_masked(
                model, clean, corrupted, pairs.metric, {graph.edges[i]: None for i in m.nonzero()[:, 0].tolist()}
            )
            for m in masks
        ]
    )
    assert (ref - pairs.clean_metric).abs().amax(1).min() > 1e-3  # every row changes the metric
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["gpt2", "gqa"])
def test_per_position_edges_equal_a_hand_written_hook_loop(kind):
    model, clean, corrupted, pairs, graph = _setup(kind)
    some = torch.arange(0, graph.n_edges, 7)  # every receiver kind among them
    exact = edge_patch(model, graph, pairs, some, per_position=True)  # [edges, pos, pairs]
    assert exact.shape == (some.numel(), 6, 3)
    assert exact[:, :2].abs().max() == 0  # nothing differs before the corrupted token (position 2)
    for i in range(0, some.numel(), 5):
        for p in (2, 4, 5):
            ref = _hand_masked(model, clean, corrupted, pairs.metric, {graph.edges[int(some[i])]: [p]})
            torch.testing.assert_close(exact[i, p], ref - pairs.clean_metric, atol=1e-5, rtol=0)
    assert exact[:, 2:].abs().max() > 1e-2
    # the general primitive with per-position masks: random (edge, position) sets, and an edge at every
    # position, which is the position-free edge
    g = torch.Generator().manual_seed(3)
    masks = torch.rand(2, 6, graph.n_edges, generator=g) < 0.2
    got = run_with_edges(model, graph, pairs, masks)
    for row, m in zip(got, masks):
        patched = {graph.edges[e]: m[:, e].nonzero()[:, 0].tolist() for e in m.any(0).nonzero()[:, 0].tolist()}
        torch.testing.assert_close(row, _hand_masked(model, clean, corrupted, pairs.metric, patched), atol=1e-5, rtol=0)
    flat = (torch.rand(3, graph.n_edges, generator=g) < 0.3).float()
    torch.testing.assert_close(
        run_with_edges(model, graph, pairs, flat[:, None].expand(3, 6, -1)),
        run_with_edges(model, graph, pairs, flat),
        atol=1e-5,
        rtol=0,
    )


def test_per_position_eap_equals_exact_patching_where_the_metric_is_linear_in_the_receiver():
    """Edges into the logits, linear final norm: per position, EAP is the whole effect; only the last
    position (where the metric reads the logits) has one, equal to the position-free edge's."""
    model = _model("gqa")
    with torch.no_grad():
        model.ln_final.eps = 1e12
        model.ln_final.w.mul_(1e6)
    clean, corrupted, metric = _pairs()
    exact = edge_scores(model, clean, corrupted, metric, method="exact", per_position=True)
    eap = edge_scores(model, clean, corrupted, metric, method="eap", per_position=True)
    whole = edge_scores(model, clean, corrupted, metric, method="exact")
    into = torch.tensor([e.endswith("->logits") for e in exact.edges])
    assert exact.scores.shape == (6, exact.graph.n_edges) and exact.scores[-1, into].abs().max() > 1e-2
    torch.testing.assert_close(eap.scores[:, into], exact.scores[:, into], atol=1e-6, rtol=1e-5)
    assert exact.scores[:-1, into].abs().max() < 1e-6
    torch.testing.assert_close(exact.total()[into], whole.scores[into], atol=1e-5, rtol=0)


def test_per_position_edges_refuse_padded_prompts():
    model = _model("gpt2")
    clean = torch.tensor([[0, 5, 7, 9], [5, 6, 7, 8]])
    corrupted = clean.clone()
    corrupted[:, 2] += 1
    pairs = pairs_of(model, clean, corrupted, logit_diff(1, 2))
    pairs.mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    graph = graph_of(model)
    with pytest.raises(ValueError, match="one token length"):
        edge_patch(model, graph, pairs, [0], per_position=True)
    with pytest.raises(ValueError, match="one token length"):
        run_with_edges(model, graph, pairs, torch.zeros(1, 4, graph.n_edges))


def test_edges_patched_in_chunks_of_rows_and_pairs_give_the_same_metric(monkeypatch):
    from gpt2_interp.analysis.circuits import edges as edges_module

    model, _, _, pairs, graph = _setup("gqa")
    masks = (torch.rand(5, graph.n_edges, generator=torch.Generator().manual_seed(0)) > 0.5).float()
    whole = run_with_edges(model, graph, pairs, masks)
    monkeypatch.setattr(edges_module, "EDGE_MEMORY", 1)  # one mask row and one pair per pass
    torch.testing.assert_close(run_with_edges(model, graph, pairs, masks), whole, atol=1e-5, rtol=0)


def test_exact_edge_patching_of_a_full_vocabulary_metric_equals_the_general_primitive():
    """A metric that reads every logit (a probability) takes the engine's full unembedding path."""
    model = _model("gpt2")
    clean, corrupted, _ = _pairs()
    pairs = pairs_of(model, clean, corrupted, prob(torch.tensor([1, 2, 3])))
    graph = graph_of(model)
    some = torch.arange(0, graph.n_edges, 5)
    exact = edge_patch(model, graph, pairs, some)
    general = run_with_edges(model, graph, pairs, torch.eye(graph.n_edges)[some]) - pairs.clean_metric
    assert exact.abs().max() > 1e-4
    torch.testing.assert_close(exact, general, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("kind", ["gpt2", "gqa"])
def test_every_edge_patched_is_the_corrupted_run_and_none_is_the_clean_run(kind):
    model, clean, corrupted, pairs, graph = _setup(kind)
    m = run_with_edges(model, graph, pairs, torch.stack([torch.ones(graph.n_edges), torch.zeros(graph.n_edges)]))
    with torch.no_grad():
        corr = pairs.metric(model(corrupted)[:, -1])
        cl = pairs.metric(model(clean)[:, -1])
    torch.testing.assert_close(m[0], corr, atol=1e-5, rtol=0)
    torch.testing.assert_close(m[1], cl, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["gpt2", "gqa"])
def test_eap_equals_exact_patching_where_the_metric_is_linear_in_the_receiver(kind):
    """With ``ln_final`` made linear (a huge eps, gain scaled to match) the metric is linear in the final
    residual, so for every edge into the logits EAP's first-order term is the whole effect."""
    model = _model(kind)
    with torch.no_grad():
        model.ln_final.eps = 1e12
        model.ln_final.w.mul_(1e6)
    clean, corrupted, metric = _pairs()
    exact = edge_scores(model, clean, corrupted, metric, method="exact")
    eap = edge_scores(model, clean, corrupted, metric, method="eap")
    into = torch.tensor([e.endswith("->logits") for e in exact.edges])
    assert exact.scores[into].abs().max() > 1e-2
    torch.testing.assert_close(eap.scores[into], exact.scores[into], atol=1e-6, rtol=1e-5)


def test_eap_ig_scores_sum_over_positions_and_agree_with_exact_patching():
    model = _model("gpt2")
    clean, corrupted, metric = _pairs()
    exact = edge_scores(model, clean, corrupted, metric, method="exact")
    for path in ("inputs", "activations"):
        ig = edge_scores(model, clean, corrupted, metric, method="eap-ig", ig_steps=4, ig_path=path)
        per = edge_scores(model, clean, corrupted, metric, "eap-ig", ig_steps=4, ig_path=path, per_position=True)
        assert per.scores.shape == (6, ig.graph.n_edges)
        torch.testing.assert_close(per.total(), ig.scores, atol=1e-6, rtol=1e-5)
        assert per.scores[:2].abs().max() == 0  # before the first differing token nothing differs
        assert torch.corrcoef(torch.stack([ig.scores, exact.scores]))[0, 1] > 0.8


def test_gpt2_small_graph_has_the_eap_ig_papers_edge_count():
    g = Graph(12, 12, 12)  # GPT-2 small; the EAP-IG graph of Hanna et al. has 32,491 edges
    assert (g.n_senders, g.n_receivers, g.n_edges) == (157, 445, 32491)
    assert g.edges[0] == "input->a0.h0<q>" and g.edge("a11.h3->logits") >= 0
    gqa = Graph(30, 9, 3)  # SmolLM2-135M: key/value receivers per KV head
    assert gqa.n_receivers == 30 * (9 + 2 * 3 + 1) + 1


def test_faithfulness_is_one_for_the_whole_graph_and_zero_for_the_empty_circuit():
    model = _model("gqa")
    clean, corrupted, metric = _pairs()
    scores = edge_scores(model, clean, corrupted, metric, method="eap")
    whole = evaluate(model, circuit(scores, fraction=1.0), clean, corrupted, metric)
    empty = evaluate(model, circuit(scores, top=0), clean, corrupted, metric)
    assert len(whole.edges) == scores.graph.n_edges
    assert whole.faithfulness == pytest.approx(1.0, abs=1e-4) and whole.completeness == pytest.approx(0.0, abs=1e-4)
    assert empty.faithfulness == pytest.approx(0.0, abs=1e-4) and empty.completeness == pytest.approx(1.0, abs=1e-4)
    curve = faithfulness_curve(model, scores, clean, corrupted, metric, sizes=[0, 10, scores.graph.n_edges])
    assert curve.faithfulness[0, 0] == pytest.approx(0.0, abs=1e-4)
    assert curve.faithfulness[0, -1] == pytest.approx(1.0, abs=1e-4)


def test_pruning_drops_edges_that_cannot_reach_the_logits_or_come_from_the_input():
    g = Graph(2, 2, 2)
    keep = torch.zeros(g.n_edges, dtype=torch.bool)
    for e in ("input->a0.h0<q>", "a0.h0->logits", "a0.h1->logits", "input->m1", "a1.h0->m1"):
        keep[g.edge(e)] = True
    kept = {g.edges[i] for i in prune(g, keep).nonzero()[:, 0].tolist()}
    # a0.h1 reads nothing in the circuit; m1 writes nothing the circuit reads; a1.h0 reads nothing
    assert kept == {"input->a0.h0<q>", "a0.h0->logits"}


def _greedy_by_definition(g: Graph, scores: torch.Tensor) -> list[int]:
    """The greedy rule written out by its definition: over and over, the highest-|score| edge not yet
    taken whose receiver is read by the logits or by a node that is the sender of an edge already taken."""
    es, _ = g.edge_index
    kv_share = g.n_head // g.n_kv
    sender_name = {int(es[e]): g.edges[e].split("->")[0] for e in range(g.n_edges)}
    taken: list[int] = []
    in_circuit = {"logits"}
    while len(taken) < g.n_edges:
        best = None
        for e in range(g.n_edges):
            if e in taken:
                continue
            dst = g.edges[e].split("->")[1]
            node, kind = dst.split("<")[0], dst[-2] if dst.endswith(">") else ""
            reading = {node}
            if kind in ("k", "v"):  # key/value head j's input: read by the query heads of its group
                layer, j = node[1:].split(".h")
                reading = {f"a{layer}.h{h}" for h in range(int(j) * kv_share, (int(j) + 1) * kv_share)}
            if reading & in_circuit and (best is None or abs(scores[e]) > abs(scores[best])):
                best = e
        taken.append(best)
        in_circuit.add(sender_name[int(es[best])])
    return taken


@pytest.mark.parametrize("shape", [(2, 2, 2), (3, 4, 2)])
def test_greedy_selection_follows_its_definition_from_the_logits_up(shape):
    g = Graph(*shape)
    scores = torch.randn(g.n_edges, generator=torch.Generator().manual_seed(0))
    order = greedy_order(g, scores).tolist()
    assert sorted(order) == list(range(g.n_edges))  # every edge is reached
    assert order == _greedy_by_definition(g, scores)
    assert g.edges[order[0]].endswith("->logits")  # the first edge can only go into the logits


def test_a_greedy_circuit_reaches_the_logits_and_is_measured():
    model = _model("gqa")
    clean, corrupted, metric = _pairs()
    scores = edge_scores(model, clean, corrupted, metric, method="eap")
    g = scores.graph
    c = circuit(scores, top=12, selection="greedy", prune_dangling=False)
    assert set(c.edges) == {g.edges[i] for i in greedy_order(g, scores.total())[:12].tolist()}
    sizes = [0, 12, 40, g.n_edges]
    curve = faithfulness_curve(model, scores, clean, corrupted, metric, sizes=sizes, selection="greedy")
    assert curve.methods == ["eap-greedy"]
    assert curve.kept[0].tolist() == [len(circuit(scores, top=k, selection="greedy").edges) for k in sizes]
    assert curve.faithfulness[0, 0] == pytest.approx(0.0, abs=1e-4)
    assert curve.faithfulness[0, -1] == pytest.approx(1.0, abs=1e-4)
    with pytest.raises(ValueError, match="not threshold"):
        circuit(scores, threshold=0.1, selection="greedy")
    with pytest.raises(ValueError, match="selection must be one of"):
        circuit(scores, top=3, selection="best")


def test_a_circuit_saves_to_json_and_loads_back(tmp_path):
    model = _model("gpt2")
    clean, corrupted, metric = _pairs()
    c = evaluate(model, circuit(edge_scores(model, clean, corrupted, metric, "eap"), top=20), clean, corrupted, metric)
    back = Circuit.load(c.save(tmp_path / "c.json"))
    assert back.edges == c.edges and back.faithfulness == pytest.approx(c.faithfulness, rel=1e-5)
    assert torch.equal(back.mask(), c.mask()) and back.nodes() == c.nodes()
    assert "faithfulness" in back.table()


def test_bad_input_is_refused_with_a_clear_error(tmp_path):
    model = _model("gpt2")
    clean, corrupted, metric = _pairs()
    with pytest.raises(ValueError, match="no edge can change"):
        pairs_of(model, clean, clean, metric)
    with pytest.raises(ValueError, match="method must be one of"):
        edge_scores(model, clean, corrupted, metric, method="acdc")
    scores = edge_scores(model, clean, corrupted, metric, "eap")
    with pytest.raises(ValueError, match="exactly one of"):
        circuit(scores, top=3, fraction=0.1)
    with pytest.raises(ValueError, match="graph_of"):
        Graph(3, 4, 4).fits(model)
    with pytest.raises(KeyError, match="closest"):
        scores.graph.edge("a0.h0->a1.h9<q>")
    (tmp_path / "x.json").write_text('{"edges": []}')
    with pytest.raises(ValueError, match="not a circuit file"):
        Circuit.load(tmp_path / "x.json")


def test_circuit_figures_draw_every_kept_edge_and_each_curve(tmp_path):
    model = _model("gqa")
    clean, corrupted, metric = _pairs()
    scores = edge_scores(model, clean, corrupted, metric, "eap")
    c = evaluate(model, circuit(scores, top=15), clean, corrupted, metric)
    fig = c.plot()
    assert len(fig.axes[0].lines) == len(c.edges) and c.faithfulness is not None
    curve = faithfulness_curve(model, [scores], clean, corrupted, metric, sizes=[5, 20, 40])
    assert [ln.get_label() for ln in curve.plot().axes[0].lines][:1] == ["eap"]
    assert scores.save_plot(tmp_path / "scores.png").stat().st_size > 0


def _normalised(pairs, value: torch.Tensor) -> float:
    clean, corr = float(pairs.clean_metric.mean()), float(pairs.corrupted_metric.mean())
    return (float(value.mean()) - corr) / (clean - corr)


def test_per_position_pruning_follows_attention_across_positions():
    """Written out by hand on a 2-layer graph: a head's key input at position 2 matters when the head sends
    at a later position; its query input at 3 does not when the head sends nothing at 3; only the logits
    at the last position are read."""
    graph = graph_of(_model("gpt2"))
    keep = torch.zeros(6, graph.n_edges, dtype=torch.bool)
    for e, p in [
        ("input->a1.h0<k>", 2),
        ("a1.h0->logits", 5),
        ("input->a1.h0<q>", 3),
        ("a1.h1->logits", 4),
        ("input->a1.h1<v>", 4),
    ]:
        keep[p, graph.edge(e)] = True
    got = prune(graph, keep)
    kept = {(graph.edges[e], p) for p, e in got.nonzero().tolist()}
    assert kept == {("input->a1.h0<k>", 2), ("a1.h0->logits", 5)}


@pytest.mark.parametrize("kind", ["gpt2", "gqa"])
def test_per_position_pruning_drops_only_items_that_cannot_change_the_metric(kind):
    model, _, _, pairs, graph = _setup(kind)
    g = torch.Generator().manual_seed(5)
    keeps = torch.rand(4, 6, graph.n_edges, generator=g) < torch.tensor([0.02, 0.05, 0.1, 0.3])[:, None, None]
    pruned = torch.stack([prune(graph, k) for k in keeps])
    assert not (pruned & ~keeps).any()  # pruning only removes
    assert (pruned.sum((1, 2)) < keeps.sum((1, 2))).all()  # and removes something from each
    for p in pruned:
        assert torch.equal(prune(graph, p), p)  # stable
    torch.testing.assert_close(
        run_with_edges(model, graph, pairs, ~pruned), run_with_edges(model, graph, pairs, ~keeps), atol=1e-5, rtol=0
    )


@pytest.mark.parametrize("kind", ["gpt2", "gqa"])
def test_a_per_position_circuit_is_measured_against_a_hand_written_hook_loop(kind):
    model = _model(kind)
    clean, corrupted, metric = _pairs()
    pairs = pairs_of(model, clean, corrupted, metric)
    scores = edge_scores(model, clean, corrupted, metric, method="eap", per_position=True)
    c = evaluate(model, circuit(scores, top=80), clean, corrupted, metric)
    assert c.per_position and c.n_pos == 6 and c.total_edges == 6 * scores.graph.n_edges
    assert 0 < len(c.edges) <= 80 and all(2 <= p < 6 for p in c.positions)  # nothing differs before position 2
    mask = c.mask()
    patched = {}
    for p, e in (~mask).nonzero().tolist():
        patched.setdefault(c.graph.edges[e], []).append(p)
    ref = _hand_masked(model, clean, corrupted, pairs.metric, patched)
    assert c.faithfulness == pytest.approx(_normalised(pairs, ref), abs=1e-4)
    assert abs(c.faithfulness) > 0.05 and abs(c.faithfulness - 1) > 0.01  # a circuit between empty and whole
    # the whole graph at every position is the clean run, none of it the corrupted one
    every = circuit(scores, fraction=1.0, prune_dangling=False)
    assert evaluate(model, every, clean, corrupted, metric).faithfulness == pytest.approx(1.0, abs=1e-5)
    assert evaluate(model, circuit(scores, top=0), clean, corrupted, metric).faithfulness == pytest.approx(
        0.0, abs=1e-5
    )


def test_a_per_position_curve_equals_its_circuits_and_refuses_mixed_or_greedy_scores(tmp_path):
    model = _model("gqa")
    clean, corrupted, metric = _pairs()
    per = edge_scores(model, clean, corrupted, metric, method="eap", per_position=True)
    curve = faithfulness_curve(model, per, clean, corrupted, metric, sizes=[5, 30, 200])
    assert curve.methods == ["eap-per-position"] and curve.total_edges == 6 * per.graph.n_edges
    for j, k in enumerate([5, 30, 200]):
        c = evaluate(model, circuit(per, top=k), clean, corrupted, metric, completeness=False)
        assert curve.faithfulness[0, j] == pytest.approx(c.faithfulness, abs=1e-5)
        assert int(curve.kept[0, j]) == len(c.edges)
    whole = edge_scores(model, clean, corrupted, metric, method="eap")
    with pytest.raises(ValueError, match="all per position or all of whole edges"):
        faithfulness_curve(model, [per, whole], clean, corrupted, metric, sizes=[5])
    with pytest.raises(ValueError, match="greedy"):
        circuit(per, top=5, selection="greedy")
    # saved and loaded with its positions; the collapsed circuit holds each edge once, scores summed
    c = circuit(per, top=30)
    back = Circuit.load(c.save(tmp_path / "c.json"))
    assert back.positions == c.positions and torch.equal(back.mask(), c.mask())
    whole_c = c.collapsed()
    assert sorted(whole_c.edges) == sorted(set(c.edges)) and whole_c.positions is None
    assert sum(whole_c.scores) == pytest.approx(sum(c.scores), abs=1e-5)
    c.plot().savefig(tmp_path / "c.png")
    data = json.loads((tmp_path / "c.json").read_text())
    data.pop("positions")
    (tmp_path / "edited.json").write_text(json.dumps(data))
    with pytest.raises(IntegrityError, match="integrity check"):  # an edited file fails its digest first
        Circuit.load(tmp_path / "edited.json")
    data.pop("sha256")  # written by hand (no digest): read with a warning, then checked field by field
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.warns(UnverifiedFileWarning), pytest.raises(ValueError, match="positions and n_pos"):
        Circuit.load(tmp_path / "bad.json")
