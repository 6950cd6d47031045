"""The fact base: real-world (relation, subject, object) facts with their prompts.

``FactBase.load()`` reads the shipped ``data/facts.jsonl`` (built by
:mod:`gpt2_interp.facts.build`); prompts come from
:mod:`gpt2_interp.facts.templates`. A prompt is fed to a model as
BOS + prompt, and the model must continue with ``fact.target`` = ``" " + object``.
``FactBase.cases()`` gives the plain ``(prompt, subject, target)`` triples that analysis
and editing take, so those layers need not know the fact base.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from gpt2_interp.facts.templates import RELATIONS, templates

from ..core.boundary import boundary

SPLITS = ("train", "heldout")


@boundary
@dataclass(frozen=True, order=True)
class Fact:
    """One fact, e.g. ``Fact("country_capital", "France", "Paris")``: the ``relation`` (a name of
    :mod:`~gpt2_interp.facts.templates`), the ``subject`` and the ``object`` (without a leading space;
    :attr:`target` adds it)."""

    relation: str
    subject: str
    object: str

    @property
    def target(self) -> str:
        """The text the model must produce after a prompt: ``" " + object``."""
        return " " + self.object


def _rng(rng: random.Random | int | None) -> random.Random:
    return rng if isinstance(rng, random.Random) else random.Random(rng)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")


@boundary
class FactBase:
    """An immutable collection of facts grouped by relation."""

    def __init__(self, facts: list[Fact]) -> None:
        self._facts: dict[str, list[Fact]] = defaultdict(list)
        for fact in sorted(set(facts)):
            if fact.relation not in RELATIONS:
                raise ValueError(f"fact {fact} has an unknown relation")
            self._facts[fact.relation].append(fact)
        self._by_object: dict[tuple[str, str], list[Fact]] = defaultdict(list)
        for fact in self.facts():
            self._by_object[fact.relation, fact.object].append(fact)

    @classmethod
    def load(cls, path: str | Path | None = None) -> FactBase:
        """Load a JSONL fact file; by default the shipped ``facts.jsonl``."""
        if path is None:
            text = resources.files("gpt2_interp.facts").joinpath("data/facts.jsonl").read_text(encoding="utf-8")
        else:
            text = Path(path).read_text(encoding="utf-8")
        rows = (json.loads(line) for line in text.splitlines() if line.strip())
        return cls([Fact(r["relation"], r["subject"], r["object"]) for r in rows])

    @property
    def relations(self) -> list[str]:
        """Relations that have facts, in the canonical ``RELATIONS`` order."""
        return [r for r in RELATIONS if self._facts.get(r)]

    def __len__(self) -> int:
        return sum(len(v) for v in self._facts.values())

    def facts(self, relation: str | None = None) -> list[Fact]:
        """All facts (sorted), or those of one relation."""
        if relation is None:
            return [f for r in self.relations for f in self._facts[r]]
        if relation not in RELATIONS:
            raise KeyError(f"unknown relation {relation!r}")
        return list(self._facts.get(relation, []))

    def objects(self, relation: str) -> list[str]:
        """The distinct objects of a relation, sorted."""
        return sorted({f.object for f in self.facts(relation)})

    def subject_texts(self) -> list[str]:
        """Every subject as the model meets it: at the start of a text and after a space. Their token
        embeddings set the causal-trace noise scale (``tracing.embedding_std``, ROME's choice)."""
        return [s for f in self.facts() for s in (f.subject, " " + f.subject)]

    def prompts(self, fact: Fact, split: str = "train") -> list[str]:
        """The fact's subject in every template of ``split`` ("train"/"heldout")."""
        _check_split(split)
        return [t.format(fact.subject) for t in templates(fact.relation, split)]

    def cases(
        self, facts: list[Fact] | None = None, split: str = "train", template: int = 0
    ) -> list[tuple[str, str, str]]:
        """``(prompt, subject, target)`` for each of ``facts`` (default: all), prompted with template
        ``template`` of ``split`` (``"train"`` or ``"heldout"``) — the plain cases ``average_trace``
        and friends take. Another split raises ValueError, a template index a relation lacks IndexError."""
        _check_split(split)
        out = []
        for f in self.facts() if facts is None else facts:
            ts = templates(f.relation, split)
            if not -len(ts) <= template < len(ts):
                raise IndexError(f"template {template} is out of range: {f.relation} has {len(ts)} {split} templates")
            out.append((ts[template].format(f.subject), f.subject, f.target))
        return out

    def neighbourhood(self, fact: Fact, n: int = 10, rng: random.Random | int | None = None) -> list[str]:
        """CounterFact neighbourhood prompts: other subjects with the same object.

        Returns up to ``n`` prompts (first training template) about other subjects
        of ``fact.relation`` whose true object is ``fact.object`` -- after editing
        ``fact`` they should still yield ``fact.target``. The first ``n`` subjects
        in sorted order, or a random sample when ``rng`` is given.
        """
        same = self._by_object[fact.relation, fact.object]
        others = [f for f in same if f.subject != fact.subject]
        if rng is not None and len(others) > n:
            others = sorted(_rng(rng).sample(others, n))
        template = templates(fact.relation, "train")[0]
        return [template.format(f.subject) for f in others[:n]]

    def counterfactual(self, fact: Fact, rng: random.Random | int) -> Fact:
        """The same relation and subject with another object of the relation."""
        choices = [o for o in self.objects(fact.relation) if o != fact.object]
        if not choices:
            raise ValueError(f"relation {fact.relation} has no other object")
        return Fact(fact.relation, fact.subject, _rng(rng).choice(choices))

    def sentences(self, split: str = "train") -> list[str]:
        """Every fact in every template of ``split``, as ``prompt + target + "."``."""
        _check_split(split)
        return [p + f.target + "." for f in self.facts() for p in self.prompts(f, split)]
