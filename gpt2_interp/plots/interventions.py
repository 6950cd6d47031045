"""Figures for interventions on attribution graphs: what the graph predicts a change of features does to the
logits, beside what the frozen replacement model and the real model measure
(:class:`~gpt2_interp.graphs.interventions.InterventionResult`), and the two-hop check of a prompt's graph
(:class:`~gpt2_interp.graphs.interventions.TwoHopCheck`).

Figures are built as ``matplotlib.figure.Figure`` objects (no pyplot state, any backend).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ..core.boundary import boundary
from .figure import finish

if TYPE_CHECKING:
    from ..graphs.interventions import InterventionResult, TwoHopCheck

#: The measures of a tracked token's logit change, in the order drawn: field of the result, legend label, colour.
#: The graph's (blues), the frozen replacement model's (greens), the real model's (red).
MEASURES = (
    ("graph_direct", "graph, direct", "#9ecae1"),
    ("graph_total", "graph, direct + indirect", "#2171b5"),
    ("graph_pruned", "pruned graph, direct + indirect", "#08306b"),
    ("frozen_held", "frozen model, features held", "#a1d99b"),
    ("frozen_free", "frozen model, features free", "#238b45"),
    ("real", "real model", "#d62728"),
)
#: The most feature rows a figure lists before it names how many more there are.
MAX_ROWS = 20


def _arr(x) -> np.ndarray:
    """A tensor as a float64 numpy array (NaN kept)."""
    return x.detach().double().cpu().numpy()


def intervention_label(result: InterventionResult, max_features: int = 3) -> str:
    """The features an intervention changed, ``L1 p3 F12 0.532 → 0.000`` each (the first ``max_features``, then
    how many more)."""
    items = [
        f"L{L} p{p} F{f} {float(o):.3f} → {float(n):.3f}"
        for (L, p, f), o, n in zip(result.features.tolist(), result.old, result.new)
    ]
    more = len(items) - max_features
    return ", ".join(items[:max_features]) + (f" and {more} more" if more > 0 else "")


def logit_change_bars(ax: Axes, result: InterventionResult, legend_columns: int = 2) -> None:
    """Grouped bars on ``ax``: per tracked token, its de-meaned logit's change in each of :data:`MEASURES` (the
    pruned graph's only when the result holds it; a token that is no logit node of the graph has no graph bars,
    and its label says so). Each measure is one ``BarContainer`` labelled as in the legend."""
    measures = [m for m in MEASURES if getattr(result, m[0]) is not None]
    n, w = len(result.token_strs), 0.84 / len(measures)
    x = np.arange(n)
    for j, (name, label, colour) in enumerate(measures):
        ax.bar(x + (j - (len(measures) - 1) / 2) * w, _arr(getattr(result, name)), w, label=label, color=colour)
    ax.axhline(0, color="k", lw=0.6)
    absent = np.isnan(_arr(result.graph_total))
    ticks = [repr(t) + ("\n(no logit node)" if a else "") for t, a in zip(result.token_strs, absent)]
    ax.set_xticks(x, ticks, fontsize=8)
    ax.set_ylabel("change of the de-meaned logit")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=legend_columns)


def prediction_scatter(ax: Axes, result: InterventionResult) -> None:
    """The graph's direct-and-indirect prediction (x) against the measured change (y): the tracked logits in the
    real model and in the frozen model with features free (tokens that are logit nodes of the graph), and every
    feature node's pre-activation in the frozen model with features free (small grey points); the line y = x."""
    pred = _arr(result.graph_total)
    node = ~np.isnan(pred)
    series = [
        (_arr(result.node_total), _arr(result.node_free), "feature nodes, frozen model (free)", "#969696", 10),
        (pred[node], _arr(result.frozen_free)[node], "logits, frozen model (free)", "#238b45", 36),
        (pred[node], _arr(result.real)[node], "logits, real model", "#d62728", 36),
    ]
    drawn = [s for s in series if len(s[0])]
    for xs, ys, label, colour, size in drawn:
        ax.scatter(xs, ys, s=size, color=colour, label=label, zorder=3)
    if drawn:
        lo = min(min(float(xs.min()), float(ys.min())) for xs, ys, *_ in drawn)
        hi = max(max(float(xs.max()), float(ys.max())) for xs, ys, *_ in drawn)
        pad = 0.05 * (hi - lo) or 1.0
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], ls="--", lw=0.8, color="grey", label="y = x")
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "the graph predicts none\nof the tracked tokens", ha="center", va="center", fontsize=8)
    ax.set_xlabel("graph's prediction (direct + indirect)")
    ax.set_ylabel("measured change")
    ax.set_title("graph vs measured", fontsize=9)
    ax.grid(alpha=0.3)


def _top_tokens(ax: Axes, top: list[tuple[str, float]], tracked: set[str], title: str) -> None:
    """The real model's most probable tokens as horizontal bars, the most probable on top; tracked tokens red."""
    labels = [repr(t) for t, _ in top][::-1]
    ax.barh(labels, [p for _, p in top][::-1], color=["#d62728" if t in tracked else "#6baed6" for t, _ in top][::-1])
    ax.set_xlim(0, max([*(p for _, p in top), 1e-12]) * 1.15)
    ax.set_xlabel("probability")
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)


@boundary
def plot_intervention(result: InterventionResult, title: str | None = None) -> Figure:
    """Three views of an :class:`~gpt2_interp.graphs.interventions.InterventionResult` ``result``: above, per
    tracked token, its de-meaned logit's change as the graph predicts it (direct; direct and indirect; through
    a pruned graph's kept edges where measured) and as the frozen replacement model (downstream features held,
    free) and the real model measure it (:func:`logit_change_bars`); below, the graph's prediction against the
    measured changes with the line y = x (:func:`prediction_scatter`), and the real model's top tokens before and
    after (tracked tokens in red). ``title`` replaces the default (the features changed)."""
    fig = Figure(figsize=(max(9.0, 2.2 + 1.1 * len(result.token_strs)), 7.2))
    axes = fig.subplot_mosaic([["bars", "bars", "bars"], ["scatter", "before", "after"]], height_ratios=[1.1, 1])
    logit_change_bars(axes["bars"], result)
    axes["bars"].set_title(
        f"tracked logits (frozen model held vs graph's edges: largest difference {result.direct_error:.1e} "
        "of the largest change)",
        fontsize=9,
    )
    prediction_scatter(axes["scatter"], result)
    tracked = set(result.token_strs)
    _top_tokens(axes["before"], result.top_before, tracked, "real model, top tokens before")
    _top_tokens(axes["after"], result.top_after, tracked, "real model, top tokens after")
    return finish(fig, title or f"intervention: {intervention_label(result)}", fontsize=10)


@boundary
def plot_two_hop_check(check: TwoHopCheck, title: str | None = None) -> Figure:
    """A :class:`~gpt2_interp.graphs.interventions.TwoHopCheck` ``check``: the model's probability of the answer
    after the two-hop prompt (and, where bridge features were found, after they were set to zero), of the bridge
    after the first hop's own prompt and of the answer after the second's; what suppressing the bridge features
    does to the answer's and the bridge's logits (:func:`logit_change_bars`); and the bridge features'
    activations (the largest :data:`MAX_ROWS`, each named with the bridge's rank among its promoted tokens).
    Without bridge features only the probabilities are drawn. ``title`` replaces the default (the prompt)."""
    sup = check.suppressed
    n_feat = min(len(check.bridge_features), MAX_ROWS)
    fig = Figure(figsize=(13.5 if sup is not None else 5.5, max(3.8, 1.6 + 0.24 * n_feat)))
    axes = fig.subplots(1, 3, width_ratios=[1, 1.15, 1]) if sup is not None else [fig.subplots()]
    rows = [(f"p({check.answer!r}), two-hop prompt", check.answer_prob, "#2171b5")]
    if sup is not None:
        rows.append((f"p({check.answer!r}), bridge features at 0", float(sup.prob_after[0]), "#d62728"))
    rows += [
        (f"p({check.bridge!r}), first hop alone", check.first_hop_prob, "#969696"),
        (f"p({check.answer!r}), second hop alone", check.second_hop_prob, "#969696"),
    ]
    labels, probs, colours = (list(c)[::-1] for c in zip(*rows))  # the first row on top
    ax = axes[0]
    bars = ax.barh(labels, probs, color=colours)
    ax.bar_label(bars, fmt="%.3g", fontsize=7, padding=2)
    ax.set_xlim(0, max([*probs, 1e-12]) * 1.3)
    ax.set_xlabel("probability")
    ax.set_title(f"answer rank {check.answer_rank} after the two-hop prompt", fontsize=9)
    ax.tick_params(labelsize=7)
    if sup is not None:
        logit_change_bars(axes[1], sup, legend_columns=1)
        axes[1].set_title("bridge features set to 0", fontsize=9)
        ax = axes[2]
        order = np.argsort(-_arr(check.bridge_activations), kind="stable")[:MAX_ROWS]
        names = [
            f"L{L} p{p} F{f} (rank {int(check.bridge_ranks[i])})"
            for i in order.tolist()
            for L, p, f in [check.bridge_features[i].tolist()]
        ]
        ax.barh(names[::-1], _arr(check.bridge_activations)[order][::-1], color="#2171b5")
        ax.set_xlabel("activation")
        more = len(check.bridge_features) - n_feat
        ax.set_title(
            f"{len(check.bridge_features)} bridge features" + (f" (the {n_feat} largest shown)" if more else ""),
            fontsize=9,
        )
        ax.tick_params(labelsize=7)
    head = f"{check.prompt!r} → {check.answer!r} via {check.bridge!r}"
    if sup is None:
        head += ": no bridge features in the graph"
    return finish(fig, title or head, fontsize=10)
