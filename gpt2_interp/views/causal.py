"""Views of the causal experiments: patching sweeps (and attribution estimates, which share their shape),
ROME-style causal traces, sets of traces and traces averaged over facts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core.boundary import boundary
from ..core.result import ResultLike
from .heatmap import KIND_COLOURS, array, as_dict, colorbar_beside, heatmap, token_label
from .page import View, figure_part, text_part

KIND_NAMES = {"hidden": "hidden state", "mlp": "MLP", "attn": "attention"}


def baseline(d: dict[str, Any]) -> float:
    """The value of "no effect" in a patching result's dict: the unpatched run's metric (the corrupted run
    when denoising, the clean run when noising; 0 and 1 when normalised)."""
    if d.get("normalized"):
        return 0.0 if d["direction"] == "denoise" else 1.0
    return float(d["corrupted_metric"] if d["direction"] == "denoise" else d["clean_metric"])


def _patch_labels(d: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(rows, columns)`` of a patching result's map: its layers; its positions ``"pos:token"`` (clean/corrupted
    tokens) or its heads ``"head h"``."""
    if d["index_names"][1] == "pos":
        cols = [f"{p}:{token_label(lab)}" for p, lab in zip(d["positions"], d["position_labels"])]
    else:
        cols = [f"head {h}" for h in d["head_labels"]]
    return list(d["layer_labels"]), cols


def _patch_panels(v: np.ndarray, d: dict[str, Any]) -> list[tuple[np.ndarray, Any]]:
    """``(map [layer, column], head label)`` per panel: one panel of a ``[layer, pos]`` or ``[layer, head]``
    result (head None), one per head of a ``[layer, pos, head]`` one."""
    if v.ndim == 2:
        return [(v, None)]
    return [(v[:, :, h], label) for h, label in enumerate(d["head_labels"])]


def _patch_hover(z: np.ndarray, rows: list[str], cols: list[str], value: str, base: float) -> list[list[str]]:
    """Each cell's hover: its row and column, ``value`` then the cell's value, and its effect (value − ``base``)."""
    return [
        [f"<b>{r}</b> · {c}{value}{z[a, b]:.5g}<br>effect = {z[a, b] - base:+.5g}" for b, c in enumerate(cols)]
        for a, r in enumerate(rows)
    ]


def _mark_trace(m: tuple[int, ...], kind: str, rows: list[str], cols: list[str]) -> Any:
    """The outline of cell ``m`` (``(layer index, column index[, head index])``): black for a ``"top"`` cell,
    grey for a control; a head's mark shown with its head's panel."""
    import plotly.graph_objects as go

    return go.Scatter(
        x=[cols[m[1]]],
        y=[rows[m[0]]],
        mode="markers",
        marker={
            "symbol": "square-open",
            "size": 14,
            "color": "black" if kind == "top" else "#999",
            "line": {"width": 2},
        },
        hoverinfo="skip",
        showlegend=False,
        visible=len(m) < 3 or m[2] == 0,
        name="verified" if len(m) < 3 else f"verified head {m[2]}",
    )


def _head_menu(heads: list[Any], marks: Sequence[tuple[int, ...]]) -> list[dict[str, Any]]:
    """The menu showing one head's panel (and its marks) at a time."""
    buttons = []
    for i, h in enumerate(heads):
        vis = [j == i for j in range(len(heads))] + [len(m) < 3 or m[2] == i for m in marks]
        buttons.append({"label": f"head {h}", "method": "update", "args": [{"visible": vis}]})
    return [{"buttons": buttons, "x": 0, "y": 1.12, "xanchor": "left", "yanchor": "bottom"}]


def patch_figure(
    d: dict[str, Any], title: str = "", marks: Sequence[tuple[int, ...]] = (), mark_kinds: Sequence[str] = ()
) -> Any:
    """The Plotly figure of a patching (or attribution) result dict: layers down, positions (or heads)
    across, diverging colours centred on the baseline; a ``[layer, pos, head]`` result gets a head menu.
    Hover: layer, position (clean/corrupted tokens) or head, value, effect (value − baseline). ``marks``:
    ``(layer index, column index[, head index])`` cells outlined (e.g. the verified ones); ``mark_kinds``:
    ``"top"`` (black) or ``"control"`` (grey) per mark."""
    import plotly.graph_objects as go

    v = array(d["values"])
    rows, cols = _patch_labels(d)
    panels = _patch_panels(v, d)
    fig = go.Figure([_panel_trace(d, v, z, h, rows, cols, i == 0) for i, (z, h) in enumerate(panels)])
    kinds = [*mark_kinds, *["top"] * (len(marks) - len(mark_kinds))]
    drawn = [m for m, mk in zip(marks, kinds) if len(m) >= 2]
    for m, mk in zip(marks, kinds):
        if len(m) >= 2:
            fig.add_trace(_mark_trace(m, mk, rows, cols))
    pos = d["index_names"][1] == "pos"
    fig.update_layout(
        title={"text": title, "font": {"size": 12}},
        height=int(min(max(26 * len(rows) + 180, 320), 1000)),
        margin={"l": 80, "r": 20, "t": 80, "b": 100},
        xaxis={"type": "category", "title": "position (clean/corrupted token)" if pos else "head"},
        yaxis={"type": "category", "title": "layer", "autorange": "reversed"},
        updatemenus=_head_menu([h for _, h in panels], drawn) if v.ndim == 3 else [],
    )
    return fig


def _panel_trace(
    d: dict[str, Any], v: np.ndarray, z: np.ndarray, h: Any, rows: list[str], cols: list[str], visible: bool
) -> Any:
    """The heatmap of panel ``z`` (head ``h``, None for the only panel) of a patching result ``d`` whose values
    are ``v``: diverging colours centred on the baseline, as far out as the largest effect of ``v``."""
    base = baseline(d)
    spread = (float(np.nanmax(np.abs(v - base))) if v.size else 0.0) or 1.0
    metric = f"{d['metric']}{' (normalised)' if d.get('normalized') else ''}"
    where = "" if h is None else f" · head {h}"
    hover = _patch_hover(z, rows, cols, f"{where}<br>{metric} = ", base)
    tr = heatmap(z, cols, rows, hover=hover, colorscale="RdBu", zmin=base - spread, zmax=base + spread, colorbar=metric)
    tr.visible = visible
    tr.name = "all" if h is None else f"head {h}"
    return tr


@boundary
def view_patch(result: ResultLike) -> View:
    """A :class:`~gpt2_interp.analysis.PatchResult` (or an attribution estimate, or either's dict) as a
    layer × position (or head) heatmap; a ``[layer, pos, head]`` sweep has a head menu. Hover: the cell's
    labels, its metric value and its effect."""
    d = as_dict(result)
    base = baseline(d)
    what = f"{d['method']} estimate of " if d.get("method") else ""
    title = f"{what}{d['direction']} patching of {d['hook']}"
    unpatched = "corrupted" if d["direction"] == "denoise" else "clean"
    note = text_part(
        f"{title}: metric {d['metric']}; white = the {unpatched} run ({base:.4g}); "
        f"clean {float(d['clean_metric']):.4g}, "
        f"corrupted {float(d['corrupted_metric']):.4g}."
    )
    return View(title, [note, figure_part(patch_figure(d))])


def trace_figure(traces: Sequence[dict[str, Any]]) -> Any:
    """Causal traces of one prompt side by side (ROME's figure): tokens down (subject tokens marked
    ``*``), layers across, p(target) with the cell restored, from 0 to the clean probability. Hover: the
    token, the layer, the restored probability, the indirect effect, the clean and corrupted probabilities."""
    from plotly.subplots import make_subplots

    titles = []
    for t in traces:
        what = KIND_NAMES.get(t["kind"], t["kind"])
        titles.append(
            f"restoring {what}" + (f" (window {t['window']})" if t["kind"] != "hidden" and t["window"] > 1 else "")
        )
    fig = make_subplots(1, len(traces), subplot_titles=titles, horizontal_spacing=0.11)
    for i, t in enumerate(traces):
        s = array(t["scores"])
        ie = array(t["indirect_effect"])
        lo, hi = t["subject_range"]
        rows = [f"{j}:{token_label(tok)}{'*' if lo <= j < hi else ''}" for j, tok in enumerate(t["tokens"])]
        cols = list(t["layer_labels"])
        clean, corr = float(t["clean_score"]), float(t["corrupted_score"])
        hover = [
            [
                f"<b>{r}</b> · {c} ({t['kind']})<br>p({token_label(t['target'])}) restored = {s[a, b]:.4f}"
                f"<br>indirect effect = {ie[a, b]:+.4f}<br>clean p = {clean:.4f} · corrupted p = {corr:.4f}"
                for b, c in enumerate(cols)
            ]
            for a, r in enumerate(rows)
        ]
        hi_ = max(float(np.nanmax(s)), clean, 1e-6)
        scale = KIND_COLOURS.get(t["kind"], "Blues")
        tr = heatmap(s, cols, rows, hover=hover, colorscale=scale, zmin=0.0, zmax=hi_, colorbar="p restored")
        fig.add_trace(tr, 1, i + 1)
        colorbar_beside(fig, i, len=0.9, thickness=10, title={"text": ""})
        fig.update_yaxes(type="category", autorange="reversed", tickfont={"size": 9}, row=1, col=i + 1)
        fig.update_xaxes(type="category", tickfont={"size": 9}, title_text="layer", row=1, col=i + 1)
    n_tok = len(traces[0]["tokens"])
    fig.update_layout(height=int(min(max(24 * n_tok + 170, 320), 1000)), margin={"l": 90, "r": 40, "t": 60, "b": 60})
    return fig


@boundary
def view_traces(result: ResultLike) -> View:
    """A :class:`~gpt2_interp.analysis.TraceResult`, a ``TraceSet`` (hidden, MLP, attention) or their
    dicts: ROME's causal-trace heatmaps of one prompt side by side, with the clean and corrupted
    probabilities of the target (see :func:`trace_figure` for the hover)."""
    d = as_dict(result)
    traces = d.get("traces", [d])
    if not traces:
        raise ValueError("the trace set holds no traces; run trace() with at least one kind")
    t0 = traces[0]
    note = text_part(
        f"Target {t0['target']!r}: clean p = {float(t0['clean_score']):.4f}, corrupted p = "
        f"{float(t0['corrupted_score']):.4f} (subject {t0['subject']!r}, marked *; {t0['samples']} noise samples, "
        f"noise std {float(t0['noise_std']):.4g})."
    )
    return View(f"Causal trace: {t0['prompt']!r} → {t0['target']!r}", [note, figure_part(trace_figure(traces))])


def _average_hover(d: dict[str, Any], z: np.ndarray, p: np.ndarray | None, cols: list[str]) -> list[list[str]]:
    """Each cell's hover in one kind's panel of an average trace: the bucket, its count of facts, the layer, the
    average indirect effect ``z`` and, where given, the average restored probability ``p``."""
    return [
        [
            f"<b>{bucket}</b> ({count} facts) · {c}<br>average indirect effect = {z[a, b]:+.4f}"
            + (f"<br>average p restored = {p[a, b]:.4f}" if p is not None else "")
            for b, c in enumerate(cols)
        ]
        for a, (bucket, count) in enumerate(zip(d["buckets"], d["counts"]))
    ]


@boundary
def view_average_trace(result: ResultLike) -> View:
    """An :class:`~gpt2_interp.analysis.AverageTrace` (or its dict — the ``causal_trace`` experiment's
    data): ROME's Figure 2, the average indirect effect per position bucket × layer, one panel per kind;
    the rows name each bucket's count of facts, hover gives the effect, the restored probability and the
    count."""
    from plotly.subplots import make_subplots

    d = as_dict(result)
    kinds = list(d["kinds"])
    ie = array(d["indirect_effect"])  # [kind, bucket, layer]
    scores = array(d["scores"]) if d.get("scores") is not None else None
    counts = list(d["counts"])
    rows = [f"{b} ({c})" for b, c in zip(d["buckets"], counts)]
    cols = list(d["layer_labels"])
    fig = make_subplots(
        1, len(kinds), subplot_titles=[f"restoring {KIND_NAMES.get(k, k)}" for k in kinds], horizontal_spacing=0.12
    )
    for i, kind in enumerate(kinds):
        z = ie[i]
        hover = _average_hover(d, z, None if scores is None else scores[i], cols)
        tr = heatmap(
            z,
            cols,
            rows,
            hover=hover,
            colorscale=KIND_COLOURS.get(kind, "Blues"),
            zmin=min(0.0, float(np.nanmin(z))),
            zmax=max(float(np.nanmax(z)), 1e-6),
            colorbar="AIE",
        )
        fig.add_trace(tr, 1, i + 1)
        colorbar_beside(fig, i, thickness=10)
        fig.update_yaxes(type="category", autorange="reversed", showticklabels=i == 0, row=1, col=i + 1)
        fig.update_xaxes(type="category", title_text="layer" if kind == "hidden" else "window centre", row=1, col=i + 1)
    fig.update_layout(height=380, margin={"l": 170, "r": 40, "t": 60, "b": 60})
    corr = ", ".join(f"{k} {float(c):.3f}" for k, c in zip(kinds, d.get("corrupted_score", [])))
    note = text_part(
        f"Averaged over {d['n_known']} known facts (of {d['n_facts']}); clean p = {float(d['clean_score']):.4f}; "
        f"corrupted p: {corr}; window {d['window']}, {d['samples']} noise samples."
    )
    return View("Average causal trace", [note, figure_part(fig)])
