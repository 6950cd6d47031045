"""Small circuit, faithfulness-curve, feature, attribution-graph and intervention results built by hand (no model
run), shared by the view tests."""

from __future__ import annotations

import torch

from gpt2_interp.analysis.circuits import EdgeScores, FaithfulnessCurve, Graph, circuit
from gpt2_interp.analysis.features import FeatureView
from gpt2_interp.graphs.attribution import AttributionGraph


def edge_scores_2x4x2() -> EdgeScores:
    """EAP-like scores on the graph of a 2-layer, 4-head model with 2 key/value heads: a few chosen edges large
    (two of them negative), the rest small and distinct."""
    g = Graph(2, 4, 2)
    s = torch.linspace(-1e-3, 1e-3, g.n_edges)
    for e, v in {
        "input->a0.h1<q>": 3.0,
        "input->a0.h1<k>": -2.5,
        "a0.h1->a1.h1<v>": 2.0,
        "a0.h1->m1": 1.5,
        "a1.h2->logits": 2.2,
        "a1.h3->logits": -1.2,
        "m1->logits": 1.8,
        "input->m0": 0.9,
        "m0->a1.h3<q>": 0.8,
    }.items():
        s[g.edge(e)] = v
    return EdgeScores(s, g.edges, "eap", "logit_diff", 2.0, -1.0, 4, _graph=g)


def small_circuit():
    """The top 12 edges of :func:`edge_scores_2x4x2`, pruned (the small filler edges drop out)."""
    c = circuit(edge_scores_2x4x2(), top=12)
    c.faithfulness, c.completeness = 0.83, 0.12
    return c


def small_curve() -> FaithfulnessCurve:
    """Two methods, four sizes; the smallest size keeps no edge."""
    f = torch.tensor([[0.0, 0.31, 0.86, 1.0], [0.0, 0.52, 0.79, 1.0]])
    kept = torch.tensor([[0, 9, 38, 116], [0, 10, 37, 116]])
    return FaithfulnessCurve(f, [1, 10, 40, 116], kept, ["eap", "eap-ig"], 116, "logit_diff", 2.0, -1.0)


def small_feature() -> FeatureView:
    """A latent with three contexts (activations by hand), a promoted/suppressed list and a 4-bin histogram."""
    contexts = [
        {"tokens": ["The", " capital", " of", " France"], "acts": [0.0, 0.5, 1.25, 4.0], "max_act": 4.0,
         "window": 2, "position": 3},
        {"tokens": [" in", " Paris", ","], "acts": [0.75, 3.0, 0.0], "max_act": 3.0, "window": 0, "position": 1},
        {"tokens": ["<|endoftext|>", " Lyon"], "acts": [0.0, 1.0], "max_act": 1.0, "window": 5, "position": 1},
    ]  # fmt: skip
    return FeatureView(
        latent=7,
        hook_name="blocks.1.hook_resid_post",
        contexts=contexts,
        promoted=[(" Paris", 0.61), (" France", 0.42), (" French", 0.3)],
        suppressed=[(" Rome", -0.5), (" Italy", -0.25)],
        histogram={"counts": [5.0, 2.0, 0.0, 1.0], "edges": [0.0, 1.0, 2.0, 3.0, 4.0]},
        density=0.04,
        tokens=200,
    )


#: The edges of :func:`small_graph` as ``(source, target, weight)``: node indices, features 0–2, errors 3–8
#: (layer 0 at positions 0–2, then layer 1), tokens 9–11, logits 12–13.
GRAPH_EDGES = [
    (10, 0, 0.8), (11, 1, 0.6), (10, 1, -0.3),  # tokens into the layer-0 features
    (0, 2, 1.25), (1, 2, -0.5), (5, 2, 0.2),  # layer-0 features and an error into the layer-1 feature
    (2, 12, 2.0), (1, 12, 0.4), (8, 12, -0.1), (11, 12, 0.3), (2, 13, -0.7),  # into the logits
    (0, 13, 0.05),  # pruned away: in the adjacency, not in the edge mask
]  # fmt: skip


def small_graph() -> AttributionGraph:
    """A pruned attribution graph of 2 layers, 3 positions, 3 features and 2 logits, edges :data:`GRAPH_EDGES`
    (all kept but the last); the error nodes without an edge are pruned; the layer-1 feature carries a
    label, top logit effects and a context."""
    n = 3 + 2 * 3 + 3 + 2
    adjacency = torch.zeros(n, n)
    for s, t, w in GRAPH_EDGES:
        adjacency[t, s] = w
    edge_mask = adjacency != 0
    edge_mask[13, 0] = False
    node_mask = torch.ones(n, dtype=torch.bool)
    node_mask[[3, 4, 6, 7]] = False
    return AttributionGraph(
        tokens=torch.tensor([50256, 64, 65]),
        features=torch.tensor([[0, 1, 5], [0, 2, 7], [1, 2, 3]]),
        activations=torch.tensor([1.5, 0.5, 2.0]),
        logit_tokens=torch.tensor([20, 21]),
        logit_probabilities=torch.tensor([0.75, 0.125]),
        adjacency=adjacency,
        n_layers=2,
        node_mask=node_mask,
        edge_mask=edge_mask,
        replacement_score=0.5,
        completeness_score=0.875,
        str_tokens=["<|endoftext|>", " a", " b"],
        logit_strs=[" x", " y"],
        feature_labels=["country", "capital", "says Paris"],
        feature_logits=[None, None, {"promoted": [[" Paris", 1.5]], "suppressed": [[" Rome", -0.875]]}],
        feature_contexts=[
            None,
            None,
            [{"tokens": [" the", " capital"], "acts": [0.5, 2.5], "max_act": 2.5, "window": 3, "position": 1}],
        ],
    )


def small_intervention():
    """An intervention's result by hand: two features set to 0, three tracked tokens (the last no logit node of
    the graph: its graph predictions NaN), four feature nodes."""
    from gpt2_interp.graphs.interventions import InterventionResult

    t = torch.tensor
    return InterventionResult(
        features=t([[0, 1, 5], [1, 2, 3]]), old=t([1.5, 2.0]), new=t([0.0, 0.0]), tokens=t([20, 21, 22]),
        token_strs=[" x", " y", "<|endoftext|>"],
        graph_direct=t([-0.5, 0.25, float("nan")], dtype=torch.float64),
        graph_total=t([-0.75, 0.5, float("nan")], dtype=torch.float64),
        frozen_held=t([-0.5, 0.25, 0.125], dtype=torch.float64),
        frozen_free=t([-0.625, 0.375, 0.25], dtype=torch.float64),
        real=t([-0.25, 0.125, 0.0625], dtype=torch.float64),
        prob_before=t([0.5, 0.25, 0.125], dtype=torch.float64), prob_after=t([0.25, 0.5, 0.125], dtype=torch.float64),
        top_before=[(" x", 0.5), (" y", 0.25)], top_after=[(" y", 0.5), (" x", 0.25)],
        node_direct=t([0.0, 0.0, -1.0, 0.5], dtype=torch.float64),
        node_held=t([0.0, 0.0, -1.0, 0.5], dtype=torch.float64),
        node_total=t([0.0, 0.0, -1.0, 0.75], dtype=torch.float64),
        node_free=t([0.0, 0.0, -1.25, 0.625], dtype=torch.float64),
    )  # fmt: skip
