"""What every figure ends with: line panels styled alike, an optional title, a tight layout."""

from __future__ import annotations

from collections.abc import Iterable

from matplotlib.axes import Axes
from matplotlib.figure import Figure


def style_line_axes(axes: Iterable[Axes], legend_size: float = 8) -> None:
    """A light grid and a small legend on each line panel."""
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=legend_size)


def finish(fig: Figure, title: str | None = None, fontsize: float = 10) -> Figure:
    """Give ``fig`` its title (if any) and a tight layout; returns it."""
    if title:
        fig.suptitle(title, fontsize=fontsize)
    fig.tight_layout()
    return fig
