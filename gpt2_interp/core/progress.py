"""Progress bars for long work: one place that decides how often they refresh."""

from __future__ import annotations

import sys
from typing import Any, Iterable

from tqdm.auto import tqdm


def progress_bar(iterable: Iterable | None = None, *, enabled: bool | None = True, **kwargs: Any) -> tqdm:
    """A tqdm bar. ``enabled``: True, False, or None for "only on a terminal". On a terminal or in
    a notebook it refreshes every 0.1 s; in a log file or CI output every 10 s, so that a long job
    leaves a few lines there instead of thousands."""
    live = sys.stderr.isatty() or "ipykernel" in sys.modules
    kwargs.setdefault("mininterval", 0.1 if live else 10.0)
    return tqdm(iterable, disable=None if enabled is None else not enabled, **kwargs)
