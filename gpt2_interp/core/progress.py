"""Progress bars for long work: one place that decides how often they refresh and how they draw.

On a terminal or in a notebook a bar is drawn and redrawn (tqdm). Where nobody watches the output as it
comes — stderr redirected to a log file, CI — a bar prints a plain line to stderr every
:func:`log_interval` seconds instead (30 s unless ``GPT2_INTERP_PROGRESS_SECONDS`` says otherwise), e.g.
``SAE blocks.3.hook_resid_pre: 120/400 batches, 2m10s elapsed, ETA 4m50s``, also while the loop is stalled
inside one item, and a last line when the work ends. With the default ``enabled=None`` work shorter than
the interval prints nothing; a bar asked for (``enabled=True``) also prints a line when it starts and one
when it ends. Every long job of the library goes through :func:`progress_bar`, so every one of them
reports this way.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from tqdm.std import tqdm as _console_tqdm

from .boundary import boundary

_SHOWN = [True]  # False inside ``enabled(False)``: every bar of the library stays silent
INTERVAL_ENV = "GPT2_INTERP_PROGRESS_SECONDS"
DEFAULT_INTERVAL = 30.0


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


def log_interval() -> float:
    """Seconds between two plain progress lines where the output is not a terminal: the environment
    variable ``GPT2_INTERP_PROGRESS_SECONDS`` (a positive number), else 30."""
    text = os.environ.get(INTERVAL_ENV, "")
    try:
        value = float(text) if text else DEFAULT_INTERVAL
    except ValueError:
        raise ValueError(f"{INTERVAL_ENV}={text!r}: expected a number of seconds > 0") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{INTERVAL_ENV}={text!r}: expected a number of seconds > 0")
    return value


def shown(enabled: bool | None = True) -> bool:
    """Whether a bar (or a :func:`note`) with this ``enabled`` is drawn: False inside ``enabled(False)``;
    None means "on a terminal or in a notebook" (in a log file or CI output a bar with ``enabled=None``
    prints plain lines at a steady interval instead, see the module's docstring; a note is not shown)."""
    if not _SHOWN[-1]:
        return False
    return _live() if enabled is None else bool(enabled)


def duration(seconds: float) -> str:
    """``seconds`` as ``"45s"``, ``"2m10s"`` or ``"1h05m"``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class _Discard:
    """A file that drops what is written: where a plain-line bar's own tqdm drawing goes."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


class PlainProgress(_console_tqdm):
    """A tqdm bar that draws nothing and prints, every ``interval`` seconds (from a daemon thread, so a
    stalled loop still reports its elapsed time), one plain line to stderr: ``desc: n/total units,
    elapsed, ETA`` (the ETA from the average rate since the start, over all of ``total``) and the bar's
    postfix; a last line at :meth:`close` when at least one line was printed. ``announce``: also a line
    at the start, and always the last one. Everything else is tqdm's (``update``, ``set_postfix``,
    iteration, ``total``, ``n``)."""

    def __init__(
        self, iterable: Iterable | None = None, *, interval: float, announce: bool = False, **kwargs: Any
    ) -> None:
        self._interval = float(interval)
        self._printed = 0
        self._announce = announce
        self._lock_lines = threading.Lock()
        self._stop = threading.Event()
        # every update reaches ``n`` at once (tqdm's iteration otherwise catches up only at a refresh); the
        # drawing it would trigger is a no-op (``display``) into a discarding file
        kwargs.update(file=_Discard(), mininterval=0, miniters=1)
        super().__init__(iterable, **kwargs)
        self._began = time.monotonic()
        if announce and not self.disable:
            self.print_line(start=True)
        if not self.disable:
            ref = weakref.ref(self)
            stop = self._stop
            threading.Thread(target=PlainProgress._tick, args=(ref, stop, self._interval), daemon=True).start()

    @staticmethod
    def _tick(ref: weakref.ref, stop: threading.Event, interval: float) -> None:
        while not stop.wait(interval):
            bar = ref()
            if bar is None:
                return
            bar.print_line()
            del bar

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        """Draw nothing (the plain lines are printed by :meth:`print_line`)."""
        return True

    def clear(self, nolock: bool = False) -> None:
        """Nothing to clear: nothing is drawn."""

    def line(self, final: bool = False, start: bool = False) -> str:
        """The plain progress line for the bar's state now (``start``: the first one, ``final``: the last)."""
        elapsed = time.monotonic() - self._began
        n, total, unit = self.n, self.total, self.unit or "it"
        plural = unit == "it" or (unit.endswith("s") and not unit.endswith("ss"))  # "steps" as is, "pass" → "passes"
        units = unit if plural else unit + ("es" if unit.endswith(("ch", "sh", "ss", "x")) else "s")
        count = f"{n:g}/{total:g}" if total else f"{n:g}"
        parts = [f"{count} {units}", f"{duration(elapsed)} elapsed"]
        done = n - (self.initial or 0)
        if final:
            parts[-1] = (
                f"done in {duration(elapsed)}" if not total or n >= total else f"stopped after {duration(elapsed)}"
            )
        elif start:
            parts[-1] = "started"
        elif total and done > 0 and n < total:
            parts.append(f"ETA {duration(elapsed / done * (total - n))}")
        text = f"{self.desc.rstrip(': ') or 'progress'}: {', '.join(parts)}"
        return text + (f" ({self.postfix})" if self.postfix else "")

    def print_line(self, final: bool = False, start: bool = False) -> None:
        """Print :meth:`line` to stderr (the daemon thread calls this every ``interval`` seconds)."""
        with self._lock_lines:
            print(self.line(final, start), file=sys.stderr, flush=True)
            self._printed += 1

    def close(self) -> None:
        """Stop the interval lines; print a last one when the work lasted long enough to print any."""
        if getattr(self, "_stop", None) is not None and not self._stop.is_set():
            self._stop.set()
            if (self._printed or self._announce) and not self.disable:
                self.print_line(final=True)
        super().close()


@boundary
def progress_bar(
    iterable: Iterable | None = None, *, enabled: bool | None = True, interval: float | None = None, **kwargs: Any
) -> _console_tqdm:
    """A progress bar (tqdm's interface, ``kwargs`` passed to it) over ``iterable`` (or none: ``update``
    it). ``enabled``: True, False, or None (the default of the library's long jobs and of the CLI): on a
    terminal or in a notebook a bar refreshed every 0.1 s; elsewhere (a log file, CI output) a
    :class:`PlainProgress` that prints a plain line to stderr every ``interval`` seconds (None:
    :func:`log_interval`) — with ``enabled=True`` also when it starts and ends. Nothing at all inside
    ``enabled(False)`` or with ``enabled=False``."""
    if _SHOWN[-1] and enabled is not False and not _live():
        wait = log_interval() if interval is None else interval
        kwargs.pop("mininterval", None)
        return PlainProgress(iterable, interval=wait, announce=enabled is True, **kwargs)
    kwargs.setdefault("mininterval", 0.1)
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
