"""Weight fingerprints: a sha256 per tensor and over a model's weights, to know bit-exactly which
weights an edit, a statistics cache or a tuned lens was made for."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import torch

from ..core.boundary import boundary

if TYPE_CHECKING:
    from .hooked_gpt2 import HookedGPT2


def _tensor_bytes(t: torch.Tensor) -> memoryview:
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data


def tensor_digest(t: torch.Tensor) -> str:
    """sha256 of a tensor's dtype, shape and raw bytes (bit-exact identity)."""
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(_tensor_bytes(t))
    return h.hexdigest()


def parameter_digests(model: HookedGPT2) -> dict[str, str]:
    """``{parameter name: tensor_digest}`` for every distinct parameter (W_U is W_E, once)."""
    return {name: tensor_digest(p) for name, p in model.named_parameters()}


@boundary
def weights_fingerprint(
    model: HookedGPT2, names: Iterable[str] | None = None, digests: Mapping[str, str] | None = None
) -> str:
    """sha256 over the model's weights (or the named subset): equal iff the weights are bit-identical.

    Hashes raw tensor bytes (≈1 GB/s: 75 ms for gpt2-facts, ~0.5 s for gpt2). Pass ``digests``
    from :func:`parameter_digests` to fingerprint several subsets with one pass over the weights.
    """
    if names is None and digests is None:
        return _whole_fingerprint(model)
    digests = dict(digests) if digests is not None else parameter_digests(model)
    keep = sorted(digests if names is None else names)
    missing = [n for n in keep if n not in digests]
    if missing:
        raise KeyError(f"no parameters named {missing[:3]}; the model has e.g. {list(digests)[:3]}")
    h = hashlib.sha256()
    for n in keep:
        h.update(f"{n}={digests[n]};".encode())
    return h.hexdigest()


def _state(model: HookedGPT2) -> tuple:
    """What identifies the weights' current content without reading it: every parameter's storage, shape,
    dtype and in-place version counter (which every in-place write, ``torch.no_grad`` or not, increments)."""
    return tuple((n, p.data_ptr(), p.shape, p.dtype, p._version) for n, p in model.named_parameters())


def _whole_fingerprint(model: HookedGPT2) -> str:
    """:func:`weights_fingerprint` of all the weights, recomputed only when a parameter was written or
    replaced since it was last computed, so that every place an SAE, circuit, lens or edit meets a model can
    check the model's identity at the cost of a glance at its parameters."""
    state = _state(model)
    cached = getattr(model, "_fingerprint_cache", None)
    if cached is not None and cached[0] == state:
        return cached[1]
    digests = parameter_digests(model)
    h = hashlib.sha256()
    for n in sorted(digests):
        h.update(f"{n}={digests[n]};".encode())
    fp = h.hexdigest()
    object.__setattr__(model, "_fingerprint_cache", (state, fp))
    return fp
