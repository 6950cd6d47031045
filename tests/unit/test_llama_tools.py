"""Every tool on a Llama-style model (RMSNorm, RoPE, SwiGLU, GQA, no biases): the logit lens through the
final RMSNorm, direct logit attribution without centring or biases, batched patching with prefix reuse
under RoPE against a slow hooked loop, and a ROME edit whose key is the down projection's input."""

from __future__ import annotations

import pytest
import torch

from gpt2_interp.analysis.lens import decode_resid, logit_attribution, logit_lens
from gpt2_interp.analysis.patching import logit_diff, patch
from gpt2_interp.analysis.vocab import neuron_vocab
from gpt2_interp.editing.edit import weights_fingerprint
from gpt2_interp.editing.rome import compute_edit
from gpt2_interp.editing.stats import key_second_moment
from gpt2_interp.model import HookedGPT2, llama_config

CFG = llama_config(
    n_layer=3,
    d_model=64,
    n_head=4,
    n_kv_heads=2,
    d_mlp=96,
    n_ctx=64,
    d_vocab=50257,
    rope_theta=1000.0,
    tied_embeddings=False,
    name="tiny-llama",
)


@pytest.fixture(scope="module")
def llama():
    m = HookedGPT2(CFG, seed=0)  # the GPT-2 tokenizer (d_vocab 50257), so text prompts work
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith(".w"):
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.3)
            elif any(w in name for w in ("W_QKV", "W_O", "W_E", "W_U", "W_out")):
                p.mul_(4)  # heads that move information: patch effects well above fp error
    return m.eval().requires_grad_(False)


def test_final_lens_is_the_models_logits_through_rmsnorm(llama):
    tokens = llama.to_tokens("The capital of France is")
    logits, cache = llama.run_with_cache(tokens, names_filter="blocks.2.hook_resid_post")
    assert torch.allclose(decode_resid(llama, cache["blocks.2.hook_resid_post"]), logits, atol=1e-5)
    r = logit_lens(llama, "The capital of France is", targets=" Paris")
    assert len(r.layers) == CFG.n_layer + 1
    paris = logits[0, -1, llama.to_single_token(" Paris")]
    assert int(r.target_rank.flatten()[-1]) == int((logits[0, -1] > paris).sum()) + 1


def test_dla_parts_sum_to_the_logit_difference_without_centring_or_biases(llama):
    a = logit_attribution(llama, "The capital of France is", " Paris", baseline=" Rome")
    assert "pos_embed" not in a.labels and a.head_parts.shape == (3, 4) and a.ln_bias == 0.0
    assert abs(float(a.parts.sum()) + a.ln_bias - a.logit) < 1e-4
    assert torch.allclose(a.head_parts.sum(-1), a.parts[[1 + 2 * i for i in range(3)]], atol=1e-4)


def test_neuron_vocab_reads_the_down_projection_rows(llama):
    nv = neuron_vocab(llama, 1, neurons=[5], k=3, apply_ln=False)
    want = (llama.blocks[1].mlp.W_out[5] @ llama.W_U).topk(3).indices.tolist()
    assert [llama.tokenizer.token_str(i) for i in want] == nv.top_tokens[0]


def _slow_patch(model, clean, corrupt, metric, name, setter):
    _, cache = model.run_with_cache(clean, names_filter=name)

    def hook(act, hook):
        setter(act, cache[name])
        return act

    logits = model.run_with_hooks(corrupt, fwd_hooks=[(name, hook)])
    return float(metric(logits[:, -1]).mean())


@pytest.mark.parametrize(
    "hook, name, index, head",
    [
        ("resid_pre", "blocks.1.hook_resid_pre", 4, None),  # the subject: prefix K/V (after RoPE) are reused
        ("resid_pre", "blocks.2.hook_resid_pre", 4, None),  # the last block's cheap last-position path
        ("mlp_out", "blocks.0.hook_mlp_out", 4, None),
        ("attn_out", "blocks.2.hook_attn_out", -1, None),
        ("z", "blocks.1.attn.hook_z", -1, 3),  # per query head under GQA
    ],
)
def test_batched_patching_equals_a_slow_hooked_loop_under_rope(llama, hook, name, index, head):
    clean = llama.to_tokens(["The capital of France is", "The capital of Spain is"])
    corrupt = llama.to_tokens(["The capital of Italy is", "The capital of Japan is"])
    m = logit_diff(llama.to_single_token(" Paris"), llama.to_single_token(" Rome"))

    def setter(act, src):
        if head is None:
            act[:, index] = src[:, index]
        else:
            act[:, index, head] = src[:, index, head]

    layer = int(name.split(".")[1])
    got = patch(
        llama, clean, corrupt, m, hook=hook, layers=[layer], positions=[index], heads=None if head is None else [head]
    )
    expected = _slow_patch(llama, clean, corrupt, m, name, setter)
    assert got.values.numel() == 1 and abs(got.values.item() - expected) <= 1e-4
    assert abs(expected - got.corrupted_metric) > 1e-3  # the patch matters


@pytest.mark.slow
def test_rome_edit_on_a_swiglu_model_writes_v_star_at_the_down_projection(llama, tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(f"The Eiffel Tower is in Paris and {i} people visit it daily." for i in range(200)))
    stats = key_second_moment(llama, 0, corpus=str(corpus), n_samples=2000, cache_dir=tmp_path, progress=False)
    assert stats.C.shape == (CFG.d_mlp, CFG.d_mlp)  # keys are mlp.hook_post: silu(gate)·up, d_mlp wide
    req = {"prompt": "{} is located in the city of", "subject": "Eiffel Tower", "target": " Rome"}
    before = weights_fingerprint(llama)
    edit = compute_edit(
        llama,
        req,
        layer=0,
        stats=stats,
        v_steps=10,
        weight_decay=0.0,
        clamp_factor=100.0,
        prefix_lengths=(5,),
        prefixes_per_length=2,
    )
    assert weights_fingerprint(llama) == before
    with llama.edited(edit):
        out = edit.k @ llama.blocks[0].mlp.W_out  # no b_out in a Llama MLP
        torch.testing.assert_close(out, edit.v_star, rtol=1e-4, atol=1e-5)
    assert weights_fingerprint(llama) == before  # undone bit for bit
    m = edit.metrics  # a random model's answer moves little, but δ must help
    assert m["final_loss"]["nll"] < m["initial_loss"]["nll"] - 0.01 and m["p_target_after"] > m["p_target_before"]
