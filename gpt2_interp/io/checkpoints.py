"""Checkpoint files as plain tensors: reading state dicts (whole, or one tensor at a time from a
directory's single or sharded weights), telling their naming apart, finding snapshots in the Hugging
Face cache and the embedded models. Nothing here builds a model (that is
``gpt2_interp.model.loading``: this layer must not import the model).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from ..core.boundary import boundary
from ..core.finite import is_finite, nonfinite_summary

EMBEDDED = {"gpt2-facts"}
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")  # buffers of old HF checkpoints
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# the index of a sharded checkpoint (transformers' save_pretrained with max_shard_size): its weight_map
# names the shard file of every tensor
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
# bytes of one block when a 2-D tensor is read straight into its transposed layout
BLOCK_BYTES = 8 * 2**20


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
    """``(config.json as a dict, state dict)`` of a Hugging Face model directory (single-file or sharded
    weights, see :func:`hf_weight_files`)."""
    path = Path(path)
    config_path = path / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{path} has no config.json; a model directory needs config.json and model.safetensors")
    hf = read_config_json(config_path)
    return hf, dict(DirWeights(hf_weight_files(path)).items())


@boundary
def hf_weight_files(path: Path) -> dict[str, Path]:
    """Tensor name → the file holding it, for the weights of the model directory ``path``: a single
    ``model.safetensors``/``pytorch_model.bin``, or the shards a ``model.safetensors.index.json`` (or
    ``pytorch_model.bin.index.json``) names in its ``weight_map``. Only file headers are read.

    Raises a one-line error naming the file for a damaged index (ValueError), an index naming a shard
    that is not in the directory (FileNotFoundError), a shard lacking a tensor the index puts in it or
    a damaged shard (ValueError), and a directory without weights (FileNotFoundError)."""
    path = Path(path)
    for name in INDEX_FILES:
        if (path / name).exists():
            return _indexed_files(path / name)
    for weights in WEIGHT_FILES:
        if (path / weights).exists():
            return dict.fromkeys(tensor_names(path / weights), path / weights)
    raise FileNotFoundError(
        f"{path} has a config.json but no weights: expected model.safetensors, pytorch_model.bin or "
        f"{INDEX_FILES[0]} with its shards"
    )


def _indexed_files(index: Path) -> dict[str, Path]:
    try:
        data = json.loads(index.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{index} is not valid JSON ({e}); an index holds a weight_map of tensor → shard") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{index} has no weight_map object of tensor name → shard file name")
    files: dict[str, Path] = {}
    for shard in dict.fromkeys(weight_map.values()):
        if Path(shard).name != shard or shard in ("", ".", ".."):
            raise ValueError(f"{index} names the shard {shard!r}, which is not a file name in its directory")
        if not (index.parent / shard).is_file():
            raise FileNotFoundError(f"{index} names the shard {shard}, which is not in {index.parent}")
        held = set(tensor_names(index.parent / shard))
        lacking = [name for name, s in weight_map.items() if s == shard and name not in held]
        if lacking:
            raise ValueError(
                f"{index.parent / shard} lacks the tensor{'s' * (len(lacking) > 1)} "
                f"{', '.join(lacking[:3])}{' …' if len(lacking) > 3 else ''} that {index.name} puts in it"
            )
    # shard by shard, each shard's tensors in the index's order
    for shard in dict.fromkeys(weight_map.values()):
        files.update({name: index.parent / shard for name, s in weight_map.items() if s == shard})
    return files


def _damaged(path: Path, e: Exception) -> ValueError:
    return ValueError(
        f"{path} is damaged or not a safetensors checkpoint ({type(e).__name__}: "
        f"{str(e).splitlines()[0] if str(e) else 'no details'})"
    )


def _open_safetensors(path: Path) -> tuple[Any, bool]:
    """A lazy reader of a safetensors file, and whether its tensors are memory-mapped: they are read with
    ``pread`` into memory of their own (no file pages stay mapped) where the installed safetensors
    offers it."""
    try:
        try:
            return safe_open(str(path), framework="pt", backend="pread"), False
        except TypeError:  # safetensors before the backend argument: memory-mapped
            return safe_open(str(path), framework="pt"), True
    except Exception as e:  # SafetensorError, OSError, …
        raise _damaged(path, e) from None


@boundary
def tensor_names(path: Path) -> list[str]:
    """The names of the tensors in a weights file (a ``.safetensors`` file's header only)."""
    path = Path(path)
    if path.suffix == ".safetensors":
        return list(_open_safetensors(path)[0].keys())
    return list(read_weights(path))


def _finite(t: torch.Tensor) -> bool:
    """:func:`~gpt2_interp.core.finite.is_finite` block by block, so that checking a half-precision tensor
    never holds a float32 copy of more than one block (``BLOCK_BYTES``)."""
    flat = t.reshape(-1)
    step = BLOCK_BYTES // 4
    return all(is_finite(flat[i : i + step]) for i in range(0, flat.numel(), step))


class DirWeights(Mapping[str, torch.Tensor]):
    """The tensors of a model directory's weight files (``files``: tensor name → file, as
    :func:`hf_weight_files` gives), read one at a time when asked for, never kept: iterating reads the
    files shard by shard, each tensor block by block (``BLOCK_BYTES``, with ``pread``) into memory of its
    own in ``dtype`` (None: as stored) on ``device`` (None: CPU), so that holding every tensor costs one
    copy of the weights in ``dtype`` plus one block. ``transposed(name)``: read that 2-D tensor ``[rows,
    cols]`` block by block straight into a ``[cols, rows]`` contiguous tensor and return its transposed
    view (same shape and values; its ``.T`` is contiguous, with no second copy).

    A tensor holding NaN or inf (in the file, or after the conversion to ``dtype``) raises a ValueError
    naming it and its file. ``shapes()`` gives every shape from the file headers without reading a weight."""

    def __init__(
        self,
        files: Mapping[str, Path],
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        transposed: Callable[[str], bool] | None = None,
    ) -> None:
        self.files = dict(files)
        self.dtype, self.device = dtype, torch.device(device or "cpu")
        self.transposed = transposed or (lambda name: False)
        self._handle: tuple[Path, Any, bool] | None = None

    def __iter__(self) -> Iterator[str]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)

    def __contains__(self, name: object) -> bool:
        return name in self.files

    def _reader(self, path: Path) -> Any:
        if self._handle is None or self._handle[0] != path:
            self._handle = None  # one file open at a time
            if path.suffix == ".safetensors":
                self._handle = (path, *_open_safetensors(path))
            else:
                try:
                    sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
                except Exception:  # an old (non-zip) .bin cannot be memory-mapped
                    sd = read_weights(path)
                self._handle = (path, sd, True)
        return self._handle[1]

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor's shape, from the file headers (``.safetensors``) without reading a weight."""
        out = {}
        for name, path in self.files.items():
            reader = self._reader(path)
            if isinstance(reader, Mapping):
                out[name] = tuple(reader[name].shape)
            else:
                out[name] = tuple(reader.get_slice(name).get_shape())
        return out

    def __getitem__(self, name: str) -> torch.Tensor:
        path = self.files[name]
        reader = self._reader(path)
        try:
            if isinstance(reader, Mapping):
                return self._converted(reader[name], name, path, copy=True)
            sl = reader.get_slice(name)
            shape = sl.get_shape()
            if len(shape) == 2 and self.transposed(name):
                return self._read_transposed(sl, name, path, shape)
            if len(shape) >= 1 and shape[0] > 1:
                return self._read_rows(sl, name, path, shape)
            return self._converted(reader.get_tensor(name), name, path, copy=bool(self._handle and self._handle[2]))
        except ValueError:
            raise
        except Exception as e:  # SafetensorError on a truncated file, …
            raise _damaged(path, e) from None

    def _converted(self, t: torch.Tensor, name: str, path: Path, copy: bool) -> torch.Tensor:
        out = t.to(self.device, self.dtype or t.dtype, copy=copy)
        if not _finite(out):
            self._refuse(t, out, name, path)
        return out

    def _read_rows(self, sl: Any, name: str, path: Path, shape: list[int]) -> torch.Tensor:
        """The tensor read block by block into its own memory (no second copy of it is ever held)."""
        dtype = self.dtype or sl[0:1].dtype
        dest = torch.empty(shape, dtype=dtype, device=self.device)
        row = max(1, dest[0].numel() * dest.element_size())
        step = max(1, BLOCK_BYTES // row)
        for r in range(0, shape[0], step):
            part = sl[r : min(r + step, shape[0])].to(self.device, dtype)
            if not _finite(part):
                whole = sl[:]
                self._refuse(whole, whole.to(dtype), name, path)
            dest[r : r + part.shape[0]].copy_(part)
        return dest

    def _read_transposed(self, sl: Any, name: str, path: Path, shape: list[int]) -> torch.Tensor:
        rows, cols = shape
        dtype = self.dtype or sl[0:1].dtype
        dest = torch.empty(cols, rows, dtype=dtype, device=self.device)
        step = max(1, BLOCK_BYTES // max(1, cols * dest.element_size()))
        for r in range(0, rows, step):
            part = sl[r : min(r + step, rows)].to(self.device, dtype)
            if not _finite(part):
                whole = sl[:]
                self._refuse(whole, whole.to(dtype), name, path)
            dest[:, r : r + part.shape[0]].copy_(part.T)
        return dest.T

    def _refuse(self, stored: torch.Tensor, converted: torch.Tensor, name: str, path: Path) -> None:
        where = f"{path}: tensor {name!r}"
        if is_finite(stored):
            raise ValueError(
                f"{where} overflows {converted.dtype} ({nonfinite_summary(converted)} after converting from "
                f"{stored.dtype}); load it in a wider dtype"
            )
        raise ValueError(
            f"{where} holds non-finite values ({nonfinite_summary(stored)}); "
            "refusing to load a model with NaN/inf weights"
        )


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
