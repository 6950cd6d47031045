"""``gpt2-interp graph train|build``: the transcoders it trains load back for the model, the graph it saves is
the API's graph built with those transcoders (pruned and annotated alike), its page is written; bad input is
one line before any work."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import gpt2_interp
from gpt2_interp.analysis.features.sae_train import heldout_windows
from gpt2_interp.cli import main
from gpt2_interp.graphs.annotate import annotate_graph
from gpt2_interp.graphs.attribution import AttributionConfig, AttributionGraph, attribute
from gpt2_interp.graphs.prune import prune_graph
from gpt2_interp.graphs.transcoder import TranscoderSet, TranscoderTrainConfig, new_transcoders
from gpt2_interp.model import HookedGPT2

PROMPT = "The capital of France is"
TRAIN = ["--steps", "4", "--batch-size", "64", "--d-sae", "48", "--k", "6", "--skip", "--context", "16"]
TRAIN += ["--buffer-tokens", "256", "--forward-batch", "8", "--eval-windows", "8"]


@pytest.fixture
def models(facts_model, monkeypatch):
    """``load("gpt2-facts")`` answers the model the test run shares; ``load("facts-other")`` a model of its shape with
    other weights (and every name asked for is recorded)."""
    other, asked = HookedGPT2(facts_model.cfg, seed=3), []

    def load(name, device=None, dtype=None):
        asked.append(name)
        return {"gpt2-facts": facts_model, "facts-other": other}[name]

    monkeypatch.setattr(gpt2_interp, "load", load)
    return facts_model, asked


def test_trained_transcoders_build_the_apis_graph_saved_as_json_and_a_page(models, tmp_path, capsys):
    model, asked = models
    folder, out, page = tmp_path / "tc", tmp_path / "graph.json", tmp_path / "graph.html"
    assert main(["graph", "train", "--out", str(folder), *TRAIN]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"6 topk transcoders (48 features each, with skips) of gpt2-facts saved to {folder}")
    assert "windows of facts (16 tokens each)" in lines[0] and len(lines) == 2 + 6  # a row per layer
    transcoders = TranscoderSet.load(folder, model)  # checked against the model's weights
    record = transcoders[0].cfg.training
    assert record is not None and record["texts"] == "facts" and record["heldout_windows"] > 0
    argv = ["graph", "build", "--transcoders", str(folder), "--prompt", PROMPT, "--out", str(out)]
    argv += ["--html", str(page), "--contexts", "2", "--windows", "24", "--max-logits", "3", "--batch-size", "48"]
    argv += ["--node-threshold", "0.99"]  # a few steps of training: the error nodes carry most of the influence
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert f"graph of {PROMPT!r} on gpt2-facts" in printed and f"page saved to {page}" in printed
    assert asked == ["gpt2-facts", "gpt2-facts"]  # build ran the model the transcoders record

    saved = AttributionGraph.load(out)
    ref = attribute(model, transcoders, model.to_tokens(PROMPT)[0], AttributionConfig(max_n_logits=3, batch_size=48))
    ref = annotate_graph(
        prune_graph(ref, node_threshold=0.99), model, transcoders, heldout_windows(model, record)[:24], n_contexts=2
    )
    for f in dataclasses.fields(AttributionGraph):
        a, b = getattr(saved, f.name), getattr(ref, f.name)
        assert torch.equal(a, b) if torch.is_tensor(b) else a == b, f.name
    assert saved.node_mask is not None and 0 < int(saved.node_mask[: saved.n_features].sum()) < saved.n_features
    kept = saved.node_mask[: saved.n_features].nonzero()[:, 0].tolist()
    assert saved.feature_contexts is not None and all(saved.feature_contexts[i] is not None for i in kept)
    text = page.read_text()
    assert "Attribution graph: &#x27;&lt;|endoftext|&gt;The capital of France is&#x27;" in text and "g2v-gsvg" in text


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_bad_input_to_graph_build_is_one_line_before_the_model_loads(models, tmp_path, capsys):
    model, asked = models
    folder = new_transcoders(model, TranscoderTrainConfig(d_sae=32, k=4)).save(tmp_path / "tc")  # no training record
    base = ["graph", "build", "--out", str(tmp_path / "g.json")]
    err = _error(capsys, [*base, "--transcoders", str(folder), "--prompt", "  "])
    assert "--prompt is empty; give the text whose next token the graph explains" in err
    err = _error(capsys, [*base, "--transcoders", str(tmp_path / "nowhere"), "--prompt", PROMPT])
    assert f"--transcoders {tmp_path / 'nowhere'}: no such folder" in err
    err = _error(capsys, [*base, "--transcoders", str(tmp_path), "--prompt", PROMPT])
    assert "no config.yaml; not a folder `graph train` wrote" in err
    assert asked == []  # none of these loaded a model
    err = _error(capsys, [*base, "--transcoders", str(folder), "--prompt", PROMPT, "--model", "facts-other"])
    assert (
        "trained on gpt2-facts with weights" in err and "(they were trained on gpt2-facts: --model gpt2-facts)" in err
    )
    err = _error(capsys, [*base, "--transcoders", str(folder), "--prompt", PROMPT, "--contexts", "2"])
    assert (
        "--contexts: these transcoders' training held out no windows (or records none); name a text with --texts" in err
    )
