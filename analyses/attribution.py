"""How faithful is attribution patching on gpt2-facts? AtP, AtP* and IG against exact patching.

    python analyses/attribution.py [--pairs 50] [--head-positions] [--quick] [--out-dir analyses/results]
    python analyses/attribution.py --model smollm2-135m --pairs 80 --keep 50 --hooks z   # → attribution_smollm2-135m_z.*
    python analyses/attribution.py --hooks mlp_out --methods ig-act --merge   # add rows to an existing table
    python analyses/attribution.py --model smollm2-135m --pairs 180 --keep 100 --head-positions-only --exact-pairs 3

Prompt pairs from the fact base (``facts.pairs.subject_swaps``: a fact's first training prompt, and
the same prompt with another subject of the same relation, equal token length), kept where the
model knows both (clean prefers its object, corrupted its own). For each hook — attention heads
(``z``, each head at every position: ``[layer, head]``), heads by position (``z`` ``[layer, pos,
head]``, with ``--head-positions``), ``mlp_out`` and the residual stream (``resid_pre``) by position — the exact patching
sweep (``patching.patch``, denoising, metric: logit difference between the two objects) is
compared with each estimate (``atp``, ``atp*``, ``ig`` with 5 steps on the input-embedding path, and on request
``ig-act``: IG on each layer's own activations, ``attribute(..., ig_path="activations")``) over every cell:

* Spearman ρ of the effects (patched − corrupted metric, averaged over pairs), and of the
  per-pair effects (every pair × cell);
* top-20 recall: the share of the exact top-20 cells (largest |effect|) among the estimate's top-20
  (for ``atp*`` ranked by its GradDrop score);
* after verification: ``verify(k=20)`` takes the estimate's top-40 cells and 20 random controls
  exactly and keeps the 20 largest; the share of the exact top-20 among them. The exact values of
  those cells are looked up in the full sweep (``verify(..., exact=sweep)``): the numbers ``verify``
  would patch again, without paying for them twice.

Writes ``attribution.png`` (estimate vs exact, one panel per hook and method), ``attribution.json``
and ``attribution.md``; for another ``--model`` the names end in ``_<model>``.

**Exact sweeps are cached on disk** (``--cache-dir``, default ``~/.cache/gpt2-interp/attribution/``;
``--no-cache`` to recompute): the exact patching of every cell is by far the slowest part (on
SmolLM2-135M 20–28 min per hook family, one thread), and it does not depend on the estimates. Each
sweep is stored under a key of the model's weight fingerprint (sha256 of its weights, so an edited
or retrained model misses), the prompt pairs and answer ids, the hook, the positions, the direction
and a format version; re-running the estimates (another method, IG steps, after a change to
``attribution.py``) reuses it. The table's "exact" time is then the time of the run that computed it
(stored with the sweep), marked "cached".
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import time
from pathlib import Path

import numpy as np
import torch

import gpt2_interp as gi
from gpt2_interp.analysis.attribution import agreement, attribute, recall, spearman, top_cells
from gpt2_interp.analysis.metrics import logit_diff
from gpt2_interp.analysis.patching import PatchResult, pair_tokens, patch
from gpt2_interp.facts.base import FactBase
from gpt2_interp.facts.pairs import subject_swaps
from gpt2_interp.model.fingerprint import weights_fingerprint
from gpt2_interp.plots.attribution import plot_agreement_grid

RESULTS = Path(__file__).resolve().parent / "results"
HOOKS = [  # (label, hook, positions)
    ("heads (z)", "z", None),
    ("heads × position (z)", "z", "each"),
    ("mlp_out", "mlp_out", None),
    ("residual (resid_pre)", "resid_pre", None),
]
METHODS = ["atp", "atp*", "ig", "ig-act"]
DEFAULT_METHODS = "atp,atp*,ig"
ATTRIBUTE_ARGS = {  # row name → attribute() arguments
    "atp": dict(method="atp"), "atp*": dict(method="atp*"), "ig": dict(method="ig"),
    "ig-act": dict(method="ig", ig_path="activations"),  # IG on each layer's own activations (m passes per layer)
}
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


CACHE_DIR = Path.home() / ".cache" / "gpt2-interp" / "attribution"
CACHE_VERSION = 1  # bump when patch()'s values or PatchResult's fields change meaning


def cache_key(model, fp, hook: str, positions, direction: str = "denoise") -> str:
    """sha256 naming one exact sweep: model weights, pairs, answers, hook, positions, direction."""
    spec = {"v": CACHE_VERSION, "weights": weights_fingerprint(model), "model": model.cfg.name,
            "clean": list(fp.clean), "corrupted": list(fp.corrupted), "answers": [int(x) for x in fp.answers],
            "wrongs": [int(x) for x in fp.wrongs], "hook": hook, "positions": positions, "direction": direction}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:32]


def cached_patch(model, fp, metric, hook: str, positions, cache_dir: Path | None) -> tuple[PatchResult, float, bool]:
    """``patch(model, fp.clean, fp.corrupted, metric, hook=hook, positions=positions)``, from the disk
    cache when this sweep was computed before. Returns the result, the seconds the sweep took when it
    was computed, and whether it came from the cache."""
    path = None if cache_dir is None else cache_dir / f"{cache_key(model, fp, hook, positions)}.pt"
    if path is not None and path.exists():
        try:
            d = torch.load(path, weights_only=True)
            return PatchResult(**d["fields"]), float(d["seconds"]), True
        except Exception as e:  # a damaged or outdated file: recompute and overwrite
            print(f"ignoring the cached sweep {path} ({type(e).__name__}: {e})", flush=True)
    t0 = time.perf_counter()
    r = patch(model, fp.clean, fp.corrupted, metric, hook=hook, positions=positions)
    seconds = time.perf_counter() - t0
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fields = {f.name: getattr(r, f.name) for f in dataclasses.fields(r)}
        tmp = path.with_suffix(".tmp")
        torch.save({"fields": fields, "seconds": seconds}, tmp)
        tmp.replace(path)
    return r, seconds, False


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=50, help="prompt pairs to draw (those the model knows are kept)")
    ap.add_argument("--keep", type=int, default=None, help="keep at most this many of the known pairs (the first drawn)")
    ap.add_argument("--ig-steps", type=int, default=5)
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--head-positions", action="store_true",
                    help="also heads × position (z per position: many cells, exact patching is the slow part)")
    ap.add_argument("--methods", default=DEFAULT_METHODS,
                    help="comma-separated subset of atp,atp*,ig,ig-act (ig-act: IG on each layer's activation path)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the rows of the existing results (same pairs) that this run does not redo")
    ap.add_argument("--hooks", default=None,
                    help="only these rows, comma-separated from z, z-pos, mlp_out, resid_pre (written to <stem>_<hooks>.*)")
    ap.add_argument("--head-positions-only", action="store_true",
                    help="only heads × position (written to <stem>_head_positions.*)")
    ap.add_argument("--quick", action="store_true", help="8 pairs (a smoke test)")
    ap.add_argument("--model", default="gpt2-facts")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    ap.add_argument("--cache-dir", type=Path, default=CACHE_DIR, help="where exact sweeps are cached")
    ap.add_argument("--no-cache", action="store_true", help="recompute the exact sweeps (and do not store them)")
    ap.add_argument("--exact-pairs", type=int, default=None,
                    help="patch exactly only the first K pairs: agreement is measured on them, the estimate is timed "
                         "on all pairs and the exact time extrapolated ×pairs/K (rows are independent)")
    a = ap.parse_args(argv)
    if a.quick:
        a.pairs = 8
    model = gi.load(a.model).eval()
    fp = known_pairs(model, subject_swaps(FactBase.load(), model.tokenizer, a.pairs, seed=0))
    if a.keep is not None:
        fp = fp.subset(range(min(a.keep, len(fp))))
    stem = "attribution" if a.model == "gpt2-facts" else f"attribution_{a.model}"
    print(f"{a.model}: {len(fp)} known pairs of {a.pairs} drawn", flush=True)
    metric = logit_diff(fp.answers, fp.wrongs)
    metric.name = "logit_diff(clean object, corrupted object)"
    P = pair_tokens(model, fp.clean, fp.corrupted)[0].shape[1]
    rows, times = [], {}
    if a.head_positions_only:
        a.head_positions, stem = True, f"{stem}_head_positions"
    hooks = [h for h in HOOKS if (a.head_positions or h[2] != "each") and (not a.head_positions_only or h[2] == "each")]
    if a.hooks:  # a subset of the rows, in a file of its own (e.g. to run a deep model's hooks side by side)
        keys = a.hooks.split(",")
        hooks = [h for h in HOOKS if (h[1] + ("-pos" if h[2] == "each" else "")) in keys]
        stem = f"{stem}_{'_'.join(keys)}"
    methods = [m for m in METHODS if m in a.methods.split(",")]
    # every hook's exact sweep with AtP and IG first, AtP* (GradDrop: one backward pass per layer) after them:
    # the cheap estimates are in the results (written after every row) before the costly one runs
    order = [(h, m) for h in hooks for m in methods if m != "atp*"] + [(h, "atp*") for h in hooks if "atp*" in methods]
    exacts: dict[str, object] = {}
    cached: dict[str, bool] = {}
    panels: dict[tuple[str, str], tuple] = {}
    kept: list[dict] = []
    old_file = a.out_dir / f"{stem}.json"
    if a.merge and old_file.exists():
        old = json.loads(old_file.read_text())
        if old.get("prompt_pairs") != [[c, k] for c, k in zip(fp.clean, fp.corrupted)]:
            raise SystemExit(f"--merge: {old_file} holds other prompt pairs; run without --merge to replace it")
        redo = {(h[0], m) for h, m in order}
        kept = [r for r in old["rows"] if (r["hook"], r["method"]) not in redo]
        for r in kept:  # rows written before the mean effects were stored: an empty panel that says so
            est_mean, ex_mean = (np.array(r.get("estimate_mean", [])), np.array(r.get("exact_mean", [])))
            panels[r["hook"], r["method"]] = (est_mean, ex_mean, f"ρ = {r['spearman']:.3f}, top-{a.k} recall {r['recall']:.0%}"
                                              + ("" if est_mean.size else " (kept row: see the table)"))
        methods = [m for m in METHODS if m in methods or any(r["method"] == m for r in kept)]
        print(f"--merge: keeping {len(kept)} rows of {old_file.name}", flush=True)
    rows = list(kept)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    sub = fp if a.exact_pairs is None or a.exact_pairs >= len(fp) else fp.subset(range(a.exact_pairs))
    sub_metric = metric if sub is fp else logit_diff(sub.answers, sub.wrongs)
    sub_metric.name = metric.name
    P_sub = pair_tokens(model, sub.clean, sub.corrupted)[0].shape[1]  # the subset's padded length may be shorter
    for (label, hook, pos), method in order:
        positions = list(range(P)) if pos == "each" else None
        if label not in exacts:
            print(f"exact patching {label}{'' if sub is fp else f' on {len(sub)} of the pairs'} …", flush=True)
            exacts[label], times[f"exact {label}"], hit = cached_patch(
                model, sub, sub_metric, hook, None if pos is None else list(range(P_sub)), None if a.no_cache else a.cache_dir)
            times[f"exact {label}"] *= len(fp) / len(sub)  # extrapolated to all pairs when a subset
            cached[label] = hit
            if hit:
                print(f"  from the cache ({times[f'exact {label}']:.0f} s when computed)", flush=True)
        exact = exacts[label]
        t0 = time.perf_counter()
        est = attribute(model, fp.clean, fp.corrupted, metric, hook=hook, positions=positions, ig_steps=a.ig_steps,
                        **ATTRIBUTE_ARGS[method])
        times[f"{method} {label}"] = time.perf_counter() - t0
        n_cells = est.values.numel()
        if sub is not fp:  # agreement on the exactly patched pairs
            est = attribute(model, sub.clean, sub.corrupted, sub_metric, hook=hook, ig_steps=a.ig_steps,
                            positions=None if pos is None else list(range(P_sub)), **ATTRIBUTE_ARGS[method])
        agr = agreement(est, exact, k=a.k)
        v = est.verify(k=a.k, exact=exact)
        truth = top_cells((exact.values - exact.baseline).abs(), a.k)
        rows.append({
            "hook": label, "method": method, "cells": n_cells, "cells_compared": agr.n_cells,
            "spearman": agr.spearman, "spearman_abs": agr.spearman_abs,
            "spearman_pairs": spearman(pair_effects(est), pair_effects(exact)),
            "recall": agr.recall, "recall_verified": recall(v.verified_top, truth),
            "verified_cells": len(v.cells), "controls_above_kth": v.controls_above,
            "seconds": times[f"{method} {label}"], "exact_seconds": times[f"exact {label}"],
            "exact_cached": cached[label], "exact_pairs": len(sub),
            "goal": GOALS.get(label),
            "estimate_mean": [round(float(x), 5) for x in agr.estimate], "exact_mean": [round(float(x), 5) for x in agr.exact],
        })
        print(f"{label} {method}: ρ {agr.spearman:.3f}, top-{a.k} recall {agr.recall:.0%} "
              f"({times[f'{method} {label}']:.1f} s; exact {times[f'exact {label}']:.1f} s)", flush=True)
        panels[label, method] = (agr.estimate.numpy(), agr.exact.numpy(), f"ρ = {agr.spearman:.3f}, top-{a.k} recall {agr.recall:.0%}")
        out = write(a, stem, fp, P, hooks, methods, rows, panels, done=len(rows) == len(order) + len(kept))
    return out


def write(a, stem: str, fp, P: int, hooks, methods: list[str], rows: list[dict], panels: dict, done: bool) -> dict:
    """Table, JSON and figure of the rows measured so far (rewritten after each row; ``done`` when all are in)."""
    n = len(fp)
    cols = [m for m in methods if any((h[0], m) in panels for h in hooks)]
    grid = [[panels.get((h[0], m), (np.zeros(0), np.zeros(0), "not run")) for m in cols] for h in hooks]
    fig = plot_agreement_grid(grid, [h[0] for h in hooks], cols,
                              title=f"Attribution estimates vs exact patching on {a.model}, {n} fact prompt pairs "
                                    f"(effect on logit difference, mean over pairs; IG: {a.ig_steps} steps)")
    fig.savefig(a.out_dir / f"{stem}.png", dpi=110, bbox_inches="tight")
    table = ["| hook | method | cells | Spearman ρ (mean effect) | ρ (per pair × cell) | ρ of |effect| vs score | "
             f"top-{a.k} recall | top-{a.k} recall after verifying {2 * a.k} + {a.k} controls | goal (ρ) | time (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for h in hooks:
        for r in sorted((r for r in rows if r["hook"] == h[0]), key=lambda r: METHODS.index(r["method"])):
            goal = "—" if r["goal"] is None else f"≥ {r['goal']}"
            k_ex = r.get("exact_pairs", n)
            exact_note = (", cached" if r.get("exact_cached") else "") + ("" if k_ex == n else f", extrapolated from {k_ex} pairs")
            table.append(f"| {r['hook']} | {r['method']} | {r['cells']} | {r['spearman']:.3f} | {r['spearman_pairs']:.3f} | "
                         f"{r['spearman_abs']:.3f} | {r['recall']:.0%} | {r['recall_verified']:.0%} | {goal} | "
                         f"{r['seconds']:.1f} (exact {r['exact_seconds']:.1f}{exact_note}) |")
    cmd = (f"python analyses/attribution.py{'' if a.model == 'gpt2-facts' else ' --model ' + a.model} --pairs {a.pairs}"
           f"{'' if a.keep is None else f' --keep {a.keep}'}{' --head-positions' if a.head_positions and not a.head_positions_only else ''}"
           f"{' --head-positions-only' if a.head_positions_only else ''}{' --hooks ' + a.hooks if a.hooks else ''}"
           f"{'' if a.methods == DEFAULT_METHODS else ' --methods ' + a.methods}{' --merge' if a.merge else ''}"
           f"{'' if a.exact_pairs is None else f' --exact-pairs {a.exact_pairs}'}")
    md = (f"# Attribution patching vs exact patching on {a.model}\n\n`{cmd}`: "
          f"{n} prompt pairs the model knows (the first {n} known of {a.pairs} drawn), {P} positions (left-padded), denoising, metric "
          f"logit[clean object] − logit[corrupted object]; IG with {a.ig_steps} steps (ig: on the input-embedding path, EAP-IG; "
          f"ig-act: on each layer's own activations, everything upstream at the corrupted run); AtP* ranks by GradDrop. "
          + ("With `--merge`, the rows of methods not named in `--methods` are kept from the previous run on the same pairs. "
             if a.merge else "")
          + 
          f"Times are wall seconds on our shared 2-core CPU, {torch.get_num_threads()} thread(s).\n\n"
          + ("" if a.exact_pairs is None or a.exact_pairs >= n else
             f"Exact patching ran on the first {a.exact_pairs} pairs only: the agreement columns compare the estimate on "
             f"those pairs; the estimate's time is for all {n} pairs, the exact time is extrapolated from the "
             f"{a.exact_pairs} (×{n / a.exact_pairs:g}; patching's rows are independent, its cost ∝ pairs).\n\n")
          + ("" if done else "**Partial: the run had not finished when this was written.**\n\n")
          + "\n".join(table) + "\n")
    (a.out_dir / f"{stem}.md").write_text(md)
    out = {"model": a.model, "pairs": n, "drawn": a.pairs, "positions": P, "ig_steps": a.ig_steps, "k": a.k,
           "complete": done, "rows": rows, "prompt_pairs": [[c, k] for c, k in zip(fp.clean, fp.corrupted)]}
    (a.out_dir / f"{stem}.json").write_text(json.dumps(out, indent=1, default=float) + "\n")
    if done:
        print(md)
    return out


if __name__ == "__main__":
    main()
