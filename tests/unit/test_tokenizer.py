"""The offline GPT-2 BPE gives GPT-2's ids."""

from __future__ import annotations

import pytest

from gpt2_interp.io import tokenizer as tok


def test_known_ids():
    # ids from GPT-2's published vocabulary
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode(" Paris") == [6342]
    assert tok.encode("<|endoftext|>") == [50256]
    assert tok.gpt2_encoding().n_vocab == 50257


@pytest.mark.parametrize(
    "text",
    [
        "",
        " ",
        "  leading",
        "trailing  ",
        "tabs\tand\nnewlines\n\n",
        "naïve café — 東京 👋🏽",
        "don't they'll",
        "1234567 3.14",
    ],
)
def test_round_trip(text):
    assert tok.decode(tok.encode(text)) == text


def test_matches_transformers_tokenizer_vocab():
    # tiktoken's own bundled r50k_base would need a download; instead check byte-level merges on a few
    # words against the BPE ranks in the shipped file: ' the' is rank 262, 'The' 464
    assert tok.encode(" the") == [262] and tok.encode("The") == [464]


def test_corrupt_bpe_file_is_refused(monkeypatch):
    import hashlib

    tok.gpt2_encoding.cache_clear()
    monkeypatch.setattr(tok, "BPE_SHA256", hashlib.sha256(b"something else").hexdigest())
    with pytest.raises(RuntimeError, match="sha256"):
        tok.gpt2_encoding()
    monkeypatch.undo()
    tok.gpt2_encoding.cache_clear()
    assert tok.encode("Hello world") == [15496, 995]
