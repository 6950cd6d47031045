"""Steering: add ``scale · direction`` to an activation for the span of a ``with`` block or a generation.

A :class:`Steer` is a value (a direction, the hook point it is added at, a scale, the positions);
:func:`steering` attaches one or several to a model through ordinary forward hooks and removes them on
exit, also when the body raises, so a steered model is the plain model again afterwards. The direction
is any vector of the activation's per-position shape (``[d_model]`` on the residual stream): a
difference of means over contrast pairs, a probe's weights, an SAE decoder row
(:mod:`gpt2_interp.analysis.features.steering` builds and measures them).

Positions are columns of each forward pass's input, negatives counting from the end: the model pads
lists of prompts on the left, so ``-1`` is every row's last token. Generation (``generate(steer=…)``)
reads them as positions of the prompt: ``positions=None`` steers the prompt and every new token,
given positions steer those prompt tokens only (the new tokens see them through the cache).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..core.boundary import boundary
from ..core.checks import as_index_list, as_int, check_number
from .hooks import HookPoint, suggest, switch_of

if TYPE_CHECKING:
    from .hooked_gpt2 import HookedGPT2

#: hook points whose activation is not ``[batch, pos, …]`` per position, or is not a vector to add to
_NOT_STEERABLE = {
    "hook_attn_scores": "[batch, head, query, key] attention scores",
    "hook_pattern": "[batch, head, query, key] attention probabilities",
    "hook_scale": "a norm's [batch, pos, 1] scale",
    "hook_tokens": "token ids",
}


class ZeroDirectionWarning(UserWarning):
    """A steering direction is the zero vector: adding any multiple of it changes nothing (e.g. a difference of
    means over identical positive and negative texts, or a dead SAE latent's decoder row)."""


@boundary
@dataclass(frozen=True)
class Steer:
    """``scale · direction`` added at the hook point ``at`` (a full hook name such as
    ``blocks.6.hook_resid_post``), at every position (``positions=None``) or at the listed columns of
    the input (negatives from the end; ``-1`` is each left-padded row's last token).

    ``direction``: ``[*per_position_shape]`` — ``[d_model]`` for the residual stream and the
    attention/MLP outputs, ``[d_mlp]`` for ``mlp.hook_post``, ``[head, d_head]`` for ``attn.hook_z``. NaN/inf
    in it is refused; a zero direction warns (:class:`ZeroDirectionWarning`)."""

    direction: torch.Tensor
    at: str
    scale: float = 1.0
    positions: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.direction, torch.Tensor):
            raise TypeError(f"direction must be a tensor, got {type(self.direction).__name__}")
        if self.direction.ndim == 0 or not self.direction.is_floating_point():
            raise ValueError(
                f"direction must be a float vector such as [d_model], got a {self.direction.dtype} tensor of "
                f"shape {tuple(self.direction.shape)}"
            )
        if not bool(torch.isfinite(self.direction).all()):
            raise ValueError("direction holds NaN or inf")
        if not bool(self.direction.any()):
            warnings.warn(
                f"steering at {self.at} with a zero direction: adding it (at any scale) changes nothing",
                ZeroDirectionWarning,
                stacklevel=4,
            )
        object.__setattr__(self, "scale", check_number(self.scale, "scale"))
        if self.positions is not None:
            given = as_index_list(self.positions, "positions", "a list of ints or None")
            if not given:
                raise ValueError("positions is empty: give a list of positions, or None for every position")
            object.__setattr__(self, "positions", tuple(as_int(p, "position") for p in given))

    def check(self, model: HookedGPT2) -> None:
        """Raise a clear error unless ``at`` is a hook point of ``model`` that takes an added vector
        (KeyError with the closest names; ValueError for attention patterns, norm scales, token ids,
        a hook point whose switch (``cfg.use_…``) is off, or a direction of the wrong size)."""
        names = model.hook_names()
        if self.at not in names:
            raise KeyError(f"unknown hook name {self.at!r}.{suggest(self.at, names)} See model.hook_names().")
        leaf = self.at.rsplit(".", 1)[-1]
        if leaf in _NOT_STEERABLE:
            raise ValueError(
                f"cannot steer at {self.at!r}: it holds {_NOT_STEERABLE[leaf]}, not a vector per position; steer the "
                "residual stream (hook_resid_pre/mid/post), hook_attn_out, hook_mlp_out, mlp.hook_post or attn.hook_z"
            )
        switch = switch_of(self.at)
        if switch is not None and not getattr(model.cfg, switch):
            raise ValueError(
                f"{self.at!r} fires only with model.cfg.{switch} = True (set it with model.set_{switch}(True)), "
                "so steering it would change nothing"
            )
        want = expected_shape(model, self.at)
        if want is not None and tuple(self.direction.shape) != want:
            raise ValueError(
                f"direction has shape {tuple(self.direction.shape)}, but {self.at!r} holds vectors of shape {want} "
                f"in {model.cfg.name}"
            )

    def hook(self) -> Any:
        """The forward hook adding ``scale · direction``: ``fn(activation [batch, pos, …], hook)``. A
        direction of another per-position shape, or a position outside the input, raises ValueError
        or IndexError on the forward pass."""
        positions, scale = self.positions, self.scale
        cached: dict[tuple[Any, Any], torch.Tensor] = {}

        def steer(act: torch.Tensor, hook: HookPoint) -> torch.Tensor:
            if tuple(act.shape[2:]) != tuple(self.direction.shape):
                raise ValueError(
                    f"steering at {hook.name}: direction has shape {tuple(self.direction.shape)}, the activation "
                    f"[batch, pos, …] has {tuple(act.shape)}"
                )
            key = (act.device, act.dtype)
            if key not in cached:
                cached[key] = (scale * self.direction.to(act.device, torch.float32)).to(act.dtype)
            delta = cached[key]
            if positions is None:
                return act + delta
            width = act.shape[1]
            bad = [p for p in positions if not -width <= p < width]
            if bad:
                raise IndexError(f"steering position {bad[0]} is outside the input of {width} tokens")
            mask = torch.zeros(width, dtype=act.dtype, device=act.device)
            mask[[p % width for p in positions]] = 1
            return act + mask.view(1, width, *([1] * (act.ndim - 2))) * delta

        steer.__name__ = f"steer({self.at}, scale={scale:g})"
        return steer


def expected_shape(model: HookedGPT2, name: str) -> tuple[int, ...] | None:
    """The per-position shape of the activation at hook point ``name`` when it is known from the config
    (residual stream, sublayer outputs, norms' outputs, MLP neurons); None for the others, which are
    checked on the first forward pass."""
    c = model.cfg
    leaf = name.rsplit(".", 1)[-1]
    if leaf in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "hook_attn_out", "hook_mlp_out"):
        return (c.d_model,)
    if leaf in ("hook_embed", "hook_pos_embed", "hook_normalized", "hook_in"):
        return (c.d_model,)
    if name.endswith(("mlp.hook_pre", "mlp.hook_post", "mlp.hook_pre_linear")):
        return (c.d_mlp,)
    return None


def as_steers(steer: Steer | Sequence[Steer]) -> list[Steer]:
    """One :class:`Steer` or a sequence of them as a list (anything else raises TypeError)."""
    items = [steer] if isinstance(steer, Steer) else list(steer) if isinstance(steer, (list, tuple)) else None
    if items is None or not all(isinstance(s, Steer) for s in items):
        raise TypeError(f"steer takes a Steer or a list of Steer values, got {type(steer).__name__}")
    return items


@contextmanager
def steering(model: HookedGPT2, steer: Steer | Sequence[Steer]) -> Iterator[HookedGPT2]:
    """Add every :class:`Steer` of ``steer`` to ``model`` for the ``with`` block (all are checked first,
    so a bad one attaches none); each is removed on exit, also when the body raises."""
    steers = as_steers(steer)
    for s in steers:
        s.check(model)
    with model.hooks(fwd_hooks=[(s.at, s.hook()) for s in steers]):
        yield model


def for_generation(
    model: HookedGPT2, steer: Steer | Sequence[Steer], prompt_width: int
) -> tuple[list[Steer], list[Steer]]:
    """``(every step, prompt only)``: how ``generate`` applies ``steer`` to a left-padded prompt of
    ``prompt_width`` columns. Steers without positions act on every position of every pass; steers
    with positions act on those prompt columns (made non-negative), in the prompt's pass (and in every
    pass without a KV cache, which re-reads the whole sequence). A position outside the prompt raises
    IndexError."""
    steers = as_steers(steer)
    every, prompt = [], []
    for s in steers:
        s.check(model)
        if s.positions is None:
            every.append(s)
            continue
        bad = [p for p in s.positions if not -prompt_width <= p < prompt_width]
        if bad:
            raise IndexError(f"steering position {bad[0]} is outside the prompt of {prompt_width} tokens")
        prompt.append(Steer(s.direction, s.at, s.scale, tuple(p % prompt_width for p in s.positions)))
    return every, prompt


__all__ = ["Steer", "as_steers", "expected_shape", "for_generation", "steering"]
