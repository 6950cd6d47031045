"""Small circuit, faithfulness-curve and feature results built by hand (no model run), shared by the view tests."""

from __future__ import annotations

import torch

from gpt2_interp.analysis.circuits import EdgeScores, FaithfulnessCurve, Graph, circuit
from gpt2_interp.analysis.features import FeatureView


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
