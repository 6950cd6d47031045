"""Argument checks shared by every public entry point: one rule for indices, counts and strings,
so that every error names the argument, what was given and what is accepted."""

from __future__ import annotations

import operator
from typing import Any


def as_int(x: Any, what: str) -> int:
    """``x`` as a Python int when it is integer-like (int, numpy integer, 0-d integer tensor);
    bools, floats, strings and the rest raise a TypeError naming ``what``."""
    if isinstance(x, bool) or isinstance(x, str):
        raise TypeError(f"{what} must be an int, got {type(x).__name__} {x!r}")
    try:
        return operator.index(x)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(x).__name__} {x!r:.40}") from None


def check_index(i: Any, n: int, what: str, context: str, allow_end: bool = False) -> int:
    """``i`` (integer-like; negative counts from the end) as an index into ``n`` items, else an
    IndexError: ``"{what} {i} is out of range: {context} (0..n-1), negatives count from the end"``.
    ``allow_end`` also accepts ``n`` itself (an exclusive bound such as ``stop_at_layer``)."""
    j = as_int(i, what)
    k = j + n if j < 0 else j
    if not 0 <= k < n + allow_end:
        raise IndexError(f"{what} {j} is out of range: {context} (0..{n - 1 + allow_end}), negatives count from the end")
    return k


def check_count(k: Any, what: str, minimum: int = 1) -> int:
    """A count such as ``k``/``top``/``samples`` as an int ≥ ``minimum``, else a clear error."""
    j = as_int(k, what)
    if j < minimum:
        raise ValueError(f"{what} must be ≥ {minimum}, got {j}")
    return j


def check_str(x: Any, what: str, example: str, allow_blank: bool = False) -> str:
    """``x`` if it is a string (non-blank unless ``allow_blank``), else a clear error with an example."""
    if not isinstance(x, str):
        raise TypeError(f"{what} must be a string such as {example!r}, got {type(x).__name__} {x!r:.40}")
    if not allow_blank and not x.strip():
        raise ValueError(f"{what} is empty or blank; give e.g. {example!r}")
    return x


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
