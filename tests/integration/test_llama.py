"""GPT-2's descendants as configuration of the one model (RMSNorm, RoPE, SwiGLU, GQA, untied W_U):
parity on logits and every shared hook with transformers' LlamaForCausalLM and TransformerLens on
random weights, conversion both ways, KV-cache generation, left padding under RoPE, bad configs."""

from __future__ import annotations

import pytest
import torch

import gpt2_interp as gi
from gpt2_interp.model import GPT2Config, HookedGPT2, llama_config

transformers = pytest.importorskip("transformers")

from tests.families_cases import VOCAB, hf_llama, llama_like_config, tl_llama  # noqa: E402

TOKENS = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))


def close(a, b, tol=1e-4):
    """Max abs difference ≤ tol; masked scores (-inf) must be masked in both."""
    a, b = a.float(), b.float()
    if not torch.equal(a.isinf(), b.isinf()):
        return False
    finite = a.isfinite()
    return (a[finite] - b[finite]).abs().max().item() <= tol


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def llama_pair(request):
    hf = hf_llama(tied=request.param)
    return hf, gi.from_transformers(hf)


def _hf_activations(hf, tokens):
    """transformers' activations under our hook names, recorded with torch forward hooks on its modules."""
    acts, handles = {}, []
    n_head, n_kv = hf.config.num_attention_heads, hf.config.num_key_value_heads

    def out(name, reshape=None):
        def fn(mod, inp, output):
            o = output[0] if isinstance(output, tuple) else output
            acts[name] = o if reshape is None else o.unflatten(-1, (reshape, -1))

        return fn

    def inp(name, reshape=None):
        def fn(mod, args):
            acts[name] = args[0] if reshape is None else args[0].unflatten(-1, (reshape, -1))

        return fn

    for i, layer in enumerate(hf.model.layers):
        b = f"blocks.{i}."
        a = layer.self_attn
        handles += [
            layer.register_forward_pre_hook(inp(b + "hook_resid_pre")),
            a.q_proj.register_forward_hook(out(b + "attn.hook_q", n_head)),
            a.k_proj.register_forward_hook(out(b + "attn.hook_k", n_kv)),
            a.v_proj.register_forward_hook(out(b + "attn.hook_v", n_kv)),
            a.o_proj.register_forward_pre_hook(inp(b + "attn.hook_z", n_head)),
            a.o_proj.register_forward_hook(out(b + "hook_attn_out")),
            layer.post_attention_layernorm.register_forward_pre_hook(inp(b + "hook_resid_mid")),
            layer.mlp.gate_proj.register_forward_hook(out(b + "mlp.hook_pre")),
            layer.mlp.up_proj.register_forward_hook(out(b + "mlp.hook_pre_linear")),
            layer.mlp.down_proj.register_forward_pre_hook(inp(b + "mlp.hook_post")),
            layer.mlp.down_proj.register_forward_hook(out(b + "hook_mlp_out")),
            layer.register_forward_hook(out(b + "hook_resid_post")),
            layer.input_layernorm.register_forward_hook(out(b + "ln1.normed")),
            layer.post_attention_layernorm.register_forward_hook(out(b + "ln2.normed")),
        ]
    handles.append(hf.model.norm.register_forward_hook(out("ln_final.normed")))
    try:
        with torch.no_grad():
            res = hf(tokens, output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    for i, pattern in enumerate(res.attentions):
        acts[f"blocks.{i}.attn.hook_pattern"] = pattern
    # RoPE applied by transformers' own function to its own q/k
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    pos = torch.arange(tokens.shape[1])[None]
    cos, sin = hf.model.rotary_emb(acts["blocks.0.hook_resid_pre"], pos)
    for i in range(len(hf.model.layers)):
        b = f"blocks.{i}.attn."
        q, k = apply_rotary_pos_emb(acts[b + "hook_q"].transpose(1, 2), acts[b + "hook_k"].transpose(1, 2), cos, sin)
        acts[b + "hook_rot_q"], acts[b + "hook_rot_k"] = q.transpose(1, 2), k.transpose(1, 2)
    return res.logits, acts


def test_logits_and_every_shared_hook_match_transformers_llama(llama_pair):
    hf, ours = llama_pair
    assert ours.cfg.n_kv == 2 and ours.cfg.tied_embeddings == hf.config.tie_word_embeddings
    ref_logits, ref = _hf_activations(hf, TOKENS)
    logits, cache = ours.run_with_cache(TOKENS)
    assert close(logits, ref_logits)
    compared = 0
    for name, want in ref.items():
        if name.endswith("normed"):  # HF's norm output = our hook_normalized · w
            ln = name.removesuffix(".normed")
            module = (
                ours.ln_final if ln == "ln_final" else getattr(ours.blocks[int(ln.split(".")[1])], ln.split(".")[2])
            )
            got = cache[f"{ln}.hook_normalized"] * module.w
        else:
            got = cache[name]
        assert got.shape == want.shape, name
        assert close(got, want), f"{name}: max diff {(got - want).abs().max():.2e}"
        compared += 1
    assert compared == 2 * 17 + 1  # every block hook transformers exposes, and the final norm


def test_matches_transformer_lens_where_it_supports_the_config(llama_pair):
    hf, ours = llama_pair
    ref = tl_llama(hf)
    with torch.no_grad():
        ref_logits, ref_cache = ref.run_with_cache(TOKENS)
    logits, cache = ours.run_with_cache(TOKENS)
    assert close(logits, ref_logits)
    shared = [n for n in ours.hook_names() if n in ref_cache.cache_dict and ref_cache[n].shape == cache[n].shape]
    assert len(shared) >= 2 * 17, sorted(set(ours.hook_names()) - set(shared))
    for n in shared:
        assert close(cache[n], ref_cache[n]), f"{n}: max diff {(cache[n] - ref_cache[n]).abs().max():.2e}"
    # hook_k/hook_v carry the KV heads in both ([batch, pos, n_kv, d_head]), so they were compared above
    assert {"blocks.1.attn.hook_k", "blocks.1.attn.hook_rot_k", "blocks.1.attn.hook_pattern"} <= set(shared)
    assert cache["blocks.1.attn.hook_k"].shape[2] == 2
    # it also loads from TransformerLens (GQA's _W_K/_W_V)
    back = gi.from_transformer_lens(ref, config=ours.cfg)
    assert close(back(TOKENS), logits)


def test_to_transformers_and_hf_directory_round_trip(llama_pair, tmp_path):
    hf, ours = llama_pair
    again = ours.to_transformers()
    assert type(again).__name__ == "LlamaForCausalLM"
    with torch.no_grad():
        assert close(again(TOKENS).logits, hf(TOKENS).logits, 1e-5)
    hf.save_pretrained(tmp_path / "hf")  # transformers writes the directory, we read it
    loaded = gi.load(tmp_path / "hf")
    assert loaded.cfg.family == "llama" and close(loaded(TOKENS), ours(TOKENS), 1e-6)
    ours.save(tmp_path / "ours")  # we write, transformers reads
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "ours").eval()
    with torch.no_grad():
        assert close(back(TOKENS).logits, ours(TOKENS), 1e-5)


def test_kv_cache_generation_equals_no_cache(llama_pair):
    _, ours = llama_pair
    prompt = TOKENS[:, :5]
    fast = ours.generate(prompt, max_new_tokens=8, use_kv_cache=True, stop_at_eos=False, do_sample=False)
    slow = ours.generate(prompt, max_new_tokens=8, use_kv_cache=False, stop_at_eos=False, do_sample=False)
    assert torch.equal(fast, slow) and fast.shape == (2, 13)


def test_left_padded_batch_equals_single_prompts_under_rope(llama_pair):
    _, ours = llama_pair
    rows = [TOKENS[0, :4].tolist(), TOKENS[1].tolist()]
    tokens = torch.zeros(2, 11, dtype=torch.long)  # pad id 0, left
    mask = torch.zeros(2, 11, dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, -len(r) :], mask[i, -len(r) :] = torch.tensor(r), 1
    batch = ours(tokens, attention_mask=mask)
    for i, r in enumerate(rows):
        alone = ours(torch.tensor([r]))
        assert close(batch[i, -len(r) :], alone[0], 1e-5)
    # the same through the KV cache, one token at a time after the padded prompt
    from gpt2_interp.model import KVCache

    cache = KVCache(ours.cfg, 2, 13, ours.device, ours.dtype)
    ours(tokens, attention_mask=mask, past_kv=cache)
    nxt = torch.tensor([[5], [7]])
    step = ours(nxt, attention_mask=torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1), past_kv=cache)
    for i, r in enumerate(rows):
        assert close(step[i, -1], ours(torch.tensor([r + nxt[i].tolist()]))[0, -1], 1e-5)


def test_gqa_per_head_views_and_parameter_names():
    # one key/value head for all four query heads (multi-query, GQA's extreme); one layer is enough here
    m = HookedGPT2(llama_like_config(n_layer=1, n_kv_heads=1), seed=0)
    a = m.blocks[0].attn
    assert a.W_Q.shape == (4, 64, 16) and a.W_K.shape == (1, 64, 16) and a.W_V.shape == (1, 64, 16)
    assert a.b_QKV is None and m.blocks[0].mlp.b_out is None and m.W_pos is None
    assert {n.split(".", 2)[-1] for n, _ in m.named_parameters() if n.startswith("blocks.0.")} == {
        "ln1.w",
        "attn.W_QKV",
        "attn.W_O",
        "ln2.w",
        "mlp.W_gate",
        "mlp.W_in",
        "mlp.W_out",
    }
    # the per-head view writes through to the fused weight the forward uses
    with torch.no_grad():
        a.W_K.zero_()
    k = m.run_with_cache(torch.tensor([[1, 2, 3]]), names_filter="blocks.0.attn.hook_k")[1]["blocks.0.attn.hook_k"]
    assert k.abs().max() == 0
    # the materialised-attention path (scores hooked) equals the fused one under GQA
    t = torch.tensor([[1, 2, 3, 4, 5]])
    fused = m(t)
    logits, _ = m.run_with_cache(t, names_filter="blocks.0.attn.hook_pattern")
    assert close(fused, logits, 1e-5)


def test_gpt2_config_is_untouched_by_the_new_fields():
    c = GPT2Config()
    assert (c.norm, c.positional, c.mlp, c.n_kv, c.bias, c.tied_embeddings, c.family) == (
        "layernorm",
        "learned",
        "gelu",
        12,
        True,
        True,
        "gpt2",
    )
    m = HookedGPT2(GPT2Config(n_layer=1, d_model=32, n_head=4, d_mlp=64, n_ctx=16, d_vocab=50))
    assert "blocks.0.attn.hook_rot_q" not in m.hook_names() and "hook_pos_embed" in m.hook_names()


def test_llama_configs_we_do_not_implement_are_refused():
    base = hf_llama(tied=True).config.to_dict()
    with pytest.raises(ValueError, match=r"rope_type='longrope' is not supported; accepted: 'default', 'linear'"):
        GPT2Config.from_hf_dict(
            {**base, "rope_parameters": {"rope_type": "longrope", "factor": 2.0, "rope_theta": 1e4}}
        )
    with pytest.raises(ValueError, match="rope_type='dynamic'"):
        GPT2Config.from_hf_dict({**base, "rope_scaling": {"rope_type": "dynamic", "factor": 8.0}})
    with pytest.raises(ValueError, match="attention_bias"):
        GPT2Config.from_hf_dict({**base, "attention_bias": True})
    with pytest.raises(ValueError, match=r"model_type='mamba'.*'gpt2', 'llama', 'qwen2'"):
        GPT2Config.from_hf_dict({**base, "model_type": "mamba"})
    with pytest.raises(ValueError, match=r"n_kv_heads=3 must .* divide n_head=4"):
        llama_config(n_head=4, d_model=64, n_kv_heads=3)
    with pytest.raises(ValueError, match="norm='batchnorm'"):
        GPT2Config(norm="batchnorm")
