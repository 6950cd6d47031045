"""The file layer: every file kind gpt2-interp writes and reads back goes through here.

Two formats, neither of which can run code when read: **safetensors** for tensors (with a JSON header)
and **JSON** for the rest. Each file carries a sha256 digest written with it and checked before its
content is used (:mod:`gpt2_interp.io.integrity`), so damage, truncation and hand edits are refused with
an error that names the file; non-finite tensors are refused where a file is written or read.

- :func:`write_json` / :func:`read_json`: a JSON object with a ``sha256`` field over the rest (circuits,
  experiment results); ``required`` fields missing from a file are named, a truncated file names its path
  and the place the text stops.
- :func:`save_tree` / :func:`load_tree`: any nesting of dicts (string or integer keys), lists, tuples,
  numbers, strings, ``None``, tensors, NumPy arrays and the library's result dataclasses, as one
  safetensors file whose header holds the structure (experiment caches, training checkpoints). Nothing is
  unpickled: a dataclass is rebuilt only when its class is a result type of the library or one the caller
  names in ``types``, never from a module path found in the file.

Nothing is unpickled (no ``torch.load`` outside its weights-only mode): a crafted file of any kind is read as data
or refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..core.boundary import boundary
from ..core.result import Result
from .integrity import DIGEST_KEY, IntegrityError, UnverifiedFileWarning, load_checked, save_checked

TREE_KEY = "tree"
_JSON_DOMAIN = "gpt2-interp-json-digest/1"


class FileFormatError(ValueError):
    """A file is readable but is not the kind expected: a field is missing, has the wrong type, or holds
    a value that cannot be right (the message names the file and the field)."""


# ---------------------------------------------------------------------------------------------- JSON
def json_digest(data: Mapping[str, Any]) -> str:
    """sha256 over the canonical JSON of ``data`` without its ``sha256`` field."""
    import hashlib

    body = {k: v for k, v in data.items() if k != DIGEST_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256((_JSON_DOMAIN + "\n" + text).encode()).hexdigest()


@boundary
def write_json(path: str | os.PathLike, data: Mapping[str, Any], indent: int | None = 1) -> Path:
    """Write the JSON object ``data`` to ``path`` with a ``sha256`` field over the rest, atomically (a
    temporary file renamed into place; parent folders created), ``indent`` as for :func:`json.dumps`.
    :func:`read_json` checks the digest."""
    path = Path(path)
    body = {k: v for k, v in data.items() if k != DIGEST_KEY}
    # round-trip first, so the digest is over exactly what a reader will parse (tuples become lists, …)
    body = json.loads(json.dumps(body))
    body[DIGEST_KEY] = json_digest(body)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(body, indent=indent) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


@boundary
def read_json(
    path: str | os.PathLike,
    kind: str,
    required: Iterable[str] = (),
    allow_unverified: bool = True,
    digest: bool = True,
) -> dict[str, Any]:
    """The JSON object in ``path`` (a ``kind`` file: "circuit", "result", …), its ``sha256`` field checked
    and removed. Refused, naming the file: a missing file (FileNotFoundError), text that is not JSON or is
    cut short (:class:`FileFormatError` with the line and column), a value that is not an object or lacks a
    ``required`` field (:class:`FileFormatError` naming the fields), a digest that does not match
    (:class:`~gpt2_interp.io.integrity.IntegrityError`). A file without a digest (written by hand or by
    another tool) is read with an :class:`~gpt2_interp.io.integrity.UnverifiedFileWarning`, or refused
    when ``allow_unverified`` is False. ``digest=False`` reads a format that carries no digest of its own
    (another tool's config, or one whose digest is kept in a companion file) without that warning."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no {kind} file at {path}" + (" (it is a directory)" if path.is_dir() else ""))
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        stripped = text.rstrip()
        cut = "; it looks truncated (it does not end where its first value closes)" if stripped[-1:] not in "}]" else ""
        raise FileFormatError(
            f"{path} is not a valid {kind} file: its JSON breaks at line {e.lineno}, column {e.colno} ({e.msg}){cut}"
        ) from None
    if not isinstance(data, dict):
        raise FileFormatError(f"{path} holds a JSON {type(data).__name__}, not the object a {kind} file holds")
    stored = data.pop(DIGEST_KEY, None) if digest else None
    if stored is None and not digest:
        pass
    elif stored is None:
        if not allow_unverified:
            raise IntegrityError(f"{path} has no integrity digest; re-create the {kind} file with gpt2-interp")
        warnings.warn(
            f"{path} has no integrity digest (a {kind} file written by hand or by another tool); read UNVERIFIED",
            UnverifiedFileWarning,
            stacklevel=2,
        )
    elif stored != json_digest(data):
        raise IntegrityError(
            f"{path} fails its integrity check: its content does not match the sha256 digest stored when it was "
            f"written; the {kind} file was modified or damaged after it was written. Re-create it."
        )
    missing = [k for k in required if k not in data]
    if missing:
        raise FileFormatError(f"{path} is not a {kind} file: it lacks the field(s) {', '.join(missing)}")
    return data


# ------------------------------------------------------------------------------------------ tensors
@boundary
def check_finite(tensors: Mapping[str, torch.Tensor], where: str | os.PathLike, kind: str) -> None:
    """Refuse (ValueError) a floating tensor among ``tensors`` (name → tensor) holding NaN or ±inf; the
    message names ``where`` (the file or object), the ``kind`` of file and the tensor."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise ValueError(
                f"{where}: the {kind}'s tensor {name!r} holds {bad} non-finite value(s) (NaN or inf); "
                "a trained or saved file never should"
            )


# --------------------------------------------------------------------------------------------- trees
def _result_types() -> dict[str, type]:
    """Every dataclass subclass of :class:`~gpt2_interp.core.result.Result` defined so far, by
    ``module:qualname`` (the classes a tree may rebuild without the caller naming them)."""
    found: dict[str, type] = {}
    todo = list(Result.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if dataclasses.is_dataclass(cls):
            found[_type_name(cls)] = cls
    return found


def _type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


class _Encoder:
    """Turns a value into JSON-able structure, collecting its tensors under their path in the value
    (``state/0/exp_avg``), so that a message about a tensor names where it sits."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}

    def tensor(self, t: torch.Tensor, tag: str, at: str) -> dict[str, Any]:
        name = at or "value"
        while name in self.tensors:
            name += "'"
        self.tensors[name] = t.detach().to("cpu").contiguous()
        return {tag: name}

    def __call__(self, x: Any, at: str = "") -> Any:
        def sub(key: Any) -> str:
            return f"{at}/{key}" if at else str(key)

        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, torch.Tensor):
            return self.tensor(x, "__tensor__", at)
        if isinstance(x, np.ndarray):
            return self.tensor(torch.from_numpy(np.ascontiguousarray(x)), "__ndarray__", at)
        if isinstance(x, np.generic):
            return x.item()
        if isinstance(x, torch.dtype):
            return {"__dtype__": str(x).removeprefix("torch.")}
        if isinstance(x, tuple):
            return {"__tuple__": [self(v, sub(i)) for i, v in enumerate(x)]}
        if isinstance(x, list):
            return [self(v, sub(i)) for i, v in enumerate(x)]
        if isinstance(x, dict):
            if all(isinstance(k, str) for k in x) and not any(k.startswith("__") for k in x):
                return {k: self(v, sub(k)) for k, v in x.items()}
            return {"__items__": [[self(k, sub("key")), self(v, sub(k))] for k, v in x.items()]}
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            fields = {f.name: self(getattr(x, f.name), sub(f.name)) for f in dataclasses.fields(x) if f.init}
            return {"__dataclass__": _type_name(type(x)), "fields": fields}
        raise TypeError(
            f"cannot save a {type(x).__name__} in a gpt2-interp file (saved: dicts, lists, tuples, numbers, strings, "
            "None, tensors, NumPy arrays and dataclasses)"
        )


class _Decoder:
    def __init__(self, tensors: Mapping[str, torch.Tensor], types: Mapping[str, type], where: Path, kind: str):
        self.tensors, self.types, self.where, self.kind = tensors, types, where, kind

    def bad(self, what: str) -> FileFormatError:
        return FileFormatError(f"{self.where} is not a valid {self.kind} file: {what}")

    def tensor(self, name: Any) -> torch.Tensor:
        if name not in self.tensors:
            raise self.bad(f"its structure names a tensor {name!r} that the file does not hold")
        return self.tensors[name]

    def __call__(self, x: Any) -> Any:
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        if isinstance(x, list):
            return [self(v) for v in x]
        if not isinstance(x, dict):
            raise self.bad(f"unexpected {type(x).__name__} in its structure")
        if "__tensor__" in x:
            return self.tensor(x["__tensor__"])
        if "__ndarray__" in x:
            return self.tensor(x["__ndarray__"]).numpy()
        if "__dtype__" in x:
            dtype = getattr(torch, str(x["__dtype__"]), None)
            if not isinstance(dtype, torch.dtype):
                raise self.bad(f"unknown dtype {x['__dtype__']!r}")
            return dtype
        if "__tuple__" in x:
            return tuple(self(v) for v in x["__tuple__"])
        if "__items__" in x:
            return {_hashable(self(k)): self(v) for k, v in x["__items__"]}
        if "__dataclass__" in x:
            cls = self.types.get(str(x["__dataclass__"]))
            if cls is None:
                raise self.bad(
                    f"it holds a {x['__dataclass__']!r} object, which is not a type this file kind may hold "
                    "(only the library's result types and those the reader names are rebuilt)"
                )
            return cls(**{k: self(v) for k, v in (x.get("fields") or {}).items()})
        return {k: self(v) for k, v in x.items()}


def _hashable(k: Any) -> Any:
    return tuple(_hashable(v) for v in k) if isinstance(k, (list, tuple)) else k


@boundary
def save_tree(path: str | os.PathLike, value: Any, kind: str, finite: bool = True) -> Path:
    """Write ``value`` (see the module's docstring for what it may hold) to ``path`` as one digest-checked
    safetensors file: its tensors as tensors, its structure as JSON in the header; ``kind`` names the file
    kind in the header and in messages. With ``finite``, a non-finite tensor
    is refused (ValueError naming it). :func:`load_tree` reads it back."""
    enc = _Encoder()
    tree = enc(value)
    if finite:
        check_finite(enc.tensors, path, kind)
    return save_checked(path, enc.tensors, {"format": f"gpt2-interp {kind}", TREE_KEY: json.dumps(tree)})


@boundary
def load_tree(
    path: str | os.PathLike,
    kind: str,
    types: Iterable[type] = (),
    finite: bool = True,
    map_location: str | torch.device | None = None,
) -> Any:
    """The value :func:`save_tree` wrote to ``path``, its digest checked first (a file without one is
    refused); ``kind`` names the file kind in messages. Dataclasses are rebuilt only for the library's
    result types and ``types``; anything else is refused (:class:`FileFormatError`), as are non-finite
    tensors with ``finite``. Tensors are moved to ``map_location`` when given."""
    path = Path(path)
    tensors, meta, _ = load_checked(path, kind=kind, allow_unverified=False)
    if TREE_KEY not in meta:
        raise FileFormatError(f"{path} is not a valid {kind} file: its header has no {TREE_KEY!r} field")
    if finite:
        check_finite(tensors, path, kind)
    if map_location is not None:
        tensors = {k: t.to(map_location) for k, t in tensors.items()}
    allowed = _result_types() | {_type_name(t): t for t in types}
    try:
        tree = json.loads(meta[TREE_KEY])
    except json.JSONDecodeError as e:
        raise FileFormatError(f"{path} is not a valid {kind} file: its structure is not JSON ({e.msg})") from None
    return _Decoder(tensors, allowed, path, kind)(tree)


__all__ = [
    "FileFormatError",
    "IntegrityError",
    "UnverifiedFileWarning",
    "check_finite",
    "json_digest",
    "load_tree",
    "read_json",
    "save_tree",
    "write_json",
]
