"""NaN/inf that a user writes into the forward pass (a hook replacing or writing in place into any hook
point, a residual stream given with start_at_layer) are reported naming where they entered, even
when a fused attention kernel absorbs them and the output comes out finite; forwards without user
hooks are not checked (and cost nothing extra)."""

from __future__ import annotations

import warnings

import pytest
import torch

from gpt2_interp.core.finite import NonFiniteWarning
from gpt2_interp.model import GPT2Config, HookedGPT2
from gpt2_interp.model.config import llama_config

SIZES = dict(n_layer=2, d_model=32, n_head=4, d_mlp=64, n_ctx=16, d_vocab=50)
TOKENS = torch.arange(1, 7)[None]


@pytest.fixture(scope="module")
def llama():
    return HookedGPT2(llama_config(**SIZES, n_kv_heads=2), seed=0)


@pytest.fixture(scope="module")
def gpt2():
    return HookedGPT2(GPT2Config(**SIZES), seed=0)


def _one_nan(act, hook):
    act = act.clone()
    act.view(-1)[3] = float("nan")
    return act


def _inf_in_place(act, hook):
    act.view(-1)[5] = float("inf")


@pytest.mark.parametrize(
    "name", ["blocks.0.attn.hook_rot_q", "blocks.0.attn.hook_rot_k", "blocks.1.attn.hook_q", "blocks.1.attn.hook_v"]
)
def test_nan_into_what_the_fused_kernel_reads_is_reported(llama, name):
    with pytest.warns(NonFiniteWarning, match=rf"hook '_one_nan' returned at '{name}'"):
        llama.run_with_hooks(TOKENS, fwd_hooks=[(name, _one_nan)])


def test_nan_in_rotated_queries_is_reported_by_run_with_cache(llama):
    with pytest.warns(NonFiniteWarning, match=r"'blocks\.0\.attn\.hook_rot_q'"):
        llama.run_with_cache(TOKENS, fwd_hooks=[("blocks.0.attn.hook_rot_q", _one_nan)])


def test_inf_written_in_place_into_the_embedding_is_reported(gpt2):
    with pytest.warns(NonFiniteWarning, match=r"hook '_inf_in_place' wrote into in place at 'hook_embed'"):
        gpt2.run_with_hooks(TOKENS, fwd_hooks=[("hook_embed", _inf_in_place)])


def test_inf_in_a_residual_given_with_start_at_layer_is_reported(gpt2):
    resid = torch.zeros(1, 4, SIZES["d_model"])
    resid[0, 2, 1] = float("inf")
    with pytest.warns(
        NonFiniteWarning, match=r"residual stream given as input with start_at_layer at 'blocks\.1\.hook_resid_pre'"
    ):
        gpt2(resid, start_at_layer=1)


def test_finite_hooks_caches_and_inputs_do_not_warn(gpt2, llama):
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteWarning)
        ref = llama(TOKENS)
        out = llama.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.attn.hook_rot_q", lambda a, h: a.clone())])
        assert torch.equal(out, ref)
        _, cache = gpt2.run_with_cache(TOKENS)
        gpt2(cache["blocks.1.hook_resid_pre"], start_at_layer=1)
        gpt2.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.attn.hook_attn_scores", lambda a, h: a.clone())])
