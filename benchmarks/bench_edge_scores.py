"""Edge scores checked against exact edge patching, and the cost of scoring every edge.

    python benchmarks/bench_edge_scores.py [--part agreement|speed|curve|smollm2|all] [--out FILE.md]

1. Agreement (gpt2-facts): subject-swap fact-recall pairs the model knows (``experiments.attribution.fact_pairs``,
   ``--pairs`` of them), metric logit[clean object] − logit[corrupted object]. Every edge is patched exactly
   (``edge_scores(method="exact")``, the prefix-reuse engine); EAP, EAP-IG (inputs, 5 steps) and EAP-IG
   (activations, 5 steps) score every edge. Spearman ρ of each against exact over all edges and over a sample
   of 1,000 edges (the top 200 by |exact| and 800 drawn at random from the rest, seeded).
2. Speed (SmolLM2-135M): EAP-IG, 5 steps, input path, over all edges for ``--speed-pairs`` subject-swap pairs
   (short fact prompts, not filtered by knowledge: only the time is measured), wall-clock seconds of
   ``edge_scores`` and the process's CPU time over it (pairs tokenised, unpatched runs and all gradient passes
   included; the model load is not). On a shared machine the CPU time is the measure: with one torch thread it
   is what an idle single core would take.
3. Faithfulness curves (gpt2-facts, the pairs of part 1): circuits of the top edges by EAP, EAP-IG (inputs) and
   EAP-IG (activations), 20 sizes from 0.1% to all edges, dangling edges pruned, faithfulness exact
   (``faithfulness_curve``); the smallest circuit reaching 80% per method, as a share of all edges.
4. SmolLM2-135M on IOI (``--part smollm2``): the pairs of ``experiments/circuit_discovery`` (``ioi``, seed 0,
   ``--speed-pairs`` of them), wall-clock seconds of EAP-IG (inputs, 5 steps) over all edges and of the exact
   faithfulness curve of its top-k circuits at 20 sizes (dangling edges pruned), with the load average
   before and after each (run it alone on the machine: the wall time is the measure).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from scipy.stats import spearmanr

import gpt2_interp as gi
from gpt2_interp.analysis.circuits import edge_scores, faithfulness_curve, graph_of
from gpt2_interp.analysis.metrics import logit_diff
from gpt2_interp.experiments.attribution import fact_pairs, pair_metric
from gpt2_interp.experiments.provenance import standalone, write_beside
from gpt2_interp.facts import FactBase
from gpt2_interp.facts.pairs import subject_swaps


def sample(exact: torch.Tensor, top: int = 200, total: int = 1000, seed: int = 0) -> torch.Tensor:
    """The ``top`` edges by |exact| and ``total − top`` others drawn at random (seeded)."""
    order = exact.abs().argsort(descending=True)
    rest = order[top:]
    g = torch.Generator().manual_seed(seed)
    return torch.cat([order[:top], rest[torch.randperm(rest.numel(), generator=g)[: total - top]]])


def agreement(pairs: int) -> tuple[list[str], dict]:
    model = gi.load("gpt2-facts")
    fp = fact_pairs(model, 4 * pairs, pairs)
    metric = pair_metric(fp)
    n_edges = graph_of(model).n_edges
    out, secs = {}, {}
    for label, kw in (
        ("exact", {"method": "exact"}),
        ("eap", {"method": "eap"}),
        ("eap-ig (inputs, 5 steps)", {"method": "eap-ig", "ig_steps": 5}),
        ("eap-ig (activations, 5 steps)", {"method": "eap-ig", "ig_steps": 5, "ig_path": "activations"}),
    ):
        t = time.perf_counter()
        out[label] = edge_scores(model, fp.clean, fp.corrupted, metric, progress=False, **kw).scores
        secs[label] = time.perf_counter() - t
    exact = out.pop("exact")
    idx = sample(exact)
    lines = [
        f"gpt2-facts, {len(fp)} fact-recall pairs, {n_edges} edges; exact edge patching of every edge "
        f"took {secs['exact']:.0f} s",
        "",
        "| method | Spearman ρ, all edges | ρ, 1,000 sampled (top 200 incl.) | seconds |",
        "|---|---|---|---|",
    ]
    data = {"pairs": len(fp), "edges": n_edges, "exact_seconds": secs["exact"]}
    for label, s in out.items():
        rho_all = spearmanr(s.numpy(), exact.numpy()).statistic
        rho_s = spearmanr(s[idx].numpy(), exact[idx].numpy()).statistic
        lines.append(f"| {label} | {rho_all:.3f} | {rho_s:.3f} | {secs[label]:.1f} |")
        data[label] = {"rho_all": float(rho_all), "rho_sample": float(rho_s), "seconds": secs[label]}
    return lines, data


def speed(n_pairs: int) -> tuple[list[str], dict]:
    model = gi.load("smollm2-135m")
    fp = subject_swaps(FactBase.load(), model.tokenizer, n_pairs)
    metric = logit_diff(torch.tensor(fp.answers), torch.tensor(fp.wrongs))
    n_edges = graph_of(model).n_edges
    tokens = len(model.to_str_tokens(fp.clean[0]))
    load0 = os.getloadavg()[0]
    t, cpu = time.perf_counter(), time.process_time()
    edge_scores(model, fp.clean, fp.corrupted, metric, method="eap-ig", ig_steps=5, progress=False)
    secs, cpu = time.perf_counter() - t, time.process_time() - cpu
    load1 = os.getloadavg()[0]
    line = (
        f"SmolLM2-135M, EAP-IG (inputs, 5 steps) over all {n_edges} edges, {len(fp)} pairs "
        f"(padded to one width; first prompt {tokens} tokens): {secs:.1f} s wall, {cpu:.1f} s of CPU time "
        f"(goal ≤ 120 s on an idle 2-core CPU; load average {load0:.1f} at the start, {load1:.1f} at the end)"
    )
    return [line], {"pairs": len(fp), "edges": n_edges, "seconds": secs, "cpu_seconds": cpu, "load": [load0, load1]}


def curve(pairs: int) -> tuple[list[str], dict]:
    model = gi.load("gpt2-facts")
    fp = fact_pairs(model, 4 * pairs, pairs)
    metric = pair_metric(fp)
    scores = [
        edge_scores(model, fp.clean, fp.corrupted, metric, progress=False, **kw)
        for kw in (
            {"method": "eap"},
            {"method": "eap-ig", "ig_steps": 5},
            {"method": "eap-ig", "ig_steps": 5, "ig_path": "activations"},
        )
    ]
    t, cpu = time.perf_counter(), time.process_time()
    c = faithfulness_curve(model, scores, fp.clean, fp.corrupted, metric, sizes=20)
    secs, cpu = time.perf_counter() - t, time.process_time() - cpu
    small = c.smallest(0.8)
    lines = [
        f"Faithfulness curves, gpt2-facts, {len(fp)} pairs, {len(c.sizes)} sizes × {len(c.methods)} methods: "
        f"{secs:.0f} s wall, {cpu:.0f} s CPU",
        "",
        "| method | smallest circuit with faithfulness ≥ 80% (edges, share of all) |",
        "|---|---|",
    ]
    for m, k in small.items():
        lines.append(f"| {m} | {'none' if k is None else f'{k} ({100 * k / c.total_edges:.1f}%)'} |")
    lines += ["", "```", c.table(), "```"]
    return lines, {"smallest": small, "faithfulness": c.faithfulness.tolist(), "kept": c.kept.tolist()}


def smollm2(n_pairs: int) -> tuple[list[str], dict]:
    from gpt2_interp.analysis.circuits.tasks import ioi

    model = gi.load("smollm2-135m")
    task = ioi(model, n=n_pairs, seed=0)
    n_edges = graph_of(model).n_edges
    load = [os.getloadavg()[0]]
    t = time.perf_counter()
    scores = edge_scores(model, task.clean, task.corrupted, task.metric, method="eap-ig", ig_steps=5, progress=False)
    ig_secs = time.perf_counter() - t
    load.append(os.getloadavg()[0])
    t = time.perf_counter()
    c = faithfulness_curve(model, scores, task.clean, task.corrupted, task.metric, sizes=20)
    curve_secs = time.perf_counter() - t
    load.append(os.getloadavg()[0])
    small = c.smallest(0.8)["eap-ig"]
    lines = [
        f"SmolLM2-135M, IOI, {len(task)} pairs (padded to {task.clean_tokens.shape[1]} tokens), all {n_edges} edges, "
        f"{torch.get_num_threads()} torch threads; load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} "
        "(start / after EAP-IG / after the curve)",
        "",
        "| step | wall seconds | goal |",
        "|---|---|---|",
        f"| EAP-IG (inputs, 5 steps), every edge | {ig_secs:.1f} | ≤ 120 |",
        f"| faithfulness curve, {len(c.sizes)} sizes (exact) | {curve_secs:.1f} | ≤ 300 |",
        "",
        f"Smallest EAP-IG circuit with faithfulness ≥ 80%: {'none' if small is None else f'{small} edges'}",
        "",
        "```",
        c.table(),
        "```",
    ]
    data = {
        "pairs": len(task),
        "edges": n_edges,
        "eap_ig_seconds": ig_secs,
        "curve_seconds": curve_secs,
        "load": load,
        "sizes": c.sizes,
        "faithfulness": c.faithfulness.tolist(),
        "kept": c.kept.tolist(),
    }
    return lines, data


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("agreement", "speed", "curve", "smollm2", "all"), default="all")
    ap.add_argument("--pairs", type=int, default=16, help="gpt2-facts pairs for the agreement part")
    ap.add_argument("--speed-pairs", type=int, default=100, help="SmolLM2 pairs for the speed and smollm2 parts")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    lines, data = [], {}
    if a.part in ("agreement", "all"):
        part, data["agreement"] = agreement(a.pairs)
        lines += [*part, ""]
    if a.part in ("speed", "all"):
        part, data["speed"] = speed(a.speed_pairs)
        lines += [*part, ""]
    if a.part in ("curve", "all"):
        part, data["curve"] = curve(a.pairs)
        lines += [*part, ""]
    if a.part in ("smollm2", "all"):
        part, data["smollm2"] = smollm2(a.speed_pairs)
        lines += part
    now = datetime.now(timezone.utc)
    env = f"{os.cpu_count()} cores, {torch.get_num_threads()} torch threads, {now:%Y-%m-%d %H:%M} UTC"
    text = "\n".join(lines) + f"\n\n({env})\n"
    print(text)
    if a.out:
        a.out.write_text(
            "# Edge-level circuits\n\n`python benchmarks/bench_edge_scores.py`\n\n"
            + (__doc__.split("\n\n", 2)[2].strip() + "\n\n")
            + text
        )
        write_beside(a.out, standalone(sys.argv))
    return data


if __name__ == "__main__":
    main()
