"""Values summed per key and ranked by size: how a per-position circuit becomes one of whole edges,
for the circuits themselves (analysis) and for their views, which sit below the analysis layer."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import TypeVar

K = TypeVar("K", bound=Hashable)


def totals_by_size(keys: Sequence[K], values: Iterable[float]) -> tuple[list[K], list[float]]:
    """Each distinct key's values summed, the keys ordered by ``|total|``, largest first (ties keep the
    order in which the keys first appear).

    >>> totals_by_size(["a", "b", "a"], [1.0, -3.0, 1.5])
    (['b', 'a'], [-3.0, 2.5])
    """
    total: dict[K, float] = {}
    for k, v in zip(keys, values, strict=True):
        total[k] = total.get(k, 0.0) + float(v)
    order = sorted(total, key=lambda k: -abs(total[k]))
    return order, [total[k] for k in order]
