"""GPT-2 hyper-parameters, and the configs of the released checkpoints."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any


@dataclass(frozen=True)
class GPT2Config:
    """The shape of a GPT-2. Every released GPT-2 differs only in these numbers."""

    n_layer: int = 12
    d_model: int = 768
    n_head: int = 12
    d_mlp: int = 3072
    n_ctx: int = 1024
    d_vocab: int = 50257
    layer_norm_eps: float = 1e-5
    name: str = "gpt2"

    def __post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_head={self.n_head}")
        for field in ("n_layer", "d_model", "n_head", "d_mlp", "n_ctx", "d_vocab"):
            if getattr(self, field) <= 0:
                raise ValueError(f"{field} must be positive, got {getattr(self, field)}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_head

    def replace(self, **changes: Any) -> "GPT2Config":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    # --- Hugging Face config.json -------------------------------------------------
    def to_hf_dict(self) -> dict[str, Any]:
        """A ``config.json`` that ``transformers.GPT2LMHeadModel`` loads as this model."""
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

    @classmethod
    def from_hf_dict(cls, hf: dict[str, Any], name: str | None = None) -> "GPT2Config":
        """Read a Hugging Face GPT-2 ``config.json``; refuse variants that are not GPT-2 maths."""
        if hf.get("model_type", "gpt2") != "gpt2":
            raise ValueError(f"config.json has model_type={hf.get('model_type')!r}; only 'gpt2' is supported")
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


def _known(name: str, n_layer: int, d_model: int, n_head: int) -> GPT2Config:
    return GPT2Config(n_layer=n_layer, d_model=d_model, n_head=n_head, d_mlp=4 * d_model, name=name)


KNOWN_CONFIGS: dict[str, GPT2Config] = {
    "gpt2": _known("gpt2", 12, 768, 12),
    "gpt2-medium": _known("gpt2-medium", 24, 1024, 16),
    "gpt2-large": _known("gpt2-large", 36, 1280, 20),
    "gpt2-xl": _known("gpt2-xl", 48, 1600, 25),
    "distilgpt2": _known("distilgpt2", 6, 768, 12),
}
