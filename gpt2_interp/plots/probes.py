"""Figures for linear probes: score, control score and selectivity by layer.

Figures are built as ``matplotlib.figure.Figure`` objects (no pyplot state, any backend).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.figure import Figure

from ..core.boundary import boundary
from .figure import finish, style_line_axes

if TYPE_CHECKING:
    from ..analysis.probes import ProbeResult


def _step(n: int, most: int = 12) -> int:
    """Label every k-th layer so that at most ``most`` tick labels share an axis."""
    return max(1, -(-n // most))


@boundary
def plot_probe(result: ProbeResult, title: str | None = None) -> Figure:
    """One panel: the task score and the control score by layer (95% fold intervals as bands), the
    chance level, and the selectivity (task − control) as bars on the same axis."""
    x = np.arange(len(result.layers))
    fig = Figure(figsize=(min(max(5.0, 0.3 * len(x) + 2.5), 14.0), 3.6))
    ax = fig.add_subplot()
    mean, ci = result.mean.numpy(), result.ci.numpy()
    ax.plot(x, mean, "o-", color="C0", label=f"{result.task or 'task'} {result.metric}")
    ax.fill_between(x, mean - ci, mean + ci, color="C0", alpha=0.2)
    control_mean, control_ci, selectivity = result.control_mean, result.control_ci, result.selectivity
    if control_mean is not None and control_ci is not None and selectivity is not None:  # with a control task
        cm = control_mean.numpy()
        cc = control_ci.numpy()
        ax.plot(x, cm, "s--", color="C1", label=f"control ({result.control})")
        ax.fill_between(x, cm - cc, cm + cc, color="C1", alpha=0.2)
        ax.bar(x, selectivity.numpy(), width=0.5, color="C2", alpha=0.35, label="selectivity")
    ax.axhline(result.chance, color="grey", lw=0.8, ls=":", label=f"chance {result.chance:.2f}")
    ax.set_xticks(x[:: _step(len(x))], list(result.layers)[:: _step(len(x))])
    ax.set_xlabel(f"layer ({result.hook} at {result.position})")
    ax.set_ylabel(result.metric)
    ax.set_ylim(min(0.0, float(np.nanmin(mean - ci)) - 0.05), 1.02)
    ax.set_title(
        title
        or f"linear probe: {result.task or 'task'} ({result.n_prompts} prompts, "
        f"{result.n_groups} groups, {result.n_folds} folds)",
        fontsize=9,
    )
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    return finish(fig)


@boundary
def plot_probe_summary(
    layers: Sequence[str],
    selectivity: dict[str, Sequence[float]],
    trace: dict[str, Sequence[float]] | None = None,
    trace_layers: Sequence[str] | None = None,
    title: str = "",
) -> Figure:
    """Selectivity by layer for several tasks (lines), beside causal-trace indirect effects by
    layer (``trace``: name → values over ``trace_layers``) when given. ``layers``: the probed layers
    (x axis); ``selectivity``: ``{task: one value per layer}``; ``title`` above the panels."""
    n = 2 if trace else 1
    fig = Figure(figsize=(5.2 * n, 3.6))
    ax = fig.add_subplot(1, n, 1)
    x = np.arange(len(layers))
    for i, (name, vals) in enumerate(selectivity.items()):
        ax.plot(x, vals, "o-", color=f"C{i}", label=name)
    ax.set_xticks(x[:: _step(len(x))], list(layers)[:: _step(len(x))])
    ax.set_xlabel("layer")
    ax.set_ylabel("selectivity (task − control)")
    ax.set_title("where each attribute is linearly decodable", fontsize=9)
    ax.axhline(0, color="grey", lw=0.8)
    style_line_axes([ax], 7)
    if trace:
        ax2 = fig.add_subplot(1, n, 2)
        xt = np.arange(len(trace_layers or next(iter(trace.values()))))
        for i, (name, vals) in enumerate(trace.items()):
            ax2.plot(xt, vals, "o-", color=f"C{i + 5}", label=name)
        names = list(trace_layers or [str(i) for i in xt])
        ax2.set_xticks(xt[:: _step(len(xt))], names[:: _step(len(xt))])
        ax2.set_xlabel("layer (centre of the restored window)")
        ax2.set_ylabel("average indirect effect")
        ax2.set_title("averaged causal trace (indirect effects)", fontsize=9)
        style_line_axes([ax2], 7)
    return finish(fig, title)
