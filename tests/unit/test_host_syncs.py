"""No hidden host syncs in the batched engine: per-chunk code reads nothing back from tensors.

On a GPU every ``.item()``, ``.tolist()``, ``bool(t)``, ``int(t)``, ``.cpu()`` … of a device tensor
waits for all queued work. The staircase engine decides everything about rows and chunks on the
CPU up front, so the number of tensor read-backs of a sweep must not grow with its number of
chunks. Counted here on the CPU by wrapping the Python-level read-back methods of ``torch.Tensor``
(``benchmarks/gpu_check.py`` counts the real syncs on CUDA with ``torch.cuda.set_sync_debug_mode``).
"""

from __future__ import annotations

import collections
import contextlib
import traceback

import pytest
import torch

from gpt2_interp.analysis.patching import logit_diff, patch
from gpt2_interp.analysis.tracing import causal_trace
from gpt2_interp.model import GPT2Config, HookedGPT2

READ_BACKS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


@contextlib.contextmanager
def count_read_backs(monkeypatch):
    """Count Python-level tensor read-backs made from gpt2_interp code, by source line."""
    counts: collections.Counter = collections.Counter()
    for name in READ_BACKS:
        original = getattr(torch.Tensor, name)

        def wrapped(self, *a, __original=original, __name=name, **k):
            frame = traceback.extract_stack(limit=2)[0]
            if "gpt2_interp" in frame.filename:
                counts[f"{frame.filename.split('gpt2_interp')[-1]}:{frame.lineno} {__name}"] += 1
            return __original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    try:
        yield counts
    finally:
        monkeypatch.undo()


@pytest.fixture(scope="module")
def tiny():
    return HookedGPT2(GPT2Config(n_layer=3, d_model=32, n_head=4, d_mlp=64, n_ctx=32, name="tiny"), seed=0).eval()


def test_patching_sweep_read_backs_do_not_grow_with_the_number_of_chunks(tiny, monkeypatch):
    clean = ["The capital of France is", "A cat sat on the"]  # different lengths: padded, masked
    corrupt = ["The capital of Italy is", "A dog sat on the"]
    metric = logit_diff(" Paris", " Rome")
    with count_read_backs(monkeypatch) as one_chunk:
        a = patch(tiny, clean, corrupt, metric, hook="resid_pre", batch_size=10_000, progress=False)
    with count_read_backs(monkeypatch) as many_chunks:
        b = patch(tiny, clean, corrupt, metric, hook="resid_pre", batch_size=2, progress=False)
    torch.testing.assert_close(a.values, b.values)
    assert many_chunks == one_chunk, (many_chunks - one_chunk) or (one_chunk - many_chunks)


def test_causal_trace_read_backs_do_not_grow_with_the_number_of_chunks(tiny, monkeypatch):
    with count_read_backs(monkeypatch) as one_chunk:
        a = causal_trace(tiny, "The capital of France is", "France", samples=3, batch_size=10_000, progress=False)
    with count_read_backs(monkeypatch) as many_chunks:
        b = causal_trace(tiny, "The capital of France is", "France", samples=3, batch_size=3, progress=False)
    torch.testing.assert_close(a.scores, b.scores)
    assert many_chunks == one_chunk, (many_chunks - one_chunk) or (one_chunk - many_chunks)


def test_model_forward_on_given_tokens_and_mask_reads_back_only_the_range_check(tiny, monkeypatch):
    tokens = torch.randint(0, 100, (3, 8))
    mask = torch.ones(3, 8, dtype=torch.long)
    mask[0, :2] = 0
    with count_read_backs(monkeypatch) as counts:
        tiny(tokens, attention_mask=mask)
    assert sum(counts.values()) == 1, counts  # the token-range check, one .tolist()
