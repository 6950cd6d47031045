"""Views of edge-level circuits: the circuit as a graph (nodes by layer, edges by score, the query, key
and value inputs marked, hover for each edge's score and exact effect), and faithfulness curves per
scoring method.

Everything is read from the result's fields (a circuit's or edge scores' ``edges`` and ``scores``, a
curve's ``faithfulness``/``kept``/``methods``), so a saved JSON views the same as the live result. Edge
names are the circuits graph's: senders ``input``, ``a{l}.h{h}``, ``m{l}``; receivers ``a{l}.h{h}<q>``,
``a{l}.h{g}<k>``/``<v>`` (``g``: the key/value head), ``m{l}``, ``logits``. The nodes sit where
:mod:`gpt2_interp.core.circuit_layout` puts them (the PNG figure's layout too): heads by layer, the MLPs in a
column of their own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..core.boundary import boundary
from ..core.checks import check_count
from ..core.circuit_layout import node_xy, receiver_port, row_ticks, x_range
from ..core.ranking import totals_by_size
from ..core.result import ResultLike
from .heatmap import array, as_dict
from .page import View, figure_part, text_part

#: Colour of an edge by the input it enters: a head's query, key or value input, an MLP, the logits.
KIND_COLOURS = {"q": "#1f77b4", "k": "#2ca02c", "v": "#ff7f0e", "mlp": "#9467bd", "logits": "#595959"}

#: The node markers' diameter and their labels' font size, in pixels.
NODE_SIZE, LABEL_SIZE = 14, 9

_HEAD = re.compile(r"a(\d+)\.h(\d+)")
_RECEIVER = re.compile(r"a(\d+)\.h(\d+)<([qkv])>")


def graph_sizes(edges: Sequence[str]) -> tuple[int, int, int]:
    """``(n_layer, n_head, n_kv)`` read off edge names (the largest layer, head and key/value head index
    they mention, plus one): the sizes of the smallest graph holding them."""
    layers, heads, kv = [0], [0], [0]
    for e in edges:
        for part in e.split("->"):
            m = _RECEIVER.fullmatch(part) or _HEAD.fullmatch(part)
            if m:
                layers.append(int(m.group(1)) + 1)
                (kv if m.lastindex == 3 and m.group(3) in "kv" else heads).append(int(m.group(2)) + 1)
            elif re.fullmatch(r"m\d+", part):
                layers.append(int(part[1:]) + 1)
    return max(layers), max(heads), max(kv) or max(heads)


def _edge_list(d: Mapping[str, Any], max_edges: int) -> tuple[list[str], np.ndarray]:
    """The edges to draw, largest ``|score|`` first, at most ``max_edges``; NaN scores left out. Edge scores
    ``[n_pos, n_edges]`` are summed over positions."""
    edges = list(d["edges"])
    scores = array(d["scores"])
    if scores.ndim == 2:
        scores = np.nansum(scores, 0)
    if scores.shape != (len(edges),):
        raise ValueError(f"scores of shape {scores.shape} for {len(edges)} edges; give one score per edge")
    order = [i for i in np.argsort(-np.abs(np.nan_to_num(scores, nan=-1.0)), kind="stable") if np.isfinite(scores[i])]
    order = order[:max_edges]
    return [edges[i] for i in order], scores[order]


def _exact_of(exact: ResultLike) -> dict[str, float]:
    """``{edge: exact effect}`` from an :class:`~gpt2_interp.analysis.circuits.EdgeScores` (method
    ``exact``), its dict, or a mapping of edge names to values; NaN entries (edges not patched) left out."""
    if isinstance(exact, Mapping) and "edges" not in exact:
        return {str(k): float(v) for k, v in exact.items()}
    d = as_dict(exact)
    if d.get("method", "exact") != "exact":
        raise ValueError(f"exact effects come from edge scores with method 'exact', got method {d.get('method')!r}")
    values = array(d["scores"])
    if values.ndim == 2:
        values = np.nansum(values, 0)
    return {e: float(v) for e, v in zip(d["edges"], values) if np.isfinite(v)}


def _edge_trace(e: str, s: float, start: tuple[float, float], end: tuple[float, float], kind: str, w: float) -> Any:
    """The line of edge ``e`` (score ``s``, ``w`` its ``|score|`` over the largest) from ``start`` to ``end``:
    width and opacity by ``w``, colour by the input ``kind`` it enters, dashed where ``s`` is negative."""
    import plotly.graph_objects as go

    return go.Scatter(
        x=[start[0], end[0]],
        y=[start[1], end[1]],
        mode="lines",
        line={"color": KIND_COLOURS[kind], "width": 0.6 + 4.5 * w, "dash": "solid" if s >= 0 else "dash"},
        opacity=0.3 + 0.65 * w,
        hoverinfo="skip",
        showlegend=False,
        name=f"edge:{e}",
    )


def _readers(receiver: str, H: int, K: int) -> tuple[list[str], str | None]:
    """``(nodes, port)``: the nodes reading ``receiver`` (a head's query input: that head; its key or value
    input: the query heads of its group; an MLP or the logits: itself) and its q/k/v port (None for none)."""
    m = _RECEIVER.fullmatch(receiver)
    if m is None:
        return [receiver], None
    layer, idx, port = m.group(1), int(m.group(2)), m.group(3)
    per = 1 if port == "q" else H // max(K, 1)  # a key/value input is read by its group's query heads
    return [f"a{layer}.h{h}" for h in range(idx * per, (idx + 1) * per)], port


def _edge_hover(e: str, s: float, label: str, exact: Mapping[str, float] | None) -> str:
    """An edge's hover: its name, its score (``label``) and, where ``exact`` is given, its exact effect."""
    hover = f"<b>{e}</b><br>{label} {s:+.5g}"
    if exact is not None:
        hover += f"<br>exact effect {exact[e]:+.5g}" if e in exact else "<br>exact effect: not measured"
    return hover


def _midpoint_trace(mids: tuple[list[float], list[float], list[str]]) -> Any:
    """The edges' midpoints ``(x, y, hover)``: the points carrying each edge's hover text."""
    import plotly.graph_objects as go

    return go.Scatter(
        x=mids[0],
        y=mids[1],
        mode="markers",
        marker={"size": 7, "color": "rgba(0,0,0,0.25)"},
        customdata=mids[2],
        hovertemplate="%{customdata}<extra></extra>",
        name="edges",
        showlegend=False,
    )


def _node_trace(nodes: set[str], L: int, H: int, K: int) -> Any:
    """The nodes, named; hover: the name and, under GQA, a head's key/value group."""
    import plotly.graph_objects as go

    names = sorted(nodes, key=lambda n: node_xy(n, L, H)[::-1])
    xy = [node_xy(n, L, H) for n in names]

    def node_hover(n: str) -> str:
        m = _HEAD.fullmatch(n)
        if m is None or K == H:
            return n
        return f"{n} (KV group {int(m.group(2)) // (H // K)})"

    return go.Scatter(
        x=[p[0] for p in xy],
        y=[p[1] for p in xy],
        mode="markers+text",
        marker={"size": NODE_SIZE, "color": "white", "line": {"color": "#333", "width": 1.5}},
        text=names,
        textposition=["bottom center" if n == "input" else "top center" for n in names],
        textfont={"size": LABEL_SIZE},
        customdata=[node_hover(n) for n in names],
        hovertemplate="%{customdata}<extra></extra>",
        name="nodes",
        showlegend=False,
    )


def _port_trace(ports: dict[tuple[float, float], str]) -> Any:
    """The q/k/v input ports below the heads, at their places, coloured as the edges entering them."""
    import plotly.graph_objects as go

    return go.Scatter(
        x=[p[0] for p in ports],
        y=[p[1] for p in ports],
        mode="markers+text",
        marker={"size": 6, "color": [KIND_COLOURS[k] for k in ports.values()], "symbol": "triangle-up"},
        text=list(ports.values()),
        textposition="bottom center",
        textfont={"size": 8},
        hoverinfo="skip",
        name="ports",
        showlegend=False,
    )


def _circuit_layout(fig: Any, L: int, H: int, title: str) -> None:
    """The legend of edge colours, the figure's size, and the axes: the rows of :func:`row_ticks`, x hidden."""
    import plotly.graph_objects as go

    for kind, colour in KIND_COLOURS.items():
        fig.add_trace(
            go.Scatter(x=[None], y=[None], mode="lines", line={"color": colour, "width": 3}, name=f"into {kind}")
        )
    fig.update_layout(
        title={"text": title, "font": {"size": 13}} if title else None,
        height=int(min(max(70 * (2 * L + 2), 420), 2400)),
        margin={"l": 60, "r": 10, "t": 40 if title else 20, "b": 30},
        hovermode="closest",
        plot_bgcolor="white",
        legend={"orientation": "h", "y": -0.01, "x": 0.5, "xanchor": "center", "yanchor": "top"},
        xaxis={"visible": False, "range": list(x_range(H))},
        yaxis={
            "range": [-0.8, 2 * L + 1.8],
            "tickvals": row_ticks(L)[0],
            "ticktext": row_ticks(L)[1],
            "showgrid": True,
            "gridcolor": "#eee",
            "zeroline": False,
        },
    )


def circuit_figure(
    d: Mapping[str, Any], max_edges: int = 300, exact: Mapping[str, float] | None = None, title: str = ""
) -> Any:
    """The Plotly figure of a circuit's (or edge scores') dict ``d``: one line trace per edge (named
    ``edge:<name>``; width and opacity by ``|score|``, colour by the input it enters, dashed where the
    score is negative), a trace of edge midpoints carrying each edge's hover text (score, and its exact
    effect where ``exact`` has it), the nodes (named ``nodes``: the input, the logits, every sender and
    every head or MLP reading a receiver input; hover: name, KV group under GQA), and the q/k/v ports."""
    import plotly.graph_objects as go

    edges, scores = _edge_list(d, max_edges)
    seen = graph_sizes(d["edges"])
    L, H, K = (int(d.get(k) or v) for k, v in zip(("n_layer", "n_head", "n_kv"), seen))
    method = str(d.get("method", "score"))
    label = "exact effect" if method == "exact" else f"{method} score"
    shown_exact = exact if method != "exact" else None
    top = float(np.abs(scores).max(initial=0.0)) or 1.0
    fig = go.Figure()
    nodes: set[str] = {"input", "logits"}
    ports: dict[tuple[float, float], str] = {}
    mids: tuple[list[float], list[float], list[str]] = ([], [], [])
    for e, s in zip(edges, scores.tolist()):
        sender, receiver = e.split("->")
        x0, y0 = node_xy(sender, L, H)
        kind, x1, y1 = receiver_port(receiver, L, H, K)
        fig.add_trace(_edge_trace(e, s, (x0, y0), (x1, y1), kind, abs(s) / top))
        readers, port = _readers(receiver, H, K)
        nodes.update([sender, *readers])
        if port is not None:
            ports[(x1, y1)] = port
        mids[0].append((x0 + x1) / 2)
        mids[1].append((y0 + y1) / 2)
        mids[2].append(_edge_hover(e, s, label, shown_exact))
    fig.add_trace(_midpoint_trace(mids))
    fig.add_trace(_node_trace(nodes, L, H, K))
    fig.add_trace(_port_trace(ports))
    _circuit_layout(fig, L, H, title)
    return fig


@boundary
def view_circuit(result: ResultLike, exact: ResultLike | None = None, max_edges: int = 300) -> View:
    """The graph of ``result``: a :class:`~gpt2_interp.analysis.circuits.Circuit` (its edges) or
    :class:`~gpt2_interp.analysis.circuits.EdgeScores` (its ``max_edges`` largest ``|score|`` edges), or
    either's dict. Nodes by layer (input, heads, MLPs, logits), edges with width by ``|score|`` and colour
    by the input they enter (query, key, value — marked ``q``/``k``/``v`` below the heads —, MLP, logits),
    negative scores dashed. Hovering an edge's midpoint shows its score and, where ``exact`` (edge scores
    of method ``exact``, their dict, or ``{edge: value}``) has it, its exact patching effect; a circuit
    scored by ``exact`` shows its scores as exact effects. At most ``max_edges`` edges are drawn."""
    d = as_dict(result)
    if not {"edges", "scores"} <= set(d):
        raise ValueError(f"a circuit view needs 'edges' and 'scores'; the result has fields {sorted(d)[:12]}")
    max_edges = check_count(max_edges, "max_edges")
    ex = _exact_of(exact) if exact is not None else None
    method, metric = d.get("method", "?"), d.get("metric", "?")
    is_circuit = "total_edges" in d
    items = len(d["edges"])
    if d.get("positions") is not None:  # a per-position circuit is drawn by its edges, scores summed over positions
        d = _collapsed(d)
    n = min(len(d["edges"]), max_edges)
    title, what = _circuit_title(d, items, n) if is_circuit else _scores_title(d, n)
    note = text_part(
        f"{what}; metric {metric}; width and opacity by |{method} score|, colour by the input the edge enters, "
        "dashed: negative score. Hover an edge's midpoint for its score"
        + (" and exact effect" if ex is not None or method == "exact" else "")
        + "."
    )
    fig = circuit_figure(d, max_edges, ex)
    return View(title, [note, figure_part(fig)])


def _circuit_title(d: Mapping[str, Any], items: int, n: int) -> tuple[str, str]:
    """A circuit view's title (its edges, or a per-position circuit's ``items``, of how many, the faithfulness
    and completeness measured) and what it draws (``n`` edges)."""
    method = d.get("method", "?")
    f, c = d.get("faithfulness"), d.get("completeness")
    measured = ("" if f is None else f", faithfulness {f:.3f}") + ("" if c is None else f", completeness {c:.3f}")
    title = f"Circuit ({method}): {len(d['edges'])} of {d['total_edges']} edges{measured}"
    if "n_pos_items" in d:
        title = (
            f"Circuit ({method}, per position): {items} of {d['n_pos_items']} (position, edge) items on "
            f"{len(d['edges'])} edges{measured}"
        )
    return title, f"{n} edges drawn" + (f" (the {n} largest)" if n < len(d["edges"]) else "")


def _scores_title(d: Mapping[str, Any], n: int) -> tuple[str, str]:
    """An edge-score view's title and what it draws (its ``n`` largest edges)."""
    return (
        f"Edge scores ({d.get('method', '?')}): the {n} largest |score| of {len(d['edges'])} edges",
        f"{n} edges drawn",
    )


def _collapsed(d: dict) -> dict:
    """A per-position circuit's dict with one entry per edge, its score summed over its positions (as
    :meth:`Circuit.collapsed <gpt2_interp.analysis.circuits.Circuit.collapsed>` does)."""
    edges, scores = totals_by_size(list(d["edges"]), d["scores"])
    n_edges = int(d["total_edges"]) // max(int(d.get("n_pos") or 1), 1)
    return {
        **d,
        "edges": edges,
        "scores": scores,
        "positions": None,
        "total_edges": n_edges,
        "n_pos_items": d["total_edges"],
    }


def _curve_trace(f: np.ndarray, kept: np.ndarray, sizes: list[int], method: str) -> Any:
    """One method's faithfulness ``f [sizes]`` against the edges ``kept [sizes]`` after pruning (the sizes
    that keep an edge); hover: the method, the requested and kept edge counts, the faithfulness."""
    import plotly.graph_objects as go

    ok = kept > 0
    return go.Scatter(
        x=kept[ok].tolist(),  # plain lists: the drawn figure's data read back as they are
        y=f[ok].tolist(),
        mode="lines+markers",
        name=method,
        customdata=[[sizes[j], method] for j in np.flatnonzero(ok)],
        hovertemplate="%{customdata[1]}: top %{customdata[0]} edges, %{x:.0f} kept after pruning"
        "<br>faithfulness %{y:.4f}<extra></extra>",
    )


def _smallest(f: np.ndarray, kept: np.ndarray, methods: list[str], target: float) -> str:
    """Per method, the fewest edges kept among the sizes whose faithfulness reaches ``target``."""
    hits = [kept[i][f[i] >= target] for i in range(len(methods))]
    return ", ".join(
        f"{m}: {int(h.min())} edges" if h.size else f"{m}: none of the sizes" for m, h in zip(methods, hits)
    )


@boundary
def view_faithfulness(result: ResultLike, target: float | None = 0.8) -> View:
    """A :class:`~gpt2_interp.analysis.circuits.FaithfulnessCurve` (or its dict): exact faithfulness against
    the circuit's edges after pruning (log scale), one line per scoring method; hover: the method, the
    requested and kept edge counts and the faithfulness. Dotted lines at 1 (the whole model), 0 (the empty
    circuit) and ``target`` (None: none), which the note's smallest-circuit counts refer to."""
    import plotly.graph_objects as go

    d = as_dict(result)
    f, kept = array(d["faithfulness"]), array(d["kept"])
    methods, sizes = list(d["methods"]), [int(s) for s in d["sizes"]]
    if f.shape != (len(methods), len(sizes)) or kept.shape != f.shape:
        raise ValueError(
            f"faithfulness {f.shape} and kept {kept.shape} must both be [methods, sizes] = {(len(methods), len(sizes))}"
        )
    fig = go.Figure([_curve_trace(f[i], kept[i], sizes, m) for i, m in enumerate(methods)])
    lines = [(1.0, "#888"), (0.0, "#888")] + ([(target, "#d62728")] if target is not None else [])
    for y, colour in lines:
        fig.add_hline(y=y, line={"dash": "dot", "color": colour, "width": 1})
    fig.update_layout(
        height=420,
        xaxis={"type": "log", "title": f"edges in the circuit (of {d.get('total_edges', '?')})"},
        yaxis={"title": f"faithfulness ({d.get('metric', '?')})"},
        margin={"t": 30},
    )
    reach = (
        ""
        if target is None
        else f"; the smallest circuit reaching {target:.0%}: " + _smallest(f, kept, methods, target)
    )
    note = text_part(
        "Faithfulness (exact: every edge outside the circuit patched to the corrupted run, normalised to 1 for "
        f"the whole model and 0 for the empty circuit) per scoring method{reach}."
    )
    return View(f"Faithfulness over circuit size ({', '.join(methods)})", [note, figure_part(fig)])
