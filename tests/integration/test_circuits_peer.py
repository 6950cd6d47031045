"""Edge scores against the peer auto-circuit on the same weights, pairs and edges: EAP equal to its mask
gradient at mask 0, exact edge patching equal to its one-edge ``patch_mode`` runs (the comparison of
benchmarks/bench_circuits.py, on a tiny random GPT-2)."""

from __future__ import annotations

import pytest
import torch

from gpt2_interp.analysis.circuits import edge_patch, edge_scores, graph_of, pairs_of
from gpt2_interp.analysis.metrics import LogitDiff
from gpt2_interp.model import HookedGPT2
from tests.conftest import TINY, script

bench = script("bench_circuits", "benchmarks")


@pytest.fixture(scope="module")
def peer():
    """(our tiny model, its prompt pairs and metric, auto-circuit on its TransformerLens copy)."""
    try:
        ac = bench.import_auto_circuit()
    except ImportError as e:
        pytest.skip(f"auto-circuit is not importable ({e}): pip install auto-circuit")
    model = HookedGPT2(TINY, seed=0).eval()
    g = torch.Generator().manual_seed(0)
    clean = torch.randint(0, TINY.d_vocab, (3, 7), generator=g)
    corrupted = clean.clone()
    corrupted[:, [2, 4]] = torch.randint(0, TINY.d_vocab, (3, 2), generator=g)
    answers, wrongs = torch.tensor([11, 22, 33]), torch.tensor([44, 55, 66])
    graph = graph_of(model)
    ref = bench.to_transformer_lens(model)
    with torch.no_grad():
        torch.testing.assert_close(ref(clean), model(clean), atol=1e-4, rtol=1e-4)
    return (
        model,
        graph,
        clean,
        corrupted,
        LogitDiff(answers, wrongs),
        bench.AutoCircuit(ac, ref, graph, clean, corrupted, answers, wrongs),
    )


def test_eap_equals_auto_circuits_mask_gradient_on_every_edge(peer):
    model, graph, clean, corrupted, metric, ac = peer
    ours = edge_scores(model, clean, corrupted, metric, method="eap", progress=False).scores
    theirs = ac.eap()
    assert ours.shape == theirs.shape == (graph.n_edges,)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-3)
    assert bench.spearman(ours, theirs) > 0.999


def test_exact_edge_patching_equals_auto_circuits_one_edge_runs(peer):
    model, graph, clean, corrupted, metric, ac = peer
    eap = edge_scores(model, clean, corrupted, metric, method="eap", progress=False).scores
    sample = bench.edge_sample(eap, 9, seed=0)  # the top 3 and 6 others
    ours = edge_patch(model, graph, pairs_of(model, clean, corrupted, metric), edges=sample, progress=False).mean(1)
    torch.testing.assert_close(ours, ac.exact(sample), atol=1e-4, rtol=1e-3)
    assert ours.abs().max() > 1e-3  # the sample holds edges that matter


def test_auto_circuit_has_no_grouped_query_edges(peer):
    # why the peer comparison is on GPT-2 only: a key receiver per query head, and patching one fails
    report = bench.gqa_check(peer[-1].ac)
    assert report.startswith("4 key receivers per layer for 2 key/value heads") and "RuntimeError" in report
