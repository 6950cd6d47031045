"""Views of attribution estimates against exact patching: the two maps side by side with the verified
cells marked, and scatters of estimate against exact effect (agreements and verifications)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.boundary import boundary
from ..core.result import ResultLike
from .causal import patch_figure
from .heatmap import array, as_dict
from .page import View, figure_part, text_part


@boundary
def view_attribution(
    estimate: ResultLike, exact: ResultLike | None = None, verification: ResultLike | None = None
) -> View:
    """An attribution estimate (:class:`~gpt2_interp.analysis.AttributionResult` or its dict) beside the
    exact patching sweep of the same cells (``exact``, a :class:`~gpt2_interp.analysis.PatchResult`, if
    given), each on its own colour scale; the cells a :class:`~gpt2_interp.analysis.Verification` patched
    exactly (``verification``) are outlined on both maps, and its scatter follows."""
    e = as_dict(estimate)
    v = as_dict(verification) if verification is not None else {"cells": [], "kind": []}
    marks = [tuple(int(i) for i in c) for c in v["cells"]]
    kinds = list(v.get("kind", []))
    method = e.get("method", "estimate")
    parts = [figure_part(patch_figure(e, f"{method} estimate of {e['hook']}", marks, kinds))]
    if exact is not None:
        x = as_dict(exact)
        if np.shape(array(x["values"])) != np.shape(array(e["values"])):
            raise ValueError(
                f"estimate and exact cover different cells: values of shape {np.shape(array(e['values']))} and "
                f"{np.shape(array(x['values']))}; patch the same hook, layers and positions"
            )
        parts.append(figure_part(patch_figure(x, f"exact patching of {x['hook']}", marks, kinds)))
    for p in parts:
        p.body = p.body.replace('class="g2v-fig"', 'class="g2v-fig" style="display:inline-block;width:49%"')
    if verification is not None:
        parts.append(view_verification(verification).parts[-1])
    note = text_part(
        f"{method} estimate{' and exact patching' if exact is not None else ''} of {e['hook']} "
        f"({e['direction']}, metric {e['metric']})"
        + (
            "; outlined: the cells verified by exact patching (black: the estimate's top cells, grey: random controls)."
            if marks
            else "."
        )
    )
    return View(f"Attribution: {method} vs exact patching, {e['hook']}", [note, *parts])


def _scatter(estimate: np.ndarray, exact: np.ndarray, labels: list[str], groups: list[str] | None) -> Any:
    import plotly.graph_objects as go

    lim = float(max(np.abs(estimate).max(initial=0), np.abs(exact).max(initial=0))) * 1.08 or 1.0
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[-lim, lim], y=[-lim, lim], mode="lines", line={"dash": "dash", "color": "#999"}, name="estimate = exact"
        )
    )
    for g, colour in (("top", "#d62728"), ("control", "#7f7f7f"), (None, "#1f77b4")):
        idx = [i for i in range(len(exact)) if (groups[i] if groups else None) == g]
        if not idx:
            continue
        name = {"top": "estimate's top cells", "control": "random controls", None: "cells"}[g]
        fig.add_trace(
            go.Scatter(
                x=exact[idx],
                y=estimate[idx],
                mode="markers",
                marker={"color": colour, "size": 7, "opacity": 0.8},
                name=name,
                customdata=[labels[i] for i in idx],
                hovertemplate="%{customdata}<br>exact %{x:.5g}<br>estimate %{y:.5g}<extra></extra>",
            )
        )
    fig.update_layout(
        height=460,
        width=520,
        xaxis={"range": [-lim, lim], "title": "exact patching effect"},
        yaxis={"range": [-lim, lim], "title": "estimated effect"},
        margin={"t": 30},
    )
    return fig


@boundary
def view_verification(result: ResultLike) -> View:
    """A :class:`~gpt2_interp.analysis.Verification` (or its dict): every verified cell's estimated effect
    against its exact one, the estimate's top cells in red, random controls in grey; hover names the cell."""
    d = as_dict(result)
    fig = _scatter(array(d["estimate"]), array(d["exact"]), list(d["labels"]), list(d["kind"]))
    note = text_part(
        f"{d['method']} on {d['hook']}: Spearman ρ = {float(d['spearman']):.3f} over the verified cells, "
        f"recall@{d['k']} = {float(d['recall']):.2f}, {d['controls_above']} controls above the k-th verified cell."
    )
    return View(f"Verification of {d['method']} by exact patching, {d['hook']}", [note, figure_part(fig)])


@boundary
def view_agreement(result: ResultLike) -> View:
    """An :class:`~gpt2_interp.analysis.Agreement` (or its dict): a scatter of every cell's estimated
    effect against its exact patching effect, with the diagonal estimate = exact."""
    d = as_dict(result)
    est, ex = array(d["estimate"]).ravel(), array(d["exact"]).ravel()
    fig = _scatter(est, ex, [f"cell {i}" for i in range(len(ex))], None)
    note = text_part(
        f"{d['method']} vs exact patching of {d['hook']} over {d['n_cells']} cells: Spearman ρ = "
        f"{float(d['spearman']):.3f} (|effect| ρ = {float(d['spearman_abs']):.3f}), "
        f"recall@{d['k']} = {float(d['recall']):.2f}."
    )
    return View(f"Agreement of {d['method']} with exact patching, {d['hook']}", [note, figure_part(fig)])
