"""Pruning an attribution graph by influence on the logits, and its replacement and completeness scores.

With ``Â = |A| / rowsum(|A|)`` (each target's incoming weights normalised to sum to 1) and ``w`` the logit
nodes' probabilities (zero elsewhere) ``[n_nodes]``, a node's influence on the output is
``w Â + w Â² + w Â³ + …`` (the series ends: the graph is acyclic, so ``Â`` is nilpotent). Pruning
(Ameisen et al. 2025, as circuit-tracer computes it):

1. keep the nodes whose influence makes up ``node_threshold`` of the total over all nodes, largest first
   (features and errors can go; tokens and logits are kept);
2. on the graph of kept nodes, score each edge ``Â[t, s] · (influence(t) + w(t))`` and keep the edges
   making up ``edge_threshold`` of the total score;
3. repeatedly drop features without a kept incoming edge and features or errors without a kept outgoing
   edge, and the edges of dropped nodes.

Scores: the *replacement score* is the share of the influence that ends at token nodes rather than error
nodes, ``Σ_tokens I / (Σ_tokens I + Σ_errors I)``; the *completeness score* is the share of every node's
incoming weight that does not come from errors, averaged with weights ``I + w``.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..core.boundary import boundary
from ..core.checks import check_number
from .attribution import AttributionGraph


@boundary
def normalise_rows(adjacency: torch.Tensor) -> torch.Tensor:
    """``|A|`` with each row scaled to sum to 1 (rows of zeros stay zero) ``[n, n]``."""
    a = adjacency.abs()
    return a / a.sum(1, keepdim=True).clamp_min(1e-10)


@boundary
def influence(normalised: torch.Tensor, weights: torch.Tensor, max_iter: int = 10_000) -> torch.Tensor:
    """``Σ_{k≥1} w Âᵏ`` ``[n]`` for a nilpotent ``normalised`` ``Â`` ``[n, n]`` (an acyclic graph) and ``weights``
    ``w`` ``[n]``;
    a RuntimeError when the series has not ended after ``max_iter`` terms (a graph with a cycle)."""
    term = weights @ normalised
    total = term.clone()
    for _ in range(max_iter):
        if not term.any():
            return total
        term = term @ normalised
        total += term
    raise RuntimeError(f"the influence series did not end after {max_iter} terms: the graph has a cycle")


def _threshold(scores: torch.Tensor, share: float) -> float:
    """The smallest score among the largest ones that together make up ``share`` of the total."""
    s = scores.flatten().sort(descending=True).values
    cum = s.cumsum(0) / s.sum().clamp_min(1e-30)
    i = min(int(torch.searchsorted(cum, torch.tensor(share, dtype=cum.dtype))), len(s) - 1)
    return float(s[i])


def _logit_weights(graph: AttributionGraph) -> torch.Tensor:
    w = torch.zeros(len(graph.adjacency))
    w[len(w) - len(graph.logit_tokens) :] = graph.logit_probabilities.float()
    return w


@boundary
def graph_scores(graph: AttributionGraph, adjacency: torch.Tensor | None = None) -> tuple[float, float]:
    """``(replacement_score, completeness_score)`` of ``graph`` (or of its nodes with another ``adjacency``
    ``[n_nodes, n_nodes]``, e.g. a pruned one); see the module's docstring."""
    a = normalise_rows(graph.adjacency if adjacency is None else adjacency)
    w = _logit_weights(graph)
    inf = influence(a, w)
    err = slice(graph.n_features, graph.token_index(0))
    tok = slice(graph.token_index(0), graph.logit_index(0))
    token_inf, error_inf = inf[tok].sum(), inf[err].sum()
    replacement = float(token_inf / (token_inf + error_inf).clamp_min(1e-30))
    non_error = 1 - a[:, err].sum(1)
    out = inf + w
    completeness = float((non_error * out).sum() / out.sum())
    return replacement, completeness


@boundary
def prune_graph(graph: AttributionGraph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> AttributionGraph:
    """``graph`` pruned as the module's docstring says (``node_threshold``, ``edge_threshold``: the shares of
    the nodes' influence and of the edges' scores kept): a copy with ``node_mask`` ``[n_nodes]``,
    ``edge_mask`` ``[n_nodes, n_nodes]`` and the pruned graph's ``replacement_score`` and
    ``completeness_score`` (its adjacency kept whole; ``adjacency * edge_mask`` is the pruned one)."""
    check_number(node_threshold, "node_threshold", 0, 1)
    check_number(edge_threshold, "edge_threshold", 0, 1)
    n_f, first_token = graph.n_features, graph.token_index(0)
    w = _logit_weights(graph)
    node_inf = influence(normalise_rows(graph.adjacency), w)
    node_mask = node_inf >= _threshold(node_inf, node_threshold)
    node_mask[first_token:] = True  # tokens and logits
    kept = graph.adjacency * node_mask[:, None] * node_mask[None, :]
    a = normalise_rows(kept)
    edge_scores = a * (influence(a, w) + w)[:, None]
    edge_mask = (edge_scores >= _threshold(edge_scores, edge_threshold)) & (edge_scores > 0)
    while True:
        before = node_mask.clone()
        edge_mask &= node_mask[:, None] & node_mask[None, :]
        node_mask[:first_token] &= edge_mask[:, :first_token].any(0)  # features and errors need a way out
        node_mask[:n_f] &= edge_mask[:n_f].any(1)  # features need a way in
        if torch.equal(node_mask, before):
            break
    edge_mask &= node_mask[:, None] & node_mask[None, :]
    replacement, completeness = graph_scores(graph, graph.adjacency * edge_mask)
    return replace(
        graph,
        node_mask=node_mask,
        edge_mask=edge_mask,
        replacement_score=replacement,
        completeness_score=completeness,
    )


__all__ = ["graph_scores", "influence", "normalise_rows", "prune_graph"]
