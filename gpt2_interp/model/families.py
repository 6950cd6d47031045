"""The model families beyond GPT-2 and Llama as config values of the one model: reading and writing
their ``config.json`` (transformers 5 keys, and the older ``rope_scaling``/``rotary_pct`` spellings) and
their checkpoints' tensor names and layouts.

A family is a set of :class:`~.config.GPT2Config` values (``hf_type`` names the transformers class a
config is written back as):

- Qwen 2 / 2.5: Llama with biases on the query/key/value projections (``qkv_bias``);
- Mistral: Llama with a ``sliding_window`` on every layer; Phi-3: the same, with fused ``qkv_proj`` and
  ``gate_up_proj`` weights in its checkpoints (split on load, fused on save);
- Qwen 3: per-head q/k RMSNorm (``qk_norm="head"``); OLMo 2: q/k RMSNorm over the whole projection
  (``qk_norm="full"``) and norms after attention and MLP instead of before (``norm_position="post"``);
- GPT-NeoX / Pythia: LayerNorm, biases, ``parallel="two_norms"``, partial rotary (``rotary_dim``), exact
  GELU (``mlp="gelu_erf"``), per-head fused query_key_value; GPT-J: ``parallel="one_norm"``, interleaved
  rotary, no attention biases, an unembedding bias;
- Gemma 2 / 3: (1 + w) RMSNorm, sandwich norms, embeddings × sqrt(d_model), GeGLU, ``attn_scale`` from
  ``query_pre_attn_scalar``, soft-caps, sliding layers alternating with global ones (``global_every``);
  Gemma 3 adds per-head q/k norms and a local rope base (``rope_local_theta``).

Mixture-of-experts, multimodal and encoder-decoder configs are refused, naming the key, before any
weight is read.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..core.boundary import boundary
from ..core.checks import check_count
from .config import GPT2Config

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@boundary
def refuse_unsupported(hf: Mapping[str, Any]) -> None:
    """Raise a one-line ValueError for a ``config.json`` of a kind no config can describe: mixture-of-experts,
    multimodal or encoder-decoder (naming the key and its value)."""
    for key in ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"):
        if isinstance(hf.get(key), int) and hf[key] > 0:
            raise ValueError(f"{key}={hf[key]}: mixture-of-experts models are not supported")
    for key in ("vision_config", "audio_config", "text_config"):
        if hf.get(key):
            raise ValueError(f"{key} is set: multimodal models are not supported (load the text model's own config)")
    if hf.get("is_encoder_decoder"):
        raise ValueError("is_encoder_decoder=True: encoder-decoder models are not supported")


def _rope_params(hf: Mapping[str, Any], layer_type: str | None = None) -> dict[str, Any]:
    """The rope parameters of ``hf`` (v5's ``rope_parameters``, per layer type where it has them, over the
    older ``rope_theta`` + ``rope_scaling``)."""
    rp = dict(hf.get("rope_parameters") or {})
    if any(isinstance(v, dict) for v in rp.values()):
        rp = dict(rp.get(layer_type or "full_attention") or {})
    theta = hf.get("rope_theta", hf.get("rotary_emb_base", 10000.0))
    scaling = dict(hf.get("rope_scaling") or {})
    if (scaling.get("rope_type") or scaling.get("type") or "default") != "default":  # the older key, when it scales
        return {"rope_theta": theta, **rp, **scaling}
    return {"rope_theta": theta, **scaling, **rp}


@boundary
def read_rope(hf: Mapping[str, Any], layer_type: str | None = None) -> dict[str, Any]:
    """Our rope fields (``rope_theta``, ``rope_scaling`` and its factors) of a ``config.json`` ``hf``;
    a rope type other than default, linear and llama3 raises ValueError naming it."""
    p = _rope_params(hf, layer_type)
    kind = p.get("rope_type") or p.get("type") or "default"
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope_type={kind!r} is not supported; accepted: {', '.join(map(repr, ROPE_TYPES))}")
    for key in {"linear": ("factor",), "llama3": ("factor",), "yarn": ("original_max_position_embeddings",)}.get(
        kind, ()
    ):
        if p.get(key) is None:
            raise ValueError(f"rope_type={kind!r} needs rope_parameters.{key}, which this config.json lacks")
    out: dict[str, Any] = {"rope_theta": p["rope_theta"]}
    if kind == "linear":
        out.update(rope_scaling="linear", rope_factor=p["factor"])
    elif kind == "llama3":
        out.update(
            rope_scaling="llama3",
            rope_factor=p["factor"],
            rope_low_freq_factor=p.get("low_freq_factor", 1.0),
            rope_high_freq_factor=p.get("high_freq_factor", 4.0),
            rope_original_ctx=p.get("original_max_position_embeddings", hf.get("max_position_embeddings", 8192)),
        )
    elif kind == "yarn":
        factor = p.get("factor") or hf.get("max_position_embeddings", 2048) / p["original_max_position_embeddings"]
        attention = p.get("attention_factor")
        if attention is None:
            mscale, mscale_all = p.get("mscale"), p.get("mscale_all_dim")
            attention = (
                _mscale(factor, mscale) / _mscale(factor, mscale_all) if mscale and mscale_all else _mscale(factor)
            )
        out.update(
            rope_scaling="yarn",
            rope_factor=factor,
            rope_original_ctx=p["original_max_position_embeddings"],
            rope_attention_factor=float(attention),
            rope_beta_fast=float(p.get("beta_fast") or 32),
            rope_beta_slow=float(p.get("beta_slow") or 1),
            rope_truncate=bool(p.get("truncate", True)),
        )
    return out


def _mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention scale ``0.1 · mscale · ln(scale) + 1`` (1 for ``scale`` ≤ 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


@boundary
def rope_dict(cfg: GPT2Config, theta: float | None = None) -> dict[str, Any]:
    """transformers' ``rope_parameters`` of ``cfg`` (base ``theta``, default ``cfg.rope_theta``)."""
    out: dict[str, Any] = {"rope_type": "default", "rope_theta": cfg.rope_theta if theta is None else theta}
    if theta is None and cfg.rope_scaling != "none":
        out.update(rope_type=cfg.rope_scaling, factor=cfg.rope_factor)
        if cfg.rope_scaling == "yarn":
            out.update(
                original_max_position_embeddings=cfg.rope_original_ctx,
                attention_factor=cfg.rope_attention_factor,
                beta_fast=cfg.rope_beta_fast,
                beta_slow=cfg.rope_beta_slow,
                truncate=cfg.rope_truncate,
            )
        if cfg.rope_scaling == "llama3":
            out.update(
                low_freq_factor=cfg.rope_low_freq_factor,
                high_freq_factor=cfg.rope_high_freq_factor,
                original_max_position_embeddings=cfg.rope_original_ctx,
            )
    if cfg.rotary_dim is not None:
        out["partial_rotary_factor"] = cfg.rotary_dim / cfg.d_head
    return out


def _windows(hf: Mapping[str, Any], n_layer: int) -> dict[str, Any]:
    """``sliding_window`` and ``global_every`` from ``layer_types`` (or a window on every layer)."""
    window = hf.get("sliding_window")
    types = hf.get("layer_types")
    if types is None:
        return {"sliding_window": window} if window else {}
    sliding = [t == "sliding_attention" for t in types]
    if not any(sliding):
        return {}
    if not window:
        raise ValueError(f"layer_types has sliding layers but sliding_window={window!r}")
    if all(sliding):
        return {"sliding_window": window}
    for k in range(2, n_layer + 1):
        if sliding == [(i + 1) % k != 0 for i in range(n_layer)]:
            return {"sliding_window": window, "global_every": k}
    raise ValueError(f"layer_types={types}: only every layer sliding or every k-th layer global is supported")


def _check_act(hf: Mapping[str, Any], key: str, allowed: Mapping[str, str]) -> str:
    act = hf.get(key, next(iter(allowed)))
    if act not in allowed:
        raise ValueError(f"{key}={act!r} is not supported; accepted: {', '.join(map(repr, allowed))}")
    return allowed[act]


@boundary
def llama_like(hf: Mapping[str, Any], tied_default: bool = False) -> dict[str, Any]:
    """Our fields of a Llama-style ``config.json`` ``hf`` (Llama and the families built on it): sizes,
    RMSNorm, rotary positions (:func:`read_rope`), SwiGLU, no biases, sliding windows; the embeddings are
    tied when ``tie_word_embeddings`` says so, else ``tied_default``. A head count or width below 1
    raises ValueError naming our field."""
    d_model = check_count(hf.get("hidden_size", 4096), "d_model")
    n_head = check_count(hf.get("num_attention_heads", 32), "n_head")
    head_dim = hf.get("head_dim")
    n_layer = hf.get("num_hidden_layers", 32)
    return dict(
        n_layer=n_layer,
        d_model=d_model,
        n_head=n_head,
        n_kv_heads=hf.get("num_key_value_heads") or n_head,
        head_dim=None if head_dim in (None, d_model // n_head) else head_dim,
        d_mlp=hf.get("intermediate_size", 11008),
        n_ctx=hf.get("max_position_embeddings", 2048),
        d_vocab=hf.get("vocab_size", 32000),
        layer_norm_eps=hf.get("rms_norm_eps", 1e-6),
        tied_embeddings=bool(hf.get("tie_word_embeddings", tied_default)),
        norm="rmsnorm",
        positional="rotary",
        mlp="swiglu",
        bias=False,
        **read_rope(hf),
        **_windows(hf, n_layer),
    )


def _silu(hf: Mapping[str, Any]) -> dict[str, Any]:
    _check_act(hf, "hidden_act", {"silu": "swiglu"})
    return {}


def _partial(hf: Mapping[str, Any], d_head: int) -> dict[str, Any]:
    p = _rope_params(hf)
    frac = p.get("partial_rotary_factor", hf.get("rotary_pct", hf.get("partial_rotary_factor", 1.0)))
    dim = int(d_head * frac)
    return {} if dim == d_head else {"rotary_dim": dim}


def _attention_bias(hf: Mapping[str, Any]) -> dict[str, Any]:
    on = bool(hf.get("attention_bias", False))
    return {"qkv_bias": on, "attn_out_bias": on} if on else {}


def _qwen2(hf: Mapping[str, Any]) -> dict[str, Any]:
    return {**llama_like(hf), **_silu(hf), "qkv_bias": True}


def _mistral(hf: Mapping[str, Any]) -> dict[str, Any]:
    return {**llama_like(hf), **_silu(hf)}


def _qwen3(hf: Mapping[str, Any]) -> dict[str, Any]:
    return {**llama_like(hf), **_silu(hf), **_attention_bias(hf), "qk_norm": "head"}


def _olmo2(hf: Mapping[str, Any]) -> dict[str, Any]:
    return {**llama_like(hf), **_silu(hf), **_attention_bias(hf), "qk_norm": "full", "norm_position": "post"}


def _phi3(hf: Mapping[str, Any]) -> dict[str, Any]:
    kw = {**llama_like(hf), **_silu(hf)}
    return {**kw, **_partial(hf, kw["head_dim"] or kw["d_model"] // kw["n_head"])}


def _gemma(hf: Mapping[str, Any], three: bool) -> dict[str, Any]:
    kw = llama_like(hf, tied_default=True)
    act = hf.get("hidden_activation") or hf.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_new"):
        raise ValueError(f"hidden_activation={act!r} is not supported; accepted: 'gelu_pytorch_tanh'")
    kw.update(
        mlp="geglu",
        norm_offset=True,
        norm_position="sandwich",
        embed_scale=True,
        attn_scale=float(hf.get("query_pre_attn_scalar", 256)) ** -0.5,
        attn_softcap=hf.get("attn_logit_softcapping"),
        final_softcap=hf.get("final_logit_softcapping"),
        **_attention_bias(hf),
    )
    if three:
        kw["qk_norm"] = "head"
        if kw.get("sliding_window"):
            local = read_rope(hf, "sliding_attention")
            if len(local) > 1:
                raise ValueError(f"rope_parameters.sliding_attention={local}: local layers must use plain rope")
            kw["rope_local_theta"] = local["rope_theta"]
    return kw


def _gpt_neox(hf: Mapping[str, Any]) -> dict[str, Any]:
    d_model, n_head = hf.get("hidden_size", 6144), hf.get("num_attention_heads", 64)
    on = bool(hf.get("attention_bias", True))
    return dict(
        n_layer=hf.get("num_hidden_layers", 44),
        d_model=d_model,
        n_head=n_head,
        d_mlp=hf.get("intermediate_size", 4 * d_model),
        n_ctx=hf.get("max_position_embeddings", 2048),
        d_vocab=hf.get("vocab_size", 50432),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-5),
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)),
        positional="rotary",
        mlp=_check_act(hf, "hidden_act", {"gelu": "gelu_erf", "gelu_new": "gelu"}),
        parallel="two_norms" if hf.get("use_parallel_residual", True) else "none",
        qkv_bias=on,
        attn_out_bias=on,
        **read_rope(hf),
        **_partial(hf, d_model // n_head),
    )


def _gptj(hf: Mapping[str, Any]) -> dict[str, Any]:
    d_model, n_head = hf.get("n_embd", 4096), hf.get("n_head", 16)
    rotary_dim = hf.get("rotary_dim")
    return dict(
        n_layer=hf.get("n_layer", 28),
        d_model=d_model,
        n_head=n_head,
        d_mlp=hf.get("n_inner") or 4 * d_model,
        n_ctx=hf.get("n_positions", 2048),
        d_vocab=hf.get("vocab_size", 50400),
        layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)),
        positional="rotary",
        mlp=_check_act(hf, "activation_function", {"gelu_new": "gelu", "gelu": "gelu_erf"}),
        parallel="one_norm",
        qkv_bias=False,
        attn_out_bias=False,
        unembed_bias=True,
        rotary_dim=None if rotary_dim in (None, d_model // n_head) else rotary_dim,
        rotary_interleaved=True,
    )


#: ``config.json`` ``model_type`` → the reader giving our fields.
FAMILY_READERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "qwen2": _qwen2,
    "mistral": _mistral,
    "qwen3": _qwen3,
    "olmo2": _olmo2,
    "phi3": _phi3,
    "gemma2": lambda hf: _gemma(hf, False),
    "gemma3_text": lambda hf: _gemma(hf, True),
    "gpt_neox": _gpt_neox,
    "gptj": _gptj,
}


@boundary
def from_family_dict(cls: type[GPT2Config], hf: Mapping[str, Any], name: str | None = None) -> GPT2Config:
    """The config of a ``config.json`` ``hf`` whose ``model_type`` is one of :data:`FAMILY_READERS`."""
    refuse_unsupported(hf)
    kind = hf["model_type"]
    kw = FAMILY_READERS[kind](hf)
    return cls(**kw, hf_type=kind, name=name or hf.get("gpt2_interp_name") or hf.get("_name_or_path") or kind)


# ---------------------------------------------------------------- writing config.json
def _layer_types(cfg: GPT2Config) -> list[str]:
    return ["sliding_attention" if cfg.is_sliding(i) else "full_attention" for i in range(cfg.n_layer)]


def _llama_like_dict(cfg: GPT2Config) -> dict[str, Any]:
    return {
        "num_hidden_layers": cfg.n_layer,
        "hidden_size": cfg.d_model,
        "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_kv,
        "head_dim": cfg.d_head,
        "intermediate_size": cfg.d_mlp,
        "max_position_embeddings": cfg.n_ctx,
        "vocab_size": cfg.d_vocab,
        "rms_norm_eps": cfg.layer_norm_eps,
        "rope_parameters": rope_dict(cfg),
        "tie_word_embeddings": cfg.tied_embeddings,
        "hidden_act": "silu",
        "attention_dropout": 0.0,
        "sliding_window": cfg.sliding_window,
    }


@boundary
def to_hf_dict(cfg: GPT2Config) -> dict[str, Any]:
    """A ``config.json`` that transformers loads as the class of ``cfg.hf_type``."""
    kind = cfg.family
    arch = HF_CLASSES[kind][1]
    out: dict[str, Any] = {"architectures": [arch], "model_type": kind, "gpt2_interp_name": cfg.name}
    if kind == "gptj":
        return {
            **out,
            "n_layer": cfg.n_layer,
            "n_embd": cfg.d_model,
            "n_head": cfg.n_head,
            "n_inner": cfg.d_mlp,
            "n_positions": cfg.n_ctx,
            "vocab_size": cfg.d_vocab,
            "layer_norm_epsilon": cfg.layer_norm_eps,
            "rotary_dim": cfg.rotary_width,
            "activation_function": "gelu_new" if cfg.mlp == "gelu" else "gelu",
            "tie_word_embeddings": cfg.tied_embeddings,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
        }
    if kind == "gpt_neox":
        return {
            **out,
            "num_hidden_layers": cfg.n_layer,
            "hidden_size": cfg.d_model,
            "num_attention_heads": cfg.n_head,
            "intermediate_size": cfg.d_mlp,
            "max_position_embeddings": cfg.n_ctx,
            "vocab_size": cfg.d_vocab,
            "layer_norm_eps": cfg.layer_norm_eps,
            "hidden_act": "gelu" if cfg.mlp == "gelu_erf" else "gelu_new",
            "use_parallel_residual": cfg.parallel == "two_norms",
            "rope_parameters": {**rope_dict(cfg), "partial_rotary_factor": cfg.rotary_width / cfg.d_head},
            "attention_bias": cfg.has_qkv_bias,
            "tie_word_embeddings": cfg.tied_embeddings,
            "attention_dropout": 0.0,
            "hidden_dropout": 0.0,
        }
    out.update(_llama_like_dict(cfg))
    if kind in ("qwen2", "qwen3"):
        out.update(use_sliding_window=cfg.sliding_window is not None, layer_types=_layer_types(cfg))
        out["max_window_layers"] = 0
    if kind in ("qwen3", "olmo2"):
        out["attention_bias"] = cfg.has_qkv_bias
    if kind in ("gemma2", "gemma3_text"):
        out.pop("hidden_act")
        out.update(
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=_scalar((cfg.attn_scale or cfg.d_head**-0.5) ** -2),
            attn_logit_softcapping=cfg.attn_softcap,
            final_logit_softcapping=cfg.final_softcap,
            layer_types=_layer_types(cfg),
            attention_bias=cfg.has_qkv_bias,
        )
    if kind == "gemma3_text":
        local = cfg.rope_local_theta if cfg.rope_local_theta is not None else cfg.rope_theta
        out["rope_parameters"] = {
            "full_attention": rope_dict(cfg),
            "sliding_attention": {"rope_type": "default", "rope_theta": local},
        }
    if kind == "phi3":
        out.update(original_max_position_embeddings=cfg.n_ctx, pad_token_id=None)
    return out


def _scalar(x: float) -> int | float:
    """Gemma's ``query_pre_attn_scalar``, an int in transformers' configs when it is one."""
    return round(x) if abs(x - round(x)) < 1e-6 * max(1.0, x) else x


#: ``model_type`` → (transformers config class, model class).
HF_CLASSES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM"),
    "gptj": ("GPTJConfig", "GPTJForCausalLM"),
}


# ---------------------------------------------------------------- checkpoint tensors
def _norm_names(cfg: GPT2Config) -> dict[str, str]:
    """Our block norm → the transformers name (Llama-like checkpoints)."""
    if cfg.norm_position == "post":
        return {"ln1_post": "post_attention_layernorm", "ln2_post": "post_feedforward_layernorm"}
    if cfg.norm_position == "sandwich":
        return {
            "ln1": "input_layernorm",
            "ln1_post": "post_attention_layernorm",
            "ln2": "pre_feedforward_layernorm",
            "ln2_post": "post_feedforward_layernorm",
        }
    return {"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}


def _pairs(cfg: GPT2Config) -> list[tuple[str, str]]:
    """(our name, transformers name) of every tensor that moves without a layout change, per block
    prefix ``{b}``/``{h}``; weights ``[out, in]`` are transposed separately."""
    if cfg.family == "gptj":
        pairs = [("embed.W_E", "transformer.wte.weight"), ("ln_final.w", "transformer.ln_f.weight")]
        pairs += [("ln_final.b", "transformer.ln_f.bias")]
        pairs += [("unembed.b_U", "lm_head.bias")] if cfg.unembed_bias else []
        pairs += [("{b}ln1.w", "{h}ln_1.weight"), ("{b}ln1.b", "{h}ln_1.bias")]
        pairs += [("{b}mlp.b_in", "{h}mlp.fc_in.bias"), ("{b}mlp.b_out", "{h}mlp.fc_out.bias")]
        return pairs
    if cfg.family == "gpt_neox":
        pairs = [("embed.W_E", "gpt_neox.embed_in.weight")]
        pairs += [("ln_final.w", "gpt_neox.final_layer_norm.weight"), ("ln_final.b", "gpt_neox.final_layer_norm.bias")]
        for ours, hf in (("ln1", "input_layernorm"), ("ln2", "post_attention_layernorm")):
            pairs += [(f"{{b}}{ours}.w", f"{{h}}{hf}.weight"), (f"{{b}}{ours}.b", f"{{h}}{hf}.bias")]
        pairs += [("{b}mlp.b_in", "{h}mlp.dense_h_to_4h.bias"), ("{b}mlp.b_out", "{h}mlp.dense_4h_to_h.bias")]
        if cfg.has_attn_out_bias:
            pairs += [("{b}attn.b_O", "{h}attention.dense.bias")]
        return pairs
    pairs = [("embed.W_E", "model.embed_tokens.weight"), ("ln_final.w", "model.norm.weight")]
    pairs += [(f"{{b}}{ours}.w", f"{{h}}{hf}.weight") for ours, hf in _norm_names(cfg).items()]
    if cfg.qk_norm != "none":
        pairs += [
            ("{b}attn.q_norm.w", "{h}self_attn.q_norm.weight"),
            ("{b}attn.k_norm.w", "{h}self_attn.k_norm.weight"),
        ]
    if cfg.has_attn_out_bias:
        pairs += [("{b}attn.b_O", "{h}self_attn.o_proj.bias")]
    return pairs


def _prefix(cfg: GPT2Config, i: int) -> str:
    return {"gptj": "transformer.h.{}.", "gpt_neox": "gpt_neox.layers.{}."}.get(cfg.family, "model.layers.{}.").format(
        i
    )


def _head_name(cfg: GPT2Config) -> str:
    return "lm_head.weight"  # GPT-NeoX checkpoints before transformers 5 call it embed_out.weight


@boundary
def family_to_native(sd: Mapping[str, torch.Tensor], cfg: GPT2Config) -> dict[str, torch.Tensor]:
    """A checkpoint of ``cfg``'s transformers class (names ``[out, in]`` weights) in our names and layouts."""
    sd = {k: v for k, v in sd.items() if not k.endswith((".attn.bias", ".attn.masked_bias", "inv_freq"))}
    if not any(k.startswith(("model.", "transformer.", "gpt_neox.")) for k in sd):  # a bare base model's names
        base = {"gptj": "transformer.", "gpt_neox": "gpt_neox."}.get(cfg.family, "model.")
        sd = {base + k: v for k, v in sd.items()}
    sd = dict(sd)
    c, out = cfg, {}
    head = sd.pop(_head_name(cfg), sd.pop("embed_out.weight", None))
    if not cfg.tied_embeddings:
        if head is None:
            raise ValueError(f"the config says the embeddings are untied but the checkpoint has no {_head_name(cfg)}")
        out["unembed.W_U"] = head.T
    for i in range(-1, c.n_layer):
        for ours, hf in _pairs(cfg):
            if ("{b}" in ours) == (i >= 0):
                out[ours.format(b=f"blocks.{i}.")] = sd.pop(hf.format(h=_prefix(cfg, i)))
    for i in range(c.n_layer):
        h, b = _prefix(cfg, i), f"blocks.{i}."
        if c.family == "gpt_neox":
            w = sd.pop(h + "attention.query_key_value.weight").view(c.n_head, 3, c.d_head, c.d_model)
            out[b + "attn.W_QKV"] = torch.cat([w[:, j].reshape(-1, c.d_model) for j in range(3)]).T
            if c.has_qkv_bias:
                bq = sd.pop(h + "attention.query_key_value.bias").view(c.n_head, 3, c.d_head)
                out[b + "attn.b_QKV"] = torch.cat([bq[:, j].reshape(-1) for j in range(3)])
            o, fc_in, fc_out = "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"
        elif c.family == "gptj":
            qkv = [sd.pop(h + f"attn.{x}_proj.weight") for x in "qkv"]
            out[b + "attn.W_QKV"] = torch.cat(qkv).T
            o, fc_in, fc_out = "attn.out_proj", "mlp.fc_in", "mlp.fc_out"
        else:
            if c.family == "phi3":
                out[b + "attn.W_QKV"] = sd.pop(h + "self_attn.qkv_proj.weight").T
                gate, up = sd.pop(h + "mlp.gate_up_proj.weight").chunk(2, dim=0)
                out[b + "mlp.W_gate"], out[b + "mlp.W_in"] = gate.T, up.T
            else:
                out[b + "attn.W_QKV"] = torch.cat([sd.pop(h + f"self_attn.{x}_proj.weight") for x in "qkv"]).T
                out[b + "mlp.W_gate"] = sd.pop(h + "mlp.gate_proj.weight").T
                out[b + "mlp.W_in"] = sd.pop(h + "mlp.up_proj.weight").T
            if c.has_qkv_bias:
                out[b + "attn.b_QKV"] = torch.cat([sd.pop(h + f"self_attn.{x}_proj.bias") for x in "qkv"])
            o, fc_in, fc_out = "self_attn.o_proj", None, "mlp.down_proj"
        out[b + "attn.W_O"] = sd.pop(h + f"{o}.weight").T.reshape(c.n_head, c.d_head, c.d_model)
        if fc_in is not None:
            out[b + "mlp.W_in"] = sd.pop(h + f"{fc_in}.weight").T
        out[b + "mlp.W_out"] = sd.pop(h + f"{fc_out}.weight").T
    if cfg.tied_embeddings and head is not None and not torch.equal(head, out["embed.W_E"]):
        raise ValueError(f"the config ties the embeddings but the checkpoint's {_head_name(cfg)} differs from them")
    if sd:
        raise ValueError(f"unexpected tensors in the checkpoint: {sorted(sd)[:5]}… (is n_layer={c.n_layer} right?)")
    return out


@boundary
def native_to_family(sd: Mapping[str, torch.Tensor], cfg: GPT2Config) -> dict[str, torch.Tensor]:
    """Our weights under the names and layouts of ``cfg``'s transformers class (inverse of
    :func:`family_to_native`; a tied head is left out)."""
    c, out = cfg, {}
    if not cfg.tied_embeddings:
        out[_head_name(cfg)] = sd["unembed.W_U"].T
    for i in range(-1, c.n_layer):
        for ours, hf in _pairs(cfg):
            if ("{b}" in ours) == (i >= 0):
                out[hf.format(h=_prefix(cfg, i))] = sd[ours.format(b=f"blocks.{i}.")]
    sizes = [c.n_head * c.d_head, c.n_kv * c.d_head, c.n_kv * c.d_head]
    for i in range(c.n_layer):
        h, b = _prefix(cfg, i), f"blocks.{i}."
        qkv = sd[b + "attn.W_QKV"].T.split(sizes)
        bias = sd[b + "attn.b_QKV"].split(sizes) if c.has_qkv_bias else None
        if c.family == "gpt_neox":
            out[h + "attention.query_key_value.weight"] = torch.stack(
                [w.view(c.n_head, c.d_head, c.d_model) for w in qkv], dim=1
            ).reshape(-1, c.d_model)
            if bias is not None:
                out[h + "attention.query_key_value.bias"] = torch.stack(
                    [t.view(c.n_head, c.d_head) for t in bias], dim=1
                ).reshape(-1)
            o, fc_in, fc_out = "attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"
        elif c.family == "gptj":
            out.update({h + f"attn.{x}_proj.weight": w for x, w in zip("qkv", qkv)})
            o, fc_in, fc_out = "attn.out_proj", "mlp.fc_in", "mlp.fc_out"
        else:
            if c.family == "phi3":
                out[h + "self_attn.qkv_proj.weight"] = sd[b + "attn.W_QKV"].T
                out[h + "mlp.gate_up_proj.weight"] = torch.cat([sd[b + "mlp.W_gate"].T, sd[b + "mlp.W_in"].T])
            else:
                out.update({h + f"self_attn.{x}_proj.weight": w for x, w in zip("qkv", qkv)})
                out[h + "mlp.gate_proj.weight"] = sd[b + "mlp.W_gate"].T
                out[h + "mlp.up_proj.weight"] = sd[b + "mlp.W_in"].T
            if bias is not None:
                out.update({h + f"self_attn.{x}_proj.bias": t for x, t in zip("qkv", bias)})
            o, fc_in, fc_out = "self_attn.o_proj", None, "mlp.down_proj"
        out[h + f"{o}.weight"] = sd[b + "attn.W_O"].reshape(-1, c.d_model).T
        if fc_in is not None:
            out[h + f"{fc_in}.weight"] = sd[b + "mlp.W_in"].T
        out[h + f"{fc_out}.weight"] = sd[b + "mlp.W_out"].T
    return {k: v.contiguous() for k, v in out.items()}
