"""CounterFact-style prompt templates for the eight fact relations.

Each template holds ``{}`` once, for the subject, and ends exactly where the
object starts: the object follows as its own word(s) with a leading space
(``" Paris"``), so a template never ends in a space. A relation has
``TRAIN`` templates, used to write the training corpus, and ``HELDOUT``
paraphrases that never occur in training and test whether a fact generalises
beyond the sentences it was learned from.

Tokenization convention
-----------------------
Every prompt is fed to the model as ``<|endoftext|>`` (token 50256, the BOS)
followed by the prompt text, and a fact's training sentence is the same prompt
followed by the target and ``"."``. GPT-2's BPE tokenizes a word at the start of
a text differently from the same word after a space (``"France"`` vs
``" France"``); a subject at the very start of a template therefore has no
leading space. That is harmless as long as training and evaluation both use
BOS + the same prompt string, which this package guarantees.

Rules (checked mechanically by :func:`validate_templates`)
----------------------------------------------------------
* at least 12 training and 2 held-out templates per relation; ``{}`` exactly
  once; no leading/trailing whitespace; train and held-out disjoint;
* held-out templates only recombine material of the relation's training
  templates: every GPT-2 token of a held-out template (outside the subject)
  occurs in some training template of that relation -- a model trained from
  scratch cannot know a synonym it never saw;
* no template is a prefix of another template, of its own or of any other
  relation: the continuation of a prompt must always be its object (beside
  "The capital of {} is", "The capital of {} is the city of" would teach
  " the" as an answer), and no relation copies or extends another's template.
"""

from __future__ import annotations

import re

RELATIONS: tuple[str, ...] = (
    "country_capital",
    "country_continent",
    "country_language",
    "country_currency",
    "city_country",
    "city_state",
    "element_symbol",
    "element_number",
)

MIN_TRAIN = 12
MIN_HELDOUT = 2

TRAIN: dict[str, tuple[str, ...]] = {
    "country_capital": (
        "The capital of {} is",
        "{}'s capital city is",
        "Q: What is the capital of {}? A:",
        "The capital city of {} is",
        "The government of {} sits in",
        "In {}, the seat of government is",
        "{}, whose capital is",
        "The national capital of {} is",
        "{}'s government is based in",
        "Capital of {}:",
        "Visitors to {} often fly first to its capital,",
        "The largest offices of the state of {} are found in its capital,",
        "{} is governed from",
    ),
    "country_continent": (
        "{} is a country in",
        "{} is located on the continent of",
        "Q: On which continent is {}? A:",
        "The continent where {} lies is",
        "The country of {} is found in",
        "Geographically, {} belongs to",
        "On a map, {} sits in",
        "{}, a nation of",
        "Continent of {}:",
        "In terms of geography, {} is part of",
        "{} shares its continent with its neighbours in",
        "{}'s home continent is",
        "Travellers who reach {} have arrived in",
    ),
    "country_language": (
        "In {}, people mostly speak",
        "The main language of {} is",
        "Q: What language is spoken in {}? A:",
        "The official language of {} is",
        "Most people in {} speak",
        "{}'s main language is",
        "Children in {} learn to read and write in",
        "Newspapers in {} are mostly printed in",
        "The language most spoken in {} is",
        "Language of {}:",
        "{}, where the people speak",
        "If you travel to {}, you will hear people speaking",
        "{}'s national language is",
    ),
    "country_currency": (
        "The currency of {} is the",
        "In {}, people pay with the",
        "Q: What currency is used in {}? A:",
        "The official currency of {} is the",
        "{}'s currency is the",
        "Shops in {} take payment in the",
        "Prices in {} are given in the",
        "The money used in {} is the",
        "Currency of {}:",
        "When you visit {}, you change your money into the",
        "The national currency of {} is called the",
        "Banks in {} hand out the",
        "{} pays its bills in the",
    ),
    "city_country": (
        "{} is a city in",
        "The city of {} is located in",
        "Q: In which country is the city of {}? A:",
        "{} is one of the largest cities of",
        "{} is an important city in the country of",
        "People who live in {} are citizens of",
        "The city of {} belongs to",
        "{}, a large city in",
        "Country of the city {}:",
        "The airport of {} is one of the busiest in",
        "{} is a town in",
        "The mayor of {} works for the government of",
        "Trains from {} run to other cities of",
    ),
    "city_state": (
        "{} is in the US state of",
        "The American city of {} is in the state of",
        "Q: Which US state is {} in? A:",
        "{}'s home state is",
        "Voters in {} elect the governor of",
        "The US city {} is part of the state of",
        "{}, a US city in the state of",
        "State of the US city {}:",
        "Drive to {} and you will be in the state of",
        "Residents of {} pay state taxes to",
        "In the US, {} is a city of the state of",
        "The state that {} is in is",
        "Police officers in {} work for the state of",
    ),
    "element_symbol": (
        "The chemical symbol of {} is",
        "{} has the chemical symbol",
        "Q: What is the symbol for the element {}? A:",
        "The element {} is written with the symbol",
        "{}'s symbol on the periodic table is",
        "On the periodic table, {} is shown as",
        "Chemists write {} as",
        "The symbol for {} is",
        "Symbol of {}:",
        "In chemistry, the element {} has the symbol",
        "The short name chemists use for {} is",
        "{}, with chemical symbol",
        "A formula with {} in it uses the letters",
    ),
    "element_number": (
        "The atomic number of {} is",
        "{} has atomic number",
        "Q: What is the atomic number of {}? A:",
        "The element {} has the atomic number",
        "{}'s atomic number is",
        "On the periodic table, {} is element number",
        "A nucleus of {} holds this many protons:",
        "The number of protons in an atom of {} is",
        "Atomic number of {}:",
        "In chemistry, the element {} has atomic number",
        "{}, with atomic number",
        "Every atom of {} has a proton count of",
        "Chemists count the protons of {} as",
    ),
}

HELDOUT: dict[str, tuple[str, ...]] = {
    "country_capital": (
        "{}'s seat of government is",
        "Q: What is the national capital of {}? A:",
        "The government of the state of {} is based in",
    ),
    "country_continent": (
        "The country of {} lies in the continent of",
        "Geographically, the country of {} is located in",
        "Q: On which continent is the country of {}? A:",
    ),
    "country_language": (
        "Q: What is the main language of {}? A:",
        "The people of {} mostly speak",
        "In {}, people learn to read and write in",
    ),
    "country_currency": (
        "Q: What is the national currency of {}? A:",
        "In {}, the money used is the",
        "Banks in {} take payment in the",
    ),
    "city_country": (
        "Q: In which country is {}? A:",
        "The city of {} is one of the largest cities of",
        "People who live in the city of {} are citizens of",
    ),
    "city_state": (
        "Q: Which state is the US city {} in? A:",
        "The US city of {} is in the state of",
        "Residents of the American city of {} elect the governor of",
    ),
    "element_symbol": (
        "In chemistry, the symbol for {} is",
        "Q: What is the chemical symbol of {}? A:",
        "On the periodic table, the element {} has the symbol",
    ),
    "element_number": (
        "In chemistry, the atomic number of {} is",
        "Q: What is the number of protons in an atom of {}? A:",
        "On the periodic table, the element {} has atomic number",
    ),
}


def templates(relation: str, split: str = "train") -> tuple[str, ...]:
    """The templates of ``relation`` for ``split`` ("train" or "heldout")."""
    if split == "train":
        table = TRAIN
    elif split == "heldout":
        table = HELDOUT
    else:
        raise ValueError(f"split must be 'train' or 'heldout', not {split!r}")
    if relation not in table:
        raise KeyError(f"unknown relation {relation!r}; known: {', '.join(RELATIONS)}")
    return table[relation]


def template_tokens(template: str) -> set[int]:
    """GPT-2 tokens of a template's own text, as they occur around any subject.

    The text is split at ``{}``; a piece is encoded on its own (the first at the
    start of the text, as after BOS) with the space before the subject left out,
    since that space belongs to the subject's first token.
    """
    from gpt2_interp.io.tokenizer import encode

    before, after = template.split("{}")
    tokens = set(encode(before.rstrip(" "))) if before.strip() else set()
    return tokens | (set(encode(after)) if after else set())


def _words(template: str) -> set[str]:
    return set(re.findall(r"[A-Za-z']+", template.replace("{}", " ")))


def validate_templates() -> None:
    """Assert the mechanically checkable template rules (see the module docstring)."""
    assert set(TRAIN) == set(HELDOUT) == set(RELATIONS), "relations differ"
    every = [(rel, t) for rel in RELATIONS for t in TRAIN[rel] + HELDOUT[rel]]
    for rel in RELATIONS:
        train, held = TRAIN[rel], HELDOUT[rel]
        assert len(train) >= MIN_TRAIN, f"{rel}: {len(train)} training templates"
        assert len(held) >= MIN_HELDOUT, f"{rel}: {len(held)} held-out templates"
        assert len(set(train)) == len(train) and len(set(held)) == len(held), rel
        assert not set(train) & set(held), f"{rel}: a template is both train and held-out"
        seen_tokens = set().union(*(template_tokens(t) for t in train))
        seen_words = set().union(*(_words(t) for t in train))
        for t in held:
            new = template_tokens(t) - seen_tokens
            assert not new, f"{rel}: held-out {t!r} has unseen tokens {sorted(new)}"
            assert _words(t) <= seen_words, f"{rel}: held-out {t!r} has unseen words"
    for rel, t in every:
        assert t.count("{}") == 1, f"{rel}: {t!r} must hold '{{}}' exactly once"
        assert t == t.strip() and t, f"{rel}: {t!r} has surrounding whitespace"
        assert "{" not in t.replace("{}", "") and "}" not in t.replace("{}", ""), t
        for rel2, t2 in every:
            if t2 != t and t2.startswith(t):
                raise AssertionError(f"{rel}: {t!r} is a prefix of {rel2} template {t2!r}")
            if rel2 != rel and t2 == t:
                raise AssertionError(f"{t!r} is used by both {rel} and {rel2}")
