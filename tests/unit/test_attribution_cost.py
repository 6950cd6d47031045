"""What a sweep costs, counted before it runs, and AtP*'s passes that cannot change its result.

The counts are checked against pass counts written out by hand for the 2-layer ``tiny`` model
(units: forward passes of one prompt; a backward pass through ``k`` of ``n`` blocks counts
``2k/n``), and the number of backward passes against the calls autograd actually receives.
Skipping a GradDrop pass is checked to be exact: the result equals the one with every pass run.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from gpt2_interp.analysis.attribution import atp as atp_module
from gpt2_interp.analysis.attribution import attribute
from gpt2_interp.analysis.attribution.cells import resolve_family
from gpt2_interp.analysis.attribution.cost import CostWarning, estimate_passes, estimate_work
from gpt2_interp.analysis.attribution.plan import Sweep
from gpt2_interp.analysis.engine import staircase_work
from gpt2_interp.analysis.metrics import logit_diff
from gpt2_interp.analysis.patching import patch, sweep_work

CLEAN, CORRUPT = "The capital of France is", "The capital of Italy is"  # 6 tokens with BOS on tiny
P = 6


def metric():
    return logit_diff(" Paris", " Rome")


def sweep(model, hook, method, layers=None, graddrop=None, ig_steps=3, ig_path="input"):
    fam, layers_ = resolve_family(model, hook, layers)
    gd = method == "atp*" if graddrop is None else graddrop
    return Sweep(model, fam, layers_, method, "denoise", ig_steps, ig_path, gd, fam.kind != "pos")


def test_staircase_work_counts_blocks_times_positions():
    # rows (start 0, first 0), (start 1, first 2), (start 2, first 0) on n=2 blocks, 4 positions
    assert staircase_work(2, 4, [0, 1, 2], [0, 2, 0]) == (3, 4 + 2 + 4, 2 * 4 + 1 * 2 + 0)


def test_exact_sweep_work_matches_hand_count(tiny):
    assert tiny.cfg.n_layer == 2 and len(tiny.to_str_tokens(CLEAN)) == P
    # mlp_out, every (layer, position): 2 unpatched runs + Σ_l Σ_p (2 − l)(P − p) / (2P)
    w = sweep_work(tiny, P, "mlp_out")
    assert w.runs == 2 + 2 * P and w.tokens == 2 * P + 2 * (P * (P + 1) // 2)
    assert w.passes == pytest.approx(2 + (2 + 1) * (P * (P + 1) / 2) / (2 * P))  # 2 + 3·21/12 = 7.25
    # resid_post of the last layer enters after the last block: patched rows run no block
    assert sweep_work(tiny, P, "resid_post", layers=[1]).passes == pytest.approx(2.0)
    # z per head at every position: 2 layers × 4 heads, rows from position 0
    assert sweep_work(tiny, P, "z").passes == pytest.approx(2 + 4 * (2 + 1) * P / (2 * P))
    # resid_pre at positions 3, 5 of layer 1: rows (1, 3), (1, 5)
    assert sweep_work(tiny, P, "resid_pre", layers=[1], positions=[3, 5]).passes == pytest.approx(
        2 + (1 * 3 + 1 * 1) / (2 * P)
    )


def test_estimate_work_matches_hand_count(tiny):
    n = 2
    cases = [
        (sweep(tiny, "mlp_out", "atp"), 1 + 1 + 2),  # source, base with autograd, backward through both blocks
        (sweep(tiny, "mlp_out", "atp*"), 4 + 2 * 2),  # + one GradDrop backward per layer
        (sweep(tiny, "mlp_out", "atp*", graddrop=False), 4),
        (sweep(tiny, "mlp_out", "atp*", layers=[1]), 2 + 1 + 1),  # backward through block 1 only; pass ℓ=0 skipped
        (sweep(tiny, "resid_post", "atp*", layers=[1]), 2 + 0),  # after the last block: no block to cross
        (sweep(tiny, "k", "atp*"), 4 + 2 * 2),  # the QK fix adds no pass
        (sweep(tiny, "mlp_out", "ig", ig_steps=3), 2 + 3 * (1 + 2)),
        (sweep(tiny, "mlp_out", "ig", ig_steps=3, ig_path="activations"), 2 + 3 * 3 * (2 / n + 1 / n)),
    ]
    for s, expected in cases:
        assert estimate_passes(s)[0] == pytest.approx(expected), (s.method, s.fam.name, s.layers, s.graddrop)
    assert estimate_work(cases[1][0], P, n_pairs=3).passes == pytest.approx(3 * 8)


@pytest.mark.parametrize(("hook", "layers", "calls"), [("mlp_out", None, 1 + 2), ("mlp_out", [1], 1 + 1)])
def test_backward_passes_counted_are_the_ones_run(tiny, monkeypatch, hook, layers, calls):
    seen = []
    real = torch.autograd.grad
    monkeypatch.setattr(atp_module.torch.autograd, "grad", lambda *a, **k: seen.append(1) or real(*a, **k))
    attribute(tiny, CLEAN, CORRUPT, metric(), hook=hook, layers=layers, method="atp*", progress=False)
    assert len(seen) == calls
    s = sweep(tiny, hook, "atp*", layers=layers)
    assert estimate_passes(s)[0] == pytest.approx(2 + (calls * 2 * (2 - (layers or [0])[0]) / 2))


@pytest.mark.parametrize(("hook", "layers"), [("mlp_out", [1]), ("resid_post", [0, 1]), ("q", [1]), ("k", [1])])
def test_skipped_graddrop_passes_change_nothing(tiny, monkeypatch, hook, layers):
    """The passes left out (their dropped layer upstream of every attributed activation) give the
    undropped estimate: forcing them on gives the same result, bit for bit."""
    seen = []
    real = torch.autograd.grad
    monkeypatch.setattr(atp_module.torch.autograd, "grad", lambda *a, **k: seen.append(1) or real(*a, **k))
    skipped = attribute(tiny, CLEAN, CORRUPT, metric(), hook=hook, layers=layers, method="atp*", progress=False)
    assert len(seen) == 1 + 1  # the pass dropping layer 0 did not run
    monkeypatch.setattr(atp_module, "graddrop_layers", lambda s: range(s.model.cfg.n_layer))
    forced = attribute(tiny, CLEAN, CORRUPT, metric(), hook=hook, layers=layers, method="atp*", progress=False)
    assert len(seen) == 2 + 1 + 2  # every pass ran
    assert torch.equal(skipped.values, forced.values)
    assert torch.equal(skipped.score, forced.score)
    assert float(skipped.score.abs().max()) > 0


def test_graddrop_passes_cannot_be_skipped_where_they_matter(tiny, monkeypatch):
    """An mlp_out sweep from layer 0: dropping layer 1 changes layer 0's estimate (cancellation through a
    later MLP is what GradDrop is for), so no pass may be left out."""
    full = attribute(tiny, CLEAN, CORRUPT, metric(), hook="mlp_out", method="atp*", progress=False)
    monkeypatch.setattr(atp_module, "graddrop_layers", lambda s: range(0))  # skip every pass
    none = attribute(tiny, CLEAN, CORRUPT, metric(), hook="mlp_out", method="atp*", progress=False)
    assert torch.equal(full.values, none.values)  # the signed estimate is GradDrop-free
    assert not torch.allclose(full.score[0], none.score[0])


def test_cost_warning_when_the_exact_sweep_is_cheaper(tiny):
    with pytest.warns(
        CostWarning, match=r"≈ 8\.0 forward passes, exact patching of the same cells ≈ 7\.2: the estimate costs 1\.1×"
    ):
        attribute(tiny, CLEAN, CORRUPT, metric(), hook="mlp_out", method="atp*", progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CostWarning)
        attribute(tiny, CLEAN, CORRUPT, metric(), hook="mlp_out", method="atp", progress=False)  # 4 < 7.25


def test_verify_runs_the_full_sweep_when_that_is_cheaper(tiny):
    est = attribute(tiny, CLEAN, CORRUPT, metric(), hook="mlp_out", method="atp", progress=False)
    exact = patch(tiny, CLEAN, CORRUPT, metric(), hook="mlp_out", progress=False)
    # 12 cells: 2k top + controls cover them all, one patch call per layer with 2 unpatched runs each
    with pytest.warns(CostWarning, match="running the full sweep instead"):
        v = est.verify(k=3, controls=20, progress=False)
    ref = est.verify(k=3, controls=20, progress=False, exact=exact)
    assert torch.equal(v.exact, ref.exact) and v.cells == ref.cells
