"""A hook point's activations for the feature dictionaries: the model run only as far as the hook, and the
width of one position there (what an SAE or transcoder reading that hook must take). Activations that overflow
a low-precision dtype warn (:class:`PrecisionWarning`)."""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any

import torch

from ...model.hooks import layer_of

if TYPE_CHECKING:
    from ...model import HookedGPT2


#: Floating dtypes whose range or precision a model's activations can exceed (float16 overflows past 65504).
LOW_PRECISION = (torch.float16, torch.bfloat16)


class PrecisionWarning(RuntimeWarning):
    """Activations read in a low-precision dtype lost values: they overflowed it (inf) or turned NaN, so what
    an SAE trains or is measured on is clipped, not the model's own activations."""


def check_precision(act: torch.Tensor, hook_name: str) -> None:
    """Warn (:class:`PrecisionWarning`, naming ``hook_name`` and the dtype) when an activation in a low-precision
    dtype (float16, bfloat16) holds inf or NaN: the model's values overflowed the dtype. Activations in float32
    or wider are not checked (no cost)."""
    if act.dtype not in LOW_PRECISION or bool(torch.isfinite(act).all()):
        return
    bad = int((~torch.isfinite(act)).sum())
    top = torch.finfo(act.dtype).max
    warnings.warn(
        f"activations at {hook_name} in {str(act.dtype).removeprefix('torch.')} hold {bad} of {act.numel()} values "
        f"that overflowed the dtype (inf or NaN; its largest is {top:.6g}): an SAE reads clipped values there; load "
        "the model in float32 (or bfloat16, whose range is float32's)",
        PrecisionWarning,
        stacklevel=3,
    )


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
    check_precision(got[-1], hook_name)
    return got[-1]


def hook_width(model: HookedGPT2, hook_name: str) -> int:
    """The width of one position's activation at ``hook_name`` (heads and ``d_head`` flattened); an
    unknown hook name raises KeyError with the closest names. Read from the config where it is known (the
    residual stream, sublayer outputs, MLP neurons), else from a one-token forward pass."""
    from ...model.steer import expected_shape

    model.hook_points(hook_name)
    shape = expected_shape(model, hook_name)
    if shape is not None:
        return int(math.prod(shape))
    bos = model.tokenizer.bos_id if model.tokenizer.bos_id is not None else 0
    act = run_to_hook(model, torch.tensor([[bos]]), hook_name)
    return int(act[0, 0].numel())
