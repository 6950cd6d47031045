"""Loading and saving GPT-2 checkpoints in every common form.

Accepted: a Hugging Face directory (``config.json`` + ``model.safetensors`` or
``pytorch_model.bin``), a bare ``.safetensors`` file (config from a sibling
``config.json``, an explicit config, or inferred from the tensor shapes), a
model name resolved through the local Hugging Face cache (then the hub, when
``huggingface_hub`` is installed and online), the embedded ``gpt2-facts``, a
``transformers`` model, and a TransformerLens ``HookedTransformer`` or its
state dict. State dicts in HF, TransformerLens or our own naming are told
apart by their keys.
"""

from __future__ import annotations

import json
import os
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import torch
from einops import rearrange
from safetensors.torch import load_file, save_file

from ..core.devices import resolve_device, resolve_dtype
from ..core.finite import is_finite, nonfinite_summary
from ..model.config import KNOWN_CONFIGS, GPT2Config
from ..model.hooked_gpt2 import HookedGPT2

EMBEDDED = {"gpt2-facts"}
HUB_REPOS = {name: f"openai-community/{name}" for name in KNOWN_CONFIGS}
HUB_REPOS.update({f"openai-community/{name}": f"openai-community/{name}" for name in KNOWN_CONFIGS})
HUB_REPOS["distilbert/distilgpt2"] = "distilbert/distilgpt2"
HUB_REPOS["distilgpt2"] = "distilbert/distilgpt2"
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers of old HF checkpoints


# ---------------------------------------------------------------- state-dict conversion
def _hf_to_native(sd: Mapping[str, torch.Tensor], cfg: GPT2Config) -> dict[str, torch.Tensor]:
    sd = {k.removeprefix("transformer."): v for k, v in sd.items() if not k.endswith(_IGNORED_SUFFIXES)}
    sd.pop("lm_head.weight", None)  # tied to wte
    out = {"embed.W_E": sd.pop("wte.weight"), "pos_embed.W_pos": sd.pop("wpe.weight")}
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


def native_to_hf(model: HookedGPT2) -> dict[str, torch.Tensor]:
    """Our weights under GPT2LMHeadModel's names (``transformer.*``; lm_head is tied)."""
    sd = model.state_dict()
    out = {"transformer.wte.weight": sd["embed.W_E"], "transformer.wpe.weight": sd["pos_embed.W_pos"]}
    out["transformer.ln_f.weight"], out["transformer.ln_f.bias"] = sd["ln_final.w"], sd["ln_final.b"]
    for i in range(model.cfg.n_layer):
        h, b = f"transformer.h.{i}.", f"blocks.{i}."
        pairs = {
            "ln_1.weight": "ln1.w", "ln_1.bias": "ln1.b", "ln_2.weight": "ln2.w", "ln_2.bias": "ln2.b",
            "attn.c_attn.weight": "attn.W_QKV", "attn.c_attn.bias": "attn.b_QKV", "attn.c_proj.bias": "attn.b_O",
            "mlp.c_fc.weight": "mlp.W_in", "mlp.c_fc.bias": "mlp.b_in",
            "mlp.c_proj.weight": "mlp.W_out", "mlp.c_proj.bias": "mlp.b_out",
        }
        out.update({h + hf: sd[b + ours] for hf, ours in pairs.items()})
        out[h + "attn.c_proj.weight"] = sd[b + "attn.W_O"].reshape(model.cfg.d_model, model.cfg.d_model)
    return {k: v.contiguous() for k, v in out.items()}


def _tl_to_native(sd: Mapping[str, torch.Tensor], cfg: GPT2Config) -> dict[str, torch.Tensor]:
    if "blocks.0.ln1.w" not in sd:
        raise ValueError(
            "this TransformerLens state dict has folded LayerNorms (no blocks.0.ln1.w), so its weights no "
            "longer mean what GPT-2's do; load it with HookedTransformer.from_pretrained_no_processing"
        )
    out = {"embed.W_E": sd["embed.W_E"], "pos_embed.W_pos": sd["pos_embed.W_pos"],
           "ln_final.w": sd["ln_final.w"], "ln_final.b": sd["ln_final.b"]}
    for i in range(cfg.n_layer):
        b = f"blocks.{i}."
        for k in ("ln1.w", "ln1.b", "ln2.w", "ln2.b", "attn.W_O", "attn.b_O",
                  "mlp.W_in", "mlp.b_in", "mlp.W_out", "mlp.b_out"):
            out[b + k] = sd[b + k]
        qkv = torch.stack([sd[b + f"attn.W_{x}"] for x in "QKV"])  # [3, head, d_model, d_head]
        out[b + "attn.W_QKV"] = rearrange(qkv, "three h d dh -> d (three h dh)")
        out[b + "attn.b_QKV"] = rearrange(torch.stack([sd[b + f"attn.b_{x}"] for x in "QKV"]), "three h dh -> (three h dh)")
    if "unembed.W_U" in sd and not torch.equal(sd["unembed.W_U"], sd["embed.W_E"].T):
        raise ValueError("this TransformerLens model's W_U is not W_Eᵀ (centred or untied); GPT-2 ties them. "
                         "Load it with from_pretrained_no_processing.")
    return out


def infer_config(sd: Mapping[str, torch.Tensor], name: str = "gpt2") -> GPT2Config:
    """Guess the config from tensor shapes (n_head from the released model of that width)."""
    fmt = detect_format(sd)
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
    return GPT2Config(n_layer=n_layer, d_model=d_model, n_head=n_head, d_mlp=d_mlp, n_ctx=wpe.shape[0], d_vocab=wte.shape[0], name=name)


def detect_format(sd: Mapping[str, Any]) -> str:
    """'hf', 'tl' (TransformerLens) or 'native' (ours), from the key names."""
    if "blocks.0.attn.W_QKV" in sd:
        return "native"
    if "blocks.0.attn.W_Q" in sd or "embed.W_E" in sd:
        return "tl"
    if any(k.removeprefix("transformer.") == "wte.weight" for k in sd):
        return "hf"
    raise ValueError(f"not a GPT-2 state dict I recognise (first keys: {list(sd)[:4]})")


def from_state_dict(sd: Mapping[str, torch.Tensor], cfg: GPT2Config | None = None,
                    source: str = "the state dict") -> HookedGPT2:
    """A ``HookedGPT2`` from a state dict in HF, TransformerLens or native naming.

    Refuses non-finite weights (naming the tensor), missing or unexpected tensors and shapes
    that do not match ``cfg``; ``source`` names the checkpoint in those errors."""
    for name, t in sd.items():
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{source}: entry {name!r} is a {type(t).__name__}, not a tensor")
    try:
        cfg = cfg or infer_config(sd)
        fmt = detect_format(sd)
        native = {"hf": _hf_to_native, "tl": _tl_to_native, "native": lambda s, c: dict(s)}[fmt](sd, cfg)
    except KeyError as e:
        raise ValueError(f"{source} lacks the tensor {e.args[0]!r} that a GPT-2 checkpoint "
                         f"{'with this config ' if cfg else ''}needs{f' ({cfg})' if cfg else ''}") from None
    except (RuntimeError, IndexError) as e:  # reshapes of tensors whose shapes do not fit the config
        raise ValueError(f"{source}: tensor shapes do not match the config {cfg} ({e})") from None
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
    for k, v in native.items():  # weights only (masks such as TransformerLens' IGNORE = -inf are not weights)
        if not is_finite(v):
            in_file = next((n for n, t in sd.items() if t is v or (t.data_ptr() == v.data_ptr() and t.shape == v.shape)), None)
            raise ValueError(f"{source}: tensor {in_file or k!r}{f' ({k})' if in_file and in_file != k else ''} holds "
                             f"non-finite values ({nonfinite_summary(v)}); refusing to load a model with NaN/inf weights")
    model = HookedGPT2(cfg, seed=0)
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
                f"(n_layer={cfg.n_layer}, d_model={cfg.d_model}, n_head={cfg.n_head}, d_mlp={cfg.d_mlp}, "
                f"n_ctx={cfg.n_ctx}, d_vocab={cfg.d_vocab}) needs {tuple(expected[k].shape)}"
            )
    model.load_state_dict({k: v.to(torch.float32) for k, v in native.items()})
    return model


# ---------------------------------------------------------------- files
def load_dir(path: Path, name: str | None = None) -> HookedGPT2:
    config_path = path / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{path} has no config.json; a GPT-2 directory needs config.json and model.safetensors")
    cfg = read_config(config_path, name=name)
    for weights in ("model.safetensors", "pytorch_model.bin"):
        if (path / weights).exists():
            return from_state_dict(_read_weights(path / weights), cfg, source=str(path / weights))
    raise FileNotFoundError(
        f"{path} has a config.json but no weights: expected model.safetensors or pytorch_model.bin"
    )


def read_config(path: Path, name: str | None = None) -> GPT2Config:
    """The :class:`GPT2Config` of a Hugging Face ``config.json``, with errors that name the file."""
    try:
        hf = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}); a GPT-2 config.json holds n_layer, n_embd, n_head, …") from None
    if not isinstance(hf, dict):
        raise ValueError(f"{path} holds a JSON {type(hf).__name__}, not an object with n_layer, n_embd, n_head, …")
    ints = ("n_layer", "n_embd", "n_head", "n_inner", "n_positions", "n_ctx", "vocab_size")
    bad = {k: hf[k] for k in ints if k in hf and hf[k] is not None and (not isinstance(hf[k], int) or isinstance(hf[k], bool))}
    if bad:
        raise ValueError(f"{path}: {', '.join(f'{k}={v!r}' for k, v in bad.items())} must be integers")
    try:
        return GPT2Config.from_hf_dict(hf, name=name)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from None


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file (or a ``.bin``, unpickled with ``weights_only=True``),
    with an error naming the file when it is damaged, truncated or not a checkpoint."""
    if path.suffix == ".safetensors":
        try:
            return load_file(str(path))
        except Exception as e:  # SafetensorError, OSError, …
            raise ValueError(f"{path} is damaged or not a safetensors checkpoint ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else 'no details'})") from None
    try:
        sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # UnpicklingError (refused globals), EOFError (truncated), zip errors, …
        raise ValueError(f"could not read {path} as a PyTorch checkpoint (loaded with weights_only=True, so code in "
                         f"the file is never run): {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    if not isinstance(sd, Mapping):
        raise ValueError(f"{path} holds a {type(sd).__name__}, not a state dict of tensors")
    return dict(sd)


def save_hf(model: HookedGPT2, path: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (HF names) to the directory ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to("cpu", dtype or v.dtype) for k, v in native_to_hf(model).items()}
    save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(model.cfg.to_hf_dict(), indent=2) + "\n")
    return path


def _hf_cache_dirs(repo: str) -> list[Path]:
    roots = []
    if os.environ.get("HF_HUB_CACHE"):
        roots.append(Path(os.environ["HF_HUB_CACHE"]))
    hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    roots.append(hf_home / "hub")
    names = {repo, repo.split("/")[-1]}
    found = []
    for root in roots:
        for n in names:
            snaps = root / f"models--{n.replace('/', '--')}" / "snapshots"
            if snaps.is_dir():
                found += sorted(snaps.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
    return [d for d in found if (d / "config.json").exists() and any((d / w).exists() for w in ("model.safetensors", "pytorch_model.bin"))]


def _from_hub(name: str) -> HookedGPT2:
    repo = HUB_REPOS[name]
    for snapshot in _hf_cache_dirs(repo):
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


def embedded_path(name: str = "gpt2-facts") -> Path:
    return Path(str(resources.files("gpt2_interp").joinpath(f"models/{name}")))


def load(
    name_or_path: str | os.PathLike,
    device: torch.device | str | None = None,
    dtype: torch.dtype | str | None = None,
    config: GPT2Config | None = None,
) -> HookedGPT2:
    """Load a GPT-2: ``"gpt2-facts"`` (embedded), ``"gpt2"``/``"gpt2-medium"``/… (HF cache, then hub),
    an HF directory, or a ``.safetensors``/``.bin`` file. Returns an eval-mode ``HookedGPT2``."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"load() takes a model name or a path, got {type(name_or_path).__name__}")
    device, dtype = resolve_device(device), resolve_dtype(dtype)  # checked before any work
    key = str(name_or_path)
    path = Path(key).expanduser()
    if key in EMBEDDED:
        model = load_dir(embedded_path(key), name=key)
    elif path.is_dir():
        model = load_dir(path)
    elif path.is_file():
        sd = _read_weights(path)
        sibling = path.parent / "config.json"
        if config is None and sibling.exists():
            config = read_config(sibling)
        if config is None:
            try:
                config = infer_config(sd, name=path.stem)
            except (KeyError, IndexError, ValueError) as e:
                raise ValueError(f"{path}: cannot infer the GPT-2 config from its tensors ({e}); "
                                 "put a config.json next to it or pass config=GPT2Config(...)") from None
        model = from_state_dict(sd, config, source=str(path))
    elif key in HUB_REPOS:
        model = _from_hub(key)
    else:
        raise FileNotFoundError(
            f"{key!r} is neither a file, a directory, nor a known model name "
            f"({', '.join(sorted(EMBEDDED | set(KNOWN_CONFIGS)))})"
        )
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)


# ---------------------------------------------------------------- other libraries
def from_transformers(hf_model: Any) -> HookedGPT2:
    """A ``HookedGPT2`` with the weights of a ``transformers`` GPT2LMHeadModel (or GPT2Model)."""
    cfg = GPT2Config.from_hf_dict(hf_model.config.to_dict())
    sd = {k: v.detach().cpu() for k, v in hf_model.state_dict().items()}
    if "lm_head.weight" in sd and not torch.equal(sd["lm_head.weight"], sd.get("transformer.wte.weight", sd.get("wte.weight"))):
        raise ValueError("this model's lm_head is not tied to wte; GPT-2 ties them")
    return from_state_dict(sd, cfg).eval()


def to_transformers(model: HookedGPT2) -> Any:
    """An equivalent ``transformers.GPT2LMHeadModel``."""
    try:
        from transformers import GPT2Config as HFConfig, GPT2LMHeadModel
    except ImportError:
        raise ImportError("to_transformers needs transformers: pip install 'gpt2-interp[transformers]'") from None
    hf = GPT2LMHeadModel(HFConfig(**model.cfg.to_hf_dict()))
    missing, unexpected = hf.load_state_dict(native_to_hf(model), strict=False)
    if unexpected or any(not k.endswith(("lm_head.weight",) + _IGNORED_SUFFIXES) for k in missing):
        raise RuntimeError(f"weight conversion mismatch: missing={missing}, unexpected={unexpected}")
    hf.tie_weights()
    return hf.to(model.device, model.dtype).eval()


def from_transformer_lens(tl_model_or_state_dict: Any) -> HookedGPT2:
    """A ``HookedGPT2`` from a TransformerLens ``HookedTransformer`` (loaded without processing) or its state dict."""
    sd = tl_model_or_state_dict
    if hasattr(sd, "state_dict"):
        sd = sd.state_dict()
    sd = {k: v.detach().cpu() for k, v in sd.items()}
    return from_state_dict(sd, infer_config(sd))
