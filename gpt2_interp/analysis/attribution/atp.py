"""AtP and AtP* on one chunk of prompt pairs: one base pass with autograd, one backward pass.

AtP: ``ΔM ≈ (a' − a) · ∂M/∂a`` per cell. AtP*: queries and keys through the QK fix (:mod:`.qk`),
and with GradDrop each layer's residual contribution (``attn_out``, ``mlp_out``) has its gradient
dropped in turn; the cell's rank score is ``(1/(L−1)) Σ_ℓ |Î_ℓ|`` (one backward pass per layer).

Where each part of AtP* can change the result (Kramár et al. 2024, section 3):

* The QK fix replaces the linear step through the attention softmax, so it concerns queries and
  keys alone (``q``/``k``); every other family takes plain AtP's estimate, at AtP's cost.
* GradDrop concerns every family: cancellation between a node's direct and indirect paths happens
  through any later layer, MLPs included, so an ``mlp_out`` sweep keeps its passes (``graddrop=False``
  ranks by ``|Î|`` alone). What cannot change the result is a pass ``ℓ`` whose dropped contribution
  lies *upstream* of every attributed activation (:func:`~.cost.graddrop_layers`): no path from an
  attributed activation to the metric crosses layer ``ℓ``'s outputs, so ``Î_ℓ`` is the undropped
  estimate itself. Those passes are not run; ``|Î|`` enters the sum in their place (the same
  values: the backward graph is the same). A sweep of late layers skips most passes; a sweep of
  the last layer's ``resid_post`` skips them all.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .cells import cell_effects, rot_name, stack
from .cost import backward_share, graddrop_layers
from .grad_hooks import capture, gate
from .plan import Chunk, ChunkEstimate, Runs, Sweep
from .qk import check_scale, qk_fixed


def uses_qk_fix(sweep: Sweep) -> bool:
    """Whether the sweep takes AtP*'s QK fix (queries or keys under ``atp*``)."""
    return sweep.method == "atp*" and sweep.fam.name in ("q", "k")


def qk_names(sweep: Sweep) -> list[str]:
    """The hooks the QK fix reads in the unpatched runs: queries, keys (as they enter the scores) and scores."""
    if not uses_qk_fix(sweep):
        return []
    m = sweep.model
    return [
        x for l in sweep.layers for x in (rot_name(m, l, "q"), rot_name(m, l, "k"), f"blocks.{l}.attn.hook_attn_scores")
    ]


class _BaseRun:
    """The base run with autograd: activations captured where the gradient is wanted (the attributed
    hooks, and the patterns for the QK fix), the QK fix's scores/queries/keys recorded, and with
    GradDrop a gate on every layer's ``attn_out`` and ``mlp_out`` (``keeps[l][0] = 0`` drops layer ``l``)."""

    def __init__(self, sweep: Sweep, chunk: Chunk) -> None:
        model, n = sweep.model, sweep.model.cfg.n_layer
        pattern_names = [f"blocks.{l}.attn.hook_pattern" for l in sweep.layers] if uses_qk_fix(sweep) else []
        self.inputs = list(dict.fromkeys(sweep.names + pattern_names))
        self.store: dict[str, torch.Tensor] = {}
        self.extra: dict[str, torch.Tensor] = {}
        self.keeps = [[1.0] for _ in range(n)]
        hooks = [(nm, capture(self.store)) for nm in self.inputs]
        hooks += [(x, lambda act, hook: self.extra.__setitem__(hook.name, act.detach())) for x in qk_names(sweep)]
        if sweep.graddrop:  # after the captures: a dropped layer's own nodes get no gradient (hence 1/(L−1))
            hooks += [(f"blocks.{l}.hook_{x}", gate(self.keeps[l])) for l in range(n) for x in ("attn_out", "mlp_out")]
        with model.hooks(hooks):
            self.logits = chunk.readout.logits(model(chunk.base_t, attention_mask=chunk.mask, stop_at_layer=n))
        self.acts = [self.store[x] for x in self.inputs]


def _estimate(
    sweep: Sweep, run: _BaseRun, src: dict[str, torch.Tensor], grads: Sequence[torch.Tensor | None]
) -> torch.Tensor:
    """Per-pair cell effects ``[b, layer, pos|1, (head)]`` from the gradients at ``run.inputs``
    (None: no gradient reached it, i.e. zero)."""
    model, fam, qk = sweep.model, sweep.fam, uses_qk_fix(sweep)
    grad = {x: torch.zeros_like(run.store[x]) if g is None else g for x, g in zip(run.inputs, grads)}
    out = []
    for l, nm in zip(sweep.layers, sweep.names):
        if qk:
            qn, kn = rot_name(model, l, "q"), rot_name(model, l, "k")
            scores, q, k = run.extra[f"blocks.{l}.attn.hook_attn_scores"], run.extra[qn], run.extra[kn]
            pn = f"blocks.{l}.attn.hook_pattern"
            out.append(
                qk_fixed(
                    fam.name,
                    q,
                    k,
                    src[qn],
                    src[kn],
                    run.store[pn].detach(),
                    scores,
                    grad[pn],
                    check_scale(q, k, scores, l),
                    sweep.together,
                )
            )
        else:
            out.append(cell_effects(fam, src[nm] - run.store[nm].detach(), grad[nm]))
    return stack(fam, out, sweep.together and not qk)


def _graddrop(
    sweep: Sweep, run: _BaseRun, src: dict[str, torch.Tensor], m: torch.Tensor, eff: torch.Tensor, b: int
) -> torch.Tensor:
    """GradDrop's rank score ``(1/(L−1)) Σ_ℓ |Î_ℓ|``: the estimate with layer ℓ's residual
    contribution cut from the backward pass, for every ℓ (the graph is kept until the last). For
    ℓ outside :func:`~.cost.graddrop_layers` ``Î_ℓ`` is ``eff`` (the undropped estimate) exactly,
    and no pass runs."""
    n = sweep.model.cfg.n_layer
    live = graddrop_layers(sweep)
    total: torch.Tensor | None = None
    for l in range(n):
        if l not in live:
            part = eff.abs()
        else:
            run.keeps[l][0] = 0.0
            try:
                part = _estimate(
                    sweep,
                    run,
                    src,
                    torch.autograd.grad(m.sum(), run.acts, retain_graph=l < live[-1], allow_unused=True),
                ).abs()
            finally:
                run.keeps[l][0] = 1.0
            sweep.tick(backward_share(sweep) * b)
        total = part if total is None else total + part
    assert total is not None
    return total / max(n - 1, 1)


def estimate_atp(sweep: Sweep, chunk: Chunk, runs: Runs) -> ChunkEstimate:
    """AtP / AtP* of one chunk (run with autograd enabled), from its unpatched source run ``runs``."""
    readout = chunk.readout
    run = _BaseRun(sweep, chunk)
    readout.bind(runs.src_logits if sweep.direction == "denoise" else run.logits.detach())
    m = readout(run.logits)
    base_m, src_m = m.detach().cpu(), readout(runs.src_logits).detach().cpu()
    readout.check_finite(base_m, src_m, sweep.direction)
    if not sweep.graddrop:
        return ChunkEstimate(
            _estimate(sweep, run, runs.src, torch.autograd.grad(m.sum(), run.acts)), None, base_m, src_m
        )
    eff = _estimate(
        sweep, run, runs.src, torch.autograd.grad(m.sum(), run.acts, retain_graph=len(graddrop_layers(sweep)) > 0)
    )
    return ChunkEstimate(eff, _graddrop(sweep, run, runs.src, m, eff, chunk.b), base_m, src_m)


__all__ = ["estimate_atp", "qk_names", "uses_qk_fix"]
