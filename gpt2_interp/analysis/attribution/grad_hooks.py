"""Temporary hooks that let autograd reach activations: :func:`capture` records (and, at the first
captured point, starts) the graph; :func:`gate` scales the gradient flowing back through a hook
(GradDrop drops a layer's residual contribution with it). No ``.grad`` or ``retain_grad`` state is
left on the model: gradients are taken with ``torch.autograd.grad`` on the captured tensors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class Gate(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by ``keep[0]`` (read at backward time)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, keep: list) -> torch.Tensor:
        ctx.keep = keep
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.keep[0], None


def capture(store: dict[str, torch.Tensor]) -> Callable[[torch.Tensor, Any], torch.Tensor | None]:
    """A hook storing its activation in ``store[hook name]``, as a tensor autograd can differentiate to."""

    def fn(act: torch.Tensor, hook: Any) -> torch.Tensor | None:
        if act.requires_grad:  # already in the graph: record it, leave it
            store[hook.name] = act
            return None
        act = act.detach().requires_grad_(
            True
        )  # the first captured point starts the graph (nothing upstream is needed)
        store[hook.name] = act
        return act

    return fn


def gate(keep: list) -> Callable[[torch.Tensor, Any], torch.Tensor]:
    """A hook passing its activation through :class:`Gate` (``keep``: a one-item list, changed in place)."""
    return lambda act, hook: Gate.apply(act, keep)


__all__ = ["Gate", "capture", "gate"]
