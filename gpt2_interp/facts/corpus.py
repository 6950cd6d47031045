"""Training documents for the embedded fact model.

The corpus holds only training templates (held-out paraphrases never appear):

* one document per (fact, training template): ``prompt + " " + object + "."``;
* one short multi-fact document per subject with facts in several relations
  (countries, elements, US cities): one sentence per relation, each with a
  randomly chosen training template, joined by spaces -- so subjects are also
  seen mid-text (with a leading space).

The order is a deterministic shuffle. The trainer tokenizes each text as
``[50256] + encode(text) + [50256]``; :func:`corpus_sha256` identifies a corpus.
"""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict

from gpt2_interp.facts.base import Fact, FactBase
from gpt2_interp.facts.templates import templates


def multi_fact_texts(fb: FactBase, seed: int = 0) -> list[str]:
    """One multi-sentence text per subject that has facts in two or more relations."""
    rng = random.Random(seed)
    by_subject: dict[str, list[Fact]] = defaultdict(list)
    for fact in fb.facts():
        by_subject[fact.subject].append(fact)
    texts = []
    for subject in sorted(by_subject):
        facts = by_subject[subject]
        if len(facts) < 2:
            continue
        facts = rng.sample(facts, len(facts))
        texts.append(
            " ".join(rng.choice(templates(f.relation, "train")).format(subject) + f.target + "." for f in facts)
        )
    return texts


def training_texts(fb: FactBase, seed: int = 0) -> list[str]:
    """All training documents, deterministically shuffled by ``seed``."""
    texts = fb.sentences("train") + multi_fact_texts(fb, seed)
    random.Random(seed).shuffle(texts)
    return texts


def corpus_sha256(texts: list[str]) -> str:
    """sha256 hex digest of the texts (in order), for reproducibility records."""
    h = hashlib.sha256()
    for text in texts:
        h.update(text.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()


def corpus_id(texts: list[str]) -> str:
    """A short identifier of the corpus: the first 12 hex digits of its sha256."""
    return corpus_sha256(texts)[:12]
