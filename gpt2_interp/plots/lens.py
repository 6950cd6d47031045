"""Figures for reading the model: logit lens, direct logit attribution, vocabulary projections.

Figures are built as ``matplotlib.figure.Figure`` objects (no pyplot state, any backend;
``Agg`` renders them to files).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from ..core.boundary import boundary
from ..core.checks import check_count
from .figure import finish, style_line_axes
from .layout import chars_that_fit, finish_layout, fit_text, grid_size

if TYPE_CHECKING:
    from ..analysis.lens import DLAResult, LensResult
    from ..analysis.vocab import NeuronSearch, SubupdateResult, VocabProjection


def _show(token: str, width: int = 10) -> str:
    """A token as cell text: visible leading space, newlines escaped, truncated."""
    s = token.replace("\n", "\\n").replace(" ", "␣", 1) if token.startswith(" ") else token.replace("\n", "\\n")
    return s if len(s) <= width else s[: width - 1] + "…"


@boundary
def plot_lens(result: LensResult, prompt: int = 0, position: int = -1, max_layers: int | None = None) -> Figure:
    """nostalgebraist-style heatmap of one prompt: rows = layer boundaries (output at the top),
    columns = analysed positions, text = top-1 token, colour = its probability (or the
    target's log-probability when a target is given); beside it, the target's probability
    and rank per layer at column ``position`` (top-1 probability without a target).

    ``result``: a :class:`~gpt2_interp.analysis.LensResult`; ``prompt``: which of its prompts (default
    0); ``max_layers`` has no effect (every boundary is drawn). The figure is sized to the data: a column
    per analysed position and a row per layer boundary (within sane bounds); cell texts and tick labels
    are shortened to fit their cells, and left out where a cell is too small to hold any."""
    b = prompt
    cols = [j for j in range(result.positions.shape[1]) if result.valid[b, j]]
    layers = result.layers
    has_t = result.target_prob is not None
    if has_t:
        assert result.target_prob is not None and result.targets is not None
        values = result.target_prob[:, b, cols].clamp_min(1e-12).log().numpy()  # [n_layers, n_cols]
        cbar_label = f"log p({result.targets[b]!r})"
    else:
        values = result.top_probs[:, b, cols, 0].numpy()
        cbar_label = "p(top-1 token)"
    n_l, n_c = values.shape
    heat_w, heat_h = grid_size(n_l, n_c, (0.7, 0.3), lo=(0.7, 1.8), hi=(16.0, 16.0))
    cell_w, cell_h = heat_w / max(n_c, 1), heat_h / max(n_l, 1)
    size = 7.0
    cell_chars = chars_that_fit(0.9 * cell_w, size) if cell_h * 72 >= 1.4 * size else 0
    step = next(s for s in range(1, n_c + 2) if chars_that_fit(0.9 * cell_w * s, size) >= 4 or s > n_c)
    tick_chars = chars_that_fit(0.9 * cell_w * step, size)
    ystep = max(1, -(-int(1.4 * 8) // max(1, int(cell_h * 72))))  # y tick labels (8 pt) one row apart at least
    # constrained layout reserves room for the colour bar's label and the curve's axis labels (no overlap)
    fig = Figure(figsize=(heat_w + 3.2 + 3.8, heat_h + 1.8), layout="constrained")
    gs = fig.add_gridspec(1, 2, width_ratios=[heat_w, 3.2])
    ax = fig.add_subplot(gs[0])
    vmin, vmax = (None, 0.0) if has_t else (0.0, 1.0)
    im = ax.imshow(values, aspect="auto", origin="lower", cmap="viridis" if has_t else "Blues", vmin=vmin, vmax=vmax)
    cell_texts = []
    for li in range(n_l if cell_chars >= 2 else 0):
        for ci, j in enumerate(cols):
            p = float(result.top_probs[li, b, j, 0])
            dark = (has_t and values[li, ci] < (np.nanmin(values) + 0.5 * (0 - np.nanmin(values)))) or (
                not has_t and p > 0.6
            )
            cell_texts.append(
                ax.text(
                    ci,
                    li,
                    _show(result.top_tokens[li][b][j][0], cell_chars),
                    ha="center",
                    va="center",
                    fontsize=size,
                    color="white" if dark else "black",
                )
            )
    ax.set_yticks(range(0, n_l, ystep), layers[::ystep])
    ax.set_xticks(
        range(0, n_c, step),
        [f"{_show(result.input_token(b, j), tick_chars)}\n{int(result.positions[b, j])}" for j in cols[::step]],
        fontsize=size,
    )
    ax.set_xlabel("input token (position)")
    ax.set_ylabel(
        "layer boundary (decoded with ln_final + W_U)"
        if result.lens == "logit lens"
        else "layer boundary (translator, ln_final + W_U)"
    )
    ax.set_title(f"{result.lens}: {result.prompts[b]!r}", fontsize=9)
    fig.colorbar(im, ax=ax, label=cbar_label, fraction=0.05, pad=0.02)

    j = cols[position] if cols else 0
    ax2 = fig.add_subplot(gs[1])
    x = np.arange(n_l)
    if has_t:
        assert result.target_prob is not None and result.target_rank is not None and result.targets is not None
        ax2.plot(x, result.target_prob[:, b, j].numpy(), "o-", color="tab:blue", label="probability")
        ax2.set_ylabel(f"p({result.targets[b]!r})", color="tab:blue")
        ax2.set_ylim(0, 1)
        twin = ax2.twinx()
        twin.plot(x, result.target_rank[:, b, j].numpy(), "s--", color="tab:red", label="rank")
        twin.set_yscale("log")
        twin.invert_yaxis()
        twin.set_ylabel("rank (1 = top)", color="tab:red")
        ax2.set_title(f"target {result.targets[b]!r} at {result.input_token(b, j)!r}", fontsize=9)
    else:
        ax2.plot(x, result.top_probs[:, b, j, 0].numpy(), "o-")
        ax2.set_ylabel("p(top-1 token)")
        ax2.set_ylim(0, 1)
        ax2.set_title(f"top-1 probability at {result.input_token(b, j)!r}", fontsize=9)
    xstep = max(1, -(-n_l // 24))
    ax2.set_xticks(x[::xstep], layers[::xstep], rotation=90, fontsize=7)
    ax2.set_xlabel("layer boundary")
    finish_layout(fig)
    fig.draw_without_rendering()
    cell_px = ax.get_window_extent().width / max(n_c, 1)
    for t in cell_texts:  # the planned cell width is an estimate: make sure each text fits its cell
        fit_text(t, 0.92 * cell_px, min_size=5.0, max_lines=1)
    return fig


@boundary
def plot_attribution(result: DLAResult) -> Figure:
    """Bars of the direct contributions (embeddings, attention, MLP per layer; LN bias apart),
    and a layer × head heatmap when per-head parts exist."""
    heads = result.head_parts is not None
    labels = [*result.labels, "ln_final.b"]
    bars_w = grid_size(1, len(labels), (0.2, 0.0), (1.4, 0.0), lo=(5.0, 0.0), hi=(20.0, 0.0))[0]
    heads_w = 3.5 if heads else 0.0
    fig = Figure(figsize=(bars_w + heads_w, 4.6))
    gs = fig.add_gridspec(1, 2 if heads else 1, width_ratios=[bars_w, heads_w] if heads else [1])
    ax = fig.add_subplot(gs[0])
    vals = np.append(result.parts.numpy(), result.ln_bias)
    colours = [
        "tab:gray" if "embed" in l else "tab:blue" if "attn" in l else "tab:orange" if "mlp" in l else "tab:green"
        for l in labels
    ]
    ax.bar(range(len(vals)), vals, color=colours)
    ax.axhline(0, color="black", lw=0.6)
    ax.set_xticks(range(len(vals)), labels, rotation=90, fontsize=7)
    ax.set_ylabel(f"direct contribution to {result.what}")
    ax.set_title(
        f"{result.prompt!r}[{result.position}] · total {result.total:+.3f} (model {result.logit:+.3f})", fontsize=9
    )
    if heads:
        assert result.head_parts is not None
        ax2 = fig.add_subplot(gs[1])
        h = result.head_parts.numpy()
        m = float(np.abs(h).max()) or 1.0
        im = ax2.imshow(h, cmap="RdBu", vmin=-m, vmax=m, aspect="auto")
        ax2.set_xlabel("head")
        ax2.set_ylabel("layer")
        ax2.set_yticks(range(h.shape[0]))
        ax2.set_title("per-head direct contribution (b_O excluded)", fontsize=9)
        fig.colorbar(im, ax=ax2, fraction=0.05)
    return finish_layout(fig)


def _token_bars(ax, tokens: Sequence[str], scores: torch.Tensor, colour: str, title: str) -> None:
    y = np.arange(len(tokens))[::-1]
    ax.barh(y, scores.numpy(), color=colour)
    ax.set_yticks(y, [repr(t) for t in tokens], fontsize=7)
    ax.set_title(title, fontsize=8)


@boundary
def plot_vocab(result: VocabProjection, rows: int | None = None, max_rows: int = 64) -> Figure:
    """For the first ``rows`` vectors of ``result`` (a :class:`~gpt2_interp.analysis.VocabProjection`;
    default: all, at most ``max_rows``): bars of their top and bottom tokens' scores. ``rows`` < 1 or
    a result without rows raises ValueError."""
    n = min(len(result.labels) if rows is None else check_count(rows, "rows"), len(result.labels), max_rows)
    if n < 1:
        raise ValueError("the result has no rows to plot")
    k = max(len(result.top_tokens[0]) if result.top_tokens else 1, 1)
    fig = Figure(figsize=(7, (0.55 + 0.13 * k) * n + 0.6))
    for r in range(n):
        ax = fig.add_subplot(n, 2, 2 * r + 1)
        _token_bars(ax, result.top_tokens[r], result.top_scores[r], "tab:green", f"{result.labels[r]}: top")
        ax = fig.add_subplot(n, 2, 2 * r + 2)
        _token_bars(ax, result.bottom_tokens[r], result.bottom_scores[r], "tab:red", f"{result.labels[r]}: bottom")
    shown = f" (first {n} of {len(result.labels)})" if n < len(result.labels) else ""
    fig.supxlabel("score = v · " + ("(w ⊙ W_U)" if result.apply_ln else "W_U") + shown, fontsize=8)
    return finish_layout(fig)


@boundary
def plot_neuron_search(result: NeuronSearch, **_: object) -> Figure:
    """One bar per neuron (its score), labelled with the neuron's own top tokens."""
    fig = Figure(figsize=(7, 0.28 * len(result) + 1.4))
    ax = fig.add_subplot()
    y = list(range(len(result)))[::-1]
    ax.barh(y, result.scores.numpy())
    ax.set_yticks(
        y,
        [
            f"L{l}.N{i} " + ",".join(map(repr, t[:3]))
            for l, i, t in zip(result.layers, result.neurons, result.top_tokens)
        ],
        fontsize=7,
    )
    ax.set_xlabel("score")
    ax.set_title("neurons promoting " + ", ".join(map(repr, result.tokens[:4])), fontsize=9)
    return finish_layout(fig)


@boundary
def plot_subupdates(result: SubupdateResult) -> Figure:
    """The largest MLP sub-updates: norm ``|m|·‖v‖`` and (with a target) direct effect, labelled
    with each one's top promoted tokens."""
    n = len(result.neurons)
    has_t = result.target_effects is not None
    fig = Figure(figsize=(10 if has_t else 6.5, 0.3 * n + 1.5))
    labels = [
        f"L{l}.N{i} " + ",".join(_show(t, 8) for t in toks[:3])
        for l, i, toks in zip(result.layers, result.neurons, result.top_tokens)
    ]
    y = np.arange(n)[::-1]
    ax = fig.add_subplot(1, 2 if has_t else 1, 1)
    ax.barh(y, result.norms.numpy(), color=["tab:blue" if a > 0 else "tab:purple" for a in result.activations])
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xlabel("|m_i| · ‖v_i‖ (blue: m > 0)")
    ax.set_title(f"MLP sub-updates at {result.token!r} of {result.prompt!r}", fontsize=9)
    if has_t:
        assert result.target_effects is not None
        ax2 = fig.add_subplot(1, 2, 2, sharey=ax)
        e = result.target_effects.numpy()
        ax2.barh(y, e, color=["tab:green" if v > 0 else "tab:red" for v in e])
        ax2.axvline(0, color="black", lw=0.6)
        ax2.tick_params(labelleft=False)
        ax2.xaxis.set_major_locator(MaxNLocator(4))
        ax2.set_xlabel(f"direct effect on logit({result.target!r})")
    return finish_layout(fig)


@boundary
def plot_lens_divergence(
    labels: Sequence[str],
    kl_bits: Mapping[str, Sequence[float] | np.ndarray],
    top1: Mapping[str, Sequence[float] | np.ndarray],
    title: str = "",
) -> Figure:
    """Two panels by layer boundary: KL(final ‖ lens) in bits (log scale; values below 1e-6 bits, the
    last boundary's round-off, are left out) and top-1 agreement with the model's final prediction, one
    line per lens (e.g. ``{"logit lens": …, "tuned lens": …}``). Deep models get every k-th tick label.
    ``labels``: the boundaries (x axis); ``kl_bits`` and ``top1``: ``{lens name: one value per
    boundary}`` (as :func:`~gpt2_interp.analysis.lens_divergence` returns them); ``title`` above both."""
    fig = Figure(figsize=(10, 3.6))
    x = np.arange(len(labels))
    ax1, ax2 = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for i, (name, vals) in enumerate(kl_bits.items()):
        v = np.asarray(vals, dtype=float)
        ax1.plot(x, np.where(v > 1e-6, v, np.nan), "o-", color=f"C{i}", label=name)
    ax1.set_yscale("log")
    ax1.set_ylabel("KL(final ‖ lens), bits")
    for i, (name, vals) in enumerate(top1.items()):
        ax2.plot(x, vals, "o-", color=f"C{i}", label=name)
    ax2.set_ylabel("top-1 agreement with the final prediction")
    ax2.set_ylim(-0.02, 1.02)
    step = max(1, -(-len(labels) // 12))
    for ax in (ax1, ax2):
        ax.set_xticks(x[::step], list(labels)[::step])
        ax.set_xlabel("layer boundary")
    style_line_axes((ax1, ax2))
    return finish(fig, title)
