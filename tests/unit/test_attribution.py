"""Attribution patching (AtP, AtP*, integrated gradients) against exact activation patching.

Each claim is checked where the approximation is provably exact (the metric is linear in the
patched activation; linear from the attention pattern on; additive over cells with activations
linear along the IG path), and the same comparison is shown to fail where it should (so the tests
can fail). The exact reference is ``patching.patch``, itself checked against TransformerLens.
"""

from __future__ import annotations

import json

import pytest
import torch

import gpt2_interp as gi
from gpt2_interp.analysis.attribution import agreement, attribute, spearman
from gpt2_interp.analysis.metrics import bind_metric, kl_to, logit_diff
from gpt2_interp.analysis.patching import pair_tokens, patch


@pytest.fixture(scope="module")
def small():
    """A random 4-layer, d_model 128 GPT-2 with non-trivial biases and LayerNorms and sharp attention."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, n_positions=64)).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(torch.randn_like(p) * 0.05)
            if "c_proj.weight" in name or "c_attn.weight" in name:
                p.mul_(4)
        hf.transformer.wte.weight.mul_(4)
    return gi.from_transformers(hf).eval()


@pytest.fixture(scope="module")
def lin(small):
    """The same model with ln_final made linear (ε = 1e12, gain × 1e7: 10·(x − mean(x))·w to fp32
    precision), so that the metric is linear in the final residual stream."""
    lin = gi.from_transformers(small.to_transformers()).eval()
    with torch.no_grad():
        lin.ln_final.eps = 1e12
        lin.ln_final.w.mul_(1e7)
    return lin


@pytest.fixture(scope="module")
def lin_attn(lin):
    """``lin`` with the last MLP's output weights zeroed: the last attention layer then reaches the
    (linear) readout only through the residual stream."""
    model = gi.from_transformers(lin.to_transformers()).eval()
    d = model.cfg.d_model
    with torch.no_grad():
        model.ln_final.eps = 1e12
        model.blocks[-1].mlp.W_out.zero_()
        model.blocks[-1].attn.W_QKV[:, :d].mul_(3)  # sharper (more saturated) attention
    return model


@pytest.fixture(scope="module")
def pairs(small):
    """Three prompt pairs as text (padded: different lengths), answers per pair."""
    clean = ["The capital of France is", "The capital of Spain is the city of", "Paris is a city in"]
    corrupt = ["The capital of Italy is", "The capital of Japan is the city of", "London is a city in"]
    return clean, corrupt, logit_diff([" Paris", " Madrid", " France"], [" Rome", " Tokyo", " England"])


def effects(r):
    return r.values - r.baseline


def pair_effects(r):
    """Per-pair effects of a (denoising, unnormalised) sweep: patched metric − corrupted metric."""
    return r.pair_values - r.corrupted_pair_metric.view((-1,) + (1,) * (r.pair_values.ndim - 1))


def test_atp_equals_exact_patching_where_the_metric_is_linear_in_the_patched_activation(lin, lin_attn, pairs):
    """With ln_final linear, the last layer's mlp_out and resid_post enter a logit difference
    linearly; with the last MLP off too, so do its z, v and attn_out (z = pattern·v, and the pattern
    does not depend on v). AtP is exact there — for every position and head, every pair, padding
    included; one layer earlier it is not."""
    clean, corrupt, m = pairs
    for model, hook in (
        (lin, "mlp_out"),
        (lin, "mlp_post"),
        (lin, "resid_post"),
        (lin_attn, "z"),
        (lin_attn, "v"),
        (lin_attn, "attn_out"),
    ):
        for positions in (None, [-1, -3]) if hook in ("z", "v") else (None,):
            exact = patch(model, clean, corrupt, m, hook=hook, layers=[3], positions=positions)
            est = attribute(model, clean, corrupt, m, hook=hook, layers=[3], positions=positions, method="atp")
            assert est.values.shape == exact.values.shape and est.index_names == exact.index_names
            assert pair_effects(exact).abs().max() > 0.1, hook  # not a flat sweep
            assert (est.pair_values - exact.pair_values).abs().max() <= 1e-4 * (1 + exact.pair_values.abs().max()), hook
    exact = patch(lin, clean, corrupt, m, hook="resid_pre", layers=[1])  # through nonlinear layers
    est = attribute(lin, clean, corrupt, m, hook="resid_pre", layers=[1], method="atp")
    assert (est.pair_values - exact.pair_values).abs().max() > 0.1


def test_noise_direction_and_normalisation_follow_patch(lin_attn, pairs):
    clean, corrupt, m = pairs
    exact = patch(lin_attn, clean, corrupt, m, hook="attn_out", layers=[3], direction="noise", normalize=True)
    est = attribute(lin_attn, clean, corrupt, m, hook="attn_out", layers=[3], direction="noise", normalize=True)
    assert est.normalized and est.direction == "noise" and est.baseline == 1.0
    assert (est.values - exact.values).abs().max() <= 1e-3
    assert est.clean_metric == pytest.approx(exact.clean_metric, abs=1e-4)
    assert est.corrupted_metric == pytest.approx(exact.corrupted_metric, abs=1e-4)


@pytest.mark.parametrize("hook, positions", [("q", None), ("q", [2, -1]), ("k", None), ("k", [1, 4, -1])])
def test_atp_star_qk_fix_equals_exact_patching_when_the_effect_is_only_through_the_pattern(
    lin_attn, pairs, hook, positions
):
    """Queries and keys of the last layer act only through its attention pattern, and with the last
    MLP off and ln_final linear the metric is linear in that pattern: recomputing the softmax (the QK
    fix) is then exact, while plain AtP, linear through the softmax, is not."""
    clean, corrupt, m = pairs
    lin = lin_attn
    exact = patch(lin, clean, corrupt, m, hook=hook, layers=[3], positions=positions)
    fixed = attribute(lin, clean, corrupt, m, hook=hook, layers=[3], positions=positions, method="atp*")
    plain = attribute(lin, clean, corrupt, m, hook=hook, layers=[3], positions=positions, method="atp")
    assert pair_effects(exact).abs().max() > 0.1
    tol = 1e-4 * (1 + float(exact.pair_values.abs().max()))
    assert (fixed.pair_values - exact.pair_values).abs().max() <= tol
    assert (plain.pair_values - exact.pair_values).abs().max() > 10 * tol  # the softmax is far from linear here


def additive_model(vocab: int = 50257):
    """A 2-layer model whose logit difference is a sum over positions p of f_p(resid_pre_0[p]) with
    nonlinear f_p: layer 0 attention off (positions do not mix), layer 0 MLP nonlinear per position,
    layer 1 attention uniform (zero queries) so it sums positions linearly, layer 1 MLP off,
    ln_final linear."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(2)
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=32, vocab_size=vocab)
    ).eval()
    with torch.no_grad():
        hf.transformer.wte.weight.mul_(8)
        hf.transformer.h[0].mlp.c_fc.weight.mul_(6)
    model = gi.from_transformers(hf).eval()
    d = model.cfg.d_model
    with torch.no_grad():
        model.blocks[0].attn.W_O.zero_()
        model.blocks[0].attn.b_O.zero_()
        model.blocks[1].attn.W_QKV[:, :d] = 0
        model.blocks[1].attn.b_QKV[:d] = 0
        model.blocks[1].attn.W_O.mul_(8)
        model.blocks[1].mlp.W_out.zero_()
        model.blocks[1].mlp.b_out.zero_()
        model.ln_final.eps = 1e12
        model.ln_final.w.mul_(1e7)
    return model


@pytest.mark.slow
def test_ig_converges_to_exact_patching_on_a_metric_additive_over_the_patched_cells():
    """resid_pre of layer 0 moves linearly along the input-embedding path, and the metric is a sum of
    per-position functions of it: IG's error shrinks to zero as the steps grow (midpoint rule:
    ~1/m²); AtP (one gradient) stays off."""
    model = additive_model()
    torch.manual_seed(3)
    clean = torch.randint(0, 1000, (3, 7))
    corrupt = clean.clone()
    corrupt[:, [1, 3, 4]] = torch.randint(0, 1000, (3, 3))
    m = logit_diff([11, 12, 13], [21, 22, 23])
    exact = patch(model, clean, corrupt, m, hook="resid_pre", layers=[0])
    assert effects(exact).abs().max() > 0.1
    err = {}
    for steps in (1, 4, 16, 48):
        est = attribute(model, clean, corrupt, m, hook="resid_pre", layers=[0], method="ig", ig_steps=steps)
        err[steps] = float((est.pair_values - exact.pair_values).abs().max())
    atp = attribute(model, clean, corrupt, m, hook="resid_pre", layers=[0], method="atp")
    atp_err = float((atp.pair_values - exact.pair_values).abs().max())
    scale = float(effects(exact).abs().max())
    assert atp_err > 0.05 * scale  # the per-position functions are far from linear
    assert err[1] > err[4] > err[16] and err[4] < atp_err
    assert err[48] <= 2e-3 * scale


def test_ig_converges_per_pair_and_per_cell_not_only_on_average():
    """IG's per-pair estimates (``pair_values``), not just their mean over pairs, converge to exact
    patching, pair by pair and cell by cell. The pairs differ in how many positions are corrupted
    (1, 2, 4, 6), so their effects differ in size and place: an estimate whose pairs were permuted
    (e.g. pairs and interpolation steps mixed up in a batched pass) has the same mean over pairs but
    fails here — checked on the estimate itself, rolled by one pair."""
    model = additive_model(vocab=1000)
    torch.manual_seed(5)
    clean = torch.randint(0, 1000, (4, 8))
    corrupt = clean.clone()
    for i, k in enumerate((1, 2, 4, 6)):
        pos = torch.randperm(8)[:k]
        corrupt[i, pos] = (clean[i, pos] + torch.randint(1, 999, (k,))) % 1000
    m = logit_diff([11, 12, 13, 14], [21, 22, 23, 24])
    exact = pair_effects(patch(model, clean, corrupt, m, hook="resid_pre", layers=[0]))
    totals = exact.abs().sum(-1).flatten()
    assert totals.max() > 2 * totals.min() and (exact != 0).sum() >= 10  # pairs of different effect sizes
    scale = float(exact.abs().max())
    est = pair_effects(attribute(model, clean, corrupt, m, hook="resid_pre", layers=[0], method="ig", ig_steps=32))
    assert (est - exact).abs().max() <= 5e-3 * scale
    assert (est.roll(1, 0) - exact).abs().max() > 0.2 * scale  # a permutation of pairs would fail
    assert (est.mean(0) - est.roll(1, 0).mean(0)).abs().max() <= 1e-5 * scale  # ... though its mean is the same
    few = pair_effects(attribute(model, clean, corrupt, m, hook="resid_pre", layers=[0], method="ig", ig_steps=3))
    chunked = pair_effects(
        attribute(model, clean, corrupt, m, hook="resid_pre", layers=[0], method="ig", ig_steps=3, batch_size=3)
    )
    assert (chunked - few).abs().max() <= 1e-4 * scale


@pytest.mark.parametrize(
    "hook, kw",
    [("z", dict(heads="all")), ("mlp_out", dict(positions="all")), ("resid_pre", dict(positions="all", layers=[1, 3]))],
)
def test_activation_path_ig_converges_to_exact_patching_where_a_layer_is_one_cell(small, pairs, hook, kw):
    """With one cell per layer (all heads, or all positions, patched together) the activation-path IG
    integrates exactly that patch: on a nonlinear model it converges to exact patching per pair as the
    steps grow (midpoint rule, error ~1/m²), while AtP and input-path IG stay off."""
    clean, corrupt, m = pairs
    exact = pair_effects(patch(small, clean, corrupt, m, hook=hook, **kw))
    scale = float(exact.abs().max())
    assert scale > 0.1
    err = {}
    for steps in (2, 24):
        est = attribute(small, clean, corrupt, m, hook=hook, method="ig", ig_steps=steps, ig_path="activations", **kw)
        assert est.ig_path == "activations" and est.values.shape == (exact.shape[1:])
        err[steps] = float((pair_effects(est) - exact).abs().max())
    atp = float((pair_effects(attribute(small, clean, corrupt, m, hook=hook, **kw)) - exact).abs().max())
    ig_in = float(
        (pair_effects(attribute(small, clean, corrupt, m, hook=hook, method="ig", ig_steps=24, **kw)) - exact)
        .abs()
        .max()
    )
    assert err[24] <= 2e-3 * scale and err[24] < err[2]
    assert atp > 10 * err[24] and ig_in > 10 * err[24]


def reference_input_ig(model, clean, corrupt, answers, wrongs, names, steps):
    """Integrated gradients on the input-embedding path, written out with autograd for one pair at a
    time: ``(a′ − a) · mean_α ∂M/∂a`` at the midpoints α = (i + ½)/steps, per cell of each named hook."""
    ct, kt, mask = pair_tokens(model, clean, corrupt)
    out = []
    for i in range(ct.shape[0]):
        c, k = ct[i : i + 1], kt[i : i + 1]
        am = None if mask is None else mask[i : i + 1]
        with torch.no_grad():
            _, cc = model.run_with_cache(c, attention_mask=am, names_filter=[*names, "hook_embed"])
            _, kc = model.run_with_cache(k, attention_mask=am, names_filter=[*names, "hook_embed"])
        grads = dict.fromkeys(names, 0.0)
        for s in range(steps):
            alpha = (s + 0.5) / steps
            emb = (kc["hook_embed"] + alpha * (cc["hook_embed"] - kc["hook_embed"])).requires_grad_(True)
            acts = {}

            def grab(act, hook, acts=acts):
                acts[hook.name] = act

            with model.hooks([("hook_embed", lambda act, hook, emb=emb: emb)] + [(x, grab) for x in names]):
                logits = model.last_logits(k, attention_mask=am)[0]
            metric = logits[answers[i]] - logits[wrongs[i]]
            for x, g in zip(names, torch.autograd.grad(metric, [acts[x] for x in names])):
                grads[x] = grads[x] + g / steps
        out.append(torch.stack([((cc[x] - kc[x]) * grads[x])[0].flatten(1).sum(-1) for x in names]))
    return torch.stack(out)  # [pair, layer, pos]


def test_ig_per_pair_equals_a_reference_written_pair_by_pair(small, pairs):
    """On a model where IG is not exact (nonlinear, attention mixing positions), the batched IG of
    ``attribute`` equals integrated gradients computed for each pair alone by a plain autograd loop,
    pair by pair and cell by cell (no pair sees another's path, answers or scale)."""
    clean, corrupt, _ = pairs
    answers = [small.tokenizer.encode_ids(x)[0] for x in (" Paris", " Madrid", " France")]
    wrongs = [small.tokenizer.encode_ids(x)[0] for x in (" Rome", " Tokyo", " England")]
    m = logit_diff(answers, wrongs)
    names = [f"blocks.{l}.hook_mlp_out" for l in range(small.cfg.n_layer)]
    ref = reference_input_ig(small, clean, corrupt, answers, wrongs, names, steps=3)
    est = pair_effects(attribute(small, clean, corrupt, m, hook="mlp_out", method="ig", ig_steps=3))
    assert ref.abs().max() > 0.1
    assert (est - ref).abs().max() <= 1e-4 * (1 + float(ref.abs().max()))


def test_graddrop_scores_equal_a_slow_loop_that_detaches_each_layer(small, pairs):
    """GradDrop: for each layer ℓ, the AtP estimate with no gradient through ℓ's attn_out and mlp_out,
    then (1/(L−1)) Σ_ℓ |Î_ℓ| per pair, averaged. Reference: one separate forward per ℓ with those
    outputs detached, gradients by autograd."""
    clean, corrupt, m = pairs
    est = attribute(small, clean, corrupt, m, hook="mlp_out", method="atp*")
    assert est.graddrop
    ct, kt, mask = pair_tokens(small, clean, corrupt)
    n = small.cfg.n_layer
    _, src = small.run_with_cache(ct, attention_mask=mask, names_filter=lambda x: x.endswith("hook_mlp_out"))
    bound = bind_metric(m, small, small.last_logits(ct, attention_mask=mask))
    total = torch.zeros(len(clean), n, ct.shape[1])
    for drop in range(n):
        acts = {}

        def grab(act, hook, acts=acts):
            act = act if act.requires_grad else act.detach().requires_grad_(True)
            acts[hook.name] = act
            return act

        def stop(act, hook):
            return act.detach()

        hooks = [(f"blocks.{l}.hook_mlp_out", grab) for l in range(n)]
        hooks += [(f"blocks.{drop}.hook_attn_out", stop), (f"blocks.{drop}.hook_mlp_out", stop)]
        with small.hooks([("hook_embed", lambda a, h: a.detach().requires_grad_(True)), *hooks]):
            out = bound(small.last_logits(kt, attention_mask=mask)[None])[0]
        names = [f"blocks.{l}.hook_mlp_out" for l in range(n)]
        grads = torch.autograd.grad(out.sum(), [acts[x] for x in names], allow_unused=True)
        for l, (x, g) in enumerate(zip(names, grads)):
            if g is not None:
                total[:, l] += ((src[x] - acts[x].detach()) * g).sum(-1).abs()
    expected = (total / (n - 1)).mean(0)
    assert (est.score - expected).abs().max() <= 1e-4 * (1 + expected.abs().max())
    assert expected.max() > 0.05 and not torch.allclose(est.score, effects(est).abs(), atol=1e-3)  # not plain |AtP|


def no_state_left(model):
    return all(not hp.has_hooks for hp in model.hook_dict.values()) and all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("method", ["atp", "atp*", "ig"])
def test_no_hooks_or_grads_are_left_after_a_call_or_an_exception(small, pairs, method):
    clean, corrupt, m = pairs
    attribute(small, clean, corrupt, m, hook="k", method=method)
    assert no_state_left(small)

    bound = bind_metric(m, small)

    def failing(logits):  # fails inside the gradient pass (and inside the hooked run for IG)
        if torch.is_grad_enabled() and logits.requires_grad:
            raise RuntimeError("metric failed")
        return bound(logits)

    failing.bind = lambda model, clean_logits=None: failing  # behave like a bindable metric
    with pytest.raises(RuntimeError, match="metric failed"):
        attribute(small, clean, corrupt, failing, hook="z", method=method)
    assert no_state_left(small)
    assert torch.is_grad_enabled()


def test_works_inside_no_grad_and_inference_mode(small, pairs):
    clean, corrupt, m = pairs
    ref = attribute(small, clean, corrupt, m, hook="q", layers=[2, 3], method="atp*")
    with torch.no_grad():
        got = attribute(small, clean, corrupt, m, hook="q", layers=[2, 3], method="atp*")
    assert torch.equal(got.values, ref.values) and torch.equal(got.score, ref.score)
    ref = attribute(small, clean, corrupt, m, hook="mlp_out", layers=[0], method="ig", ig_steps=2)
    with torch.inference_mode():
        got = attribute(small, clean, corrupt, m, hook="mlp_out", layers=[0], method="ig", ig_steps=2)
    assert torch.allclose(got.values, ref.values)


def test_batched_pairs_equal_separate_runs_and_chunking(small, pairs):
    clean, corrupt, _ = pairs
    m = logit_diff([" Paris", " Madrid", " France"], [" Rome", " Tokyo", " England"])
    both = attribute(small, clean, corrupt, m, hook="z", positions=[-1, -2], method="atp")
    chunked = attribute(small, clean, corrupt, m, hook="z", positions=[-1, -2], method="atp", batch_size=2)
    assert (both.pair_values - chunked.pair_values).abs().max() <= 1e-4
    for i, (a, w) in enumerate([(" Paris", " Rome"), (" Madrid", " Tokyo"), (" France", " England")]):
        alone = attribute(small, clean[i], corrupt[i], logit_diff(a, w), hook="z", positions=[-1, -2], method="atp")
        assert (both.pair_values[i] - alone.pair_values[0]).abs().max() <= 1e-3


def test_embeddings_and_full_hook_names_have_patch_axes(small, pairs):
    clean, corrupt, m = pairs
    for hook in ("embed", "blocks.1.mlp.hook_pre"):
        exact = patch(small, clean, corrupt, m, hook=hook)
        est = attribute(small, clean, corrupt, m, hook=hook, method="ig", ig_steps=2)
        assert est.values.shape == exact.values.shape and est.layer_labels == exact.layer_labels
    with pytest.raises(ValueError, match="final LayerNorm"):
        attribute(small, clean, corrupt, m, hook="ln_final.hook_scale")


def test_pattern_and_kl_metric(small, pairs):
    """Patterns (per head, per query row) and a nonlinear metric run, with the shapes of patch."""
    clean, corrupt, _ = pairs
    exact = patch(small, clean, corrupt, kl_to(), hook="pattern", layers=[2, 3])
    est = attribute(small, clean, corrupt, kl_to(), hook="pattern", layers=[2, 3], method="ig", ig_steps=3)
    assert est.values.shape == exact.values.shape == (2, 4)
    assert est.corrupted_metric == pytest.approx(exact.corrupted_metric, rel=1e-4)
    assert est.clean_metric == pytest.approx(0, abs=1e-5)


def test_result_has_patch_axes_labels_json_plot_and_verify_matches_exact(small, pairs, tmp_path):
    clean, corrupt, m = pairs
    est = attribute(small, clean, corrupt, m, hook="z", positions=[-1, 1], method="atp")
    exact = patch(small, clean, corrupt, m, hook="z", positions=[-1, 1])
    for f in ("index_names", "layers", "layer_labels", "positions", "position_labels", "heads", "head_labels"):
        assert getattr(est, f) == getattr(exact, f), f
    d = json.loads(est.to_json())
    assert d["method"] == "atp" and "_spec" not in d and len(d["values"]) == 4
    assert est.save_plot(tmp_path / "a.png").stat().st_size > 1000
    v = est.verify(k=3, candidates=5, controls=4)
    assert len(v.cells) == 9 and v.kind.count("control") == 4
    for c, e in zip(v.cells, v.exact):
        assert float(e) == pytest.approx(float(exact.values[c] - exact.baseline), abs=1e-4)
    truth = sorted(v.cells, key=lambda c: -abs(float(exact.values[c] - exact.baseline)))[:3]
    assert set(v.verified_top) == set(truth)
    looked_up = est.verify(k=3, candidates=5, controls=4, exact=exact)  # the same cells, read from the sweep
    assert looked_up.cells == v.cells and looked_up.verified_top == v.verified_top
    assert torch.allclose(looked_up.exact, v.exact, atol=1e-4) and looked_up.recall == v.recall
    with pytest.raises(ValueError, match="same arguments"):
        est.verify(k=3, exact=patch(small, clean, corrupt, m, hook="z"))
    assert v.save_plot(tmp_path / "v.png").stat().st_size > 1000 and "Spearman" in v.table()
    a = agreement(est, exact, k=5)
    assert -1 <= a.spearman <= 1 and 0 <= a.recall <= 1 and a.save_plot(tmp_path / "g.png").exists()


def test_spearman_equals_scipy():
    stats = pytest.importorskip("scipy.stats")
    torch.manual_seed(0)
    x, y = torch.randn(50), torch.randn(50)
    y[:10] = x[:10]
    x[5:8] = 1.0  # ties
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x.numpy(), y.numpy()).statistic, abs=1e-10)


def test_bad_input(small, pairs):
    clean, corrupt, m = pairs
    with pytest.raises(ValueError, match="method must be one of"):
        attribute(small, clean, corrupt, m, method="gradcam")
    with pytest.raises(KeyError, match="Did you mean 'resid_pre'"):
        attribute(small, clean, corrupt, m, hook="resid_pr")
    with pytest.raises(ValueError, match="ig_steps"):
        attribute(small, clean, corrupt, m, method="ig", ig_steps=0)
    with pytest.raises(ValueError, match="no head axis"):
        attribute(small, clean, corrupt, m, hook="mlp_out", heads=[0])
    with pytest.raises(IndexError, match="layer 4 is out of range"):
        attribute(small, clean, corrupt, m, layers=[4])
    with pytest.raises(ValueError, match="graddrop is part of"):
        attribute(small, clean, corrupt, m, graddrop=True)
    with pytest.raises(ValueError, match="ig_path must be"):
        attribute(small, clean, corrupt, m, method="ig", ig_path="edges")
    with pytest.raises(ValueError, match="ig_path is for method='ig'"):
        attribute(small, clean, corrupt, m, method="atp", ig_path="activations")


def test_cli_attribute(small, tmp_path, capsys):
    from gpt2_interp.cli import main

    small.save(tmp_path / "m")
    out = tmp_path / "fig.png"
    pair = ["attribute", "--model", str(tmp_path / "m"), "--clean", "The capital of France is"]
    pair += ["--corrupted", "The capital of Italy is", "--answer", " Paris"]
    rc = main(
        [*pair, "--wrong", " Rome", "--hook", "k", "--method", "atp*", "--verify", "3", "--out", str(out), "--json"]
    )
    assert rc == 0 and out.exists()
    d = json.loads(capsys.readouterr().out)
    assert d["method"] == "atp*" and d["hook"] == "k" and len(d["values"]) == 4
    rc = main([*pair, "--method", "ig", "--ig-steps", "2"])
    text = capsys.readouterr().out
    assert rc == 0 and "ig (2 steps, input path) estimate" in text and "highest-ranked cells" in text
    rc = main([*pair, "--method", "ig", "--ig-steps", "2", "--ig-path", "activations", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0 and d["method"] == "ig" and d["ig_path"] == "activations"


def test_subject_swaps_pair_same_length_prompts_of_one_relation_with_different_answers(facts_model):
    from gpt2_interp.facts.base import FactBase
    from gpt2_interp.facts.pairs import subject_swaps

    fb = FactBase.load()
    pairs = subject_swaps(fb, facts_model.tokenizer, 24, seed=1)
    assert len(pairs) == 24 and len({f.relation for f, _ in pairs.facts}) == len(fb.relations)
    tok = facts_model.tokenizer
    for c, k, a, w, (f, g) in zip(pairs.clean, pairs.corrupted, pairs.answers, pairs.wrongs, pairs.facts):
        assert f.relation == g.relation and f.subject in c and g.subject in k and f.subject != g.subject
        assert len(tok.encode_ids(c)) == len(tok.encode_ids(k)) and a != w
        assert a == tok.encode_ids(f.target)[0] and w == tok.encode_ids(g.target)[0]
    assert subject_swaps(fb, tok, 24, seed=1).clean == pairs.clean  # deterministic
