"""Offline GPT-2 BPE tokenizer built with tiktoken from the shipped ``gpt2.tiktoken``.

The file is r50k_base (OpenAI's GPT-2 vocabulary), taken from the MIT-licensed
``openai-whisper`` sdist; its sha256 is checked at load so a corrupted copy can
never silently produce wrong token ids.
"""

from __future__ import annotations

import base64
import bisect
import hashlib
from functools import lru_cache
from importlib import resources

import tiktoken

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
        raise RuntimeError(
            f"gpt2.tiktoken has sha256 {digest}, expected {BPE_SHA256}; reinstall gpt2-interp."
        )
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in raw.splitlines() if line)
    }
    return tiktoken.Encoding(
        name="gpt2_interp_r50k",
        pat_str=_PAT,
        mergeable_ranks=ranks,
        special_tokens={EOT: EOT_ID},
        explicit_n_vocab=50257,
    )


class Tokenizer:
    """What the model needs from a tokenizer: ids ⇄ text, the bytes and character spans of each
    token (to find a subject's tokens), and the special ids. One implementation per family
    (GPT-2's tiktoken BPE here; a ``tokenizers`` BPE for GGUF/Llama models).

    ``bos_id`` is prepended by ``model.to_tokens(prepend_bos=True)`` (None: nothing is), ``pad_id``
    fills padding (always masked out), ``eos_id`` stops generation.
    """

    name: str
    vocab_size: int
    bos_id: int | None
    eos_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError

    def token_str(self, token_id: int) -> str:
        raise NotImplementedError

    def char_spans(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """``(ids, spans)``: the tokens of ``text`` and each one's ``(start, end)`` character span
        (a token that covers part of a multi-byte character spans all of that character)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, vocab_size={self.vocab_size}, bos={self.bos_id}, eos={self.eos_id})"


class GPT2Tokenizer(Tokenizer):
    """GPT-2's byte-level BPE (r50k_base, offline through tiktoken); ``<|endoftext|>`` is BOS, EOS and pad."""

    name, vocab_size, bos_id, eos_id, pad_id = "gpt2", 50257, EOT_ID, EOT_ID, EOT_ID

    def encode(self, text: str) -> list[int]:
        return encode(text)

    def decode(self, ids: list[int]) -> str:
        return decode(ids)

    def token_str(self, token_id: int) -> str:
        return token_str(token_id)

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
    """The shared GPT-2 tokenizer (stateless, built once)."""
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


class HFTokenizer(Tokenizer):
    """A tokenizer backed by the ``tokenizers`` library (e.g. a byte-level BPE read from a GGUF file,
    :func:`gpt2_interp.io.gguf.gguf_tokenizer`). Special tokens written in the text are matched whole."""

    def __init__(self, backend, name: str, bos_id: int | None, eos_id: int, pad_id: int | None = None) -> None:
        self.backend = backend  # tokenizers.Tokenizer
        self.name, self.bos_id, self.eos_id = name, bos_id, eos_id
        self.pad_id = eos_id if pad_id is None else pad_id
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=False)

    def token_str(self, token_id: int) -> str:
        return self.backend.decode([int(token_id)], skip_special_tokens=False)

    def char_spans(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        enc = self.backend.encode(text, add_special_tokens=False)
        return enc.ids, [tuple(o) for o in enc.offsets]
