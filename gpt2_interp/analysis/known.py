"""Whether a model knows a fact: one rule for the analyses and the edit evaluation.

A fact — a prompt and the target the model should continue it with (``" Paris"`` after
``"The capital of France is"``) — is **known** when

1. the model's top-1 next token after BOS + prompt is the target's first token, and
2. that first token is **informative**: it holds more than whitespace.

Rule 2 is for tokenizers that split numbers: SmolLM2 splits ``" 89"`` into ``" "``, ``"8"``,
``"9"``, so the target's first token is a bare space, and predicting ``" "`` shows nothing about
the number. A fact whose target starts with a whitespace-only token is therefore never known,
whatever the model predicts (with GPT-2's tokenizer ``" 89"`` is one token and the question does
not arise).

Only the first token is compared (ROME's and CounterFact's choice): a multi-token object is known
when the model starts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from ..core.boundary import boundary
from ..core.checks import check_count
from ..facts.base import Fact, FactBase
from .tokens import target_ids

if TYPE_CHECKING:
    from ..model import HookedGPT2


@boundary
def informative(model: HookedGPT2, target: str) -> bool:
    """Whether ``target``'s first token (in ``model``'s tokenizer) holds more than whitespace.

    ``" Paris"`` → True; with SmolLM2's tokenizer ``" 89"`` → False (its first token is ``" "``).
    An empty or non-string target raises (:func:`~.tokens.target_ids`)."""
    return bool(model.tokenizer.decode(target_ids(model, target)[:1]).strip())


@torch.no_grad()
def top1_tokens(model: HookedGPT2, prompts: Sequence[str], batch_size: int = 64, prepend_bos: bool = True) -> list[int]:
    """The model's top-1 next-token id after BOS + each prompt (batched, left-padded): ``[n]``.
    ``prepend_bos=False`` for texts that bring their own start (e.g. a chat template)."""
    batch_size = check_count(batch_size, "batch_size")
    prompts = list(prompts)
    out: list[int] = []
    for s in range(0, len(prompts), batch_size):
        tokens, mask = model.tokenize(prompts[s : s + batch_size], prepend_bos=prepend_bos)
        out += model.last_logits(tokens, attention_mask=mask).argmax(-1).tolist()
    return out


def _pairs(prompts: Sequence[str], targets: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(prompts, targets)`` as lists of equal length, else an error naming what is wrong."""
    if isinstance(prompts, str) or isinstance(targets, str):
        raise TypeError("prompts and targets must be sequences of strings (one target per prompt), not a single string")
    prompts, targets = list(prompts), list(targets)
    if len(prompts) != len(targets):
        raise ValueError(
            f"prompts and targets must have the same length, got {len(prompts)} prompts and {len(targets)} targets"
        )
    return prompts, targets


@boundary
def knows(
    model: HookedGPT2, prompts: Sequence[str], targets: Sequence[str], batch_size: int = 64, prepend_bos: bool = True
) -> list[bool]:
    """Per ``(prompt, target)``: whether the model knows it (module doc): its top-1 next token after
    the prompt is the target's first token, and that token is not whitespace only. ``[n]`` bools,
    batched; only prompts with an informative target are run through the model. ``prepend_bos=False``:
    the same rule on texts that bring their own start (e.g. a chat template's special token).

    ``prompts`` and ``targets``: sequences of strings, one target per prompt; ``batch_size``
    (default 64) prompts per forward pass. A single string instead of a sequence raises TypeError;
    sequences of different lengths, an empty target or ``batch_size`` < 1 raise ValueError."""
    prompts, targets = _pairs(prompts, targets)
    firsts = [target_ids(model, t)[0] for t in targets]
    useful = [i for i, t in enumerate(targets) if informative(model, t)]
    top = top1_tokens(model, [prompts[i] for i in useful], batch_size, prepend_bos)
    out = [False] * len(prompts)
    for i, t in zip(useful, top):
        out[i] = t == firsts[i]
    return out


@boundary
def known_facts(
    model: HookedGPT2,
    fb: FactBase | None = None,
    facts: Sequence[Fact] | None = None,
    batch_size: int = 64,
    template: int = 0,
    split: str = "train",
) -> list[Fact]:
    """The facts (default: every fact of ``fb``, the shipped fact base by default) that the model
    knows (:func:`knows`) on their ``template``-th prompt of ``split`` ("train" or "heldout";
    ``FactBase.cases``), in order; ``batch_size`` (default 64) prompts per forward pass."""
    fb = fb or FactBase.load()
    facts = fb.facts() if facts is None else list(facts)
    cases = fb.cases(facts, split, template)
    hits = knows(model, [p for p, _, _ in cases], [t for _, _, t in cases], batch_size)
    return [f for f, h in zip(facts, hits) if h]


__all__ = ["informative", "known_facts", "knows", "top1_tokens"]


@boundary
@torch.no_grad()
def whole_object(model: HookedGPT2, prompts: Sequence[str], targets: Sequence[str], batch_size: int = 64) -> list[bool]:
    """Per ``(prompt, target)``: whether greedy decoding after BOS + prompt produces every token of the
    target — teacher-forced: each target token is the top-1 after the prompt and the target tokens
    before it (one forward pass per batch instead of one per token). A stricter reading than
    :func:`knows`, which compares the first token only. ``[n]`` bools. ``prompts`` and ``targets``:
    one target per prompt; ``batch_size`` (default 64) rows per forward pass. Refusals as in
    :func:`knows`."""
    prompts, targets = _pairs(prompts, targets)
    batch_size = check_count(batch_size, "batch_size")
    out: list[bool] = []
    for s in range(0, len(prompts), batch_size):
        ids = [target_ids(model, t) for t in targets[s : s + batch_size]]
        rows = [model.to_tokens(p)[0].tolist() + i for p, i in zip(prompts[s : s + batch_size], ids)]
        tokens, mask = model.pad(rows)  # left-padded: every row ends in the last column
        pred = model(tokens, attention_mask=mask).argmax(-1)  # [batch, pos]
        w = tokens.shape[1]
        out += [pred[j, w - len(i) - 1 : w - 1].tolist() == i for j, i in enumerate(ids)]
    return out


__all__ += ["whole_object"]
