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
    d = as_dict(result)
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        raise ValueError(
            f"an attribution graph view needs {', '.join(missing)}; the result has fields {sorted(d)[:12]}"
        )
    tokens = _array(d, "tokens", np.int64).reshape(-1)
    features = _array(d, "features", np.int64).reshape(-1, 3)
    acts = _array(d, "activations", np.float64).reshape(-1)
    logit_tokens = _array(d, "logit_tokens", np.int64).reshape(-1)
    probs = _array(d, "logit_probabilities", np.float64).reshape(-1)
    adj = _array(d, "adjacency", np.float64)
    n_layers, pos, n_f, n_logits = int(d["n_layers"]), len(tokens), len(features), len(logit_tokens)
    n = n_f + (n_layers + 1) * pos + n_logits
    if adj.shape != (n, n):
        raise ValueError(
            f"graph field 'adjacency' has shape {adj.shape}; {n_f} features, {n_layers} layers × {pos} positions "
            f"of errors, {pos} tokens and {n_logits} logits make {n} nodes: ({n}, {n}) expected"
        )
    if len(acts) != n_f or len(probs) != n_logits:
        raise ValueError(
            f"graph fields 'activations' ({len(acts)}) and 'logit_probabilities' ({len(probs)}) must match the "
            f"{n_f} features and {n_logits} logit tokens"
        )
    if n_f and (features[:, 0].min() < 0 or features[:, 0].max() >= n_layers or features[:, 1].max() >= pos):
        raise ValueError(
            f"graph field 'features' names a layer outside [0, {n_layers}) or a position outside [0, {pos})"
        )
    str_tokens = _strings(d, "str_tokens", pos, [f"#{t}" for t in tokens.tolist()])
    logit_strs = _strings(d, "logit_strs", n_logits, [f"#{t}" for t in logit_tokens.tolist()])
    labels = _strings(d, "feature_labels", n_f, [f"L{L} F{f}" for L, _, f in features.tolist()])
    feature_logits = _per_feature(d, "feature_logits", n_f)
    contexts = _per_feature(d, "feature_contexts", n_f)
    first_token, first_logit = n_f + n_layers * pos, n - n_logits

    node_mask, edge_mask = _values(d, "node_mask"), _values(d, "edge_mask")
    if (node_mask is None) != (edge_mask is None):
        raise ValueError("a pruned graph has both 'node_mask' and 'edge_mask'; this one has one of them")
    if node_mask is not None and edge_mask is not None:
        if node_mask.shape != (n,) or edge_mask.shape != (n, n):
            raise ValueError(
                f"graph fields 'node_mask' {node_mask.shape} and 'edge_mask' {edge_mask.shape}: "
                f"({n},) and ({n}, {n}) expected"
            )
        keep = edge_mask.astype(bool) & (adj != 0)
        keep &= node_mask.astype(bool)[:, None] & node_mask.astype(bool)[None, :]
        shown = node_mask.astype(bool).copy()
    else:
        keep = adj != 0
        shown = np.zeros(n, dtype=bool)
        shown[first_token:] = True
    tgt, src = np.nonzero(keep)
    total_edges = len(tgt)
    w = adj[tgt, src]
    if len(w) > max_edges:
        top = np.argsort(-np.abs(w), kind="stable")[:max_edges]
        tgt, src, w = tgt[top], src[top], w[top]
    shown[tgt] = True
    shown[src] = True
    order = np.argsort(np.abs(w), kind="stable")
    tgt, src, w = tgt[order], src[order], w[order]

    def where(i: int) -> tuple[str, int, int]:
        """(kind, layer, position) of node ``i``."""
        if i < n_f:
            return "feature", int(features[i, 0]), int(features[i, 1])
        if i < first_token:
            L, p = divmod(i - n_f, pos)
            return "error", L, p
        if i < first_logit:
            return "token", -1, i - first_token
        return "logit", n_layers, pos - 1

    ids = np.flatnonzero(shown).tolist()
    cells: dict[tuple[int, int], list[int]] = {}
    for i in ids:
        _, L, p = where(i)
        cells.setdefault((L, p), []).append(i)  # features by index, then the error node; logits by probability
    slots = [max([len(v) for (_, p), v in cells.items() if p == q], default=1) for q in range(pos)]
    widths = [s * SLOT + GAP for s in slots]
    lefts = np.concatenate([[LEFT], LEFT + np.cumsum(widths)]).tolist()
    n_rows = n_layers + 2
    height = TOP + (n_rows - 1) * ROW + BOTTOM

    def row_y(L: int) -> float:
        return TOP + (n_layers - L) * ROW  # logits (L = n_layers) at the top, tokens (L = -1) at the bottom

    logit_rows = adj[first_logit:]  # [n_logits, n_nodes]: each node's direct effect on each logit
    nodes: list[dict[str, Any]] = []
    local: dict[int, int] = {}
    for i in ids:
        kind, L, p = where(i)
        cell = cells[(L, p)]
        j = cell.index(i)
        x = lefts[p] + widths[p] / 2 + (j - (len(cell) - 1) / 2) * SLOT
        node: dict[str, Any] = {"id": i, "kind": kind, "layer": L, "pos": p, "x": round(x, 2), "y": row_y(L)}
        at = f"position {p} {_shown(str_tokens[p])}"
        if kind == "feature":
            named = "" if d.get("feature_labels") is None else f" (L{L} F{int(features[i, 2])})"
            title = f"{labels[i]}{named} · {at}"
            node.update(label=labels[i], title=title, feature=int(features[i, 2]), act=float(acts[i]))
            if feature_logits[i] is not None:
                node["logits"] = feature_logits[i]
            if contexts[i] is not None:
                node["contexts"] = contexts[i]
        elif kind == "error":
            node.update(label=f"error L{L}", title=f"error L{L} · {at}: what layer {L}'s transcoder misses")
        elif kind == "token":
            node.update(label=str_tokens[p], title=f"token {at} (id {int(tokens[p])})")
        else:
            k = i - first_logit
            node.update(
                label=logit_strs[k],
                title=f"logit {_shown(logit_strs[k])} (id {int(logit_tokens[k])})",
                prob=float(probs[k]),
            )
        if kind != "logit" and n_logits:
            eff = logit_rows[:, i]
            top_k = np.argsort(-np.abs(eff), kind="stable")[:TO_LOGITS]
            node["to_logits"] = [[logit_strs[k], float(eff[k])] for k in top_k.tolist() if eff[k] != 0]
        local[i] = len(nodes)
        nodes.append(node)
    edges = [[local[int(s)], local[int(t)], float(v)] for s, t, v in zip(src, tgt, w)]
    pruned = node_mask is not None
    prompt = "".join(str_tokens) if d.get("str_tokens") is not None else " ".join(str_tokens)
    return {
        "nodes": nodes,
        "edges": edges,
        "width": lefts[-1] + 20,
        "height": height,
        "rows": [{"name": "logits", "y": row_y(n_layers)}]
        + [{"name": f"L{L}", "y": row_y(L)} for L in reversed(range(n_layers))]
        + [{"name": "tokens", "y": row_y(-1)}],
        "columns": [{"x": lefts[p] + widths[p] / 2, "w": widths[p]} for p in range(pos)],
        "colours": [POSITIVE, NEGATIVE],
        "prompt": prompt,
        "top_logit": [logit_strs[0], float(probs[0])] if n_logits else None,
        "pruned": pruned,
        "total_edges": int(total_edges),
        "n_features": n_f,
        "shown_features": sum(1 for i in ids if i < n_f),
        "scores": [d.get("replacement_score"), d.get("completeness_score")],
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
