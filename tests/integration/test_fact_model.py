"""The shipped gpt2-facts knows its facts (quality bars measured on the shipped weights)."""

from __future__ import annotations

import random

import pytest

from gpt2_interp.factmodel.quality import first_token_accuracy, lens_curve
from gpt2_interp.facts import FactBase


@pytest.fixture(scope="module")
def fb():
    return FactBase.load()


def test_is_a_full_vocabulary_gpt2(facts_model):
    c = facts_model.cfg
    assert c.d_vocab == 50257 and 6 <= c.n_layer <= 8 and 256 <= c.d_model <= 384 and c.n_head == 8
    assert facts_model.W_U.data_ptr() == facts_model.W_E.data_ptr()  # tied


@pytest.mark.slow
def test_knows_training_facts(facts_model, fb):
    acc = first_token_accuracy(facts_model, fb, "train", limit=400)
    assert acc["mean"] >= 0.95, acc["mean"]


@pytest.mark.slow
def test_generalises_to_heldout_paraphrases(facts_model, fb):
    acc = first_token_accuracy(facts_model, fb, "heldout", limit=400)
    assert acc["mean"] >= 0.80, acc["mean"]


@pytest.mark.slow
def test_logit_lens_answer_rank_improves_with_depth(facts_model, fb):
    curve = lens_curve(facts_model, fb, limit=200)
    assert curve["mrr"][-1] > curve["mrr"][0]
    assert curve["improves_embed_to_last"] >= 0.9
    assert curve["top1"][-1] >= 0.95


def test_greedy_generation_completes_the_sentence(facts_model, fb):
    facts = random.Random(0).sample(fb.facts(), 20)
    outs = facts_model.generate([fb.prompts(f)[0] for f in facts], max_new_tokens=12, do_sample=False)
    good = sum(out == fb.prompts(f)[0] + f.target + "." for f, out in zip(facts, outs))
    assert good >= 18, list(zip(outs, facts))
