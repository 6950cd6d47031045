"""The pieces most views share: result → dict, token labels safe for Plotly, labelled heatmaps, bar charts."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..core.result import ResultLike

WHITE_BLUE = [[0.0, "#ffffff"], [1.0, "#08306b"]]
DIVERGING = "RdBu"
KIND_COLOURS = {"hidden": "Purples", "mlp": "Greens", "attn": "Reds"}


def as_dict(result: ResultLike) -> dict[str, Any]:
    """A result object's ``to_dict()``, or the mapping itself (a saved result read back from JSON)."""
    if isinstance(result, Mapping):
        return dict(result)
    to_dict = getattr(result, "to_dict", None)
    if to_dict is None:
        raise TypeError(f"expected a result object (with to_dict()) or its dict, got {type(result).__name__}")
    return to_dict()


def token_label(token: str) -> str:
    """A token as Plotly text: HTML-escaped (``<|endoftext|>`` stays visible), a leading space as ``␣``,
    newlines as ``\\n``."""
    t = token.replace("\n", "\\n")
    if t.startswith(" "):
        t = "␣" + t[1:]
    return html.escape(t)


def axis_labels(tokens: Sequence[str]) -> list[str]:
    """Unique axis labels ``"i:token"`` (a repeated token keeps its own row or column)."""
    return [f"{i}:{token_label(t)}" for i, t in enumerate(tokens)]


def array(x: Any) -> np.ndarray:
    """A tensor, array or nested list as a float numpy array (None as NaN)."""
    if hasattr(x, "detach"):
        return x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=float)


def heatmap(
    z: np.ndarray,
    x: Sequence[str],
    y: Sequence[str],
    hover: list[list[str]] | None = None,
    colorscale: Any = WHITE_BLUE,
    zmin: float | None = None,
    zmax: float | None = None,
    zmid: float | None = None,
    text: list[list[str]] | None = None,
    colorbar: str = "",
    name: str = "",
    showscale: bool = True,
) -> Any:
    """A ``go.Heatmap`` of ``z [len(y), len(x)]`` with categorical axes ``x``/``y``; ``hover``: one HTML
    string per cell shown on hover (default: row, column, value); ``text``: a short text drawn in each cell."""
    import plotly.graph_objects as go

    kw: dict[str, Any] = {}
    if hover is not None:
        kw["customdata"] = hover
        kw["hovertemplate"] = "%{customdata}<extra></extra>"
    else:
        kw["hovertemplate"] = "%{y} · %{x}<br>%{z:.4g}<extra></extra>"
    if text is not None:
        kw["text"] = text
        kw["texttemplate"] = "%{text}"
        kw["textfont"] = {"size": 9}
    if zmid is not None:
        kw["zmid"] = zmid
    return go.Heatmap(
        z=[
            [v if np.isfinite(v) else None for v in row] for row in np.asarray(z, dtype=float).tolist()
        ],  # plain lists: the drawn figure's data read back as they are
        x=list(x),
        y=list(y),
        colorscale=colorscale,
        zmin=zmin,
        zmax=zmax,
        colorbar={"title": {"text": colorbar, "side": "right"}, "thickness": 12},
        name=name,
        showscale=showscale,
        xgap=0,
        ygap=0,
        **kw,
    )


def colorbar_beside(fig: Any, i: int, **kw: Any) -> None:
    """Put the colour bar of ``fig``'s last trace just right of subplot ``i`` (0 the first), with the colour
    bar settings ``kw``."""
    dom = fig.layout[f"xaxis{'' if i == 0 else i + 1}"].domain
    fig.data[-1].colorbar.update(x=dom[1] + 0.005, **kw)


def grid_height(rows: int, per_row: int = 16, lo: int = 260, hi: int = 900) -> int:
    """A figure height in pixels for ``rows`` heatmap rows, within ``[lo, hi]``."""
    return int(min(max(per_row * rows + 140, lo), hi))


def category_axes(fig: Any, n: int, reversed_y: bool = True) -> None:
    """Categorical axes on every one of ``fig``'s ``n`` subplots (labels kept in order, y top-down)."""
    for i in range(1, n + 1):
        suffix = "" if i == 1 else str(i)
        fig.layout[f"xaxis{suffix}"].update(type="category", tickfont={"size": 9})
        fig.layout[f"yaxis{suffix}"].update(
            type="category", tickfont={"size": 9}, autorange="reversed" if reversed_y else True
        )
