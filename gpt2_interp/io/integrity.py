"""Integrity-checked files: a safetensors file whose header carries a sha256 digest of its content.

The digest covers every header field (except the digest itself) and every tensor (name, dtype,
shape, raw bytes), so flipped bytes, an edited header (e.g. a layer number) and truncation are
all refused at load, with an error naming the file. Used by edit files and key-statistics
caches; any other file we save (tuned lenses, …) should use :func:`save_checked`/:func:`load_checked`.

Files written before digests existed (no ``sha256`` field) are loaded with an
:class:`UnverifiedFileWarning` (``allow_unverified=True``, the default) or refused.
The digest detects accidental damage and naive edits; it is not a signature (whoever can
write the file can recompute it).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch

from ..core.boundary import boundary

DIGEST_KEY = "sha256"
_DOMAIN = b"gpt2-interp-file-digest/1\n"


class IntegrityError(ValueError):
    """A saved file is damaged, truncated, or was modified after it was written."""


class UnverifiedFileWarning(UserWarning):
    """A file without an integrity digest (written by an older version) was loaded unverified."""


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The raw bytes of a tensor (CPU, contiguous), for hashing."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data


def content_digest(tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> str:
    """sha256 over the header fields (sorted, ``sha256`` itself excluded) and the tensors (sorted
    by name; name, dtype, shape and raw bytes of each)."""
    h = hashlib.sha256(_DOMAIN)
    for key in sorted(metadata):
        if key != DIGEST_KEY:
            h.update(json.dumps([key, metadata[key]]).encode() + b"\n")
    for name in sorted(tensors):
        t = tensors[name]
        h.update(json.dumps([name, str(t.dtype), list(t.shape)]).encode() + b"\n")
        h.update(tensor_bytes(t))
    return h.hexdigest()


@boundary
def save_checked(path: str | os.PathLike, tensors: Mapping[str, torch.Tensor], metadata: Mapping[str, str]) -> Path:
    """Write ``tensors`` (moved to CPU) + string ``metadata`` as one safetensors file at ``path`` with a
    ``sha256`` digest field over both (a ``sha256`` key in ``metadata`` is replaced). Written to a
    temporary file first and renamed, so a crash never leaves a half-written file; parent directories
    are created. Returns the path; :func:`load_checked` reads and verifies it."""
    from safetensors.torch import save_file

    path = Path(path)
    tensors = {k: t.detach().to("cpu").contiguous() for k, t in tensors.items()}
    meta = {str(k): str(v) for k, v in metadata.items() if k != DIGEST_KEY}
    meta[DIGEST_KEY] = content_digest(tensors, meta)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)
    return path


@boundary
def load_checked(
    path: str | os.PathLike, kind: str = "gpt2-interp", allow_unverified: bool = True
) -> tuple[dict[str, torch.Tensor], dict[str, str], bool]:
    """Read a file written by :func:`save_checked`: ``(tensors, metadata, verified)``.

    Raises :class:`IntegrityError` (naming ``path`` and ``kind``, e.g. "edit") when safetensors
    cannot parse the file (truncated, not safetensors) or the content does not match its digest.
    A file without a digest is returned with ``verified=False`` and an
    :class:`UnverifiedFileWarning`, or refused when ``allow_unverified`` is False.
    """
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no {kind} file at {path}" + (" (it is a directory)" if path.is_dir() else ""))
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = dict(f.metadata() or {})
            tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safetensors safe_open handles have keys() but are not iterable)
    except Exception as e:  # safetensors raises its own error types (SafetensorError, OSError, …)
        raise IntegrityError(
            f"{path} is damaged or not {_a(kind)} {kind} file: safetensors could not read it "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else 'no details'})"
        ) from None
    stored = metadata.pop(DIGEST_KEY, None)
    if stored is None:
        msg = (
            f"{path} has no integrity digest ({_a(kind)} {kind} file written before gpt2-interp checked file "
            "integrity, "
            "or one whose digest was removed)"
        )
        if not allow_unverified:
            raise IntegrityError(msg + "; re-create it with this version")
        warnings.warn(
            msg + "; it is loaded UNVERIFIED. Save it again to add a digest.", UnverifiedFileWarning, stacklevel=3
        )
        return tensors, metadata, False
    actual = content_digest(tensors, metadata)
    if actual != stored:
        raise IntegrityError(
            f"{path} fails its integrity check: its content (tensors and header) does not match the sha256 digest "
            f"stored when it was saved ({stored[:12]}… vs {actual[:12]}…); the {kind} file was modified or damaged "
            "after it was written. Re-create it (or restore it from a copy)."
        )
    return tensors, metadata, True


def _a(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"
