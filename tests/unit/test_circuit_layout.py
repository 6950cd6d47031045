"""The circuit graph's layout on a SmolLM2-shaped graph (30 layers, 9 query heads over 3 key/value heads): every
node has a place of its own (the MLPs in their own column, not in a head's), and every node's label stays clear of
the other labels and nodes by 1.5 times its font size, in the PNG figure (matplotlib's own text extents) and in
the interactive view (label boxes from the figure's size, font and ranges, at Plotly's default 700-pixel width).
With the MLPs centred in the heads' rows, labels came within 5 pixels (PNG) and 11.5 pixels (view) of the next
node up (``m23`` under ``a24.h4``, ``m29`` under ``logits``)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from gpt2_interp.core.circuit_layout import mlp_x, node_xy

L, H, K = 30, 9, 3  # SmolLM2-135M's graph


def every_node_edges() -> list[str]:
    """Edges that put every node of the graph in the figure: each head and MLP into the logits, the input and
    each MLP into a head's query (SmolLM2's own edge names)."""
    edges = [f"a{l}.h{h}->logits" for l in range(L) for h in range(H)] + [f"m{l}->logits" for l in range(L)]
    edges += [f"m{l}->a{l + 1}.h4<q>" for l in range(L - 1)] + ["input->a0.h0<q>", "a3.h2->a7.h1<k>"]
    return edges


def circuit() -> SimpleNamespace:
    edges = every_node_edges()
    return SimpleNamespace(
        edges=edges,
        scores=np.linspace(1.0, 0.1, len(edges)).tolist(),
        n_layer=L,
        n_head=H,
        n_kv=K,
        method="eap",
        total_edges=len(edges),
        faithfulness=None,
    )


NODES = ["input", "logits", *[f"a{l}.h{h}" for l in range(L) for h in range(H)], *[f"m{l}" for l in range(L)]]


def overlapping(boxes: dict[str, tuple[float, float, float, float]], markers: dict[str, tuple], pad: float):
    """Pairs (label, other label or node) whose boxes ``(x0, y0, x1, y1)`` come within ``pad`` of each other."""

    def touch(a, b) -> bool:
        return a[0] < b[2] + pad and b[0] < a[2] + pad and a[1] < b[3] + pad and b[1] < a[3] + pad

    found = [(a, b) for a, b in itertools.combinations(boxes, 2) if touch(boxes[a], boxes[b])]
    found += [(a, f"node {b}") for a in boxes for b in markers if a != b and touch(boxes[a], markers[b])]
    return found


def test_every_node_has_a_place_of_its_own_and_mlps_a_column_of_their_own():
    xy = {n: node_xy(n, L, H) for n in NODES}
    closest = min(np.hypot(a[0] - b[0], a[1] - b[1]) for a, b in itertools.combinations(xy.values(), 2))
    assert closest >= 1.0
    assert all(xy[f"m{l}"][0] == mlp_x(H) > max(h for h in range(H)) for l in range(L))
    assert {x for n, (x, _) in xy.items() if n.startswith("a")}.isdisjoint({mlp_x(H)})
    with pytest.raises(ValueError, match="not a node"):
        node_xy("b3", L, H)


def test_no_label_of_the_png_figure_overlaps_another_label_or_node():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from gpt2_interp.plots.circuits import plot_circuit

    fig = plot_circuit(circuit(), max_edges=10_000)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    ax = fig.axes[0]
    labels = {t.get_text(): t for t in ax.texts if (t.get_gid() or "").startswith("node:")}
    assert set(labels) == set(NODES)
    boxes = {n: tuple(t.get_window_extent(renderer).extents) for n, t in labels.items()}
    radius = np.sqrt(60) / 2 * fig.dpi / 72  # the scatter's s=60 points² marker, in pixels
    markers = {}
    for n in NODES:
        x, y = ax.transData.transform(node_xy(n, L, H))
        markers[n] = (x - radius, y - radius, x + radius, y + radius)
    assert not overlapping(boxes, markers, pad=1.5 * 6 * fig.dpi / 72)  # the labels' 6-point font


def test_no_label_of_the_interactive_view_overlaps_another_label_or_node():
    pytest.importorskip("plotly")
    from gpt2_interp.views.circuits import LABEL_SIZE, NODE_SIZE, circuit_figure

    d = {"edges": every_node_edges(), "scores": circuit().scores, "n_layer": L, "n_head": H, "n_kv": K}
    fig = circuit_figure(d, max_edges=10_000).to_plotly_json()
    nodes = next(t for t in fig["data"] if t.get("name") == "nodes")
    lay = fig["layout"]
    width, height, m = 700, lay["height"], lay["margin"]
    (x0, x1), (y0, y1) = lay["xaxis"]["range"], lay["yaxis"]["range"]
    sx = (width - m.get("l", 80) - m.get("r", 80)) / (x1 - x0)
    sy = (height - m["t"] - m["b"]) / (y1 - y0)
    boxes, markers = {}, {}
    for x, y, text, where in zip(nodes["x"], nodes["y"], nodes["text"], nodes["textposition"]):
        px, py = (x - x0) * sx, (y - y0) * sy  # pixels, y upwards
        r = NODE_SIZE / 2
        markers[text] = (px - r, py - r, px + r, py + r)
        w, h = 0.62 * LABEL_SIZE * len(text), 1.25 * LABEL_SIZE  # generous: Plotly's sans-serif is narrower
        base = py + r + 1 if where == "top center" else py - r - 1 - h
        boxes[text] = (px - w / 2, base, px + w / 2, base + h)
    assert set(boxes) == set(NODES)
    assert not overlapping(boxes, markers, pad=1.5 * LABEL_SIZE)
