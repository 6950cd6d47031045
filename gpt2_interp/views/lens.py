"""Views of reading the model: logit / tuned lens maps, direct logit attribution, vocabulary projections,
neuron searches and MLP sub-updates — each drawn from the result's own fields (``to_dict()``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.boundary import boundary
from ..core.checks import check_index
from ..core.result import ResultLike
from .heatmap import WHITE_BLUE, array, as_dict, heatmap, token_label
from .page import View, figure_part, text_part


@boundary
def view_lens(result: ResultLike, prompt: int = 0, k: int = 5) -> View:
    """``result``, a :class:`~gpt2_interp.analysis.LensResult` (or its dict), as a layer × position map of
    one ``prompt``: layer boundaries up (the output at the top), the analysed positions across (input
    tokens on the axis), the top-1 token written in each cell (up to 32 positions; wider maps show it on
    hover); colour = the target's log-probability with a target, else the top-1 probability. Hover: the
    layer, the input token, the lens's top-``k`` tokens with their probabilities and, with a target, its
    probability and rank (1 = top)."""
    import plotly.graph_objects as go

    d = as_dict(result)
    b = check_index(prompt, len(d["prompts"]), "prompt", f"the result holds {len(d['prompts'])} prompts")
    valid = np.asarray(d["valid"], dtype=bool)[b]
    positions = np.asarray(d["positions"], dtype=int)[b]
    cols = [j for j in range(len(positions)) if valid[j]]
    layers = list(d["layers"])
    toks = d["str_tokens"][b]
    top_tokens = d["top_tokens"]  # [layer][prompt][col][k]
    top_probs = array(d["top_probs"])  # [layer, prompt, col, k]
    has_t = d.get("target_prob") is not None
    target = d["targets"][b] if has_t else None
    t_prob = array(d["target_prob"])[:, b] if has_t else None
    t_rank = np.asarray(d["target_rank"])[:, b] if has_t and d.get("target_rank") is not None else None
    x = [f"{int(positions[j])}:{token_label(toks[int(positions[j])])}" for j in cols]
    z = np.empty((len(layers), len(cols)))
    text: list[list[str]] = []
    hover: list[list[str]] = []
    for li, layer in enumerate(layers):
        trow, hrow = [], []
        for ci, j in enumerate(cols):
            tops = top_tokens[li][b][j][:k]
            probs = top_probs[li, b, j, :k]
            trow.append(token_label(tops[0])[:8])
            lines = [f"<b>{layer}</b> · input {x[ci]}"]
            lines += [f"{r + 1}. {token_label(t)}  {p:.3f}" for r, (t, p) in enumerate(zip(tops, probs))]
            if has_t:
                assert t_prob is not None
                rank = f", rank {int(t_rank[li, j])}" if t_rank is not None else ""
                lines.append(f"target {token_label(target or '')}: p = {t_prob[li, j]:.4g}{rank}")
                z[li, ci] = np.log(max(float(t_prob[li, j]), 1e-12))
            else:
                z[li, ci] = float(probs[0])
            hrow.append("<br>".join(lines))
        text.append(trow)
        hover.append(hrow)
    scale = "Viridis" if has_t else WHITE_BLUE
    bar = f"log p({token_label(target or '')})" if has_t else "p(top-1)"
    trace = heatmap(
        z,
        x,
        layers,
        hover=hover,
        text=text if len(cols) <= 32 else None,  # cell texts only where cells are wide enough to read them
        colorscale=scale,
        zmin=None if has_t else 0.0,
        zmax=0.0 if has_t else 1.0,
        colorbar=bar,
    )
    fig = go.Figure(trace)
    fig.update_layout(
        height=int(min(max(22 * len(layers) + 160, 300), 1100)),
        margin={"l": 90, "r": 20, "t": 30, "b": 90},
        xaxis={"type": "category", "title": "input token (position)", "tickfont": {"size": 9}},
        yaxis={"type": "category", "title": "layer boundary", "tickfont": {"size": 9}},
    )
    lens = d.get("lens", "logit lens")
    what = f"colour: log p of the target {target!r}" if has_t else "colour: probability of the top-1 token"
    note = text_part(f"{lens}: each cell is the lens's top-1 token at that layer boundary and position; {what}.")
    return View(f"{lens}: {d['prompts'][b]!r}", [note, figure_part(fig)])


@boundary
def view_dla(result: ResultLike) -> View:
    """A :class:`~gpt2_interp.analysis.DLAResult` (or its dict): a bar per component's direct contribution
    (embeddings, attention and MLP per layer, the final LayerNorm's bias), hover for its exact value; and a
    layer × head heatmap where per-head parts exist."""
    import plotly.graph_objects as go

    d = as_dict(result)
    labels = [*d["labels"], "ln_final.b"]
    vals = [*array(d["parts"]).tolist(), float(d["ln_bias"])]
    colours = [
        "#888" if "embed" in l else "#1f77b4" if "attn" in l else "#ff7f0e" if "mlp" in l else "#2ca02c" for l in labels
    ]
    bars = go.Figure(go.Bar(x=labels, y=vals, marker_color=colours, hovertemplate="%{x}: %{y:.5g}<extra></extra>"))
    bars.update_layout(height=380, yaxis_title=f"direct contribution to {d.get('target', '')!r}", margin={"t": 30})
    what = repr(d.get("target", ""))
    parts = [
        text_part(
            f"{d['prompt']!r} at position {d['position']}: total {sum(vals):+.4f} "
            f"(model logit {float(d['logit']):+.4f}) for {what}"
        ),
        figure_part(bars),
    ]
    if d.get("head_parts") is not None:
        h = array(d["head_parts"])
        m = float(np.abs(h).max()) or 1.0
        hm = go.Figure(
            heatmap(
                h,
                [str(i) for i in range(h.shape[1])],
                [f"L{i}" for i in range(h.shape[0])],
                colorscale="RdBu",
                zmin=-m,
                zmax=m,
                colorbar="direct contribution",
            )
        )
        hm.update_layout(
            height=min(26 * h.shape[0] + 150, 800),
            xaxis={"type": "category", "title": "head"},
            yaxis={"type": "category", "title": "layer", "autorange": "reversed"},
            title={"text": "per-head direct contribution (b_O excluded)", "font": {"size": 12}},
        )
        parts.append(figure_part(hm))
    return View(f"Direct logit attribution: {what}", parts)


def _token_bars(title: str, tokens: list[list[str]], scores: np.ndarray, labels: list[str], colour: str) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for r, label in enumerate(labels):
        fig.add_trace(
            go.Bar(
                y=[token_label(t) for t in tokens[r]][::-1],
                x=scores[r][::-1],
                orientation="h",
                name=label,
                visible=r == 0,
                marker_color=colour,
                hovertemplate=f"{label}<br>%{{y}}: %{{x:.4g}}<extra></extra>",
            )
        )
    buttons = [
        {"label": l, "method": "update", "args": [{"visible": [i == r for i in range(len(labels))]}]}
        for r, l in enumerate(labels)
    ]
    fig.update_layout(
        title={"text": title, "font": {"size": 12}},
        height=max(24 * len(tokens[0]) + 140, 300),
        margin={"l": 120, "t": 60},
        updatemenus=[{"buttons": buttons, "x": 0, "y": 1.18, "xanchor": "left"}] if len(labels) > 1 else [],
        yaxis={"type": "category"},
    )
    return fig


@boundary
def view_vocab(result: ResultLike) -> View:
    """A :class:`~gpt2_interp.analysis.VocabProjection` (or its dict): for the vector chosen in the menu,
    bars of its top and bottom tokens' scores (hover: the exact score)."""
    d = as_dict(result)
    labels = list(d["labels"])
    score = "v · (w ⊙ W_U)" if d.get("apply_ln") else "v · W_U"
    top = _token_bars(f"top tokens ({score})", d["top_tokens"], array(d["top_scores"]), labels, "#2ca02c")
    bottom = _token_bars(f"bottom tokens ({score})", d["bottom_tokens"], array(d["bottom_scores"]), labels, "#d62728")
    return View(f"Vocabulary projection of {len(labels)} vectors", [figure_part(top), figure_part(bottom)])


@boundary
def view_neuron_search(result: ResultLike) -> View:
    """A :class:`~gpt2_interp.analysis.NeuronSearch` (or its dict): a bar per neuron (its score); hover for
    the neuron's own top tokens."""
    import plotly.graph_objects as go

    d = as_dict(result)
    names = [f"L{l}.N{n}" for l, n in zip(d["layers"], d["neurons"])]
    hover = [", ".join(token_label(t) for t in toks[:8]) for toks in d["top_tokens"]]
    fig = go.Figure(
        go.Bar(
            y=names[::-1],
            x=array(d["scores"])[::-1],
            orientation="h",
            customdata=hover[::-1],
            hovertemplate="%{y}: %{x:.4g}<br>top tokens: %{customdata}<extra></extra>",
        )
    )
    fig.update_layout(height=22 * len(names) + 140, xaxis_title="score", yaxis={"type": "category"})
    toks = ", ".join(repr(t) for t in d["tokens"][:4])
    return View(f"Neurons promoting {toks}", [figure_part(fig)])


@boundary
def view_subupdates(result: ResultLike) -> View:
    """A :class:`~gpt2_interp.analysis.SubupdateResult` (or its dict): the largest MLP sub-updates by norm
    ``|m|·‖v‖`` and, with a target, their direct effect on its logit; hover for each one's activation and
    top promoted tokens."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    d = as_dict(result)
    names = [f"L{l}.N{n}" for l, n in zip(d["layers"], d["neurons"])][::-1]
    acts = array(d["activations"])[::-1]
    tops = [", ".join(token_label(t) for t in toks[:5]) for toks in d["top_tokens"]][::-1]
    custom = [[f"{a:+.4g}", t] for a, t in zip(acts, tops)]
    has_t = d.get("target_effects") is not None
    fig = make_subplots(1, 2 if has_t else 1, shared_yaxes=True, horizontal_spacing=0.03)
    tmpl = "%{y}: %{x:.4g}<br>activation m = %{customdata[0]}<br>promotes %{customdata[1]}<extra></extra>"
    fig.add_trace(
        go.Bar(
            y=names,
            x=array(d["norms"])[::-1],
            orientation="h",
            name="|m|·‖v‖",
            customdata=custom,
            hovertemplate=tmpl,
            marker_color=["#1f77b4" if a > 0 else "#9467bd" for a in acts],
        ),
        1,
        1,
    )
    if has_t:
        e = array(d["target_effects"])[::-1]
        fig.add_trace(
            go.Bar(
                y=names,
                x=e,
                orientation="h",
                name=f"effect on logit({d['target']!r})",
                customdata=custom,
                hovertemplate=tmpl,
                marker_color=["#2ca02c" if v > 0 else "#d62728" for v in e],
            ),
            1,
            2,
        )
        fig.update_xaxes(title_text=f"direct effect on logit({d['target']!r})", row=1, col=2)
    fig.update_xaxes(title_text="|m_i| · ‖v_i‖ (blue: m > 0)", row=1, col=1)
    fig.update_layout(height=22 * len(names) + 160, showlegend=False, yaxis={"type": "category"})
    return View(f"MLP sub-updates at {d['token']!r} of {d['prompt']!r}", [figure_part(fig)])
