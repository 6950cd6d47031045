"""Progress bars for long work: one place that decides how often they refresh and how they draw."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from tqdm.std import tqdm as _console_tqdm

_SHOWN = [True]  # False inside ``enabled(False)``: every bar of the library stays silent


def _bar_class() -> type:
    """The notebook widget bar inside a Jupyter kernel that has ipywidgets; the plain text bar
    everywhere else (also in a kernel without ipywidgets, where ``tqdm.auto`` would print an
    "IProgress not found" warning in every cell)."""
    if "ipykernel" in sys.modules:
        try:
            import ipywidgets  # noqa: F401 (only whether it is installed: tqdm.notebook needs it)
            from tqdm.notebook import tqdm as notebook_tqdm
        except ImportError:
            return _console_tqdm
        return notebook_tqdm
    return _console_tqdm


def _live() -> bool:
    """Whether the output is watched as it comes: a terminal or a Jupyter kernel."""
    return sys.stderr.isatty() or "ipykernel" in sys.modules


def shown(enabled: bool | None = True) -> bool:
    """Whether a bar (or a :func:`note`) with this ``enabled`` is shown: False inside ``enabled(False)``;
    None means "on a terminal or in a notebook" (off in a log file or CI output)."""
    if not _SHOWN[-1]:
        return False
    return _live() if enabled is None else bool(enabled)


def progress_bar(iterable: Iterable | None = None, *, enabled: bool | None = True, **kwargs: Any) -> _console_tqdm:
    """A tqdm bar. ``enabled``: True, False, or None for "on a terminal or in a notebook" (:func:`shown`).
    On a terminal or in a notebook it refreshes every 0.1 s; in a log file or CI output every 10 s, so
    that a long job leaves a few lines there instead of thousands."""
    kwargs.setdefault("mininterval", 0.1 if _live() else 10.0)
    return _bar_class()(iterable, disable=not shown(enabled), **kwargs)


def note(message: str, enabled: bool | None = True) -> None:
    """One line on stderr about the work under way (what a bar cannot say, e.g. which corpus), shown
    under the same rule as a bar (:func:`shown`) and printed without breaking a bar that is drawing."""
    if shown(enabled):
        _console_tqdm.write(message, file=sys.stderr)


@contextlib.contextmanager
def enabled(show: bool) -> Iterator[None]:
    """Within the block, ``show=False`` silences every progress bar of the library (a runner's
    ``--quiet``); ``show=True`` leaves each call's own ``enabled`` in charge."""
    _SHOWN.append(bool(show))
    try:
        yield
    finally:
        _SHOWN.pop()
