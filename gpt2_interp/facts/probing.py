"""Labelled probing sets built from the fact base: which attribute of a subject a probe should read.

A task names a subject type and an attribute of it, e.g. ``continent`` (country → continent),
``period`` (element → period of the periodic table, from its atomic number), ``country``
(city → country), ``city_continent`` (city → the continent of its country),
``atomic_number`` (element → Z, a regression task). Every subject is written into several
prompt templates of the relations about its type (a country appears in capital, continent,
language and currency templates), so a probe must read the attribute from the subject's
representation, not from one sentence shape. ``groups`` is the subject: folds split by it, so
no subject is in both a training and a test fold.

This module is data: it imports only the fact base and its templates.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from gpt2_interp.facts.base import FactBase
from gpt2_interp.facts.templates import templates

# subject type -> the relations whose templates hold a subject of that type
SUBJECT_RELATIONS: dict[str, tuple[str, ...]] = {
    "country": ("country_capital", "country_continent", "country_language", "country_currency"),
    "city": ("city_country",),
    "element": ("element_symbol", "element_number"),
}
# last atomic number of each period of the periodic table (1..7)
PERIOD_ENDS = (2, 10, 18, 36, 54, 86, 118)


@dataclass(frozen=True)
class ProbeTask:
    """``name``: subjects of ``subject_type``, labelled by ``relation``'s object mapped through
    ``label`` (``"identity"``, ``"period"``, ``"number"``, ``"continent"``); ``kind`` is
    ``"classification"`` or ``"regression"``; ``max_classes`` keeps the classes with most subjects."""

    name: str
    subject_type: str
    relation: str
    label: str = "identity"
    kind: str = "classification"
    max_classes: int | None = None
    description: str = ""


TASKS: dict[str, ProbeTask] = {
    t.name: t
    for t in (
        ProbeTask("continent", "country", "country_continent", description="country → continent (6 classes)"),
        ProbeTask(
            "language",
            "country",
            "country_language",
            max_classes=6,
            description="country → main language (the 6 most common)",
        ),
        ProbeTask(
            "currency",
            "country",
            "country_currency",
            max_classes=6,
            description="country → currency name (the 6 most common)",
        ),
        ProbeTask(
            "country",
            "city",
            "city_country",
            max_classes=12,
            description="city → country (the 12 countries with most cities)",
        ),
        ProbeTask(
            "city_continent", "city", "city_country", label="continent", description="city → continent of its country"
        ),
        ProbeTask(
            "period",
            "element",
            "element_number",
            label="period",
            description="element → period of the periodic table (1–7)",
        ),
        ProbeTask(
            "atomic_number",
            "element",
            "element_number",
            label="number",
            kind="regression",
            description="element → atomic number (regression)",
        ),
    )
}


@dataclass
class ProbingSet:
    """Prompts with a label each. ``subjects[i]`` occurs in ``prompts[i]``; ``groups[i]`` is the
    subject (split folds by it); ``templates[i]`` the template the prompt was written from;
    ``classes`` the sorted class names (empty for regression)."""

    task: str
    kind: str
    prompts: list[str]
    subjects: list[str]
    labels: list
    groups: list[str]
    templates: list[str]
    classes: list[str] = field(default_factory=list)
    description: str = ""

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def n_subjects(self) -> int:
        return len(set(self.groups))


def period(atomic_number: int) -> int:
    """Period (row) of the periodic table of the element with this atomic number."""
    for p, end in enumerate(PERIOD_ENDS, start=1):
        if atomic_number <= end:
            return p
    raise ValueError(f"atomic number {atomic_number} is beyond the 7 periods (1–118)")


def _check_task(task: str) -> ProbeTask:
    if task not in TASKS:
        raise KeyError(f"unknown probing task {task!r}; known: {', '.join(TASKS)}")
    return TASKS[task]


def probing_set(
    task: str,
    fb: FactBase | None = None,
    per_subject: int | None = 8,
    which: str = "all",
    split: str = "train",
    seed: int = 0,
) -> ProbingSet:
    """The labelled prompts of ``task`` (see :data:`TASKS`).

    ``which``: ``"all"`` templates of the subject type's relations, ``"own"`` (only the probed
    relation's: the prompt asks for the attribute) or ``"others"`` (never the probed relation's).
    ``per_subject``: templates sampled per subject (seeded; None = every one). ``split``: the
    fact base's ``"train"`` templates or ``"heldout"`` paraphrases.
    """
    t = _check_task(task)
    if which not in ("all", "own", "others"):
        raise ValueError(f"which must be 'all', 'own' or 'others', got {which!r}")
    fb = fb or FactBase.load()
    facts = fb.facts(t.relation)
    pairs: list[tuple[str, str | float]]
    if t.label == "continent":
        continent = {f.subject: f.object for f in fb.facts("country_continent")}
        pairs = [(f.subject, continent[f.object]) for f in facts if f.object in continent]
    elif t.label == "period":
        pairs = [(f.subject, str(period(int(f.object)))) for f in facts]
    elif t.label == "number":
        pairs = [(f.subject, float(f.object)) for f in facts]
    else:
        pairs = [(f.subject, f.object) for f in facts]
    if t.max_classes is not None:
        counts = Counter(label for _, label in pairs)
        keep = {c for c, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[: t.max_classes]}
        pairs = [(s, label) for s, label in pairs if label in keep]
    relations = SUBJECT_RELATIONS[t.subject_type]
    if which == "own":
        relations = (t.relation,)
    elif which == "others":
        relations = tuple(r for r in relations if r != t.relation)
        if not relations:
            raise ValueError(f"task {task!r}: its subjects appear only in {t.relation!r} templates; use which='all'")
    pool = [tpl for r in relations for tpl in templates(r, split)]
    rng = random.Random(seed)
    out = ProbingSet(
        task=task, kind=t.kind, prompts=[], subjects=[], labels=[], groups=[], templates=[], description=t.description
    )
    for subject, label in sorted(pairs):
        chosen = pool if per_subject is None or per_subject >= len(pool) else rng.sample(pool, per_subject)
        for tpl in chosen:
            out.prompts.append(tpl.format(subject))
            out.subjects.append(subject)
            out.labels.append(label)
            out.groups.append(subject)
            out.templates.append(tpl)
    if t.kind == "classification":
        out.classes = sorted(set(out.labels))
    return out


__all__ = ["TASKS", "ProbeTask", "ProbingSet", "period", "probing_set"]
