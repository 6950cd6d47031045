"""TransformerLens's ``utils`` names that TL code reaches for: ``from gpt2_interp import utils``.

``utils.get_act_name("k", 6)`` is ``"blocks.6.attn.hook_k"``; ``utils.Slice`` is what
``run_with_cache(pos_slice=)`` and the cache's ``pos_slice=`` accept (an int, slice, tuple or list work too).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .model.hooks import get_act_name, hook_name

__all__ = ["Slice", "get_act_name", "hook_name", "to_numpy"]


class Slice:
    """A position selection: an int (drops the dimension), a ``(start, stop[, step])`` tuple,
    a ``slice``, a list/array of indices, or None (everything)."""

    def __init__(self, input_slice: Any = None) -> None:
        if isinstance(input_slice, tuple):
            input_slice = slice(*input_slice)
        elif input_slice is None:
            input_slice = slice(None)
        elif isinstance(input_slice, (list, np.ndarray)):
            input_slice = torch.as_tensor(input_slice)
        elif not isinstance(input_slice, (int, slice, torch.Tensor)):
            raise ValueError(
                f"Slice takes an int, tuple, slice, list, array, tensor or None; got {type(input_slice).__name__}"
            )
        self.slice = input_slice

    def apply(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        index: list[Any] = [slice(None)] * tensor.ndim
        index[dim] = self.slice
        return tensor[tuple(index)]


def to_numpy(t: Any) -> np.ndarray:
    """A tensor (any device, any grad state), list or number as a numpy array."""
    return t.detach().cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
