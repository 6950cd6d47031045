"""Checkpoint files as plain tensors: reading state dicts, telling their naming apart, finding
snapshots in the Hugging Face cache and the embedded models. Nothing here builds a model (that is
``gpt2_interp.model.loading``: this layer must not import the model).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ..core.boundary import boundary

EMBEDDED = {"gpt2-facts"}
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")  # buffers of old HF checkpoints
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


def detect_format(sd: Mapping[str, Any]) -> str:
    """'hf' (GPT2LMHeadModel), 'hf_llama' (LlamaForCausalLM), 'tl' (TransformerLens) or 'native' (ours),
    from the key names."""
    if "blocks.0.attn.W_QKV" in sd:
        return "native"
    if "blocks.0.attn.W_Q" in sd or "embed.W_E" in sd:
        return "tl"
    if any(k.removeprefix("transformer.") == "wte.weight" for k in sd):
        return "hf"
    if any(k.removeprefix("model.") == "embed_tokens.weight" for k in sd):
        return "hf_llama"
    raise ValueError(f"not a GPT-2 or Llama state dict I recognise (first keys: {list(sd)[:4]})")


@boundary
def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file (or a ``.bin``, unpickled with ``weights_only=True``),
    with an error naming the file when it is damaged, truncated or not a checkpoint."""
    path = Path(path)
    if path.suffix == ".safetensors":
        try:
            return load_file(str(path))
        except Exception as e:  # SafetensorError, OSError, …
            raise ValueError(
                f"{path} is damaged or not a safetensors checkpoint ({type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else 'no details'})"
            ) from None
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # UnpicklingError (refused globals), EOFError (truncated), zip errors, …
        raise ValueError(
            f"could not read {path} as a PyTorch checkpoint (loaded with weights_only=True, so code in "
            f"the file is never run): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from None
    if not isinstance(sd, Mapping):
        raise ValueError(f"{path} holds a {type(sd).__name__}, not a state dict of tensors")
    return dict(sd)


def read_config_json(path: Path) -> dict[str, Any]:
    """A Hugging Face ``config.json`` as a dict, with errors that name the file."""
    try:
        hf = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}); a config.json holds n_layer, n_embd, n_head, …") from None
    if not isinstance(hf, dict):
        raise ValueError(f"{path} holds a JSON {type(hf).__name__}, not an object with n_layer, n_embd, n_head, …")
    ints = (
        "n_layer",
        "n_embd",
        "n_head",
        "n_inner",
        "n_positions",
        "n_ctx",
        "vocab_size",
        "num_hidden_layers",
        "hidden_size",
        "num_attention_heads",
        "num_key_value_heads",
        "intermediate_size",
    )
    bad = {
        k: hf[k]
        for k in ints
        if k in hf and hf[k] is not None and (not isinstance(hf[k], int) or isinstance(hf[k], bool))
    }
    if bad:
        raise ValueError(f"{path}: {', '.join(f'{k}={v!r}' for k, v in bad.items())} must be integers")
    return hf


@boundary
def read_hf_dir(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(config.json as a dict, state dict)`` of a Hugging Face model directory."""
    path = Path(path)
    config_path = path / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{path} has no config.json; a model directory needs config.json and model.safetensors")
    hf = read_config_json(config_path)
    for weights in WEIGHT_FILES:
        if (path / weights).exists():
            return hf, read_weights(path / weights)
    raise FileNotFoundError(f"{path} has a config.json but no weights: expected model.safetensors or pytorch_model.bin")


@boundary
def write_hf_dir(path: Path, config: dict[str, Any], sd: Mapping[str, torch.Tensor]) -> Path:
    """Write ``config`` as ``config.json`` and the state dict ``sd`` (name → tensor, made contiguous) as
    ``model.safetensors`` to the directory ``path`` (created if missing; existing files are
    overwritten). Returns ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in sd.items()}, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return path


def hf_cache_roots() -> list[Path]:
    """The local Hugging Face cache folders searched for models, in order: ``$HF_HUB_CACHE`` (if set), then
    ``$HF_HOME/hub`` (``HF_HOME`` defaults to ``~/.cache/huggingface``)."""
    roots = []
    if os.environ.get("HF_HUB_CACHE"):
        roots.append(Path(os.environ["HF_HUB_CACHE"]))
    hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    roots.append(hf_home / "hub")
    return roots


def hf_cache_dirs(repo: str, need: tuple[str, ...] = WEIGHT_FILES) -> list[Path]:
    """Snapshots of ``repo`` in the local Hugging Face cache (newest first) holding a config.json and
    one of the ``need`` files."""
    roots = hf_cache_roots()
    # the hub matches repository ids in any case, so a cache folder may be spelled either way
    wanted = {f"models--{n.replace('/', '--')}".lower() for n in (repo, repo.split("/")[-1])}
    found = []
    for root in roots:
        for folder in sorted(root.iterdir()) if root.is_dir() else []:
            snaps = folder / "snapshots"
            if folder.name.lower() in wanted and snaps.is_dir():
                found += sorted(snaps.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    with_config = need == WEIGHT_FILES
    return [
        d for d in found if any((d / w).exists() for w in need) and (not with_config or (d / "config.json").exists())
    ]


@boundary
def embedded_path(name: str = "gpt2-facts") -> Path:
    """The directory of a model shipped inside the package (``gpt2_interp/models/<name>``; default
    ``gpt2-facts``). The path is returned whether or not it exists."""
    return Path(str(resources.files("gpt2_interp").joinpath(f"models/{name}")))
