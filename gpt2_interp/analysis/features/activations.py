"""A hook point's activations for the feature dictionaries: the model run only as far as the hook, and the
width of one position there (what an SAE or transcoder reading that hook must take)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ...model.hooks import layer_of

if TYPE_CHECKING:
    from ...model import HookedGPT2


def run_to_hook(model: HookedGPT2, tokens: torch.Tensor, hook_name: str) -> torch.Tensor:
    """The activation at ``hook_name`` ``[batch, pos, ...]`` for token windows ``[batch, pos]``, the model
    run only as far as it needs to (the block holding the hook)."""
    got: list[torch.Tensor] = []

    def grab(x: torch.Tensor, hook: Any) -> None:
        got.append(x.detach())

    grab.reads_only = True  # type: ignore[attr-defined]  # hooks.reads_only's marker: the hook never writes
    layer = layer_of(hook_name)
    stop = None if hook_name.startswith(("ln_final", "unembed")) else (0 if layer is None else layer + 1)
    with model.hooks([(hook_name, grab)]):
        model(tokens.to(model.device), return_type=None, stop_at_layer=stop)
    return got[-1]


def hook_width(model: HookedGPT2, hook_name: str) -> int:
    """The width of one position's activation at ``hook_name`` (heads and ``d_head`` flattened); an
    unknown hook name raises KeyError with the closest names."""
    model.hook_points(hook_name)
    bos = model.tokenizer.bos_id if model.tokenizer.bos_id is not None else 0
    act = run_to_hook(model, torch.tensor([[bos]]), hook_name)
    return int(act[0, 0].numel())
