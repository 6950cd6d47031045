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


def progress_bar(iterable: Iterable | None = None, *, enabled: bool | None = True, **kwargs: Any) -> _console_tqdm:
    """A tqdm bar. ``enabled``: True, False, or None for "only on a terminal". On a terminal or in
    a notebook it refreshes every 0.1 s; in a log file or CI output every 10 s, so that a long job
    leaves a few lines there instead of thousands."""
    if not _SHOWN[-1]:
        enabled = False
    live = sys.stderr.isatty() or "ipykernel" in sys.modules
    kwargs.setdefault("mininterval", 0.1 if live else 10.0)
    return _bar_class()(iterable, disable=None if enabled is None else not enabled, **kwargs)


@contextlib.contextmanager
def enabled(show: bool) -> Iterator[None]:
    """Within the block, ``show=False`` silences every progress bar of the library (a runner's
    ``--quiet``); ``show=True`` leaves each call's own ``enabled`` in charge."""
    _SHOWN.append(bool(show))
    try:
        yield
    finally:
        _SHOWN.pop()
