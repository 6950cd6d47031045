"""The ffn_vocab experiment through the runner, in its quick mode: each reported coherence rechecked from scratch."""

from __future__ import annotations

import pytest

from gpt2_interp.analysis.vocab import neuron_vocab
from gpt2_interp.experiments import run_experiment
from gpt2_interp.facts.base import FactBase
from gpt2_interp.io import tokenizer as tok

pytestmark = pytest.mark.slow  # two layers × 1,024 neurons projected on the vocabulary, 8 searches


def test_quick_concept_neurons_have_the_coherence_they_report(facts_model, tmp_path):
    res = run_experiment("ffn_vocab", facts_model, quick=True, out=tmp_path, progress=False)
    md = (tmp_path / "ffn_vocab" / "gpt2-facts" / "quick" / "ffn_vocab.md").read_text()
    data = res.data
    assert "| relation |" in md and data["layers"] == [4, 5]
    fb = FactBase.load()
    # the classes, built here with GPT-2's tokenizer directly: first token of " " + object
    classes = {r: {tok.encode(" " + o)[0] for o in fb.objects(r)} for r in fb.relations}
    corpus = {t for s in fb.sentences("train") for t in tok.encode(s)}
    assert data["class_sizes"] == {r: len(c) for r, c in classes.items()}
    assert data["chance"]["country_continent"] == pytest.approx(
        len(classes["country_continent"] & corpus) / len(corpus), rel=1e-5
    )
    assert data["concept_neurons"]
    for row in data["concept_neurons"]:  # recheck each reported coherence from scratch
        top = neuron_vocab(facts_model, row["layer"], [row["neuron"]], k=data["k"]).top_ids[0]
        assert sum(int(t) in classes[row["relation"]] for t in top) / data["k"] == pytest.approx(row["coherence"])
        assert row["coherence"] >= data["min_coherence"]
    assert all(len(hits) == 3 for hits in data["search"].values())
