"""Non-finite values (NaN, ±inf): one way to describe them, refuse them, or warn about them."""

from __future__ import annotations

import torch

from .boundary import boundary


class NonFiniteWarning(RuntimeWarning):
    """NaN or inf values appeared where a number was expected (e.g. introduced by a user's hook)."""


def nonfinite_summary(t: torch.Tensor) -> str:
    """``"2 NaN, 1 inf of 768 values"`` for a float tensor (empty string when all are finite)."""
    if not t.is_floating_point() and not t.is_complex():
        return ""
    nan = int(torch.isnan(t).sum())
    inf = int(torch.isinf(t).sum())
    if nan == 0 and inf == 0:
        return ""
    parts = ([f"{nan} NaN"] if nan else []) + ([f"{inf} inf"] if inf else [])
    return f"{', '.join(parts)} of {t.numel()} values"


@boundary
def is_finite(t: torch.Tensor) -> bool:
    """True when every value of ``t`` is finite (always True for integer tensors).

    Fast path: NaN and ±inf propagate into a float32 sum, which costs one cheap reduction (a full
    ``isfinite`` pass is ~10× slower on CPU); only when the sum is not finite (which a finite tensor
    can reach only by overflow) is every element checked."""
    if not t.is_floating_point() and not t.is_complex():
        return True
    if t.numel() == 0:
        return True
    if bool(torch.isfinite(t.sum(dtype=torch.float32 if t.is_floating_point() else None))):
        return True
    return bool(torch.isfinite(t).all())


@boundary
def require_finite(t: torch.Tensor, what: str, hint: str = "") -> torch.Tensor:
    """Return ``t`` unchanged, or raise a ValueError saying that ``what`` holds NaN/inf (and how many),
    followed by ``hint`` (what to try) when one is given.

    >>> require_finite(torch.tensor([1.0, float("nan")]), "metric on the clean run")
    Traceback (most recent call last):
    ValueError: metric on the clean run is not finite (1 NaN of 2 values)
    """
    if not is_finite(t):
        raise ValueError(f"{what} is not finite ({nonfinite_summary(t)}){'; ' + hint if hint else ''}")
    return t
