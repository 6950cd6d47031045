"""Attribution and patching inputs answered clearly: a non-finite or non-differentiable metric, bad
counts, multi-token or identical answers, degenerate dataset lines and non-integer indices each get
an error (or warning) naming the argument, metric or file — and valid inputs keep their results,
checked against hand-computed values (a plain autograd loop, hand-picked logits, a sort)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gpt2_interp.analysis.attribution import agreement, attribute, spearman, top_cells
from gpt2_interp.analysis.metrics import logit_diff
from gpt2_interp.analysis.patching import patch
from gpt2_interp.cli import main
from gpt2_interp.core.finite import NonFiniteWarning

CLEAN, CORRUPTED = "The capital of France is", "The capital of Italy is"
ESTIMATORS = [
    dict(method="atp"),
    dict(method="atp*"),
    dict(method="ig", ig_steps=2),
    dict(method="ig", ig_steps=2, ig_path="activations"),
]


def nan_metric(logits):
    return logits[..., 0] * float("nan")


def inf_metric(logits):
    return logits[..., 0] + float("inf")


def argmax_metric(logits):
    return logits.argmax(-1).float()


def detached_metric(logits):
    return logits[..., 0].detach()


# ------------------------------------------------------------------ the metric
@pytest.mark.parametrize("kw", ESTIMATORS, ids=lambda kw: f"{kw['method']}-{kw.get('ig_path', 'input')}")
@pytest.mark.parametrize("metric, value", [(nan_metric, "NaN"), (inf_metric, "inf")])
def test_every_estimator_refuses_a_non_finite_metric_naming_it_and_the_value(tiny, kw, metric, value):
    with pytest.raises(
        ValueError, match=rf"metric {metric.__name__} on the (clean|corrupted) run is not finite \(\d+ {value}"
    ):
        attribute(tiny, CLEAN, CORRUPTED, metric, hook="resid_pre", **kw)


@pytest.mark.parametrize("kw", ESTIMATORS, ids=lambda kw: f"{kw['method']}-{kw.get('ig_path', 'input')}")
@pytest.mark.parametrize("metric", [argmax_metric, detached_metric])
def test_every_estimator_refuses_a_non_differentiable_metric_naming_it(tiny, kw, metric):
    with pytest.raises(ValueError, match=rf"metric {metric.__name__} is not differentiable in the logits"):
        attribute(tiny, CLEAN, CORRUPTED, metric, hook="resid_pre", **kw)
    patch(tiny, CLEAN, CORRUPTED, metric, layers=[0])  # exact patching takes any finite metric


def test_atp_of_a_custom_metric_equals_a_hand_written_gradient_product(tiny):
    """AtP on resid_pre of layer 1 = (clean − corrupted activation) · ∂M/∂a, from a plain autograd run."""

    def metric(logits):  # any differentiable function of the logits
        return logits[..., 5].tanh() * 3 - logits[..., 7] ** 2 / 10

    name = "blocks.1.hook_resid_pre"
    tokens = tiny.to_tokens([CLEAN, CORRUPTED])
    with torch.no_grad():
        _, cache = tiny.run_with_cache(tokens, names_filter=[name])
    store = {}

    def leaf(act, hook):
        store["a"] = act.detach().requires_grad_(True)
        return store["a"]

    with tiny.hooks([(name, leaf)]):
        m = metric(tiny(tokens[1:])[:, -1])
    (grad,) = torch.autograd.grad(m.sum(), [store["a"]])
    expected = m.item() + ((cache[name][0] - cache[name][1]) * grad[0]).sum(-1)  # [pos]
    est = attribute(tiny, CLEAN, CORRUPTED, metric, hook="resid_pre", layers=[1], method="atp")
    torch.testing.assert_close(est.values[0], expected, rtol=1e-4, atol=1e-5)


def test_a_metric_whose_gradient_is_not_finite_gives_a_warning_naming_it(tiny):
    def sqrt_metric(logits):  # 0 everywhere (finite), but d√x/dx at 0 is inf: the gradient is NaN
        return (logits[..., 0] * 0).sqrt()

    with pytest.warns(NonFiniteWarning, match=r"gradient of metric sqrt_metric holds NaN/inf"):
        est = attribute(tiny, CLEAN, CORRUPTED, sqrt_metric, hook="resid_pre", layers=[1])
    assert torch.isnan(est.values).all()


def test_spearman_gives_ties_their_average_rank():
    # x ranks 1, 2.5, 2.5, 4 and y ranks 1, 3, 2, 4: Pearson of the ranks by hand = 4.5 / √(4.5 · 5)
    x, y = torch.tensor([1.0, 2.0, 2.0, 3.0]), torch.tensor([10.0, 30.0, 20.0, 40.0])
    assert spearman(x, y) == pytest.approx(4.5 / (4.5 * 5) ** 0.5, abs=1e-12)
    assert spearman(x, -y) == pytest.approx(-4.5 / (4.5 * 5) ** 0.5, abs=1e-12)
    assert np.isnan(spearman(torch.ones(4), y)) and np.isnan(spearman(x[:1], y[:1]))
    with pytest.raises(ValueError, match="one size"):
        spearman(x, y[:3])


# ------------------------------------------------------------------ counts
@pytest.fixture(scope="module")
def results(facts_model):
    metric = logit_diff(" Paris", " Rome")
    exact = patch(facts_model, CLEAN, CORRUPTED, metric, hook="mlp_out")
    est = attribute(facts_model, CLEAN, CORRUPTED, metric, hook="mlp_out", method="atp")
    return exact, est


@pytest.mark.parametrize(
    "call, arg",
    [
        (lambda ex, est: ex.top(-1), "k"),
        (lambda ex, est: ex.table(k=-2), "k"),
        (lambda ex, est: est.top(-1), "k"),
        (lambda ex, est: est.table(-1), "k"),
        (lambda ex, est: est.verify(k=0, exact=ex), "k"),
        (lambda ex, est: est.verify(k=2, candidates=-1, exact=ex), "candidates"),
        (lambda ex, est: est.verify(k=2, controls=-1, exact=ex), "controls"),
        (lambda ex, est: agreement(est, ex, k=0), "k"),
        (lambda ex, est: top_cells(est.values, -3), "k"),
    ],
)
def test_a_negative_count_is_refused_naming_the_argument(results, call, arg):
    with pytest.raises(ValueError, match=rf"^{arg} must be ≥ \d, got -?\d"):
        call(*results)


@pytest.mark.parametrize(
    "call, arg",
    [
        (lambda ex, est: ex.top(2.5), "k"),
        (lambda ex, est: est.verify(k="3", exact=ex), "k"),
        (lambda ex, est: est.verify(k=2, controls=1.0, exact=ex), "controls"),
    ],
)
def test_a_non_integer_count_is_refused_naming_the_argument(results, call, arg):
    with pytest.raises(TypeError, match=rf"^{arg} must be an int"):
        call(*results)


def test_valid_counts_still_rank_the_cells_by_effect(results):
    exact, est = results
    effect = (exact.values - exact.baseline).abs().flatten()
    order = sorted(range(effect.numel()), key=lambda i: -float(effect[i]))[:3]  # a plain sort as the reference
    assert [np.ravel_multi_index(c, exact.values.shape) for c, _ in exact.top(3)] == order
    assert exact.top(0) == [] and len(exact.table(2).splitlines()) == 4  # heading, header row, two cells
    v = est.verify(k=2, candidates=3, controls=0, exact=exact)
    assert v.kind == ["top"] * 3 and v.k == 2


# ------------------------------------------------------------------ answers
def test_logit_diff_refuses_a_multi_token_answer_naming_the_argument_and_its_tokens(tiny):
    with pytest.raises(ValueError, match=r"answer: ' Paris France' is 2 tokens \[' Paris', ' France'\]"):
        logit_diff(" Paris France", " Rome", model=tiny)
    with pytest.raises(ValueError, match=r"wrong: ' Rome Italy' is 2 tokens"):
        patch(tiny, CLEAN, CORRUPTED, logit_diff(" Paris", " Rome Italy"))
    with pytest.raises(ValueError, match=r"answer\[1\]: ' Rome Italy' is 2 tokens"):
        patch(tiny, [CLEAN, CLEAN], [CORRUPTED, CORRUPTED], logit_diff([" Paris", " Rome Italy"], [" Rome", " Paris"]))
    with pytest.raises(ValueError, match=r"wrong: '' is 0 tokens"):
        logit_diff(" Paris", "", model=tiny)


def test_logit_diff_refuses_the_same_answer_and_wrong_for_every_pair(tiny):
    with pytest.raises(ValueError, match=r"answer and wrong are the same token .*' Paris'.* 0 for every run"):
        patch(tiny, CLEAN, CORRUPTED, logit_diff(" Paris", " Paris"))
    with pytest.raises(ValueError, match=r"same token"):
        attribute(tiny, CLEAN, CORRUPTED, logit_diff(" Paris", " Paris"))
    # one equal pair among others is fine, also when attribution runs the pairs one chunk at a time;
    # that pair's logit difference is 0 on every run, so its estimate is exactly 0
    est = attribute(
        tiny,
        [CLEAN, CLEAN],
        [CORRUPTED, CORRUPTED],
        logit_diff([" Paris", " Paris"], [" Paris", " Rome"]),
        layers=[0],
        batch_size=1,
    )
    assert torch.equal(est.pair_values[0], torch.zeros_like(est.pair_values[0])) and est.pair_values[1].abs().sum() > 0


def test_a_valid_logit_diff_is_the_difference_of_the_two_logits(tiny):
    logits = torch.randn(3, tiny.cfg.d_vocab)
    paris, rome = tiny.to_single_token(" Paris"), tiny.to_single_token(" Rome")
    torch.testing.assert_close(logit_diff(" Paris", " Rome", model=tiny)(logits), logits[:, paris] - logits[:, rome])
    per_pair = logit_diff(
        [" Paris", " Rome", " Paris"], [" Rome", " Paris", " Paris"], model=tiny
    )  # one pair equal: fine
    expected = torch.stack([logits[0, paris] - logits[0, rome], logits[1, rome] - logits[1, paris], torch.tensor(0.0)])
    torch.testing.assert_close(per_pair(logits), expected)


# ------------------------------------------------------------------ indices
@pytest.mark.parametrize("fn", [patch, attribute], ids=["patch", "attribute"])
@pytest.mark.parametrize(
    "kw, error, match",
    [
        (dict(layers=[1.0]), TypeError, r"layers\[0\] must be an int, got float 1\.0 \(in layers="),
        (dict(layers=1), TypeError, r"layers must be a list of ints or None, got int"),
        (dict(positions=[0.5]), TypeError, r"positions\[0\] must be an int, got float 0\.5 \(in positions="),
        (dict(positions=2), TypeError, r"positions must be a list of ints"),
        (dict(hook="z", heads=[1.0]), TypeError, r"heads\[0\] must be an int, got float 1\.0 \(in heads="),
        (dict(hook="z", heads=3), TypeError, r"heads must be a list of ints"),
        (dict(layers=[5]), IndexError, r"layer 5 is out of range.*\(in layers=\[5\]\)"),
    ],
)
def test_non_integer_or_scalar_indices_are_refused_naming_the_argument(tiny, fn, kw, error, match):
    with pytest.raises(error, match=match):
        fn(tiny, CLEAN, CORRUPTED, logit_diff(" Paris", " Rome"), **kw)


def test_integer_like_indices_give_the_same_sweep_as_ints(tiny):
    metric = logit_diff(" Paris", " Rome")
    ref = patch(tiny, CLEAN, CORRUPTED, metric, hook="z", layers=[1], positions=[2, 4], heads=[0, 3])
    alt = patch(
        tiny,
        CLEAN,
        CORRUPTED,
        metric,
        hook="z",
        layers=torch.tensor([1]),
        positions=np.array([2, 4]),
        heads=(np.int64(0), 3),
    )
    torch.testing.assert_close(alt.values, ref.values)
    est = attribute(tiny, CLEAN, CORRUPTED, metric, hook="z", layers=(1,), positions=torch.tensor([2, 4]), heads=[0, 3])
    assert est.values.shape == ref.values.shape and est.positions == [2, 4] and est.heads == [0, 3]


@pytest.mark.parametrize("command", ["patch", "attribute"])
def test_cli_layers_that_are_not_integers_are_one_line_error_naming_the_option(capsys, command):
    code = main([command, "--clean", CLEAN, "--corrupted", CORRUPTED, "--answer", " Paris", "--layers", "0,1.5"])
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert code != 0 and len(err) == 1 and "--layers" in err[0] and "'0,1.5'" in err[0]


@pytest.mark.parametrize("fn", [patch, attribute], ids=["patch", "attribute"])
def test_patch_and_attribute_name_hooks_by_one_rule(tiny, fn):
    metric = logit_diff(" Paris", " Rome")
    with pytest.raises(KeyError, match=r"unknown hook name 'blocks\.0\.hook_resid_prex'.*Did you mean"):
        fn(tiny, CLEAN, CORRUPTED, metric, hook="blocks.0.hook_resid_prex")
    with pytest.raises(ValueError, match=r"is one hook point; to sweep layers pass a family name"):
        fn(tiny, CLEAN, CORRUPTED, metric, hook="blocks.0.hook_resid_pre", layers=[0])


# ------------------------------------------------------------------ patch --dataset
def _dataset(tmp_path, lines):
    path = tmp_path / "pairs.jsonl"
    path.write_text(
        "".join(f'{{"clean": "{c}", "corrupted": "{k}", "answer": "{a}", "wrong": "{w}"}}\n' for c, k, a, w in lines)
    )
    return str(path)


def test_patch_dataset_whose_answer_equals_wrong_on_every_line_is_one_line_error(tmp_path, capsys):
    path = _dataset(
        tmp_path,
        [
            (CLEAN, CORRUPTED, " Paris", " Paris"),
            ("The capital of Spain is", "The capital of Japan is", " Madrid", " Madrid"),
        ],
    )
    code = main(["patch", "--dataset", path, "--layers", "0"])
    out, err = capsys.readouterr()
    lines = [l for l in err.splitlines() if l.strip()]
    assert code != 0 and out == "" and len(lines) == 1
    assert path in lines[0] and "answer equals wrong on lines 1, 2" in lines[0]


def test_patch_dataset_with_a_few_degenerate_lines_warns_naming_them_and_patches_the_rest(
    tmp_path, capsys, facts_model
):
    good = [
        (CLEAN, CORRUPTED, " Paris", " Rome"),
        ("The capital of Spain is", "The capital of Japan is", " Madrid", " Tokyo"),
    ]
    path = _dataset(
        tmp_path, [good[0], (CLEAN, CORRUPTED, " Paris", " Paris"), good[1], (CLEAN, CLEAN, " Paris", " Rome")]
    )
    code = main(["patch", "--dataset", path, "--layers", "0", "--json"])
    out, err = capsys.readouterr()
    assert code == 0
    warning = [l for l in err.splitlines() if "warning" in l]
    assert len(warning) == 1 and path in warning[0] and "2 of 4 pairs" in warning[0]
    assert "answer equals wrong on line 2" in warning[0] and "clean equals corrupted on line 4" in warning[0]
    # the good pairs keep the values they have when patched alone
    ref = patch(
        facts_model,
        [g[0] for g in good],
        [g[1] for g in good],
        logit_diff([g[2] for g in good], [g[3] for g in good]),
        layers=[0],
    )
    got = json.loads(out)
    pair_values = torch.tensor(got["pair_values"])
    torch.testing.assert_close(pair_values[[0, 2]], ref.pair_values, rtol=1e-4, atol=1e-4)
