"""Token-level helpers shared by the analyses and editors: targets, subject spans, prompt positions.

All of them go through ``model.tokenizer``, so they hold for any tokenizer the model carries."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..core.boundary import boundary

if TYPE_CHECKING:
    from ..model import HookedGPT2


@boundary
def target_ids(model: HookedGPT2, target: str) -> list[int]:
    """Token ids of a (possibly multi-token) target string; a non-string or empty target raises."""
    if not isinstance(target, str):
        raise TypeError(f"target must be a string such as ' Rome', got {type(target).__name__}")
    if not target.strip():
        raise ValueError(f"target {target!r} is empty; give the text the model should produce, e.g. ' Rome'")
    return model.tokenizer.encode_ids(target)


@boundary
def token_span(model: HookedGPT2, text: str, lo: int, hi: int, prepend_bos: bool = True) -> tuple[int, int]:
    """``(start, end)`` positions (end exclusive) in ``model.to_tokens(text, prepend_bos)`` of every
    token that overlaps characters ``[lo, hi)`` of ``text`` (GPT-2 merges a leading space into a
    word's first token: "The| E|iff|el| Tower")."""
    _, spans = model.tokenizer.char_spans(text)
    hit = [i for i, (a, b) in enumerate(spans) if a < hi and b > lo]
    if not hit:
        raise ValueError(f"no token of {text!r} overlaps characters {lo}..{hi}")
    bos = 1 if prepend_bos and model.tokenizer.bos_id is not None else 0
    return bos + hit[0], bos + hit[-1] + 1


@boundary
def subject_span(model: HookedGPT2, prompt: str, subject: str, prepend_bos: bool = True) -> tuple[int, int]:
    """``(start, end)`` token positions of the first occurrence of ``subject`` in
    ``model.to_tokens(prompt)`` (end exclusive): every token that overlaps the subject's characters.
    Positions count BOS when ``prepend_bos`` (default True) and the tokenizer has one.

    A subject that is not a non-blank string, or does not occur in the prompt, raises a clear error
    (showing both tokenizations)."""
    for name, value in (("prompt", prompt), ("subject", subject)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    if not subject.strip():
        raise ValueError(f"subject {subject!r} is empty or blank; give the entity, e.g. 'Eiffel Tower'")
    idx = prompt.find(subject)
    if idx < 0:
        hint = " (it occurs with different capitalisation)" if subject.lower() in prompt.lower() else ""
        show = model.tokenizer
        raise ValueError(
            f"subject {subject!r} does not occur in the prompt {prompt!r}{hint}; the prompt tokenizes as "
            f"{[show.token_str(i) for i in show.encode_ids(prompt)]}, the subject as "
            f"{[show.token_str(i) for i in show.encode_ids(subject)]}"
        )
    return token_span(model, prompt, idx, idx + len(subject), prepend_bos)


@boundary
def prompt_position(model: HookedGPT2, prompt: str, position: int, what: str) -> tuple[torch.Tensor, int]:
    """Tokens ``[1, pos]`` of one prompt and ``position`` as a non-negative index (BOS included);
    a non-string prompt or non-integer position raises TypeError (naming ``what``, the calling
    function), an out-of-range position IndexError, saying the valid range."""
    if not isinstance(prompt, str):
        raise TypeError(f"{what} takes one prompt string, got {type(prompt).__name__}")
    if isinstance(position, bool) or not hasattr(position, "__index__"):
        raise TypeError(f"position must be an int, got {type(position).__name__}")
    position = int(position.__index__())
    tokens, _ = model.tokenize(prompt)
    length = tokens.shape[1]
    if not -length <= position < length:
        raise IndexError(
            f"position {position} is out of range for a prompt of {length} tokens (BOS included): "
            f"use {-length}..{length - 1}"
        )
    return tokens, position % length
