"""Which SAE latents carry a labelled attribute, and how well one latent alone separates it.

For labelled activations (e.g. the subject's last token in prompts of the fact base, labelled with
the subject's continent), every latent's activation is scored as a one-vs-rest detector of each class
by its AUROC (the probability that a random prompt of the class activates the latent more than a random
prompt of another class; ties count half; 0.5 is chance). :func:`latent_probe` picks, per class, the
latent with the highest AUROC on the training folds only and reports its AUROC on the held-out folds
(folds split by subject, as the linear probes split them), and a sparse probe — a logistic regression
on those picked latents alone, one per class (Gurnee et al.'s *k*-sparse probing with *k* = the number
of classes) — whose held-out accuracy can be set beside a linear probe on the full activation.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...core.boundary import boundary
from ...core.checks import check_index_list
from ...core.finite import nonfinite_summary
from ...core.result import Result
from ...core.tables import format_table


@boundary
def latent_auroc(latents: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """Each latent's AUROC ``[d_sae]`` as a detector of ``positive`` ``[n]`` (bool) from ``latents``
    ``[n, d_sae]`` (ties share their average rank: a latent that never fires scores 0.5)."""
    return _auroc_from_ranks(_ranks(latents), positive)


def _ranks(latents: torch.Tensor) -> torch.Tensor:
    """Each column's ranks ``[n, d]`` (1-based, ties averaged)."""
    from scipy.stats import rankdata

    return torch.from_numpy(rankdata(latents.detach().double().cpu().numpy(), axis=0))


def _auroc_from_ranks(ranks: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    positive = positive.bool().cpu()
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"an AUROC needs positives and negatives; got {n_pos} positive and {n_neg} negative rows")
    u = ranks[positive].sum(0) - n_pos * (n_pos + 1) / 2  # Mann-Whitney U
    return (u / (n_pos * n_neg)).float()


@boundary
@dataclass
class LatentProbe(Result):
    """Per class of ``task``: the latent picked on the training folds (``latent``: the one picked most
    often over the folds), its held-out AUROC (``auroc``: mean over folds of the held-out AUROC of each
    fold's pick), and the fraction of folds that picked the same latent (``agreement``); ``sparse_accuracy``
    ``[n_folds]``: held-out accuracy of a logistic regression on the picked latents, one per class;
    ``chance``: the majority class's held-out accuracy; ``hook_name``; ``classes``; ``n_prompts``."""

    result_kind = "latent probe"

    task: str
    hook_name: str
    classes: list[str]
    latent: list[int]
    auroc: list[float]
    agreement: list[float]
    sparse_accuracy: list[float]
    chance: float
    n_prompts: int

    def best(self) -> dict[str, Any]:
        """The class whose latent separates it best: ``{"class", "latent", "auroc"}``."""
        i = int(np.argmax(self.auroc))
        return {"class": self.classes[i], "latent": self.latent[i], "auroc": self.auroc[i]}

    def table(self) -> str:
        """One row per class: its latent, held-out AUROC and fold agreement."""
        rows = [
            [c, str(lat), f"{a:.3f}", f"{g:.0%}"]
            for c, lat, a, g in zip(self.classes, self.latent, self.auroc, self.agreement)
        ]
        head = ["class", "latent", "held-out AUROC", "folds agreeing"]
        return "\n".join(format_table(head, rows, right=[False, True, True, True]))


def _checked_folds(folds: list[tuple[np.ndarray, np.ndarray]], n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``folds`` as ``(train, test)`` integer index arrays into ``n`` prompts, each part non-empty and the
    two disjoint, else an error naming the fold (a boolean mask, an index out of range, an overlap)."""
    if not folds:
        raise ValueError("folds is empty: give (train, test) index arrays, e.g. a linear probe's folds")
    out = []
    for f, fold in enumerate(folds):
        if len(fold) != 2:
            raise ValueError(f"folds[{f}] must be a (train, test) pair of index arrays, got {len(fold)} items")
        parts = []
        for name, part in zip(("train", "test"), fold):
            parts.append(
                np.asarray(check_index_list(part, n, "prompt", f"folds[{f}] {name}", f"there are {n} prompts"))
            )
        shared = np.intersect1d(parts[0], parts[1])
        if len(shared):
            raise ValueError(
                f"folds[{f}]: train and test share {len(shared)} prompt(s) (e.g. {shared[:5].tolist()}); a held-out "
                "score needs disjoint folds"
            )
        out.append((parts[0], parts[1]))
    return out


@boundary
def latent_probe(
    latents: torch.Tensor,
    labels: list[str],
    folds: list[tuple[np.ndarray, np.ndarray]],
    task: str = "",
    hook_name: str = "",
    seed: int = 0,
) -> LatentProbe:
    """Pick one latent per class on each training fold and score it on the held-out fold (see the
    module's docstring). ``latents`` ``[n, d_sae]``: an SAE's latents for ``n`` labelled prompts;
    ``labels``: one class name per prompt; ``folds``: ``(train, test)`` index arrays (e.g. a linear
    probe's folds, split by subject); ``task`` and ``hook_name``: names kept in the result; ``seed``: the
    sparse probe's. A class missing from a training or
    held-out fold is scored on the folds that have it. Refused, naming the argument: latents that are not
    ``[n, d_sae]`` or hold NaN/inf, labels of one class, folds that are boolean masks, reach past the
    prompts, are empty or whose train and test parts overlap."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if latents.ndim != 2:
        raise ValueError(f"latents must be [n_prompts, d_sae], got shape {tuple(latents.shape)}")
    if not bool(torch.isfinite(latents).all()):
        raise ValueError(f"latents holds {nonfinite_summary(latents.detach())}: an AUROC needs finite activations")
    y = np.asarray(labels, dtype=str)
    if len(y) != len(latents):
        raise ValueError(f"got {len(y)} labels for {len(latents)} rows of latents; give one label per row")
    classes = sorted(set(y.tolist()))
    if len(classes) < 2:
        raise ValueError(
            f"labels hold {len(classes)} class(es) ({', '.join(map(repr, classes))} for all {len(y)} prompts): "
            "a probe separates at least two"
        )
    folds = _checked_folds(folds, len(y))
    picks: list[list[int]] = [[] for _ in classes]
    held: list[list[float]] = [[] for _ in classes]
    sparse, chance = [], []
    z = latents.detach().float().cpu()
    for train, test in folds:
        tr, te = torch.from_numpy(np.asarray(train)), torch.from_numpy(np.asarray(test))
        chosen = []
        ranks = _ranks(z[tr])  # one ranking per fold serves every class
        for c, cls in enumerate(classes):
            pos_tr, pos_te = torch.from_numpy(y[train] == cls), torch.from_numpy(y[test] == cls)
            if pos_tr.all() or not pos_tr.any():
                continue
            best = int(_auroc_from_ranks(ranks, pos_tr).argmax())
            picks[c].append(best)
            chosen.append(best)
            if pos_te.any() and not pos_te.all():
                held[c].append(float(latent_auroc(z[te][:, [best]], pos_te)[0]))
        cols = sorted(set(chosen))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000, random_state=seed))
            est.fit(z[tr][:, cols].numpy(), y[train])
        sparse.append(float(np.mean(est.predict(z[te][:, cols].numpy()) == y[test])))
        majority = Counter(y[train].tolist()).most_common(1)[0][0]
        chance.append(float(np.mean(y[test] == majority)))
    latent = [Counter(p).most_common(1)[0][0] if p else -1 for p in picks]
    return LatentProbe(
        task=task,
        hook_name=hook_name,
        classes=classes,
        latent=latent,
        auroc=[float(np.mean(h)) if h else float("nan") for h in held],
        agreement=[float(np.mean([q == lat for q in p])) if p else 0.0 for p, lat in zip(picks, latent)],
        sparse_accuracy=sparse,
        chance=float(np.mean(chance)),
        n_prompts=len(y),
    )


__all__ = ["LatentProbe", "latent_auroc", "latent_probe"]
