"""The page of an attribution graph: its nodes laid out by layer (y) and token position (x), its edges drawn
by weight, a node's details on hover, the paths through a node on click.

Read from an attribution graph's dict (:meth:`AttributionGraph.to_dict
<gpt2_interp.graphs.attribution.AttributionGraph.to_dict>`, or the same fields holding tensors), so a saved
graph views the same as the live one; nothing here computes on a model. The fields read: ``tokens``
``[pos]``, ``features`` ``[n_features, 3]`` (layer, position, index), ``activations`` ``[n_features]``,
``logit_tokens`` and ``logit_probabilities`` ``[n_logits]``, ``adjacency`` ``[n_nodes, n_nodes]`` (row the
target, column the source; nodes ordered features, errors layer-major, tokens, logits), ``n_layers``; where
present ``node_mask``/``edge_mask`` (a pruned graph: only the kept nodes and edges are drawn), the two
scores, ``str_tokens``/``logit_strs`` (the tokens as text), ``feature_labels``, ``feature_logits`` and
``feature_contexts`` (shown on hover). A tensor field may be a tensor, an array, a nested list or the
``{"dtype", "data"}`` object the graph's JSON holds.

The drawing is one SVG element per node and per edge (no Plotly), scripted by ``data/graph.js``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from ..core.boundary import boundary
from ..core.checks import check_count
from ..core.result import ResultLike
from .heatmap import as_dict
from .page import Part, View, script_json, text_part

#: Pixels: a node's slot within its (layer, position) cell, the gap between position columns, a layer row,
#: and the margins left of the first column (row names), above the logits and below the tokens (their labels).
SLOT, GAP, ROW = 26, 26, 62
LEFT, TOP, BOTTOM = 70, 96, 40
#: The colours of positive and negative edges.
POSITIVE, NEGATIVE = "#2166ac", "#d6604d"
#: The logit nodes' direct effects shown per node on hover.
TO_LOGITS = 5

_REQUIRED = ("tokens", "features", "activations", "logit_tokens", "logit_probabilities", "adjacency", "n_layers")


def _shown(token: str) -> str:
    """A token as plain text, quoted: a leading space as ``␣``, newlines as ``\\n`` (the page sets it as text)."""
    t = token.replace("\n", "\\n")
    return "'" + ("␣" + t[1:] if t.startswith(" ") else t) + "'"


@cache
def _asset(name: str) -> str:
    return (Path(__file__).with_name("data") / name).read_text(encoding="utf-8")


def _values(d: Mapping[str, Any], name: str) -> np.ndarray | None:
    """Field ``name`` of ``d`` as an array: a tensor, an array, a nested list, or a tensor's
    ``{"dtype", "data"}`` JSON object; None where the field is missing or None."""
    v = d.get(name)
    if v is None:
        return None
    if isinstance(v, Mapping):
        if "data" not in v:
            raise ValueError(f"graph field {name!r}: a tensor's JSON object holds 'dtype' and 'data', got {sorted(v)}")
        v = v["data"]
    if hasattr(v, "detach"):
        v = v.detach().cpu().numpy()
    return np.asarray(v)


def _array(d: Mapping[str, Any], name: str, dtype: type) -> np.ndarray:
    """Required field ``name`` of ``d`` as an array of ``dtype`` (:func:`_values`)."""
    v = _values(d, name)
    if v is None:
        raise ValueError(f"graph field {name!r} is None; give the dict or file the graph's to_dict()/save() wrote")
    return v.astype(dtype)


def _strings(d: Mapping[str, Any], name: str, n: int, fallback: list[str]) -> list[str]:
    v = d.get(name)
    if v is None:
        return fallback
    if len(v) != n:
        raise ValueError(f"graph field {name!r} holds {len(v)} entries for {n} nodes")
    return [str(x) for x in v]


def _per_feature(d: Mapping[str, Any], name: str, n: int) -> list[Any]:
    v = d.get(name)
    if v is None:
        return [None] * n
    if len(v) != n:
        raise ValueError(f"graph field {name!r} holds {len(v)} entries for {n} features")
    return list(v)


@dataclass
class _Graph:
    """The fields of an attribution graph's dict that the page reads, as arrays and lists, checked."""

    d: Mapping[str, Any]
    tokens: np.ndarray  # [pos]
    features: np.ndarray  # [n_features, 3]: layer, position, index
    acts: np.ndarray  # [n_features]
    logit_tokens: np.ndarray  # [n_logits]
    probs: np.ndarray  # [n_logits]
    adj: np.ndarray  # [n_nodes, n_nodes]: row the target, column the source
    n_layers: int

    @property
    def pos(self) -> int:
        return len(self.tokens)

    @property
    def n_f(self) -> int:
        return len(self.features)

    @property
    def n_logits(self) -> int:
        return len(self.logit_tokens)

    @property
    def n(self) -> int:
        return self.n_f + (self.n_layers + 1) * self.pos + self.n_logits

    @property
    def first_token(self) -> int:
        return self.n_f + self.n_layers * self.pos

    @property
    def first_logit(self) -> int:
        return self.n - self.n_logits

    def where(self, i: int) -> tuple[str, int, int]:
        """(kind, layer, position) of node ``i``."""
        if i < self.n_f:
            return "feature", int(self.features[i, 0]), int(self.features[i, 1])
        if i < self.first_token:
            L, p = divmod(i - self.n_f, self.pos)
            return "error", L, p
        if i < self.first_logit:
            return "token", -1, i - self.first_token
        return "logit", self.n_layers, self.pos - 1


def _read_graph(d: Mapping[str, Any]) -> _Graph:
    """The required fields of ``d`` (:data:`_REQUIRED`) read and their sizes checked against each other."""
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        raise ValueError(
            f"an attribution graph view needs {', '.join(missing)}; the result has fields {sorted(d)[:12]}"
        )
    g = _Graph(
        d,
        tokens=_array(d, "tokens", np.int64).reshape(-1),
        features=_array(d, "features", np.int64).reshape(-1, 3),
        acts=_array(d, "activations", np.float64).reshape(-1),
        logit_tokens=_array(d, "logit_tokens", np.int64).reshape(-1),
        probs=_array(d, "logit_probabilities", np.float64).reshape(-1),
        adj=_array(d, "adjacency", np.float64),
        n_layers=int(d["n_layers"]),
    )
    _check_sizes(g)
    return g


def _check_sizes(g: _Graph) -> None:
    """ValueError naming the field where the adjacency, the activations, the probabilities or the features'
    layers and positions do not match the graph's node counts."""
    n, n_f, pos, n_logits = g.n, g.n_f, g.pos, g.n_logits
    if g.adj.shape != (n, n):
        raise ValueError(
            f"graph field 'adjacency' has shape {g.adj.shape}; {n_f} features, {g.n_layers} layers × {pos} positions "
            f"of errors, {pos} tokens and {n_logits} logits make {n} nodes: ({n}, {n}) expected"
        )
    if len(g.acts) != n_f or len(g.probs) != n_logits:
        raise ValueError(
            f"graph fields 'activations' ({len(g.acts)}) and 'logit_probabilities' ({len(g.probs)}) must match the "
            f"{n_f} features and {n_logits} logit tokens"
        )
    layers, positions = g.features[:, 0], g.features[:, 1]
    if n_f and (layers.min() < 0 or layers.max() >= g.n_layers or positions.max() >= pos):
        raise ValueError(
            f"graph field 'features' names a layer outside [0, {g.n_layers}) or a position outside [0, {pos})"
        )


def _kept(g: _Graph) -> tuple[np.ndarray, np.ndarray, bool]:
    """``(keep [n, n], shown [n], pruned)``: the edges that may be drawn (nonzero; a pruned graph's kept edges
    between kept nodes) and the nodes shown whatever edges are drawn (a pruned graph's kept nodes; else the
    tokens and logits)."""
    node_mask, edge_mask = _values(g.d, "node_mask"), _values(g.d, "edge_mask")
    if node_mask is None or edge_mask is None:
        if (node_mask is None) != (edge_mask is None):
            raise ValueError("a pruned graph has both 'node_mask' and 'edge_mask'; this one has one of them")
        shown = np.zeros(g.n, dtype=bool)
        shown[g.first_token :] = True
        return g.adj != 0, shown, False
    if node_mask.shape != (g.n,) or edge_mask.shape != (g.n, g.n):
        raise ValueError(
            f"graph fields 'node_mask' {node_mask.shape} and 'edge_mask' {edge_mask.shape}: "
            f"({g.n},) and ({g.n}, {g.n}) expected"
        )
    nodes = node_mask.astype(bool)
    keep = edge_mask.astype(bool) & (g.adj != 0) & nodes[:, None] & nodes[None, :]
    return keep, nodes.copy(), True


def _drawn_edges(adj: np.ndarray, keep: np.ndarray, max_edges: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """``(targets, sources, weights, total)`` of the edges drawn: the ``max_edges`` largest ``|weight|`` of
    those ``keep`` marks (``total`` of them), smallest ``|weight|`` first."""
    tgt, src = np.nonzero(keep)
    total = len(tgt)
    w = adj[tgt, src]
    if len(w) > max_edges:
        top = np.argsort(-np.abs(w), kind="stable")[:max_edges]
        tgt, src, w = tgt[top], src[top], w[top]
    order = np.argsort(np.abs(w), kind="stable")
    return tgt[order], src[order], w[order], total


@dataclass
class _Layout:
    """Where the nodes go: the nodes of each (layer, position) cell in order, each position column's width
    and left edge, in pixels."""

    cells: dict[tuple[int, int], list[int]]
    widths: list[int]
    lefts: list[int]
    n_layers: int

    def x(self, L: int, p: int, i: int) -> float:
        """The x of node ``i`` in cell ``(L, p)``: the cell's nodes side by side, centred in its column."""
        cell = self.cells[(L, p)]
        return self.lefts[p] + self.widths[p] / 2 + (cell.index(i) - (len(cell) - 1) / 2) * SLOT

    def y(self, L: int) -> float:
        return TOP + (self.n_layers - L) * ROW  # logits (L = n_layers) at the top, tokens (L = -1) at the bottom


def _layout(g: _Graph, ids: list[int]) -> _Layout:
    """The layout of nodes ``ids``: each position column as wide as its fullest cell."""
    cells: dict[tuple[int, int], list[int]] = {}
    for i in ids:
        _, L, p = g.where(i)
        cells.setdefault((L, p), []).append(i)  # features by index, then the error node; logits by probability
    slots = [max([len(v) for (_, p), v in cells.items() if p == q], default=1) for q in range(g.pos)]
    widths = [s * SLOT + GAP for s in slots]
    lefts = np.concatenate([[LEFT], LEFT + np.cumsum(widths)]).tolist()
    return _Layout(cells, widths, lefts, g.n_layers)


@dataclass
class _Texts:
    """The graph's names for its nodes: the tokens and logit tokens as text, the features' labels, and the
    features' top logits and contexts where the graph carries them."""

    str_tokens: list[str]
    logit_strs: list[str]
    labels: list[str]
    feature_logits: list[Any]
    contexts: list[Any]


def _texts(g: _Graph) -> _Texts:
    d = g.d
    return _Texts(
        _strings(d, "str_tokens", g.pos, [f"#{t}" for t in g.tokens.tolist()]),
        _strings(d, "logit_strs", g.n_logits, [f"#{t}" for t in g.logit_tokens.tolist()]),
        _strings(d, "feature_labels", g.n_f, [f"L{L} F{f}" for L, _, f in g.features.tolist()]),
        _per_feature(d, "feature_logits", g.n_f),
        _per_feature(d, "feature_contexts", g.n_f),
    )


def _feature_node(g: _Graph, t: _Texts, i: int, L: int, at: str) -> dict[str, Any]:
    """What a feature node's hover shows: its label, index and activation, its top logits and contexts."""
    named = "" if g.d.get("feature_labels") is None else f" (L{L} F{int(g.features[i, 2])})"
    node: dict[str, Any] = {
        "label": t.labels[i],
        "title": f"{t.labels[i]}{named} · {at}",
        "feature": int(g.features[i, 2]),
        "act": float(g.acts[i]),
    }
    if t.feature_logits[i] is not None:
        node["logits"] = t.feature_logits[i]
    if t.contexts[i] is not None:
        node["contexts"] = t.contexts[i]
    return node


def _node_text(g: _Graph, t: _Texts, i: int, kind: str, L: int, p: int) -> dict[str, Any]:
    """A node's label and hover fields, by its kind."""
    at = f"position {p} {_shown(t.str_tokens[p])}"
    if kind == "feature":
        return _feature_node(g, t, i, L, at)
    if kind == "error":
        return {"label": f"error L{L}", "title": f"error L{L} · {at}: what layer {L}'s transcoder misses"}
    if kind == "token":
        return {"label": t.str_tokens[p], "title": f"token {at} (id {int(g.tokens[p])})"}
    k = i - g.first_logit
    return {
        "label": t.logit_strs[k],
        "title": f"logit {_shown(t.logit_strs[k])} (id {int(g.logit_tokens[k])})",
        "prob": float(g.probs[k]),
    }


def _to_logits(g: _Graph, t: _Texts, i: int) -> list[list[Any]]:
    """Node ``i``'s largest direct effects on the logit nodes (at most :data:`TO_LOGITS`, nonzero ones)."""
    eff = g.adj[g.first_logit :, i]
    top_k = np.argsort(-np.abs(eff), kind="stable")[:TO_LOGITS]
    return [[t.logit_strs[k], float(eff[k])] for k in top_k.tolist() if eff[k] != 0]


def _node(g: _Graph, t: _Texts, lay: _Layout, i: int) -> dict[str, Any]:
    """The page's node ``i``: where it is drawn and what its hover shows."""
    kind, L, p = g.where(i)
    x = lay.x(L, p, i)
    node: dict[str, Any] = {"id": i, "kind": kind, "layer": L, "pos": p, "x": round(x, 2), "y": lay.y(L)}
    node.update(_node_text(g, t, i, kind, L, p))
    if kind != "logit" and g.n_logits:
        node["to_logits"] = _to_logits(g, t, i)
    return node


def _rows(lay: _Layout) -> list[dict[str, Any]]:
    """The row names and their y: the logits at the top, each layer, the tokens at the bottom."""
    L = lay.n_layers
    return (
        [{"name": "logits", "y": lay.y(L)}]
        + [{"name": f"L{layer}", "y": lay.y(layer)} for layer in reversed(range(L))]
        + [{"name": "tokens", "y": lay.y(-1)}]
    )


@boundary
def graph_page_data(result: ResultLike, max_edges: int = 2000) -> dict[str, Any]:
    """What the page of an attribution graph draws, as JSON-ready data: ``nodes`` (each with its index in
    the graph ``id``, ``kind`` — ``feature``, ``error``, ``token``, ``logit`` —, ``layer`` (-1 for tokens,
    ``n_layers`` for logits), ``pos``, its place ``x``, ``y`` in pixels, a ``label``, and what its hover
    shows), ``edges`` (``[source, target, weight]``, sources and targets as positions in ``nodes``,
    smallest ``|weight|`` first: the largest are drawn on top), ``width``, ``height`` and the page's
    headings. A pruned graph draws its kept nodes and edges; an unpruned one its ``max_edges`` largest
    ``|weight|`` edges with their nodes (and every token and logit); a pruned graph with more kept edges
    than ``max_edges`` keeps its largest ones. Fields of the wrong shape raise ValueError naming them."""
    max_edges = check_count(max_edges, "max_edges")
    g = _read_graph(as_dict(result))
    t = _texts(g)
    keep, shown, pruned = _kept(g)
    tgt, src, w, total_edges = _drawn_edges(g.adj, keep, max_edges)
    shown[tgt] = True
    shown[src] = True
    ids = np.flatnonzero(shown).tolist()
    lay = _layout(g, ids)
    nodes = [_node(g, t, lay, i) for i in ids]
    local = {i: j for j, i in enumerate(ids)}
    edges = [[local[int(s)], local[int(r)], float(v)] for s, r, v in zip(src, tgt, w)]
    prompt = "".join(t.str_tokens) if g.d.get("str_tokens") is not None else " ".join(t.str_tokens)
    return {
        "nodes": nodes,
        "edges": edges,
        "width": lay.lefts[-1] + 20,
        "height": TOP + (g.n_layers + 1) * ROW + BOTTOM,
        "rows": _rows(lay),
        "columns": [{"x": lay.lefts[p] + lay.widths[p] / 2, "w": lay.widths[p]} for p in range(g.pos)],
        "colours": [POSITIVE, NEGATIVE],
        "prompt": prompt,
        "top_logit": [t.logit_strs[0], float(g.probs[0])] if g.n_logits else None,
        "pruned": pruned,
        "total_edges": int(total_edges),
        "n_features": g.n_f,
        "shown_features": sum(1 for i in ids if i < g.n_f),
        "scores": [g.d.get("replacement_score"), g.d.get("completeness_score")],
    }


@boundary
def view_graph(result: ResultLike, max_edges: int = 2000, highlight: str = "paths") -> View:
    """The page of the attribution graph ``result``: an
    :class:`~gpt2_interp.graphs.attribution.AttributionGraph`, its ``to_dict()`` or its JSON read back (see
    the module's docstring for the fields read).

    Nodes by layer (y: the input tokens at the bottom, each layer's feature nodes (circles) and error nodes
    (grey squares), the top output logits at the top) and token position (x); edges as curves whose width
    and opacity grow with ``|weight|``, blue where positive and red where negative. Hovering a node shows
    what it is (a feature's label, position and activation; a logit's probability), its direct effects on
    the logit nodes, and, where the graph carries them, a feature's top logit effects and top-activating
    contexts; hovering an edge shows its weight. Clicking a node pins it: its details stay below the graph
    and the edges on paths through it are highlighted — every edge upstream and downstream of it with
    ``highlight="paths"``, its own incoming and outgoing edges with ``"direct"`` (a menu switches) —;
    clicking it again (or the background) unpins it. A slider hides edges below a share of the largest
    ``|weight|``. What is drawn: :func:`graph_page_data` (``max_edges``)."""
    if highlight not in ("paths", "direct"):
        raise ValueError(f"highlight must be 'paths' or 'direct', got {highlight!r}")
    data = graph_page_data(result, max_edges)
    data["highlight"] = highlight
    shown, total = len(data["edges"]), data["total_edges"]
    edges = f"{shown} edges" + (f" (the largest |weight| of {total})" if shown < total else "")
    features = f"{data['shown_features']} of {data['n_features']} features"
    what = f"pruned graph: {features} kept, {edges}" if data["pruned"] else f"unpruned graph: {features}, {edges}"
    rep, comp = data["scores"]
    scores = "" if rep is None else f"; replacement score {rep:.3f}, completeness score {comp:.3f}"
    note = text_part(
        f"{what}{scores}. Circles: features; grey squares: error nodes; blue: positive edge, red: "
        "negative. Hover a node for its details; click it to pin it and highlight the paths through it (click "
        "again to unpin)."
    )
    body = (
        '<div id="{id}" class="g2v-graph"><style>' + _asset("graph.css") + "</style>"
        '<div class="g2v-controls"><label>highlight on click <select aria-label="highlight">'
        '<option value="paths">every path through the node</option>'
        '<option value="direct">its own edges</option></select></label>'
        '<label>hide edges below <input type="range" aria-label="edge threshold" min="0" max="0.5" step="0.01" '
        'value="0"> <span class="g2v-gthr">0%</span> of the largest |weight|</label></div>'
        '<div class="g2v-gscroll"><svg class="g2v-gsvg" xmlns="http://www.w3.org/2000/svg"></svg>'
        '<div class="g2v-gtip" role="tooltip"></div></div>'
        '<div class="g2v-ginfo g2v-info">click a node to pin it</div></div>'
    )
    title = f"Attribution graph: {data['prompt']!r}"
    if data["top_logit"] is not None:
        title += f" → {data['top_logit'][0]!r} (p = {data['top_logit'][1]:.3f})"
    return View(title, [note, Part(body, _asset("graph.js").replace("{data}", script_json(data)))])


__all__ = ["graph_page_data", "view_graph"]
