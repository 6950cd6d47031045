"""Edge scores checked against exact edge patching, and the cost of scoring every edge.

    python benchmarks/bench_edge_scores.py [--part agreement|speed|curve|smollm2|all] [--out FILE.md]

1. Agreement (``--model gpt2-facts``: subject-swap fact-recall pairs the model knows,
   ``analyses.attribution.fact_pairs``, metric logit[clean object] − logit[corrupted object];
   ``--model smollm2-135m``: IOI pairs, seed 0, metric logit[IO] − logit[S]; ``--pairs`` of them). EAP,
   EAP-IG (inputs, 5 and 20 steps) and EAP-IG (activations, 5 steps) score every edge; edges are patched
   exactly (``edge_scores(method="exact")``, the prefix-reuse engine, noising: one edge at a time carries the
   corrupted sender into the clean run) — on gpt2-facts every edge; on SmolLM2 (70,651 edges) the union of
   each method's top 200 and 800 edges drawn uniformly from the rest, and without the activations path (one
   forward and backward per receiver stage, 61 of them: ≈ 30× the inputs path's cost there). Spearman ρ of each method
   against exact over the patched edges and over a sample of 1,000 (the top 200 by |exact| among the patched
   and 800 drawn at random: from the rest on gpt2-facts, the uniform draw on SmolLM2). ``--denoise`` also
   patches every edge the other way (restored to clean in the corrupted run) and reports each method's ρ
   against the noising effect, the negated denoising effect and their mean.
2. Speed (SmolLM2-135M): EAP-IG, 5 steps, input path, over all edges for ``--speed-pairs`` subject-swap pairs
   (short fact prompts, not filtered by knowledge: only the time is measured), wall-clock seconds of
   ``edge_scores`` and the process's CPU time over it (pairs tokenised, unpatched runs and all gradient passes
   included; the model load is not). On a shared machine the CPU time is the measure: with one torch thread it
   is what an idle single core would take.
3. Faithfulness curves (gpt2-facts, the pairs of part 1): circuits of the top edges by EAP, EAP-IG (inputs) and
   EAP-IG (activations), 20 sizes from 0.1% to all edges, dangling edges pruned, faithfulness exact
   (``faithfulness_curve``), then the same with the greedy selection (``selection="greedy"``: grown from the
   logits up); the smallest circuit reaching 80% per method, as a share of all edges.
4. SmolLM2-135M on IOI (``--part smollm2``): the pairs of ``analyses/circuit_discovery`` (``ioi``, seed 0,
   ``--speed-pairs`` of them), wall-clock seconds of EAP-IG (inputs, 5 steps) over all edges and of the exact
   faithfulness curve of its top-k circuits at 20 sizes (dangling edges pruned), with the load average
   before and after each (run it alone on the machine: the wall time is the measure); then the curve of its
   greedy circuits (not timed).
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
from gpt2_interp.experiments.provenance import standalone, write_beside
from gpt2_interp.facts import FactBase
from gpt2_interp.facts.pairs import subject_swaps

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the studies (analyses/) beside the package
from analyses.attribution import fact_pairs, pair_metric


def sample(
    exact: torch.Tensor, top: int = 200, total: int = 1000, seed: int = 0, drawn: torch.Tensor | None = None
) -> torch.Tensor:
    """The ``top`` edges by |exact| among those patched (not NaN), and ``total − top`` others drawn at
    random (seeded) from the rest of them — or, given ``drawn`` (edges drawn uniformly at random from
    the whole graph), those of ``drawn`` not already in the top."""
    known = (~exact.isnan()).nonzero()[:, 0]
    order = known[exact[known].abs().argsort(descending=True)]
    if drawn is not None:
        return torch.cat([order[:top], drawn[~torch.isin(drawn, order[:top])][: total - top]])
    rest = order[top:]
    g = torch.Generator().manual_seed(seed)
    return torch.cat([order[:top], rest[torch.randperm(rest.numel(), generator=g)[: total - top]]])


METHODS = (
    ("eap", {"method": "eap"}),
    ("eap-ig (inputs, 5 steps)", {"method": "eap-ig", "ig_steps": 5}),
    ("eap-ig (inputs, 20 steps)", {"method": "eap-ig", "ig_steps": 20}),
    ("eap-ig (activations, 5 steps)", {"method": "eap-ig", "ig_steps": 5, "ig_path": "activations"}),
)


def _rho(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(spearmanr(a.numpy(), b.numpy()).statistic)


def agreement(
    model_name: str, pairs: int, candidates: int = 200, denoise: bool = False, all_up_to: int = 5000
) -> tuple[list[str], dict]:
    """Spearman ρ of each gradient method against exact edge patching (noising: one edge at a time
    carries the corrupted sender into the clean run). gpt2-facts: every edge patched exactly; a larger
    graph (over ``all_up_to`` edges): the union of each method's top ``candidates`` edges and 800 others
    drawn at random."""
    model = gi.load(model_name)
    if model_name == "gpt2-facts":
        fp = fact_pairs(model, 4 * pairs, pairs)
        clean, corrupted, metric, what = fp.clean, fp.corrupted, pair_metric(fp), "fact-recall pairs it knows"
    else:
        from gpt2_interp.analysis.circuits.tasks import ioi

        task = ioi(model, n=pairs, seed=0)
        clean, corrupted, metric, what = task.clean, task.corrupted, task.metric, "IOI pairs (seed 0)"
    n_edges = graph_of(model).n_edges
    est, secs = {}, {}
    for label, kw in METHODS:
        if kw.get("ig_path") == "activations" and n_edges > all_up_to:
            continue  # one run per receiver stage (61 on SmolLM2): ~30× the inputs path, left out there
        t = time.perf_counter()
        est[label] = edge_scores(model, clean, corrupted, metric, progress=False, **kw).scores
        secs[label] = time.perf_counter() - t
    drawn = None
    if n_edges <= all_up_to:
        chosen, how = None, f"every edge ({n_edges}) patched exactly"
    else:
        g = torch.Generator().manual_seed(1)
        tops = torch.cat([s.abs().argsort(descending=True)[:candidates] for s in est.values()]).unique()
        others = torch.ones(n_edges, dtype=torch.bool)
        others[tops] = False
        pool = others.nonzero()[:, 0]
        drawn = pool[torch.randperm(pool.numel(), generator=g)[: min(800, all_up_to)]]
        chosen = torch.cat([tops, drawn])
        how = (
            f"{chosen.numel()} of {n_edges} edges patched exactly: the union of each method's top {candidates} "
            f"by |score| ({tops.numel()}) and {drawn.numel()} drawn at random from the rest (seeded)"
        )
    t = time.perf_counter()
    exact = edge_scores(model, clean, corrupted, metric, method="exact", edges=chosen, progress=False).scores
    secs["exact"] = time.perf_counter() - t
    idx = sample(exact, drawn=drawn)
    done = (~exact.isnan()).nonzero()[:, 0]
    lines = [
        f"{model_name}, {len(clean)} {what}; {how} in {secs['exact']:.0f} s (load average "
        f"{os.getloadavg()[0]:.1f} at the end)",
        "",
        "| method | Spearman ρ, all patched edges | ρ, 1,000 sampled (top 200 by exact incl.) | seconds |",
        "|---|---|---|---|",
    ]
    data: dict = {"model": model_name, "pairs": len(clean), "edges": n_edges, "patched": int(done.numel())}
    data["exact_seconds"] = secs["exact"]
    for label, s in est.items():
        rho_all, rho_s = _rho(s[done], exact[done]), _rho(s[idx], exact[idx])
        lines.append(f"| {label} | {rho_all:.3f} | {rho_s:.3f} | {secs[label]:.1f} |")
        data[label] = {"rho_all": rho_all, "rho_sample": rho_s, "seconds": secs[label]}
    if denoise:  # the other direction: one edge at a time carries the clean sender into the corrupted run
        t = time.perf_counter()
        back = edge_scores(model, corrupted, clean, metric, method="exact", edges=chosen, progress=False).scores
        secs["denoise"] = time.perf_counter() - t
        both = (exact - back) / 2
        lines += [
            "",
            f"Denoising (every edge alone restored to its clean sender in the corrupted run; {secs['denoise']:.0f} s): "
            "ρ over all patched edges against the noising effect N, the negated denoising effect −D, and their "
            "mean (N − D)/2",
            "",
            "| method | ρ vs N | ρ vs −D | ρ vs (N − D)/2 |",
            "|---|---|---|---|",
        ]
        data["denoise"] = {"seconds": secs["denoise"], "rho_noise_denoise": _rho(exact[done], -back[done])}
        for label, s in est.items():
            r = [_rho(s[done], x[done]) for x in (exact, -back, both)]
            lines.append(f"| {label} | {r[0]:.3f} | {r[1]:.3f} | {r[2]:.3f} |")
            data["denoise"][label] = r
        lines += ["", f"ρ(N, −D) = {data['denoise']['rho_noise_denoise']:.3f}"]
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
    greedy = faithfulness_curve(model, scores, fp.clean, fp.corrupted, metric, sizes=20, selection="greedy")
    small = c.smallest(0.8) | greedy.smallest(0.8)
    lines = [
        f"Faithfulness curves, gpt2-facts, {len(fp)} pairs, {len(c.sizes)} sizes × {len(c.methods)} methods: "
        f"{secs:.0f} s wall, {cpu:.0f} s CPU (the top edges; the same again with the greedy selection)",
        "",
        "| method | smallest circuit with faithfulness ≥ 80% (edges, share of all) |",
        "|---|---|",
    ]
    for m, k in small.items():
        lines.append(f"| {m} | {'none' if k is None else f'{k} ({100 * k / c.total_edges:.1f}%)'} |")
    lines += ["", "```", c.table(), "```", "", "```", greedy.table(), "```"]
    data = {"smallest": small, "faithfulness": c.faithfulness.tolist(), "kept": c.kept.tolist()}
    return lines, data | {"greedy_faithfulness": greedy.faithfulness.tolist(), "greedy_kept": greedy.kept.tolist()}


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
    greedy = faithfulness_curve(model, scores, task.clean, task.corrupted, task.metric, sizes=20, selection="greedy")
    small = c.smallest(0.8)["eap-ig"]
    small_greedy = greedy.smallest(0.8)["eap-ig-greedy"]
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
        f"Smallest EAP-IG circuit with faithfulness ≥ 80%: {'none' if small is None else f'{small} edges'} "
        f"(the top edges); {'none' if small_greedy is None else f'{small_greedy} edges'} (greedy selection)",
        "",
        "```",
        c.table(),
        "```",
        "",
        "```",
        greedy.table(),
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
        "greedy_faithfulness": greedy.faithfulness.tolist(),
        "greedy_kept": greedy.kept.tolist(),
    }
    return lines, data


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("agreement", "speed", "curve", "smollm2", "all"), default="all")
    ap.add_argument("--pairs", type=int, default=16, help="prompt pairs for the agreement part")
    ap.add_argument("--model", default="gpt2-facts", help="the agreement part's model (gpt2-facts, smollm2-135m)")
    ap.add_argument("--denoise", action="store_true", help="agreement: also patch each edge the other way")
    ap.add_argument("--speed-pairs", type=int, default=100, help="SmolLM2 pairs for the speed and smollm2 parts")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    torch.manual_seed(0)
    lines, data = [], {}
    if a.part in ("agreement", "all"):
        part, data["agreement"] = agreement(a.model, a.pairs, denoise=a.denoise)
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
