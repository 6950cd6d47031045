"""How faithful is attribution patching on gpt2-facts? AtP, AtP* and IG against exact patching.

    python analyses/attribution.py [--pairs 50] [--head-positions] [--quick] [--out-dir analyses/results]

Prompt pairs from the fact base (``facts.pairs.subject_swaps``: a fact's first training prompt, and
the same prompt with another subject of the same relation, equal token length), kept where the
model knows both (clean prefers its object, corrupted its own). For each hook — attention heads
(``z``, each head at every position: ``[layer, head]``), heads by position (``z`` ``[layer, pos,
head]``, with ``--head-positions``), ``mlp_out`` and the residual stream (``resid_pre``) by position — the exact patching
sweep (``patching.patch``, denoising, metric: logit difference between the two objects) is
compared with each estimate (``atp``, ``atp*``, ``ig`` with 5 steps) over every cell:

* Spearman ρ of the effects (patched − corrupted metric, averaged over pairs), and of the
  per-pair effects (every pair × cell);
* top-20 recall: the share of the exact top-20 cells (largest |effect|) among the estimate's top-20
  (for ``atp*`` ranked by its GradDrop score);
* after verification: ``verify(k=20)`` patches the estimate's top-40 cells and 20 random controls
  exactly and keeps the 20 largest; the share of the exact top-20 among them.

Writes ``attribution.png`` (estimate vs exact, one panel per hook and method), ``attribution.json``
and ``attribution.md``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

import gpt2_interp as gi
from gpt2_interp.analysis.attribution import agreement, attribute, recall, spearman, top_cells
from gpt2_interp.analysis.metrics import logit_diff
from gpt2_interp.analysis.patching import pair_tokens, patch
from gpt2_interp.facts.base import FactBase
from gpt2_interp.facts.pairs import subject_swaps
from gpt2_interp.plots.attribution import plot_agreement_grid

RESULTS = Path(__file__).resolve().parent / "results"
HOOKS = [  # (label, hook, positions)
    ("heads (z)", "z", None),
    ("heads × position (z)", "z", "each"),
    ("mlp_out", "mlp_out", None),
    ("residual (resid_pre)", "resid_pre", None),
]
METHODS = ["atp", "atp*", "ig"]
GOALS = {"heads (z)": 0.9, "mlp_out": 0.9, "residual (resid_pre)": 0.8}


@torch.no_grad()
def known_pairs(model, fp):
    """The pairs where the clean run prefers its object and the corrupted run its own."""
    c, k, mask = pair_tokens(model, fp.clean, fp.corrupted)
    m = logit_diff(fp.answers, fp.wrongs)
    lc = m(model.last_logits(c, attention_mask=mask)[None])[0]
    lk = m(model.last_logits(k, attention_mask=mask)[None])[0]
    return fp.subset([i for i in range(len(fp)) if lc[i] > 0 > lk[i]])


def pair_effects(r) -> torch.Tensor:
    base = r.corrupted_pair_metric.view((-1,) + (1,) * (r.pair_values.ndim - 1))
    return r.pair_values - base


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=50, help="prompt pairs to draw (those the model knows are kept)")
    ap.add_argument("--ig-steps", type=int, default=5)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--head-positions", action="store_true",
                    help="also heads × position (z per position: many cells, exact patching is the slow part)")
    ap.add_argument("--quick", action="store_true", help="8 pairs (a smoke test)")
    ap.add_argument("--model", default="gpt2-facts")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    if a.quick:
        a.pairs = 8
    model = gi.load(a.model).eval()
    fp = known_pairs(model, subject_swaps(FactBase.load(), model.tokenizer, a.pairs, seed=0))
    metric = logit_diff(fp.answers, fp.wrongs)
    metric.name = "logit_diff(clean object, corrupted object)"
    P = pair_tokens(model, fp.clean, fp.corrupted)[0].shape[1]
    rows, panels, times = [], [], {}
    hooks = [h for h in HOOKS if a.head_positions or h[2] != "each"]
    for label, hook, pos in hooks:
        positions = list(range(P)) if pos == "each" else None
        t0 = time.perf_counter()
        exact = patch(model, fp.clean, fp.corrupted, metric, hook=hook, positions=positions)
        times[f"exact {label}"] = time.perf_counter() - t0
        ex_pair = pair_effects(exact)
        row_panels = []
        for method in METHODS:
            t0 = time.perf_counter()
            est = attribute(model, fp.clean, fp.corrupted, metric, hook=hook, positions=positions, method=method,
                            ig_steps=a.ig_steps)
            times[f"{method} {label}"] = time.perf_counter() - t0
            agr = agreement(est, exact, k=a.k)
            v = est.verify(k=a.k)
            truth = top_cells((exact.values - exact.baseline).abs(), a.k)
            rows.append({
                "hook": label, "method": method, "cells": agr.n_cells,
                "spearman": agr.spearman, "spearman_abs": agr.spearman_abs,
                "spearman_pairs": spearman(pair_effects(est), ex_pair),
                "recall": agr.recall, "recall_verified": recall(v.verified_top, truth),
                "verified_cells": len(v.cells), "controls_above_kth": v.controls_above,
                "seconds": times[f"{method} {label}"], "exact_seconds": times[f"exact {label}"],
                "goal": GOALS.get(label),
            })
            row_panels.append((agr.estimate.numpy(), agr.exact.numpy(), f"ρ = {agr.spearman:.3f}, top-{a.k} recall {agr.recall:.0%}"))
        panels.append(row_panels)
    n = len(fp)
    fig = plot_agreement_grid(panels, [h[0] for h in hooks], METHODS,
                              title=f"Attribution estimates vs exact patching on {a.model}, {n} fact prompt pairs "
                                    f"(effect on logit difference, mean over pairs; IG: {a.ig_steps} steps)")
    a.out_dir.mkdir(parents=True, exist_ok=True)
    fig.savefig(a.out_dir / "attribution.png", dpi=110, bbox_inches="tight")
    table = ["| hook | method | cells | Spearman ρ (mean effect) | ρ (per pair × cell) | ρ of |effect| vs score | "
             f"top-{a.k} recall | top-{a.k} recall after verifying {2 * a.k} + {a.k} controls | goal (ρ) | time (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        goal = "—" if r["goal"] is None else f"≥ {r['goal']}"
        table.append(f"| {r['hook']} | {r['method']} | {r['cells']} | {r['spearman']:.3f} | {r['spearman_pairs']:.3f} | "
                     f"{r['spearman_abs']:.3f} | {r['recall']:.0%} | {r['recall_verified']:.0%} | {goal} | "
                     f"{r['seconds']:.1f} (exact {r['exact_seconds']:.1f}) |")
    md = (f"# Attribution patching vs exact patching on {a.model}\n\n`python analyses/attribution.py --pairs {a.pairs}{' --head-positions' if a.head_positions else ''}`: "
          f"{n} prompt pairs the model knows (of {a.pairs} drawn), {P} positions (left-padded), denoising, metric "
          f"logit[clean object] − logit[corrupted object]; IG with {a.ig_steps} steps; AtP* ranks by GradDrop.\n\n"
          + "\n".join(table) + "\n")
    (a.out_dir / "attribution.md").write_text(md)
    out = {"model": a.model, "pairs": n, "drawn": a.pairs, "positions": P, "ig_steps": a.ig_steps, "k": a.k, "rows": rows,
           "prompt_pairs": [[c, k] for c, k in zip(fp.clean, fp.corrupted)]}
    (a.out_dir / "attribution.json").write_text(json.dumps(out, indent=1, default=float) + "\n")
    print(md)
    return out


if __name__ == "__main__":
    main()
