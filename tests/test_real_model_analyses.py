"""The rome_counterfact analysis's shards checked against an independent computation: one unsharded run."""

from __future__ import annotations

import json

import pytest

from .conftest import script

pytestmark = pytest.mark.slow  # runs ROME evaluations: minutes


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
