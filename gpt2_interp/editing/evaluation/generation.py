"""Scores of what the edited model says on its own: greedy continuations, and two-hop questions.

Teacher-forced scores (:mod:`.scores`) compare P(new) with P(true) for targets the evaluation supplies: they
reveal the answer's content and length to the model. A user asks and reads the answer. Here each prompt is
continued greedily for ``n_tokens`` tokens, with no target supplied, and the continuation
**states** an object when its first line holds the object as a whole word, and holds it before the competing
object if both occur (:func:`states`):

* **generation efficacy** (``es``): the rewrite prompt's continuation states the new object;
* **generation paraphrase** (``ps``): the share of paraphrases whose continuation states the new object;
* **generation neighbourhood** (``ns``): the share of neighbourhood prompts whose continuation still states
  the true object.

**Two-hop questions through an edited fact** (MQuAKE-style, :func:`two_hop_questions`): when an edit moves a
city to another country, "The capital of the country that contains {city} is" should be answered with the
new country's capital. ``hop`` is the share of a case's two-hop questions whose continuation states the
answer through the new object, ``hop_true`` the share that states the answer through the true object, and
``hop_tf`` the teacher-forced form (P(answer through new) > P(answer through true)). The questions' prompts
name neither the bridge nor the answer; they come from the fact base's chains
(:data:`~gpt2_interp.facts.two_hop.TWO_HOP_TEMPLATES`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.boundary import boundary
from ...core.checks import check_count
from ...facts.base import Fact, FactBase
from ...facts.two_hop import TWO_HOP_TEMPLATES
from .cases import CounterfactCase
from .scores import GenerationScores, target_logprobs

if TYPE_CHECKING:
    from ...model import HookedGPT2

#: Greedy tokens per prompt for the generation-based scores (the answers are a few tokens long).
GENERATION_TOKENS = 10


def _find(text: str, obj: str) -> int:
    """Where ``obj`` (stripped) first occurs in ``text`` as a whole word; -1 if nowhere."""
    word = obj.strip()
    if not word:
        return -1
    m = re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text)
    return m.start() if m else -1


@boundary
def states(continuation: str, obj: str, other: str = "") -> bool:
    """Whether ``continuation`` states ``obj``: its first line holds ``obj`` (surrounding spaces ignored) as a
    whole word — case-sensitive, so " Paris" is found in "Paris, the city" but not in "Parisian" — and, when
    ``other`` also occurs there, ``obj`` comes first. ``"The capital is Rome, not Paris"`` states Rome, not
    Paris. An empty ``obj`` is never stated."""
    line = continuation.split("\n", 1)[0]
    at = _find(line, obj)
    if at < 0:
        return False
    other_at = _find(line, other) if other.strip() and other.strip() != obj.strip() else -1
    return other_at < 0 or at <= other_at


@boundary
@dataclass(frozen=True)
class TwoHopQuestion:
    """A question whose answer runs through an edited fact: ``prompt`` (``"The capital of the country that
    contains Aalborg is"``), ``answer_new`` (the capital of the country the edit moves Aalborg to, with its
    leading space), ``answer_true`` (`` Copenhagen``) and ``chain`` (``("city_country", "country_capital")``)."""

    prompt: str
    answer_new: str
    answer_true: str
    chain: tuple[str, str]


@boundary
def two_hop_questions(cases: Sequence[CounterfactCase], facts: FactBase | None = None) -> list[list[TwoHopQuestion]]:
    """Per case: the two-hop questions through its edit, one per chain ``(case.relation, second)`` of
    :data:`~gpt2_interp.facts.two_hop.TWO_HOP_TEMPLATES` whose second relation has exactly one fact for the
    true object and one for the new object, with different answers, neither of which (nor either object)
    the subject names. Cases of other relations, or without a true object, get none. ``facts``: the fact
    base the second hop is read from (default: the shipped one)."""
    facts = facts or FactBase.load()
    by_subject: dict[tuple[str, str], list[Fact]] = {}
    for f in facts.facts():
        by_subject.setdefault((f.relation, f.subject), []).append(f)
    out: list[list[TwoHopQuestion]] = []
    for c in cases:
        true, new, subject = c.target_true.strip(), c.request.target.strip(), c.request.subject
        row = []
        for (first, second), template in TWO_HOP_TEMPLATES.items():
            if first != c.relation or not true:
                continue
            a, b = by_subject.get((second, new), []), by_subject.get((second, true), [])
            if len(a) != 1 or len(b) != 1 or a[0].object == b[0].object:
                continue
            if any(w in subject for w in (new, true, a[0].object, b[0].object)):
                continue
            row.append(TwoHopQuestion(template.format(subject), a[0].target, b[0].target, (first, second)))
        out.append(row)
    return out


def _rate(hits: Sequence[bool]) -> float | None:
    return sum(hits) / len(hits) if hits else None


@boundary
def continuations(model: HookedGPT2, prompts: Sequence[str], n_tokens: int, batch_size: int = 64) -> list[str]:
    """The greedy continuation (the new text only) of each of ``prompts``, up to ``n_tokens`` tokens or the
    end-of-text token, ``batch_size`` prompts per batch (``model.generate``: left-padded, KV cache)."""
    n_tokens = check_count(n_tokens, "n_tokens")
    out: list[str] = []
    for s in range(0, len(prompts), batch_size):
        chunk = list(prompts[s : s + batch_size])
        longest = model.tokenize(chunk)[0].shape[1]
        texts = model.generate(
            chunk, max_new_tokens=min(n_tokens, model.cfg.n_ctx - longest), stop_at_eos=True, do_sample=False
        )
        out += [t[len(p) :] if t.startswith(p) else t for p, t in zip(chunk, texts)]
    return out


def _checks(case: CounterfactCase, questions: Sequence[TwoHopQuestion]) -> list[tuple[str, str, str, str]]:
    """``(score, prompt, object, other)`` per check of one case: the continuation of ``prompt`` counts for
    ``score`` when it states ``object`` before ``other`` (:func:`states`)."""
    new, true = case.request.target, case.target_true
    rows = [("es", case.request.text, new, true)] + [("ps", p, new, true) for p in case.paraphrases]
    rows += [("ns", p, true, new) for p in case.neighbourhood] if true else []
    for q in questions:
        rows += [("hop", q.prompt, q.answer_new, q.answer_true), ("hop_true", q.prompt, q.answer_true, q.answer_new)]
    return rows


def _hop_tf(model: HookedGPT2, questions: Sequence[TwoHopQuestion], batch_size: int) -> list[bool]:
    """Per question: P(answer through the new object) > P(answer through the true object), teacher-forced."""
    if not questions:
        return []
    prompts = [q.prompt for q in questions for _ in range(2)]
    lp = target_logprobs(model, prompts, [t for q in questions for t in (q.answer_new, q.answer_true)], batch_size)
    return (lp[0::2] > lp[1::2]).tolist()


@boundary
def generation_scores(
    model: HookedGPT2,
    cases: Sequence[CounterfactCase],
    questions: Sequence[Sequence[TwoHopQuestion]] | None = None,
    n_tokens: int = GENERATION_TOKENS,
    batch_size: int = 64,
) -> list[GenerationScores]:
    """Per case of ``cases``: its :class:`GenerationScores` on ``model`` as it stands. ``questions``: each
    case's two-hop questions (:func:`two_hop_questions`; None: no two-hop scores); ``n_tokens`` greedy
    tokens per prompt (default 10); ``batch_size`` prompts per batch. Every distinct prompt is continued
    once, all of them batched together."""
    if questions is not None and len(questions) != len(cases):
        raise ValueError(f"{len(questions)} lists of two-hop questions for {len(cases)} cases")
    qs = [list(q) for q in questions] if questions is not None else [[] for _ in cases]
    checks = [_checks(c, q) for c, q in zip(cases, qs)]
    prompts = list(dict.fromkeys(p for rows in checks for _, p, _, _ in rows))
    said = dict(zip(prompts, continuations(model, prompts, n_tokens, batch_size)))
    forced = iter(_hop_tf(model, [q for row in qs for q in row], batch_size))
    out = []
    for rows, q in zip(checks, qs):
        hits: dict[str, list[bool]] = {}
        for score, prompt, obj, other in rows:
            hits.setdefault(score, []).append(states(said[prompt], obj, other))
        rates = {k: _rate(hits.get(k, [])) for k in ("es", "ps", "ns", "hop", "hop_true")}
        out.append(GenerationScores(**rates, hop_tf=_rate([next(forced) for _ in q])))
    return out


__all__ = [
    "GENERATION_TOKENS",
    "GenerationScores",
    "TwoHopQuestion",
    "continuations",
    "generation_scores",
    "states",
    "two_hop_questions",
]
