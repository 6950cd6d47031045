"""``attribute``: a whole patching sweep estimated from gradients, in named steps — check the
options, resolve the cells, run the chunks of prompt pairs through the method's estimator
(:mod:`.atp`, :mod:`.ig`), and assemble a :class:`~.result.AttributionResult` shaped like ``patch``'s."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch

from ...core.boundary import boundary
from ...core.checks import as_selection, check_count
from ...core.finite import NonFiniteWarning, is_finite, nonfinite_summary
from ...core.progress import note, progress_bar
from ..engine import timed
from ..metrics import Metric, bind_metric, metric_name, refuse_degenerate
from ..patching import Prompts, normalize_effects, pair_tokens, position_labels, result_fields, sweep_work
from .atp import estimate_atp, qk_names
from .cells import resolve_family, select
from .cost import check_cost, estimate_passes, estimate_work
from .ig import estimate_ig, ig_names
from .plan import Chunk, ChunkEstimate, Sweep, unpatched_runs
from .readout import Readout
from .result import AttributionResult

if TYPE_CHECKING:
    from ...model import HookedGPT2

ATTRIBUTION_METHODS = ("atp", "atp*", "ig")


@boundary
def attribute(
    model: HookedGPT2,
    clean: Prompts,
    corrupted: Prompts,
    metric: Metric,
    hook: str = "resid_pre",
    method: Literal["atp", "atp*", "ig"] = "atp",
    ig_steps: int = 5,
    layers: Sequence[int] | None = None,
    positions: Sequence[int] | Literal["all"] | None = None,
    heads: Sequence[int] | Literal["all"] | None = None,
    direction: Literal["denoise", "noise"] = "denoise",
    normalize: bool = False,
    graddrop: bool | None = None,
    batch_size: int | None = None,
    progress: bool | None = None,
    ig_path: Literal["input", "activations"] = "input",
) -> AttributionResult:
    """Estimate a whole :func:`~.patching.patch` sweep from gradients (see the package docstring).

    Arguments mean what they mean for ``patch`` (``hook``: ``resid_pre|resid_mid|resid_post|attn_out|
    mlp_out`` per position, ``z|q|k|v|pattern`` per head, or one of their hook names; ``layers``,
    ``positions``, ``heads``, ``direction``, ``normalize``), and the result has ``patch``'s axes and
    labels. ``method``: ``"atp"``, ``"atp*"`` (QK fix for ``q``/``k``; GradDrop ranking unless
    ``graddrop=False``) or ``"ig"`` (``ig_steps`` points on the input-embedding path, or with
    ``ig_path="activations"`` on each layer's own activations; see the package docstring).
    ``batch_size``: prompt pairs per pass (default: all at once). ``metric`` must be finite on the
    clean and corrupted runs and differentiable in the logits (else a ValueError naming it).
    ``progress``: a progress bar over the chunks of pairs.

    Returns an :class:`~.result.AttributionResult`: ``values`` ``[layer, pos]``, ``[layer, head]`` or
    ``[layer, pos, head]`` as ``patch`` would give, holding estimates; :meth:`~.result.AttributionResult.verify`
    checks its top cells by exact patching. Cells whose estimate is not finite are kept as NaN/inf
    with a ``NonFiniteWarning``.

    Refused before any work (ValueError): an unknown ``method``, ``direction`` or ``ig_path``,
    ``ig_steps`` < 1, ``ig_path`` without ``method="ig"``, ``graddrop`` without ``"atp*"``,
    ``batch_size`` < 1, and the prompt, hook and metric refusals of ``patch``.

    Before any pass the estimate's cost and the exact sweep's are counted (:mod:`.cost`, in forward
    passes); when the exact sweep costs no more, a :class:`~.cost.CostWarning` says so with both
    numbers. With ``progress`` the work and its expected time (from the timed unpatched runs of the
    first chunk) are written beside the progress bar, which counts forward passes.
    """
    ig_steps, graddrop = _check_options(method, direction, ig_steps, ig_path, graddrop)
    refuse_degenerate(bind_metric(metric, model), model)  # token strings checked on every pair, before any work
    fam, layers_ = resolve_family(model, hook, layers)
    clean_t, corr_t, mask = pair_tokens(model, clean, corrupted)
    n_pairs = clean_t.shape[0]
    bs = n_pairs if batch_size is None else check_count(batch_size, "batch_size")
    positions, heads = as_selection(positions, "positions"), as_selection(heads, "heads")
    together = fam.kind != "pos" and (positions is None or positions == "all")  # heads patched at every position
    sweep = Sweep(model, fam, layers_, method, direction, ig_steps, ig_path, graddrop, together)
    P = clean_t.shape[1]
    work = estimate_work(sweep, P, n_pairs)
    exact = sweep_work(model, P, hook, layers, positions, heads)
    exact.passes, exact.runs, exact.tokens = exact.passes * n_pairs, exact.runs * n_pairs, exact.tokens * n_pairs
    check_cost(work, exact)
    base_t, src_t = (corr_t, clean_t) if direction == "denoise" else (clean_t, corr_t)
    chunks = []
    per_pair = estimate_passes(sweep)[0]
    bar = progress_bar(
        total=round(work.passes, 1), desc=f"attribution ({method}) {hook}", unit="pass", leave=False, enabled=progress
    )
    done = [0.0]

    def tick(passes: float) -> None:
        done[0] += passes
        bar.update(passes)

    sweep.tick = tick

    def announce(seconds: float, forwards: int, b: int) -> None:
        work.seconds = work.passes * seconds / (forwards * b)
        note(f"{work.line()} (exact patching: ≈ {exact.passes:.1f})", enabled=progress)

    for a in range(0, n_pairs, bs):
        b = min(n_pairs, a + bs)
        chunk = Chunk(
            base_t[a:b].clone(),
            src_t[a:b].clone(),
            None if mask is None else mask[a:b],
            (a, n_pairs),
            Readout(model, metric, (a, n_pairs), b - a),
        )
        chunks.append(_estimate_chunk(sweep, chunk, announce if a == 0 else None))
        tick(per_pair * b - done[0])  # the rest of the chunk's passes (pairs 0…b done)
    bar.close()
    spec = dict(
        model=model,
        clean=clean,
        corrupted=corrupted,
        metric=metric,
        hook=hook,
        layers=layers,
        positions=positions,
        heads=heads,
        direction=direction,
        normalize=normalize,
    )
    return _assemble(sweep, chunks, positions, heads, normalize, metric, (clean_t, corr_t, mask), hook, spec)


def _check_options(method: str, direction: str, ig_steps: Any, ig_path: str, graddrop: bool | None) -> tuple[int, bool]:
    """The method's options checked (errors name the argument); returns ``ig_steps`` and ``graddrop`` resolved."""
    if method not in ATTRIBUTION_METHODS:
        raise ValueError(f"method must be one of {', '.join(repr(m) for m in ATTRIBUTION_METHODS)}, not {method!r}")
    if direction not in ("denoise", "noise"):
        raise ValueError(
            "direction must be 'denoise' (patch clean into corrupted) or 'noise' (corrupted into clean), not "
            f"{direction!r}"
        )
    if method == "ig":
        ig_steps = check_count(ig_steps, "ig_steps (points on the interpolation path)")
    if ig_path not in ("input", "activations"):
        raise ValueError(f"ig_path must be 'input' (EAP-IG) or 'activations' (each layer's own), not {ig_path!r}")
    if ig_path != "input" and method != "ig":
        raise ValueError("ig_path is for method='ig'")
    if graddrop and method != "atp*":
        raise ValueError("graddrop is part of method='atp*'")
    return ig_steps, method == "atp*" if graddrop is None else bool(graddrop)


def _estimate_chunk(sweep: Sweep, chunk: Chunk, timed_runs: Any = None) -> ChunkEstimate:
    """One chunk through its method's estimator: the unpatched runs without autograd, then the
    estimator with autograd (also inside a caller's ``no_grad`` / ``inference_mode``).
    ``timed_runs(seconds, forwards, pairs)``: told how long the unpatched runs took."""
    ig = sweep.method == "ig"
    names = sweep.names + (ig_names(sweep) if ig else qk_names(sweep))
    (runs, chunk), seconds = timed(sweep.model, lambda: unpatched_runs(sweep.model, chunk, names, with_base=ig))
    if timed_runs is not None:
        timed_runs(seconds, 2 if ig else 1, chunk.b)
    with torch.inference_mode(False), torch.enable_grad():
        return (estimate_ig if ig else estimate_atp)(sweep, chunk, runs)


def _assemble(
    sweep: Sweep,
    chunks: list[ChunkEstimate],
    positions: Any,
    heads: Any,
    normalize: bool,
    metric: Metric,
    tokens: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None],
    hook: str,
    spec: dict,
) -> AttributionResult:
    """The chunks' per-pair effects as an :class:`AttributionResult`: the cells ``positions``/``heads``
    keep, each pair's estimated patched metric, the mean, the ranking score, normalised like ``patch``."""
    model, fam = sweep.model, sweep.fam
    eff = torch.cat([c.effects for c in chunks])  # [n_pairs, layer, pos|1, (head)]
    base_m, src_m = torch.cat([c.base_metric for c in chunks]), torch.cat([c.src_metric for c in chunks])
    clean_m, corr_m = (src_m, base_m) if sweep.direction == "denoise" else (base_m, src_m)
    P = tokens[0].shape[1]
    n_heads = model.cfg.n_head if fam.kind == "pos" else eff.shape[-1]  # k/v: the key/value heads (fewer under GQA)
    per_pair, index_names, pos_axis, head_axis = select(fam, eff, positions, heads, P, n_heads)
    graddrops = [c.graddrop for c in chunks if c.graddrop is not None]
    assert not sweep.graddrop or len(graddrops) == len(chunks), "every chunk computes GradDrop when the sweep does"
    drop = select(fam, torch.cat(graddrops), positions, heads, P, n_heads)[0] if sweep.graddrop else None
    per_pair = per_pair + base_m.view((-1,) + (1,) * (per_pair.ndim - 1))
    if not is_finite(per_pair):
        warnings.warn(
            f"attribution ({sweep.method}) of {hook}: the estimate is not finite for some cells "
            f"({nonfinite_summary(per_pair)}): the gradient of metric {metric_name(metric)} holds NaN/inf "
            "there; those cells are NaN/inf in the result",
            NonFiniteWarning,
            stacklevel=3,
        )
    mean = per_pair.mean(0)
    score = (mean - mean.new_tensor(float(base_m.mean()))).abs() if drop is None else drop.mean(0)
    if normalize:
        mean, per_pair, gap = normalize_effects(mean, per_pair, clean_m, corr_m)
        score = score / abs(gap)
    return AttributionResult(
        **result_fields(
            model,
            mean,
            per_pair,
            index_names,
            sweep.layers,
            pos_axis,
            head_axis,
            position_labels(model, *tokens),
            hook,
            sweep.direction,
            metric,
            normalize,
            clean_m,
            corr_m,
        ),
        method=sweep.method,
        ig_steps=sweep.ig_steps if sweep.method == "ig" else None,
        ig_path=sweep.ig_path if sweep.method == "ig" else None,
        graddrop=sweep.graddrop,
        score=score,
        _spec=spec,
    )


__all__ = ["ATTRIBUTION_METHODS", "attribute"]
