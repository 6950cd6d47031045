"""What is attributed: the hook family and layers a ``hook=`` argument names (:func:`resolve_family`,
on the rule patching uses, :func:`~gpt2_interp.analysis.hook_targets.resolve_hook`), the per-cell
first-order effect ``(a' − a) · ∂M/∂a`` (:func:`cell_effects`) and the cells a result keeps (:func:`select`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import torch
from einops import rearrange

from ...core.checks import check_indices
from ...model.hooks import hook_name, suggest
from ..hook_targets import is_full_name, resolve_hook

if TYPE_CHECKING:
    from ...model import HookedGPT2

POS_FAMILIES = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "mlp_pre", "mlp_post", "pre", "post")
HEAD_FAMILIES = ("z", "q", "k", "v")
FAMILIES = POS_FAMILIES + HEAD_FAMILIES + ("pattern",)


@dataclass
class Family:
    """The attributed activations: their shape ``kind``, family ``name`` (e.g. ``"z"``, or a full hook
    name outside the families) and per layer the hook name."""

    kind: Literal["pos", "head", "pattern"]
    name: str
    names: dict[int, str]


def resolve_family(model: HookedGPT2, hook: str, layers: Sequence[int] | None) -> tuple[Family, list[int]]:
    """The :class:`Family` and layers of an attribution's ``hook`` and ``layers`` arguments: a family
    of :data:`FAMILIES` (``attn`` = ``pattern``), ``embed``/``pos_embed``, or the full name of a
    per-position activation (not ``ln_final``'s, which runs on the last position only, nor scores)."""
    if not is_full_name(hook):
        hook = "pattern" if hook == "attn" else hook
        if hook not in (*FAMILIES, "embed", "pos_embed"):
            raise KeyError(
                f"attribution covers the hook families {', '.join(FAMILIES)}, embed, pos_embed and full hook "
                f"names of per-position activations, not {hook!r}.{suggest(hook, list(FAMILIES))}"
            )
    family, names = resolve_hook(model, hook, layers)
    if family is None:  # one hook point: its family if it is one of a family's layers
        ((lay, name),) = names.items()
        if name.startswith("ln_final") or name.endswith("hook_attn_scores"):
            raise ValueError(
                f"attribution does not take {name!r} (the final LayerNorm runs on the last position "
                "only; scores hold −inf): use a residual hook, or 'pattern' for attention"
            )
        family = next((f for f in FAMILIES if lay >= 0 and name == hook_name(f, lay)), None)
        if family is None:  # any other per-position activation [batch, pos, ...]: embeddings, MLP neurons
            return Family("pos", name, names), [lay]
    kind: Literal["pos", "head", "pattern"] = (
        "pos" if family in POS_FAMILIES else "head" if family in HEAD_FAMILIES else "pattern"
    )
    return Family(kind, family, names), list(names)


def rot_name(model: HookedGPT2, layer: int, x: str) -> str:
    """The hook holding the keys/queries as they enter the scores (rotary models: ``hook_rot_{x}``)."""
    rot = f"blocks.{layer}.attn.hook_rot_{x}"
    return rot if rot in model.hook_dict else f"blocks.{layer}.attn.hook_{x}"


def cell_effects(fam: Family, delta: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """First-order effect per cell: ``[b, pos]`` (pos kinds) or ``[b, pos, head]`` (per-head kinds)."""
    if fam.kind == "pos":  # [b, pos, ...]
        return (delta.float() * grad.float()).flatten(2).sum(-1)
    if fam.kind == "head":  # [b, pos, head, d_head]  (a product and a sum: einsum would make it a slow bmm)
        return (delta.float() * grad.float()).sum(-1)
    return rearrange(
        (delta.float() * grad.float()).sum(-1), "b h q -> b q h"
    )  # pattern [b, h, q, k]: rows = query positions


def stack(fam: Family, effects: list[torch.Tensor], sum_positions: bool) -> torch.Tensor:
    """Per-layer cell effects → ``[b, layer, pos, (head)]``; with ``sum_positions`` (a per-head family
    patched at every position at once) the positions are summed into one slot."""
    out = torch.stack(effects, 1)
    if sum_positions and fam.kind != "pos":
        out = out.sum(2, keepdim=True)
    return out.detach().cpu()


def select(
    fam: Family, per: torch.Tensor, positions: Any, heads: Any, P: int, H: int
) -> tuple[torch.Tensor, tuple[str, ...], list[int] | None, list[int] | None]:
    """``per`` ``[b, layer, pos(, head)]`` (``pos`` may be 1 = every position together) → the result's
    cells, axes as ``patch`` gives them."""
    if fam.kind == "pos":
        if heads is not None:
            raise ValueError(f"heads are for per-head hooks (z, q, k, v, pattern); {fam.name!r} has no head axis")
        if positions == "all":
            return per.sum(2, keepdim=True), ("layer", "pos"), None, None
        if positions is None:
            return per, ("layer", "pos"), list(range(P)), None
        ps = check_indices(positions, P, "position", "positions", f"the prompts have {P} tokens")
        return per[:, :, ps], ("layer", "pos"), ps, None
    if heads is None:
        hs: list[int] | None = list(range(H))
    elif heads == "all":
        hs = None
    else:
        hs = check_indices(heads, H, "head", "heads", f"the model has {H} heads")
    per = per.sum(-1, keepdim=True) if hs is None else per[..., hs]
    if positions is None or positions == "all":
        return per.sum(2), ("layer", "head"), None, hs
    if isinstance(positions, str):
        raise ValueError(f"positions must be a list of ints, None or 'all', not {positions!r}")
    ps = check_indices(positions, P, "position", "positions", f"the prompts have {P} tokens")
    return per[:, :, ps], ("layer", "pos", "head"), ps, hs


__all__ = [
    "FAMILIES",
    "HEAD_FAMILIES",
    "POS_FAMILIES",
    "Family",
    "cell_effects",
    "resolve_family",
    "rot_name",
    "select",
    "stack",
]
