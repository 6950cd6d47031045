"""Reading GGUF files (llama.cpp's format): metadata, and tensors dequantized to float32.

The header is parsed here (a few dozen lines: the layout is fixed by the GGUF spec, and reading only
what we need is ~100× faster than ``gguf.GGUFReader``, which builds a numpy view per array element);
dequantization is the ``gguf`` package's. Nothing here knows what the tensors mean: turning them
into a model (and undoing llama.cpp's Q/K row order, :func:`unpermute_rotary`) is the model layer's job.

Layout (GGUF v2/v3, little-endian): ``"GGUF"``, version u32, tensor count u64, metadata count u64;
metadata ``(key, type u32, value)``; tensor infos ``(name, n_dims u32, dims u64…, type u32, offset u64)``
with ``dims`` innermost first; then, aligned to ``general.alignment`` (32), the tensor data.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

from ..core.boundary import boundary
from .tokenizer import bytes_to_unicode

GGUF_MAGIC = b"GGUF"
# GGML types we dequantize (tested); the gguf package knows more, but we accept only these.
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_NUMPY = {
    0: np.uint8,
    1: np.int8,
    2: np.uint16,
    3: np.int16,
    4: np.uint32,
    5: np.int32,
    6: np.float32,
    7: np.bool_,
    10: np.uint64,
    11: np.int64,
    12: np.float64,
}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """A GGUF file we cannot read (truncated, not GGUF, or a tensor type we do not dequantize)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # torch order (outermost first): a linear weight is [out, in]
    type_name: str  # GGML type, e.g. "Q4_1"
    type_id: int
    offset: int  # absolute, in the file
    nbytes: int


@boundary
@dataclass
class GGUFFile:
    """A parsed GGUF (made by :func:`read_gguf`): the file's ``path``, its format ``version``,
    ``metadata`` (key → Python value; arrays as lists) and ``tensors`` (name → where and how it is stored).
    :meth:`tensor` reads and dequantizes one tensor to float32."""

    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo] = field(default_factory=dict)

    @property
    def architecture(self) -> str:
        """The ``general.architecture`` metadata (``"llama"``, ``"gpt2"``, …; ``"?"`` when absent)."""
        return str(self.metadata.get("general.architecture", "?"))

    def tensor(self, name: str) -> np.ndarray:
        """Tensor ``name`` as float32 numpy, in torch order (a linear weight is ``[out, in]``); the types
        of ``SUPPORTED_TYPES`` (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) are read. A name the file lacks raises
        :class:`GGUFError`."""
        import gguf.quants

        info = self.tensors.get(name)
        if info is None:
            raise GGUFError(f"{self.path}: lacks the tensor {name!r}")
        with open(self.path, "rb") as f:
            f.seek(info.offset)
            raw = np.frombuffer(f.read(info.nbytes), dtype=np.uint8)
        if info.type_name == "F32":
            out = raw.view(np.float32)
        elif info.type_name == "F16":
            out = raw.view(np.float16).astype(np.float32)
        else:
            qtype = gguf.GGMLQuantizationType[info.type_name]
            out = gguf.quants.dequantize(raw.reshape(-1, info.nbytes // max(1, prod(info.shape[:-1]))), qtype)
        return np.require(out.reshape(info.shape), np.float32, ["C_CONTIGUOUS", "WRITEABLE"])

    def check_types(self) -> None:
        """Raise :class:`GGUFError` naming every tensor type we do not dequantize (before reading any)."""
        bad = sorted({t.type_name for t in self.tensors.values() if t.type_name not in SUPPORTED_TYPES})
        if bad:
            names = [t.name for t in self.tensors.values() if t.type_name in bad][:3]
            raise GGUFError(
                f"{self.path.name} holds tensors of GGML type {', '.join(bad)} (e.g. {', '.join(names)}); "
                f"gpt2-interp dequantizes {', '.join(SUPPORTED_TYPES)}. Re-quantize the model to one of these "
                "(e.g. llama.cpp's llama-quantize … Q8_0)."
            )


class _Cursor:
    def __init__(self, buf: bytes, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            raise GGUFError(
                f"{self.path} is truncated: its header ends at byte {len(self.buf)} but needs {self.pos + n}"
            )
        b = self.buf[self.pos : self.pos + n]
        self.pos += n
        return b

    def scalar(self, t: int) -> Any:
        fmt = _SCALAR[t]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.scalar(10)).decode("utf-8", errors="replace")

    def value(self, t: int) -> Any:
        if t == _STRING:
            return self.string()
        if t == _ARRAY:
            et, n = self.scalar(4), self.scalar(10)
            if et == _STRING:
                return [self.string() for _ in range(n)]
            if et in _NUMPY:
                dt = np.dtype(_NUMPY[et])
                return np.frombuffer(self.take(n * dt.itemsize), dtype=dt).tolist()
            return [self.value(et) for _ in range(n)]
        if t not in _SCALAR:
            raise GGUFError(f"{self.path}: unknown GGUF metadata type {t} (corrupt file?)")
        return self.scalar(t)


@boundary
def read_gguf(path: str | Path) -> GGUFFile:
    """Parse a GGUF file's metadata and tensor table (no tensor data is read)."""
    import gguf

    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(min(size, 64 << 20))  # the header: metadata (vocabularies) and tensor infos
    cur = _Cursor(head, path)
    if cur.take(4) != GGUF_MAGIC:
        raise GGUFError(f"{path} is not a GGUF file (it does not start with b'GGUF')")
    version = cur.scalar(4)
    if version not in (2, 3):
        raise GGUFError(f"{path} is GGUF version {version}; supported: 2, 3")
    n_tensors, n_kv = cur.scalar(10), cur.scalar(10)
    metadata = {}
    for _ in range(n_kv):
        key = cur.string()
        metadata[key] = cur.value(cur.scalar(4))
    infos = []
    for _ in range(n_tensors):
        name = cur.string()
        dims = [cur.scalar(10) for _ in range(cur.scalar(4))]
        type_id, offset = cur.scalar(4), cur.scalar(10)
        infos.append((name, tuple(reversed(dims)), type_id, offset))
    align = int(metadata.get("general.alignment", 32))
    data_start = (cur.pos + align - 1) // align * align
    out = GGUFFile(path, version, metadata)
    for name, shape, type_id, offset in infos:
        try:
            qtype = gguf.GGMLQuantizationType(type_id)
        except ValueError:
            raise GGUFError(f"{path}: tensor {name} has unknown GGML type id {type_id}") from None
        block, type_size = gguf.GGML_QUANT_SIZES[qtype]
        nbytes = prod(shape) // block * type_size
        start = data_start + offset
        if start + nbytes > size:
            raise GGUFError(
                f"{path} is truncated: tensor {name} needs bytes up to {start + nbytes:,} but the file has {size:,}"
            )
        out.tensors[name] = TensorInfo(name, shape, qtype.name, type_id, start, nbytes)
    return out


def unpermute_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order. Its converter reorders each head's rows of ``W_q``/``W_k``
    ``[n_head·d_head, d_in]`` from the half-split rotary layout (transformers: pairs ``(i, i + d/2)``)
    to interleaved pairs ``(2i, 2i+1)``; this puts them back."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# Pre-tokenizer names (``tokenizer.ggml.pre``) whose split is GPT-2's regex, as llama.cpp and
# transformers treat them; files naming another split are refused rather than tokenized wrongly.
GPT2_SPLIT_PRE = ("default", "gpt-2", "gpt2", "smollm")


def gguf_tokenizer(g: GGUFFile):
    """The byte-level BPE tokenizer a GGUF file embeds (``tokenizer.ggml.*``), as an
    :class:`~gpt2_interp.io.tokenizer.HFTokenizer` built with the ``tokenizers`` library: the file's
    vocabulary and merges, GPT-2's byte-level pre-tokenizer, its control tokens as special tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from .tokenizer import HFTokenizer

    md = g.metadata
    if "tokenizer.ggml.tokens" not in md:
        raise GGUFError(
            f"{g.path.name} has no tokenizer (no tokenizer.ggml.tokens in its metadata); "
            "gpt2-interp needs the vocabulary embedded in the GGUF file"
        )
    kind = md.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(
            f"{g.path.name} has a {kind!r} tokenizer; gpt2-interp reads byte-level BPE ('gpt2') "
            "tokenizers from GGUF files"
        )
    pre = md.get("tokenizer.ggml.pre", "default")
    if pre not in GPT2_SPLIT_PRE:
        raise GGUFError(f"{g.path.name} asks for the {pre!r} pre-tokenizer; supported: {', '.join(GPT2_SPLIT_PRE)}")
    tokens: list[str] = md["tokenizer.ggml.tokens"]
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    byte_char = bytes_to_unicode()
    spelled = [t if set(t) <= alphabet else "".join(byte_char[b] for b in t.encode()) for t in tokens]
    vocab = {t: i for i, t in enumerate(spelled)}
    merges = [tuple(m.split(" ", 1)) for m in md.get("tokenizer.ggml.merges", [])]
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    types = md.get("tokenizer.ggml.token_type") or []
    control = [t for t, ty in zip(tokens, types) if ty == 3 and set(t) <= alphabet]  # 3: CONTROL
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    eos = md.get("tokenizer.ggml.eos_token_id")
    if eos is None:
        raise GGUFError(f"{g.path.name}'s tokenizer names no eos token (tokenizer.ggml.eos_token_id)")
    # The start-of-text token that model.to_tokens prepends: the file's BOS when it asks for one; else, like
    # GPT-2, the document separator <|endoftext|> when the vocabulary has it (SmolLM2 sets add_bos_token
    # false, and its "BOS" <|im_start|> opens a chat turn, not a document); else none.
    if md.get("tokenizer.ggml.add_bos_token", False):
        bos = md.get("tokenizer.ggml.bos_token_id")
    else:
        bos = tokens.index("<|endoftext|>") if "<|endoftext|>" in control else None
    name = str(md.get("general.basename") or md.get("general.name") or g.path.stem)
    return HFTokenizer(backend, name, bos_id=bos, eos_id=int(eos), pad_id=md.get("tokenizer.ggml.padding_token_id"))
