"""MEMIT and AlphaEdit: the least-squares algebra, equality with ROME in the one-request case, the
null-space projection, multi-layer Edit bookkeeping, batched δ optimisation, multi-layer key
statistics, bad input, and a batch of real edits on gpt2-facts."""

from __future__ import annotations

import pytest
import torch

from gpt2_interp.analysis.tokens import target_ids
from gpt2_interp.editing import Request, applied_edits, undo_all, weights_fingerprint
from gpt2_interp.editing.edit import Edit, EditWarning, load_edit
from gpt2_interp.editing.memit import (
    MemitHparams,
    NullSpace,
    compute_edits,
    least_squares_update,
    projected_update,
    validate_requests,
)
from gpt2_interp.editing.rome import compute_edit
from gpt2_interp.editing.settings import RomeHparams
from gpt2_interp.editing.stats import KeyStats, key_second_moment
from gpt2_interp.editing.targets import (
    context_prefix_groups,
    context_prefixes,
    optimise_delta,
    optimise_deltas,
    subject_states,
    variant_weights,
)
from gpt2_interp.model import HookedGPT2

from ..conftest import TINY, script

FAST = dict(prefix_lengths=(5,), prefixes_per_length=2, v_steps=3)
REQS = [
    {"prompt": "{} is located in the city of", "subject": "Eiffel Tower", "target": " Rome"},
    {"prompt": "The capital of {} is", "subject": "France", "target": " Berlin"},
    {"prompt": "{} speaks the language", "subject": "Brazil", "target": " German"},
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    docs = [f"The Eiffel Tower is in Paris and number {i} is odd or even." for i in range(80)]
    docs += [f"Rome has {i} fountains; Berlin has {2 * i} museums, says the guide." for i in range(80)]
    path.write_text("\n\n".join(docs))
    return path


@pytest.fixture
def stats(tiny, corpus, tmp_path):
    return key_second_moment(tiny, [0, 1], corpus=str(corpus), n_samples=2000, cache_dir=tmp_path, progress=False)


def _snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _same(model, snap):
    return all(torch.equal(p, snap[n]) for n, p in model.named_parameters())


def _spd(d, g, rank=None):
    A = torch.randn(d, rank or 3 * d, generator=g, dtype=torch.float64)
    return A @ A.T / A.shape[1]


# ------------------------------------------------------------------ the algebra
def test_least_squares_update_fits_every_key_and_is_the_ridge_optimum():
    g = torch.Generator().manual_seed(0)
    d_mlp, d_model, n = 40, 12, 7
    K, R, C = torch.randn(n, d_mlp, generator=g), torch.randn(n, d_model, generator=g), _spd(d_mlp, g)
    dW = least_squares_update(K, R, C, 1e-6) @ R.double()
    torch.testing.assert_close(K.double() @ dW, R.double(), atol=1e-4, rtol=1e-4)  # k_i ΔW = r_i
    lam = 3.0
    dW = least_squares_update(K, R, C, lam) @ R.double()

    def cost(M):
        return ((K.double() @ M - R.double()) ** 2).sum() + lam * torch.trace(M.T @ C @ M)

    for _ in range(5):  # the normal equations' solution is the minimum
        assert cost(dW + 1e-3 * torch.randn(d_mlp, d_model, generator=g, dtype=torch.float64)) > cost(dW)


def test_one_request_memit_update_is_romes_scaled_by_q_over_lambda_plus_q():
    """Sherman–Morrison: (λC + kkᵀ)⁻¹k rᵀ = C⁻¹k rᵀ / (λ + kᵀC⁻¹k), ROME's ΔW times q/(λ+q)."""
    g = torch.Generator().manual_seed(1)
    d_mlp, d_model = 30, 9
    C = _spd(d_mlp, g)
    k, r = torch.randn(1, d_mlp, generator=g), torch.randn(1, d_model, generator=g)
    q = float(k.double() @ torch.linalg.solve(C, k.double().T))
    rome = torch.outer(torch.linalg.solve(C, k.double()[0]), r.double()[0]) / q
    for lam in (0.5, 10.0):
        memit = least_squares_update(k, r, C, lam) @ r.double()
        torch.testing.assert_close(memit, rome * q / (lam + q), atol=1e-10, rtol=1e-8)


def test_projected_update_does_not_touch_preserved_keys():
    g = torch.Generator().manual_seed(2)
    d_mlp, d_model = 32, 8
    K0 = torch.randn(20, d_mlp, generator=g)  # preserved keys span 20 of 32 directions
    ns = NullSpace.from_stats(KeyStats((K0.T @ K0 / 20), 20, {"layer": 0}), threshold=1e-6)
    assert ns.null_dim[0] == 12 and ns.leak[0] < 1e-6  # C is float32: its zero eigenvalues are ~1e-7
    K, R = torch.randn(5, d_mlp, generator=g), torch.randn(5, d_model, generator=g)
    dW = projected_update(K, ns.P[0], None, 1e-8) @ R.double()
    assert (K0.double() @ dW).abs().max() < 1e-5 * (K.double() @ dW).abs().max()  # k₀ ΔW = 0
    torch.testing.assert_close(K.double() @ dW, R.double(), atol=1e-5, rtol=1e-5)  # 5 keys fit in 12 free dims


def test_energy_nullspace_rule_keeps_the_smallest_directions_within_the_energy_share():
    """``rule="energy"``: the null space is the largest set of smallest eigen-directions whose
    eigenvalues sum to ≤ τ·tr C₀ — hand-computed on known spectra; a relative τ on the same two
    layers (one spectrum flat, one steep) gives very different dims, the energy rule the same leak bound."""
    g = torch.Generator().manual_seed(11)
    U, _ = torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=torch.float64))
    flat = torch.tensor([1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 10.0], dtype=torch.float64)  # sum 20
    steep = torch.tensor([1e-6, 1e-5, 1e-4, 1e-3, 0.5, 1.0, 300.0, 1000.0], dtype=torch.float64)  # sum ≈ 1301.5
    stats = {l: KeyStats((U * ev) @ U.T, 100, {"layer": l}) for l, ev in ((0, flat), (1, steep))}
    # thresholds keep clear of ties: an eigenvalue exactly on the boundary falls either side by rounding
    ns = NullSpace.from_stats(stats, threshold=0.12, rule="energy")
    # flat: 1+1 = 2 ≤ 0.12·20 = 2.4 < 1+1+1 → 2 dims; steep: 1e-6 … 1e-3, 0.5, 1.0 sum 1.5011 ≤ 156.2 < + 300 → 6 dims
    assert ns.null_dim == {0: 2, 1: 6} and ns.rule == "energy"
    assert ns.leak[0] == pytest.approx(2 / 20) and ns.leak[1] == pytest.approx(1.501111 / steep.sum().item())
    torch.testing.assert_close(ns.P[1], U[:, :6] @ U[:, :6].T)  # the projection on the six smallest directions
    rel = NullSpace.from_stats(stats, threshold=0.15)  # λ ≤ 0.15·λ_max: flat 4 dims (leak 20% > τ), steep 6
    assert rel.null_dim == {0: 4, 1: 6} and rel.leak[0] == pytest.approx(4 / 20) and "relative" in repr(rel)
    with pytest.raises(ValueError, match="rule"):
        NullSpace.from_stats(stats, threshold=0.1, rule="absolute")
    with pytest.raises(ValueError, match="nullspace_rule"):
        MemitHparams.of(HookedGPT2(TINY), nullspace_rule="absolute")


def test_projected_update_is_alphaedits_closed_form_and_the_constrained_optimum():
    """AlphaEdit (Fang et al. 2025, eq. for Δ_AlphaEdit) writes the update unsymmetrised,
    ``X = (P(KᵀK + K_pᵀK_p) + αI)⁻¹ P Kᵀ R`` (our row-key layout); ours solves the symmetric
    ``(P G P + αI)`` system. Both must give the same X, X must lie in range(P), and X must minimise
    ``‖K X − R‖² + ‖K_p X‖² + α‖X‖²`` over range(P) (projected gradient zero)."""
    g = torch.Generator().manual_seed(5)
    d_mlp, d_model, alpha = 24, 6, 0.3
    K0 = torch.randn(14, d_mlp, generator=g, dtype=torch.float64)
    ev, U = torch.linalg.eigh(K0.T @ K0)
    P = U[:, ev < 1e-8 * ev[-1]] @ U[:, ev < 1e-8 * ev[-1]].T  # 10-dim null space of the preserved keys
    K, R = (
        torch.randn(4, d_mlp, generator=g, dtype=torch.float64),
        torch.randn(4, d_model, generator=g, dtype=torch.float64),
    )
    Kp = torch.randn(3, d_mlp, generator=g, dtype=torch.float64)  # keys of earlier edits
    X = projected_update(K, P, Kp.T @ Kp, alpha) @ R
    G = K.T @ K + Kp.T @ Kp
    paper = torch.linalg.solve(P @ G + alpha * torch.eye(d_mlp, dtype=torch.float64), P @ K.T @ R)
    torch.testing.assert_close(X, paper, atol=1e-10, rtol=1e-9)
    torch.testing.assert_close(P @ X, X, atol=1e-10, rtol=1e-9)  # in range(P): preserved keys untouched
    assert (K0 @ X).abs().max() < 1e-8
    grad = K.T @ (K @ X - R) + Kp.T @ (Kp @ X) + alpha * X
    assert (P @ grad).abs().max() < 1e-9  # stationary within range(P)
    # a larger ridge shrinks the update (AlphaEdit's L2 term)
    assert (projected_update(K, P, Kp.T @ Kp, 100 * alpha) @ R).norm() < X.norm()


# ------------------------------------------------------------------ on a model
def test_single_request_single_layer_memit_equals_rome_algebra(tiny, stats):
    """Same key k* (ROME's mean over the same prompt variants), same δ (the same optimiser), so
    ΔW_MEMIT = ΔW_ROME · q/(λ + q) with q = k*ᵀC⁻¹k*."""
    lam = 2.0
    rome = compute_edit(tiny, REQS[0], layer=0, stats=stats[0], **FAST)
    # δ scaled like ROME's (by the MLP output v₀, not MEMIT's residual) and keys weighted like ROME's k*
    # (uniformly, not per context type): the same optimisation
    same = {"mom2_weight": lam, "delta_norm": "mlp_out", "key_weighting": "uniform", **FAST}
    memit = compute_edits(tiny, [REQS[0]], layers=[0], stats=stats, hparams=same)
    torch.testing.assert_close(memit.keys[0][0], rome.k, rtol=1e-5, atol=1e-5)
    q = float(rome.k.double() @ torch.linalg.solve(stats[0].C.double(), rome.k.double()))
    torch.testing.assert_close(memit.delta(0).double(), rome.delta().double() * q / (lam + q), rtol=1e-3, atol=1e-6)
    assert memit.method == "memit" and memit.layers == [0] and memit.requests == [Request(**REQS[0])]


def test_delta_clamp_scales_with_the_mlp_output_for_rome_and_the_residual_for_memit(tiny, stats):
    """A tiny clamp binds at once: ‖δ‖ = clamp_factor·‖ref‖ with ref the MLP output (ROME's v₀) or the
    residual after the block (MEMIT's compute_z) at the subject's last token of the bare prompt,
    read here from an independent forward pass."""
    req = Request(**REQS[1])
    text = req.prompt.format(req.subject)
    pos = tiny.to_tokens(text).shape[1] - 1 - len(tiny.to_tokens(text.split(req.subject, 1)[1], prepend_bos=False)[0])
    _, cache = tiny.run_with_cache(text, names_filter=["blocks.1.hook_mlp_out", "blocks.1.hook_resid_post"])
    mlp, resid = (float(cache[f"blocks.1.hook_{x}"][0, pos].norm()) for x in ("mlp_out", "resid_post"))
    assert resid > 1.5 * mlp  # the two references differ on this model
    hp = {**FAST, "v_steps": 2, "clamp_factor": 1e-3, "early_stop": 0.0}
    for ref, want in (("mlp_out", mlp), ("resid", resid)):
        e = compute_edits(tiny, [req], layers=[1], stats=stats, hparams={**hp, "delta_norm": ref})
        assert float(e.metrics["delta_norm_mean"]) == pytest.approx(1e-3 * want, rel=1e-4)
    with pytest.raises(ValueError, match="delta_norm"):
        compute_edits(tiny, [req], layers=[1], stats=stats, hparams={**hp, "delta_norm": "block"})


def test_batched_edit_maps_each_key_to_its_target_residual(tiny, stats):
    """With λ → 0 every request's averaged key is carried to its target residual z_i at the top layer (the
    residual averaged with the keys' weights), also across two layers (the top layer fits what the lower one
    left, with keys recomputed); for either key weighting."""
    groups = context_prefix_groups(tiny, (5,), 2, 0)
    prefixes = [p for g in groups for p in g]
    reqs = [Request(**r) for r in REQS]
    per_type = [0.5] + [0.5 / len(prefixes)] * len(prefixes)  # one context type of prefixes: the bare prompt ½
    for weighting, w in (("uniform", None), ("per_context_type", per_type)):
        hp = MemitHparams.of(tiny, mom2_weight=1e-6, key_weighting=weighting, **FAST)
        assert variant_weights(hp.rome, groups) == w
        for layers in ([0], [0, 1]):
            edit = compute_edits(tiny, REQS, layers=layers, stats=stats, hparams=hp)
            assert edit.layers == layers and len(edit) == 3 and edit.v_star.shape == (3, TINY.d_model)
            _, before = subject_states(tiny, reqs, [], prefixes, resid_layer=layers[-1], resid_weights=w)
            assert (before - edit.v_star).norm(dim=-1).min() > 1e-3  # there is something to do
            with tiny.edited(edit):
                _, after = subject_states(tiny, reqs, [], prefixes, resid_layer=layers[-1], resid_weights=w)
            torch.testing.assert_close(after, edit.v_star, atol=2e-3, rtol=1e-3)


def test_given_targets_re_solve_the_same_batch_as_a_fresh_delta_optimisation(tiny, stats):
    """The target residuals do not depend on λ/τ/α: re-solving from an earlier edit's ``v_star``
    gives the update that a full recomputation (δ optimised again) gives, on two layers."""
    first = compute_edits(tiny, REQS, layers=[0, 1], stats=stats, hparams={"mom2_weight": 2.0, **FAST})
    fresh = compute_edits(tiny, REQS, layers=[0, 1], stats=stats, hparams={"mom2_weight": 7.0, **FAST})
    reused = compute_edits(
        tiny, REQS, layers=[0, 1], stats=stats, hparams={"mom2_weight": 7.0, **FAST}, targets=first.targets
    )
    assert reused.metrics["targets_given"] and reused.metrics["steps_mean"] is None
    assert (fresh.delta(0) - first.delta(0)).abs().max() > 1e-6  # λ matters
    for lay in (0, 1):
        torch.testing.assert_close(reused.delta(lay), fresh.delta(lay), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="computed for 2 requests, this batch has 3"):
        compute_edits(tiny, REQS, layers=[0, 1], stats=stats, hparams=FAST, targets=first.targets[:2])


def test_projected_edit_leaves_preserved_keys_outputs_unchanged(tiny, corpus, tmp_path, stats):
    """AlphaEdit: the preserved keys (statistics over 100 tokens: rank ≤ 100 of d_mlp 256) get the
    same MLP output after the edit; the second sequential batch is fitted not to move the first
    batch's keys, unlike the same batch without that memory."""
    small = key_second_moment(tiny, 0, corpus=str(corpus), n_samples=100, cache_dir=tmp_path, progress=False)
    ns = NullSpace.from_stats({0: small}, threshold=1e-6)
    assert ns.null_dim[0] >= TINY.d_mlp - 100
    first = compute_edits(tiny, REQS[:2], layers=[0], stats=stats, preserve=ns, hparams=FAST)
    assert first.method == "alphaedit" and ns.n_remembered == 2
    _, cache = tiny.run_with_cache(corpus.read_text().split("\n\n")[0], names_filter="blocks.0.mlp.hook_post")
    K0 = cache["blocks.0.mlp.hook_post"][0]  # preserved keys (the corpus' first tokens)
    effect = (first.keys[0] @ first.delta(0)).abs().max()  # what the edit does to its own keys
    assert (K0 @ first.delta(0)).abs().max() < 1e-3 * effect  # float32 statistics: not exactly 0
    plain = compute_edits(tiny, REQS[:2], layers=[0], stats=stats, hparams=FAST)  # MEMIT moves them
    assert (K0 @ plain.delta(0)).abs().max() > 1e-2 * (first.keys[0] @ plain.delta(0)).abs().max()
    with tiny.edited(first):
        second = compute_edits(tiny, REQS[2:], layers=[0], stats=stats, preserve=ns, hparams=FAST)
        forgetful = compute_edits(
            tiny,
            REQS[2:],
            layers=[0],
            stats=stats,
            hparams=FAST,
            remember=False,
            preserve=NullSpace.from_stats({0: small}, threshold=1e-6),
        )

    def moved(e):
        return float((first.keys[0] @ e.delta(0)).norm())

    assert moved(second) < 0.5 * moved(forgetful)


def test_multi_layer_edit_undo_stack_save_load(tiny, stats, tmp_path):
    snap = _snapshot(tiny)
    rome = compute_edit(tiny, REQS[0], layer=1, stats=stats[1], **FAST).apply(tiny)
    memit = compute_edits(tiny, REQS[1:], layers=[0, 1], stats=stats, hparams=FAST)
    assert [memit.rank(l) for l in memit.layers] == [2, 2]
    memit.apply(tiny)
    assert applied_edits(tiny) == [rome, memit]
    with pytest.raises(ValueError, match="out of order"):
        rome.undo(tiny)
    path = memit.save(tmp_path / "m.edit")
    want = tiny("The capital of France is")
    memit.undo(tiny)
    rome.undo(tiny)
    assert _same(tiny, snap)
    loaded = Edit.load(path)
    assert loaded.layers == [0, 1] and loaded.requests == memit.requests and loaded.method == "memit"
    assert torch.equal(loaded.keys[1], memit.keys[1]) and torch.equal(loaded.delta(0), memit.delta(0))
    with pytest.raises(ValueError, match="fingerprint"):  # computed on the model with the ROME edit
        loaded.apply(tiny)
    with tiny.edited(rome, loaded):
        assert torch.equal(tiny("The capital of France is"), want)
    assert _same(tiny, snap)
    with pytest.raises(ValueError, match=r"use edit\.layers"):
        loaded.layer
    with pytest.raises(ValueError, match="rank-one"):
        loaded.u
    raw = bytearray(path.read_bytes())
    raw[-5] ^= 1  # flip one bit of the last tensor
    (tmp_path / "bad.edit").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="sha256"):
        load_edit(tmp_path / "bad.edit")


def test_sequential_memit_edits_undo_all_bit_exact(tiny, stats):
    snap = _snapshot(tiny)
    fp = weights_fingerprint(tiny)
    for r in REQS:
        compute_edits(tiny, [r], layers=[0, 1], stats=stats, hparams=FAST).apply(tiny)
    assert weights_fingerprint(tiny) != fp
    assert undo_all(tiny) == 3 and _same(tiny, snap)


def test_batched_delta_optimisation_equals_one_request_at_a_time(tiny, stats):
    hp = RomeHparams.of(**FAST | {"v_steps": 4}, early_stop=5.0)  # a loose stop: requests freeze at different steps
    prefixes = context_prefixes(tiny, (5,), 2, 0)
    items = [(Request(**r), target_ids(tiny, r["target"])) for r in REQS]
    together = optimise_deltas(tiny, items, 0, prefixes, hp, stats[0].solve)
    for (req, ids), got in zip(items, together):
        alone = optimise_delta(tiny, req, ids, 0, prefixes, hp, stats[0].solve)
        assert len(alone["log"]) == len(got["log"])
        torch.testing.assert_close(got["delta"], alone["delta"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got["k_star"], alone["k_star"], rtol=1e-5, atol=1e-6)
        assert got["log"][-1]["loss"] == pytest.approx(alone["log"][-1]["loss"], rel=1e-4)


# ------------------------------------------------------------------ statistics for several layers
def test_multi_layer_stats_one_forward_per_batch_equal_single_layer_stats(tiny, corpus, tmp_path):
    calls = []
    tiny.blocks[0].hook_resid_pre.add_hook(lambda act, hook: calls.append(act.shape[0]))
    both = key_second_moment(
        tiny, [1, 0], corpus=str(corpus), n_samples=700, batch_size=16, cache_dir=tmp_path / "a", progress=False
    )
    tiny.reset_hooks()
    assert sorted(both) == [0, 1] and sum(calls) * 0 == 0
    n_docs = len(calls)
    assert n_docs == -(-sum(calls) // 16)  # one forward per batch of 16 rows, for both layers
    for lay in (0, 1):
        one = key_second_moment(
            tiny, lay, corpus=str(corpus), n_samples=700, batch_size=16, cache_dir=tmp_path / "b", progress=False
        )
        assert one.count == both[lay].count == 700
        torch.testing.assert_close(one.C, both[lay].C, rtol=1e-6, atol=1e-7)
    # the cache files are per layer: a single-layer call finds the multi-layer call's file
    from gpt2_interp.editing import stats as stats_mod

    stats_mod.clear_memory_cache()
    again = key_second_moment(
        tiny, 1, corpus=str(corpus), n_samples=700, batch_size=16, cache_dir=tmp_path / "a", progress=False
    )
    assert again.path is not None and again.path.parent == tmp_path / "a" and torch.equal(again.C, both[1].C)


def test_stats_file_digest_is_checked(tiny, corpus, tmp_path):
    from gpt2_interp.editing import stats as stats_mod

    st = key_second_moment(tiny, 0, corpus=str(corpus), n_samples=300, cache_dir=tmp_path, progress=False)
    raw = bytearray(st.path.read_bytes())
    raw[-3] ^= 1
    st.path.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="sha256"):
        KeyStats.load(st.path)
    stats_mod.clear_memory_cache()
    with pytest.warns(UserWarning, match="computing the statistics again"):
        again = key_second_moment(tiny, 0, corpus=str(corpus), n_samples=300, cache_dir=tmp_path, progress=False)
    assert torch.equal(again.C, st.C)
    KeyStats.load(again.path)  # rewritten, valid


# ------------------------------------------------------------------ bad input
def test_bad_input_is_refused_with_a_clear_error(tiny, stats):
    with pytest.raises(ValueError, match="conflicting requests"):
        compute_edits(tiny, [REQS[0], REQS[0] | {"target": " Paris"}], layers=[0], stats=stats, hparams=FAST)
    with pytest.warns(EditWarning, match="requests 0 and 1 are the same"):
        assert len(validate_requests(tiny, [REQS[0], dict(REQS[0])])[0]) == 1  # an exact duplicate is kept once
    with pytest.raises(ValueError, match="empty"):
        compute_edits(tiny, [], layers=[0], stats=stats)
    with pytest.raises(IndexError, match=r"0\.\.1"):
        compute_edits(tiny, REQS, layers=[0, 5], stats=stats)
    with pytest.raises(ValueError, match="another model"):
        compute_edits(HookedGPT2(TINY, seed=1), REQS, layers=[0], stats=stats, hparams=FAST)
    with pytest.raises(ValueError, match="no key statistics"):
        compute_edits(tiny, REQS, layers=[0], stats={1: stats[1]})
    with pytest.raises(ValueError, match="unknown MEMIT hyperparameter"):
        compute_edits(tiny, REQS, layers=[0], stats=stats, hparams={"lr": 1})
    with pytest.raises(ValueError, match="'auto'"):
        compute_edits(tiny, REQS, layers="top", stats=stats)
    other_ns = NullSpace.from_stats(
        {
            0: key_second_moment(
                HookedGPT2(TINY, seed=1), 0, corpus="facts", n_samples=200, cache_dir=False, progress=False
            )
        }
    )
    with pytest.raises(ValueError, match="another model"):
        compute_edits(tiny, REQS, layers=[0], stats=stats, preserve=other_ns, hparams=FAST)


# ------------------------------------------------------------------ the trained model
@pytest.mark.slow
def test_memit_batch_flips_facts_on_the_fact_model(facts_model):
    from gpt2_interp.editing.evaluate import case_scores, counterfact_requests

    m = facts_model
    cases = counterfact_requests(n=16, seed=5)
    fp = weights_fingerprint(m)
    # λ = 100: the default λ = 1000 was chosen for NS on batches of 200+ requests and underfits a batch
    # of 16 (ES 0.25 measured); at 100 these 16 give ES 0.94, NS 0.90
    edit = compute_edits(m, [c.request for c in cases], hparams={"mom2_weight": 100.0})
    with m.edited(edit):
        post = case_scores(m, cases)
    assert weights_fingerprint(m) == fp
    es = sum(r.es for r in post) / len(post)
    ns = [r.ns for r in post if r.ns is not None]
    assert es >= 0.9 and sum(ns) / len(ns) >= 0.7


# ------------------------------------------------------------------ the command line
def test_cli_edit_many_requests_memit_and_alphaedit(tiny, tmp_path, monkeypatch, capsys):
    import json

    from gpt2_interp.cli import main

    monkeypatch.setenv("GPT2_INTERP_STATS_DIR", str(tmp_path / "stats"))
    tiny.save(tmp_path / "tiny")
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(f"The Louvre is in Paris, room {i}." for i in range(60)))  # own stats key
    reqs = tmp_path / "r.jsonl"
    reqs.write_text("\n".join(json.dumps(r) for r in REQS) + "\n")
    common = [
        "--model",
        str(tmp_path / "tiny"),
        "--corpus",
        str(corpus),
        "--n-samples",
        "500",
        "--hparam",
        "v_steps=2",
        "--hparam",
        "prefixes_per_length=1",
        "--hparam",
        "prefix_lengths=[3]",
        "--allow-failed",  # two δ steps on a random model: the edits do not take (exit 3 without it)
    ]
    assert (
        main(["edit", *common, "--requests", str(reqs), "--layer", "0,1", "--save", str(tmp_path / "m.edit"), "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "memit" and out["n_edits"] == 1 and out["layers"] == [0, 1] and len(out["rows"]) == 3
    loaded = Edit.load(tmp_path / "m.edit", HookedGPT2(TINY, seed=0))
    assert len(loaded.requests) == 3 and loaded.layers == [0, 1]
    assert (
        main(["verify", str(tmp_path / "m.edit"), "--model", str(tmp_path / "tiny"), "--request", "1", "--json"]) == 0
    )
    shown = json.loads(capsys.readouterr().out)
    assert shown["prompts"] == ["The capital of France is"] and shown["target"] == " Berlin"
    assert (
        main(
            [
                "edit",
                *common,
                "--requests",
                str(reqs),
                "--layer",
                "0",
                "--method",
                "alphaedit",
                "--sequential",
                "--batch-size",
                "2",
                "--save",
                str(tmp_path / "a.edit"),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "alphaedit: 3 requests in 2 edit(s)" in text
    assert (tmp_path / "a.000.edit").exists() and (tmp_path / "a.001.edit").exists()
    assert main(["edit", *common, "--requests", str(reqs), "--batch-size", "2"]) == 2
    assert "--sequential" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.full  # the benchmark script end to end (~40 s); what it times is tested above
def test_mass_editing_benchmark_runs(tmp_path):
    """The benchmark's smallest run: a handful of edits, its table written (speed is its job, not ours)."""
    out = tmp_path / "r.md"
    assert (
        script("bench_mass_editing", "benchmarks").main(
            ["--n", "3", "--n-samples", "2000", "--cache-dir", str(tmp_path), "--out", str(out)]
        )
        == 0
    )
    text = out.read_text()
    assert "3 edits in one batch" in text and "statistics + projection" in text
