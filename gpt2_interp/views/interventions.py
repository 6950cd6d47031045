"""The interactive views of interventions on attribution graphs: what setting or scaling features does to the
tracked logits as the graph predicts it, beside what the frozen replacement model and the real model measure
(:class:`~gpt2_interp.graphs.interventions.InterventionResult`), and the two-hop check of a prompt's graph
(:class:`~gpt2_interp.graphs.interventions.TwoHopCheck`).

Read from the result or its dict (``to_dict()``, a graph prediction that is no logit node as None), so a saved
result views the same as the live one; nothing here computes on a model.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..core.boundary import boundary
from ..core.result import ResultLike
from .heatmap import array, as_dict, axis_labels, token_label
from .page import Part, View, figure_part, text_part

#: The measures of a tracked token's logit change, in the order drawn: field, legend label, colour (the graph's
#: blues, the frozen replacement model's greens, the real model's red; as the figure of
#: :func:`~gpt2_interp.plots.interventions.plot_intervention`).
MEASURES = (
    ("graph_direct", "graph, direct", "#9ecae1"),
    ("graph_total", "graph, direct + indirect", "#2171b5"),
    ("graph_pruned", "pruned graph, direct + indirect", "#08306b"),
    ("frozen_held", "frozen model, features held", "#a1d99b"),
    ("frozen_free", "frozen model, features free", "#238b45"),
    ("real", "real model", "#d62728"),
)


def _values(x: Any) -> list[float | None]:
    """A field's numbers as a plain list (NaN and None as None: a gap in the drawing)."""
    return [float(v) if np.isfinite(v) else None for v in array(x).reshape(-1).tolist()]


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> Part:
    """A small HTML table (cells escaped)."""
    cells = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return Part(
        '<table class="g2v-table"><tr>' + "".join(f"<th>{html.escape(h)}</th>" for h in head) + f"</tr>{cells}</table>"
    )


def _features_text(d: Mapping[str, Any], max_features: int = 6) -> str:
    """``L1 p3 F12 0.532 → 0.000, …`` for the features an intervention changed."""
    items = [
        f"L{int(L)} p{int(p)} F{int(f)} {float(o):.3f} → {float(n):.3f}"
        for (L, p, f), o, n in zip(np.asarray(array(d["features"]), dtype=np.int64).reshape(-1, 3).tolist(),
                                   array(d["old"]).reshape(-1), array(d["new"]).reshape(-1))
    ]  # fmt: skip
    more = len(items) - max_features
    return ", ".join(items[:max_features]) + (f" and {more} more" if more > 0 else "")


@boundary
def intervention_figure(result: ResultLike) -> Any:
    """The Plotly figure of an intervention (an :class:`~gpt2_interp.graphs.interventions.InterventionResult`
    or its dict): left, per tracked token one bar per measure of its de-meaned logit's change (a trace per
    measure named as :data:`MEASURES` labels it; the pruned graph's only where the result holds it); right, the
    graph's direct-and-indirect prediction (x) against the measured change (y) for the feature nodes (frozen
    model, features free), the tracked logits (frozen model, features free; real model) and the line y = x.
    Hover: the token or node and the exact values."""
    from plotly.subplots import make_subplots

    d = as_dict(result)
    tokens = [str(t) for t in d["token_strs"]]
    labels = axis_labels(tokens)
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.6, 0.4],
        horizontal_spacing=0.1,
        subplot_titles=("change of each tracked token's de-meaned logit", "graph's prediction vs measured"),
    )
    for name, label, colour in MEASURES:
        if d.get(name) is not None:
            fig.add_trace(_measure_bars(d, name, label, colour, labels), row=1, col=1)
    seen: list[float] = []
    for label, xs, ys, names, colour, size in _prediction_series(d, labels):
        if xs:
            seen += [v for v in (*xs, *ys) if v is not None]
            fig.add_trace(_prediction_points(label, xs, ys, names, colour, size), row=1, col=2)
    if seen:
        fig.add_trace(_diagonal(seen), row=1, col=2)
    fig.update_xaxes(type="category", tickfont={"size": 9}, row=1, col=1)
    fig.update_xaxes(title_text="graph (direct + indirect)", row=1, col=2)
    fig.update_yaxes(title_text="measured", row=1, col=2)
    fig.update_layout(height=420, barmode="group", margin={"t": 40}, legend={"font": {"size": 10}})
    return fig


def _measure_bars(d: Mapping[str, Any], name: str, label: str, colour: str, labels: list[str]) -> Any:
    """The bars of measure ``name`` (legend ``label``) of each tracked token (``labels``), one per token."""
    import plotly.graph_objects as go

    values = _values(d[name])
    if len(values) != len(labels):
        raise ValueError(f"{name} has {len(values)} values for {len(labels)} tracked tokens")
    return go.Bar(
        x=labels,
        y=values,
        name=label,
        marker_color=colour,
        legendgroup="bars",
        hovertemplate=f"%{{x}}<br>{html.escape(label)}: %{{y:+.5g}}<extra></extra>",
    )


def _prediction_series(d: Mapping[str, Any], labels: list[str]) -> list[tuple[Any, ...]]:
    """``(legend label, graph's predictions, measured changes, names, colour, marker size)`` of the feature
    nodes (frozen model, features free) and of the tracked tokens that are logit nodes (frozen model, features
    free; real model)."""
    pred = _values(d["graph_total"])
    node_x, node_y = _values(d["node_total"]), _values(d["node_free"])
    at = [i for i, v in enumerate(pred) if v is not None]
    xs, names = [pred[i] for i in at], [labels[i] for i in at]
    return [
        ("feature nodes, frozen model (free)", node_x, node_y, [f"feature node {i}" for i in range(len(node_x))],
         "#969696", 5),
        ("logits, frozen model (free)", xs, [_values(d["frozen_free"])[i] for i in at], names, "#238b45", 9),
        ("logits, real model", xs, [_values(d["real"])[i] for i in at], names, "#d62728", 9),
    ]  # fmt: skip


def _prediction_points(label: str, xs: list, ys: list, names: list[str], colour: str, size: int) -> Any:
    """The points (graph's prediction, measured change) of one series; hover: the name and both values."""
    import plotly.graph_objects as go

    return go.Scatter(
        x=xs,
        y=ys,
        mode="markers",
        name=label,
        text=names,
        marker={"color": colour, "size": size},
        hovertemplate="%{text}<br>graph %{x:+.5g}<br>measured %{y:+.5g}<extra></extra>",
    )


def _diagonal(seen: list[float]) -> Any:
    """The line y = x across the values ``seen``, 5% beyond them (±1 where they are all equal)."""
    import plotly.graph_objects as go

    lo, hi = min(seen), max(seen)
    pad = 0.05 * (hi - lo) or 1.0
    line = [lo - pad, hi + pad]
    return go.Scatter(x=line, y=line, mode="lines", name="y = x", line={"dash": "dash", "color": "grey", "width": 1})


def _intervention_note(d: Mapping[str, Any]) -> str:
    """The features an intervention changed and how far the frozen model (features held) is from the graph."""
    error = d.get("direct_error")
    note = f"Features changed: {_features_text(d)}."
    if error is not None:
        note += (
            f" The frozen model with the downstream features held differs from the graph's edges by at most "
            f"{float(error):.1e} of the largest change."
        )
    return note + " Logit changes are those of the de-meaned last-position logits; NaN where a token is no logit node."


def _tracked_rows(d: Mapping[str, Any]) -> list[list[str]]:
    """Per tracked token: the token, its probability before and after (``—`` where missing)."""
    before, after = _values(d["prob_before"]), _values(d["prob_after"])
    return [
        [repr(str(t)), f"{b:.4f}" if b is not None else "—", f"{a:.4f}" if a is not None else "—"]
        for t, b, a in zip(d["token_strs"], before, after)
    ]


def _top_rows(d: Mapping[str, Any]) -> list[list[str]]:
    """The most probable tokens before and after side by side: token, p, token, p (blank past a shorter list)."""
    tops = [(str(t), float(p)) for t, p in d["top_before"]], [(str(t), float(p)) for t, p in d["top_after"]]
    n = max(len(tops[0]), len(tops[1]))
    return [
        [cell for side in tops for cell in ([repr(side[i][0]), f"{side[i][1]:.4f}"] if i < len(side) else ["", ""])]
        for i in range(n)
    ]


def _intervention_parts(d: Mapping[str, Any]) -> list[Part]:
    """The note, the figure and the probability tables of an intervention's dict."""
    return [
        text_part(_intervention_note(d)),
        figure_part(intervention_figure(d)),
        text_part("The tracked tokens' probabilities in the real model:"),
        _table(["token", "p before", "p after"], _tracked_rows(d)),
        text_part("The real model's most probable tokens before and after:"),
        _table(["before", "p", "after", "p"], _top_rows(d)),
    ]


@boundary
def view_intervention(result: ResultLike) -> View:
    """The page of an intervention: an :class:`~gpt2_interp.graphs.interventions.InterventionResult` or its
    dict. The features changed and how far the frozen model (features held) is from the graph's edges, the
    figure of :func:`intervention_figure`, the tracked tokens' probabilities in the real model before and
    after, and its most probable tokens before and after."""
    d = as_dict(result)
    return View(f"Intervention: {_features_text(d, 3)}", _intervention_parts(d))


def _two_hop_figure(d: Mapping[str, Any]) -> Any:
    """The probabilities of a two-hop check's dict (answer, answer with the bridge features at 0, each hop
    alone) beside the bridge features' activations."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    answer, bridge, sup = str(d["answer"]), str(d["bridge"]), d.get("suppressed")
    rows = [(f"p({token_label(answer)}), two-hop prompt", float(d["answer_prob"]), "#2171b5")]
    if sup is not None:
        rows.append((f"p({token_label(answer)}), bridge features at 0", float(array(sup["prob_after"])[0]), "#d62728"))
    rows += [
        (f"p({token_label(bridge)}), first hop alone", float(d["first_hop_prob"]), "#969696"),
        (f"p({token_label(answer)}), second hop alone", float(d["second_hop_prob"]), "#969696"),
    ]
    feats = np.asarray(array(d["bridge_features"]), dtype=np.int64).reshape(-1, 3).tolist()
    acts, ranks = _values(d["bridge_activations"]), [int(r) for r in array(d["bridge_ranks"]).reshape(-1)]
    fig = make_subplots(
        rows=1, cols=2, horizontal_spacing=0.25, subplot_titles=("probabilities", f"{len(feats)} bridge features")
    )
    fig.add_trace(
        go.Bar(
            x=[p for _, p, _ in rows],
            y=[n for n, _, _ in rows],
            orientation="h",
            marker_color=[c for _, _, c in rows],
            showlegend=False,
            hovertemplate="%{y}: %{x:.5g}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Bar(
            x=acts,
            y=[f"L{L} p{p} F{f}" for L, p, f in feats],
            orientation="h",
            marker_color="#2171b5",
            customdata=ranks,
            showlegend=False,
            hovertemplate="%{y}<br>activation %{x:.5g}<br>bridge rank %{customdata}<extra></extra>",
        ),
        row=1,
        col=2,
    )
    fig.update_yaxes(type="category", autorange="reversed", tickfont={"size": 9})
    fig.update_layout(height=max(260, 20 * max(len(feats), len(rows)) + 100), margin={"t": 40})
    return fig


@boundary
def view_two_hop_check(result: ResultLike) -> View:
    """The page of a two-hop check: a :class:`~gpt2_interp.graphs.interventions.TwoHopCheck` or its dict. The
    prompt, its answer's probability and rank and each hop's own probability, the bridge features (activation,
    the bridge's rank among each one's promoted tokens; hover) and, where there are any, the page of setting
    them to zero (:func:`view_intervention`)."""
    d = as_dict(result)
    answer, bridge = str(d["answer"]), str(d["bridge"])
    note = (
        f"{d['prompt']!r} → {answer!r} (bridge {bridge!r}): p {float(d['answer_prob']):.4f}, rank "
        f"{int(d['answer_rank'])}; first hop alone p({bridge!r}) {float(d['first_hop_prob']):.4f}, second hop "
        f"alone p({answer!r}) {float(d['second_hop_prob']):.4f}."
    )
    parts = [text_part(note), figure_part(_two_hop_figure(d))]
    sup = d.get("suppressed")
    if sup is None:
        parts.append(text_part(f"No feature of the graph promotes {bridge!r}: nothing to suppress."))
    else:
        parts.append(text_part("Bridge features set to 0", "h3", "g2v-title"))
        parts += _intervention_parts(as_dict(sup))
    return View(f"Two-hop check: {d['prompt']!r} → {answer!r}", parts)
