"""The mass_editing_keys experiment, quick mode through the runner, its counts against the tokenizer."""

from __future__ import annotations

import collections

import pytest

from gpt2_interp.editing.evaluate import known_cases
from gpt2_interp.experiments import run_experiment
from gpt2_interp.facts.base import FactBase

pytestmark = [
    pytest.mark.slow,  # two small MEMIT batches
    pytest.mark.filterwarnings("ignore:tokenizer encode adds no BOS"),
]  # only the last token is read


def _key(tok, case):
    return tok.encode(case.request.prompt.split("{}")[0] + case.request.subject)[-1]


def test_counts_of_shared_keys_match_the_tokenizer(facts_model, tmp_path):
    res = run_experiment("mass_editing_keys", facts_model, quick=True, out=tmp_path, progress=False)
    data = res.data
    tok = facts_model.tokenizer
    fb = FactBase.load()
    subjects = {f.subject for f in fb.facts()}
    assert data["fact_base"] == {
        "facts": len(fb.facts()),
        "subjects": len(subjects),
        "subject_final_tokens": len({tok.encode(" " + s)[-1] for s in subjects}),
    }
    pool = known_cases(facts_model, 40, 0)
    keys = [_key(tok, c) for c in pool]
    assert data["known_pool"] == {
        "n": len(pool),
        "subjects": len({c.request.subject for c in pool}),
        "key_tokens": len(set(keys)),
    }
    drawn, distinct = data["runs"]
    counts = collections.Counter(keys[:3])
    assert drawn["set"] == "as drawn" and drawn["requests_sharing_a_key"] == sum(v for v in counts.values() if v > 1)
    assert distinct["requests_sharing_a_key"] == 0 and distinct["n"] == drawn["n"] == 3
    assert all(0 <= r[k] <= 1 for r in data["runs"] for k in ("es", "ps", "ns"))
    assert "| distinct key tokens | 3 | 0 |" in res.tables()["mass_editing_keys"]
