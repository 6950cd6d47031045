"""Figures of attribution estimates against exact patching: scatter plots of effects.

Built from plain arrays (``Figure`` objects, no pyplot state); the analysis results call these.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..core.boundary import boundary
from .figure import finish
from .layout import grid_size, place_labels


def _scatter(ax: Axes, estimate: np.ndarray, exact: np.ndarray, highlight: Sequence[bool] | None = None) -> None:
    est, ex = np.asarray(estimate, dtype=float), np.asarray(exact, dtype=float)
    lim = float(max(np.abs(est).max(initial=0), np.abs(ex).max(initial=0))) * 1.08 or 1.0
    ax.axhline(0, color="0.85", lw=0.8)
    ax.axvline(0, color="0.85", lw=0.8)
    ax.plot([-lim, lim], [-lim, lim], color="0.6", lw=0.8, ls="--", label="estimate = exact")
    if highlight is None:
        ax.scatter(ex, est, s=9, alpha=0.6, color="tab:blue", lw=0)
    else:
        h = np.asarray(highlight, dtype=bool)
        ax.scatter(ex[h], est[h], s=14, alpha=0.8, color="tab:red", lw=0, label="estimate's top cells")
        ax.scatter(ex[~h], est[~h], s=14, alpha=0.8, color="tab:gray", lw=0, label="random controls")
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    # equal limits (no fixed aspect, which a tight layout cannot account for): the diagonal runs corner to corner
    ax.set_xlabel("exact patching effect", fontsize=8)
    ax.set_ylabel("estimated effect", fontsize=8)
    ax.tick_params(labelsize=7)
    for axis in (ax.xaxis, ax.yaxis):  # few enough tick labels that they never run into each other
        axis.set_major_locator(MaxNLocator(5, symmetric=True))


@boundary
def plot_estimate_vs_exact(estimate: np.ndarray, exact: np.ndarray, title: str = "") -> Figure:
    """One scatter of every cell's ``estimate`` effect (y) against its ``exact`` patching effect (x), both
    ``[n_cells]``, with the diagonal estimate = exact; ``title`` above it."""
    fig = Figure(figsize=(4.2, 4.2))
    ax = fig.add_subplot()
    _scatter(ax, estimate, exact)
    ax.set_title(title, fontsize=9)
    return finish(fig)


@boundary
def plot_verification(
    estimate: np.ndarray,
    exact: np.ndarray,
    top: Sequence[bool],
    labels: Sequence[str],
    title: str = "",
    n_labels: int = 5,
) -> Figure:
    """Verified cells: the estimate's top cells (red) and random controls (grey); the ``n_labels`` cells
    of largest exact effect are labelled where a label fits inside the axes without covering another
    label or the legend (:func:`~gpt2_interp.plots.layout.place_labels`). ``estimate``, ``exact``, ``top``
    (True for a top cell) and ``labels``: one entry per verified cell (as in
    :class:`~gpt2_interp.analysis.Verification`); ``title`` above it."""
    fig = Figure(figsize=(5.0, 5.0))
    ax = fig.add_subplot()
    _scatter(ax, estimate, exact, top)
    legend = ax.legend(fontsize=7, loc="upper left")
    ax.set_title(title, fontsize=8)
    finish(fig)
    ex, est = np.asarray(exact, dtype=float), np.asarray(estimate, dtype=float)
    order = np.argsort(-np.abs(ex))[:n_labels]
    place_labels(
        ax, ex[order].tolist(), est[order].tolist(), [labels[i] for i in order], avoid=[legend.get_window_extent()]
    )
    return fig


@boundary
def plot_agreement_grid(
    panels: Sequence[Sequence[tuple[np.ndarray, np.ndarray, str]]],
    row_labels: Sequence[str],
    col_labels: Sequence[str],
    title: str = "",
) -> Figure:
    """A grid of estimate-vs-exact scatters: ``panels[row][col] = (estimate, exact, caption)`` (rows:
    hook families, columns: methods), titled by ``row_labels[row]`` and ``col_labels[col]``; ``title``
    above the grid."""
    rows, cols = len(panels), max(len(r) for r in panels)
    fig = Figure(figsize=grid_size(rows, cols, (3.2, 3.2), (0.4, 0.8), lo=(4.5, 3.5), hi=(22.0, 24.0)))
    for i, row in enumerate(panels):
        for j, (est, ex, caption) in enumerate(row):
            ax = fig.add_subplot(rows, cols, i * cols + j + 1)
            _scatter(ax, est, ex)
            ax.set_title(f"{row_labels[i]} · {col_labels[j]}\n{caption}", fontsize=8)
    return finish(fig, title)
