"""How an attribution estimate agrees with exact patching: rank correlation (:func:`spearman`, scipy's),
top-``k`` cells (:func:`top_cells`), recall, and the comparison over every cell (:func:`agreement`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ...core.boundary import boundary
from ...core.checks import check_count
from ...core.result import Result
from ..patching import PatchResult

if TYPE_CHECKING:
    from .result import AttributionResult


@boundary
def spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    """Spearman rank correlation of two flat tensors (``scipy.stats.spearmanr``: ties get their
    average rank); NaN for fewer than two values or a constant input."""
    x, y = x.flatten().double(), y.flatten().double()
    if x.numel() != y.numel():
        raise ValueError(f"spearman needs two tensors of one size, got {x.numel()} and {y.numel()}")
    if x.numel() < 2 or bool((x == x[0]).all()) or bool((y == y[0]).all()):
        return float("nan")  # undefined (scipy would warn and return NaN)
    from scipy.stats import spearmanr  # scipy.stats takes a while to import: only when a correlation is asked for

    return float(spearmanr(x.cpu().numpy(), y.cpu().numpy())[0])


@boundary
def top_cells(score: torch.Tensor, k: int) -> list[tuple[int, ...]]:
    """The ``k`` cells with the largest ``score`` (index tuples into its shape)."""
    k = check_count(k, "k", minimum=0)
    idx = score.flatten().topk(min(k, score.numel())).indices
    return [tuple(int(i) for i in torch.unravel_index(j, score.shape)) for j in idx]


@boundary
def recall(predicted: Sequence[tuple[int, ...]], truth: Sequence[tuple[int, ...]]) -> float:
    """Share of the ``truth`` cells found among ``predicted``."""
    return len(set(predicted) & set(truth)) / max(len(truth), 1)


@boundary
@dataclass
class Agreement(Result):
    """How an attribution estimate agrees with an exact patching sweep over all cells.

    ``method`` and ``hook``: the estimate's; ``n_cells``: cells compared; ``spearman``: rank
    correlation of the signed effects (value − baseline); ``spearman_abs``: of the exact
    ``|effect|`` against the estimate's ranking score; ``recall``: the share of the exact top-``k``
    (by ``|effect|``) among the estimate's top-``k`` (by score); ``estimate``/``exact``
    ``[n_cells]``: the flattened effects."""

    result_kind = "agreement"

    method: str
    hook: str
    n_cells: int
    spearman: float  # of the effects (value − baseline), signed
    spearman_abs: float  # of |effect| against the estimate's ranking score
    k: int
    recall: float  # exact top-k (by |effect|) among the estimate's top-k (by score)
    estimate: torch.Tensor = field(repr=False)
    exact: torch.Tensor = field(repr=False)

    def plot(self, **kwargs: Any):
        from ...plots.attribution import plot_estimate_vs_exact

        return plot_estimate_vs_exact(
            self.estimate.numpy(),
            self.exact.numpy(),
            title=f"{self.method} vs exact patching, {self.hook} (ρ = {self.spearman:.3f})",
            **kwargs,
        )

    def table(self) -> str:
        """One line: cells, Spearman ρ (signed and of ``|effect|``) and top-``k`` recall."""
        return (
            f"{self.method} on {self.hook}: {self.n_cells} cells, Spearman ρ {self.spearman:.3f} "
            f"(|effect| {self.spearman_abs:.3f}), top-{self.k} recall {self.recall:.0%}"
        )


@boundary
def agreement(estimate: AttributionResult, exact: PatchResult, k: int = 20) -> Agreement:
    """Compare an estimate with an exact sweep of the same cells: Spearman ρ of the effects and the
    share of the exact top-``k`` cells (largest ``|effect|``) among the estimate's top-``k`` (default
    20). ``estimate`` and ``exact`` must cover the same cells (ValueError otherwise); ``k`` < 1
    raises ValueError."""
    k = check_count(k, "k")
    if estimate.values.shape != exact.values.shape:
        raise ValueError(
            f"estimate {tuple(estimate.values.shape)} and exact {tuple(exact.values.shape)} cover different cells"
        )
    est = estimate.values - estimate.baseline
    ex = exact.values - exact.baseline
    score = est.abs() if estimate.score is None else estimate.score
    return Agreement(
        estimate.method,
        estimate.hook,
        est.numel(),
        spearman(est, ex),
        spearman(score, ex.abs()),
        k,
        recall(top_cells(score, k), top_cells(ex.abs(), k)),
        est.flatten().float(),
        ex.flatten().float(),
    )


__all__ = ["Agreement", "agreement", "recall", "spearman", "top_cells"]
