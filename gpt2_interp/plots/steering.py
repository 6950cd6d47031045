"""Figures for steering: the target behaviour's probability against what it costs, by scale."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from matplotlib.figure import Figure

from ..core.boundary import boundary
from .figure import finish

if TYPE_CHECKING:
    from ..analysis.features.steering import SteeringCurve


@boundary
def plot_steering_curve(result: SteeringCurve, title: str | None = None, max_loss_change: float = 0.05) -> Figure:
    """Two panels of a :class:`~gpt2_interp.analysis.features.SteeringCurve` ``result`` against the scale:
    the change of P(target) from the unsteered model's (± the paired standard error over prompts, the
    standard error of the per-prompt differences; zero dotted, so a scale that lowers the target shows
    below it); and the fluency cost (relative loss change on unrelated text, the ``max_loss_change`` budget
    dashed) with the KL drift on a second axis. ``title`` replaces the default title (model, hook, method)."""
    x = result.scales.numpy()
    fig = Figure(figsize=(9.0, 3.4))
    ax1, ax2 = fig.subplots(1, 2)
    d, e = result.prob_shift.numpy(), result.shift_sem.numpy()
    ax1.plot(x, d, "o-", color="C0", label="P(target) − unsteered")
    ax1.fill_between(x, d - e, d + e, color="C0", alpha=0.2, label="± paired s.e.")
    ax1.axhline(0, color="grey", lw=0.8, ls=":", label=f"no change (unsteered P = {result.baseline_prob:.4f})")
    ax1.set_xlabel("scale")
    ax1.set_ylabel("change of P(target tokens)")
    ax1.set_title(f"target behaviour ({result.n_prompts} held-out prompts)", fontsize=9)
    ax1.legend(fontsize=7)
    ax1.grid(alpha=0.3)
    change = 100 * result.loss_change.numpy()
    ax2.plot(x, change, "s-", color="C1", label="loss change on unrelated text (%)")
    ax2.axhline(100 * max_loss_change, color="C1", lw=0.8, ls="--", label=f"{100 * max_loss_change:g}% budget")
    ax2.set_xlabel("scale")
    ax2.set_ylabel("loss change (%)")
    kl_ax = ax2.twinx()
    kl_ax.plot(x, result.kl.numpy(), "^--", color="C2", label="KL drift (nats)")
    kl_ax.set_ylabel("KL(unsteered ‖ steered)")
    lines = ax2.get_lines() + kl_ax.get_lines()
    ax2.legend(lines, [str(ln.get_label()) for ln in lines], fontsize=7, loc="upper left")
    ax2.set_title(f"cost ({result.n_unrelated} unrelated texts, {result.n_tokens} tokens)", fontsize=9)
    ax2.grid(alpha=0.3)
    if np.all(np.isfinite(change)):
        ax2.set_ylim(min(-1.0, float(change.min()) - 1), max(10.0, float(change.max()) + 1))
    return finish(fig, title or f"{result.model_name}: steering at {result.at} ({result.method})", fontsize=9)
