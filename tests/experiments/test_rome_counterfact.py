"""The rome_counterfact experiment: its quick mode through the runner (scores checked against log-probabilities
computed by hand, the weights against a copy), and parts merged into the run made in one go."""

from __future__ import annotations

import pytest
import torch

from analyses.rome_counterfact import Config, parse_hparams, split_cases
from gpt2_interp.experiments import run_experiment

pytestmark = pytest.mark.slow  # ROME edits with key statistics: tens of seconds


def logprob_by_hand(model, prompt: str, target: str) -> float:
    """log P(target | BOS + prompt), summed over the target's tokens, from one unpadded forward pass."""
    p = model.to_tokens(prompt)[0].tolist()
    t = model.tokenizer.encode_ids(target)
    with torch.no_grad():
        lp = model(torch.tensor([p + t])).log_softmax(-1)[0]
    return float(sum(lp[len(p) - 1 + i, tok] for i, tok in enumerate(t)))


def test_quick_run_scores_and_restores_the_weights(facts_model, tmp_path):
    before = {k: v.clone() for k, v in facts_model.state_dict().items()}
    res = run_experiment("rome_counterfact", facts_model, quick=True, out=tmp_path, progress=False)
    d = tmp_path / "rome_counterfact" / "gpt2-facts" / "quick"
    for name in ("rome_counterfact.png", "rome_sequential.png", "rome_counterfact.md", "result.json"):
        assert (d / name).stat().st_size > 0
    md = (d / "rome_counterfact.md").read_text()
    assert "one at a time" in md and "sequential" in md
    data = res.data
    one = data["one_at_a_time"]
    assert one["summary"]["all"]["n"] == 3 and len(one["rows"]) == 3 and one["restored_exactly"]
    assert data["layer"] == 0 and one["hparams"]["v_steps"] == 5  # the model's default layer, the quick override
    assert res.provenance["settings"]["rome_hparams"]["v_steps"] == 5
    after = facts_model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # one-at-a-time and sequential edits undone
    for row in one["rows"]:  # the unedited model's P(new) on the rewrite prompt, by hand
        assert row["pre"]["p_new"] == pytest.approx(
            torch.tensor(logprob_by_hand(facts_model, row["prompt"], row["target_new"])).exp().item(), rel=1e-3
        )
        assert row["post"]["es"] in (0.0, 1.0)


# two partial runs and a whole one (~2 min); merging parts is checked in CI's lane by mass_editing's test
@pytest.mark.full
def test_parts_merge_to_the_run_made_in_one_go(facts_model, tmp_path):
    common = {
        "known_only": True,
        "tune_n": 2,
        "trace_facts": 0,
        "sequential_n": 0,
        "n_samples": 4000,
        "hparams": ["v_steps=5"],
        "layer": 0,
    }

    def go(tag, **kw):
        return run_experiment(
            "rome_counterfact", facts_model, settings={**common, **kw}, out=tmp_path, tag=tag, progress=False
        )

    one = go("one", n=4).data
    for off in (0, 2):
        go(f"o{off}", n=2, offset=off)
    folders = [str(tmp_path / "rome_counterfact" / "gpt2-facts" / f"o{off}") for off in (0, 2)]
    merged_res = go("merged", merge=folders)
    merged = merged_res.data
    rows_m, rows_o = merged["one_at_a_time"]["rows"], one["one_at_a_time"]["rows"]
    assert [r["case_id"] for r in rows_m] == [r["case_id"] for r in rows_o] == [0, 1, 2, 3]
    assert [r["subject"] for r in rows_m] == [r["subject"] for r in rows_o]
    for a, b in zip(rows_m, rows_o):
        for k in ("es", "ps", "ns"):
            assert a["post"][k] == pytest.approx(b["post"][k], abs=1e-6)
    s_m, s_o = merged["one_at_a_time"]["summary"]["all"], one["one_at_a_time"]["summary"]["all"]
    assert s_m["n"] == 4 and s_m["post"]["es"] == pytest.approx(s_o["post"]["es"], abs=1e-6)
    assert merged["one_at_a_time"]["restored_exactly"] is True
    assert [p["config"]["offset"] for p in merged["parts"]] == [0, 2]
    assert merged_res.tables()["rome_counterfact"].count("offset=") == 2
    # the tuning split (the first 2 known facts) is disjoint from the evaluation
    tune = split_cases(facts_model, 2, 2, "tune", 0)
    assert len(tune) == 2
    assert {(c.relation, c.request.subject) for c in tune}.isdisjoint({(r["relation"], r["subject"]) for r in rows_o})
    with pytest.raises(ValueError, match="overlap"):
        go("bad", merge=[folders[0], folders[0]])


def test_settings_are_checked():
    assert parse_hparams(["v_lr=1", "prefix_lengths=[3]", "corpus=brown"]) == {
        "v_lr": 1,
        "prefix_lengths": (3,),
        "corpus": "brown",
    }
    with pytest.raises(ValueError, match="hparams"):
        Config.from_settings({"hparams": "v_lr"})
    with pytest.raises(ValueError, match="trace_facts"):
        Config.from_settings({"layer": "trace", "trace_facts": "0"})
    assert Config.from_settings({"layer": "3"}).layer == 3
