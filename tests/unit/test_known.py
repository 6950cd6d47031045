"""The one "the model knows this fact" rule: top-1 next token = the target's informative first token."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from gpt2_interp.analysis.known import informative, known_facts, knows
from gpt2_interp.editing.evaluate import counterfact_requests, known_cases
from gpt2_interp.facts.base import FactBase
from gpt2_interp.facts.templates import templates
from gpt2_interp.model import HookedGPT2

from ..conftest import TINY


def always_predicts(token_str: str) -> HookedGPT2:
    """A hand-made model whose next token is ``token_str`` after every prompt: the final norm outputs
    the constant e₀ (gain 0, bias e₀) and the (untied) unembedding maps e₀ to that token alone."""
    model = HookedGPT2(replace(TINY, tied_embeddings=False), seed=0).eval()
    tok = model.tokenizer.encode_ids(token_str)
    assert len(tok) == 1, tok
    with torch.no_grad():
        model.ln_final.w.zero_()
        model.ln_final.b.zero_()
        model.ln_final.b[0] = 1.0
        W_U = model._modules["unembed"].W_U
        W_U.zero_()
        W_U[0, tok[0]] = 10.0
    return model


def greedy_first_token(model, prompts):
    """The first greedily generated token after BOS + each prompt (one prompt at a time, KV-cache path)."""
    out = []
    for p in prompts:
        tokens = model.to_tokens(p)
        gen = model.generate(tokens, max_new_tokens=1, do_sample=False, stop_at_eos=False)
        out.append(int(gen[0, -1]))
    return out


def test_informative_refuses_a_whitespace_only_first_token(tiny):
    # GPT-2's tokenizer: "  89" (two spaces) is [" ", " 89"], as SmolLM2 splits " 89" into " ", "8", "9"
    assert tiny.to_str_tokens("  89", prepend_bos=False)[0] == " "
    assert not informative(tiny, "  89")
    assert informative(tiny, " 89") and informative(tiny, " Paris") and informative(tiny, "Paris")
    with pytest.raises(ValueError, match="target"):
        informative(tiny, " ")


def test_a_top1_match_on_a_bare_space_is_not_knowing():
    space = always_predicts(" ")
    prompts = ["The capital of France is", "Mount Everest is in"]
    assert greedy_first_token(space, prompts) == [220, 220]  # the model does predict " " (GPT-2's id 220)
    assert knows(space, prompts, ["  89", "  Nepal"]) == [False, False]  # first token " ": refused
    digits = always_predicts(" 89")
    assert knows(digits, prompts, [" 89", " 90"]) == [True, False]  # the same model, an informative first token
    assert knows(digits, prompts, [" 89 metres", " 89"]) == [True, True]  # only the first token counts


def test_knows_matches_greedy_generation_on_the_fact_model(facts_model):
    fb = FactBase.load()
    facts = fb.facts()[::25]  # spread over relations
    # held-out prompts: the fact model knows every fact on its training prompts, not all on these
    prompts = [templates(f.relation, "heldout")[0].format(f.subject) for f in facts]
    greedy = greedy_first_token(facts_model, prompts)
    want = [
        g == facts_model.tokenizer.encode_ids(f.target)[0]
        and facts_model.to_str_tokens(f.target, prepend_bos=False)[0].strip() != ""
        for f, g in zip(facts, greedy)
    ]
    assert 0 < sum(want) < len(want)  # some known, some not: the comparison can fail either way
    assert knows(facts_model, prompts, [f.target for f in facts], batch_size=5) == want
    assert known_facts(facts_model, fb, facts, batch_size=7, split="heldout") == [f for f, w in zip(facts, want) if w]
    assert known_facts(facts_model, fb, facts) == facts  # the training prompts: all known (greedy says so too)
    assert all(
        g == facts_model.tokenizer.encode_ids(f.target)[0]
        for f, g in zip(
            facts, greedy_first_token(facts_model, [templates(f.relation, "train")[0].format(f.subject) for f in facts])
        )
    )


def test_knows_checks_its_arguments(tiny):
    with pytest.raises(ValueError, match="same length"):
        knows(tiny, ["a", "b"], [" x"])
    with pytest.raises(TypeError, match="sequences of strings"):
        knows(tiny, "a", " x")
    with pytest.raises(ValueError, match="batch_size"):
        knows(tiny, ["a"], [" x"], batch_size=0)
    assert knows(tiny, [], []) == []


def test_known_cases_keep_exactly_the_cases_greedy_decoding_starts_right(facts_model):
    fb = FactBase.load()
    pool = counterfact_requests(fb, n=len(fb), seed=4)[:60]
    greedy = greedy_first_token(facts_model, [c.request.text for c in pool])
    want = [c for c, g in zip(pool, greedy) if g == facts_model.tokenizer.encode_ids(c.target_true)[0]]
    got = known_cases(facts_model, len(want), seed=4, batch_size=60)
    assert [c.request.text for c in got] == [c.request.text for c in want]


def test_the_evaluations_known_flag_follows_the_rule():
    from gpt2_interp.editing.evaluation import CounterfactCase, known_flags

    space = always_predicts(" ")
    cases = [
        CounterfactCase.of({"prompt": "{} is", "subject": "Everest", "target": " 1", "target_true": t}, i)
        for i, t in enumerate(["  8848", " Nepal"])
    ]
    cases.append(CounterfactCase.of({"prompt": "{} is", "subject": "Everest", "target": " 1"}, 2))  # no true target
    assert known_flags(space, cases) == [False, False, False]  # top-1 " " matches "  8848"'s first token: refused
    nepal = always_predicts(" Nepal")
    assert known_flags(nepal, cases, batch_size=1) == [False, True, False]
