"""Latent AUROCs against scikit-learn's, and the latent probe on latents whose meaning is planted."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from gpt2_interp.analysis.features.latent_probes import latent_auroc, latent_probe


def test_latent_auroc_equals_sklearn_with_ties_and_silent_latents():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(60, 7, generator=g).relu()  # sparse: about half the entries are tied zeros
    z[:, 3] = 0  # a latent that never fires
    pos = torch.rand(60, generator=g) < 0.3
    got = latent_auroc(z, pos)
    want = [roc_auc_score(pos.numpy(), z[:, j].numpy()) for j in range(7)]
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float32), atol=1e-6)
    assert got[3] == 0.5
    with pytest.raises(ValueError, match="positives and negatives"):
        latent_auroc(z, torch.ones(60, dtype=torch.bool))


def test_latent_probe_finds_the_planted_latents_and_scores_them_on_held_out_folds():
    g = torch.Generator().manual_seed(1)
    labels = ["a", "b", "c"] * 20
    z = torch.rand(60, 10, generator=g) * 0.5  # noise latents
    planted = {"a": 7, "b": 2, "c": 4}
    for i, y in enumerate(labels):
        z[i, planted[y]] += 1.0  # each class lights its own latent above all noise
    z[:, 9] = torch.rand(60, generator=g)
    idx = np.arange(60)
    folds = [(idx[idx // 3 % 3 != k], idx[idx // 3 % 3 == k]) for k in range(3)]  # every fold has every class
    r = latent_probe(z, labels, folds, task="planted")
    assert r.classes == ["a", "b", "c"] and r.latent == [7, 2, 4]
    assert r.auroc == [1.0, 1.0, 1.0] and r.agreement == [1.0, 1.0, 1.0]
    assert r.sparse_accuracy == [1.0, 1.0, 1.0] and r.chance == pytest.approx(1 / 3)
    assert r.best()["auroc"] == 1.0 and "held-out AUROC" in r.table()
    # labels unrelated to the latents: held-out AUROCs near chance, well below the planted ones
    shuffled = [labels[i] for i in torch.randperm(60, generator=g).tolist()]
    noise = latent_probe(z[:, [0, 1, 3, 5, 6, 8, 9]], shuffled, folds)
    assert max(noise.auroc) < 0.85
    with pytest.raises(ValueError, match="one label per row"):
        latent_probe(z, labels[:-1], folds)
