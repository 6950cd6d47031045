"""ROME: Rank-One Model Editing of one MLP's ``W_out`` (Meng et al. 2022), with the r-ROME fix.

Our MLP computes ``out = k @ W_out + b_out`` with the key ``k = gelu(ln2(x) @ W_in + b_in)``
``[d_mlp]`` and ``W_out: [d_mlp, d_model]``. ROME treats ``W_out`` as a linear associative
memory and inserts the association ``k* → v*`` with the smallest change in the C-metric
(``C = E[k kᵀ]``, :mod:`.stats`):

* ``k*``: the key at the subject's last token, averaged over the bare prompt and prompts
  prefixed with short texts the model generates (``"{prefix}. {prompt}"``);
* ``v*``: the MLP output that makes the model say the target: ``v* = (k* @ W_out + b_out) + δ``
  where ``δ`` is added at the MLP output of the edit layer at the subject's last token and
  optimised (Adam) for the NLL of every target token over all prompt variants, plus
  ``kl_factor`` × KL between the edited and unedited next-token distributions on
  ``"{subject} is a"`` (from the subject's last token on), plus ``weight_decay`` × ‖δ‖/‖v₀‖²;
  ``δ`` is kept in the ball ‖δ‖ ≤ ``clamp_factor`` × ‖v₀‖ (``v₀``: the original MLP output at
  the subject's last token of the bare prompt). Only ``δ`` has a gradient. With ``exact_edit``
  (default) every position ``t`` of every variant receives ``(k_tᵀC⁻¹k*)/(k*ᵀC⁻¹k*) · δ`` —
  exactly what the rank-one update below will add there, since the keys of the edit layer do not
  depend on its ``W_out`` — so the optimised loss is the edited model's loss. ROME adds a plain
  ``δ`` at the subject's last token only (``exact_edit=False``); the difference matters when a
  variant's key differs from k* ("France" at the start of a text vs " France" after a prefix)
  and when other tokens' keys share k*'s direction: then a variant's key gets only part of the edit
  that the optimisation assumed.
* ``keep`` (ours, optional; :attr:`Request.keep`): prompts about the same subject whose next-token
  distribution must not move — the subject's other attributes. Their KL (edited ‖ unedited, at
  their last token, averaged over the prompts) enters the loss × ``keep_factor``. The edit writes
  to the subject's representation, which every relation reads, so without it writing one relation
  can rewrite the subject's others.
* a norm on the MLP's output (OLMo 2's and Gemma's ``ln2_post``): ``v₀``, ``δ`` and ``v*`` are
  ``W_out``'s output before it, and δ passes through it at every step (:func:`.targets.optimise_deltas`'
  ``delta_site``), so the update below writes exactly the value optimised;
* the update ``ΔW = outer(C⁻¹k*, v* − (k* @ W_out + b_out)) / (k*ᵀ C⁻¹ k*)``, so
  ``k* @ (W_out + ΔW) + b_out = v*`` exactly, and any key ``k`` with ``kᵀC⁻¹k* = 0`` is untouched.

The r-ROME fix (Gupta et al. 2024, "Rebuilding ROME"): the original code used the prefix-averaged
k* in ``C⁻¹k*`` but the bare prompt's key in the denominator and in ``W_out k``; that mismatch
makes some edits blow up ("disabling edits"). Here the SAME averaged k* is used in all three
places, so the inserted association is exactly ``k* → v*``.

This module holds the rank-one update and its entry points; the keys, the context prefixes and the δ
optimisation it shares with MEMIT are in :mod:`.targets`, the settings in :mod:`.settings`.

Every departure from the authors' code is a named :class:`RomeHparams` option (``target_state``,
``exact_edit``, ``kl_positions``, ``step_count``, ``prefix_style``, ``prepend_bos``, ``key_weighting``);
``preset="paper"`` selects the authors' value for each (:func:`hparams_for`; the table in
docs/guide/editing.md), checked against their code in tests/unit/test_paper_golden.py.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import torch

from ..analysis.tracing import causal_trace
from ..core.boundary import boundary
from ..core.progress import progress_bar
from ..model.fingerprint import parameter_digests, weights_fingerprint
from .edit import (
    Edit,
    Request,
    is_weak,
    report_failed,
)
from .settings import (
    default_layer,
    hparams_for,
)
from .stats import DEFAULT_CORPUS_RULE, KeyStats, key_second_moment
from .targets import (
    RequestLike,
    context_prefix_groups,
    optimise_delta,
    target_outcomes,
    validate_request,
    variant_weights,
)

if TYPE_CHECKING:
    from ..model import HookedGPT2


# ---------------------------------------------------------------- the maths
@boundary
def rank_one_update(
    W_out: torch.Tensor,
    b_out: torch.Tensor | None,
    k: torch.Tensor,
    v_star: torch.Tensor,
    solve: Callable[[torch.Tensor], torch.Tensor] | None = None,
    k_residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(u, v)`` with ``ΔW = outer(u, v)`` the C-metric minimal update making ``k @ (W+ΔW) + b = v*``.

    ``W_out: [d_mlp, d_model]``, ``b_out: [d_model]`` or None, ``k: [d_mlp]``, ``v_star: [d_model]``;
    ``solve(k)`` returns ``C⁻¹k`` (identity when None: then ``ΔW = outer(k, v* − Wᵀk − b) / ‖k‖²``). ``u`` is
    ``C⁻¹k`` normalised; ``v = (v* − Wᵀk − b) / (k · u)``. The same ``k`` enters the direction,
    the denominator and the residual (r-ROME). Returns float32 ``u [d_mlp]`` and ``v [d_model]``.
    A zero key, or ``k · u`` ≈ 0 (degenerate statistics), raises ValueError.

    ``k_residual`` (``target_state="bare_prompt"``, ROME's code): the key of the residual
    ``v* − Wᵀk_r − b`` and the denominator ``k_r · u`` instead of ``k`` (ROME uses the bare prompt's key
    there and the averaged k* in ``u``); then ``k_r @ (W+ΔW) + b = v*`` and k* gets
    ``(k*·u)/(k_r·u)`` of the change."""
    k64, W64 = k.double().reshape(-1), W_out.double()
    if k_residual is not None:
        k64 = k_residual.double().reshape(-1)
    out = k64 @ W64 + (b_out.double() if b_out is not None else 0.0)
    resid = v_star.double().reshape(-1) - out  # [d_model]
    c = (solve(k.float()) if solve is not None else k).double().reshape(-1)  # [d_mlp]
    if c.norm() == 0 or k64.norm() == 0 or k.norm() == 0:
        raise ValueError("the key k* is zero: the MLP is dead at the subject's last token; try another layer")
    u = c / c.norm()
    denom = k64 @ u
    if float(denom.abs()) < 1e-12 * float(k64.norm()):
        raise ValueError("k*ᵀC⁻¹k* is ~0: the key statistics are degenerate; recompute them over more samples")
    return u.float(), (resid / denom).float()


# ---------------------------------------------------------------- layer choice
def choose_layer(model: HookedGPT2, request: RequestLike, progress: bool | None = None) -> int:
    """The layer whose MLP has the largest indirect effect at the subject's last token in the
    causal trace of the request's prompt (``layer="auto"``; window: ``tracing.default_window``)."""
    req = Request.of(request)
    trace = causal_trace(model, req.text, req.subject, kind="mlp", progress=progress)
    last = trace.subject_range[1] - 1  # indexes the trace's tokens
    return int(trace.indirect_effect[last].argmax())  # indirect_effect: [n_tokens, n_layer]


# ---------------------------------------------------------------- the entry point
@boundary
def compute_edit(
    model: HookedGPT2,
    request: RequestLike,
    layer: int | str | None = None,
    stats: KeyStats | Mapping[int, KeyStats] | None = None,  # a mapping is refused in the function's own words
    progress: bool | None = None,
    **hparams: Any,
) -> Edit:
    """Compute (not apply) the ROME edit writing ``request`` into ``model``.

    ``layer``: an int, None (:func:`default_layer`) or ``"auto"`` (:func:`choose_layer`).
    ``stats``: key statistics for that layer (:func:`~.stats.key_second_moment`; computed and
    cached when None). ``hparams`` override :class:`RomeHparams` (see :func:`hparams_for`). Apply with
    ``edit.apply(model)`` or ``with model.edited(edit):``. ``progress`` (None: on a terminal or in a
    notebook): bars for the key statistics, the causal trace (``"auto"``) and the δ steps (loss and
    P(target) as they go).

    ``request``: a :class:`~.edit.Request` or a dict (``prompt`` with ``{}``, ``subject``, ``target``;
    see :meth:`~.edit.Request.of`). Returns a rank-one :class:`~.edit.Edit` (``u [d_mlp]``,
    ``v [d_model]``, ``k`` = k*, ``v_star``) whose ``metrics`` hold P(target) before and after, the
    δ and ΔW norms, the optimisation steps and losses, and ``weak``. The model is left unchanged.

    A target unlikely to follow the prompt as written warns before any work
    (:class:`~.edit.TargetSpacingWarning`). Whether the edit took is measured on the edited model:
    ``edit.succeeded`` / ``edit.metrics["took"]`` (:data:`~.edit.EDIT_TOOK_RULE`); an edit that did not
    take also warns (:class:`~.edit.EditFailedWarning`).

    Refused before the optimisation: a malformed request (TypeError/ValueError naming the field), a
    subject that does not occur in the prompt, an empty target, an unknown hyperparameter or one out
    of range, a ``layer`` string other than ``"auto"`` (ValueError), a layer out of range
    (IndexError), ``stats`` that are not :class:`~.stats.KeyStats` (TypeError) or were computed for
    another layer or other weights (ValueError).
    """
    t0 = time.perf_counter()
    req, ids = validate_request(model, request)
    hp = hparams_for(model, **hparams)
    if layer is None:
        layer = hp.layer if hp.layer is not None and hp.layer < model.cfg.n_layer else default_layer(model)
    elif layer == "auto":
        layer = choose_layer(model, req, progress=progress)
    elif isinstance(layer, str):
        raise ValueError(f"layer must be an int, None or 'auto', got {layer!r}")
    layer = model.check_layer(layer)
    digests = parameter_digests(model)
    if stats is None:
        stats = key_second_moment(model, layer, corpus=hp.corpus, n_samples=hp.n_samples, progress=progress)
    elif not isinstance(stats, KeyStats):
        raise TypeError(
            f"stats must be the KeyStats of layer {layer} (key_second_moment(model, {layer})) or None, "
            f"got {type(stats).__name__}"
        )
    stats.check(model, layer, digests)
    groups = context_prefix_groups(model, hp.prefix_lengths, hp.prefixes_per_length, hp.prefix_seed, hp.prefix_style)
    prefixes = [p for g in groups for p in g]
    (before,) = target_outcomes(model, [req.text], [ids])
    opt = optimise_delta(
        model, req, ids, layer, prefixes, hp, stats.solve, progress=progress, key_weights=variant_weights(hp, groups)
    )
    mlp = model.blocks[layer].mlp
    k_star = opt["k_star"]
    b_out = None if mlp.b_out is None else mlp.b_out.detach()
    k_res = opt["k_bare"] if hp.target_state == "bare_prompt" else None  # ROME's code: v* = v₀ + δ, k_bare · u
    v_star = (k_star if k_res is None else k_res) @ mlp.W_out.detach().float()
    v_star = v_star + (0.0 if b_out is None else b_out.float()) + opt["delta"]
    u, v = rank_one_update(mlp.W_out.detach(), b_out, k_star, v_star, stats.solve, k_residual=k_res)
    with _updated(mlp.W_out, u, v):
        (after,) = target_outcomes(model, [req.text], [ids])
    metrics = {
        "p_target_before": float(torch.tensor(before.logprob).exp()),
        "p_target_after": float(torch.tensor(after.logprob).exp()),
        "logp_target_before": before.logprob,
        "logp_target_after": after.logprob,
        "took": after.took,
        "top1_after": after.top1,
        "delta_norm": float(opt["delta"].norm()),
        "v0_norm": float(opt["v0"].norm()),
        "dW_norm": float(u.norm() * v.norm()),
        "steps": len(opt["log"]) - 1,
        "n_prompts": opt["n_prompts"],
        "initial_loss": opt["log"][0],
        "key_scale": opt["key_scale"],
        "final_loss": opt["log"][-1],
        "seconds": time.perf_counter() - t0,
    }
    metrics["weak"] = is_weak(metrics["p_target_before"], metrics["p_target_after"])
    report_failed([req], [after.took], [metrics["p_target_before"]], [metrics["p_target_after"]], [after.top1])
    return Edit.rank_one(
        layer,
        u,
        v,
        req,
        base_fingerprint=weights_fingerprint(model, digests=digests),
        k=k_star,
        v_star=v_star,
        hparams=asdict(hp)
        | {"layer": layer, "stats_corpus": stats.key["corpus"], "stats_count": stats.count}
        | {"stats_corpus_default": DEFAULT_CORPUS_RULE},
        metrics=metrics,
        model_name=model.cfg.name,
        shape=(model.cfg.d_mlp, model.cfg.d_model),
    )


@contextmanager
def _updated(W_out: torch.Tensor, u: torch.Tensor, v: torch.Tensor) -> Iterator[None]:
    """``W_out`` with ``outer(u, v)`` added inside the block, restored bit for bit after it: the edited model
    as the edit will make it (also where the MLP's output passes a norm before the residual, OLMo 2 and
    Gemma)."""
    saved = W_out.detach().clone()
    try:
        with torch.no_grad():
            W_out.add_(torch.outer(u, v).to(W_out.device, W_out.dtype))
        yield
    finally:
        with torch.no_grad():
            W_out.copy_(saved)


@boundary
def apply_rome(
    model: HookedGPT2,
    requests: RequestLike | Sequence[RequestLike],
    layer: int | str | None = None,
    stats: KeyStats | None = None,
    progress: bool | None = None,
    **hparams: Any,
) -> list[Edit]:
    """Compute and apply edits for several requests, one after another (each on the model edited
    by the previous ones). Undo with ``gpt2_interp.editing.undo_all(model)``.

    ``requests``: one request or a list; ``layer``, ``stats`` and ``hparams`` are passed to
    :func:`compute_edit` for each (so ``stats`` must be for ``layer``). ``progress``: as in
    :func:`compute_edit`, plus a bar over the requests (with the time left). Returns the applied edits
    in order; refusals as in :func:`compute_edit` (a request's position is named in its error)."""
    if isinstance(requests, (Request, Mapping)):
        requests = [requests]
    requests = [Request.of(r, i) for i, r in enumerate(requests)]
    edits = []
    bar = progress_bar(
        total=len(requests), unit="req", desc="ROME edits", enabled=progress if len(requests) > 1 else False
    )
    for r in requests:
        e = compute_edit(model, r, layer=layer, stats=stats, progress=progress, **hparams)
        edits.append(e.apply(model, verify=False))
        bar.update(1)
    bar.close()
    return edits


__all__ = [
    "apply_rome",
    "choose_layer",
    "compute_edit",
    "rank_one_update",
]
