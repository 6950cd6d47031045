"""TransformerLens's receiver-input hook points (``use_split_qkv_input``, ``use_attn_in``,
``use_hook_mlp_in``): equal to TransformerLens 3.9 on the same weights (GPT-2 and a grouped-query
Llama), free of effect on the logits, and a patch of one head's input changes exactly that head."""

from __future__ import annotations

import pytest
import torch

import gpt2_interp as gi
from gpt2_interp.analysis.patching import logit_diff, patch
from gpt2_interp.model import HookedGPT2

transformers = pytest.importorskip("transformers")

from tests.families_cases import VOCAB, hf_llama, hf_model, llama_like_config, tl_llama  # noqa: E402

TOKENS = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(3))
OTHER = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(4))
FLAGS = ("use_split_qkv_input", "use_attn_in", "use_hook_mlp_in")


@pytest.fixture(scope="module")
def gpt2_pair(tl_from_hf):
    """(ours, TransformerLens) on one small random GPT-2."""
    hf = hf_model("gpt2")
    return gi.from_transformers(hf), tl_from_hf(hf)


@pytest.fixture(scope="module")
def llama_pair():
    """(ours, TransformerLens) on one small random Llama: RMSNorm, RoPE, SwiGLU, 4 heads over 2 KV heads."""
    hf = hf_llama()
    return gi.from_transformers(hf), tl_llama(hf)


@pytest.fixture(scope="module")
def gpt2_64(gpt2_pair):
    """Our small GPT-2 in float64 (a copy): flags on and off must then agree to rounding."""
    ours, _ = gpt2_pair
    model = HookedGPT2(ours.cfg.config, tokenizer=ours.tokenizer).eval()
    model.load_state_dict(ours.state_dict())
    return model.to(torch.float64)


def _switch(model, **on):
    """Set the model's three switches (off unless named) in an order every combination allows."""
    for flag in FLAGS:
        setattr(model.cfg, flag, False)
    for flag, value in on.items():
        setattr(model.cfg, flag, value)


def _close(a, b, tol):
    """Max abs difference ≤ tol; masked scores (-inf) must be masked in both."""
    a, b = a.double(), b.double()
    finite = a.isfinite()
    return torch.equal(finite, b.isfinite()) and (a[finite] - b[finite]).abs().max().item() <= tol


@pytest.mark.parametrize(
    "on",
    [
        {"use_split_qkv_input": True},
        {"use_attn_in": True},
        {"use_hook_mlp_in": True, "use_split_qkv_input": True, "use_attn_result": True},
    ],
    ids=["split_qkv", "attn_in", "mlp_in+split+result"],
)
def test_gpt2_hooks_equal_transformer_lens(gpt2_pair, on):
    ours, ref = gpt2_pair
    for model in (ours, ref):
        for flag, value in on.items():
            getattr(model, f"set_{flag}")(value)
    try:
        with torch.no_grad():
            ref_logits, ref_cache = ref.run_with_cache(TOKENS)
        logits, cache = ours.run_with_cache(TOKENS)
    finally:
        for model in (ours, ref):
            for flag in on:
                getattr(model, f"set_{flag}")(False)
    new = {
        "use_split_qkv_input": ["hook_q_input", "hook_k_input", "hook_v_input"],
        "use_attn_in": ["hook_attn_in"],
        "use_hook_mlp_in": ["hook_mlp_in"],
    }
    wanted = [f"blocks.{l}.{h}" for flag in on for h in new.get(flag, []) for l in range(2)]
    assert wanted and all(n in cache and n in ref_cache.cache_dict for n in wanted)
    shared = [n for n in cache if n in ref_cache.cache_dict]
    assert len(shared) == len(cache)  # every hook that fired here fired in TL, ln1's per-head scales included
    for n in shared:
        assert cache[n].shape == ref_cache[n].shape, n
        assert _close(cache[n], ref_cache[n], 1e-4), f"{n}: {(cache[n] - ref_cache[n]).abs().max():.2e}"
    assert _close(logits, ref_logits, 1e-4)
    assert cache["blocks.1.hook_q_input" if "use_split_qkv_input" in on else "blocks.1.hook_attn_in"].shape == (
        2,
        9,
        4,
        64,
    )


def test_receiver_input_gradients_equal_transformer_lens(gpt2_pair):
    """The gradients at the per-head inputs (what edge attribution reads) equal TransformerLens's."""
    ours, ref = gpt2_pair
    names = [f"blocks.1.hook_{x}_input" for x in "qkv"] + ["blocks.0.hook_mlp_in"]
    for model in (ours, ref):
        model.set_use_split_qkv_input(True)
        model.set_use_hook_mlp_in(True)
    try:
        _, ref_cache = ref.run_with_cache(TOKENS, return_type="loss", incl_bwd=True, names_filter=names)
        _, cache = ours.run_with_cache(TOKENS, return_type="loss", incl_bwd=True, names_filter=names)
    finally:
        for model in (ours, ref):
            model.set_use_split_qkv_input(False)
            model.set_use_hook_mlp_in(False)
            model.zero_grad(set_to_none=True)
    for n in names:
        got, want = cache[n + "_grad"], ref_cache[n + "_grad"]
        assert got.shape == want.shape and want.abs().max() > 0, n
        assert _close(got, want, 1e-5 * want.abs().max().item()), f"{n}: {(got - want).abs().max():.2e}"


def test_gqa_hooks_equal_transformer_lens_kv_inputs_per_kv_head(llama_pair):
    ours, ref = llama_pair
    for model in (ours, ref):
        model.set_use_split_qkv_input(True)
        model.set_use_hook_mlp_in(True)
    try:
        with torch.no_grad():
            ref_logits, ref_cache = ref.run_with_cache(TOKENS)
        logits, cache = ours.run_with_cache(TOKENS)
    finally:
        for model in (ours, ref):
            model.set_use_split_qkv_input(False)
            model.set_use_hook_mlp_in(False)
    assert cache["blocks.0.hook_q_input"].shape == (2, 9, 4, 64)
    assert cache["blocks.0.hook_k_input"].shape == cache["blocks.0.hook_v_input"].shape == (2, 9, 2, 64)
    names = [f"blocks.{l}.hook_{h}" for l in range(2) for h in ("q_input", "k_input", "v_input", "mlp_in")]
    names += [f"blocks.{l}.attn.hook_{h}" for l in range(2) for h in ("q", "k", "v", "rot_q", "rot_k", "z")]
    for n in names:
        assert _close(cache[n], ref_cache[n], 1e-4), f"{n}: {(cache[n] - ref_cache[n]).abs().max():.2e}"
    assert _close(logits, ref_logits, 1e-4)
    with pytest.raises(ValueError, match=r"grouped-query attention\): use set_use_split_qkv_input"):
        ours.set_use_attn_in(True)  # as TransformerLens (an assertion there)
    assert not ours.cfg.use_attn_in


@pytest.mark.parametrize("which", ["gpt2", "llama"])
def test_flags_on_leave_logits_and_gradients_unchanged(gpt2_64, llama_pair, which):
    model = gpt2_64 if which == "gpt2" else llama_pair[0]
    combos = [{"use_split_qkv_input": True, "use_hook_mlp_in": True}]
    if which == "gpt2":
        combos.append({"use_attn_in": True, "use_attn_result": True})

    def run():
        grads = {}

        def keep(grad, hook):
            grads[hook.name] = grad

        with model.hooks(bwd_hooks=[("blocks.0.hook_resid_pre", keep)]):
            logits = model(TOKENS)
            logits[:, -1].logsumexp(-1).sum().backward()
        return logits.detach(), grads["blocks.0.hook_resid_pre"]

    base_logits, base_grad = run()
    tol = 1e-10 if model.dtype == torch.float64 else 1e-5
    for on in combos:
        _switch(model, **on)
        try:
            logits, grad = run()
        finally:
            _switch(model)
            model.cfg.use_attn_result = False
        assert _close(logits, base_logits, tol), on
        assert _close(grad, base_grad, tol * 10), on  # the copies' gradients add up to the residual's
    model.zero_grad(set_to_none=True)


def test_patching_one_heads_query_input_recomputes_that_heads_query(gpt2_64):
    model, layer, head = gpt2_64, 1, 2
    _, other = model.run_with_cache(OTHER, names_filter="blocks.1.hook_resid_pre")
    donor = other["blocks.1.hook_resid_pre"]  # [batch, pos, d_model]
    model.set_use_split_qkv_input(True)
    try:
        _, clean = model.run_with_cache(TOKENS, names_filter=lambda n: n.startswith("blocks.1.attn.hook_"))

        def swap(act, hook):
            act[:, :, head] = donor
            return act

        with model.hooks([(f"blocks.{layer}.hook_q_input", swap)]):
            _, patched = model.run_with_cache(TOKENS, names_filter=lambda n: n.startswith("blocks.1.attn.hook_"))
    finally:
        model.set_use_split_qkv_input(False)
    attn = model.blocks[layer].attn
    ln = model.blocks[layer].ln1
    expected = ln.unhooked(donor) @ attn.W_Q[head] + attn.b_Q[head]  # by hand: that head's query of the donor
    q, q0 = patched["blocks.1.attn.hook_q"], clean["blocks.1.attn.hook_q"]
    assert _close(q[:, :, head], expected, 1e-10)
    others = [h for h in range(4) if h != head]
    assert torch.equal(q[:, :, others], q0[:, :, others])
    for name in ("hook_k", "hook_v"):
        assert torch.equal(patched[f"blocks.1.attn.{name}"], clean[f"blocks.1.attn.{name}"])
    z, z0 = patched["blocks.1.attn.hook_z"], clean["blocks.1.attn.hook_z"]
    assert torch.equal(z[:, :, others], z0[:, :, others]) and not torch.equal(z[:, :, head], z0[:, :, head])


def test_patching_one_kv_heads_key_input_changes_only_its_query_group(llama_pair):
    model = llama_pair[0]  # 4 query heads over 2 KV heads: KV head 1 serves query heads 2 and 3
    _, other = model.run_with_cache(OTHER, names_filter="blocks.0.hook_resid_pre")
    donor = other["blocks.0.hook_resid_pre"]
    model.set_use_split_qkv_input(True)
    names = ["blocks.0.attn.hook_rot_k", "blocks.0.attn.hook_v", "blocks.0.attn.hook_pattern"]
    try:
        _, clean = model.run_with_cache(TOKENS, names_filter=names)

        def swap(act, hook):
            act[:, :, 1] = donor
            return act

        with model.hooks([("blocks.0.hook_k_input", swap)]):
            _, patched = model.run_with_cache(TOKENS, names_filter=names)
    finally:
        model.set_use_split_qkv_input(False)
    k, k0 = patched["blocks.0.attn.hook_rot_k"], clean["blocks.0.attn.hook_rot_k"]
    assert torch.equal(k[:, :, 0], k0[:, :, 0]) and not torch.equal(k[:, :, 1], k0[:, :, 1])
    assert torch.equal(patched["blocks.0.attn.hook_v"], clean["blocks.0.attn.hook_v"])
    p, p0 = patched["blocks.0.attn.hook_pattern"], clean["blocks.0.attn.hook_pattern"]  # [batch, head, q, k]
    assert torch.equal(p[:, :2], p0[:, :2]) and not torch.allclose(p[:, 2:], p0[:, 2:])


def test_attn_in_copy_feeds_its_heads_query_key_and_value_only(gpt2_64):
    model = gpt2_64
    names = [f"blocks.0.attn.hook_{x}" for x in ("q", "k", "v")]
    model.set_use_attn_in(True)
    try:
        _, clean = model.run_with_cache(TOKENS, names_filter=names)

        def zero_head(act, hook):
            act[:, :, 3] = 0.5
            return act

        with model.hooks([("blocks.0.hook_attn_in", zero_head)]):
            _, patched = model.run_with_cache(TOKENS, names_filter=names)
    finally:
        model.set_use_attn_in(False)
    for n in names:
        a, a0 = patched[n], clean[n]
        assert torch.equal(a[:, :, :3], a0[:, :, :3]) and not torch.equal(a[:, :, 3], a0[:, :, 3]), n


def test_mlp_in_patch_changes_the_mlp_input_not_the_residual(gpt2_64):
    model = gpt2_64
    names = ["blocks.0.hook_resid_mid", "blocks.0.hook_mlp_out", "blocks.0.hook_resid_post", "blocks.0.hook_mlp_in"]
    model.set_use_hook_mlp_in(True)
    try:
        _, clean = model.run_with_cache(TOKENS, names_filter=names)
        assert torch.equal(clean["blocks.0.hook_mlp_in"], clean["blocks.0.hook_resid_mid"])
        with model.hooks([("blocks.0.hook_mlp_in", lambda act, hook: act.mul_(0.5))]):  # in place, as users do
            _, patched = model.run_with_cache(TOKENS, names_filter=names)
    finally:
        model.set_use_hook_mlp_in(False)
    mid = patched["blocks.0.hook_resid_mid"]
    assert torch.equal(mid, clean["blocks.0.hook_resid_mid"])
    mlp = model.blocks[0].mlp
    expected = mlp(model.blocks[0].ln2.unhooked(0.5 * mid))  # by hand: the MLP of the halved residual
    assert _close(patched["blocks.0.hook_mlp_out"], expected, 1e-10)
    assert _close(patched["blocks.0.hook_resid_post"], mid + expected, 1e-10)


def test_switches_are_per_model_exclusive_and_off_by_default(gpt2_pair):
    ours, _ = gpt2_pair
    assert not any(getattr(ours.cfg, f) for f in FLAGS)
    assert not any(getattr(ours.cfg.config, f) for f in FLAGS)  # the plain config value: TL's defaults
    _, cache = ours.run_with_cache(TOKENS)
    assert not [n for n in cache if n.endswith(("_input", "attn_in", "mlp_in"))]  # off: the hooks never fire
    ours.set_use_split_qkv_input(True)
    try:
        other = HookedGPT2(ours.cfg.config)  # a model built from the same config keeps its own switches
        assert not other.cfg.use_split_qkv_input
        with pytest.raises(ValueError, match="use_attn_in and use_split_qkv_input are exclusive"):
            ours.set_use_attn_in(True)
        with pytest.raises(ValueError, match="exclusive"):
            ours.cfg.use_attn_in = True
    finally:
        ours.set_use_split_qkv_input(False)
    with pytest.raises(AttributeError, match="use_split_qkv_input"):
        ours.cfg.use_hook_tokens_typo = True  # an unknown switch names the settable ones


def test_kv_cache_generation_with_split_inputs_equals_without(llama_pair, gpt2_pair):
    for model in (llama_pair[0], gpt2_pair[0]):
        plain = model.generate(TOKENS[:, :5], max_new_tokens=4, do_sample=False, stop_at_eos=False)
        _switch(model, use_split_qkv_input=True, use_hook_mlp_in=True)
        try:
            split = model.generate(TOKENS[:, :5], max_new_tokens=4, do_sample=False, stop_at_eos=False)
        finally:
            _switch(model)
        assert torch.equal(plain, split)


@pytest.mark.parametrize("hook", ["resid_pre", "z"])
def test_patching_engine_with_split_inputs_equals_without(gpt2_64, hook):
    model = gpt2_64
    metric = logit_diff(torch.tensor([5, 6]), torch.tensor([7, 8]))
    base = patch(model, TOKENS, OTHER, metric, hook=hook, progress=False)
    _switch(model, use_split_qkv_input=True, use_hook_mlp_in=True)
    try:
        split = patch(model, TOKENS, OTHER, metric, hook=hook, progress=False)
    finally:
        _switch(model)
    assert _close(split.values, base.values, 1e-10)


@pytest.mark.parametrize("family", ["q", "k", "v"])
def test_patching_a_heads_input_equals_patching_its_projection_gqa(family):
    """A head's query/key/value at every position is a function of its own input copy alone, so the
    patching sweep over ``{family}_input`` equals the sweep over ``{family}`` (key/value heads under GQA)."""
    model = HookedGPT2(llama_like_config(), seed=0).double().eval()
    metric = logit_diff(torch.tensor([5, 6]), torch.tensor([7, 8]))
    on_projection = patch(model, TOKENS, OTHER, metric, hook=family, progress=False)
    model.set_use_split_qkv_input(True)
    on_input = patch(model, TOKENS, OTHER, metric, hook=f"{family}_input", progress=False)
    assert on_input.values.shape == on_projection.values.shape == (2, 4 if family == "q" else 2)
    assert _close(on_input.values, on_projection.values, 1e-10)
    assert on_input.values.abs().max() > 1e-3  # the patches do something


def test_cache_names_the_switch_of_a_hook_that_did_not_fire(gpt2_pair):
    _, cache = gpt2_pair[0].run_with_cache(TOKENS)
    with pytest.raises(KeyError, match=r"model\.set_use_split_qkv_input\(True\)"):
        cache["q_input", 0]
    with pytest.raises(KeyError, match=r"model\.set_use_hook_mlp_in\(True\)"):
        cache["blocks.1.hook_mlp_in"]
