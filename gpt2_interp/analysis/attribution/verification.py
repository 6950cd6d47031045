"""Exact verification of an attribution estimate: batched patching (:func:`~gpt2_interp.analysis.patching.patch`)
of its top cells and a random control sample (:func:`verify`), compared in a :class:`Verification`."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ...core.checks import check_count
from ...core.result import Result
from ..hook_targets import is_full_name
from ..patching import PatchResult, patch
from .compare import recall, spearman, top_cells

if TYPE_CHECKING:
    from .result import AttributionResult


@dataclass
class Verification(Result):
    """Exact patching of an estimate's top cells (and random controls).

    ``cells``: the verified cells (index tuples into the estimate's ``values``); ``estimate``,
    ``exact``: their effects (value − baseline) by each; ``kind``: ``"top"`` (the estimate's
    ``candidates`` best) or ``"control"`` (random others). ``verified_top``: the ``k`` cells with the
    largest exact ``|effect|`` among those verified — the answer to use; ``spearman``: rank correlation
    of estimate and exact over every verified cell; ``recall``: the share of ``verified_top`` already
    in the estimate's top-``k``; ``controls_above``: controls whose exact ``|effect|`` beats the
    ``k``-th of ``verified_top`` (a false-negative warning: the estimate missed them).
    """

    method: str
    hook: str
    k: int
    cells: list[tuple[int, ...]]
    labels: list[str]
    kind: list[str]
    estimate: torch.Tensor
    exact: torch.Tensor
    verified_top: list[tuple[int, ...]]
    spearman: float
    recall: float
    controls_above: int

    def plot(self, **kwargs: Any):
        from ...plots.attribution import plot_verification

        top = [c == "top" for c in self.kind]
        return plot_verification(
            self.estimate.numpy(),
            self.exact.numpy(),
            top,
            self.labels,
            title=f"{self.method} estimate vs exact patching, {self.hook}: "
            f"ρ = {self.spearman:.3f}, top-{self.k} recall {self.recall:.0%}",
            **kwargs,
        )

    def table(self) -> str:
        lines = [
            f"verified {self.kind.count('top')} top cells + {self.kind.count('control')} controls of {self.method} "
            f"on {self.hook}: Spearman ρ {self.spearman:.3f}, top-{self.k} recall {self.recall:.0%}, "
            f"{self.controls_above} control(s) above the {self.k}-th exact effect",
            f"  {'cell':<28} {'estimate':>10} {'exact':>10}",
        ]
        order = self.exact.abs().argsort(descending=True)
        for i in order[: self.k].tolist():
            lines.append(
                f"  {self.labels[i]:<28} {float(self.estimate[i]):>+10.4f} {float(self.exact[i]):>+10.4f}"
                f"{'  (control)' if self.kind[i] == 'control' else ''}"
            )
        return "\n".join(lines)


def cell_label(result: PatchResult, cell: tuple[int, ...]) -> str:
    """``"L3 ' Paris' H2"``-style label of a cell of a patching/attribution result."""
    parts = [result.layer_labels[cell[0]]]
    pos_labels, head_labels = result.position_labels or [], result.head_labels or []  # set where indexed
    for name, i in zip(result.index_names[1:], cell[1:]):
        parts.append(repr(pos_labels[i]) if name == "pos" else head_labels[i])
    return " ".join(parts)


def verify(
    result: AttributionResult,
    k: int = 20,
    candidates: int | None = None,
    controls: int = 20,
    seed: int = 0,
    batch_size: int | None = None,
    progress: bool | None = None,
    exact: PatchResult | None = None,
) -> Verification:
    """Run exact batched patching (:func:`~.patching.patch`) on the estimate's top ``candidates``
    cells (default ``2k``) and ``controls`` random other cells, and compare.

    Cells are patched one layer at a time (``patch`` restricted to that layer and the positions and
    heads of its cells), on the same prompt pairs, metric, direction and normalisation. ``exact``:
    a full exact sweep of the same cells (``patch`` with the same arguments) when one is at hand —
    the cells are then looked up in it instead of patched again (the same values, no extra runs)."""
    k = check_count(k, "k")
    cand = 2 * k if candidates is None else max(k, check_count(candidates, "candidates"))
    controls = check_count(controls, "controls", minimum=0)
    spec = result._spec
    if exact is not None:
        if exact.values.shape != result.values.shape or exact.index_names != result.index_names:
            raise ValueError(
                f"exact covers {exact.index_names} {tuple(exact.values.shape)}, the estimate "
                f"{result.index_names} {tuple(result.values.shape)}: pass patch() run with the same arguments"
            )
    elif spec is None:
        raise ValueError("this result carries no run to verify (was it loaded from JSON?); call attribute() again")
    score = (result.values - result.baseline).abs() if result.score is None else result.score
    top = top_cells(score, cand)
    chosen = set(top)
    rest = [
        c
        for c in (
            tuple(int(i) for i in torch.unravel_index(torch.tensor(j), score.shape)) for j in range(score.numel())
        )
        if c not in chosen
    ]
    ctrl = random.Random(seed).sample(rest, min(controls, len(rest)))
    cells = top + ctrl
    if exact is None:
        ex = torch.tensor(_exact_cells(result, cells, batch_size, progress)) - result.baseline
    else:
        ex = torch.stack([exact.values[c] for c in cells]).float() - exact.baseline
    est = torch.stack([result.values[c] for c in cells]) - result.baseline
    by_exact = ex.abs().argsort(descending=True)[:k].tolist()
    verified_top = [cells[i] for i in by_exact]
    kth = float(ex.abs()[by_exact[-1]]) if by_exact else float("inf")
    n_top = len(top)
    return Verification(
        method=result.method,
        hook=result.hook,
        k=k,
        cells=cells,
        labels=[cell_label(result, c) for c in cells],
        kind=["top"] * n_top + ["control"] * len(ctrl),
        estimate=est.float(),
        exact=ex.float(),
        verified_top=verified_top,
        spearman=spearman(est, ex),
        recall=recall(top[:k], verified_top),
        controls_above=int((ex[n_top:].abs() > kth).sum()),
    )


def _exact_cells(
    result: AttributionResult, cells: list[tuple[int, ...]], batch_size: int | None, progress: bool | None
) -> list[float]:
    """Exact patched metric of each cell, by one ``patch`` call per group of cells (:func:`_groups`)."""
    spec = result._spec
    assert spec is not None, "verify refuses a result without its run's arguments"
    got: dict[tuple[int, ...], float] = {}
    for key, cs in _groups(result.index_names, cells).items():
        kw = _patch_args(result, key, cs)
        r = patch(
            spec["model"],
            spec["clean"],
            spec["corrupted"],
            spec["metric"],
            batch_size=batch_size,
            progress=progress,
            **kw,
        )
        for c in cs:
            got[c] = float(r.values[_index_in(result, c, kw)])
    return [got[c] for c in cells]


def _groups(names: tuple[str, ...], cells: list[tuple[int, ...]]) -> dict[tuple[int, ...], list[tuple[int, ...]]]:
    """Cells grouped for ``patch`` calls: one group per layer (its positions × heads grid), or for
    ``[layer, pos, head]`` cells one per (layer, position) when that patches fewer rows than the
    layer's grid (each call also pays two unpatched runs)."""
    groups: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for c in cells:
        groups.setdefault(c[:1], []).append(c)
    if names != ("layer", "pos", "head"):
        return groups
    regrouped: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for key, cs in groups.items():
        ps, hs = {c[1] for c in cs}, {c[2] for c in cs}
        if len(cs) + 2 * len(ps) < len(ps) * len(hs) + 2:
            for c in cs:
                regrouped.setdefault(c[:2], []).append(c)
        else:
            regrouped[key] = cs
    return regrouped


def _patch_args(result: AttributionResult, key: tuple[int, ...], cs: list[tuple[int, ...]]) -> dict[str, Any]:
    """The ``patch`` arguments that sweep the cells ``cs`` (of layer ``key[0]``): the estimate's own
    hook, direction and normalisation, restricted to that layer and the cells' positions and heads."""
    spec, names = result._spec, result.index_names
    assert spec is not None, "verify refuses a result without its run's arguments"
    kw: dict[str, Any] = dict(hook=spec["hook"], direction=spec["direction"], normalize=spec["normalize"])
    if not is_full_name(spec["hook"]) and result.layers[key[0]] >= 0:
        kw["layers"] = [result.layers[key[0]]]
    if names == ("layer", "pos"):
        kw["positions"] = "all" if result.positions is None else sorted({result.positions[c[1]] for c in cs})
    elif names == ("layer", "head"):
        kw["heads"] = "all" if result.heads is None else sorted({result.heads[c[1]] for c in cs})
    else:
        positions = result.positions
        kw["positions"] = "all" if positions is None else sorted({positions[c[1]] for c in cs})
        kw["heads"] = "all" if result.heads is None else sorted({result.heads[c[2]] for c in cs})
    return kw


def _index_in(result: AttributionResult, cell: tuple[int, ...], kw: dict[str, Any]) -> tuple[int, ...]:
    """Where the estimate's ``cell`` sits in the values of ``patch(**kw)`` (:func:`_patch_args`)."""
    j = [0]
    for name, i in zip(result.index_names[1:], cell[1:]):
        if name == "pos":
            j.append(0 if result.positions is None else kw["positions"].index(result.positions[i]))
        else:
            j.append(0 if result.heads is None else kw["heads"].index(result.heads[i]))
    return tuple(j)


__all__ = ["Verification", "cell_label", "verify"]
