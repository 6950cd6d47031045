"""Figures of the causal experiments: patching heatmaps and ROME-style causal traces.

Figures are built with ``matplotlib.figure.Figure`` (no pyplot state, any backend); save them with
``fig.savefig`` or a result's ``save_plot``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colorbar import Colorbar
from matplotlib.figure import Figure

from ..core.boundary import boundary
from .layout import finish_layout, grid_size, spaced_ticks

if TYPE_CHECKING:
    from ..analysis.patching import PatchResult
    from ..analysis.tracing import AverageTrace, TraceResult

TRACE_CMAPS = {"hidden": "Purples", "mlp": "Greens", "attn": "Reds"}
TRACE_NAMES = {"hidden": "state", "mlp": "MLP", "attn": "Attn"}


def _heatmap(
    fig: Figure,
    ax: Axes,
    data: np.ndarray,
    rows: list[str],
    cols: list[str],
    cmap: str,
    vmin: float | None,
    vmax: float | None,
    label: str,
    max_ticks: int = 24,
) -> Any:
    im = ax.imshow(data, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    step = max(1, -(-len(cols) // max_ticks))
    ax.set_xticks(
        range(0, len(cols), step),
        [cols[i] for i in range(0, len(cols), step)],
        fontsize=8,
        rotation=90 if max(map(len, cols), default=0) > 3 else 0,
    )
    cbar = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.03)
    cbar.set_label(label, fontsize=8)
    return cbar


@boundary
def plot_patch(result: PatchResult, cmap: str = "RdBu") -> Figure:
    """Heatmap of a patching sweep: layers down, positions (or heads) across; a ``[layer, pos, head]``
    result gets one panel per head. Diverging colours centred on the unpatched run's metric
    (``result.baseline``): white = no effect."""
    v = result.values.detach().float().cpu().numpy()
    base = result.baseline
    spread = float(np.abs(v - base).max()) or 1.0
    lo, hi = base - spread, base + spread
    label = f"{result.metric}{' (normalised)' if result.normalized else ''}"
    title = (
        f"{result.direction} patching of {result.hook} "
        f"(white = {'corrupted' if result.direction == 'denoise' else 'clean'} run, {base:.3g})"
    )
    if v.ndim == 2:
        cols = result.position_labels if result.index_names[1] == "pos" else result.head_labels
        assert cols is not None, "a result labels the axes it has"
        fig = Figure(figsize=grid_size(len(result.layer_labels), len(cols), (0.45, 0.3), (2.6, 1.6), lo=(5.0, 3.0)))
        ax = fig.add_subplot()
        _heatmap(fig, ax, v, result.layer_labels, [repr(c)[1:-1] for c in cols], cmap, lo, hi, label)
        ax.set_xlabel("position (clean/corrupted token)" if result.index_names[1] == "pos" else "head")
        ax.set_ylabel("layer")
        ax.set_title(title, fontsize=10)
        return finish_layout(fig)
    heads = result.head_labels
    assert heads is not None and result.position_labels is not None, "a [layer, pos, head] result labels both"
    ncols = min(4, len(heads))
    nrows = -(-len(heads) // ncols)
    panel = grid_size(len(result.layer_labels), len(result.position_labels), (0.35, 0.3), (1.8, 1.5), lo=(4.2, 2.5))
    fig = Figure(figsize=(min(panel[0] * ncols, 24.0), min(panel[1] * nrows + 0.5, 30.0)))
    for i, h in enumerate(heads):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        _heatmap(
            fig,
            ax,
            v[:, :, i],
            result.layer_labels,
            [repr(c)[1:-1] for c in result.position_labels],
            cmap,
            lo,
            hi,
            label,
        )
        ax.set_title(f"head {h}", fontsize=9)
        ax.set_xlabel("position")
        ax.set_ylabel("layer")
    fig.suptitle(title)
    return finish_layout(fig)


def _trace_axes(fig: Figure, ax: Axes, r: TraceResult) -> tuple[Colorbar, list[tuple[float, str]]]:
    """One trace panel. The colour scale is absolute, from 0 to the clean probability (or the best
    restored cell), with the corrupted and clean probabilities marked on the colour bar: a weak
    corruption shows as a dark background instead of being stretched to white."""
    labels = [
        repr(t)[1:-1] + ("*" if r.subject_range[0] <= i < r.subject_range[1] else "") for i, t in enumerate(r.tokens)
    ]
    scores = r.scores.detach().float().cpu().numpy()
    hi = max(float(scores.max()), r.clean_score, 1e-6)
    cbar = _heatmap(
        fig,
        ax,
        scores,
        labels,
        [str(i) for i in range(scores.shape[1])],
        TRACE_CMAPS[r.kind],
        0.0,
        hi,
        f"p({r.target.strip()!s}) with the cell restored",
    )
    for value, style in ((r.corrupted_score, "--"), (r.clean_score, "-")):
        cbar.ax.axhline(value, color="black", lw=1.2, ls=style)
    # most important first: a tick that would overprint one before it is left out after the layout
    ticks = [(r.clean_score, f"clean {r.clean_score:.2f}"), (r.corrupted_score, f"corrupted {r.corrupted_score:.2f}")]
    ticks += [(0.0, "0"), (hi, f"{hi:.2f}")]
    shown = dict(reversed(ticks))  # every candidate for now, so the layout makes room for the widest label
    cbar.set_ticks(list(shown), labels=list(shown.values()), fontsize=7)
    what = TRACE_NAMES[r.kind]
    weak = r.clean_score > 0 and r.corrupted_score > 0.5 * r.clean_score
    ax.set_title(
        f"Impact of restoring {what} after corrupted input\n"
        f"corrupted p = {r.corrupted_score:.3f}, clean p = {r.clean_score:.3f}"
        + (" (weak corruption)" if weak else ""),
        fontsize=9,
        color="tab:red" if weak else "black",
    )
    ax.set_xlabel(
        "single restored layer"
        if r.kind == "hidden"
        else f"single restored {what} layer"
        if r.window == 1
        else f"center of interval of {r.window} restored {what} layers",
        fontsize=8,
    )
    return cbar, ticks


def _trace_size(r: TraceResult) -> tuple[float, float]:
    """One trace panel's size: a column per layer, a row per token."""
    return grid_size(len(r.tokens), r.scores.shape[1], (0.16, 0.3), (3.2, 1.8), lo=(5.0, 3.0), hi=(7.5, 16.0))


def _finish_traces(fig: Figure, bars: list[tuple[Colorbar, list[tuple[float, str]]]]) -> Figure:
    finish_layout(fig)
    for cbar, ticks in bars:
        spaced_ticks(cbar, ticks)
    return fig


@boundary
def plot_trace(result: TraceResult) -> Figure:
    """ROME's heatmap: tokens down (subject tokens marked ``*``), layers across, p(target) with the
    cell restored; the colour scale runs from 0, with the corrupted and clean scores marked on it."""
    fig = Figure(figsize=_trace_size(result))
    return _finish_traces(fig, [_trace_axes(fig, fig.add_subplot(), result)])


@boundary
def plot_traces(traces: Sequence[TraceResult]) -> Figure:
    """Several traces of one prompt side by side (ROME: hidden, MLP, attention)."""
    if not traces:
        raise ValueError("no traces to plot")
    w, h = _trace_size(traces[0])
    fig = Figure(figsize=(min(w * len(traces), 24.0), h + 0.3))
    bars = [_trace_axes(fig, fig.add_subplot(1, len(traces), i + 1), r) for i, r in enumerate(traces)]
    fig.suptitle(f"{traces[0].prompt!r} → {traces[0].target!r} (clean p = {traces[0].clean_score:.3f})", fontsize=10)
    return _finish_traces(fig, bars)


@boundary
def plot_average_trace(result: AverageTrace, **_: Any) -> Figure:
    """ROME Figure 2: average indirect effect per position bucket × layer, one panel per kind."""
    k = len(result.kinds)
    w, h = grid_size(
        len(result.buckets), len(result.layer_labels), (0.14, 0.35), (3.6, 1.4), lo=(5.0, 3.0), hi=(7.5, 8.0)
    )
    fig = Figure(figsize=(min(w * k, 24.0), h))
    for i, kind in enumerate(result.kinds):
        ax = fig.add_subplot(1, k, i + 1)
        data = result.indirect_effect[i].detach().float().cpu().numpy()
        rows = [f"{b} ({c})" for b, c in zip(result.buckets, result.counts)]
        _heatmap(
            fig,
            ax,
            data,
            rows,
            result.layer_labels,
            TRACE_CMAPS.get(kind, "viridis"),
            min(0.0, float(data.min())),
            max(float(data.max()), 1e-6),
            "average indirect effect",
            max_ticks=12,
        )
        ax.set_title(f"restoring {TRACE_NAMES.get(kind, kind)}", fontsize=9)
        ax.set_xlabel("layer" if kind == "hidden" else f"center of {result.window}-layer window", fontsize=8)
    fig.suptitle(
        f"Causal trace averaged over {result.n_known} known facts (of {result.n_facts}); "
        f"clean p = {result.clean_score:.3f}",
        fontsize=10,
    )
    return finish_layout(fig)
