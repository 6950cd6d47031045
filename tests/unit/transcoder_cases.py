"""The attribution-graph tests' shared model: gpt2-facts with untrained transcoders whose every term (encoder
and decoder biases, skip connection) is non-zero, and the tokens of one prompt."""

from __future__ import annotations

import torch

import gpt2_interp as gi
from gpt2_interp.graphs.transcoder import TranscoderSet, TranscoderTrainConfig, new_transcoders
from gpt2_interp.model import HookedGPT2


def random_transcoders(model: HookedGPT2) -> TranscoderSet:
    """Untrained transcoders with non-zero biases and skips (so that every term of the maths is exercised)."""
    ts = new_transcoders(model, TranscoderTrainConfig(d_sae=64, k=8, skip=True, seed=1))
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for t in ts:
            t.b_enc.copy_(0.1 * torch.randn(t.b_enc.shape, generator=g))
            t.b_dec.copy_(0.1 * torch.randn(t.b_dec.shape, generator=g))
            assert t.W_skip is not None
            t.W_skip.copy_(0.05 * torch.randn(t.W_skip.shape, generator=g))
    return ts


def facts_with_transcoders(
    dtype: torch.dtype = torch.float32, prompt: str = "The capital of France is"
) -> tuple[HookedGPT2, TranscoderSet, torch.Tensor]:
    """``(gpt2-facts in dtype, its random transcoders in dtype, the prompt's tokens [pos])``, built afresh on
    each call, so that a module converting or editing them leaves the other modules' alone."""
    model = gi.load("gpt2-facts").to(dtype)
    return model, random_transcoders(model).to(dtype), model.to_tokens(prompt)[0]
