"""Editing cost on our CPU: one ROME edit of SmolLM2-135M with cached key statistics (#12 goal: ≤ 10 s).

    python benchmarks/bench_editing.py [--edits 8] [--layer L] [--out benchmarks/RESULTS_editing.md]

Times ``rome.compute_edit`` (δ optimisation + the rank-one solve, statistics read from the cache, which
the first call fills) for ``--edits`` requests about facts the model knows, and one forward pass of the
same prompt batch the δ optimisation runs (its bare prompt + context prefixes + KL prompt), so the edit
also reads as "× a forward" — a ratio that moves less with the machine's load than the seconds do.
Run it on an idle machine: the 2-core machine we share swings 2-10× under load (the header records the
load average before and after).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import gpt2_interp as gi
from gpt2_interp.editing.rome import compute_edit
from gpt2_interp.editing.settings import default_layer, hparams_for
from gpt2_interp.editing.stats import key_second_moment
from gpt2_interp.experiments.provenance import standalone, write_beside

ROOT = Path(__file__).resolve().parent.parent
REQUESTS = [  # facts SmolLM2-135M knows (analyses/results/known_facts/smollm2-135m/known_facts.json), new targets
    ("The capital of {} is", "France", " Rome"),
    ("The capital of {} is", "Japan", " Berlin"),
    ("{} is located in the continent of", "Brazil", " Asia"),
    ("The official language of {} is", "Germany", " Spanish"),
    ("The capital of {} is", "Egypt", " Madrid"),
    ("{} is located in the country of", "Toronto", " Italy"),
    ("The capital of {} is", "Canada", " Paris"),
    ("The chemical symbol of {} is", "Iron", " Au"),
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--edits", type=int, default=8)
    p.add_argument("--layer", type=int, default=None, help="edit layer (default: the model's ROME default)")
    p.add_argument("--corpus", default="brown")
    p.add_argument("--n-samples", type=int, default=100_000)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS_editing.md")
    a = p.parse_args(argv)
    load0 = os.getloadavg()[0]
    model = gi.load(a.model)
    layer = default_layer(model) if a.layer is None else a.layer
    t = time.perf_counter()
    stats = key_second_moment(model, layer, corpus=a.corpus, n_samples=a.n_samples, progress=False)
    stats_s = time.perf_counter() - t
    reqs = [{"prompt": pr, "subject": s, "target": tg} for pr, s, tg in (REQUESTS * 4)[: a.edits]]
    compute_edit(model, reqs[0], layer=layer, stats=stats)  # warm-up (prefixes are generated once per model)
    times, steps = [], []
    for r in reqs:
        t = time.perf_counter()
        e = compute_edit(model, r, layer=layer, stats=stats)
        times.append(time.perf_counter() - t)
        steps.append(e.metrics["steps"])
    # one forward of a batch shaped like the δ optimisation's (12 rows of its width)
    hp = hparams_for(model)
    rows = 1 + len(hp.prefix_lengths) * hp.prefixes_per_length + 1
    toks = torch.randint(100, 1000, (rows, 24))
    with torch.no_grad():
        model(toks)
        f = []
        for _ in range(5):
            t = time.perf_counter()
            model(toks)
            f.append(time.perf_counter() - t)
    fwd = statistics.median(f)
    med = statistics.median(times)
    load1 = os.getloadavg()[0]
    lines = [
        "# Editing cost",
        "",
        f"`python benchmarks/bench_editing.py {' '.join(argv if argv is not None else sys.argv[1:])}` — "
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
        f"load average {load0:.2f} before, {load1:.2f} after.",
        "",
        f"ROME on {model.cfg.name}, layer {layer}, key statistics: {stats.count} tokens of `{stats.key['corpus']}` "
        f"({stats_s:.1f} s, or read from the cache).",
        "",
        "| measurement | value | goal |",
        "|---|---|---|",
        f"| one ROME edit (median of {len(times)}; δ steps {min(steps)}–{max(steps)}) | {med:.2f} s | ≤ 10 s |",
        f"| … ÷ one forward of its {rows}×24 prompt batch | {med / fwd:.0f}× | |",
        f"| slowest edit | {max(times):.2f} s | |",
        "",
    ]
    a.out.write_text("\n".join(lines))
    write_beside(a.out, standalone(sys.argv))  # provenance.json beside the results
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
