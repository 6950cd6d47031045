"""What every figure ends with: line panels styled alike, an optional title, a layout whose text fits."""

from __future__ import annotations

from collections.abc import Iterable

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from .layout import finish_layout


def style_line_axes(axes: Iterable[Axes], legend_size: float = 8) -> None:
    """A light grid and a small legend on each line panel."""
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=legend_size)


def finish(fig: Figure, title: str | None = None, fontsize: float = 10) -> Figure:
    """Give ``fig`` its title (if any) and a layout in which every title and label fits its panel
    (:func:`~gpt2_interp.plots.layout.finish_layout`); returns it."""
    if title:
        fig.suptitle(title, fontsize=fontsize)
    return finish_layout(fig)
