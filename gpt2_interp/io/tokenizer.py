"""Offline GPT-2 BPE tokenizer built with tiktoken from the shipped ``gpt2.tiktoken``.

The file is r50k_base (OpenAI's GPT-2 vocabulary), taken from the MIT-licensed
``openai-whisper`` sdist; its sha256 is checked at load so a corrupted copy can
never silently produce wrong token ids.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import os
import warnings
from collections.abc import Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import tiktoken
import torch

from ..core.boundary import boundary
from ..core.porting import PortingWarning

BPE_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
EOT_ID = 50256  # <|endoftext|>: GPT-2's BOS, EOS and pad token
EOT = "<|endoftext|>"
# tiktoken's r50k_base pattern (the GPT-2 pre-tokenizer regex).
_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@lru_cache(maxsize=1)
def gpt2_encoding() -> tiktoken.Encoding:
    """The GPT-2 BPE as a ``tiktoken.Encoding`` (50,257 tokens), built offline."""
    raw = resources.files("gpt2_interp.io").joinpath("data/gpt2.tiktoken").read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != BPE_SHA256:
        raise RuntimeError(f"gpt2.tiktoken has sha256 {digest}, expected {BPE_SHA256}; reinstall gpt2-interp.")
    ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in raw.splitlines() if line)}
    return tiktoken.Encoding(
        name="gpt2_interp_r50k",
        pat_str=_PAT,
        mergeable_ranks=ranks,
        special_tokens={EOT: EOT_ID},
        explicit_n_vocab=50257,
    )


class Encoding(dict):
    """What calling a tokenizer returns (Hugging Face's ``BatchEncoding`` in small): a dict of
    ``input_ids`` and ``attention_mask`` that also reads as attributes (``enc.input_ids``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to(self, device: Any) -> Encoding:
        """The tensors moved to ``device`` (after ``return_tensors="pt"``)."""
        return Encoding({k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.items()})


class Tokenizer:
    """What the model needs from a tokenizer: ids ⇄ text, the bytes and character spans of each
    token (to find a subject's tokens), and the special ids. One implementation per family
    (GPT-2's tiktoken BPE here; a ``tokenizers`` BPE for GGUF/Llama models) provides
    ``encode_ids``/``decode_ids``/``token_str``/``char_spans``/``id_to_token``/``token_to_id``.

    ``bos_id`` is prepended by ``model.to_tokens(prepend_bos=True)`` (None: nothing is), ``pad_id``
    fills padding (always masked out), ``eos_id`` stops generation.

    It is also the tokenizer object TransformerLens users reach for as ``model.tokenizer`` (Hugging
    Face's interface): ``tokenizer(text_or_texts, padding=True, return_tensors="pt")``, ``encode``
    (text spelling a special token, e.g. ``<|endoftext|>``, becomes that token), ``decode``, ``batch_decode``,
    ``convert_ids_to_tokens`` (the vocabulary's spelling, e.g. ``"Ġfox"``), ``bos_token_id``,
    ``eos_token_id``, ``pad_token_id``, ``padding_side`` (``"right"`` as in Hugging Face until set),
    ``vocab_size`` and ``len()``.

    BOS: ``encode``/``tokenizer(...)`` add none (Hugging Face's GPT-2 tokenizer; TransformerLens
    under transformers 4) unless ``add_bos_token = True`` (TransformerLens 3.9 reloads its tokenizer
    with ``add_bos_token=True``, so under transformers ≥ 5 its ``encode`` and call prepend BOS). While
    ``add_bos_token`` was never set, a call that would differ gets a ``PortingWarning``; setting it
    (either way) or passing ``add_special_tokens=False`` is the explicit choice. ``encode_ids`` (the
    package's own calls) never adds BOS and never warns; ``model.to_tokens`` is where BOS is added.
    """

    name: str
    vocab_size: int
    bos_id: int | None
    eos_id: int
    pad_id: int

    # ------------------------------------------------------------------ one implementation per family
    def encode_ids(self, text: str) -> list[int]:
        """Token ids of ``text``, without BOS and without a warning (the package's own calls); text
        spelling a special token (e.g. ``<|endoftext|>``) becomes that token."""
        raise NotImplementedError

    def decode_ids(self, ids: list[int]) -> str:
        """The text of a list of token ids, special tokens included, exactly as their bytes spell it
        (invalid UTF-8 becomes U+FFFD)."""
        raise NotImplementedError

    def token_str(self, token_id: int) -> str:
        """The text of one token (``" fox"``; a token holding part of a multi-byte character decodes
        to U+FFFD), as opposed to the vocabulary spelling of :meth:`id_to_token`."""
        raise NotImplementedError

    def char_spans(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """``(ids, spans)``: the tokens of ``text`` and each one's ``(start, end)`` character span
        (a token that covers part of a multi-byte character spans all of that character)."""
        raise NotImplementedError

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary's own spelling of a token (GPT-2's byte-level BPE: ``"Ġfox"`` for " fox")."""
        raise NotImplementedError

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary spelling (:meth:`id_to_token`'s inverse); None if it is not one."""
        raise NotImplementedError

    # ------------------------------------------------------------------ ids ⇄ text (ours and Hugging Face's)
    def encode(
        self, text: str, add_special_tokens: bool = True, return_tensors: str | None = None, **kwargs: Any
    ) -> Any:
        """Token ids of ``text`` (a list; a ``[1, n]`` long tensor with ``return_tensors="pt"``, the only
        tensor kind accepted: any other value raises ValueError). BOS comes first only with
        ``add_bos_token`` set and ``add_special_tokens`` true (see the class docstring). A batch
        (non-string ``text``) raises TypeError: call the tokenizer for one."""
        if not isinstance(text, str):
            raise TypeError(f"encode takes one string, got {type(text).__name__}; call the tokenizer for a batch")
        ids = self._bos(add_special_tokens, "encode") + self.encode_ids(text)
        return _tensor(ids, return_tensors) if return_tensors else ids

    def decode(
        self,
        token_ids: Any,
        skip_special_tokens: bool = False,
        clean_up_tokenization_spaces: bool = False,
        **kwargs: Any,
    ) -> str:
        """The text of ``token_ids`` (an int, a list or a 0-d/1-d tensor), exactly as their bytes spell it;
        ``skip_special_tokens`` drops BOS/EOS/pad ids first (default False).
        ``clean_up_tokenization_spaces`` is ignored, as transformers ignores it for BPE tokenizers.
        A batch (nested lists, a 2-d tensor) raises ValueError: use :meth:`batch_decode`."""
        ids = _ids(token_ids)
        ids = [ids] if isinstance(ids, int) else ids
        if ids and isinstance(ids[0], list):
            raise ValueError("decode takes one sequence; use batch_decode for a batch")
        if skip_special_tokens:
            special = self.special_ids
            ids = [i for i in ids if i not in special]
        return self.decode_ids(ids)

    def batch_decode(self, sequences: Any, **kwargs: Any) -> list[str]:
        """:meth:`decode` of each row of ``[batch, pos]`` ids (a tensor or a list of lists)."""
        return [self.decode(row, **kwargs) for row in _ids(sequences)]

    def __call__(
        self,
        text: str | Sequence[str],
        padding: bool | str = False,
        truncation: bool = False,
        max_length: int | None = None,
        return_tensors: str | None = None,
        add_special_tokens: bool = True,
        return_attention_mask: bool = True,
        **kwargs: Any,
    ) -> Encoding:
        """Hugging Face's call: ``{"input_ids", "attention_mask"}`` for a string (lists) or a list of
        strings (lists of lists); ``padding=True``/``"longest"`` pads to the longest row,
        ``"max_length"`` to ``max_length``, on :attr:`padding_side` with ``pad_token_id``;
        ``truncation`` cuts rows to ``max_length``; ``return_tensors="pt"`` gives tensors."""
        single = isinstance(text, str)
        texts: list[str] = [text] if isinstance(text, str) else list(text)
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("the tokenizer takes a string or a list of strings")
        bos = self._bos(add_special_tokens, "tokenizer(...)")
        rows = [bos + self.encode_ids(t) for t in texts]
        if truncation and max_length is not None:
            rows = [r[:max_length] for r in rows]
        masks = [[1] * len(r) for r in rows]
        if padding not in (False, "do_not_pad"):
            if padding not in (True, "longest", "max_length"):
                raise ValueError(f"padding must be True, False, 'longest' or 'max_length', got {padding!r}")
            width = max(map(len, rows))
            if padding == "max_length":
                if max_length is None:
                    raise ValueError("padding='max_length' needs max_length")
                width = max_length
            for i, r in enumerate(rows):
                fill = width - len(r)
                if self.padding_side == "left":
                    rows[i], masks[i] = [self.pad_id] * fill + r, [0] * fill + masks[i]
                else:
                    rows[i], masks[i] = r + [self.pad_id] * fill, masks[i] + [0] * fill
        out: dict[str, Any] = {"input_ids": rows}
        if return_attention_mask:
            out["attention_mask"] = masks
        if return_tensors:  # [batch, pos] ([1, pos] for one string)
            if len({len(r) for r in rows}) > 1:
                raise ValueError("rows of different lengths do not make one tensor; pass padding=True")
            out = {k: _tensor(v, return_tensors) for k, v in out.items()}
        elif single:
            out = {k: v[0] for k, v in out.items()}
        return Encoding(out)

    def convert_ids_to_tokens(self, ids: Any, skip_special_tokens: bool = False) -> str | list[str]:
        """The vocabulary spelling of an id (a string) or of each id (a list)."""
        ids = _ids(ids)
        if isinstance(ids, int):
            return self.id_to_token(ids)
        special = self.special_ids if skip_special_tokens else set()
        return [self.id_to_token(i) for i in ids if i not in special]

    def convert_tokens_to_ids(self, tokens: str | Sequence[str]) -> int | list[int | None] | None:
        """:meth:`convert_ids_to_tokens`'s inverse."""
        if isinstance(tokens, str):
            return self.token_to_id(tokens)
        return [self.token_to_id(t) for t in tokens]

    def _bos(self, add_special_tokens: bool, what: str) -> list[int]:
        """``[bos_id]`` when this call adds BOS; warns where TransformerLens 3.9 would add it and we do not."""
        if not add_special_tokens or self.bos_id is None:
            return []
        chosen = self.__dict__.get("_add_bos_token")
        if chosen is None:
            warnings.warn(
                f"tokenizer {what} adds no BOS (Hugging Face's GPT-2 tokenizer), but TransformerLens 3.9 reloads "
                "model.tokenizer with add_bos_token=True, so under transformers >= 5 its encode/call prepend "
                f"{self.id_to_token(self.bos_id)!r}. Set tokenizer.add_bos_token = False (ours) or True "
                "(TransformerLens 3.9's) to silence this; model.to_tokens adds BOS either way.",
                PortingWarning,
                stacklevel=3,
            )
        return [self.bos_id] if chosen else []

    @property
    def add_bos_token(self) -> bool:
        """Whether ``encode``/``tokenizer(...)`` prepend BOS (False until set; see the class docstring)."""
        return bool(self.__dict__.get("_add_bos_token"))

    @add_bos_token.setter
    def add_bos_token(self, value: bool) -> None:
        self.__dict__["_add_bos_token"] = bool(value)

    # ------------------------------------------------------------------ Hugging Face's names
    @property
    def special_ids(self) -> set[int]:
        """The BOS, EOS and pad ids (those that are set)."""
        return {i for i in (self.bos_id, self.eos_id, self.pad_id) if i is not None}

    @property
    def bos_token_id(self) -> int | None:
        """Hugging Face's name for ``bos_id`` (None: the model prepends no BOS)."""
        return self.bos_id

    @property
    def eos_token_id(self) -> int:
        """Hugging Face's name for ``eos_id``, the id that stops generation."""
        return self.eos_id

    @property
    def pad_token_id(self) -> int:
        """Hugging Face's name for ``pad_id``, the id that fills padding."""
        return self.pad_id

    @property
    def bos_token(self) -> str | None:
        """The vocabulary spelling of the BOS token (None when there is none)."""
        return None if self.bos_id is None else self.id_to_token(self.bos_id)

    @property
    def eos_token(self) -> str:
        """The vocabulary spelling of the EOS token (``<|endoftext|>`` for GPT-2)."""
        return self.id_to_token(self.eos_id)

    @property
    def pad_token(self) -> str:
        """The vocabulary spelling of the pad token."""
        return self.id_to_token(self.pad_id)

    @property
    def padding_side(self) -> str:
        """Where the tokenizer call pads: ``"right"`` (Hugging Face's default) until set. Setting it is a
        choice ``model.to_tokens`` honours too (see :attr:`chosen_padding_side`)."""
        return self.__dict__.get("_padding_side") or "right"

    @padding_side.setter
    def padding_side(self, side: str) -> None:
        if side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {side!r}")
        self.__dict__["_padding_side"] = side

    @property
    def chosen_padding_side(self) -> str | None:
        """The padding side a user set on this tokenizer, or None when it was never set."""
        return self.__dict__.get("_padding_side")

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.name!r}, vocab_size={self.vocab_size}, bos={self.bos_id}, eos={self.eos_id})"
        )


def _ids(x: Any) -> Any:
    """Token ids as a Python int or (nested) lists of ints (from ints, lists, tensors or arrays)."""
    if hasattr(x, "tolist"):
        x = x.tolist()
    if isinstance(x, (list, tuple)):
        return [_ids(r) for r in x]
    return int(x)


def _tensor(rows: Any, return_tensors: str) -> torch.Tensor:
    if return_tensors != "pt":
        raise ValueError(f"return_tensors={return_tensors!r}: only 'pt' (torch) is supported")
    t = torch.tensor(rows, dtype=torch.long)
    return t[None] if t.ndim == 1 else t.view(len(rows), -1)


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of each byte (``" "`` → ``"Ġ"``), used for its vocabulary's token strings."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


@lru_cache(maxsize=1)
def _gpt2_token_ids() -> dict[str, int]:
    enc, spell = gpt2_encoding(), bytes_to_unicode()
    ids = {"".join(spell[b] for b in enc.decode_single_token_bytes(i)): i for i in range(EOT_ID)}
    ids[EOT] = EOT_ID
    return ids


class GPT2Tokenizer(Tokenizer):
    """GPT-2's byte-level BPE (r50k_base, offline through tiktoken); ``<|endoftext|>`` is BOS, EOS and pad."""

    name, vocab_size, bos_id, eos_id, pad_id = "gpt2", 50257, EOT_ID, EOT_ID, EOT_ID

    def encode_ids(self, text: str) -> list[int]:
        return encode(text)

    def decode_ids(self, ids: list[int]) -> str:
        return decode(ids)

    def token_str(self, token_id: int) -> str:
        return token_str(token_id)

    def id_to_token(self, token_id: int) -> str:
        if token_id == EOT_ID:
            return EOT
        spell = bytes_to_unicode()
        return "".join(spell[b] for b in gpt2_encoding().decode_single_token_bytes(token_id))

    def token_to_id(self, token: str) -> int | None:
        return _gpt2_token_ids().get(token)

    def char_spans(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        ids, enc = encode(text), gpt2_encoding()
        starts = [0]  # byte offset -> character index, via each character's UTF-8 length
        for ch in text:
            starts.append(starts[-1] + len(ch.encode()))
        spans, offset = [], 0
        for t in ids:
            n = len(enc.decode_single_token_bytes(t))
            spans.append((bisect.bisect_right(starts, offset) - 1, bisect.bisect_left(starts, offset + n)))
            offset += n
        return ids, spans


@lru_cache(maxsize=1)
def gpt2_tokenizer() -> GPT2Tokenizer:
    """A shared GPT-2 tokenizer (built once; a model gets its own :class:`GPT2Tokenizer`, whose
    ``padding_side`` is per model)."""
    return GPT2Tokenizer()


def encode(text: str) -> list[int]:
    """Token ids of ``text``; the literal ``<|endoftext|>`` is treated as the special token."""
    return gpt2_encoding().encode(text, allowed_special={EOT})


def decode(ids: list[int]) -> str:
    """Text of token ids (invalid UTF-8 byte runs become U+FFFD, as in GPT-2)."""
    return gpt2_encoding().decode(ids)


def token_str(token_id: int) -> str:
    """The string of a single token (possibly a partial UTF-8 sequence, replaced)."""
    return gpt2_encoding().decode_single_token_bytes(token_id).decode("utf-8", errors="replace")


@boundary
class HFTokenizer(Tokenizer):
    """A tokenizer backed by the ``tokenizers`` library (e.g. a byte-level BPE read from a GGUF file,
    :func:`gpt2_interp.io.gguf.gguf_tokenizer`). Special tokens written in the text are matched whole.

    ``backend`` is the ``tokenizers.Tokenizer``; ``name`` names the tokenizer (shown in its repr);
    ``bos_id`` is prepended by ``model.to_tokens(prepend_bos=True)`` (None: nothing is), ``eos_id``
    stops generation and ``pad_id`` fills padding (default: ``eos_id``). ``vocab_size`` counts the
    added tokens too."""

    def __init__(self, backend, name: str, bos_id: int | None, eos_id: int, pad_id: int | None = None) -> None:
        self.backend = backend  # tokenizers.Tokenizer
        self.name, self.bos_id, self.eos_id = name, bos_id, eos_id
        self.pad_id = eos_id if pad_id is None else pad_id
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)

    def encode_ids(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode_ids(self, ids: list[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=False)

    def token_str(self, token_id: int) -> str:
        return self.backend.decode([int(token_id)], skip_special_tokens=False)

    def id_to_token(self, token_id: int) -> str:
        return self.backend.id_to_token(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def char_spans(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        enc = self.backend.encode(text, add_special_tokens=False)
        return enc.ids, [tuple(o) for o in enc.offsets]


def read_tokenizer_json(path: str | os.PathLike[str]) -> Any:
    """A ``tokenizers.Tokenizer`` from a ``tokenizer.json`` file; a file the ``tokenizers`` library
    cannot parse (truncated, not JSON, not a tokenizer) raises a ValueError naming the file."""
    from tokenizers import Tokenizer as Backend

    try:
        return Backend.from_file(str(path))
    except Exception as e:  # the library raises its own Exception subclass with the parser's message
        raise ValueError(
            f"{path} is not a tokenizer file the tokenizers library can read ({e}); "
            "restore it from the model's repository"
        ) from None


def read_json_file(path: str | os.PathLike[str], what: str) -> Any:
    """The JSON value in ``path``; a file that is not valid JSON raises a ValueError naming it and ``what`` it is."""
    import json

    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} ({what}) is not valid JSON: {e}") from None
