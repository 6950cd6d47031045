"""Argument checks shared by every public entry point: one rule for indices, counts and strings,
so that every error names the argument, what was given and what is accepted."""

from __future__ import annotations

import operator
import os
from pathlib import Path
from typing import Any, Literal

from .boundary import boundary


def as_int(x: Any, what: str) -> int:
    """``x`` as a Python int when it is integer-like (int, numpy integer, 0-d integer tensor);
    bools, floats, strings and the rest raise a TypeError naming ``what``."""
    if isinstance(x, (bool, str)):
        raise TypeError(f"{what} must be an int, got {type(x).__name__} {x!r}")
    try:
        return operator.index(x)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(x).__name__} {x!r:.40}") from None


@boundary
def check_index(i: Any, n: int, what: str, context: str, allow_end: bool = False) -> int:
    """``i`` (integer-like; negative counts from the end) as an index into ``n`` items, else an
    IndexError: ``"{what} {i} is out of range: {context} (0..n-1), negatives count from the end"``.
    ``allow_end`` also accepts ``n`` itself (an exclusive bound such as ``stop_at_layer``)."""
    j = as_int(i, what)
    k = j + n if j < 0 else j
    if not 0 <= k < n + allow_end:
        raise IndexError(
            f"{what} {j} is out of range: {context} (0..{n - 1 + allow_end}), negatives count from the end"
        )
    return k


@boundary
def check_count(k: Any, what: str, minimum: int = 1) -> int:
    """A count such as ``k``/``top``/``samples`` as an int ≥ ``minimum`` (default 1), else a clear error
    naming ``what``: anything not integer-like (bool, float, string) raises ``TypeError``, a value
    below ``minimum`` raises ``ValueError``."""
    j = as_int(k, what)
    if j < minimum:
        raise ValueError(f"{what} must be ≥ {minimum}, got {j}")
    return j


@boundary
def check_str(x: Any, what: str, example: str, allow_blank: bool = False) -> str:
    """``x`` if it is a string (non-blank unless ``allow_blank``), else a clear error naming ``what`` and
    showing ``example``: a non-string raises ``TypeError``, an empty or blank one ``ValueError``."""
    if not isinstance(x, str):
        raise TypeError(f"{what} must be a string such as {example!r}, got {type(x).__name__} {x!r:.40}")
    if not allow_blank and not x.strip():
        raise ValueError(f"{what} is empty or blank; give e.g. {example!r}")
    return x


@boundary
def check_number(
    x: Any,
    what: str,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``x`` as a finite float within ``[low, high]`` (``low_open``/``high_open``: the bound itself is
    excluded), else an error naming ``what``: NaN and ±inf are refused (a comparison with NaN is
    always false, so a range check alone lets it through), as are bools and non-numbers."""
    if isinstance(x, bool) or (not isinstance(x, (int, float)) and not hasattr(x, "__float__")):
        raise TypeError(f"{what} must be a number, got {type(x).__name__} {x!r:.40}")
    value = float(x)
    if value != value or abs(value) == float("inf"):  # NaN or ±inf
        raise ValueError(f"{what} must be a finite number, got {value}")
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        if low is not None and high is not None:
            rng = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        elif low is not None:
            rng = f"{'>' if low_open else '≥'} {low:g}"
        else:
            rng = f"{'<' if high_open else '≤'} {high:g}"
        raise ValueError(f"{what} must be {rng}, got {value:g}")
    return value


@boundary
def check_choice(x: Any, what: str, choices: tuple[str, ...]) -> str:
    """``x`` if it is one of ``choices``, else a ValueError naming ``what`` and listing them."""
    if not isinstance(x, str) or x not in choices:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, choices))}, got {x!r}")
    return x


def as_index_list(items: Any, argument: str, accepted: str = "a list of ints") -> list[Any]:
    """``items`` (a list, tuple, range, array or 1-d tensor of indices) as a list, else a TypeError
    naming ``argument``: a bare int, float or string is not a list of indices."""
    if isinstance(items, (str, bytes)) or not hasattr(items, "__iter__") or getattr(items, "ndim", 1) == 0:
        raise TypeError(f"{argument} must be {accepted}, got {type(items).__name__} {items!r:.40}")
    return list(items)


def check_indices(items: Any, n: int, what: str, argument: str, context: str) -> list[int]:
    """Each index of the argument ``argument`` (see :func:`as_index_list`) checked by :func:`check_index`
    (``what``: one index, e.g. ``"layer"`` for ``layers``); errors keep its wording and add the argument."""
    given, out = as_index_list(items, argument), []
    for i in given:
        try:
            out.append(check_index(i, n, what, context))
        except (TypeError, IndexError) as e:
            raise type(e)(f"{e} (in {argument}={given!r:.60})") from None
    return out


def as_selection(x: Any, argument: str) -> Any:
    """A selection argument such as ``positions``/``heads``: None and strings (``"all"``, checked by
    the caller) as given, anything else as a list (:func:`as_index_list`; a bare number is refused)."""
    if x is None or isinstance(x, str):
        return x
    return as_index_list(x, argument, "a list of ints, None or 'all'")


@boundary
def check_prompts(prompts: Any, what: str = "prompts") -> list[str]:
    """``prompts`` (one string, or a sequence of strings) as a list of strings, else a TypeError naming
    ``what``, the index of the first bad element and its type (an empty sequence is a ValueError)."""
    if isinstance(prompts, str):
        return [prompts]
    if isinstance(prompts, (bytes, dict, set)) or not hasattr(prompts, "__iter__"):
        raise TypeError(f"{what} must be a string or a list of strings, got {type(prompts).__name__} {prompts!r:.40}")
    items = list(prompts)
    if not items:
        raise ValueError(f"no {what}: {what} is empty; give a prompt or a non-empty list of prompts")
    for i, p in enumerate(items):
        if not isinstance(p, str):
            raise TypeError(f"{what}[{i}] must be a string, got {type(p).__name__} {p!r:.40}")
    return items


_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+=,@")


def check_path_name(x: Any, what: str) -> str:
    """``x`` if it can be one folder or file name inside a folder the library writes to (a tag, a key):
    letters, digits and ``. _ - + = , @``, not ``.`` or ``..``; else a ValueError naming ``what``, so that
    no name places a file outside its folder."""
    check_str(x, what, "run-1")
    bad = sorted(set(x) - _NAME_CHARS)
    if bad or x in (".", ".."):
        raise ValueError(
            f"{what} {x!r} cannot name a folder inside the output folder"
            + (f" (it holds {''.join(bad)!r})" if bad else "")
            + "; use letters, digits and . _ - + = , @"
        )
    return x


def check_index_list(items: Any, n: int, what: str, argument: str, context: str) -> list[int]:
    """A non-empty list of indices (:func:`check_indices`) that is not a boolean mask: a bool array or tensor
    (or a list of bools) is refused with a TypeError naming ``argument`` and how to turn the mask into
    indices, an empty list with a ValueError naming ``argument``."""
    dtype = getattr(items, "dtype", None)
    if dtype is not None and str(dtype) in ("bool", "torch.bool"):
        raise TypeError(
            f"{argument} must be a list of {what} indices, got a boolean mask of shape {tuple(items.shape)}; "
            "give the indices where it is true (mask.nonzero())"
        )
    given = as_index_list(items, argument)
    if not given:
        raise ValueError(f"{argument} is empty: give at least one {what} ({context})")
    if any(isinstance(i, (bool,)) or str(getattr(i, "dtype", "")) in ("bool", "torch.bool") for i in given):
        raise TypeError(f"{argument} must be a list of {what} indices, got booleans {given!r:.60}")
    return check_indices(given, n, what, argument, context)


def check_token_windows(windows: Any, what: str = "windows") -> Any:
    """``windows`` if it is a 2-d integer tensor of token ids ``[n, pos]`` with at least one row and one
    column, else an error naming ``what``: a TypeError for anything but an integer tensor (texts, floats), a
    ValueError for another number of dimensions or an empty tensor."""
    import torch

    if not isinstance(windows, torch.Tensor) or windows.is_floating_point() or windows.dtype == torch.bool:
        got = type(windows).__name__ if not isinstance(windows, torch.Tensor) else f"a {windows.dtype} tensor"
        raise TypeError(f"{what} must be an integer tensor of token ids [n, pos] (token_windows), got {got}")
    if windows.ndim != 2:
        raise ValueError(
            f"{what} must be token windows [n, pos], got shape {tuple(windows.shape)}"
            + ("; one window is windows[None]" if windows.ndim == 1 else "")
        )
    if not windows.numel():
        raise ValueError(f"{what} is empty (shape {tuple(windows.shape)}): give at least one window of tokens")
    return windows


@boundary
def check_writable(path: str | os.PathLike[str], what: str, kind: Literal["file", "dir"] = "file") -> Path:
    """``path`` as a :class:`~pathlib.Path` if the library can write there, else a ValueError naming ``what``
    (the argument or flag, e.g. ``"--out"``) and the reason — checked before any work, creating nothing.
    ``kind`` ``"file"``: a file (an existing one must be writable; else the nearest existing folder above it,
    where the missing folders would be created); ``"dir"``: a folder (created if missing, likewise)."""
    p = Path(path).expanduser()
    if p.exists():
        if kind == "file" and p.is_dir():
            raise ValueError(f"{what} {path} is a directory; give a file path")
        if kind == "dir" and not p.is_dir():
            raise ValueError(f"{what} {path} is a file; give a folder")
        if p.is_file():
            try:
                with open(p, "ab"):  # opened for writing, nothing written
                    pass
            except OSError as e:
                raise ValueError(f"{what} {path} cannot be written ({e.strerror})") from None
            return p
        parent = p  # an existing folder
    else:
        parent = p.parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            raise ValueError(f"{what} {path} cannot be written: {parent} is a file, not a folder")
    import tempfile

    try:  # the one test that holds for every user (root too) and file system (read-only mounts, /proc)
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".gpt2-interp-write-check-"):
            pass
    except OSError as e:
        raise ValueError(f"{what} {path} cannot be written: cannot create files in {parent} ({e.strerror})") from None
    return p
