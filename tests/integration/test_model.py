"""The hookable GPT-2 is GPT-2: parity with transformers and TransformerLens, and hook semantics."""

from __future__ import annotations

import pytest
import torch

import gpt2_interp as gi
from gpt2_interp.model import GPT2Config, HookedGPT2

ALL_NAMES = None


def random_tokens(batch=4, pos=24, seed=1):
    return torch.randint(0, 50257, (batch, pos), generator=torch.Generator().manual_seed(seed))


def test_param_count_matches_hf_accounting():
    # HF's num_parameters() for gpt2 counts the tied W_U once: 124,439,808.
    assert HookedGPT2("gpt2").n_params() == 124_439_808


def test_logits_and_loss_match_transformers(hf_gpt2, gpt2):
    tokens = random_tokens()
    with torch.no_grad():
        ref = hf_gpt2(tokens, labels=tokens)
    logits, loss = gpt2(tokens, return_type="both")
    assert (logits - ref.logits).abs().max().item() <= 1e-4
    assert abs(loss.item() - ref.loss.item()) <= 1e-5


@pytest.mark.slow
def test_to_transformers_and_save_round_trip(gpt2, tmp_path):
    transformers = pytest.importorskip("transformers")
    tokens = random_tokens(2, 12)
    ours = gpt2(tokens)
    hf = gpt2.to_transformers()
    assert (hf(tokens).logits - ours).abs().max().item() <= 1e-4
    gpt2.save(tmp_path / "saved")
    reloaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "saved").eval()
    assert (reloaded(tokens).logits - ours).abs().max().item() <= 1e-4


@pytest.mark.slow
def test_every_hook_matches_transformer_lens(hf_gpt2, gpt2, tl_from_hf):
    ref = tl_from_hf(hf_gpt2)
    tokens = random_tokens(2, 16)
    ref.set_use_attn_result(True), gpt2.set_use_attn_result(True)  # every hook, the opt-in hook_result too
    try:
        ref_logits, ref_cache = ref.run_with_cache(tokens)
        logits, cache = gpt2.run_with_cache(tokens)
    finally:
        gpt2.set_use_attn_result(False)
    shared = [n for n in cache if n in ref_cache]
    # every hook that fires without the receiver-input switches (those: test_split_inputs.py), unembed's included
    assert len(shared) == len(cache) == 12 * 18 + 6
    worst = max((cache[n] - ref_cache[n]).abs().max().item() for n in shared)
    assert worst <= 1e-4
    assert (logits - ref_logits).abs().max().item() <= 1e-4
    # and back: a TransformerLens model converts to ours with equal logits
    assert (gi.from_transformer_lens(ref)(tokens) - logits).abs().max().item() <= 1e-4


def test_hook_names_and_shapes(tiny):
    names = tiny.hook_names()
    assert names[:2] == ["hook_embed", "hook_pos_embed"] and names[-4:] == [
        "ln_final.hook_scale",
        "ln_final.hook_normalized",
        "unembed.hook_in",
        "unembed.hook_out",
    ]
    _, cache = tiny.run_with_cache("The cat sat on the mat")  # 7 tokens with BOS
    c = tiny.cfg
    assert cache["blocks.1.attn.hook_q"].shape == (1, 7, c.n_head, c.d_head)
    assert cache["pattern", 0].shape == (1, c.n_head, 7, 7)
    assert cache["blocks.0.mlp.hook_post"].shape == (1, 7, c.d_mlp)
    assert cache["blocks.0.ln1.hook_scale"].shape == (1, 7, 1)
    assert torch.allclose(cache["pattern", 0].sum(-1), torch.ones(1, c.n_head, 7))
    assert (cache["pattern", 0].triu(1) == 0).all()  # causal


def test_fused_attention_equals_materialised(tiny):
    tokens = random_tokens(3, 20)
    fused = tiny(tokens)
    with tiny.hooks(
        [("blocks.0.attn.hook_pattern", lambda a, h: None), ("blocks.1.attn.hook_attn_scores", lambda a, h: None)]
    ):
        materialised = tiny(tokens)
    assert (fused - materialised).abs().max().item() <= 1e-5


def test_cache_filter_stores_only_requested_names(tiny):
    _, cache = tiny.run_with_cache("Hello world", names_filter=["blocks.1.hook_resid_post"])
    assert list(cache) == ["blocks.1.hook_resid_post"]
    _, cache = tiny.run_with_cache("Hello world", names_filter=lambda n: n.endswith("hook_z"))
    assert sorted(cache) == ["blocks.0.attn.hook_z", "blocks.1.attn.hook_z"]
    with pytest.raises(KeyError, match="include it in run_with_cache"):
        cache["blocks.0.hook_resid_pre"]


def test_left_padded_batch_equals_individual_runs(tiny):
    prompts = ["Hi", "The quick brown fox jumps over", "A longer prompt that has quite a few more tokens in it"]
    batched = tiny(prompts)
    _, mask = tiny.tokenize(prompts)
    assert mask is not None and mask.sum(1).tolist() == [len(tiny.to_tokens(p)[0]) for p in prompts]
    for i, p in enumerate(prompts):
        alone = tiny(p)[0]
        assert (batched[i, -alone.shape[0] :] - alone).abs().max().item() <= 1e-5


@pytest.mark.slow
def test_kv_cache_generation_equals_no_cache(tiny):
    prompts = ["Hi there", "The quick brown fox jumps over the"]
    tokens = tiny.to_tokens(prompts)
    with_cache = tiny.generate(tokens, max_new_tokens=12, use_kv_cache=True, stop_at_eos=False, do_sample=False)
    without = tiny.generate(tokens, max_new_tokens=12, use_kv_cache=False, stop_at_eos=False, do_sample=False)
    assert torch.equal(with_cache, without)
    # batched generation equals one prompt at a time
    for i, p in enumerate(prompts):
        assert (
            tiny.generate(p, 12, stop_at_eos=False, do_sample=False)
            == tiny.generate(prompts, 12, stop_at_eos=False, do_sample=False)[i]
        )


def test_sampling_is_seeded(tiny):
    a = tiny.generate("Hello", 8, temperature=1.0, top_k=50, seed=3)
    b = tiny.generate("Hello", 8, temperature=1.0, top_k=50, seed=3)
    assert a == b


def test_replacement_hook_changes_downstream(tiny):
    tokens = random_tokens(1, 8)
    _, clean = tiny.run_with_cache(tokens)

    def zero(act, hook):
        return torch.zeros_like(act)

    logits, cache = tiny.run_with_cache(tokens, fwd_hooks=[("blocks.0.hook_mlp_out", zero)])
    assert cache["blocks.0.hook_mlp_out"].abs().max() == 0
    # resid_mid of block 0 is untouched, resid_post is resid_mid + 0
    assert torch.equal(cache["blocks.0.hook_resid_mid"], clean["blocks.0.hook_resid_mid"])
    assert torch.allclose(cache["blocks.0.hook_resid_post"], cache["blocks.0.hook_resid_mid"])
    assert not torch.allclose(logits, tiny(tokens))


def test_hooks_removed_after_exceptions(tiny):
    def boom(act, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        tiny.run_with_hooks("Hello", fwd_hooks=[("blocks.0.hook_resid_pre", boom)])
    assert not any(hp.has_hooks for hp in tiny.hook_dict.values())
    with pytest.raises(ValueError), tiny.hooks([(lambda n: "resid" in n, lambda a, h: None)]):
        assert tiny.hook_dict["blocks.1.hook_resid_mid"].has_hooks
        raise ValueError
    assert not any(hp.has_hooks for hp in tiny.hook_dict.values())


def test_start_and_stop_at_layer_compose(tiny):
    tokens = random_tokens(2, 10)
    mid = tiny(tokens, stop_at_layer=1)
    _, cache = tiny.run_with_cache(tokens, names_filter="blocks.1.hook_resid_pre")
    assert torch.equal(mid, cache["blocks.1.hook_resid_pre"])
    assert (tiny(mid, start_at_layer=1) - tiny(tokens)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_runs_close_to_fp32(tiny, dtype):
    tokens = random_tokens(2, 10)
    ref = tiny(tokens)
    low = HookedGPT2(tiny.cfg, seed=0).eval().to(dtype=dtype)
    out = low(tokens)
    assert out.dtype == dtype
    assert (out.float() - ref).abs().max().item() < 0.1
    assert low.generate(tokens, 4, do_sample=False).shape == (2, 14)


# ---------------------------------------------------------------- errors that say what to do
def test_unknown_hook_name_suggests_close_names(tiny):
    with pytest.raises(KeyError, match=r"blocks\.0\.hook_resid_pre"):
        tiny.run_with_hooks("Hi", fwd_hooks=[("blocks.0.hook_resid_pr", lambda a, h: None)])
    with pytest.raises(KeyError, match="hook_names"):
        tiny.run_with_cache("Hi", names_filter=["blocks.0.hook_resid_pr"])


def test_too_long_input_names_both_lengths(tiny):
    with pytest.raises(ValueError, match=r"70 tokens.*context of 64"):
        tiny(torch.zeros(1, 70, dtype=torch.long))
    with pytest.raises(ValueError, match="context of 64"):
        tiny.generate("Hello", max_new_tokens=100, do_sample=False)


def test_bad_inputs(tiny):
    with pytest.raises(ValueError, match="empty"):
        tiny(torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="no input"):
        tiny([])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tiny(torch.tensor([[1, 50257]]))
    with pytest.raises(ValueError, match="keep the shape"):
        tiny.run_with_hooks("Hi", fwd_hooks=[("blocks.0.hook_resid_pre", lambda a, h: a[:, :1])])
    with pytest.raises(ValueError, match="is 2 tokens"):
        tiny.to_single_token(" Parisx")
    assert tiny.to_single_token(" Paris") == 6342


def test_config_validation():
    with pytest.raises(ValueError, match="divisible"):
        GPT2Config(d_model=100, n_head=3)
