"""The cases an evaluation edits and the prompts that test them.

A :class:`CounterfactCase` is one request to rewrite ``subject``'s object from ``target_true`` to
``target``, with its paraphrases and neighbourhood prompts; :func:`counterfact_requests` draws them
from the embedded fact base. :func:`related_prompts` lists facts an edit should leave alone (the
edited subject's other relations, subjects sharing its last token), :func:`unrelated_prompts` a fixed
set for drift. Whether the unedited model knows a fact is :func:`gpt2_interp.analysis.known.knows`.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ...analysis.known import knows
from ...analysis.tokens import subject_span
from ...core.boundary import boundary
from ...facts.base import Fact, FactBase
from ...facts.templates import templates
from ..edit import Request

if TYPE_CHECKING:
    from ...model import HookedGPT2


@boundary
@dataclass
class CounterfactCase:
    """One counterfactual request with the prompts that test it (prompts are filled-in text).

    ``case_id``: its number; ``request``: the rewrite (prompt, subject, new ``target``);
    ``target_true``: the object the model should forget (``""`` when unknown); ``paraphrases``:
    other prompts of the same fact (efficacy under rewording); ``neighbourhood``: prompts about
    other subjects with the same true object (should keep it); ``relation``: the fact base's
    relation (``""`` for a case from elsewhere)."""

    case_id: int
    request: Request
    target_true: str
    paraphrases: list[str] = field(default_factory=list)
    neighbourhood: list[str] = field(default_factory=list)
    relation: str = ""

    @classmethod
    def of(cls, x: Any, case_id: int = 0) -> CounterfactCase:
        """From a case, or a Request/dict (dict keys ``target_true``, ``paraphrases`` or ROME's
        ``paraphrase_prompts``, ``neighbourhood`` or ``neighborhood_prompts`` are optional)."""
        if isinstance(x, CounterfactCase):
            return x
        req = Request.of(x)
        d = x if isinstance(x, Mapping) else {}
        true = d.get("target_true")
        if isinstance(true, Mapping):
            true = " " + str(true.get("str", "")).lstrip()
        return cls(
            int(d.get("case_id", case_id)),
            req,
            str(true) if true else "",
            list(d.get("paraphrases", d.get("paraphrase_prompts", []))),
            list(d.get("neighbourhood", d.get("neighborhood_prompts", []))),
            str(d.get("relation", "")),
        )


@boundary
def counterfact_requests(
    fb: FactBase | None = None, n: int = 200, seed: int = 0, n_neighbours: int = 10
) -> list[CounterfactCase]:
    """``n`` counterfactual cases from the fact base, spread evenly over the relations.

    Each rewrites a fact's object to another object of the same relation
    (``FactBase.counterfactual``); the rewrite prompt is the relation's first training template,
    the paraphrases its held-out templates, the neighbourhood up to ``n_neighbours`` prompts about
    other subjects with the same true object (none exist for one-to-one relations such as
    element symbols: those cases have no neighbourhood score).

    ``fb``: the fact base (default: the shipped one); ``seed``: the draw of facts and new objects.
    ``n`` larger than the number of facts raises ValueError."""
    fb = fb or FactBase.load()
    rng = random.Random(seed)
    pools = {r: rng.sample(fb.facts(r), len(fb.facts(r))) for r in fb.relations}
    if n > len(fb):
        raise ValueError(f"asked for {n} cases but the fact base has {len(fb)} facts")
    picked: list[Fact] = []
    while len(picked) < n:  # round-robin over relations
        for r in fb.relations:
            if pools[r] and len(picked) < n:
                picked.append(pools[r].pop())
    cases = []
    for i, fact in enumerate(picked):
        new = fb.counterfactual(fact, rng)
        cases.append(
            CounterfactCase(
                i,
                Request(templates(fact.relation, "train")[0], fact.subject, new.target),
                fact.target,
                fb.prompts(fact, "heldout"),
                fb.neighbourhood(fact, n_neighbours, rng),
                fact.relation,
            )
        )
    return cases


@boundary
def as_cases(requests: Sequence[Any] | int, seed: int = 0) -> list[CounterfactCase]:
    """``requests`` as cases: an int n is that many :func:`counterfact_requests` (``seed``); cases,
    Requests or dicts are converted one by one (:meth:`CounterfactCase.of`, ids in order)."""
    cases = (
        counterfact_requests(n=requests, seed=seed)
        if isinstance(requests, int)
        else [CounterfactCase.of(r, i) for i, r in enumerate(requests)]
    )
    if not cases:
        raise ValueError("no requests to evaluate: give CounterFact cases, Requests/dicts or a count n ≥ 1")
    return cases


@boundary
def keep_other_relations(
    cases: Sequence[CounterfactCase], template: int | Sequence[int] = 1, fb: FactBase | None = None
) -> list[CounterfactCase]:
    """Copies of ``cases`` whose requests keep the subject's other facts (:attr:`Request.keep`): the
    fact base's ``template``-th training prompt (or each of several: ``template=(1, 2, 3)``) of every
    other relation the subject has. Subject specificity is scored on the 0th
    (:func:`related_prompts`), so with the default the scored prompts are not the ones optimised.
    ``fb``: the fact base (default: the shipped one). No template index, or one a relation does not
    have, raises ValueError."""
    idx = [template] if isinstance(template, int) else list(template)
    if not idx:
        raise ValueError("template: give at least one training-prompt index")
    fb = fb or FactBase.load()
    rels: dict[str, list[str]] = {}
    for f in fb.facts():
        rels.setdefault(f.subject, []).append(f.relation)
    out = []
    for c in cases:
        others = [r for r in rels.get(c.request.subject, []) if r != c.relation]
        for r in others:
            if max(idx) >= len(templates(r, "train")) or min(idx) < -len(templates(r, "train")):
                raise ValueError(f"template {idx}: relation {r!r} has {len(templates(r, 'train'))} training prompts")
        keep = tuple(templates(r, "train")[i] for r in others for i in idx)
        out.append(replace(c, request=replace(c.request, keep=keep)))
    return out


@boundary
def known_cases(
    model: HookedGPT2,
    n: int,
    seed: int = 0,
    exclude: Collection[tuple[str, str]] = frozenset(),
    batch_size: int = 256,
) -> list[CounterfactCase]:
    """Up to ``n`` CounterFact cases (:func:`counterfact_requests` over the whole fact base, seeded
    shuffle spread over relations) whose fact the unedited ``model`` knows on the rewrite prompt
    (:func:`~gpt2_interp.analysis.known.knows`: top-1 next token = the true object's first token,
    a token that holds more than whitespace), none with a ``(relation, subject)`` in ``exclude``.
    Fewer when the model knows fewer. ``seed``: the shuffle; ``batch_size`` (default 256) cases are
    checked per batch of forward passes."""
    fb = FactBase.load()
    pool = [c for c in counterfact_requests(fb, n=len(fb), seed=seed) if (c.relation, c.request.subject) not in exclude]
    out: list[CounterfactCase] = []
    for s in range(0, len(pool), batch_size):
        chunk = pool[s : s + batch_size]
        hits = knows(model, [c.request.text for c in chunk], [c.target_true for c in chunk], batch_size)
        out += [c for c, hit in zip(chunk, hits) if hit]
        if len(out) >= n:
            break
    return out[:n]


@boundary
def known_flags(model: HookedGPT2, cases: Sequence[CounterfactCase], batch_size: int = 64) -> list[bool]:
    """Per case: whether the model knows its fact on the rewrite prompt
    (:func:`~gpt2_interp.analysis.known.knows`); False for a case without ``target_true``."""
    with_true = [i for i, c in enumerate(cases) if c.target_true]
    hits = knows(
        model, [cases[i].request.text for i in with_true], [cases[i].target_true for i in with_true], batch_size
    )
    out = [False] * len(cases)
    for i, hit in zip(with_true, hits):
        out[i] = hit
    return out


@boundary
def unrelated_prompts(n: int = 30, seed: int = 1) -> list[tuple[str, str, str]]:
    """A fixed set of ``(relation, subject, prompt)`` from the fact base, spread over relations."""
    cases = counterfact_requests(n=n, seed=seed, n_neighbours=0)
    return [(c.relation, c.request.subject, c.request.text) for c in cases]


@boundary
@dataclass
class RelatedPrompt:
    """A fact the edit should leave alone: ``kind`` "subject" (another relation of the edited
    subject) or "shared" (a subject whose last token is the edited subject's).

    ``prompt``: the filled-in prompt; ``target_true``: the object the model should still give;
    ``subject`` and ``relation``: the fact's."""

    prompt: str
    target_true: str
    kind: str
    subject: str = ""
    relation: str = ""


def _last_token(model: HookedGPT2, subject: str, relation: str) -> str:
    """The last subject token of the relation's first training prompt (the position an edit writes to)."""
    text = templates(relation, "train")[0].format(subject)
    _, end = subject_span(model, text, subject)
    return model.to_str_tokens(text)[end - 1]


def _related_prompt(f: Fact, kind: str) -> RelatedPrompt:
    return RelatedPrompt(templates(f.relation, "train")[0].format(f.subject), f.target, kind, f.subject, f.relation)


@boundary
def related_prompts(
    model: HookedGPT2, cases: Sequence[CounterfactCase], fb: FactBase | None = None, n_max: int = 10, seed: int = 0
) -> list[list[RelatedPrompt]]:
    """Per case: the edited subject's facts of the other relations, and up to ``n_max`` facts of
    subjects that share the edited subject's last token in its rewrite prompt (the position the
    edit writes to), facts of the edited relation first. Facts that any case edits are left out.
    Cases whose subject/relation are not in the fact base get none. ``cases``: the edited cases;
    ``fb``: the fact base (default: the shipped one); ``seed``: the draw among shared-token subjects."""
    fb = fb or FactBase.load()
    rng = random.Random(seed)
    edited = {(c.relation, c.request.subject) for c in cases}
    by_subject: dict[str, list[Fact]] = {}
    by_last: dict[str, list[Fact]] = {}
    for f in fb.facts():
        by_subject.setdefault(f.subject, []).append(f)
        by_last.setdefault(_last_token(model, f.subject, f.relation), []).append(f)
    out: list[list[RelatedPrompt]] = []
    for c in cases:
        rel, subj = c.relation, c.request.subject
        if subj not in by_subject:
            out.append([])
            continue
        rows = [
            _related_prompt(f, "subject")
            for f in by_subject[subj]
            if f.relation != rel and (f.relation, f.subject) not in edited
        ]
        shared = [
            f
            for f in by_last.get(_last_token(model, subj, rel), [])
            if f.subject != subj and (f.relation, f.subject) not in edited
        ]
        shared = sorted(shared, key=lambda f: (f.relation != rel, rng.random()))[:n_max]
        out.append(rows + [_related_prompt(f, "shared") for f in shared])
    return out


@boundary
def known_related(
    model: HookedGPT2, cases: Sequence[CounterfactCase], seed: int = 0, batch_size: int = 64
) -> list[list[RelatedPrompt]]:
    """:func:`related_prompts` of ``cases``, keeping only the facts the model knows
    (:func:`~gpt2_interp.analysis.known.knows`); none for any case without a relation (cases not
    from the fact base). ``seed`` as in :func:`related_prompts`; ``batch_size`` (default 64) prompts
    per forward pass."""
    if not all(c.relation for c in cases):
        return [[] for _ in cases]
    rel = related_prompts(model, cases, seed=seed)
    flat = [p for ps in rel for p in ps]
    hits = iter(knows(model, [p.prompt for p in flat], [p.target_true for p in flat], batch_size))
    return [[p for p in ps if next(hits)] for ps in rel]
