"""The dashboard of one sparse-autoencoder latent (as Neuronpedia's feature pages, kept simple): its top
contexts with every token coloured by the latent's activation there, its logit effect (the tokens it
promotes and suppresses most) and the histogram of its non-zero activations with its density.

Read from a :class:`~gpt2_interp.analysis.features.FeatureView` or its dict (``contexts``, ``promoted``,
``suppressed``, ``histogram``, ``density``), so a saved JSON views the same as the live result.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..core.boundary import boundary
from ..core.result import ResultLike
from .heatmap import as_dict, token_label
from .page import Part, View, figure_part, text_part

#: The colour of a token's activation (its alpha: the activation over the largest one shown).
ACTIVATION_RGB = "214,39,40"


def context_part(contexts: list[Mapping[str, Any]]) -> Part:
    """The top contexts, one line each: its largest activation, then its tokens on a background whose
    opacity is the token's activation over the largest activation of all contexts (the exact value in
    ``data-act`` and on hover); the token where the context's maximum sits is outlined."""
    top = max((float(c["max_act"]) for c in contexts), default=0.0) or 1.0
    rows = []
    for i, c in enumerate(contexts):
        spans = []
        for j, (t, a) in enumerate(zip(c["tokens"], c["acts"])):
            a = float(a)
            alpha = min(max(a / top, 0.0), 1.0)
            sel = " g2v-sel" if j == c.get("position") else ""
            colour = "white" if alpha > 0.55 else "#222"
            spans.append(
                f'<span class="g2v-tok{sel}" data-act="{a!r}" style="background:rgba({ACTIVATION_RGB},{alpha:.3f});'
                f'color:{colour}" title="{html.escape(token_label(t))}: activation {a:.4g}">{html.escape(t)}</span>'
            )
        where = f"window {c['window']}" if "window" in c else f"context {i}"
        rows.append(
            f'<div class="g2v-tokens g2v-context"><span class="g2v-info" title="{where}">'
            f"{float(c['max_act']):.3f}&nbsp;</span>{''.join(spans)}</div>"
        )
    if not rows:
        rows.append('<p class="g2v-note">The latent fires on none of the tokens evaluated.</p>')
    return Part('<div id="{id}" class="g2v-contexts">' + "".join(rows) + "</div>")


def _logit_figure(promoted: list[Any], suppressed: list[Any]) -> Any:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(1, 2, subplot_titles=["promoted tokens", "suppressed tokens"], horizontal_spacing=0.22)
    for col, pairs, colour in ((1, promoted, "#2ca02c"), (2, suppressed, "#d62728")):
        toks = [f"{i}:{token_label(str(t))}" for i, (t, _) in enumerate(pairs)]
        fig.add_trace(
            go.Bar(
                x=[float(v) for _, v in pairs],
                y=toks,
                orientation="h",
                marker_color=colour,
                hovertemplate="%{y}<br>logit effect %{x:.5g}<extra></extra>",
                showlegend=False,
            ),
            1,
            col,
        )
        fig.update_yaxes(type="category", autorange="reversed", tickfont={"size": 9}, row=1, col=col)
    fig.update_layout(height=max(220, 22 * max(len(promoted), len(suppressed), 1) + 90), margin={"t": 40})
    return fig


def _histogram_figure(hist: Mapping[str, Any], density: float) -> Any:
    import plotly.graph_objects as go

    counts, edges = np.asarray(hist["counts"], dtype=float), np.asarray(hist["edges"], dtype=float)
    if edges.shape != (counts.size + 1,):
        raise ValueError(f"a histogram of {counts.size} counts needs {counts.size + 1} bin edges, got {edges.size}")
    fig = go.Figure(
        go.Bar(
            x=((edges[:-1] + edges[1:]) / 2).tolist(),
            y=counts.tolist(),  # plain lists: the drawn figure's data read back as they are
            width=np.diff(edges).tolist(),
            marker_color="#d62728",
            customdata=np.stack([edges[:-1], edges[1:]], 1).tolist(),
            hovertemplate="activation %{customdata[0]:.4g} – %{customdata[1]:.4g}<br>%{y:.0f} tokens<extra></extra>",
        )
    )
    fig.update_layout(
        height=280,
        title={"text": f"non-zero activations (density {density:.4g})", "font": {"size": 12}},
        xaxis={"title": "activation"},
        yaxis={"title": "tokens"},
        margin={"t": 40},
        bargap=0,
    )
    return fig


@boundary
def view_feature(result: ResultLike) -> View:
    """The dashboard of one latent: a :class:`~gpt2_interp.analysis.features.FeatureView` or its dict. Its
    top contexts with every token coloured by the activation (hover: the value), the tokens its logit
    effect promotes and suppresses most (bars; hover: the exact effect), and the histogram of its non-zero
    activations with its density (the share of tokens it fires on)."""
    d = as_dict(result)
    need = {"latent", "contexts", "promoted", "suppressed", "histogram", "density"}
    missing = sorted(need - set(d))
    if missing:
        raise ValueError(f"a feature view needs {', '.join(missing)}; the result has fields {sorted(d)[:12]}")
    density, tokens = float(d["density"]), int(d.get("tokens") or 0)
    note = text_part(
        f"latent {d['latent']} of the SAE at {d.get('hook_name', '?')}: fires on {100 * density:.3g}% of "
        f"{tokens or 'the'} tokens evaluated. Top contexts (largest activation first; the firing token outlined, "
        "each token's colour its activation over the largest shown):"
    )
    parts = [note, context_part(list(d["contexts"]))]
    parts.append(text_part("Logit effect: the decoder direction through the final norm's gain and the unembedding."))
    parts.append(figure_part(_logit_figure(list(d["promoted"]), list(d["suppressed"]))))
    parts.append(figure_part(_histogram_figure(d["histogram"], density)))
    return View(f"Feature: latent {d['latent']} at {d.get('hook_name', '?')}", parts)
