"""Exact verification of an attribution estimate: batched patching (:func:`~gpt2_interp.analysis.patching.patch`)
of its top cells and a random control sample (:func:`verify`), compared in a :class:`Verification`."""

from __future__ import annotations

import random
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ...core.boundary import boundary
from ...core.checks import check_count
from ...core.progress import note, progress_bar
from ...core.result import Result
from ...core.tables import format_table
from ..engine import Work
from ..hook_targets import is_full_name
from ..patching import PatchResult, pair_tokens, patch, sweep_work
from .compare import recall, spearman, top_cells
from .cost import CostWarning

if TYPE_CHECKING:
    from .result import AttributionResult


@boundary
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
    ``method`` and ``hook``: the estimate's; ``labels``: a readable label per cell (:func:`cell_label`).
    """

    result_kind = "verification"

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
        """The agreement, then the ``k`` cells with the largest exact effect under a header naming the
        columns: the cell, its effect by the estimate and by exact patching (patched − baseline, in
        the metric's units), and whether it was a top cell of the estimate or a random control."""
        title = (
            f"verified {self.kind.count('top')} top cells + {self.kind.count('control')} controls of {self.method} "
            f"on {self.hook}: Spearman ρ {self.spearman:.3f}, top-{self.k} recall {self.recall:.0%}, "
            f"{self.controls_above} control(s) above the {self.k}-th exact effect"
        )
        order = self.exact.abs().argsort(descending=True)
        rows = [
            [self.labels[i], f"{float(self.estimate[i]):+.4f}", f"{float(self.exact[i]):+.4f}", self.kind[i]]
            for i in order[: self.k].tolist()
        ]
        header = ["cell", "estimated effect", "exact effect", "chosen as"]
        return "\n".join([title, *format_table(header, rows, right=[False, True, True, False])])


@boundary
def cell_label(result: PatchResult, cell: tuple[int, ...]) -> str:
    """``"L3 ' Paris' H2"``-style label of a cell of a patching/attribution result."""
    parts = [result.layer_labels[cell[0]]]
    pos_labels, head_labels = result.position_labels or [], result.head_labels or []  # set where indexed
    for name, i in zip(result.index_names[1:], cell[1:]):
        parts.append(repr(pos_labels[i]) if name == "pos" else head_labels[i])
    return " ".join(parts)


@boundary
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
    the cells are then looked up in it instead of patched again (the same values, no extra runs).

    ``result``: an :class:`~.result.AttributionResult` returned by ``attribute`` in this process;
    ``k`` (default 20): the size of the verified top set; ``controls`` (default 20) random cells
    drawn with ``seed``; ``batch_size`` and ``progress`` go to ``patch``. Refused (ValueError):
    ``k`` or ``candidates`` < 1, negative ``controls``, an ``exact`` sweep of other cells, and a
    result that carries no run (loaded from JSON) without ``exact``.

    Before patching, the verification's work (:func:`verification_work`) is compared with the full
    exact sweep's (:func:`~.patching.sweep_work`): when the full sweep costs no more — few cells
    per group, each group paying its own two unpatched runs — it runs instead (the cells are
    looked up in it) and a :class:`~.cost.CostWarning` states both costs."""
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
        exact = _full_sweep_if_cheaper(result, cells, batch_size, progress)
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


def verification_work(result: AttributionResult, cells: list[tuple[int, ...]]) -> tuple[Work, Work]:
    """``(verification, full sweep)``: the :class:`~..engine.Work` of exactly patching ``cells`` (one
    ``patch`` call per group, :func:`_groups`) and of the full exact sweep of the estimate's cells,
    over all its prompt pairs, counted before running."""
    spec = result._spec
    assert spec is not None
    model = spec["model"]
    n_pairs, P = pair_tokens(model, spec["clean"], spec["corrupted"])[0].shape
    parts = [
        sweep_work(
            model, P, **{k: v for k, v in _patch_args(result, key, cs).items() if k not in ("direction", "normalize")}
        )
        for key, cs in _groups(result.index_names, cells).items()
    ]
    full = sweep_work(model, P, spec["hook"], spec["layers"], spec["positions"], spec["heads"])
    ver = Work(
        f"exact patching of {len(cells)} cells",
        n_pairs * sum(w.runs for w in parts),
        n_pairs * sum(w.tokens for w in parts),
        n_pairs * sum(w.passes for w in parts),
    )
    return ver, Work(
        f"the full exact sweep of {spec['hook']}", n_pairs * full.runs, n_pairs * full.tokens, n_pairs * full.passes
    )


def _full_sweep_if_cheaper(
    result: AttributionResult, cells: list[tuple[int, ...]], batch_size: int | None, progress: bool | None
) -> PatchResult | None:
    """The full exact sweep when it costs no more than patching ``cells`` group by group (warned, with
    both costs); else None (the cells are patched by :func:`_exact_cells`)."""
    ver, full = verification_work(result, cells)
    note(f"{ver.line()}; {full.what}: ≈ {full.passes:.1f} forward passes", enabled=progress)
    if full.passes > ver.passes:
        return None
    warnings.warn(
        f"{ver.what} costs ≈ {ver.passes:.1f} forward passes, {full.what} ≈ {full.passes:.1f} "
        f"({ver.passes / max(full.passes, 1e-9):.1f}× as much): running the full sweep instead",
        CostWarning,
        stacklevel=4,
    )
    spec = result._spec
    assert spec is not None
    return patch(
        spec["model"],
        spec["clean"],
        spec["corrupted"],
        spec["metric"],
        hook=spec["hook"],
        layers=spec["layers"],
        positions=spec["positions"],
        heads=spec["heads"],
        direction=spec["direction"],
        normalize=spec["normalize"],
        batch_size=batch_size,
        progress=progress,
    )


def _exact_cells(
    result: AttributionResult, cells: list[tuple[int, ...]], batch_size: int | None, progress: bool | None
) -> list[float]:
    """Exact patched metric of each cell, by one ``patch`` call per group of cells (:func:`_groups`),
    under one progress bar over the groups."""
    spec = result._spec
    assert spec is not None, "verify refuses a result without its run's arguments"
    got: dict[tuple[int, ...], float] = {}
    groups = _groups(result.index_names, cells)
    for key, cs in progress_bar(groups.items(), total=len(groups), desc="verifying", leave=False, enabled=progress):
        kw = _patch_args(result, key, cs)
        r = patch(
            spec["model"],
            spec["clean"],
            spec["corrupted"],
            spec["metric"],
            batch_size=batch_size,
            progress=False,
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


__all__ = ["Verification", "cell_label", "verification_work", "verify"]
