"""The result of an attribution: a :class:`~gpt2_interp.analysis.patching.PatchResult` whose values
are estimates, with the score its cells are ranked by and the run it came from (for :meth:`verify`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...core.boundary import boundary
from ...core.checks import check_count
from ...core.tables import format_table
from ..patching import PatchResult
from .verification import Verification, verify


@boundary
@dataclass
class AttributionResult(PatchResult):
    """An attribution estimate, shaped and labelled exactly like :class:`~.patching.PatchResult`.

    ``values`` / ``pair_values``: the *estimated* patched metric (baseline + estimated effect, or
    normalised like ``patch``). ``score`` (same shape as ``values``): what the cells are ranked by —
    ``|values − baseline|``, or for ``atp*`` with GradDrop the GradDrop magnitude
    ``mean_pairs (1/(L−1)) Σ_ℓ |Î_ℓ|`` (in the units of the effect). ``method``: ``atp``, ``atp*``
    or ``ig``; ``ig_steps`` and ``ig_path`` (``"input"`` or ``"activations"``) for IG, else None;
    ``graddrop``: whether ``score`` is GradDrop's. The other fields are :class:`~.patching.PatchResult`'s.
    """

    result_kind = "attribution"

    method: str = "atp"
    ig_steps: int | None = None
    ig_path: str | None = None
    graddrop: bool = False
    score: torch.Tensor | None = field(default=None, repr=False)
    _spec: dict | None = field(default=None, repr=False, compare=False)

    def table(self, k: int = 8) -> str:
        """Like ``PatchResult.table``, the ``k`` highest-ranked cells, the columns named as estimates
        (with GradDrop, its score as one more column)."""
        k = check_count(k, "k", minimum=0)
        steps = f" ({self.ig_steps} steps, {self.ig_path} path)" if self.method == "ig" else ""
        rank = "GradDrop score" if self.graddrop else "|estimated effect|"
        title = f"{self.method}{steps} estimate — " + self.heading("patching") + f"; highest-ranked cells (by {rank}):"
        if not self.graddrop or self.score is None:
            return "\n".join([title, *self.effect_rows(k, "estimated ")])
        header = [
            "cell (" + ", ".join("position" if n == "pos" else n for n in self.index_names) + ")",
            "estimated patched metric",
            "estimated effect (patched − baseline)",
            "GradDrop score",
        ]
        rows = [
            [self.label(idx), f"{v:+.4f}", f"{v - self.baseline:+.4f}", f"{float(self.score[idx]):.4f}"]
            for idx, v in self.top(k)
        ]
        return "\n".join([title, *format_table(header, rows, right=[False, True, True, True])])

    def top(self, k: int = 5) -> list[tuple[tuple[int, ...], float]]:
        """The ``k`` cells ranked highest by :attr:`score`, as ``((layer, pos|head, ...), value)``."""
        k = check_count(k, "k", minimum=0)
        flat = self.values.flatten()
        score = (flat - self.baseline).abs() if self.score is None else self.score.flatten()
        idx = score.topk(min(k, flat.numel())).indices
        return [(tuple(int(i) for i in torch.unravel_index(j, self.values.shape)), float(flat[j])) for j in idx]

    def verify(
        self,
        k: int = 20,
        candidates: int | None = None,
        controls: int = 20,
        seed: int = 0,
        batch_size: int | None = None,
        progress: bool | None = None,
        exact: PatchResult | None = None,
    ) -> Verification:
        """Exact batched patching of this estimate's top cells and a random control sample; see :func:`verify`
        (``k``, ``candidates``, ``controls``, ``seed``, ``batch_size``, ``progress`` and ``exact`` as there)."""
        return verify(
            self,
            k=k,
            candidates=candidates,
            controls=controls,
            seed=seed,
            batch_size=batch_size,
            progress=progress,
            exact=exact,
        )


__all__ = ["AttributionResult"]
