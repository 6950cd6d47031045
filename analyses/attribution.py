"""How faithful is attribution patching? AtP, AtP* and IG against exact activation patching.

Prompt pairs from the fact base (:func:`~gpt2_interp.facts.pairs.subject_swaps`: a fact's first
training prompt, and the same prompt with another subject of the same relation, equal token length),
kept where the model knows both facts (:func:`gpt2_interp.analysis.known.knows`: its top-1 next token
is the object's first token on the clean prompt and the other object's on the corrupted one), the
first ``keep`` of them. A real model knows few of the pairs (SmolLM2-135M: 53 of 450 drawn), so draw
``pairs`` accordingly. For each hook family — attention heads (``z``: each head at every position,
``[layer, head]``), heads by position (``z-pos``: ``[layer, pos, head]``), ``mlp_out`` and the residual
stream (``resid_pre``) by position — the exact patching sweep (``patching.patch``, denoising, metric:
logit difference between the two objects) is compared with each estimate (``atp``, ``atp*``, ``ig``
with ``ig_steps`` steps on the input-embedding path, ``ig-act``: IG on each layer's own activations,
``attribute(..., ig_path="activations")``) over every cell:

* Spearman ρ of the effects (patched − corrupted metric, averaged over pairs), and of the per-pair
  effects (every pair × cell);
* top-``k`` recall: the share of the exact top-``k`` cells (largest |effect|) among the estimate's
  top-``k`` (for ``atp*`` ranked by its GradDrop score);
* after verification: ``verify(k)`` takes the estimate's top-2k cells and k random controls exactly
  and keeps the k largest; the share of the exact top-k among them. The exact values of those cells
  are looked up in the full sweep (``verify(..., exact=sweep)``).

The exact sweeps, by far the slowest part (on SmolLM2-135M 20–28 min per hook family at one thread),
are kept on disk through the runner (``ctx.cached``): an interrupted or repeated run with the same
settings reuses them, and the table's exact time is then the time of the run that computed the sweep
("cached"). ``exact_pairs`` patches exactly only the first K pairs (agreement on those; the exact time
extrapolated ×pairs/K). ``keep_previous`` keeps the rows of the earlier result in the same folder (same
prompt pairs) that this run does not redo, e.g. to add a method to a finished table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from gpt2_interp.analysis.attribution import agreement, attribute, recall, spearman, top_cells
from gpt2_interp.analysis.known import knows
from gpt2_interp.analysis.metrics import logit_diff
from gpt2_interp.analysis.patching import PatchResult, pair_tokens, patch
from gpt2_interp.experiments.base import ExperimentConfig, register
from gpt2_interp.experiments.runner import RunContext
from gpt2_interp.facts.base import FactBase
from gpt2_interp.facts.pairs import FactPairs, subject_swaps

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from gpt2_interp.model import HookedGPT2

#: hook key (config) → (row label, patched hook, per position)
HOOKS: dict[str, tuple[str, str, bool]] = {
    "z": ("heads (z)", "z", False),
    "z-pos": ("heads × position (z)", "z", True),
    "mlp_out": ("mlp_out", "mlp_out", False),
    "resid_pre": ("residual (resid_pre)", "resid_pre", False),
}
METHODS = ["atp", "atp*", "ig", "ig-act"]
ATTRIBUTE_ARGS: dict[str, dict[str, Any]] = {  # row name → attribute() arguments
    "atp": dict(method="atp"),
    "atp*": dict(method="atp*"),
    "ig": dict(method="ig"),
    "ig-act": dict(method="ig", ig_path="activations"),  # IG on each layer's own activations (m passes per layer)
}
GOALS = {"heads (z)": 0.9, "mlp_out": 0.9, "residual (resid_pre)": 0.8}
METRIC_NAME = "logit_diff(clean object, corrupted object)"


@dataclass
class Config(ExperimentConfig):
    pairs: int = field(default=50, metadata={"help": "prompt pairs to draw (those the model knows are kept)"})
    keep: int | None = field(default=None, metadata={"help": "keep at most this many known pairs (the first drawn)"})
    hooks: list[str] = field(
        default_factory=lambda: ["z", "mlp_out", "resid_pre"],
        metadata={
            "help": "hook families, from z, z-pos (heads × position: many cells, slow exact sweep), mlp_out, resid_pre"
        },
    )
    methods: list[str] = field(
        default_factory=lambda: ["atp", "atp*", "ig"],
        metadata={"help": "estimates, from atp, atp*, ig, ig-act (IG on each layer's activations)"},
    )
    ig_steps: int = field(default=5, metadata={"help": "IG interpolation steps"})
    k: int = field(default=20, metadata={"help": "top-k cells for recall and verification"})
    exact_pairs: int | None = field(
        default=None,
        metadata={"help": "patch exactly only the first K pairs (agreement on them; exact time extrapolated ×pairs/K)"},
    )
    keep_previous: bool = field(
        default=False,
        metadata={"help": "keep the earlier result's rows (same folder, same pairs) that this run does not redo"},
    )

    QUICK: ClassVar[dict[str, Any]] = {"pairs": 8}

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, given, valid in (("hooks", self.hooks, list(HOOKS)), ("methods", self.methods, METHODS)):
            bad = [x for x in given if x not in valid]
            if bad or not given:
                raise ValueError(f"attribution setting {name}: {bad or 'empty'} — choose from {', '.join(valid)}")
        for name in ("pairs", "ig_steps", "k"):
            if getattr(self, name) < 1:
                raise ValueError(f"attribution setting {name} must be >= 1, got {getattr(self, name)}")
        for name in ("keep", "exact_pairs"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"attribution setting {name} must be >= 1 or none, got {getattr(self, name)}")


# ---------------------------------------------------------------- shared steps (attribution_diagnosis uses them)
def known_pairs(model: HookedGPT2, fp: FactPairs) -> FactPairs:
    """The pairs whose two facts the model knows (:func:`~gpt2_interp.analysis.known.knows`): on the clean
    prompt it predicts the clean object's first token, on the corrupted prompt the corrupted object's."""
    clean = knows(model, fp.clean, [f.target for f, _ in fp.facts])
    corrupted = knows(model, fp.corrupted, [g.target for _, g in fp.facts])
    return fp.subset([i for i, (a, b) in enumerate(zip(clean, corrupted)) if a and b])


def fact_pairs(model: HookedGPT2, drawn: int, keep: int | None, seed: int = 0) -> FactPairs:
    """``drawn`` subject-swap pairs (seeded), those the model knows, the first ``keep`` of them."""
    fp = known_pairs(model, subject_swaps(FactBase.load(), model.tokenizer, drawn, seed=seed))
    return fp if keep is None else fp.subset(range(min(keep, len(fp))))


def pair_metric(fp: FactPairs):
    """The metric of the sweeps: logit[clean object] − logit[corrupted object], per pair."""
    metric = logit_diff(fp.answers, fp.wrongs)
    metric.name = METRIC_NAME
    return metric


def pair_effects(r: PatchResult) -> torch.Tensor:
    """Per-pair effects of a denoising sweep: patched metric − corrupted metric, ``[n_pairs, *cells]``."""
    base = r.corrupted_pair_metric.view((-1,) + (1,) * (r.pair_values.ndim - 1))
    return r.pair_values - base


def exact_sweep(
    model: HookedGPT2, fp: FactPairs, hook: str, positions: list[int] | None, ctx: RunContext
) -> tuple[PatchResult, float, bool]:
    """``patch(model, fp.clean, fp.corrupted, pair_metric(fp), hook=hook, positions=positions)``, kept on
    disk by the runner. Returns the sweep, the seconds it took when computed, and whether it was read back."""
    fresh = []

    def compute() -> dict:
        t0 = time.perf_counter()
        r = patch(model, fp.clean, fp.corrupted, pair_metric(fp), hook=hook, positions=positions, progress=ctx.progress)
        fresh.append(True)
        return {"result": r, "seconds": time.perf_counter() - t0}

    key = f"exact-{hook}-{'pos' if positions is not None else 'all'}-{len(fp)}"
    # the sweep depends on the pairs, their metric, the hook and the positions only: a rerun that changes
    # the estimators' settings (methods, IG steps, k) reads it back
    depends = {
        "clean": fp.clean,
        "corrupted": fp.corrupted,
        "answers": fp.answers,
        "wrongs": fp.wrongs,
        "hook": hook,
        "positions": positions,
    }
    got = ctx.cached(key, compute, depends=depends)
    return got["result"], float(got["seconds"]), not fresh


# ---------------------------------------------------------------- one row
def compare(
    model: HookedGPT2, fp: FactPairs, sub: FactPairs, hook_key: str, method: str, exact: PatchResult, cfg: Config
) -> tuple[dict, float, int]:
    """One estimate against the exact sweep: the row's agreement numbers, the estimate's seconds on all
    pairs, and its number of cells. With ``sub`` (the exactly patched pairs) other than ``fp``, the
    estimate is timed on all pairs and compared on ``sub``."""
    _, hook, per_pos = HOOKS[hook_key]

    def estimate(pairs: FactPairs):
        positions = list(range(pair_tokens(model, pairs.clean, pairs.corrupted)[0].shape[1])) if per_pos else None
        return attribute(
            model,
            pairs.clean,
            pairs.corrupted,
            pair_metric(pairs),
            hook=hook,
            positions=positions,
            ig_steps=cfg.ig_steps,
            **ATTRIBUTE_ARGS[method],
        )

    t0 = time.perf_counter()
    est = estimate(fp)
    seconds = time.perf_counter() - t0
    n_cells = est.values.numel()
    if sub is not fp:
        est = estimate(sub)
    agr = agreement(est, exact, k=cfg.k)
    v = est.verify(k=cfg.k, exact=exact)
    truth = top_cells((exact.values - exact.baseline).abs(), cfg.k)
    row = {
        "cells_compared": agr.n_cells,
        "spearman": agr.spearman,
        "spearman_abs": agr.spearman_abs,
        "spearman_pairs": spearman(pair_effects(est), pair_effects(exact)),
        "recall": agr.recall,
        "recall_verified": recall(v.verified_top, truth),
        "verified_cells": len(v.cells),
        "controls_above_kth": v.controls_above,
        "estimate_mean": [round(float(x), 5) for x in agr.estimate],
        "exact_mean": [round(float(x), 5) for x in agr.exact],
    }
    return row, seconds, n_cells


def row_order(cfg: Config) -> list[tuple[str, str]]:
    """(hook, method) in run order: every hook's exact sweep with the cheap estimates first, AtP*
    (GradDrop: one backward pass per layer) after them."""
    hooks = [h for h in HOOKS if h in cfg.hooks]
    methods = [m for m in METHODS if m in cfg.methods]
    return [(h, m) for h in hooks for m in methods if m != "atp*"] + [(h, "atp*") for h in hooks if "atp*" in methods]


def previous_rows(ctx: RunContext, cfg: Config, fp: FactPairs) -> list[dict]:
    """With ``keep_previous``: the earlier result's rows that this run does not redo (same pairs required)."""
    if not cfg.keep_previous:
        return []
    old = ctx.previous
    if old is None:
        raise ValueError(
            "attribution setting keep_previous: there is no earlier result in this run's folder to keep rows from"
        )
    if old.get("prompt_pairs") != [[c, k] for c, k in zip(fp.clean, fp.corrupted)]:
        raise ValueError(
            "attribution setting keep_previous: the earlier result holds other prompt pairs; "
            "run without it to replace it"
        )
    redo = {(HOOKS[h][0], m) for h, m in row_order(cfg)}
    return [r for r in old["rows"] if (r["hook"], r["method"]) not in redo]


# ---------------------------------------------------------------- rendering
def _hooks_and_methods(data: dict) -> tuple[list[str], list[str]]:
    labels = [v[0] for v in HOOKS.values()]
    hooks = sorted({r["hook"] for r in data["rows"]}, key=lambda h: labels.index(h) if h in labels else len(labels))
    methods = sorted(
        {r["method"] for r in data["rows"]}, key=lambda m: METHODS.index(m) if m in METHODS else len(METHODS)
    )
    return hooks, methods


def tables(data: dict) -> dict[str, str]:
    n, k = data["pairs"], data["k"]
    head = [
        "| hook | method | cells | Spearman ρ (mean effect) | ρ (per pair × cell) | ρ of |effect| vs score | "
        f"top-{k} recall | top-{k} recall after verifying {2 * k} + {k} controls | goal (ρ) | time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    hooks, methods = _hooks_and_methods(data)
    for h in hooks:
        for r in sorted((r for r in data["rows"] if r["hook"] == h), key=lambda r: methods.index(r["method"])):
            goal = "—" if r.get("goal") is None else f"≥ {r['goal']}"
            k_ex = r.get("exact_pairs") or n
            note = (", cached" if r.get("exact_cached") else "") + (
                "" if k_ex == n else f", extrapolated from {k_ex} pairs"
            )
            head.append(
                f"| {r['hook']} | {r['method']} | {r['cells']} | {r['spearman']:.3f} | {r['spearman_pairs']:.3f} | "
                f"{r['spearman_abs']:.3f} | {r['recall']:.0%} | {r['recall_verified']:.0%} | {goal} | "
                f"{r['seconds']:.1f} (exact {r['exact_seconds']:.1f}{note}) |"
            )
    threads = f", {data['torch_threads']} thread(s)" if data.get("torch_threads") else ""
    text = (
        f"Attribution patching vs exact patching on {data['model']}: {n} prompt pairs the model knows (the first "
        f"{n} known of {data['drawn']} drawn), {data['positions']} positions (left-padded), denoising, metric "
        f"logit[clean object] − logit[corrupted object]; IG with {data['ig_steps']} steps (ig: on the "
        "input-embedding path, EAP-IG; ig-act: on each layer's own activations, everything upstream at the "
        f"corrupted run); AtP* ranks by GradDrop. Times are wall seconds{threads}.\n\n" + "\n".join(head)
    )
    return {"attribution": text}


def figures(data: dict) -> dict[str, Figure]:
    from gpt2_interp.plots.attribution import plot_agreement_grid

    hooks, methods = _hooks_and_methods(data)
    by = {(r["hook"], r["method"]): r for r in data["rows"]}
    grid = []
    for h in hooks:
        line = []
        for m in methods:
            r = by.get((h, m))
            if r is None:
                line.append((np.zeros(0), np.zeros(0), "not run"))
                continue
            est, ex = np.array(r.get("estimate_mean", [])), np.array(r.get("exact_mean", []))
            line.append(
                (
                    est,
                    ex,
                    f"ρ = {r['spearman']:.3f}, top-{data['k']} recall {r['recall']:.0%}"
                    + ("" if est.size else " (no stored effects: see the table)"),
                )
            )
        grid.append(line)
    fig = plot_agreement_grid(
        grid,
        hooks,
        methods,
        title=f"Attribution estimates vs exact patching on {data['model']}, {data['pairs']} fact "
        f"prompt pairs (effect on logit difference, mean over pairs; IG: {data['ig_steps']} steps)",
    )
    return {"attribution": fig}


@register("attribution", Config, tables=tables, figures=figures)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    model.eval()
    fp = fact_pairs(model, cfg.pairs, cfg.keep)
    if len(fp) == 0:
        raise ValueError(f"attribution setting pairs: the model knows none of the {cfg.pairs} drawn pairs; draw more")
    sub = fp if cfg.exact_pairs is None or cfg.exact_pairs >= len(fp) else fp.subset(range(cfg.exact_pairs))
    rows = previous_rows(ctx, cfg, fp)
    exacts: dict[str, tuple[PatchResult, float, bool]] = {}
    for hook_key, method in row_order(cfg):
        label, hook, per_pos = HOOKS[hook_key]
        if hook_key not in exacts:
            P_sub = pair_tokens(model, sub.clean, sub.corrupted)[0].shape[1]
            exacts[hook_key] = exact_sweep(model, sub, hook, list(range(P_sub)) if per_pos else None, ctx)
        exact, exact_seconds, hit = exacts[hook_key]
        agr, seconds, n_cells = compare(model, fp, sub, hook_key, method, exact, cfg)
        rows.append(
            {
                "hook": label,
                "method": method,
                "cells": n_cells,
                **agr,
                "seconds": seconds,
                "exact_seconds": exact_seconds * len(fp) / len(sub),
                "exact_cached": hit,
                "exact_pairs": len(sub),
                "goal": GOALS.get(label),
            }
        )
    return {
        "model": model.cfg.name,
        "pairs": len(fp),
        "drawn": cfg.pairs,
        "positions": pair_tokens(model, fp.clean, fp.corrupted)[0].shape[1],
        "ig_steps": cfg.ig_steps,
        "k": cfg.k,
        "complete": True,
        "torch_threads": torch.get_num_threads(),
        "rows": rows,
        "prompt_pairs": [[c, k] for c, k in zip(fp.clean, fp.corrupted)],
    }
