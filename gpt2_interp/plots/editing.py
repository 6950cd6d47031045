"""Figures for fact editing: CounterFact scores, sequential decay, before/after top-k.

Figures are built as ``matplotlib.figure.Figure`` objects (no pyplot state, any backend).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from matplotlib.figure import Figure

from ..core.boundary import boundary
from .layout import finish_layout

if TYPE_CHECKING:
    from ..editing.compare import TopKComparison
    from ..editing.evaluate import EditEvaluation


def _val(x: Any) -> float:
    return float("nan") if x is None else 100 * float(x)


@boundary
def plot_edit_evaluation(ev: EditEvaluation, title: str | None = None) -> Figure:
    """Scores (ES/PS/NS/S) and magnitudes before/after editing, over all cases and the known
    subset; with a sequential curve, a third panel of scores against the number of edits."""
    n_panels = 3 if ev.curve else 2
    fig = Figure(figsize=(5.2 * n_panels, 4.6))
    axes = fig.subplots(1, n_panels)
    groups = [(s, st) for s in ("all", "known") for st in ("pre", "post")]
    colours = {"all pre": "#bbbbbb", "all post": "#1f77b4", "known pre": "#e0c9a6", "known post": "#ff7f0e"}
    for ax, keys, label in (
        (axes[0], ("es", "ps", "ns", "S"), "score (%)"),
        (axes[1], ("em", "pm", "nm"), "magnitude (percentage points)"),
    ):
        x = np.arange(len(keys))
        w = 0.8 / len(groups)
        for j, (subset, stage) in enumerate(groups):
            vals = [_val(getattr(getattr(ev.summary[subset], stage), k)) for k in keys]
            name = f"{subset} {stage}"
            bars = ax.bar(x + (j - 1.5) * w, vals, w, label=f"{name} (n={ev.summary[subset].n})", color=colours[name])
            if stage == "post":  # the numbers people look for
                ax.bar_label(bars, fmt="%.1f", fontsize=6, padding=1)
        ax.set_xticks(x, [k.upper() if k != "S" else "S" for k in keys])
        ax.set_ylabel(label)
        ax.axhline(0, color="k", lw=0.6)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylim(0, 110)
    axes[0].set_title("CounterFact scores")
    axes[1].set_title("magnitudes: P(new)−P(true), neighbourhood P(true)−P(new)")
    axes[0].legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, frameon=False)
    if ev.curve:
        ax = axes[2]
        ks = [c.n_edits for c in ev.curve]
        for key, col in (("es", "C0"), ("ps", "C1"), ("ns", "C2"), ("S", "k")):
            ax.plot(
                ks, [_val(getattr(c, key)) for c in ev.curve], "o-", color=col, label=key.upper() if key != "S" else "S"
            )
        ax.set_xscale("log")
        ax.set_xlabel("number of edits applied (sequential)")
        ax.set_ylabel("score over the edits so far (%)")
        ax.set_ylim(0, 105)
        ax.set_title("decay with accumulated edits")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    how = "sequential" if ev.sequential else ("one at a time" if ev.method == "rome" else "one batch")
    fig.suptitle(title or f"{ev.method.upper()} at layer {ev.layer}: {ev.summary['all'].n} requests ({how})")
    s = ev.summary["all"]

    def fmt(x, f):
        return format(x, f) if x is not None else "–"

    fig.text(
        0.5,
        0.005,
        f"fluency (n-gram entropy) {fmt(s.fluency_pre, '.3f')} → {fmt(s.fluency_post, '.3f')}"
        f" · KL drift on unrelated prompts {fmt(s.kl_drift, '.2e')} · neighbourhood cases "
        f"{s.n_neighbourhood} · edit time {fmt(s.edit_seconds, '.2f')} s mean, "
        f"{fmt(s.edit_seconds_median, '.2f')} s median · weights restored bit-exactly: {ev.restored_exactly}",
        ha="center",
        va="bottom",
        fontsize=7.5,
    )
    return finish_layout(fig, rect=(0, 0.04, 1, 1))


@boundary
def plot_decay(
    n_edits: Mapping[str, Sequence[int]],
    scores: Mapping[str, Mapping[str, Sequence[float | None]]],
    reference: Mapping[str, float | None] | None = None,
    title: str | None = None,
    xlabel: str = "edits applied",
    log_x: bool = False,
):
    """Scores against the number of edits applied, one panel per score, one line per method.

    ``n_edits[method]``: x values; ``scores[metric][method]``: values in [0, 1] (None: undefined);
    ``reference[metric]``: a horizontal line (e.g. the unedited model's NS). ``xlabel``/``log_x``:
    another x quantity (e.g. statistics tokens, on a log axis). ``title`` above the panels.
    Returns a :class:`matplotlib.figure.Figure`."""
    from matplotlib.figure import Figure

    metrics = list(scores)
    fig = Figure(figsize=(4.2 * len(metrics), 3.8))
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, metric in zip(axes, metrics):
        for j, (method, ys) in enumerate(scores[metric].items()):
            ax.plot(list(n_edits[method]), [_val(y) for y in ys], "o-", ms=3, color=f"C{j}", label=method)
        if reference and metric in reference:
            ax.axhline(_val(reference[metric]), color="k", ls="--", lw=0.8, label="unedited")
        ax.set_xlabel(xlabel)
        if log_x:
            ax.set_xscale("log")
        ax.set_ylabel(f"{metric} (%)")
        ax.set_ylim(0, 105)
        ax.set_title(metric)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return finish_layout(fig)


@boundary
def plot_topk_comparison(cmp: TopKComparison, title: str | None = None) -> Figure:
    """For each prompt, the top-k next-token probabilities before (left) and after (right) the edit;
    the target's first token is drawn in red."""
    first = cmp.target_token or None
    n = len(cmp.prompts)
    fig = Figure(figsize=(9, 1.0 + 1.6 * n))
    axes = fig.subplots(n, 2, squeeze=False)
    for i, prompt in enumerate(cmp.prompts):
        p_t = (
            cmp.p_target_before[i] if cmp.p_target_before else None,
            cmp.p_target_after[i] if cmp.p_target_after else None,
        )
        for j, (side, rows) in enumerate((("before", cmp.before[i]), ("after", cmp.after[i]))):
            ax = axes[i, j]
            labels = [repr(t) for t, _ in rows][::-1]
            probs = [p for _, p in rows][::-1]
            colours = ["C3" if t == first else "C0" for t, _ in rows][::-1]
            ax.barh(labels, probs, color=colours)
            ax.set_xlim(0, 1)
            shown = repr(prompt)
            extra = f"   P(target)={p_t[j]:.3g}" if p_t[j] is not None else ""
            ax.set_title(f"{side}: {shown}{extra}", fontsize=8)
            ax.tick_params(labelsize=7)
            if i == n - 1:
                ax.set_xlabel("next-token probability")
    fig.suptitle(title or f"edit → {cmp.target!r}")
    return finish_layout(fig)
