"""The interactive view of a steering curve: what adding ``scale · direction`` does to the target
behaviour, against what it costs in fluency and drift (:class:`~gpt2_interp.analysis.features.SteeringCurve`)."""

from __future__ import annotations

from ..core.boundary import boundary
from ..core.result import ResultLike
from .heatmap import array, as_dict
from .page import View, figure_part, text_part


@boundary
def view_steering(result: ResultLike, max_loss_change: float = 0.05) -> View:
    """A :class:`~gpt2_interp.analysis.features.SteeringCurve` (or its dict) as three panels over the
    scale: P(target) with its standard error, the relative loss change on unrelated text, and the KL
    drift; hover: the scale and each value. A dotted line marks ``max_loss_change`` (the fluency budget)
    and the note names the steered scale with the highest P(target) below it (as ``SteeringCurve.best``)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    d = as_dict(result)
    scales = [float(s) for s in array(d["scales"])]
    prob, sem = array(d["target_prob"]), array(d["target_sem"])
    change, kl = array(d["loss_change"]), array(d["kl"])
    if not (len(scales) == len(prob) == len(sem) == len(change) == len(kl)):
        raise ValueError("scales, target_prob, target_sem, loss_change and kl must have one value per scale")
    fig = make_subplots(
        rows=1, cols=3, subplot_titles=("P(target tokens)", "loss change on unrelated text", "KL drift (nats)")
    )
    common = {"x": scales, "mode": "lines+markers", "showlegend": False}
    fig.add_trace(
        go.Scatter(
            y=prob.tolist(),
            error_y={"type": "data", "array": sem.tolist(), "visible": True},
            hovertemplate="scale %{x:g}<br>P(target) %{y:.4f}<extra></extra>",
            **common,
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(y=change.tolist(), hovertemplate="scale %{x:g}<br>loss change %{y:+.1%}<extra></extra>", **common),
        row=1,
        col=2,
    )
    fig.add_hline(y=max_loss_change, line={"dash": "dot", "color": "#d62728", "width": 1}, row=1, col=2)
    fig.add_trace(
        go.Scatter(y=kl.tolist(), hovertemplate="scale %{x:g}<br>KL %{y:.4f}<extra></extra>", **common), row=1, col=3
    )
    fig.update_xaxes(title_text="scale")
    fig.update_yaxes(tickformat=".0%", row=1, col=2)
    fig.update_layout(height=360, margin={"t": 40})
    within = [i for i, c in enumerate(change) if scales[i] != 0 and c < max_loss_change]  # as SteeringCurve.best
    if within:
        i = max(within, key=lambda j: float(prob[j]))
        best = (
            f"the best scale within a {max_loss_change:.0%} loss rise is {scales[i]:g}: P(target) "
            f"{float(d['baseline_prob']):.4f} → {float(prob[i]):.4f} (loss {float(change[i]):+.1%})"
        )
    else:
        best = f"no scale stays within a {max_loss_change:.0%} loss rise"
    note = text_part(f"Steering {d.get('model_name', '?')} at {d.get('at', '?')} with {d.get('method', '?')}: {best}.")
    return View(f"Steering curve at {d.get('at', '?')}", [note, figure_part(fig)])
