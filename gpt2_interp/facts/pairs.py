"""Clean/corrupted prompt pairs from the fact base, for patching and attribution.

A pair is a fact's prompt (clean) and the same template with another subject of the same relation
(corrupted): the two runs differ only in the subject, and the corrupted run has its own answer. The
prompts must have the same number of tokens so that positions align; token counts come from the
tokenizer passed in (``model.tokenizer``), so this stays data-level and works for any tokenizer.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .base import Fact, FactBase
from .templates import templates


@dataclass
class FactPairs:
    """Prompt pairs: ``clean[i]`` / ``corrupted[i]`` (strings), ``answers[i]`` / ``wrongs[i]``: the
    first token id of the clean / corrupted object (they differ), ``facts[i]``: the two facts.
    ``logit_diff(pairs.answers, pairs.wrongs)`` is the usual metric."""

    clean: list[str]
    corrupted: list[str]
    answers: list[int]
    wrongs: list[int]
    facts: list[tuple[Fact, Fact]]

    def __len__(self) -> int:
        return len(self.clean)

    def subset(self, keep: Sequence[int]) -> FactPairs:
        """The pairs at indices ``keep``, in that order."""
        return FactPairs(
            *([getattr(self, f)[i] for i in keep] for f in ("clean", "corrupted", "answers", "wrongs", "facts"))
        )


def subject_swaps(facts: FactBase, tokenizer: Any, n: int, seed: int = 0, template: int = 0) -> FactPairs:
    """Up to ``n`` pairs spread over the relations (facts drawn at random, fixed ``seed``): training
    template ``template`` of the fact's relation with its subject, and with another subject of the
    relation whose object starts with a different token and whose prompt has as many tokens.
    ``tokenizer``: ``model.tokenizer``, or anything with ``encode(text, add_special_tokens=False) -> list[int]``."""
    rng = random.Random(seed)
    encode = getattr(tokenizer, "encode_ids", None) or (lambda text: tokenizer.encode(text, add_special_tokens=False))

    def first(f: Fact) -> int:
        return encode(f.target)[0]

    pools = {r: rng.sample(facts.facts(r), len(facts.facts(r))) for r in facts.relations}
    out: list[tuple[str, str, int, int, tuple[Fact, Fact]]] = []
    while len(out) < n and any(pools.values()):
        for r in facts.relations:
            if not pools[r] or len(out) >= n:
                continue
            f = pools[r].pop()
            t = templates(r, "train")[template]
            prompt = t.format(f.subject)
            length = len(encode(prompt))
            others = [g for g in facts.facts(r) if g.subject != f.subject and first(g) != first(f)]
            rng.shuffle(others)
            g = next((g for g in others if len(encode(t.format(g.subject))) == length), None)
            if g is not None:
                out.append((prompt, t.format(g.subject), first(f), first(g), (f, g)))
    if not out:
        return FactPairs([], [], [], [], [])
    return FactPairs(*(list(x) for x in zip(*out)))
