"""Linear probes on activations, with control tasks (scikit-learn does the statistics).

For each layer a probe ``Pipeline(StandardScaler, LogisticRegression)`` (``Ridge`` for a
real-valued label) is cross-validated over folds split by *group* (the subject: no subject is
in a training and a test fold; ``StratifiedGroupKFold``/``GroupKFold``). The scaler is part of
the pipeline, so it is fitted on the training folds only. Scores are accuracy (R² for
regression) per fold; the confidence interval is the t-interval over folds.

Control tasks (Hewitt & Liang 2019) ask how much of a probe's score the probe could reach on
labels the representation does not carry. The control is fitted and scored on the very same
folds and features with control labels:

* ``"random-labels"``: the labels permuted over prompts;
* ``"by-type"``: each group (subject) gets one random label, the group-level labels permuted
  (Hewitt & Liang's control: a label per word type). Under subject-grouped folds the test
  subjects' control labels cannot be memorised, so this control measures what a probe reaches
  on a label that is consistent within a subject but unrelated to it.

``selectivity = score(task) − score(control)`` per layer.

Activations are collected in batches through ``run_with_cache`` with a names filter (only the
probed hook points are kept) at one position per prompt: the last subject token, the last
token, or the mean over the subject's tokens.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..core.boundary import boundary
from ..core.checks import check_count, check_prompts
from ..core.progress import progress_bar
from ..core.result import Result, to_jsonable
from ..core.tables import format_table
from ..model.fingerprint import weights_fingerprint
from ..model.hooks import hook_name
from .tokens import subject_span

if TYPE_CHECKING:
    from matplotlib.figure import Figure
    from sklearn.pipeline import Pipeline

    from ..model import HookedGPT2

POSITIONS = ("last-subject", "last", "mean-subject")
CONTROLS = ("random-labels", "by-type", None)
Layers = str | int | Sequence[int]


# ---------------------------------------------------------------------------- activations
def probe_hooks(model: HookedGPT2, hook: str, layers: Layers = "all") -> tuple[list[str], list[str]]:
    """``(full hook names, short labels)`` to probe: a family (``"resid_post"``, ``"mlp_out"``,
    ``"z"``…) at ``layers`` (``"all"``, an int or a list), ``"resid"`` (every layer boundary:
    ``embed`` = resid_pre 0, then ``L{i}`` = resid_post i), or one full hook name."""
    known = model.hook_names()
    n = model.cfg.n_layer
    if hook in known:
        return [hook], [hook]
    if hook == "resid":  # every layer boundary, as the logit lens reads them: embeddings, then after each block
        names = [hook_name("resid_pre", 0)] + [hook_name("resid_post", i) for i in range(n)]
        labels = ["embed"] + [f"L{i}" for i in range(n)]
        if isinstance(layers, str):
            if layers != "all":
                raise ValueError(f"layers must be 'all', an int or a list of ints, got {layers!r}")
            return names, labels
        picked = [layers] if isinstance(layers, int) else list(layers)
        return [names[i + 1] for i in picked], [labels[i + 1] for i in picked]
    try:
        template = hook_name(hook, 0)
    except KeyError as e:
        raise ValueError(
            f"unknown hook {hook!r}: give a hook family (e.g. 'resid_post', 'resid_pre', 'mlp_out', 'attn_out', 'z') "
            f"or a full name from model.hook_names() (e.g. {known[2]!r}). {e.args[0]}"
        ) from None
    if template not in known:  # a family without layers, e.g. "embed"
        name = hook_name(hook)
        return [name], [hook]
    if isinstance(layers, str):
        if layers != "all":
            raise ValueError(f"layers must be 'all', an int or a list of ints, got {layers!r}")
        idx = list(range(n))
    else:
        idx = [layers] if isinstance(layers, int) else list(layers)
        if not idx:
            raise ValueError("layers is empty: give 'all', an int or a list of ints")
        bad = [i for i in idx if not -n <= i < n]
        if bad:
            raise ValueError(f"layer {bad[0]} is out of range: {model.cfg.name} has layers 0..{n - 1}")
        idx = [i % n for i in idx]
    if hook in ("attn_scores", "scores", "pattern", "attn"):
        raise ValueError(
            f"hook {hook!r} is indexed [batch, head, query, key], not by position; probe 'z' "
            "(per-head outputs) or 'attn_out' instead"
        )
    return [hook_name(hook, i) for i in idx], [f"L{i}" for i in idx]


def _positions(
    model: HookedGPT2, prompts: list[str], subjects: list[str] | None, position: str, lengths: list[int]
) -> list[tuple[int, int]]:
    """Per prompt, the span ``[lo, hi)`` of its own tokens (BOS = 0) that the position rule reads."""
    if position == "last":
        return [(n - 1, n) for n in lengths]
    if subjects is None:
        raise ValueError(f"position={position!r} needs subjects= (one per prompt); or use position='last'")
    spans = [subject_span(model, p, s) for p, s in zip(prompts, subjects)]
    if position == "last-subject":
        return [(hi - 1, hi) for _, hi in spans]
    return spans


@torch.no_grad()
def collect_activations(
    model: HookedGPT2,
    prompts: Sequence[str],
    names: Sequence[str],
    subjects: Sequence[str] | None = None,
    position: str = "last-subject",
    batch_size: int = 64,
    progress: bool | None = None,
) -> dict[str, torch.Tensor]:
    """``{hook name: activations [n_prompts, d]}`` (float32, CPU) at one position per prompt.

    ``position``: ``"last-subject"`` (the subject's last token), ``"last"`` (the prompt's last
    token) or ``"mean-subject"`` (mean over the subject's tokens). Activations with more than one
    feature dimension (``z``: ``[head, d_head]``) are flattened. Prompts are left-padded and run
    ``batch_size`` at a time, caching only ``names``.
    """
    if position not in POSITIONS:
        raise ValueError(f"position must be one of {POSITIONS}, got {position!r}")
    batch_size = check_count(batch_size, "batch_size")
    prompts = check_prompts(prompts, "prompts")
    subjects = None if subjects is None else list(subjects)
    if subjects is not None and len(subjects) != len(prompts):
        raise ValueError(f"got {len(subjects)} subjects for {len(prompts)} prompts; give one subject per prompt")
    out: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    starts = range(0, len(prompts), batch_size)
    for s in progress_bar(starts, desc="activations", enabled=progress if progress is not None else len(starts) > 8):
        chunk = prompts[s : s + batch_size]
        tokens, mask = model.tokenize(chunk)
        width = tokens.shape[1]
        model.check_length(width)
        lengths = mask.sum(-1).tolist() if mask is not None else [width] * len(chunk)
        spans = _positions(model, chunk, None if subjects is None else subjects[s : s + batch_size], position, lengths)
        _, cache = model.run_with_cache(tokens, names_filter=list(names), attention_mask=mask, return_type=None)
        # a [batch, width] weight matrix: 1/len over each prompt's span (left padding shifts columns)
        w = torch.zeros(len(chunk), width, device=tokens.device)
        for b, ((lo, hi), n) in enumerate(zip(spans, lengths)):
            w[b, width - n + lo : width - n + hi] = 1.0 / (hi - lo)
        for name in names:
            act = cache[name]
            if act.ndim < 3 or act.shape[1] != width:
                raise ValueError(
                    f"hook {name!r} gives activations of shape {tuple(act.shape)}, not [batch, pos, ...]; "
                    "probe a hook indexed by position (resid_*, mlp_out, attn_out, z, …)"
                )
            act = act.reshape(*act.shape[:2], -1).float()  # [b, width, d]
            out[name].append(torch.einsum("bp,bpd->bd", w, act).cpu())
    return {n: torch.cat(v) for n, v in out.items()}


# ---------------------------------------------------------------------------- the result
@boundary
@dataclass
class ProbeResult(Result):
    """Per-layer probe scores over folds (``scores [n_layers, n_folds]``: accuracy, or R² for
    regression), the control task's on the same folds, and the probes fitted on all data.

    ``layers`` label the probed hook points ``hooks``; ``chance`` is the score of predicting the
    training folds' majority class (0 for R²); ``fold[i]`` is the fold in which prompt ``i`` is tested.

    - ``task``: the probing task's name; ``kind``: ``"classification"`` or ``"regression"``;
      ``metric``: ``"accuracy"`` or ``"R²"``; ``hook``: the probed family; ``position``: the
      position rule (``"last-subject"``, ``"last"``, ``"mean-subject"``);
    - ``control`` and ``control_scores`` ``[n_layers, n_folds]``: the control task and its scores
      (None without one); ``classes``: the class names (classification);
    - ``n_prompts``, ``n_groups`` (folds never split a group) and ``n_folds``;
    - ``estimators``: the fitted scikit-learn pipelines, one per layer (left out of :meth:`to_dict`);
    - ``model_name`` and ``fingerprint``: the model whose activations were probed (``""`` for
      precomputed features); :meth:`check` compares them with a model."""

    result_kind = "probe"

    task: str
    kind: str
    metric: str
    hook: str
    position: str
    layers: list[str]
    hooks: list[str]
    scores: torch.Tensor
    control: str | None
    control_scores: torch.Tensor | None
    chance: float
    classes: list[str]
    n_prompts: int
    n_groups: int
    n_folds: int
    fold: list[int] = field(default_factory=list, repr=False)
    estimators: list[Any] = field(default_factory=list, repr=False)
    model_name: str = ""  # the model the activations came from ("" for precomputed features)
    fingerprint: str = ""  # its weights_fingerprint: the probes read only that model's activations

    def check(self, model: HookedGPT2) -> None:
        """Raise a ValueError unless ``model`` has the weights these probes were fitted on (probes
        from precomputed features, which carry no fingerprint, are not checked)."""
        if not self.fingerprint:
            return
        fp = weights_fingerprint(model)
        if fp != self.fingerprint:
            raise ValueError(
                f"these probes were fitted on activations of {self.model_name!r} (weights {self.fingerprint[:12]}…), "
                f"but this model is {model.cfg.name!r} (weights {fp[:12]}…); a probe only reads the model it was "
                "fitted on: run probe(model, …) for this model"
            )

    def predict(
        self,
        model: HookedGPT2,
        prompts: Sequence[str],
        layer: int | str,
        subjects: Sequence[str] | None = None,
        batch_size: int = 64,
    ) -> list:
        """The fitted probe at ``layer`` applied to ``prompts`` on ``model`` (which must be the model it
        was fitted on): a class name per prompt, or a value (regression). ``subjects`` (one per prompt)
        are needed for the subject positions; ``batch_size`` prompts run per forward pass (default 64).
        Another model raises ValueError, a layer that was not probed KeyError."""
        self.check(model)
        prompts = check_prompts(prompts, "prompts")
        i = self._layer_index(layer)
        acts = collect_activations(model, prompts, [self.hooks[i]], subjects, self.position or "last", batch_size)
        out = self.estimators[i].predict(acts[self.hooks[i]].numpy().astype(np.float64))
        return [str(v) for v in out] if self.kind == "classification" else [float(v) for v in out]

    # ------------------------------------------------------------------ summaries
    @property
    def mean(self) -> torch.Tensor:
        """Mean score over folds ``[n_layers]``."""
        return self.scores.mean(1)

    @property
    def ci(self) -> torch.Tensor:
        """Half-width of the 95% t-interval over folds ``[n_layers]``."""
        return _ci(self.scores)

    @property
    def control_mean(self) -> torch.Tensor | None:
        """Mean control score over folds ``[n_layers]`` (None without a control)."""
        return None if self.control_scores is None else self.control_scores.mean(1)

    @property
    def control_ci(self) -> torch.Tensor | None:
        """Half-width of the control scores' 95% t-interval over folds ``[n_layers]`` (None without a control)."""
        return None if self.control_scores is None else _ci(self.control_scores)

    @property
    def selectivity(self) -> torch.Tensor | None:
        """Task score − control score per layer ``[n_layers]`` (Hewitt & Liang)."""
        control_mean = self.control_mean
        return None if control_mean is None else self.mean - control_mean

    @property
    def selectivity_ci(self) -> torch.Tensor | None:
        """95% t-interval half-width of the per-fold differences (same folds) ``[n_layers]``."""
        return None if self.control_scores is None else _ci(self.scores - self.control_scores)

    def first_decodable(self, fraction: float = 0.9) -> int:
        """Index of the first layer whose selectivity (or score without a control) reaches
        ``fraction`` of the best layer's."""
        s = self.selectivity if self.selectivity is not None else self.mean - self.chance
        best = float(s.max())
        return int((s >= fraction * best).nonzero()[0])

    def to_dict(self) -> dict[str, Any]:
        """The fields without ``estimators`` and ``fold``, plus the per-layer summaries (``mean``, ``ci``,
        ``control_mean``, ``selectivity``, ``selectivity_ci``)."""
        d = super().to_dict()
        d.pop("estimators")
        d.pop("fold")
        d.update(
            mean=self.mean,
            ci=self.ci,
            control_mean=self.control_mean,
            selectivity=self.selectivity,
            selectivity_ci=self.selectivity_ci,
        )
        return to_jsonable(d)

    def table(self) -> str:
        """The setting, then a header row naming the columns and one row per layer: the probe's
        held-out score, the control task's and the selectivity (their difference), each the mean
        over folds ± the 95% interval."""
        head = (
            f"probe {self.task!r} ({self.kind}, {self.n_prompts} prompts, {self.n_groups} groups, "
            f"{self.n_folds} group folds) on {self.hook} at {self.position}; chance {self.chance:.3f}; "
            "mean over folds ± 95% interval"
        )
        header = ["layer", f"{self.metric} (held out)"]
        if self.control_scores is not None:
            header += [f"control ({self.control})", "selectivity (probe − control)"]
        rows = []
        for i, name in enumerate(self.layers):
            row = [name, f"{float(self.mean[i]):.3f} ± {float(self.ci[i]):.3f}"]
            cm, cc, sel, sel_ci = self.control_mean, self.control_ci, self.selectivity, self.selectivity_ci
            if cm is not None and cc is not None and sel is not None and sel_ci is not None:  # with a control task
                row += [f"{float(cm[i]):.3f} ± {float(cc[i]):.3f}", f"{float(sel[i]):.3f} ± {float(sel_ci[i]):.3f}"]
            rows.append(row)
        return "\n".join([head, *format_table(header, rows, right=[False] + [True] * (len(header) - 1))])

    def plot(self, **kwargs: Any) -> Figure:
        """Score, control score and selectivity by layer, with 95% intervals over folds."""
        from ..plots.probes import plot_probe

        return plot_probe(self, **kwargs)

    # ------------------------------------------------------------------ directions
    def _layer_index(self, layer: int | str) -> int:
        if isinstance(layer, str):
            if layer not in self.layers and layer not in self.hooks:
                raise KeyError(f"no probed layer {layer!r}; probed: {', '.join(self.layers)}")
            return self.layers.index(layer) if layer in self.layers else self.hooks.index(layer)
        if isinstance(layer, int) and f"L{layer}" in self.layers:
            return self.layers.index(f"L{layer}")
        raise KeyError(f"no probed layer {layer!r}; probed: {', '.join(self.layers)} (pass a block index or a label)")

    def direction(
        self, layer: int | str, cls: str | int | None = None, normalize: bool = True, model: HookedGPT2 | None = None
    ) -> torch.Tensor:
        """The probe's weight vector ``[d]`` in the hook's own activation space (the scaler's
        division folded in: ``w_raw = w / σ``), unit-norm by default: adding ``α·direction`` to
        the activation raises the probe's logit for ``cls`` (regression: the predicted value).

        ``layer``: a block index or a label of :attr:`layers`. ``cls``: a class name or index;
        needed with more than two classes (for two, the positive class's vector). ``model``: the
        model the direction will be used on, checked to be the one the probe was fitted on."""
        if model is not None:
            self.check(model)
        est = self.estimators[self._layer_index(layer)]
        scaler, fitted = est.named_steps["scale"], est.named_steps["probe"]
        coef = np.atleast_2d(fitted.coef_)  # [n_classes or 1, d]
        if self.kind == "classification" and coef.shape[0] > 1:
            if cls is None:
                raise ValueError(f"the probe has {coef.shape[0]} classes; pass cls= one of {self.classes}")
            k = self.classes.index(cls) if isinstance(cls, str) else int(cls)
            w = coef[k]
        else:
            w = coef[0]
            if cls is not None and self.kind == "classification":
                k = self.classes.index(cls) if isinstance(cls, str) else int(cls)
                w = w if k == 1 else -w
        w = torch.tensor(w / scaler.scale_, dtype=torch.float32)
        return w / w.norm() if normalize else w


def _ci(scores: torch.Tensor) -> torch.Tensor:
    """95% t-interval half-width over the last dimension (folds)."""
    from scipy.special import stdtrit  # Student t quantile (scipy.stats is a far heavier import)

    k = scores.shape[-1]
    if k < 2:
        return torch.zeros(scores.shape[:-1])
    return scores.std(-1, unbiased=True) / math.sqrt(k) * float(stdtrit(k - 1, 0.975))


# ---------------------------------------------------------------------------- probing
def _pipeline(kind: str, C: float, seed: int) -> Pipeline:
    from sklearn.linear_model import LogisticRegression, Ridge
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import StandardScaler

    est = (
        LogisticRegression(C=C, max_iter=2000, random_state=seed) if kind == "classification" else Ridge(alpha=1.0 / C)
    )
    return Pipeline([("scale", StandardScaler()), ("probe", est)])


def _folds(
    y: np.ndarray, groups: np.ndarray, kind: str, n_folds: int, seed: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import GroupKFold, StratifiedGroupKFold

    if kind == "classification":
        with warnings.catch_warnings():  # a class with fewer groups than folds: sklearn warns, and it is fine
            warnings.simplefilter("ignore", UserWarning)
            cv = StratifiedGroupKFold(n_splits=n_folds, shuffle=True, random_state=seed)
            return list(cv.split(np.zeros(len(y)), y, groups))
    return list(GroupKFold(n_splits=n_folds).split(np.zeros(len(y)), y, groups))


def control_labels(labels: np.ndarray, groups: np.ndarray, control: str, seed: int = 0) -> np.ndarray:
    """Control-task labels: ``"random-labels"`` permutes the labels over prompts; ``"by-type"``
    gives each group one label, permuting the groups' (first) labels among the groups, so the
    control keeps the task's class balance over subjects."""
    rng = np.random.default_rng(seed)
    if control == "random-labels":
        return labels[rng.permutation(len(labels))]
    if control == "by-type":
        uniq, first, inv = np.unique(groups, return_index=True, return_inverse=True)
        per_group = labels[first][rng.permutation(len(uniq))]
        return per_group[inv]
    raise ValueError(f"control must be one of {CONTROLS}, got {control!r}")


def _score(est: Pipeline, X: np.ndarray, y: np.ndarray, folds: list, kind: str) -> np.ndarray:
    from sklearn.base import clone
    from sklearn.metrics import accuracy_score, r2_score

    out = []
    for train, test in folds:
        e = clone(est).fit(X[train], y[train])
        pred = e.predict(X[test])
        out.append(accuracy_score(y[test], pred) if kind == "classification" else r2_score(y[test], pred))
    return np.array(out)


def check_labels(
    labels: Sequence, groups: Sequence | None, n: int, kind: str | None, control: str | None, n_folds: int
) -> tuple[np.ndarray, np.ndarray, str, list[str]]:
    """Validate a probing task before any work: ``(labels, groups, kind, classes)`` as arrays; raises a
    ValueError naming the fix for labels of the wrong length, a single class, too few groups."""
    n_folds = check_count(n_folds, "n_folds", minimum=2)
    labels = list(labels)
    if len(labels) != n:
        raise ValueError(f"got {len(labels)} labels for {n} prompts; give exactly one label per prompt")
    missing = next((i for i, v in enumerate(labels) if v is None or (isinstance(v, float) and math.isnan(v))), None)
    if missing is not None:
        raise ValueError(
            f"labels[{missing}] is missing ({labels[missing]!r}); every prompt needs a label "
            "(drop the prompts without one)"
        )
    y = np.asarray(labels)
    if kind is None:
        kind = "regression" if y.dtype.kind == "f" else "classification"
    if kind not in ("classification", "regression"):
        raise ValueError(f"kind must be 'classification' or 'regression', got {kind!r}")
    if control not in CONTROLS:
        raise ValueError(f"control must be one of {CONTROLS}, got {control!r}")
    classes: list[str] = []
    if kind == "classification":
        y = y.astype(str)
        classes = [str(c) for c in np.unique(y)]
        if len(classes) < 2:
            raise ValueError(
                f"all {n} labels are {classes[0]!r}: a probe needs at least two classes; "
                "give labels with two or more values"
            )
    else:
        y = y.astype(np.float64)
    if groups is not None and any(v is None for v in groups):
        raise ValueError(
            f"groups[{next(i for i, v in enumerate(groups) if v is None)}] is missing (None); "
            "give a group (e.g. the subject) for every prompt"
        )
    g = np.asarray(list(groups)) if groups is not None else np.arange(n)
    if len(g) != n:
        raise ValueError(f"got {len(g)} groups for {n} prompts; give one group (e.g. the subject) per prompt")
    n_groups = len(np.unique(g))
    if n_groups < n_folds:
        raise ValueError(
            f"only {n_groups} distinct groups for {n_folds} folds: every fold needs its own test groups "
            f"(no subject in both train and test). Lower n_folds to at most {n_groups}, or give more subjects"
        )
    return y, g, kind, classes


def probe_features(
    features: Sequence[np.ndarray | torch.Tensor],
    labels: Sequence,
    groups: Sequence | None = None,
    layers: Sequence[str] | None = None,
    kind: str | None = None,
    control: str | None = "random-labels",
    n_folds: int = 5,
    C: float = 1.0,
    seed: int = 0,
    task: str = "",
    hook: str = "",
    hooks: Sequence[str] | None = None,
    position: str = "",
    progress: bool | None = None,
) -> ProbeResult:
    """Probe precomputed ``features`` (one ``[n, d]`` array per layer) for ``labels`` — the
    statistics half of :func:`probe`, with the same checks, folds, controls and result."""
    feats = [np.asarray(f.float().numpy() if isinstance(f, torch.Tensor) else f, dtype=np.float64) for f in features]
    if not feats:
        raise ValueError("no features to probe")
    n = len(feats[0])
    if any(len(f) != n for f in feats):
        raise ValueError("every layer's features must have one row per prompt")
    y, g, kind, classes = check_labels(labels, groups, n, kind, control, n_folds)
    folds = _folds(y, g, kind, n_folds, seed)
    y_ctrl = None if control is None else control_labels(y, g, control, seed)
    est = _pipeline(kind, C, seed)
    scores, ctrl, fitted = [], [], []
    from sklearn.base import clone
    from threadpoolctl import threadpool_limits

    # one BLAS thread: these fits are small, and a multi-threaded BLAS spinning against torch's threads
    # on a busy CPU runs them ~10x slower
    with warnings.catch_warnings(), threadpool_limits(limits=1, user_api="blas"):
        warnings.simplefilter("ignore", category=UserWarning)  # classes missing from a training fold
        for X in progress_bar(feats, desc="probes", enabled=progress if progress is not None else len(feats) > 8):
            scores.append(_score(est, X, y, folds, kind))
            if y_ctrl is not None:
                ctrl.append(_score(est, X, y_ctrl, folds, kind))
            fitted.append(clone(est).fit(X, y))
    if kind == "classification":
        chance = float(np.mean([np.mean(y[te] == _majority(y[tr])) for tr, te in folds]))
    else:
        chance = 0.0
    layer_labels = list(layers) if layers is not None else [f"L{i}" for i in range(len(feats))]
    fold = np.zeros(n, dtype=int)
    for k, (_, te) in enumerate(folds):
        fold[te] = k
    return ProbeResult(
        task=task,
        kind=kind,
        metric="accuracy" if kind == "classification" else "R²",
        hook=hook,
        position=position,
        layers=layer_labels,
        hooks=list(hooks) if hooks is not None else layer_labels,
        scores=torch.tensor(np.stack(scores), dtype=torch.float32),
        control=control,
        control_scores=None if y_ctrl is None else torch.tensor(np.stack(ctrl), dtype=torch.float32),
        chance=chance,
        classes=classes,
        n_prompts=n,
        n_groups=len(np.unique(g)),
        n_folds=len(folds),
        fold=fold.tolist(),
        estimators=fitted,
    )


def _majority(y: np.ndarray) -> str:
    vals, counts = np.unique(y, return_counts=True)
    return vals[counts.argmax()]


@boundary
def probe(
    model: HookedGPT2,
    prompts: Sequence[str] | Any,
    labels: Sequence | None = None,
    hook: str = "resid_post",
    layers: Layers = "all",
    groups: Sequence | None = None,
    subjects: Sequence[str] | None = None,
    position: str | None = None,
    control: str | None = "random-labels",
    kind: str | None = None,
    n_folds: int = 5,
    C: float = 1.0,
    seed: int = 0,
    batch_size: int = 64,
    progress: bool | None = None,
) -> ProbeResult:
    """Linear probes for ``labels`` at ``hook`` for every layer in ``layers``.

    ``prompts``: a list of prompts, or a :class:`~gpt2_interp.facts.probing.ProbingSet` (which
    brings its labels, subjects and groups). ``labels``: one per prompt — strings/ints classify
    (logistic regression, accuracy), floats regress (ridge, R²). ``groups``: folds never split a
    group (default: the subjects, else each prompt alone). ``position``: ``"last-subject"``
    (default with subjects), ``"last"`` (default without) or ``"mean-subject"``. ``control``:
    ``"random-labels"``, ``"by-type"`` or None (see the module doc). ``C``: inverse L2 strength.

    ``hook``: a family (default ``"resid_post"``), ``"resid"`` (every layer boundary) or a full hook
    name; ``layers``: ``"all"`` (default), an int or a list. ``kind``: ``"classification"`` or
    ``"regression"`` (None: from the labels); ``n_folds`` (default 5) group folds; ``seed`` fixes
    the folds and the control labels; ``batch_size`` (default 64) prompts per forward pass;
    ``progress``: progress bars (None: automatic). Returns a :class:`ProbeResult` with ``scores``
    ``[n_layers, n_folds]``.

    Refused before any work (ValueError): missing labels, labels, subjects or groups whose number
    is not the number of prompts, a single class, too few groups for the folds, an unknown kind,
    control, position or hook, a position on the subject without subjects, an attention-pattern
    hook, and a layer out of range.
    """
    task = ""
    if labels is None and hasattr(prompts, "labels") and hasattr(prompts, "prompts"):
        ds: Any = prompts  # a ProbingSet
        prompts, labels, task = ds.prompts, ds.labels, ds.task
        subjects = ds.subjects if subjects is None else subjects
        groups = ds.groups if groups is None else groups
        kind = kind or ds.kind
    if labels is None:
        raise ValueError("labels is missing: give one label per prompt, or pass a ProbingSet as prompts")
    prompts = check_prompts(prompts, "prompts")
    if len(labels) != len(prompts):
        raise ValueError(f"got {len(labels)} labels for {len(prompts)} prompts; give exactly one label per prompt")
    if subjects is not None and len(subjects) != len(prompts):
        raise ValueError(f"got {len(subjects)} subjects for {len(prompts)} prompts; give one subject per prompt")
    if groups is None:
        groups = subjects
    check_labels(labels, groups, len(prompts), kind, control, n_folds)
    position = position or ("last-subject" if subjects is not None else "last")
    names, layer_labels = probe_hooks(model, hook, layers)
    acts = collect_activations(model, prompts, names, subjects, position, batch_size, progress)
    result = probe_features(
        [acts[n] for n in names],
        labels,
        groups,
        layer_labels,
        kind,
        control,
        n_folds,
        C,
        seed,
        task=task,
        hook=hook,
        hooks=names,
        position=position,
        progress=progress,
    )
    result.model_name, result.fingerprint = model.cfg.name, weights_fingerprint(model)
    return result


__all__ = [
    "ProbeResult",
    "check_labels",
    "collect_activations",
    "control_labels",
    "probe",
    "probe_features",
    "probe_hooks",
]
