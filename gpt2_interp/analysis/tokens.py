"""Token-level helpers shared by the analyses: targets, subject spans."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from ..io import tokenizer as tok

if TYPE_CHECKING:
    from ..model import HookedGPT2


def target_id(model: "HookedGPT2", target: str | int) -> int:
    """A single-token target's id; a multi-token string raises, showing how it tokenizes."""
    if isinstance(target, int):
        if not 0 <= target < model.cfg.d_vocab:
            raise ValueError(f"target id {target} is outside the vocabulary [0, {model.cfg.d_vocab})")
        return target
    return model.to_single_token(target)


def target_ids(target: str) -> list[int]:
    """Token ids of a (possibly multi-token) target string; empty raises."""
    if not target or not target.strip():
        raise ValueError(f"target {target!r} is empty; give the text the model should produce, e.g. ' Rome'")
    return tok.encode(target)


def subject_span(model: "HookedGPT2", prompt: str, subject: str, prepend_bos: bool = True) -> tuple[int, int]:
    """``(start, end)`` token positions of ``subject`` in ``model.to_tokens(prompt)`` (end exclusive):
    every token that overlaps the subject's characters (GPT-2 merges the leading space into
    the subject's first token: "The| E|iff|el| Tower").

    A subject that does not occur in the prompt raises a ValueError showing both tokenizations.
    """
    if not subject:
        raise ValueError("subject is empty")
    idx = prompt.find(subject)
    if idx < 0:
        hint = ""
        if prompt.lower().find(subject.lower()) >= 0:
            hint = " (it occurs with different capitalisation)"
        raise ValueError(
            f"subject {subject!r} does not occur in the prompt {prompt!r}{hint}; the prompt tokenizes as "
            f"{[tok.token_str(i) for i in tok.encode(prompt)]}, the subject as "
            f"{[tok.token_str(i) for i in tok.encode(subject)]}"
        )
    lo = len(prompt[:idx].encode())
    hi = lo + len(subject.encode())
    enc = tok.gpt2_encoding()
    start = end = None
    offset = 0
    for i, t in enumerate(tok.encode(prompt)):
        n = len(enc.decode_single_token_bytes(t))
        if offset < hi and offset + n > lo:
            start = i if start is None else start
            end = i + 1
        offset += n
    bos = 1 if prepend_bos else 0
    return bos + start, bos + end


def prompt_position(model: "HookedGPT2", prompt: str, position: int, what: str) -> tuple[torch.Tensor, int]:
    """Tokens ``[1, pos]`` of one prompt and ``position`` as a non-negative index (BOS included);
    a non-string prompt or an out-of-range position raises, saying the valid range."""
    if not isinstance(prompt, str):
        raise TypeError(f"{what} takes one prompt string")
    tokens, _ = model.tokenize(prompt)
    length = tokens.shape[1]
    if not -length <= position < length:
        raise IndexError(f"position {position} is out of range for a prompt of {length} tokens (BOS included): "
                         f"use {-length}..{length - 1}")
    return tokens, position % length


def str_tokens(model: "HookedGPT2", tokens: torch.Tensor | Sequence[int]) -> list[str]:
    return [tok.token_str(int(i)) for i in tokens]
