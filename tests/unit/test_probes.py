"""Linear probes: folds never split a subject, scaling is fitted on training folds only, a planted
linear signal is found while control tasks stay at chance, and bad input is refused with the fix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpt2_interp.analysis.probes import collect_activations, control_labels, probe, probe_features, probe_hooks
from gpt2_interp.facts.base import FactBase
from gpt2_interp.facts.probing import TASKS, period, probing_set


def planted(n_groups: int = 60, per_group: int = 8, d: int = 24, n_classes: int = 3, seed: int = 0):
    """Features for two 'layers': pure noise, and noise plus a class-dependent offset along one direction
    per class (a linearly decodable label, constant within a group)."""
    rng = np.random.default_rng(seed)
    group_label = rng.integers(0, n_classes, n_groups)
    groups = np.repeat(np.arange(n_groups), per_group)
    labels = np.array([f"c{k}" for k in group_label[groups]])
    dirs = rng.normal(size=(n_classes, d))
    noise = rng.normal(size=(len(groups), d))
    signal = noise + 3.0 * dirs[group_label[groups]] + rng.normal(size=(n_groups, d))[groups] * 0.3
    return [noise, signal * rng.uniform(0.5, 20, size=d)], labels, groups, dirs


def test_planted_linear_signal_is_found_and_controls_stay_at_chance():
    feats, labels, groups, _ = planted()
    for control in ("random-labels", "by-type"):
        r = probe_features(feats, labels, groups, control=control, n_folds=5)
        noise_acc, signal_acc = r.mean.tolist()
        assert signal_acc > 0.95, r.table()
        assert abs(noise_acc - 1 / 3) < 0.12, r.table()  # no signal: chance
        assert float(r.control_mean[1]) < r.chance + 0.12, r.table()  # the control cannot be learned
        assert float(r.selectivity[1]) > 0.5 and float(r.selectivity[0]) < 0.15
        assert r.first_decodable() == 1


def test_no_subject_is_in_both_train_and_test_folds():
    fb = FactBase.load()
    ds = probing_set("continent", fb, per_subject=3)
    feats = [np.random.default_rng(0).normal(size=(len(ds), 4))]
    r = probe_features(feats, ds.labels, ds.groups, n_folds=5, control=None)
    fold = np.asarray(r.fold)
    g = np.asarray(ds.groups)
    assert sorted(set(fold.tolist())) == list(range(5))
    for k in range(5):
        assert not set(g[fold == k]) & set(g[fold != k])


def test_scaler_is_fitted_on_the_training_folds_only():
    """Ridge probe scores equal a by-hand sklearn computation with the scaler fitted on each training
    fold; fitting it on all rows instead gives different scores (so the check can fail)."""
    from sklearn.linear_model import Ridge
    from sklearn.metrics import r2_score
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(1)
    n, d = 200, 30
    X = rng.normal(size=(n, d)) * rng.uniform(0.1, 10, d) + rng.normal(size=d) * 5
    y = X[:, :3] @ np.array([1.0, -0.5, 0.2]) + rng.normal(size=n)
    groups = np.repeat(np.arange(40), 5)
    r = probe_features([X], y, groups, n_folds=4, C=0.05, control=None)
    assert r.kind == "regression" and r.metric == "R²"
    fold = np.asarray(r.fold)
    by_hand, leaky = [], []
    for k in range(4):
        tr, te = fold != k, fold == k
        for fit_rows, out in ((tr, by_hand), (np.ones(n, bool), leaky)):
            sc = StandardScaler().fit(X[fit_rows])
            m = Ridge(alpha=1 / 0.05).fit(sc.transform(X[tr]), y[tr])
            out.append(r2_score(y[te], m.predict(sc.transform(X[te]))))
    np.testing.assert_allclose(r.scores[0].double().numpy(), by_hand, rtol=0, atol=1e-6)
    assert np.abs(np.array(leaky) - np.array(by_hand)).max() > 1e-4


def test_direction_points_along_the_planted_class_direction_in_raw_activation_space():
    feats, labels, groups, _ = planted(n_classes=2, d=16)
    r = probe_features(feats, labels, groups, control=None)
    X = feats[1]
    w = r.direction(1, "c1")
    est = r.estimators[1]
    before = est.decision_function(X[:20])
    after = est.decision_function(X[:20] + 2.0 * w.numpy())
    assert (after > before).all()  # moving along the direction raises the probe's score for c1
    assert torch.allclose(w.norm(), torch.tensor(1.0))
    with pytest.raises(KeyError, match="probed"):
        r.direction(7)


def test_control_labels_keep_the_label_counts_and_by_type_is_constant_within_a_group():
    labels = np.array(list("aaabbbccdd" * 3))
    groups = np.repeat(np.arange(15), 2)
    labels = labels[np.repeat(np.arange(0, 30, 2), 2)]  # one label per group
    for kind in ("random-labels", "by-type"):
        c = control_labels(labels, groups, kind, seed=3)
        assert sorted(c) == sorted(labels)
    c = control_labels(labels, groups, "by-type", seed=3)
    assert all(len(set(c[groups == g])) == 1 for g in np.unique(groups))


def test_bad_input_is_refused_with_the_fix():
    feats, labels, groups, _ = planted(n_groups=6, per_group=4)
    with pytest.raises(ValueError, match="one label per prompt"):
        probe_features(feats, labels[:-1], groups)
    with pytest.raises(ValueError, match="at least two classes"):
        probe_features(feats, ["x"] * len(labels), groups)
    with pytest.raises(ValueError, match="Lower n_folds to at most 6"):
        probe_features(feats, labels, groups, n_folds=10)
    with pytest.raises(ValueError, match="one group"):
        probe_features(feats, labels, groups[:-1])
    with pytest.raises(ValueError, match="control must be one of"):
        probe_features(feats, labels, groups, control="shuffled")


def test_unknown_hook_and_bad_layers_are_refused(tiny):
    with pytest.raises(ValueError, match=r"unknown hook 'resid_psot'.*resid_post"):
        probe_hooks(tiny, "resid_psot")
    with pytest.raises(ValueError, match=r"layers 0\.\.1"):
        probe_hooks(tiny, "resid_post", layers=[5])
    with pytest.raises(ValueError, match="not by position"):
        probe_hooks(tiny, "pattern")
    assert probe_hooks(tiny, "resid") == (
        ["blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", "blocks.1.hook_resid_post"],
        ["embed", "L0", "L1"],
    )
    with pytest.raises(ValueError, match="one label per prompt"):
        probe(tiny, ["a b", "c d"], labels=["x"])


@pytest.mark.parametrize("position", ["last-subject", "last", "mean-subject"])
def test_batched_left_padded_activations_equal_one_prompt_at_a_time(tiny, position):
    prompts = ["The capital of France is", "Germany is a country in", "In the Republic of Congo, people speak"]
    subjects = ["France", "Germany", "Republic of Congo"]
    names = ["blocks.1.hook_resid_post", "blocks.0.attn.hook_z"]
    acts = collect_activations(tiny, prompts, names, subjects, position, batch_size=3)
    from gpt2_interp.analysis.tokens import subject_span

    for i, (p, s) in enumerate(zip(prompts, subjects)):
        _, cache = tiny.run_with_cache(p, names_filter=names)
        lo, hi = subject_span(tiny, p, s)
        n = tiny.to_tokens(p).shape[1]
        sl = {"last-subject": slice(hi - 1, hi), "last": slice(n - 1, n), "mean-subject": slice(lo, hi)}[position]
        for name in names:
            want = cache[name][0, sl].reshape(sl.stop - sl.start, -1).mean(0)
            torch.testing.assert_close(acts[name][i], want, atol=1e-5, rtol=1e-5)


def test_probing_sets_are_grouped_by_subject_with_the_fact_base_labels():
    fb = FactBase.load()
    assert [period(z) for z in (1, 2, 3, 10, 11, 26, 55, 79, 87, 118)] == [1, 1, 2, 2, 3, 4, 6, 6, 7, 7]
    continent = {f.subject: f.object for f in fb.facts("country_continent")}
    ds = probing_set("continent", fb, per_subject=4)
    assert len(ds) == 4 * len(continent) and ds.groups == ds.subjects
    for p, s, y in zip(ds.prompts, ds.subjects, ds.labels):
        assert s in p and continent[s] == y
    own = probing_set("continent", fb, per_subject=None, which="own")
    assert len(own) == len(continent) * len(set(own.templates))
    others = probing_set("continent", fb, which="others")
    assert not set(others.templates) & set(own.templates)
    number = {f.subject: int(f.object) for f in fb.facts("element_number")}
    per = probing_set("period", fb, per_subject=1)
    assert all(y == str(period(number[s])) for s, y in zip(per.subjects, per.labels))
    assert probing_set("atomic_number", fb, per_subject=1).kind == "regression"
    with pytest.raises(KeyError, match="known: continent"):
        probing_set("continents")
    assert set(TASKS) >= {"continent", "period", "country"}


@pytest.mark.slow
def test_continent_is_decodable_from_the_subject_in_gpt2_facts(facts_model):
    ds = probing_set("continent", per_subject=2)
    r = probe(facts_model, ds, layers=[0, 5], control="by-type")
    assert r.n_groups == ds.n_subjects and r.position == "last-subject"
    assert (r.mean > 0.7).all() and (r.control_mean < r.chance + 0.1).all(), r.table()
    assert "selectivity" in r.table() and r.plot() is not None
    d = r.to_dict()
    assert "estimators" not in d and len(d["selectivity"]) == 2


@pytest.mark.slow
def test_cli_probe_prints_the_layer_table(facts_model, capsys):
    from gpt2_interp.cli import main

    assert main(["probe", "--task", "period", "--per-subject", "1", "--folds", "3", "--hook", "resid_post"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("probe 'period'") and "selectivity" in out and "L5" in out
    assert main(["probe", "--task", "period", "--hook", "resid_psot"]) == 2
    assert "unknown hook 'resid_psot'" in capsys.readouterr().err
