"""analysis.known's whole_object and knows(prepend_bos=False) against the model's own greedy decoding and logits."""

from __future__ import annotations

import pytest
import torch

from gpt2_interp.analysis.known import informative, knows, whole_object
from gpt2_interp.analysis.tokens import target_ids
from gpt2_interp.facts.base import FactBase


def _cases(model, n: int = 2) -> list[tuple[str, str]]:
    """Facts with multi-token objects (and single-token ones), plus made-up objects the model does not say."""
    fb = FactBase.load()
    facts = [f for r in fb.relations for f in fb.facts(r)]
    multi = [f for f in facts if len(target_ids(model, f.target)) > 1][:n]
    single = [f for f in facts if len(target_ids(model, f.target)) == 1][:n]
    cases = [(fb.prompts(f)[0], f.target) for f in multi + single]
    return [*cases, ("The capital of France is", " Moon Base"), (fb.prompts(multi[0])[0], multi[0].target + " Moon")]


@pytest.mark.slow
def test_whole_object_is_greedy_decoding_of_every_target_token(facts_model):
    cases = _cases(facts_model)
    got = whole_object(facts_model, [p for p, _ in cases], [t for _, t in cases], batch_size=3)
    want = []
    for prompt, target in cases:  # the reference: greedy generation, one token at a time, compared by ids
        ids = target_ids(facts_model, target)
        gen = facts_model.generate(
            facts_model.to_tokens(prompt), max_new_tokens=len(ids), do_sample=False, stop_at_eos=False
        )
        want.append(gen[0, -len(ids) :].tolist() == ids)
    assert got == want and any(want) and not all(want)


def test_knows_without_a_bos_is_the_rule_on_the_text_as_given(facts_model):
    fb = FactBase.load()
    facts = [f for r in fb.relations for f in fb.facts(r)[:2]]
    texts, targets = [fb.prompts(f)[0] for f in facts], [f.target for f in facts]
    got = knows(facts_model, texts, targets, batch_size=5, prepend_bos=False)
    with torch.no_grad():  # the reference: one text at a time, no BOS, no padding
        top = [int(facts_model(facts_model.to_tokens(t, prepend_bos=False))[0, -1].argmax()) for t in texts]
    assert got == [t == target_ids(facts_model, y)[0] and informative(facts_model, y) for t, y in zip(top, targets)]
    # with the BOS written into the text, it is :func:`knows` on the bare prompt
    bos = facts_model.tokenizer.decode([facts_model.to_tokens("x")[0, 0].item()])
    assert knows(facts_model, [bos + t for t in texts], targets, prepend_bos=False) == knows(
        facts_model, texts, targets
    )


def test_whole_object_and_knows_refuse_mismatched_input(facts_model):
    with pytest.raises(ValueError, match="same length"):
        whole_object(facts_model, ["a", "b"], [" c"])
    with pytest.raises(TypeError, match="sequences of strings"):
        knows(facts_model, "The capital of France is", " Paris", prepend_bos=False)
