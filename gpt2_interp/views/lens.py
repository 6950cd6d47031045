"""Views of reading the model: logit / tuned lens maps, direct logit attribution, vocabulary projections,
neuron searches and MLP sub-updates — each drawn from the result's own fields (``to_dict()``)."""

from __future__ import annotations

from dataclasses import dataclass
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
    x = [f"{int(positions[j])}:{token_label(toks[int(positions[j])])}" for j in cols]
    t = _LensTarget.of(d, b)
    z, text, hover = _lens_cells(d, b, cols, x, k, t)
    trace = heatmap(
        z,
        x,
        layers,
        hover=hover,
        text=text if len(cols) <= 32 else None,  # cell texts only where cells are wide enough to read them
        colorscale="Viridis" if t else WHITE_BLUE,
        zmin=None if t else 0.0,
        zmax=0.0 if t else 1.0,
        colorbar=f"log p({token_label(t.target)})" if t else "p(top-1)",
    )
    fig = go.Figure(trace)
    fig.update_layout(
        height=int(min(max(22 * len(layers) + 160, 300), 1100)),
        margin={"l": 90, "r": 20, "t": 30, "b": 90},
        xaxis={"type": "category", "title": "input token (position)", "tickfont": {"size": 9}},
        yaxis={"type": "category", "title": "layer boundary", "tickfont": {"size": 9}},
    )
    lens = d.get("lens", "logit lens")
    what = f"colour: log p of the target {t.name!r}" if t else "colour: probability of the top-1 token"
    note = text_part(f"{lens}: each cell is the lens's top-1 token at that layer boundary and position; {what}.")
    return View(f"{lens}: {d['prompts'][b]!r}", [note, figure_part(fig)])


@dataclass
class _LensTarget:
    """A lens result's target for one prompt: its name (as given), its probability ``[layer, col]`` and, where
    the result holds it, its rank ``[layer, col]``; false where the result has no target."""

    name: Any = None
    prob: np.ndarray | None = None
    rank: np.ndarray | None = None

    @classmethod
    def of(cls, d: dict[str, Any], b: int) -> _LensTarget:
        """The target of prompt ``b`` of the lens result ``d`` (empty without one)."""
        if d.get("target_prob") is None:
            return cls()
        rank = np.asarray(d["target_rank"])[:, b] if d.get("target_rank") is not None else None
        return cls(d["targets"][b], array(d["target_prob"])[:, b], rank)

    def __bool__(self) -> bool:
        return self.prob is not None

    @property
    def target(self) -> str:
        """The target as text (empty for none)."""
        return self.name or ""

    def line(self, li: int, j: int) -> str:
        """The hover line of layer ``li``, column ``j``: the target's probability and rank."""
        assert self.prob is not None
        rank = f", rank {int(self.rank[li, j])}" if self.rank is not None else ""
        return f"target {token_label(self.target)}: p = {self.prob[li, j]:.4g}{rank}"


def _lens_cells(
    d: dict[str, Any], b: int, cols: list[int], x: list[str], k: int, t: _LensTarget
) -> tuple[np.ndarray, list[list[str]], list[list[str]]]:
    """``(z, text, hover)`` of the lens map of prompt ``b``, layers down and columns ``cols`` (labelled ``x``)
    across: the colour (the target's log p, else the top-1 probability), the top-1 token written in the cell,
    and the hover (the layer, the input, the top-``k`` tokens with their probabilities, the target's line)."""
    layers = list(d["layers"])
    top_tokens = d["top_tokens"]  # [layer][prompt][col][k]
    top_probs = array(d["top_probs"])  # [layer, prompt, col, k]
    z = np.empty((len(layers), len(cols)))
    text: list[list[str]] = []
    hover: list[list[str]] = []
    for li, layer in enumerate(layers):
        tops = [top_tokens[li][b][j][:k] for j in cols]
        probs = [top_probs[li, b, j, :k] for j in cols]
        text.append([token_label(tt[0])[:8] for tt in tops])
        hover.append([_top_hover(layer, x[ci], tops[ci], probs[ci]) for ci in range(len(cols))])
        z[li] = _lens_colour(t, li, cols, probs)
        if t:
            hover[-1] = [h + "<br>" + t.line(li, j) for h, j in zip(hover[-1], cols)]
    return z, text, hover


def _lens_colour(t: _LensTarget, li: int, cols: list[int], probs: list[np.ndarray]) -> list[float]:
    """The colours of layer ``li``'s cells: the target's log-probability (floored at 1e-12) where there is a
    target, else the top-1 probability."""
    if t.prob is None:
        return [float(p[0]) for p in probs]
    return [np.log(max(float(t.prob[li, j]), 1e-12)) for j in cols]


def _top_hover(layer: str, where: str, tops: list[str], probs: np.ndarray) -> str:
    """A lens cell's hover: the layer, the input token, the top tokens with their probabilities."""
    lines = [f"<b>{layer}</b> · input {where}"]
    lines += [f"{r + 1}. {token_label(t)}  {p:.3f}" for r, (t, p) in enumerate(zip(tops, probs))]
    return "<br>".join(lines)


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
    from plotly.subplots import make_subplots

    d = as_dict(result)
    names = [f"L{l}.N{n}" for l, n in zip(d["layers"], d["neurons"])][::-1]
    acts = array(d["activations"])[::-1]
    tops = [", ".join(token_label(t) for t in toks[:5]) for toks in d["top_tokens"]][::-1]
    custom = [[f"{a:+.4g}", t] for a, t in zip(acts, tops)]
    has_t = d.get("target_effects") is not None
    fig = make_subplots(1, 2 if has_t else 1, shared_yaxes=True, horizontal_spacing=0.03)
    norms = _signed_bars(names, array(d["norms"])[::-1], acts, "|m|·‖v‖", custom, ("#1f77b4", "#9467bd"))
    fig.add_trace(norms, 1, 1)
    if has_t:
        e = array(d["target_effects"])[::-1]
        fig.add_trace(
            _signed_bars(names, e, e, f"effect on logit({d['target']!r})", custom, ("#2ca02c", "#d62728")), 1, 2
        )
        fig.update_xaxes(title_text=f"direct effect on logit({d['target']!r})", row=1, col=2)
    fig.update_xaxes(title_text="|m_i| · ‖v_i‖ (blue: m > 0)", row=1, col=1)
    fig.update_layout(height=22 * len(names) + 160, showlegend=False, yaxis={"type": "category"})
    return View(f"MLP sub-updates at {d['token']!r} of {d['prompt']!r}", [figure_part(fig)])


def _signed_bars(
    names: list[str], x: np.ndarray, sign: np.ndarray, name: str, custom: list[list[str]], colours: tuple[str, str]
) -> Any:
    """Horizontal bars ``x`` of the sub-updates ``names``, coloured ``colours[0]`` where ``sign`` is positive and
    ``colours[1]`` elsewhere; hover: the value, the activation and the promoted tokens (``custom``)."""
    import plotly.graph_objects as go

    return go.Bar(
        y=names,
        x=x,
        orientation="h",
        name=name,
        customdata=custom,
        hovertemplate="%{y}: %{x:.4g}<br>activation m = %{customdata[0]}<br>promotes %{customdata[1]}<extra></extra>",
        marker_color=[colours[0] if v > 0 else colours[1] for v in sign],
    )
