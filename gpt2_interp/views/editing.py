"""Views of fact editing: the top-k next tokens before and after an edit on the rewrite prompt, its
paraphrases and neighbours; CounterFact scores of an evaluation; linear-probe curves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..core.boundary import boundary
from ..core.result import ResultLike
from .heatmap import array, as_dict, token_label
from .page import Part, View, figure_part, text_part

SCORE_NAMES = {"es": "ES", "ps": "PS", "ns": "NS", "S": "S", "em": "EM", "pm": "PM", "nm": "NM"}


@boundary
def view_topk(result: ResultLike, roles: Sequence[str] | None = None, scores: Mapping[str, Any] | None = None) -> View:
    """``result``, a :class:`~gpt2_interp.editing.compare.TopKComparison` (or its dict): for every prompt, the top-k
    next tokens and their probabilities before (left) and after (right) the edit, the target's first token
    in red; hover gives the exact probability. ``roles``: one word per prompt (``"rewrite"``,
    ``"paraphrase"``, ``"neighbour"``, …) shown beside it; ``scores``: the edit's scores (e.g. ``{"ES": 1.0,
    "PS": 0.5, "NS": 1.0}`` or the demo's edit record), written above the bars."""
    from plotly.subplots import make_subplots

    d = as_dict(result)
    prompts = list(d["prompts"])
    n = len(prompts)
    if roles is not None and len(roles) != n:
        raise ValueError(f"roles has {len(roles)} entries for {n} prompts; give one role per prompt")
    titles = _topk_titles(d, prompts, roles)
    fig = make_subplots(
        n, 2, subplot_titles=titles, horizontal_spacing=0.18, vertical_spacing=min(0.35 / max(n, 1), 0.12)
    )
    first = d.get("target_token") or None
    for i in range(n):
        for j, side in enumerate(("before", "after")):
            fig.add_trace(_topk_bars(d[side][i], first, side), i + 1, j + 1)
            fig.update_xaxes(range=[0, 1], row=i + 1, col=j + 1)
            fig.update_yaxes(type="category", tickfont={"size": 10}, row=i + 1, col=j + 1)
    for a in fig.layout.annotations:
        a.font = {"size": 11}
    fig.update_layout(height=150 * n + 80, margin={"l": 110, "r": 20, "t": 40, "b": 30})
    parts: list[Part] = []
    if scores:
        parts.append(text_part(" · ".join(f"{k}: {_fmt(v)}" for k, v in scores.items())))
    parts.append(figure_part(fig))
    k = len(d["before"][0]) if d["before"] else 0
    return View(f"Edit → {d.get('target', '')!r}: top-{k} before and after", parts)


def _topk_titles(d: dict[str, Any], prompts: list[str], roles: Sequence[str] | None) -> list[str]:
    """The panels' titles, before and after per prompt: its role, the prompt, the side and the target's
    probability where the result holds it."""
    pb, pa = d.get("p_target_before") or [], d.get("p_target_after") or []
    titles = []
    for i, p in enumerate(prompts):
        role = f"[{roles[i]}] " if roles else ""
        for side, pt in (("before", pb), ("after", pa)):
            extra = f" · P(target) = {pt[i]:.3g}" if i < len(pt) else ""
            titles.append(f"{role}{token_label(p)} — {side}{extra}")
    return titles


def _topk_bars(rows: Sequence[tuple[str, Any]], first: str | None, side: str) -> Any:
    """The top-k tokens ``rows`` (token, probability) of one prompt on one ``side`` as horizontal bars, the most
    probable at the top, the target's first token ``first`` in red."""
    import plotly.graph_objects as go

    toks = [token_label(t) for t, _ in rows][::-1]
    return go.Bar(
        y=[f"{t} " for t in toks],
        x=[float(p) for _, p in rows][::-1],
        orientation="h",
        marker_color=["#d62728" if t == first else "#1f77b4" for t, _ in rows][::-1],
        showlegend=False,
        hovertemplate=f"{side}: %{{y}} p = %{{x:.4f}}<extra></extra>",
    )


def _fmt(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


@boundary
def view_edit_evaluation(result: ResultLike) -> View:
    """An :class:`~gpt2_interp.editing.evaluation.EditEvaluation` (or its dict): CounterFact scores
    (ES/PS/NS/S) and magnitudes before and after editing, over all cases and the known subset (hover: the
    exact value and the number of cases); with a sequential curve, the scores against the edits applied."""
    d = as_dict(result)
    summary = d["summary"]
    score, mag = _summary_figures(summary)
    parts = [figure_part(score), figure_part(mag)]
    if d.get("curve"):
        parts.append(figure_part(_curve_figure(d["curve"])))
    layer = d.get("layer")
    how = "sequential" if d.get("sequential") else "one at a time" if d["method"] == "rome" else "one batch"
    a = summary.get("all", {})
    note = text_part(
        f"{str(d['method']).upper()} at layer {layer}, {a.get('n', '?')} requests ({how}); weights restored "
        f"bit-exactly: {d.get('restored_exactly')}; KL drift on unrelated prompts {_fmt(a.get('kl_drift'))}."
    )
    return View(f"Edit evaluation: {str(d['method']).upper()}", [note, *parts])


def _percent(scores: Mapping[str, Any], keys: Sequence[str]) -> list[float | None]:
    """``scores[key]`` in percent per key (None where missing or None)."""
    return [None if scores.get(k) is None else 100 * float(scores[k]) for k in keys]


def _summary_figures(summary: Mapping[str, Any]) -> tuple[Any, Any]:
    """The CounterFact scores and the magnitudes of an evaluation's ``summary``: a bar group per subset (all
    cases, the known ones) and stage (before, after editing)."""
    import plotly.graph_objects as go

    score = go.Figure()
    mag = go.Figure()
    for subset in (k for k in ("all", "known") if k in summary):
        s = summary[subset]
        for stage in ("pre", "post"):
            name = f"{subset} {stage} (n={s['n']})"
            for fig, keys in ((score, ("es", "ps", "ns", "S")), (mag, ("em", "pm", "nm"))):
                fig.add_trace(
                    go.Bar(
                        x=[SCORE_NAMES[k] for k in keys],
                        y=_percent(s[stage], keys),
                        name=name,
                        hovertemplate=f"{name}<br>%{{x}} = %{{y:.2f}}<extra></extra>",
                    )
                )
    score.update_layout(
        barmode="group", height=380, yaxis={"title": "score (%)", "range": [0, 105]}, title="CounterFact scores"
    )
    mag.update_layout(barmode="group", height=380, yaxis={"title": "percentage points"}, title="magnitudes")
    return score, mag


def _curve_figure(curve: Sequence[Mapping[str, Any]]) -> Any:
    """A sequential evaluation's scores against the number of edits applied."""
    import plotly.graph_objects as go

    fig = go.Figure()
    ks = [c["n_edits"] for c in curve]
    for key in ("es", "ps", "ns", "S"):
        y = [_percent(c, (key,))[0] for c in curve]
        fig.add_trace(go.Scatter(x=ks, y=y, mode="lines+markers", name=SCORE_NAMES[key]))
    fig.update_layout(
        height=360, xaxis={"type": "log", "title": "edits applied (sequential)"}, yaxis={"title": "score (%)"}
    )
    return fig


@boundary
def view_probe(result: ResultLike) -> View:
    """A :class:`~gpt2_interp.analysis.ProbeResult` (or its dict): the probe's score by layer (mean over
    folds, every fold's score on hover), the control task's, and the chance level."""
    import plotly.graph_objects as go

    d = as_dict(result)
    layers = list(d["layers"])
    s = array(d["scores"])
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=layers,
            y=s.mean(1),
            mode="lines+markers",
            name=f"{d.get('task') or 'task'} {d['metric']}",
            customdata=[", ".join(f"{v:.3f}" for v in row) for row in s],
            hovertemplate="%{x}: %{y:.4f}<br>folds: %{customdata}<extra></extra>",
        )
    )
    if d.get("control_scores") is not None:
        c = array(d["control_scores"])
        fig.add_trace(go.Scatter(x=layers, y=c.mean(1), mode="lines+markers", name=f"control ({d.get('control')})"))
        fig.add_trace(go.Bar(x=layers, y=s.mean(1) - c.mean(1), name="selectivity", opacity=0.4))
    fig.add_hline(y=float(d["chance"]), line_dash="dot", annotation_text=f"chance {float(d['chance']):.2f}")
    fig.update_layout(
        height=380,
        xaxis={"type": "category", "title": f"layer ({d['hook']} at {d['position']})"},
        yaxis={"title": d["metric"], "range": [min(0.0, float(np.nanmin(s)) - 0.05), 1.02]},
    )
    note = text_part(
        f"{d['n_prompts']} prompts, {d['n_groups']} groups, {d['n_folds']} folds; "
        f"classes: {', '.join(map(str, d['classes'][:12]))}."
    )
    return View(f"Linear probe: {d.get('task') or 'task'}", [note, figure_part(fig)])
