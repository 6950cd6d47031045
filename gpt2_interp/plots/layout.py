"""Text that stays legible: figure sizes from the data's shape, labels that neither overlap nor leave
their axes, titles that fit their panel, colour-bar ticks spaced apart.

Everything here measures with the figure's own renderer (``Text.get_window_extent``) after the layout
is computed, so the geometry it guarantees holds in the saved file at any dpi (positions are in
figure fractions and points, which scale together).
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colorbar import Colorbar
from matplotlib.figure import Figure
from matplotlib.text import Annotation, Text
from matplotlib.transforms import Bbox

#: Smallest font size (points) a title or label is shrunk to before it is shortened.
MIN_FONTSIZE = 6.0
#: Width of one character as a fraction of the font size (a wide average for the default sans font).
CHAR_WIDTH = 0.62


def grid_size(
    n_rows: int,
    n_cols: int,
    cell: tuple[float, float],
    extra: tuple[float, float] = (0.0, 0.0),
    lo: tuple[float, float] = (3.0, 2.5),
    hi: tuple[float, float] = (22.0, 18.0),
) -> tuple[float, float]:
    """Figure size in inches for an ``n_rows`` × ``n_cols`` grid of ``cell = (width, height)`` inches plus
    ``extra`` inches for labels and colour bars, clamped to ``[lo, hi]`` in each direction."""
    w = extra[0] + cell[0] * max(n_cols, 1)
    h = extra[1] + cell[1] * max(n_rows, 1)
    return float(np.clip(w, lo[0], hi[0])), float(np.clip(h, lo[1], hi[1]))


def chars_that_fit(width_in: float, fontsize: float) -> int:
    """How many characters of ``fontsize`` points fit in ``width_in`` inches."""
    return int(width_in * 72 / (CHAR_WIDTH * fontsize))


def shorten(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, ending in ``…`` when cut (``""`` when nothing fits)."""
    if width <= 0:
        return ""
    return text if len(text) <= width else text[: width - 1] + "…"


def _figure_of(ax: Axes) -> Figure:
    """The top-level figure an axes is drawn in."""
    fig = ax.get_figure(root=True)
    if not isinstance(fig, Figure):
        raise ValueError("the axes belongs to no figure")
    return fig


def _px_per_pt(fig: Figure) -> float:
    return fig.dpi / 72.0


def _length(text: Text) -> float:
    """A text's extent along its own direction, in pixels (its width, or its height when turned upright)."""
    ext = text.get_window_extent()
    return ext.height if abs(text.get_rotation() - 90) < 1 or abs(text.get_rotation() - 270) < 1 else ext.width


def fit_text(text: Text, width_px: float, min_size: float = MIN_FONTSIZE, max_lines: int = 3) -> None:
    """Make ``text`` at most ``width_px`` long along its direction (wide, or tall when upright): break it at
    spaces (up to ``max_lines`` lines), then shrink its font (not below ``min_size``), then shorten its
    longest lines with ``…``."""
    if not text.get_visible() or not text.get_text() or width_px <= 0:
        return
    width_px *= 0.96  # slack: glyph widths do not scale exactly with the dpi (hinting at low resolutions)
    w = _length(text)
    if w <= width_px:
        return
    lines = text.get_text().split("\n")
    if len(lines) < max_lines:
        per_char = w / max(map(len, lines))
        wrapped = [p for line in lines for p in textwrap.wrap(line, max(8, int(width_px / per_char))) or [""]]
        if len(wrapped) <= max_lines:
            text.set_text("\n".join(wrapped))
            w = _length(text)
    size = float(text.get_fontsize())
    if w > width_px and size > min_size:
        text.set_fontsize(max(min_size, size * width_px / w))
        w = _length(text)
    while w > width_px and text.get_text():
        lines = text.get_text().split("\n")
        i = max(range(len(lines)), key=lambda j: len(lines[j]))
        keep = min(len(lines[i]) - 1, int(len(lines[i]) * width_px / w))
        lines[i] = shorten(lines[i], keep) if keep > 1 else ""
        text.set_text("\n".join(line for line in lines if line))
        w = _length(text)


def _groups(fig: Figure) -> list[tuple[list[Axes], Bbox]]:
    """The figure's panels: axes grouped by their top-level grid cell (a panel's colour bar and twin
    axes join it), each with the union of their window extents and y tick labels. Axes outside any grid (a colour bar
    placed by the constrained layout, an inset) belong to no panel."""
    groups: dict[object, list[Axes]] = {}
    for ax in fig.axes:
        spec = ax.get_subplotspec()
        if not ax.get_visible() or spec is None:
            continue
        top = spec.get_topmost_subplotspec()
        groups.setdefault((top.get_geometry(), id(top.get_gridspec())), []).append(ax)
    boxes = [[a.get_window_extent(), *(b for b in (a.yaxis.get_tightbbox(),) if b is not None)] for a in fig.axes]
    extent = {id(a): Bbox.union(b) for a, b in zip(fig.axes, boxes)}  # each axes with its y tick labels
    return [(axes, Bbox.union([extent[id(a)] for a in axes])) for axes in groups.values()]


def _title_span(fig: Figure, box: Bbox, others: Sequence[Bbox]) -> tuple[float, float]:
    """Horizontal room ``(left, right)`` in pixels for a panel's title: up to half-way to the neighbouring
    panels in the same row, within the figure."""
    left, right = fig.bbox.x0, fig.bbox.x1
    for o in others:
        if o.y1 < box.y0 or o.y0 > box.y1:  # another row
            continue
        if o.x0 >= box.x1:
            right = min(right, (box.x1 + o.x0) / 2)
        elif o.x1 <= box.x0:
            left = max(left, (o.x1 + box.x0) / 2)
    return left, right


def fit_titles(fig: Figure, min_size: float = MIN_FONTSIZE) -> None:
    """Fit every panel's title and axis labels to the panel's room, and the figure's own texts (suptitle,
    supxlabel, footnotes) to the figure. Call after the layout is computed."""
    fig.draw_without_rendering()
    groups = _groups(fig)
    margin = 4 * _px_per_pt(fig)
    for axes, box in groups:
        left, right = _title_span(fig, box, [b for a, b in groups if a is not axes])
        for ax in axes:
            t = ax.title
            if t.get_text():
                centre = t.get_window_extent().x0 + t.get_window_extent().width / 2
                fit_text(t, 2 * (min(centre - left, right - centre) - margin), min_size)
            fit_text(ax.xaxis.label, right - left - margin, min_size)
            fit_text(ax.yaxis.label, ax.get_window_extent().height + 8 * margin, min_size)
    for t in fig.texts:  # suptitle, supxlabel, footnotes
        fit_text(t, fig.bbox.width - margin, min_size)


def thin_ticks(ax: Axes) -> None:
    """Where fixed tick labels (set with ``set_xticks``/``set_yticks``) run into each other, keep every k-th
    one, the smallest k that leaves them apart. Call after the layout is computed."""
    from matplotlib.ticker import FixedLocator

    for axis in (ax.xaxis, ax.yaxis):
        if not isinstance(axis.get_major_locator(), FixedLocator):
            continue
        lo, hi = sorted(axis.get_view_interval())
        ticks = [(loc, t) for loc, t in zip(axis.get_ticklocs(), axis.get_ticklabels()) if lo <= loc <= hi]
        ticks = [(loc, t) for loc, t in ticks if t.get_visible() and t.get_text()]
        if len(ticks) < 2:
            continue
        boxes = [t.get_window_extent() for _, t in ticks]
        k = 1
        while k < len(ticks) and any(boxes[i].overlaps(boxes[i + k]) for i in range(len(boxes) - k)):
            k += 1
        if k > 1:
            first = ticks[0][1]
            axis.set_ticks(
                [loc for loc, _ in ticks[::k]],
                labels=[t.get_text() for _, t in ticks[::k]],
                fontsize=first.get_fontsize(),
                rotation=first.get_rotation(),
            )


def finish_layout(
    fig: Figure, min_size: float = MIN_FONTSIZE, rect: tuple[float, float, float, float] | None = None
) -> Figure:
    """Lay ``fig`` out (a tight layout within ``rect``, or the figure's own layout engine), fit its titles
    and labels (:func:`fit_titles`), lay it out again with the fitted text, fit once more, and freeze the
    layout so what was measured is what is saved; returns ``fig``."""
    engine = fig.get_layout_engine()
    for _ in range(2):
        if engine is None:
            fig.tight_layout(rect=rect)
        fit_titles(fig, min_size)
    for ax in fig.axes:
        thin_ticks(ax)
    if engine is not None:
        fig.draw_without_rendering()
        fig.set_layout_engine("none")
    return fig


def place_labels(
    ax: Axes,
    x: Sequence[float],
    y: Sequence[float],
    labels: Sequence[str],
    fontsize: float = 6.0,
    avoid: Sequence[Bbox] = (),
) -> list[Annotation]:
    """Label the points ``(x[i], y[i])`` (data coordinates) in the order given (most important first),
    each beside its point where its box stays inside the axes and clear of every label placed before it
    and of the ``avoid`` boxes (pixels, e.g. a legend); a label with no free place near its point is left
    out. A label placed away from its point gets a thin leader line. Call after the layout is final."""
    fig = _figure_of(ax)
    fig.draw_without_rendering()
    frame = ax.get_window_extent()
    taken = list(avoid)
    k = _px_per_pt(fig)
    placed = []
    for xi, yi, text in zip(x, y, labels):
        px, py = ax.transData.transform((xi, yi))
        if not (frame.x0 <= px <= frame.x1 and frame.y0 <= py <= frame.y1):
            continue
        probe = ax.annotate(text, (xi, yi), fontsize=fontsize, xytext=(0, 0), textcoords="offset points")
        ext = probe.get_window_extent()
        probe.remove()
        w, h = ext.width / k, ext.height / k  # points
        spot = _free_spot(px, py, w * k, h * k, frame, taken, k)
        if spot is None:
            continue
        (dx, dy), box = spot
        far = abs(dx) > 8 or abs(dy) > 8
        ann = ax.annotate(
            text,
            (xi, yi),
            fontsize=fontsize,
            xytext=(dx / k, dy / k),
            textcoords="offset points",
            ha="left",
            va="bottom",
            arrowprops={"arrowstyle": "-", "color": "0.5", "lw": 0.5, "shrinkA": 0, "shrinkB": 2} if far else None,
            annotation_clip=True,
        )
        placed.append(ann)
        taken.append(box)
    return placed


def _free_spot(
    px: float, py: float, w: float, h: float, frame: Bbox, taken: Sequence[Bbox], k: float
) -> tuple[tuple[float, float], Bbox] | None:
    """The first offset (pixels, of the text's lower-left corner from the point) on rings of growing
    distance whose ``w`` × ``h`` box lies inside ``frame`` and overlaps none of ``taken``."""
    gap = 3 * k
    for r in (1, 2, 3, 5, 8):
        d = gap * r
        for dx, dy in (
            (d, d),
            (d, -d - h),
            (-d - w, d),
            (-d - w, -d - h),
            (-w / 2, d),
            (-w / 2, -d - h),
            (d, -h / 2),
            (-d - w, -h / 2),
        ):
            box = Bbox.from_bounds(px + dx, py + dy, w, h)
            inside = (
                box.x0 >= frame.x0 + 1 and box.x1 <= frame.x1 - 1 and box.y0 >= frame.y0 + 1 and box.y1 <= frame.y1 - 1
            )
            if inside and not any(box.overlaps(t) for t in taken):
                return (dx, dy), box
    return None


def spaced_ticks(cbar: Colorbar, ticks: Sequence[tuple[float, str]], fontsize: float = 7.0) -> list[float]:
    """Set the colour bar's ticks to ``ticks`` (``(value, label)``, most important first), leaving out any
    whose label would overprint one kept before it; returns the values kept. Call after the layout is
    final: the spacing is measured on the drawn colour bar."""
    fig = _figure_of(cbar.ax)
    fig.draw_without_rendering()
    box = cbar.ax.get_window_extent()
    lo, hi = float(cbar.norm.vmin or 0.0), float(cbar.norm.vmax or 0.0)
    vertical = cbar.orientation == "vertical"
    length = box.height if vertical else box.width
    need = 1.25 * fontsize * _px_per_pt(fig) if vertical else None
    kept: list[tuple[float, str, float]] = []
    for value, label in ticks:
        if not lo <= value <= hi or hi <= lo:
            continue
        at = (value - lo) / (hi - lo) * length
        size = need if need is not None else len(label) * CHAR_WIDTH * fontsize * _px_per_pt(fig)
        if all(abs(at - a) >= size for _, _, a in kept):
            kept.append((value, label, at))
    kept.sort()
    cbar.set_ticks([v for v, _, _ in kept], labels=[s for _, s, _ in kept], fontsize=fontsize)
    return [v for v, _, _ in kept]
