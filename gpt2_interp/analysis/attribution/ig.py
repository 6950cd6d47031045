"""Integrated gradients on one chunk of prompt pairs (EAP-IG; see the package docstring).

Input path (:func:`estimate_ig`, ``ig_path="input"``): the gradient at every attributed hook is
averaged along the straight path from the base input embeddings to the source ones. Activation path
(``ig_path="activations"``): per layer, only that layer's attributed activations are interpolated,
everything upstream at the base run. Either way ``ΔM ≈ (a' − a) · mean_α ∂M/∂a`` per cell, the
``ig_steps`` midpoints ``α = (i + ½)/m`` folded into the batch axis, as many per pass as
:data:`IG_BUDGET` allows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
from einops import rearrange, reduce, repeat

from ..engine import BACKWARD
from .cells import cell_effects, stack
from .cost import backward_share
from .grad_hooks import capture
from .plan import Chunk, ChunkEstimate, Runs, Sweep
from .readout import Readout

if TYPE_CHECKING:
    from ...model import HookedGPT2

IG_BUDGET = 1.5e7  # rows × positions × d_model × layers run per pass (bounds the saved activations)


def ig_names(sweep: Sweep) -> list[str]:
    """The extra hooks IG caches in the unpatched runs: the embeddings (input path) or the residual
    stream entering each attributed layer (activation path)."""
    n = sweep.model.cfg.n_layer
    if sweep.ig_path == "activations":
        return [f"blocks.{l}.hook_resid_pre" for l in sweep.layers if 0 <= l < n]
    return ["hook_embed"]


def estimate_ig(sweep: Sweep, chunk: Chunk, runs: Runs) -> ChunkEstimate:
    """IG of one chunk (run with autograd enabled), from its unpatched base and source runs ``runs``."""
    readout = chunk.readout
    assert runs.base is not None and runs.base_logits is not None, "IG runs the base alongside the source"
    readout.bind(runs.src_logits if sweep.direction == "denoise" else runs.base_logits)
    base_m, src_m = readout(runs.base_logits).detach().cpu(), readout(runs.src_logits).detach().cpu()
    readout.check_finite(base_m, src_m, sweep.direction)
    base, src = runs.base, runs.src
    if sweep.ig_path == "activations":
        grads = _activation_path_grads(sweep, chunk, base, src)
    else:
        grads = _input_path_grads(sweep, chunk, base["hook_embed"], src["hook_embed"])
    eff = [cell_effects(sweep.fam, src[nm] - base[nm], grads[nm]) for nm in sweep.names]
    return ChunkEstimate(stack(sweep.fam, eff, sweep.together), None, base_m, src_m)


def _input_path_grads(sweep: Sweep, chunk: Chunk, e0: torch.Tensor, e1: torch.Tensor) -> dict[str, torch.Tensor]:
    """``mean_α ∂M/∂a`` at every attributed hook along the input-embedding path ``e0 + α(e1 − e0)``
    (``e0``: base run, ``e1``: source run), each shaped like its hook's activation."""
    model, names, steps, readout = sweep.model, sweep.names, sweep.ig_steps, chunk.readout
    n = model.cfg.n_layer
    b, P = chunk.base_t.shape
    grads: dict[str, torch.Tensor | None] = dict.fromkeys(names)
    per_pass = max(1, min(steps, int(IG_BUDGET // max(1, b * P * model.cfg.d_model * n))))
    alphas = (torch.arange(steps, dtype=torch.float32, device=e0.device) + 0.5) / steps  # midpoints
    for first in range(0, steps, per_pass):  # steps folded into the batch axis: (s b) rows per pass
        al = alphas[first : first + per_pass]
        k = al.numel()
        path = rearrange(e0[None] + al.view(-1, 1, 1, 1).to(e0.dtype) * (e1 - e0)[None], "s b p d -> (s b) p d")
        store: dict[str, torch.Tensor] = {}
        hooks = [("hook_embed", lambda act, hook, path=path: path)] + [(nm, capture(store)) for nm in names]
        rows_mask = None if chunk.mask is None else repeat(chunk.mask, "b p -> (s b) p", s=k)
        with model.hooks(hooks):
            resid = model(repeat(chunk.base_t, "b p -> (s b) p", s=k), attention_mask=rows_mask, stop_at_layer=n)
        logits = rearrange(readout.logits(resid), "(s b) v -> s b v", s=k)
        total = cast(torch.Tensor, sum(readout(logits[i]).sum() for i in range(k)))  # k ≥ 1 tensors
        for nm, g in zip(names, torch.autograd.grad(total, [store[nm] for nm in names])):
            part = reduce(rearrange(g.float(), "(s b) ... -> s b ...", s=k), "s b ... -> b ...", "sum") / steps
            prev = grads[nm]
            grads[nm] = part if prev is None else prev + part
        sweep.tick(k * b * (1 + backward_share(sweep)))
    out = {nm: g for nm, g in grads.items() if g is not None}
    assert len(out) == len(grads), "every pass adds to every gradient"
    return out


def _activation_path_grads(
    sweep: Sweep, chunk: Chunk, base: dict[str, torch.Tensor], src: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``mean_α ∂M/∂a`` of each attributed layer on its own activation path (see :func:`_activation_path_grad`)."""
    n = sweep.model.cfg.n_layer
    out = {}
    for l, nm in zip(sweep.layers, sweep.names):
        resid0 = base.get(f"blocks.{l}.hook_resid_pre") if 0 <= l < n else None
        out[nm] = _activation_path_grad(
            sweep.model, chunk.readout, nm, l, base[nm], src[nm], resid0, chunk.base_t, chunk.mask, sweep.ig_steps
        )
        sweep.tick(chunk.b * sweep.ig_steps * (1 + BACKWARD) * (n - max(l, 0)) / n)
    return out


def _activation_path_grad(
    model: HookedGPT2,
    readout: Readout,
    name: str,
    layer: int,
    a0: torch.Tensor,
    a1: torch.Tensor,
    resid0: torch.Tensor | None,
    base_t: torch.Tensor,
    mask: torch.Tensor | None,
    steps: int,
) -> torch.Tensor:
    """``mean_α ∂M/∂a`` at ``a = a0 + α(a1 − a0)`` of hook ``name`` (``a0``: base run, ``a1``: source run;
    α at the ``steps`` midpoints), everything upstream at the base run: the pass starts at ``layer``
    from the base residual stream ``resid0`` (or, for a hook before the first block, at the tokens).
    Steps are folded into the batch axis (``(s b)`` rows), as many per pass as the memory budget
    allows. Returns ``[b, ...]``, shaped like the hook's activation."""
    n = model.cfg.n_layer
    b, P = base_t.shape
    run = n - max(layer, 0)
    per_pass = max(1, min(steps, int(IG_BUDGET // max(1, b * P * model.cfg.d_model * run))))
    alphas = (torch.arange(steps, dtype=torch.float32, device=a0.device) + 0.5) / steps
    grad = torch.zeros_like(a0, dtype=torch.float32)
    for first in range(0, steps, per_pass):
        al = alphas[first : first + per_pass]
        s = al.numel()
        path = a0.float()[None] + al.view(-1, *([1] * a0.ndim)) * (a1.float() - a0.float())[None]
        leaf = rearrange(path.to(a0.dtype), "s b ... -> (s b) ...").requires_grad_(True)
        m_rows = None if mask is None else repeat(mask, "b p -> (s b) p", s=s)

        def use_leaf(act: torch.Tensor, hook: Any, leaf: torch.Tensor = leaf) -> torch.Tensor:
            return leaf

        with model.hooks([(name, use_leaf)]):
            if resid0 is None:
                resid = model(repeat(base_t, "b p -> (s b) p", s=s), attention_mask=m_rows, stop_at_layer=n)
            else:
                resid = model(
                    repeat(resid0, "b p d -> (s b) p d", s=s),
                    attention_mask=m_rows,
                    start_at_layer=layer,
                    stop_at_layer=n,
                )
        logits = rearrange(readout.logits(resid), "(s b) k -> s b k", s=s)
        total = cast(torch.Tensor, sum(readout(logits[i]).sum() for i in range(s)))  # s ≥ 1 tensors
        (g,) = torch.autograd.grad(total, [leaf])
        grad += reduce(rearrange(g.float(), "(s b) ... -> s b ...", s=s), "s b ... -> b ...", "sum") / steps
    return grad


__all__ = ["IG_BUDGET", "estimate_ig", "ig_names"]
