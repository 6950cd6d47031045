"""AtP*'s QK fix: the effect of patching queries or keys, linear only from the attention pattern on.

A patched query row is recomputed exactly; a patched key at ``s`` moves only column ``s`` of each
query row, by ``δ = q_t·(k'_s − k_s)·scale``, and the new row is closed-form:
``Σ_s' ΔA_ts' G_ts' = a·(e^δ − 1)(G_ts − Σ_s' A_ts' G_ts') / (1 + a(e^δ − 1))`` with ``a = A_ts``
and ``G = ∂M/∂A`` (Kramár et al. 2024). :func:`check_scale` refuses a model whose attention scores
are not ``q·k/√d_head`` rather than estimate them wrongly.
"""

from __future__ import annotations

import math

import torch
from einops import einsum, rearrange, reduce


def qk_fixed(
    family: str,
    q: torch.Tensor,
    k: torch.Tensor,
    q_src: torch.Tensor,
    k_src: torch.Tensor,
    pattern: torch.Tensor,
    scores: torch.Tensor,
    G: torch.Tensor,
    scale: float,
    together: bool,
) -> torch.Tensor:
    """AtP* effect of patching queries or keys, linear only from the attention pattern on.

    ``q, k`` ``[b, pos, head(_kv), d_head]`` base run (as they enter the scores), ``*_src`` the source
    run's; ``pattern``, ``scores`` (masked: −inf) and ``G = ∂M/∂pattern`` ``[b, head, q, k]``.
    Returns ``[b, pos, head(_kv)]`` (per query / key position), or with ``together`` the effect of
    patching every position at once in position 0 (``[b, 1, head(_kv)]``)."""
    H, Hk = q.shape[2], k.shape[2]
    group = H // Hk  # query heads per key/value head (grouped-query attention)
    allowed = torch.isfinite(scores)
    A, G = pattern.double(), G.double()
    if family == "q" or together:
        if family == "q":
            new = einsum(q_src.double(), k.double().repeat_interleave(group, 2), "b t h d, b s h d -> b h t s")
        else:
            new = einsum(q.double(), k_src.double().repeat_interleave(group, 2), "b t h d, b s h d -> b h t s")
        new = (new * scale).masked_fill(~allowed, float("-inf")).softmax(-1)
        per_row = ((new - A) * G).nan_to_num().sum(-1)  # [b, h, t]
        if family == "q":
            out = rearrange(per_row, "b h t -> b t h")
            return out.sum(1, keepdim=True) if together else out
        out = per_row.sum(-1)[:, None]  # [b, 1, h]
    else:
        # a key at s moves only column s: closed-form new row, see the module docstring
        dk = (k_src - k).double().repeat_interleave(group, 2)
        delta = einsum(q.double(), dk, "b t h d, b s h d -> b h t s") * scale
        delta = torch.where(allowed, delta, torch.zeros((), dtype=delta.dtype, device=delta.device)).clamp(max=600.0)
        S = (A * G).sum(-1, keepdim=True)  # [b, h, t, 1]
        e = torch.expm1(delta)
        ratio = A * e / (1 + A * e)  # δ ≤ 600 keeps e^δ finite in float64
        ratio = torch.where(allowed, ratio, torch.zeros((), dtype=ratio.dtype, device=ratio.device))
        out = rearrange((ratio * (G - S)).sum(2), "b h s -> b s h")  # sum over queries t
    if group > 1:
        out = reduce(out, "b p (hk g) -> b p hk", "sum", g=group)
    return out.float()


def check_scale(q: torch.Tensor, k: torch.Tensor, scores: torch.Tensor, layer: int) -> float:
    """The attention scale, checked: the QK fix recomputes scores as ``q·k·scale``, which must reproduce
    the model's own scores (a model that scores differently is refused rather than estimated wrongly)."""
    H, Hk, dh = q.shape[2], k.shape[2], q.shape[-1]
    scale = 1 / math.sqrt(dh)
    s = einsum(q.float(), k.float().repeat_interleave(H // Hk, 2), "b t h d, b s h d -> b h t s") * scale
    ok = torch.isfinite(scores)
    err = (s[ok] - scores.float()[ok]).abs().max() if bool(ok.any()) else torch.tensor(0.0)
    if float(err) > 1e-3 * (1 + float(scores.float()[ok].abs().max())):
        raise NotImplementedError(
            f"layer {layer}: q·k/√d_head does not reproduce the model's attention scores "
            f"(max error {float(err):.3g}); the AtP* QK fix needs that — use method='atp' or 'ig'"
        )
    return scale


__all__ = ["check_scale", "qk_fixed"]
