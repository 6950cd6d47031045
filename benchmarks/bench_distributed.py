"""Key statistics on 2 processes vs 1 (torch.distributed, gloo, CPU), and a projection to many ranks.

    python benchmarks/bench_distributed.py [--tokens 30000] [--out benchmarks/RESULTS_distributed.md]

``key_second_moment`` of the embedded gpt2-facts (its default edit layer, the "facts" corpus,
no disk cache), timed

1. in one process with 1 thread, and with 2 threads (the single-process peer on this machine);
2. on 2 ranks (``torch.multiprocessing.spawn``, gloo), 1 thread each, timed inside the ranks from a
   barrier to the end of the all-reduce (process start and imports excluded, reported apart).

Speed-up = one process, 1 thread ÷ 2 ranks; efficiency = speed-up ÷ 2; per-process throughput =
tokens ÷ time ÷ processes. On a 2-core machine the bound is 2×, and a machine shared with other
jobs gives noisy numbers: the ratios are measured in the same run.

The projection: time(R) = tokens × (measured seconds per token of one 1-thread rank) ÷ R + an
all-reduce of the d_mlp × d_mlp float64 sum, measured on 2 ranks and scaled as a ring all-reduce
(2(R−1)/R of the bytes through each link). It ignores load imbalance (≤ one batch per rank) and
the replicated tokenisation of the corpus on every rank.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import gpt2_interp as gi  # noqa: E402 (imported once the checkout is on sys.path)
from gpt2_interp.core import distributed  # noqa: E402 (imported once the checkout is on sys.path)
from gpt2_interp.editing.rome import default_layer  # noqa: E402 imported once the checkout is on sys.path
from gpt2_interp.editing.stats import clear_memory_cache, key_second_moment  # noqa: E402 (imported once the checkout is on sys.path)
from gpt2_interp.experiments.provenance import standalone, write_beside  # noqa: E402 (as above)


def stats_seconds(model, tokens: int, group=None) -> tuple[float, torch.Tensor]:
    clear_memory_cache()
    distributed.barrier(group)
    t0 = time.perf_counter()
    st = key_second_moment(
        model, default_layer(model), corpus="facts", n_samples=tokens, cache_dir=False, progress=False, group=group
    )
    return time.perf_counter() - t0, st.C


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, tokens: int, repeats: int, out: str) -> None:
    torch.set_num_threads(1)
    t_start = time.perf_counter()
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=600)
    )
    model = gi.load("gpt2-facts")
    t_ready = time.perf_counter() - t_start
    times, C = [], None
    for _ in range(repeats):
        t, C = stats_seconds(model, tokens)
        times.append(t)
    # the all-reduce of one d_mlp × d_mlp float64 sum, alone
    x = torch.zeros(model.cfg.d_mlp, model.cfg.d_mlp, dtype=torch.float64)
    ar = []
    for _ in range(5):
        distributed.barrier()
        t0 = time.perf_counter()
        distributed.all_reduce_sum(x)
        ar.append(time.perf_counter() - t0)
    if rank == 0:
        torch.save({"times": times, "C": C, "allreduce": ar, "ready": t_ready}, out)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=30_000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    model = gi.load("gpt2-facts")
    d_mlp = model.cfg.d_mlp
    single: dict[int, list[float]] = {1: [], 2: []}
    C1 = None
    for threads in (1, 2):
        torch.set_num_threads(threads)
        stats_seconds(model, min(a.tokens, 2000))  # warm-up
        for _ in range(a.repeats):
            t, C1 = stats_seconds(model, a.tokens)
            single[threads].append(t)
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench_distributed_{os.getpid()}.pt"
    t0 = time.perf_counter()
    mp.spawn(_rank, args=(2, _port(), a.tokens, a.repeats, str(tmp)), nprocs=2, join=True)
    spawn_total = time.perf_counter() - t0
    r = torch.load(tmp, weights_only=False)
    tmp.unlink()
    t1, t1b, t2 = statistics.median(single[1]), statistics.median(single[2]), statistics.median(r["times"])
    ar = statistics.median(r["allreduce"])
    diff = float((r["C"].double() - C1.double()).abs().max() / C1.double().abs().max())
    per_token = t1 / a.tokens
    speedup = t1 / t2
    rows = [
        ("1 process, 1 thread", t1, a.tokens / t1, a.tokens / t1, "—"),
        ("1 process, 2 threads", t1b, a.tokens / t1b, a.tokens / t1b, f"{t1 / t1b:.2f}×"),
        ("2 ranks (gloo), 1 thread each", t2, a.tokens / t2, a.tokens / t2 / 2, f"{speedup:.2f}×"),
    ]
    lines = [
        f"Key statistics of gpt2-facts (layer {default_layer(model)}, d_mlp {d_mlp}), {a.tokens:,} tokens of the "
        f"'facts' corpus, median of {a.repeats}.",
        "",
        "| run | seconds | tokens/s | tokens/s per process | speed-up vs 1 process, 1 thread |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {n} | {t:.2f} | {tp:,.0f} | {pp:,.0f} | {s} |" for n, t, tp, pp, s in rows]
    lines += [
        "",
        f"2 ranks: speed-up {speedup:.2f}×, efficiency {speedup / 2:.0%} (bound: 2 cores). "
        f"C on 2 ranks vs 1 process: max |Δ| ÷ max |C| = {diff:.1e} (float64 sums, summation order). "
        f"Process start + imports + model load per rank: {r['ready']:.1f} s (whole spawn {spawn_total:.1f} s, not in "
        "the times above). "
        f"All-reduce of the {d_mlp}×{d_mlp} float64 sum ({d_mlp * d_mlp * 8 / 2**20:.0f} MiB) on 2 ranks: "
        f"{ar * 1e3:.1f} ms.",
        "",
    ]
    lines += [
        "### Projection: statistics time vs ranks",
        "",
        f"time(R) = tokens × {per_token * 1e6:.1f} µs/token (measured, one 1-thread rank of this CPU) ÷ R + "
        f"all-reduce {ar * 1e3:.1f} ms × 2(R−1)/R (ring all-reduce; measured at R = 2).",
        "",
        "| tokens | R = 1 | 2 | 4 | 8 | 16 | 64 | speed-up at 64 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n_tok in (100_000, 1_000_000, 44_000_000):
        ts = [n_tok * per_token / R + (ar * (R - 1) / R / 0.5 if R > 1 else 0) for R in (1, 2, 4, 8, 16, 64)]
        lines.append(f"| {n_tok:,} | " + " | ".join(_dur(t) for t in ts) + f" | {ts[0] / ts[-1]:.1f}× |")
    lines += [
        "",
        "(100k: ROME's default sample; 44M: MEMIT's GPT-J statistics per layer. The all-reduce is "
        "milliseconds against minutes of work, so the projected scaling is linear until a rank has "
        "fewer tokens than one batch. On one H200 a whole gpt2-facts forward runs at 2.7M tokens/s "
        "(RESULTS_gpu.md), over 1000× this CPU rank, so there the all-reduce (NCCL, not measured here) "
        "weighs more and the linear range is shorter.)",
    ]
    cpu = platform.processor() or platform.machine()
    env = f"torch {torch.__version__}, {os.cpu_count()} CPUs ({cpu}), shared machine"
    text = "\n".join(lines) + f"\n\n({env}; `python benchmarks/bench_distributed.py --tokens {a.tokens}`)\n"
    print(text)
    if a.out:
        a.out.write_text("# Distributed key statistics\n\n" + text)
        write_beside(a.out, standalone(sys.argv))  # provenance.json beside the results
    return {"speedup": speedup, "efficiency": speedup / 2, "t1": t1, "t2": t2, "allreduce_s": ar, "rel_diff": diff}


def _dur(s: float) -> str:
    return f"{s:.2f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


if __name__ == "__main__":
    main()
