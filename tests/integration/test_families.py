"""The model families as config values of the one model, each exact against its transformers class on
tiny random weights that keep the family's features (GQA, biases, partial or interleaved rotary, q/k
norms, sandwich and post norms, soft-caps, a sliding window shorter than the prompts): fp32 logits of a
left-padded batch, each row equal to its prompt alone, greedy KV-cache generation token for token,
``to_transformers`` round trip, HF directories both ways, the logit lens at the last layer, and the
real models' parameter counts per layer.

Run: ``pytest -p no:cacheprovider -q tests/integration/test_families.py``."""

from __future__ import annotations

import pytest
import torch

import gpt2_interp as gi
from gpt2_interp.analysis.lens import decode_resid, logit_lens
from gpt2_interp.model import KNOWN_CONFIGS, GPT2Config, HookedGPT2

transformers = pytest.importorskip("transformers")

from tests.families_cases import CASES, PROMPTS, family_pair, padded  # noqa: E402


@pytest.fixture(scope="module", params=sorted(CASES))
def pair(request):
    """Each family's ``(family, transformers model, our model)``."""
    return family_pair(request.param)


@torch.no_grad()
def test_padded_batch_logits_match_transformers_and_each_prompt_alone(pair):
    family, hf, ours = pair
    tokens, mask = padded()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    theirs = hf(input_ids=tokens, attention_mask=mask, position_ids=pos).logits
    mine = ours(tokens, attention_mask=mask)
    real = mask.bool()
    delta = (mine[real] - theirs[real]).abs().max().item()
    assert delta < 1e-4, f"{family}: max |Δlogit| {delta:.2e}"
    for i, p in enumerate(PROMPTS):
        alone = ours(p[None])[0]
        assert (alone - mine[i, real[i]]).abs().max().item() < 1e-4


@torch.no_grad()
def test_residual_stream_matches_transformers_hidden_states(pair):
    """Every block's input residual (``hook_resid_pre``, after Gemma's embedding scale) equals transformers'
    hidden state there."""
    family, hf, ours = pair
    tokens = PROMPTS[0][None]
    states = hf(tokens, output_hidden_states=True).hidden_states
    _, cache = ours.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_resid_pre"))
    for i in range(ours.cfg.n_layer):
        delta = (cache[f"blocks.{i}.hook_resid_pre"] - states[i]).abs().max().item()
        assert delta < 1e-4, f"{family} block {i}: {delta:.2e}"


@torch.no_grad()
def test_greedy_generation_with_kv_cache_matches_transformers(pair):
    family, hf, ours = pair
    prompt = PROMPTS[1][None]
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32, do_sample=False)
    mine = ours.generate(prompt, max_new_tokens=32, do_sample=False, stop_at_eos=False, use_kv_cache=True)
    assert mine.tolist() == theirs.tolist(), family


@torch.no_grad()
def test_to_transformers_round_trip_and_config_json(pair):
    _family, hf, ours = pair
    back = ours.to_transformers()
    theirs, again = hf.state_dict(), back.state_dict()
    assert sorted(theirs) == sorted(again)
    for k in theirs:
        assert torch.equal(theirs[k], again[k]), k
    assert GPT2Config.from_hf_dict(ours.cfg.to_hf_dict()) == ours.cfg.config
    tokens = PROMPTS[0][None]
    assert (back(tokens).logits - ours(tokens)).abs().max().item() < 1e-4


@torch.no_grad()
def test_logit_lens_at_the_last_layer_is_the_models_logits(pair):
    _family, _, ours = pair
    tokens = PROMPTS[0][None]
    logits = ours(tokens)
    resid = ours(tokens, stop_at_layer=ours.cfg.n_layer)
    assert (decode_resid(ours, resid) - logits).abs().max().item() < 1e-5
    result = logit_lens(ours, tokens, k=3, return_logits=True, progress=False)
    assert (result.logits[-1, 0, -1] - logits[0, -1]).abs().max().item() < 1e-4


@torch.no_grad()
def test_hook_points_follow_transformer_lens_names(pair):
    _family, _, ours = pair
    names = set(ours.hook_dict)
    assert "blocks.0.attn.hook_rot_q" in names and "blocks.0.attn.hook_q" in names
    c = ours.cfg
    if c.qk_norm != "none":
        assert "blocks.0.attn.q_norm.hook_normalized" in names
    if c.norm_position == "sandwich":
        assert {"blocks.0.ln1_post.hook_normalized", "blocks.0.ln2.hook_normalized"} <= names
    _, cache = ours.run_with_cache(PROMPTS[1][None])
    assert set(cache.keys()) <= names


FAMILY_OF = {
    "llama-3.2-1b": ("LlamaConfig", "LlamaForCausalLM"),
    "llama-3.2-3b": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen2.5-1.5b": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3-1.7b": ("Qwen3Config", "Qwen3ForCausalLM"),
    "pythia-1b": ("GPTNeoXConfig", "GPTNeoXForCausalLM"),
    "qwen2.5-0.5b": ("Qwen2Config", "Qwen2ForCausalLM"),
    "qwen3-0.6b": ("Qwen3Config", "Qwen3ForCausalLM"),
    "gemma-2-2b": ("Gemma2Config", "Gemma2ForCausalLM"),
    "gemma-3-1b": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "gpt-j-6b": ("GPTJConfig", "GPTJForCausalLM"),
    "pythia-70m": ("GPTNeoXConfig", "GPTNeoXForCausalLM"),
    "pythia-160m": ("GPTNeoXConfig", "GPTNeoXForCausalLM"),
    "pythia-410m": ("GPTNeoXConfig", "GPTNeoXForCausalLM"),
    "pythia-1.4b": ("GPTNeoXConfig", "GPTNeoXForCausalLM"),
    "mistral-7b": ("MistralConfig", "MistralForCausalLM"),
    "phi-3-mini": ("Phi3Config", "Phi3ForCausalLM"),
    "olmo-2-1b": ("Olmo2Config", "Olmo2ForCausalLM"),
}


# Total parameters as published in the Pythia suite's model table (EleutherAI/pythia README).
PYTHIA_PARAMETERS = {
    "pythia-70m": 70_426_624,
    "pythia-160m": 162_322_944,
    "pythia-410m": 405_334_016,
    "pythia-1b": 1_011_781_632,
    "pythia-1.4b": 1_414_647_808,
}


@pytest.mark.parametrize("name", sorted(PYTHIA_PARAMETERS))
def test_pythia_shapes_have_the_published_parameter_count(name):
    with torch.device("meta"):
        n = sum(p.numel() for p in HookedGPT2(KNOWN_CONFIGS[name]).parameters())
    assert n == PYTHIA_PARAMETERS[name]


@pytest.mark.parametrize("name", sorted(FAMILY_OF))
def test_real_shapes_have_transformers_parameter_count_per_layer(name):
    """Each real shape with 1 and 2 layers on the meta device: the per-layer and the rest count agree."""
    config_class, model_class = FAMILY_OF[name]

    def counts(n_layer):
        cfg = KNOWN_CONFIGS[name].replace(n_layer=n_layer)
        with torch.device("meta"):
            ours = sum(p.numel() for p in _meta_model(cfg).parameters())
            hf = getattr(transformers, model_class)(getattr(transformers, config_class)(**cfg.to_hf_dict()))
        return ours, sum(p.numel() for p in hf.parameters())

    (o1, h1), (o2, h2) = counts(1), counts(2)
    assert o2 - o1 == h2 - h1, name  # one layer's parameters
    assert o1 == h1, name


def _meta_model(cfg):
    from gpt2_interp.model.hooked_gpt2 import Block, Embed, Unembed, norm

    embed = Embed(cfg)
    mods = torch.nn.ModuleList([embed, *(Block(cfg, i) for i in range(cfg.n_layer)), norm(cfg), Unembed(cfg, embed)])
    return mods


def test_what_stays_unsupported_is_refused_before_weights():
    base = CASES["qwen2"][2] | {"model_type": "qwen2"}
    with pytest.raises(ValueError, match="num_experts=8: mixture-of-experts"):
        GPT2Config.from_hf_dict({**base, "num_experts": 8})
    with pytest.raises(ValueError, match="vision_config is set: multimodal"):
        GPT2Config.from_hf_dict({**base, "vision_config": {"hidden_size": 8}})
    with pytest.raises(ValueError, match="is_encoder_decoder=True"):
        GPT2Config.from_hf_dict({**base, "is_encoder_decoder": True})
    with pytest.raises(ValueError, match="rope_type='longrope' is not supported"):
        GPT2Config.from_hf_dict(
            {**base, "rope_parameters": {"rope_type": "longrope", "factor": 4.0, "rope_theta": 1e4}}
        )
    with pytest.raises(ValueError, match="qk_norm='layer'"):
        GPT2Config(qk_norm="layer")
    with pytest.raises(ValueError, match="rotary_dim=32 is wider"):
        GPT2Config(positional="rotary", rotary_dim=32, n_head=48)


@torch.no_grad()
def test_opt_in_hooks_keep_the_output(pair):
    """TransformerLens's opt-in hook points (per-head results, split inputs, mlp_in) and a hooked
    pattern (the explicit attention path) leave every family's logits unchanged."""
    family, _, ours = pair
    tokens, mask = padded()
    plain = ours(tokens, attention_mask=mask)
    ours.cfg.use_attn_result = True
    ours.cfg.use_split_qkv_input = True
    ours.cfg.use_hook_mlp_in = True
    try:
        _, cache = ours.run_with_cache(tokens, attention_mask=mask, names_filter=lambda n: "pattern" in n)
        hooked = ours(tokens, attention_mask=mask)
    finally:
        ours.cfg.use_attn_result = ours.cfg.use_split_qkv_input = ours.cfg.use_hook_mlp_in = False
    assert (hooked - plain).abs().max().item() < 1e-4, family
    if ours.cfg.sliding_window is not None:  # the sliding layers' pattern is zero beyond the window
        layer = next(i for i in range(ours.cfg.n_layer) if ours.cfg.is_sliding(i))
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"][0]
        far = torch.ones(pattern.shape[-2:], dtype=torch.bool).tril(-ours.cfg.sliding_window)
        assert pattern[:, far].abs().max().item() == 0.0


@torch.no_grad()
def test_hf_directory_both_ways_and_bare_base_model(pair, tmp_path):
    """We write a directory transformers loads (same logits); transformers' own directory loads back equal;
    its bare base model (no head) unembeds with W_Eᵀ."""
    family, hf, ours = pair
    tokens = PROMPTS[0][None]
    ours.save(tmp_path / "ours")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "ours", attn_implementation="eager").eval()
    assert (theirs(tokens).logits - ours(tokens)).abs().max().item() < 1e-4, family
    hf.save_pretrained(tmp_path / "hf")
    again = gi.load(tmp_path / "hf")
    assert (again(tokens) - ours(tokens)).abs().max().item() == 0.0, family
    bare = gi.from_transformers(hf.base_model)
    resid = ours(tokens, stop_at_layer=ours.cfg.n_layer)
    assert torch.equal(bare(tokens, stop_at_layer=bare.cfg.n_layer), resid)


def test_an_unsupported_directory_is_refused_before_its_weights(tmp_path):
    """The config of a mixture-of-experts directory is refused by key; its (damaged) weights are never read."""
    import json

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "num_experts": 8, **CASES["qwen2"][2]}))
    (tmp_path / "model.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=r"config.json: num_experts=8: mixture-of-experts models are not supported"):
        gi.load(tmp_path)


def test_transformer_lens_weight_names_cover_partial_biases(pair):
    """TL's stacked weights and biases read every family: biases on some projections only (Qwen 2's q/k/v,
    GPT-J's MLP and head) are the real ones, the others zeros."""
    family, _, ours = pair
    c = ours.cfg
    assert ours.W_Q.shape == (c.n_layer, c.n_head, c.d_model, c.d_head)
    assert ours.b_Q.shape == (c.n_layer, c.n_head, c.d_head) and ours.b_O.shape == (c.n_layer, c.d_model)
    assert bool(ours.b_Q.any()) == c.has_qkv_bias and bool(ours.b_O.any()) == c.has_attn_out_bias, family
    assert bool(ours.b_U.any()) == c.unembed_bias
    assert torch.equal(ours.state_dict()["blocks.0.attn.W_Q"], ours.W_Q[0])


@torch.no_grad()
def test_patching_engine_equals_naive_patching(pair):
    """The batched patching sweep (prefix keys reused after q/k norms and each layer's rope, windows applied)
    equals patching one residual at a time with a hook."""
    from gpt2_interp.analysis import patch

    family, _, ours = pair
    clean = PROMPTS[0][None]
    corr = clean.clone()
    corr[0, 2], corr[0, 5] = 9, 11

    def metric(logits):
        return logits[..., 5] - logits[..., 6]

    res = patch(ours, clean, corr, metric, hook="resid_pre", progress=False)
    _, cache = ours.run_with_cache(clean, names_filter=lambda n: n.endswith("hook_resid_pre"))
    for layer in range(ours.cfg.n_layer):
        name = f"blocks.{layer}.hook_resid_pre"
        for p in range(clean.shape[1]):

            def put(x, hook, p=p, name=name):
                x = x.clone()
                x[:, p] = cache[name][:, p]
                return x

            ref = metric(ours.run_with_hooks(corr, fwd_hooks=[(name, put)])[:, -1]).item()
            assert abs(res.values[layer, p].item() - ref) < 1e-4, (family, layer, p)


def test_rope_parameters_a_type_needs_are_named_when_missing():
    base = CASES["qwen2"][2] | {"model_type": "qwen2"}
    with pytest.raises(ValueError, match=r"rope_type='llama3' needs rope_parameters.factor"):
        GPT2Config.from_hf_dict({**base, "rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4}})
    with pytest.raises(ValueError, match=r"rope_type='yarn' needs rope_parameters.original_max_position_embeddings"):
        GPT2Config.from_hf_dict({**base, "rope_parameters": {"rope_type": "yarn", "factor": 2.0, "rope_theta": 1e4}})


@torch.no_grad()
def test_attention_and_mlp_outputs_match_transformers_modules(pair):
    """``hook_attn_out`` and ``hook_mlp_out`` are what each block adds to the residual: transformers' attention
    and MLP outputs, after the post-norm where the family has one (Gemma, OLMo 2)."""
    family, hf, ours = pair
    c = ours.cfg
    attn = {"gptj": "attn", "gpt_neox": "attention"}.get(c.family, "self_attn")
    if c.norm_position == "pre":
        modules = {"attn_out": attn, "mlp_out": "mlp"}
    else:
        modules = {"attn_out": "post_attention_layernorm", "mlp_out": "post_feedforward_layernorm"}
    got, handles = {}, []
    for i, layer in enumerate(hf.base_model.layers if hasattr(hf.base_model, "layers") else hf.base_model.h):
        for ours_name, theirs in modules.items():

            def keep(_m, _i, out, key=f"blocks.{i}.hook_{ours_name}"):
                got[key] = out[0] if isinstance(out, tuple) else out

            handles.append(layer.get_submodule(theirs).register_forward_hook(keep))
    tokens = PROMPTS[0][None]
    try:
        hf(tokens)
    finally:
        for h in handles:
            h.remove()
    _, cache = ours.run_with_cache(tokens, names_filter=lambda n: n in got)
    for name, theirs in got.items():
        assert (cache[name] - theirs).abs().max().item() < 1e-4, (family, name)
