"""Figures of edge-level circuits: the circuit as a graph, faithfulness curves, edge-score heatmaps.

Built from the result objects of :mod:`gpt2_interp.analysis.circuits` read by their fields (a circuit's
``edges``/``scores``/``n_layer``/``n_head``/``n_kv``, a curve's ``faithfulness``/``kept``/``methods``),
as ``Figure`` objects without pyplot state.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..core.boundary import boundary
from ..core.circuit_layout import faithfulness_text, node_xy, row_ticks, x_range
from .figure import finish, style_line_axes
from .layout import grid_size

#: Line colour of an edge by the input it enters: a head's query, key or value input, an MLP, the logits.
KIND_COLOURS = {"q": "tab:blue", "k": "tab:green", "v": "tab:orange", "mlp": "tab:purple", "logits": "0.35"}


def _node_xy(name: str, n_layer: int, n_head: int) -> tuple[float, float]:
    """Where a node sits: :func:`gpt2_interp.core.circuit_layout.node_xy` (the interactive view's layout), rows by
    forward order, heads spread across each attention row, the MLPs in a column of their own."""
    return node_xy(name, n_layer, n_head)


def _receiver_target(receiver: str, n_layer: int, n_head: int, n_kv: int) -> tuple[str, float, float]:
    """``(kind, x, y)`` where an edge into ``receiver`` ends (a key/value input: the middle of its group's heads)."""
    m = re.fullmatch(r"a(\d+)\.h(\d+)<([qkv])>", receiver)
    if m is None:
        kind = "logits" if receiver == "logits" else "mlp"
        return (kind, *_node_xy(receiver, n_layer, n_head))
    layer, idx, kind = int(m.group(1)), int(m.group(2)), m.group(3)
    if kind == "q":
        return kind, float(idx), 2.0 * layer + 1
    per = n_head // n_kv
    return kind, idx * per + (per - 1) / 2, 2.0 * layer + 1


@boundary
def plot_circuit(circuit: Any, max_edges: int = 400, title: str | None = None) -> Figure:
    """The circuit's nodes by layer (heads spread across each attention row) and its edges, their width by
    ``|score|`` and their colour by the input they enter (query, key, value, MLP, logits;
    :data:`KIND_COLOURS`); negative scores dashed. At most ``max_edges`` edges (the largest) are drawn;
    ``title`` replaces the default one (method, edge count, faithfulness when measured)."""
    L, H, K = circuit.n_layer, circuit.n_head, circuit.n_kv
    fig = Figure(figsize=grid_size(1, 1, (max(4.0, 0.45 * (H + 1) + 1.5), max(4.0, 0.32 * (2 * L + 2) + 1.0))))
    ax = fig.add_subplot()
    edges, scores = list(circuit.edges[:max_edges]), np.abs(np.asarray(circuit.scores[:max_edges], dtype=float))
    top = float(scores.max(initial=0.0)) or 1.0
    nodes: set[str] = set()
    for e, s, signed in zip(edges, scores, circuit.scores[:max_edges]):
        sender, receiver = e.split("->")
        x0, y0 = _node_xy(sender, L, H)
        kind, x1, y1 = _receiver_target(receiver, L, H, K)
        ax.plot(
            [x0, x1],
            [y0, y1],
            color=KIND_COLOURS[kind],
            lw=0.4 + 3.0 * s / top,
            alpha=0.35 + 0.6 * s / top,
            ls="-" if signed >= 0 else "--",
            zorder=1,
        )
        nodes.add(sender)
        if kind in ("mlp", "logits"):
            nodes.add(receiver)
        elif kind == "q":
            nodes.add(receiver.split("<")[0])
    for name in sorted(nodes):
        x, y = _node_xy(name, L, H)
        ax.scatter([x], [y], s=60, color="white", edgecolor="0.2", zorder=2)
        below = name == "input"  # the input's label under it, clear of the first layer's heads
        ax.annotate(
            name,
            (x, y),
            xytext=(0, -6 if below else 6),
            textcoords="offset points",
            fontsize=6,
            ha="center",
            va="top" if below else "bottom",
            zorder=3,
            gid=f"node:{name}",
        )
    ticks, labels = row_ticks(L)
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=7)
    ax.set_xticks([])
    ax.set_xlim(*x_range(H))
    ax.set_ylim(-1, 2 * L + 2)
    handles = [Line2D([], [], color=c, lw=2, label=k) for k, c in KIND_COLOURS.items()]
    ax.legend(handles=handles, fontsize=6, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=5, frameon=False)
    if title is None:
        f = faithfulness_text(circuit.faithfulness, 2)
        title = f"circuit ({circuit.method}): {len(circuit.edges)} of {circuit.total_edges} edges{f}"
    ax.set_title(title, fontsize=9)
    return finish(fig)


@boundary
def plot_faithfulness(curve: Any, target: float | None = 0.8, title: str | None = None) -> Figure:
    """A ``curve`` (:class:`~gpt2_interp.analysis.circuits.FaithfulnessCurve`): faithfulness (y) against the
    circuit's edges after pruning (x, log scale), one line per scoring method; dotted lines at 1 (the whole
    model), 0 and ``target`` (None: none). ``title`` replaces the default."""
    fig = Figure(figsize=(5.5, 3.8))
    ax = fig.add_subplot()
    for i, m in enumerate(curve.methods):
        kept = np.asarray(curve.kept[i], dtype=float)
        ok = kept > 0
        ax.plot(kept[ok], np.asarray(curve.faithfulness[i], dtype=float)[ok], marker="o", ms=3, label=m)
    ax.axhline(1.0, color="0.5", lw=0.8, ls=":")
    ax.axhline(0.0, color="0.5", lw=0.8, ls=":")
    if target is not None:
        ax.axhline(target, color="tab:red", lw=0.8, ls=":", label=f"{target:.0%}")
    ax.set_xscale("log")
    ax.set_xlabel(f"edges in the circuit (of {curve.total_edges})", fontsize=8)
    ax.set_ylabel(f"faithfulness ({curve.metric})", fontsize=8)
    ax.tick_params(labelsize=7)
    style_line_axes([ax], legend_size=7)
    ax.set_title("faithfulness over circuit size" if title is None else title, fontsize=9)
    return finish(fig)


@boundary
def plot_edge_scores(scores: Any, title: str | None = None) -> Figure:
    """Edge scores as a senders (rows) × receivers (columns) heatmap, a diverging scale centred at 0,
    blank where no edge exists; ``title`` replaces the default (method and metric)."""
    graph = scores.graph
    flat = scores.total().float()
    mat = graph.matrix(flat.nan_to_num(0.0)).numpy()
    mat = np.where(graph.valid.numpy(), mat, np.nan)
    lim = float(np.nanmax(np.abs(mat))) if np.isfinite(mat).any() else 1.0
    fig = Figure(figsize=(7.0, 5.0))
    ax = fig.add_subplot()
    im = ax.imshow(mat, cmap="RdBu_r", vmin=-lim or -1, vmax=lim or 1, aspect="auto", interpolation="nearest")
    fig.colorbar(im, ax=ax, shrink=0.8)
    ax.set_xlabel(f"receivers ({graph.n_receivers})", fontsize=8)
    ax.set_ylabel(f"senders ({graph.n_senders})", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.set_title(f"{scores.method} edge scores ({scores.metric})" if title is None else title, fontsize=9)
    return finish(fig)


__all__ = ["KIND_COLOURS", "plot_circuit", "plot_edge_scores", "plot_faithfulness"]
