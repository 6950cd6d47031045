"""Model hyper-parameters: GPT-2 and its descendants (Llama-style) as one config, and the configs
of the released GPT-2 checkpoints.

GPT-2 evolved into the architecture of most open models by four substitutions, each a field here
(defaults are GPT-2's, so a GPT-2 config is unchanged):

=============  =====================  ===========================================
field          GPT-2                  Llama / SmolLM2
=============  =====================  ===========================================
``norm``       ``"layernorm"``        ``"rmsnorm"`` (no centring, no bias)
``positional`` ``"learned"`` (W_pos)  ``"rotary"`` (RoPE, ``rope_theta``)
``mlp``        ``"gelu"``             ``"swiglu"`` (W_gate, W_in = up, W_out = down)
``n_kv_heads`` = ``n_head``           fewer (grouped-query attention)
``bias``       True                   False
``tied_embeddings`` True              either
=============  =====================  ===========================================

The later families (Qwen, Mistral, OLMo 2, GPT-NeoX, GPT-J, Gemma, Phi-3) are more fields of the same
config, each listed in :class:`GPT2Config` and set from a ``config.json`` by :mod:`.families`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import FrozenInstanceError, asdict, dataclass, fields, replace
from typing import Any, ClassVar

from ..core.boundary import boundary
from ..core.checks import check_count


@boundary
@dataclass(frozen=True)
class GPT2Config:
    """The shape of a GPT-2. Every released GPT-2 differs only in these numbers (the defaults are
    gpt2-small's); the other fields describe Llama-style variants (:func:`llama_config`).

    - ``n_layer`` blocks, residual width ``d_model``, ``n_head`` attention heads (``d_head =
      d_model // n_head``), MLP width ``d_mlp``, context ``n_ctx`` tokens, vocabulary ``d_vocab``;
    - ``layer_norm_eps``: the norms' epsilon; ``name``: the model's name (shown in errors and reprs);
    - ``norm``: ``"layernorm"`` or ``"rmsnorm"``; ``positional``: ``"learned"`` or ``"rotary"``
      (base ``rope_theta``); ``mlp``: ``"gelu"`` or ``"swiglu"``;
    - ``n_kv_heads``: key/value heads for grouped-query attention (None: ``n_head``);
    - ``bias``: whether linear layers have biases; ``tied_embeddings``: whether ``W_U = W_E.T``.

    The later families' options (defaults keep GPT-2 and Llama unchanged; :mod:`.families` sets them from a
    ``config.json``):

    - ``head_dim``: the head width when it is not ``d_model // n_head`` (Qwen 3, Gemma, Mistral);
    - ``rope_scaling``: ``"none"``, ``"linear"`` (frequencies ÷ ``rope_factor``), ``"llama3"`` (Llama 3.1's
      scheme with ``rope_factor``, ``rope_low_freq_factor``, ``rope_high_freq_factor`` and ``rope_original_ctx``,
      the pre-training context) or ``"yarn"`` (YaRN with ``rope_factor``, ``rope_original_ctx``,
      ``rope_beta_fast``, ``rope_beta_slow``, ``rope_truncate``; cos and sin × ``rope_attention_factor``);
      ``rope_local_theta``: the rope base of the sliding layers (Gemma 3);
    - ``rotary_dim``: how many head dimensions RoPE rotates (None: all; GPT-NeoX, GPT-J);
      ``rotary_interleaved``: GPT-J's pairs ``(2i, 2i+1)`` instead of the half split;
    - ``qkv_bias``, ``attn_out_bias``: biases of the query/key/value and output projections (None: ``bias``);
      ``unembed_bias``: an unembedding bias ``b_U`` (GPT-J);
    - ``qk_norm``: ``"none"``, ``"head"`` (a norm over ``d_head`` per head: Qwen 3, Gemma 3) or ``"full"`` (over the
      whole projection: OLMo 2);
    - ``norm_position``: ``"pre"``, ``"post"`` (norms on the attention and MLP outputs only: OLMo 2) or
      ``"sandwich"`` (both: Gemma); ``parallel``: ``"none"``, ``"two_norms"`` (attention and MLP of the same
      residual: GPT-NeoX) or ``"one_norm"`` (sharing ``ln1``: GPT-J);
    - ``norm_offset``: RMSNorm gains ``1 + w`` (Gemma); ``embed_scale``: embeddings × sqrt(d_model) (Gemma);
    - ``attn_scale``: the attention score scale (None: ``d_head ** -0.5``); ``attn_softcap``, ``final_softcap``:
      ``cap · tanh(x / cap)`` on the attention scores and on the logits (Gemma 2);
    - ``sliding_window``: keys at most this many positions back (``i - j < window``); ``global_every``: 0 for every
      layer sliding, else every ``global_every``-th layer is global (Gemma);
    - ``hf_type``: the transformers ``model_type`` the config is written back as (``family``).

    Checked when made: sizes must be positive integers, ``n_head`` must divide ``d_model`` and
    ``n_kv_heads`` divide ``n_head``, rotary positions need an even ``d_head``, ``layer_norm_eps`` and
    ``rope_theta`` must be finite and > 0, and the three kinds must be one of those listed (ValueError;
    TypeError for a value of the wrong type). The config is frozen: :meth:`replace` makes a changed copy.
    """

    n_layer: int = 12
    d_model: int = 768
    n_head: int = 12
    d_mlp: int = 3072
    n_ctx: int = 1024
    d_vocab: int = 50257
    layer_norm_eps: float = 1e-5
    name: str = "gpt2"
    norm: str = "layernorm"
    positional: str = "learned"
    rope_theta: float = 10000.0
    mlp: str = "gelu"
    n_kv_heads: int | None = None
    bias: bool = True
    tied_embeddings: bool = True
    # --- the options of later families (defaults: GPT-2 / Llama's; see FAMILY_FIELDS and docs/guide) ---
    head_dim: int | None = None
    rope_scaling: str = "none"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_ctx: int = 8192
    rope_attention_factor: float = 1.0
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_truncate: bool = True
    rope_local_theta: float | None = None
    rotary_dim: int | None = None
    rotary_interleaved: bool = False
    qkv_bias: bool | None = None
    attn_out_bias: bool | None = None
    unembed_bias: bool = False
    qk_norm: str = "none"
    norm_position: str = "pre"
    parallel: str = "none"
    norm_offset: bool = False
    embed_scale: bool = False
    attn_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    sliding_window: int | None = None
    global_every: int = 0
    hf_type: str | None = None

    # per model, not part of the value: TransformerLens's opt-in hook points (see ModelConfig)
    use_attn_result: ClassVar[bool] = False
    use_split_qkv_input: ClassVar[bool] = False
    use_attn_in: ClassVar[bool] = False
    use_hook_mlp_in: ClassVar[bool] = False

    def __post_init__(self) -> None:
        self._check_sizes()
        self._check_numbers()
        for field, allowed in (
            ("norm", ("layernorm", "rmsnorm")),
            ("positional", ("learned", "rotary")),
            ("mlp", ("gelu", "gelu_erf", "swiglu", "geglu")),
            ("rope_scaling", ("none", "linear", "llama3", "yarn")),
            ("qk_norm", ("none", "head", "full")),
            ("norm_position", ("pre", "post", "sandwich")),
            ("parallel", ("none", "two_norms", "one_norm")),
            ("hf_type", (None, *HF_TYPES)),
        ):
            if getattr(self, field) not in allowed:
                raise ValueError(f"{field}={getattr(self, field)!r}; accepted: {', '.join(map(repr, allowed))}")
        for field in (
            "bias",
            "tied_embeddings",
            "rotary_interleaved",
            "unembed_bias",
            "norm_offset",
            "embed_scale",
            "rope_truncate",
        ):
            if not isinstance(getattr(self, field), bool):
                raise TypeError(f"{field} must be True or False, got {getattr(self, field)!r}")
        if not isinstance(self.name, str):
            raise TypeError(f"name must be a string, got {type(self.name).__name__} {self.name!r:.40}")
        for field in ("qkv_bias", "attn_out_bias"):
            if getattr(self, field) is not None and not isinstance(getattr(self, field), bool):
                raise TypeError(f"{field} must be True, False or None (as bias), got {getattr(self, field)!r}")
        if self.positional == "rotary" and self.rotary_width % 2:
            raise ValueError(f"rotary positions need an even rotary_dim, got {self.rotary_width}")
        if self.rotary_width > self.d_head:
            raise ValueError(f"rotary_dim={self.rotary_dim} is wider than the head (d_head={self.d_head})")
        if self.parallel != "none" and self.norm_position != "pre":
            raise ValueError(f"parallel={self.parallel!r} needs norm_position='pre', got {self.norm_position!r}")

    def _check_sizes(self) -> None:
        """Sizes are positive ints; n_head divides d_model and n_kv_heads divides n_head."""
        for field in ("n_layer", "d_model", "n_head", "d_mlp", "n_ctx", "d_vocab"):
            object.__setattr__(self, field, check_count(getattr(self, field), field))
        if self.d_model % self.n_head and self.head_dim is None:
            raise ValueError(
                f"n_head={self.n_head} must divide d_model={self.d_model} (d_model must be divisible by n_head)"
            )
        for field, minimum in (("head_dim", 1), ("rotary_dim", 2), ("sliding_window", 1)):
            if getattr(self, field) is not None:
                object.__setattr__(self, field, check_count(getattr(self, field), field, minimum))
        object.__setattr__(self, "global_every", check_count(self.global_every, "global_every", 0))
        object.__setattr__(self, "rope_original_ctx", check_count(self.rope_original_ctx, "rope_original_ctx"))
        if self.n_kv_heads is not None:
            object.__setattr__(self, "n_kv_heads", check_count(self.n_kv_heads, "n_kv_heads"))
            if self.n_head % self.n_kv_heads:
                raise ValueError(f"n_kv_heads={self.n_kv_heads} must be positive and divide n_head={self.n_head}")

    def _check_numbers(self) -> None:
        """The norm epsilon and the rotary base are finite positive numbers."""
        optional = ("rope_local_theta", "attn_scale", "attn_softcap", "final_softcap")
        for field in (
            "layer_norm_eps",
            "rope_theta",
            "rope_factor",
            "rope_low_freq_factor",
            "rope_high_freq_factor",
            "rope_attention_factor",
            "rope_beta_fast",
            "rope_beta_slow",
            *optional,
        ):
            v = getattr(self, field)
            if v is None and field in optional:
                continue
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise TypeError(f"{field} must be a number, got {type(v).__name__} {v!r:.40}")
            if not math.isfinite(v) or v <= 0:
                raise ValueError(f"{field} must be a finite number > 0, got {v!r}")
            object.__setattr__(self, field, float(v))

    @property
    def d_head(self) -> int:
        """The width of one attention head: ``head_dim``, else ``d_model // n_head``."""
        return self.head_dim or self.d_model // self.n_head

    @property
    def rotary_width(self) -> int:
        """How many dimensions of each query/key head RoPE rotates (``rotary_dim``, else all ``d_head``)."""
        return self.rotary_dim or self.d_head

    @property
    def has_qkv_bias(self) -> bool:
        """Whether the query/key/value projections have biases (``qkv_bias``, else ``bias``)."""
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @property
    def has_attn_out_bias(self) -> bool:
        """Whether the attention output projection has a bias (``attn_out_bias``, else ``bias``)."""
        return self.bias if self.attn_out_bias is None else self.attn_out_bias

    def is_sliding(self, layer: int) -> bool:
        """Whether block ``layer`` attends within ``sliding_window`` tokens only: every layer when
        ``global_every`` is 0, else all but every ``global_every``-th (Gemma's local/global alternation)."""
        if self.sliding_window is None:
            return False
        return self.global_every == 0 or (layer + 1) % self.global_every != 0

    @property
    def n_kv(self) -> int:
        """Key/value heads (``n_head`` unless grouped-query attention)."""
        return self.n_kv_heads or self.n_head

    @property
    def family(self) -> str:
        """The transformers ``model_type`` of this config: ``hf_type`` when set (``"qwen2"``, ``"gemma2"``…),
        else ``"gpt2"`` (GPT-2's maths), ``"llama"`` (RMSNorm, RoPE, SwiGLU, no biases) or ``"mixed"``."""
        if self.hf_type is not None:
            return self.hf_type
        plain = {f.name: f.default for f in fields(GPT2Config) if f.name in FAMILY_FIELDS}
        if any(getattr(self, k) != v for k, v in plain.items()):
            return "mixed"
        if (self.norm, self.positional, self.mlp, self.bias) == ("layernorm", "learned", "gelu", True):
            return "gpt2" if self.tied_embeddings and self.n_kv == self.n_head else "mixed"
        if (self.norm, self.positional, self.mlp, self.bias) == ("rmsnorm", "rotary", "swiglu", False):
            return "llama"
        return "mixed"

    # TransformerLens's names for the same numbers (read-only)
    @property
    def n_layers(self) -> int:
        """TransformerLens's name for ``n_layer``."""
        return self.n_layer

    @property
    def n_heads(self) -> int:
        """TransformerLens's name for ``n_head``."""
        return self.n_head

    @property
    def d_vocab_out(self) -> int:
        """TransformerLens's name for the output vocabulary size (``d_vocab``)."""
        return self.d_vocab

    @property
    def model_name(self) -> str:
        """TransformerLens's name for ``name``."""
        return self.name

    def replace(self, **changes: Any) -> GPT2Config:
        """A copy with the fields in ``changes`` replaced (checked like a new config)."""
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a plain dict (``GPT2Config(**d)`` rebuilds the config)."""
        return asdict(self)

    # --- Hugging Face config.json -------------------------------------------------
    def to_hf_dict(self) -> dict[str, Any]:
        """A ``config.json`` that ``transformers`` loads as this model (GPT2LMHeadModel or LlamaForCausalLM)."""
        if self.family not in ("gpt2", "llama"):
            from .families import to_hf_dict

            return to_hf_dict(self)
        if self.family == "llama":
            return self._to_llama_dict()
        if self.family != "gpt2":
            raise ValueError(f"{self.name} mixes GPT-2 and Llama parts ({self}); transformers has no class for it")
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "activation_function": "gelu_new",
            "n_layer": self.n_layer,
            "n_embd": self.d_model,
            "n_head": self.n_head,
            "n_inner": self.d_mlp,
            "n_positions": self.n_ctx,
            "n_ctx": self.n_ctx,
            "vocab_size": self.d_vocab,
            "layer_norm_epsilon": self.layer_norm_eps,
            "bos_token_id": 50256,
            "eos_token_id": 50256,
            "tie_word_embeddings": True,
            "scale_attn_weights": True,
            "scale_attn_by_inverse_layer_idx": False,
            "reorder_and_upcast_attn": False,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "gpt2_interp_name": self.name,
        }

    def _to_llama_dict(self) -> dict[str, Any]:
        from .families import rope_dict

        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_act": "silu",
            "num_hidden_layers": self.n_layer,
            "hidden_size": self.d_model,
            "num_attention_heads": self.n_head,
            "num_key_value_heads": self.n_kv,
            "head_dim": self.d_head,
            "intermediate_size": self.d_mlp,
            "max_position_embeddings": self.n_ctx,
            "vocab_size": self.d_vocab,
            "rms_norm_eps": self.layer_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": rope_dict(self),
            "tie_word_embeddings": self.tied_embeddings,
            "attention_bias": False,
            "mlp_bias": False,
            "attention_dropout": 0.0,
            "gpt2_interp_name": self.name,
        }

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], name: str | None = None) -> GPT2Config:
        """Read a Hugging Face GPT-2 or Llama ``config.json``; refuse variants whose maths we do not implement,
        and values no model can have (naming our field and the ``config.json`` key it came from)."""
        if not isinstance(hf, dict):
            raise TypeError(f"a config.json must hold a JSON object, got {type(hf).__name__}")
        from .families import FAMILY_READERS, from_family_dict, refuse_unsupported

        refuse_unsupported(hf)
        try:
            if hf.get("model_type", "gpt2") in FAMILY_READERS:
                return from_family_dict(cls, hf, name)
            if hf.get("model_type", "gpt2") == "llama":
                return cls._from_llama_dict(hf, name)
            return cls._from_gpt2_dict(hf, name)
        except (ValueError, TypeError) as e:
            keys = LLAMA_JSON_KEYS if hf.get("model_type") == "llama" else GPT2_JSON_KEYS
            field = str(e).split("=")[0].split(" ")[0]
            if field in keys:
                raise type(e)(f"{e} (config.json key {keys[field]!r})") from None
            raise

    @classmethod
    def _from_gpt2_dict(cls, hf: dict[str, Any], name: str | None) -> GPT2Config:
        if hf.get("model_type", "gpt2") != "gpt2":
            raise ValueError(
                f"config.json has model_type={hf.get('model_type')!r}; supported: 'gpt2', 'llama', "
                f"{', '.join(map(repr, HF_TYPES))}"
            )
        unsupported = {
            "activation_function": ("gelu_new", hf.get("activation_function", "gelu_new")),
            "scale_attn_weights": (True, hf.get("scale_attn_weights", True)),
            "scale_attn_by_inverse_layer_idx": (False, hf.get("scale_attn_by_inverse_layer_idx", False)),
            "tie_word_embeddings": (True, hf.get("tie_word_embeddings", True)),
        }
        bad = {k: got for k, (want, got) in unsupported.items() if got != want}
        if bad:
            raise ValueError(f"this checkpoint is not plain GPT-2 ({bad}); gpt2-interp implements exactly GPT-2")
        d_model = hf.get("n_embd", 768)
        return cls(
            n_layer=hf.get("n_layer", 12),
            d_model=d_model,
            n_head=hf.get("n_head", 12),
            d_mlp=hf.get("n_inner") or 4 * d_model,
            n_ctx=hf.get("n_positions", hf.get("n_ctx", 1024)),
            d_vocab=hf.get("vocab_size", 50257),
            layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
            name=name or hf.get("gpt2_interp_name") or hf.get("_name_or_path") or "gpt2",
        )

    @classmethod
    def _from_llama_dict(cls, hf: dict[str, Any], name: str | None) -> GPT2Config:
        from .families import llama_like

        kw = llama_like(hf)  # the one reader of Llama-style config.json keys; embeddings untied unless said
        for key in ("sliding_window", "global_every"):  # LlamaForCausalLM has no sliding window
            kw.pop(key, None)
        unsupported = {
            "hidden_act": ("silu", hf.get("hidden_act", "silu")),
            "attention_bias": (False, hf.get("attention_bias", False)),
            "mlp_bias": (False, hf.get("mlp_bias", False)),
            "pretraining_tp": (1, hf.get("pretraining_tp", 1) or 1),
        }
        bad = {k: got for k, (want, got) in unsupported.items() if got != want}
        if bad:
            raise ValueError(
                f"this Llama checkpoint uses {bad}; gpt2-interp implements Llama with "
                "hidden_act 'silu', no attention/MLP biases, pretraining_tp 1"
            )
        return cls(**kw, name=name or hf.get("gpt2_interp_name") or hf.get("_name_or_path") or "llama")


@boundary
def llama_config(**kw: Any) -> GPT2Config:
    """A Llama-family config (RMSNorm, RoPE, SwiGLU, no biases, name ``"llama"``); ``kw`` sets the sizes
    and may override any other :class:`GPT2Config` field (e.g. ``n_kv_heads``, ``tied_embeddings``)."""
    base: dict[str, Any] = dict(norm="rmsnorm", positional="rotary", mlp="swiglu", bias=False, name="llama")
    return GPT2Config(**{**base, **kw})


class ModelConfig(GPT2Config):
    """One model's view of its config: every field of the (frozen, shareable) :class:`GPT2Config`,
    equal to it, plus what TransformerLens keeps on ``model.cfg`` that belongs to one model:

    - ``device`` and ``dtype``, read from the model's embedding, so they are right after ``model.to(...)``
      (read-only: move the model instead);
    - TransformerLens's opt-in hook points, the switches that may be set (all off by default; each also
      has TL's setter on the model, e.g. ``model.set_use_attn_result(True)``):

      - ``use_attn_result``: every attention layer computes and hooks its per-head results
        ``blocks.{l}.attn.hook_result`` ``[batch, pos, head, d_model]``;
      - ``use_split_qkv_input``: each block hooks one copy of its residual input per head and per use,
        ``blocks.{l}.hook_q_input`` ``[batch, pos, head, d_model]`` and ``hook_k_input``/``hook_v_input``
        ``[batch, pos, kv_head, d_model]``; ``ln1`` normalises each copy and head ``h`` reads only its own;
      - ``use_attn_in``: one copy per head shared by its query, key and value, ``blocks.{l}.hook_attn_in``
        ``[batch, pos, head, d_model]`` (refused under grouped-query attention, as in TL: use
        ``use_split_qkv_input``); at most one of these two is on (setting both raises);
      - ``use_hook_mlp_in``: ``blocks.{l}.hook_mlp_in`` ``[batch, pos, d_model]``, a copy of the residual
        the MLP's norm ``ln2`` reads (replacing it changes the MLP's input, not the residual stream).

    Anything else set on it raises (a TransformerLens flag we do not have must not be a silent no-op).
    ``config`` is the plain :class:`GPT2Config`; ``replace`` returns one.
    """

    @classmethod
    def of(cls, cfg: GPT2Config, embed: Any) -> ModelConfig:
        """A view of ``cfg``'s fields for the model whose token embedding module is ``embed``
        (holding ``W_E``; a submodule, so the view makes no reference cycle with the model)."""
        view = cls(**{f.name: getattr(cfg, f.name) for f in fields(GPT2Config)})
        object.__setattr__(view, "_embed", embed)
        for switch in SWITCHES:
            object.__setattr__(view, switch, bool(getattr(cfg, switch)))
        return view

    @property
    def config(self) -> GPT2Config:
        """The plain config value (no model attached)."""
        return GPT2Config(**{f.name: getattr(self, f.name) for f in fields(GPT2Config)})

    @property
    def device(self) -> Any:
        """The model's device (where its weights are now)."""
        return self._embedding().device

    @property
    def dtype(self) -> Any:
        """The model's dtype (of its weights now)."""
        return self._embedding().dtype

    def _embedding(self) -> Any:
        embed = self.__dict__.get("_embed")
        if embed is None:
            raise AttributeError("this config is not attached to a model; device and dtype are the model's")
        return embed.W_E

    def __setattr__(self, name: str, value: Any) -> None:
        if name in SWITCHES:
            object.__setattr__(self, name, self._checked_switch(name, value))
        elif name in ("device", "dtype"):
            raise AttributeError(f"cfg.{name} follows the model's weights; use model.to(...) to change it")
        elif name in {f.name for f in fields(GPT2Config)}:
            raise FrozenInstanceError(
                f"cannot assign to field {name!r}: a config is a frozen value; build a "
                f"model from cfg.replace({name}=...)"
            )
        else:
            raise AttributeError(
                f"cfg.{name}: gpt2-interp's config has no such switch (the settable TransformerLens "
                f"switches are {', '.join(SWITCHES)}); see docs/porting.md"
            )

    def _checked_switch(self, name: str, value: Any) -> bool:
        """``value`` as a bool for switch ``name``, refusing what TransformerLens refuses: ``use_attn_in``
        under grouped-query attention, and ``use_attn_in`` with ``use_split_qkv_input`` (TL's
        ``HookedTransformer`` would silently ignore edits to ``hook_attn_in``; its bridge refuses)."""
        on = bool(value)
        if on and name == "use_attn_in" and self.n_kv != self.n_head:
            raise ValueError(
                f"use_attn_in needs one key/value head per query head; {self.name} has n_kv_heads={self.n_kv} "
                f"for n_head={self.n_head} (grouped-query attention): use set_use_split_qkv_input(True) instead"
            )
        other = {"use_attn_in": "use_split_qkv_input", "use_split_qkv_input": "use_attn_in"}.get(name)
        if on and other is not None and getattr(self, other):
            raise ValueError(
                f"{name} and {other} are exclusive (both hook the attention's input); set {other} to False first"
            )
        return on

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GPT2Config):
            return all(getattr(self, f.name) == getattr(other, f.name) for f in fields(GPT2Config))
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.config)

    def __repr__(self) -> str:
        return repr(self.config)

    def replace(self, **changes: Any) -> GPT2Config:
        return replace(self.config, **changes)


#: The transformers ``model_type`` of each family beyond GPT-2 and Llama that a config can be (``hf_type``).
HF_TYPES = ("qwen2", "mistral", "qwen3", "olmo2", "gpt_neox", "gptj", "gemma2", "gemma3_text", "phi3")

#: The fields that make a config differ from plain GPT-2 / Llama maths (``family`` is ``"mixed"`` when one of
#: them is set and ``hf_type`` is not); head_dim and the rope_* fields are Llama's own options.
FAMILY_FIELDS = (
    "rotary_dim",
    "rotary_interleaved",
    "qkv_bias",
    "attn_out_bias",
    "unembed_bias",
    "qk_norm",
    "norm_position",
    "parallel",
    "norm_offset",
    "embed_scale",
    "attn_scale",
    "attn_softcap",
    "final_softcap",
    "sliding_window",
    "global_every",
    "rope_local_theta",
)

#: The per-model TransformerLens switches :class:`ModelConfig` lets a user set (all off by default).
SWITCHES = ("use_attn_result", "use_split_qkv_input", "use_attn_in", "use_hook_mlp_in")

# our field → the config.json key it is read from
GPT2_JSON_KEYS = {
    "n_layer": "n_layer",
    "d_model": "n_embd",
    "n_head": "n_head",
    "d_mlp": "n_inner",
    "n_ctx": "n_positions",
    "d_vocab": "vocab_size",
    "layer_norm_eps": "layer_norm_epsilon",
}
LLAMA_JSON_KEYS = {
    "n_layer": "num_hidden_layers",
    "d_model": "hidden_size",
    "n_head": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "d_mlp": "intermediate_size",
    "n_ctx": "max_position_embeddings",
    "d_vocab": "vocab_size",
    "layer_norm_eps": "rms_norm_eps",
    "rope_theta": "rope_theta",
}


def _known(name: str, n_layer: int, d_model: int, n_head: int) -> GPT2Config:
    return GPT2Config(n_layer=n_layer, d_model=d_model, n_head=n_head, d_mlp=4 * d_model, name=name)


def _llama_json(layers: int, d: int, heads: int, kv: int, mlp: int, vocab: int, ctx: int, **kw: Any) -> dict[str, Any]:
    """The shape keys of a Llama-like ``config.json`` (``kw`` adds or overrides keys)."""
    return {
        "num_hidden_layers": layers,
        "hidden_size": d,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "intermediate_size": mlp,
        "vocab_size": vocab,
        "max_position_embeddings": ctx,
        "hidden_act": "silu",
        **kw,
    }


def _pythia(layers: int, d: int, heads: int) -> dict[str, Any]:
    return {
        "model_type": "gpt_neox",
        "num_hidden_layers": layers,
        "hidden_size": d,
        "num_attention_heads": heads,
        "intermediate_size": 4 * d,
        "vocab_size": 50304,
        "max_position_embeddings": 2048,
        "rotary_pct": 0.25,
        "rotary_emb_base": 10000,
        "hidden_act": "gelu",
        "use_parallel_residual": True,
        "layer_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }


_LLAMA3 = {
    "model_type": "llama",
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
}
_QWEN2 = {
    "model_type": "qwen2",
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "use_sliding_window": False,
    "sliding_window": None,
}
_QWEN3 = {
    "model_type": "qwen3",
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "sliding_window": None,
}
_GEMMA = {"hidden_activation": "gelu_pytorch_tanh", "query_pre_attn_scalar": 256, "tie_word_embeddings": True}

#: The published ``config.json`` values (the keys that shape the model) of released models of the later
#: families, as data: :data:`KNOWN_CONFIGS` reads each with :meth:`GPT2Config.from_hf_dict`.
PUBLISHED_CONFIG_JSON: dict[str, dict[str, Any]] = {
    "llama-3.2-1b": _llama_json(
        16,
        2048,
        32,
        8,
        8192,
        128256,
        131072,
        head_dim=64,
        **_LLAMA3,
    ),
    "llama-3.2-3b": _llama_json(
        28,
        3072,
        24,
        8,
        8192,
        128256,
        131072,
        head_dim=128,
        **_LLAMA3,
    ),
    "qwen2.5-0.5b": _llama_json(
        24,
        896,
        14,
        2,
        4864,
        151936,
        32768,
        **_QWEN2,
    ),
    "qwen2.5-1.5b": _llama_json(
        28,
        1536,
        12,
        2,
        8960,
        151936,
        131072,
        **_QWEN2,
    ),
    "qwen3-0.6b": _llama_json(
        28,
        1024,
        16,
        8,
        3072,
        151936,
        40960,
        **_QWEN3,
    ),
    "qwen3-1.7b": _llama_json(
        28,
        2048,
        16,
        8,
        6144,
        151936,
        40960,
        **_QWEN3,
    ),
    "gemma-2-2b": _llama_json(
        26,
        2304,
        8,
        4,
        9216,
        256000,
        8192,
        model_type="gemma2",
        head_dim=256,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        sliding_window=4096,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        layer_types=["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(26)],
        **_GEMMA,
    ),
    "gemma-3-1b": _llama_json(
        26,
        1152,
        4,
        1,
        6912,
        262144,
        32768,
        model_type="gemma3_text",
        head_dim=256,
        rms_norm_eps=1e-6,
        sliding_window=512,
        layer_types=["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(26)],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        **_GEMMA,
    ),
    "gpt-j-6b": {
        "model_type": "gptj",
        "n_layer": 28,
        "n_embd": 4096,
        "n_head": 16,
        "rotary_dim": 64,
        "n_inner": None,
        "n_positions": 2048,
        "vocab_size": 50400,
        "layer_norm_epsilon": 1e-5,
        "activation_function": "gelu_new",
        "tie_word_embeddings": False,
    },
    "pythia-70m": _pythia(6, 512, 8),
    "pythia-160m": _pythia(12, 768, 12),
    "pythia-410m": _pythia(24, 1024, 16),
    "pythia-1b": _pythia(16, 2048, 8),
    "pythia-1.4b": _pythia(24, 2048, 16),
    "mistral-7b": _llama_json(
        32,
        4096,
        32,
        8,
        14336,
        32000,
        32768,
        model_type="mistral",
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        sliding_window=4096,
        tie_word_embeddings=False,
    ),
    "phi-3-mini": _llama_json(
        32,
        3072,
        32,
        32,
        8192,
        32064,
        4096,
        model_type="phi3",
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        sliding_window=2047,
        tie_word_embeddings=False,
        original_max_position_embeddings=4096,
    ),
    "olmo-2-1b": _llama_json(
        16,
        2048,
        16,
        16,
        8192,
        100352,
        4096,
        model_type="olmo2",
        rms_norm_eps=1e-6,
        rope_theta=500000.0,
        attention_bias=False,
        tie_word_embeddings=False,
    ),
}

KNOWN_CONFIGS: dict[str, GPT2Config] = {
    "gpt2": _known("gpt2", 12, 768, 12),
    "gpt2-medium": _known("gpt2-medium", 24, 1024, 16),
    "gpt2-large": _known("gpt2-large", 36, 1280, 20),
    "gpt2-xl": _known("gpt2-xl", 48, 1600, 25),
    "distilgpt2": _known("distilgpt2", 6, 768, 12),
    # the shapes of later families (random weights: HookedGPT2("qwen3-0.6b"); trained ones load from a directory)
    **{name: GPT2Config.from_hf_dict(hf, name=name) for name, hf in PUBLISHED_CONFIG_JSON.items()},
}
