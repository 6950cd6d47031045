"""What every estimator of one :func:`~.attribute` call shares: the sweep's settings (:class:`Sweep`),
one chunk of prompt pairs (:class:`Chunk`) and the chunk's unpatched runs (:func:`unpatched_runs`),
computed without autograd and handed back as normal tensors that autograd may use."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch

from .cells import Family
from .readout import Readout

if TYPE_CHECKING:
    from ...model import HookedGPT2


@dataclass
class Sweep:
    """The settings of one attribution: model, attributed family and layers, method and its options;
    ``together``: per-head cells patched at every position at once; ``tick(passes)``: told the
    forward passes (one prompt each) done as the expensive loops advance (a progress bar)."""

    model: HookedGPT2
    fam: Family
    layers: list[int]
    method: str
    direction: str
    ig_steps: int
    ig_path: str
    graddrop: bool
    together: bool
    tick: Callable[[float], None] = field(default=lambda passes: None, repr=False)

    @property
    def names(self) -> list[str]:
        """The attributed hook name of each layer."""
        return [self.fam.names[l] for l in self.layers]


@dataclass
class Chunk:
    """``b`` prompt pairs, rows ``first…first+b`` of ``n_pairs`` (``rows``): the unpatched (base) and
    source tokens ``[b, pos]``, the attention mask and the chunk's metric readout."""

    base_t: torch.Tensor
    src_t: torch.Tensor
    mask: torch.Tensor | None
    rows: tuple[int, int]
    readout: Readout

    @property
    def b(self) -> int:
        return self.base_t.shape[0]


class Runs(NamedTuple):
    """Cached activations and last-position logits of the source run (and of the base run, when asked)."""

    src: dict[str, torch.Tensor]
    src_logits: torch.Tensor
    base: dict[str, torch.Tensor] | None
    base_logits: torch.Tensor | None


class ChunkEstimate(NamedTuple):
    """Per-pair effects ``[b, layer, pos|1, (head)]``, GradDrop magnitudes (or None), base and source metric ``[b]``."""

    effects: torch.Tensor
    graddrop: torch.Tensor | None
    base_metric: torch.Tensor
    src_metric: torch.Tensor


def unpatched_runs(model: HookedGPT2, chunk: Chunk, names: list[str], with_base: bool) -> tuple[Runs, Chunk]:
    """The source run (and with ``with_base`` the base run) of ``chunk``, caching ``names``, without
    autograd; returns the runs and the chunk with its tensors as normal (not inference) tensors,
    so that this works inside a caller's ``torch.no_grad()`` or ``inference_mode()``."""
    n = model.cfg.n_layer
    b = chunk.b
    tokens = torch.cat([chunk.src_t, chunk.base_t]) if with_base else chunk.src_t
    mask = chunk.mask
    rmask = None if mask is None else (torch.cat([mask, mask]) if with_base else mask)
    cache: Mapping[str, torch.Tensor]  # the ActivationCache, then its tensors cloned out of inference mode
    with torch.inference_mode():
        resid, cache = model.run_with_cache(
            tokens, names_filter=list(dict.fromkeys(names)), attention_mask=rmask, stop_at_layer=n
        )
        logits = chunk.readout.logits(resid)
    with torch.inference_mode(False):
        cache = {k: v.clone() for k, v in cache.items()}
        logits = logits.clone()
        chunk = dataclasses.replace(chunk, base_t=chunk.base_t.clone(), mask=None if mask is None else mask.clone())
    src = {k: v[:b] for k, v in cache.items()}
    if not with_base:
        return Runs(src, logits[:b], None, None), chunk
    return Runs(src, logits[:b], {k: v[b:] for k, v in cache.items()}, logits[b:]), chunk


__all__ = ["Chunk", "ChunkEstimate", "Runs", "Sweep", "unpatched_runs"]
