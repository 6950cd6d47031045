"""The δ optimisation's packed steps (only real tokens, packed end to end) give the update of the padded batch."""

from __future__ import annotations

import pytest
import torch

import gpt2_interp as gi
from gpt2_interp.editing import memit
from gpt2_interp.editing.settings import RomeHparams
from gpt2_interp.editing.targets import _Packing, context_prefixes, optimise_deltas
from gpt2_interp.model import HookedGPT2, llama_config

REQS = [
    gi.editing.Request("The capital of {} is", "France", " Rome"),
    gi.editing.Request("{} is located in the city of", "Eiffel Tower", " New York", keep=("The {} is",)),
    gi.editing.Request("{} plays", "Michael Jordan", " soccer"),
]


def _both(model, layer, hp, solve=None, **kw):
    items = [(r, model.tokenizer.encode_ids(r.target)) for r in REQS]
    prefixes = context_prefixes(model, hp.prefix_lengths, hp.prefixes_per_length, hp.prefix_seed)
    return [optimise_deltas(model, items, layer, prefixes, hp, solve, packed=p, **kw) for p in (True, False)]


def _same(packed, padded):
    assert len(packed) == len(padded)
    for a, b in zip(packed, padded):
        assert [len(a["log"])] == [len(b["log"])]  # the same early stop
        scale = float(b["delta"].norm()) or 1.0
        # Adam divides each gradient component by its own magnitude, so the rounding of a small component
        # (the packed and padded batches sum in other orders) reaches δ undamped: 1e-5 on some CPUs
        assert float((a["delta"] - b["delta"]).norm()) <= 3e-5 * scale
        for x, y in zip(a["log"], b["log"]):
            for k in ("loss", "nll"):
                assert abs(x[k] - y[k]) <= 1e-5 * max(abs(y[k]), 1e-3), k
            for k in ("kl", "keep_kl"):  # a small difference of fp32 log-probabilities of magnitude ~10
                assert abs(x[k] - y[k]) <= 1e-6 + 5e-5 * abs(y[k]), k
        assert a["key_scale"] == pytest.approx(b["key_scale"], rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("exact", [True, False])
def test_packed_steps_give_the_padded_batchs_deltas_on_gpt2_facts(facts_model, exact):
    """gpt2-facts (learned positions), three requests of different lengths (one with a keep prompt),
    δ added by the exact rank-one effect or at the subject's last token only, some requests stopping early."""
    hp = RomeHparams.of(
        v_steps=3, v_lr=5.0, exact_edit=exact, prefix_lengths=(5, 10), prefixes_per_length=2, early_stop=2.0
    )
    packed, padded = _both(facts_model, 0, hp, chunk=2)
    _same(packed, padded)
    assert any(float(o["delta"].norm()) > 0 for o in packed)


def test_packed_steps_give_the_padded_batchs_deltas_on_a_rotary_gqa_model():
    """A tiny Llama-family model: RoPE positions are each token's own in its row, grouped-query attention."""
    model = HookedGPT2(llama_config(n_layer=3, d_model=64, n_head=4, n_kv_heads=2, d_mlp=96, n_ctx=64), seed=0).eval()
    hp = RomeHparams.of(v_steps=4, prefix_lengths=(3, 7), prefixes_per_length=2, weight_decay=0.0)
    packed, padded = _both(model, 1, hp)
    _same(packed, padded)
    assert all(float(o["delta"].norm()) > 0 for o in packed)


@pytest.mark.slow
def test_memit_targets_are_the_same_packed_or_padded(facts_model):
    """MEMIT's δ (its norm from the residual) through the same optimiser, packed or padded."""
    hp = memit.MemitHparams.of(facts_model, v_steps=5, prefixes_per_length=2).rome
    packed, padded = _both(facts_model, 0, hp, norm_reference="resid")
    _same(packed, padded)


def test_packing_holds_every_real_token_once_in_causal_segments():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0], [0, 0, 0, 1, 1]])
    model = HookedGPT2(llama_config(n_layer=1, d_model=16, n_head=2, d_mlp=32, n_ctx=16), seed=0)
    p = _Packing.of(model, mask, torch.tensor([0, 1, 3]))  # row 2 is not active
    real = mask.reshape(-1).bool().clone()
    real[2 * 5 : 3 * 5] = False
    assert sorted(p.src[p.real].tolist()) == real.nonzero()[:, 0].tolist()
    assert int((p.slot >= 0).sum()) == int(real.sum())
    flat_src = p.src.reshape(-1)
    for s in (p.slot[p.slot >= 0]).tolist():  # every token maps back to its own slot
        assert p.slot[flat_src[s]] == s
    # a token sees exactly the earlier tokens of its own row
    att = p.mask[:, 0]
    for b in range(p.src.shape[0]):
        for i in range(p.src.shape[1]):
            if not p.real[b, i]:
                assert att[b, i].nonzero()[:, 0].tolist() == [i]
                continue
            row, col = divmod(int(p.src[b, i]), 5)
            seen = sorted(divmod(int(p.src[b, j]), 5) for j in att[b, i].nonzero()[:, 0].tolist())
            assert seen == [(row, c) for c in range(5) if mask[row, c] and c <= col]
