"""Two-hop prompts from the fact base: a city's country, then that country's capital (or continent, language,
currency), asked in one prompt that names only the city.

Two relations *chain* when the objects of the first are subjects of the second (``city_country`` → Denmark →
``country_capital``); :func:`two_hop_chains` finds every such pair in a fact base. A chain has a prompt when
:data:`TWO_HOP_TEMPLATES` holds one for it: ``"The capital of the country that contains {} is"`` with the city
as ``{}``, so that the answer (`` Copenhagen``) needs the intermediate entity (Denmark, the *bridge*), which
the prompt never names. These templates are not among the fact model's training templates: a model that answers
has composed the two facts itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.boundary import boundary
from .base import Fact, FactBase

#: The two-hop prompt of each chain ``(first relation, second relation)``: ``{}`` is the first fact's subject.
TWO_HOP_TEMPLATES: dict[tuple[str, str], str] = {
    ("city_country", "country_capital"): "The capital of the country that contains {} is",
    ("city_country", "country_continent"): "The continent of the country that contains {} is",
    ("city_country", "country_language"): "The language of the country that contains {} is",
    ("city_country", "country_currency"): "The currency of the country that contains {} is",
}


@boundary
@dataclass(frozen=True)
class TwoHopCase:
    """One two-hop prompt: ``prompt`` (e.g. ``"The capital of the country that contains Aalborg is"``), its
    ``subject`` (Aalborg), the ``bridge`` entity the first fact leads to (Denmark, never in the prompt), and
    the two facts it chains, ``first`` (``city_country``) and ``second`` (``country_capital``); the answer
    is ``second.target`` (`` Copenhagen``)."""

    prompt: str
    subject: str
    bridge: str
    first: Fact
    second: Fact

    @property
    def target(self) -> str:
        """The text the model must produce after the prompt: ``" " + second.object``."""
        return self.second.target


@boundary
def two_hop_chains(facts: FactBase) -> dict[tuple[str, str], int]:
    """Every pair of relations ``(first, second)`` of ``facts`` that chains — an object of ``first`` is a
    subject of ``second`` — with the number of ``first`` facts whose object is such a subject."""
    subjects = {r: {f.subject for f in facts.facts(r)} for r in facts.relations}
    out: dict[tuple[str, str], int] = {}
    for first in facts.relations:
        for second in facts.relations:
            n = sum(f.object in subjects[second] for f in facts.facts(first))
            if first != second and n:
                out[first, second] = n
    return out


@boundary
def two_hop_cases(
    facts: FactBase, second: str = "country_capital", first: str = "city_country", n: int | None = None
) -> list[TwoHopCase]:
    """The two-hop prompts of the fact base ``facts`` for the chain ``first`` → ``second`` (see
    :data:`TWO_HOP_TEMPLATES`), one per ``first`` fact whose object has exactly one ``second`` fact, in the fact
    base's order (the first ``n``; all when None). Left out, as no test of composition: a subject that names
    its bridge or its answer (the city Luxembourg, Mexico City; Paris, the capital of France), and a bridge that
    is its own answer (Singapore). A chain without a template raises ValueError listing those with one."""
    if (first, second) not in TWO_HOP_TEMPLATES:
        raise ValueError(
            f"no two-hop template for {first} → {second}; chains with one: "
            + ", ".join(f"{a} → {b}" for a, b in TWO_HOP_TEMPLATES)
        )
    if n is not None and n < 1:
        raise ValueError(f"n must be ≥ 1 or None, got {n}")
    by_subject: dict[str, list[Fact]] = {}
    for f in facts.facts(second):
        by_subject.setdefault(f.subject, []).append(f)
    template, out = TWO_HOP_TEMPLATES[first, second], []
    for f in facts.facts(first):
        hops = by_subject.get(f.object, [])
        if len(hops) != 1 or f.object in f.subject or hops[0].object in f.subject or f.object == hops[0].object:
            continue
        out.append(TwoHopCase(template.format(f.subject), f.subject, f.object, f, hops[0]))
        if n is not None and len(out) == n:
            break
    return out


__all__ = ["TWO_HOP_TEMPLATES", "TwoHopCase", "two_hop_cases", "two_hop_chains"]
