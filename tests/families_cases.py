"""The model families on tiny random weights, shared by the family tests: ``CASES`` (family → transformers
config class, model class and kwargs keeping the family's features), ``hf_model`` (the transformers model
with non-trivial norm gains and biases), ``family_pair`` (that model and ours converted from it, for a test
module's fixture) and the test prompts; ``REFERENCE_CASES`` adds GPT-2 for tools compared across families.
``LLAMA_LIKE`` also gives the plain Llama of the Llama tests: ``llama_like_config`` (ours), ``hf_llama`` and
``tl_llama`` (transformers' and TransformerLens's, on the same weights)."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

import gpt2_interp as gi
from gpt2_interp.model import GPT2Config

transformers = pytest.importorskip("transformers")

VOCAB = 256
LLAMA_LIKE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    pad_token_id=0,
)

NEOX_LIKE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=128,
    pad_token_id=0,
)

# family → (config class, model class, config kwargs)
CASES = {
    "llama3-rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            LLAMA_LIKE,
            rope_parameters=dict(
                rope_type="llama3",
                rope_theta=10000.0,
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=16,
            ),
        ),
    ),
    "llama-linear-rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(LLAMA_LIKE, rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0)),
    ),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(LLAMA_LIKE, tie_word_embeddings=True)),
    "qwen2-yarn": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(
            LLAMA_LIKE,
            rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=32),
        ),
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(LLAMA_LIKE, head_dim=24, sliding_window=5)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(LLAMA_LIKE, head_dim=24, tie_word_embeddings=True)),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(LLAMA_LIKE)),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(LLAMA_LIKE, sliding_window=6, original_max_position_embeddings=128),
    ),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(NEOX_LIKE, rotary_pct=0.25, use_parallel_residual=True)),
    "gpt_neox-sequential": (
        "GPTNeoXConfig",
        "GPTNeoXForCausalLM",
        dict(NEOX_LIKE, rotary_pct=0.5, use_parallel_residual=False),
    ),
    "gptj": (
        "GPTJConfig",
        "GPTJForCausalLM",
        dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128, rotary_dim=8),
    ),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(
            LLAMA_LIKE,
            head_dim=24,
            query_pre_attn_scalar=20,
            sliding_window=4,
            attn_logit_softcapping=3.0,
            final_logit_softcapping=2.0,
            tie_word_embeddings=True,
        ),
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            LLAMA_LIKE,
            num_hidden_layers=3,
            head_dim=24,
            query_pre_attn_scalar=20,
            sliding_window=4,
            sliding_window_pattern=3,
            rope_parameters={
                "full_attention": {"rope_type": "linear", "rope_theta": 100000.0, "factor": 2.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1000.0},
            },
            tie_word_embeddings=True,
        ),
    ),
}


# GPT-2 (learned positions, LayerNorm, tied head, Conv1D weights) as the reference the tools were built on
REFERENCE_CASES = {
    "gpt2": (
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128, pad_token_id=0),
    ),
}


def hf_model(family: str, vocab: int = VOCAB):
    """The transformers model of ``family`` (a key of ``CASES`` or ``REFERENCE_CASES``), seeded, eager
    attention, with noise added to every parameter; ``vocab`` 50257 lets GPT-2's tokenizer read text."""
    config_class, model_class, kw = {**CASES, **REFERENCE_CASES}[family]
    return _noisy(config_class, model_class, {**kw, "vocab_size": vocab})


def _noisy(config_class: str, model_class: str, kw: dict):
    torch.manual_seed(0)
    cfg = getattr(transformers, config_class)(**kw)
    cfg._attn_implementation = "eager"
    model = getattr(transformers, model_class)(cfg).eval()
    with torch.no_grad():  # non-trivial norm gains and biases, larger weights so attention is not uniform
        for _name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.ndim == 1 else 0.05))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


# a small RoPE base: every rotary frequency turns visibly over a test prompt, so a wrong rotation shows
LLAMA_ROPE_THETA = 500.0


def hf_llama(tied: bool = False):
    """transformers' LlamaForCausalLM of ``LLAMA_LIKE`` (RoPE base ``LLAMA_ROPE_THETA``), built as
    :func:`hf_model` builds the families; ``tied``: the unembedding shares the embedding's weights."""
    kw = dict(LLAMA_LIKE, rope_theta=LLAMA_ROPE_THETA, tie_word_embeddings=tied)
    return _noisy("LlamaConfig", "LlamaForCausalLM", kw)


def llama_like_config(**changes) -> GPT2Config:
    """Our config of ``LLAMA_LIKE`` (through ``GPT2Config.from_hf_dict``), with ``changes`` applied."""
    cfg = GPT2Config.from_hf_dict({**LLAMA_LIKE, "model_type": "llama", "rope_theta": LLAMA_ROPE_THETA})
    return dataclasses.replace(cfg, **changes)


def tl_llama(hf):
    """TransformerLens 3.9's HookedTransformer with the weights of the transformers Llama ``hf`` (a config it
    can build: RMSNorm, rotary on every head dimension with halves rotated as transformers does, SwiGLU, GQA),
    through TransformerLens's own ``convert_llama_weights``."""
    tl = pytest.importorskip("transformer_lens")
    from transformer_lens.pretrained.weight_conversions.llama import convert_llama_weights

    c = hf.config
    d_head = c.hidden_size // c.num_attention_heads
    rope = getattr(c, "rope_parameters", None) or {}  # transformers ≥ 5 keeps θ there
    rope_theta = float(rope.get("rope_theta") or getattr(c, "rope_theta", 10000.0))
    cfg = tl.HookedTransformerConfig(
        n_layers=c.num_hidden_layers,
        d_model=c.hidden_size,
        n_heads=c.num_attention_heads,
        d_head=d_head,
        n_key_value_heads=c.num_key_value_heads,
        d_mlp=c.intermediate_size,
        n_ctx=c.max_position_embeddings,
        d_vocab=c.vocab_size,
        act_fn="silu",
        gated_mlp=True,
        normalization_type="RMS",
        eps=c.rms_norm_eps,
        positional_embedding_type="rotary",
        rotary_dim=d_head,
        rotary_base=rope_theta,
        rotary_adjacent_pairs=False,
        final_rms=True,
        default_prepend_bos=False,
    )
    with warnings.catch_warnings():  # TL 3.9 points to TransformerBridge; the classic class is what we compare with
        warnings.simplefilter("ignore", DeprecationWarning)
        ref = tl.HookedTransformer(cfg)
    ref.load_state_dict(convert_llama_weights(hf, cfg), strict=False)
    return ref.eval()


def family_pair(family: str, vocab: int = VOCAB):
    """``(family, transformers model, our model)`` for one family of ``CASES`` or ``REFERENCE_CASES``; each
    call builds a fresh pair, so a test that edits weights leaves other modules' models alone."""
    hf = hf_model(family, vocab)
    return family, hf, gi.from_transformers(hf).eval()


PROMPTS = [torch.randint(1, VOCAB, (n,), generator=torch.Generator().manual_seed(n)) for n in (13, 8, 3)]


def padded():
    """``PROMPTS`` left-padded into one batch: ``(tokens, attention_mask)``."""
    width = max(len(p) for p in PROMPTS)
    tokens = torch.zeros(len(PROMPTS), width, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for i, p in enumerate(PROMPTS):
        tokens[i, width - len(p) :], mask[i, width - len(p) :] = p, 1
    return tokens, mask
