"""Forward-pass benchmarks, as ratios measured in one run on the same weights.

    python benchmarks/bench_forward.py [--repeats 10] [--out benchmarks/RESULTS_forward.md]

1. forward (no hooks) vs transformers' GPT2LMHeadModel, batch 8 × 64 — goal ≤ 1.05×
2. run_with_cache (every hook name) vs plain forward — goal ≤ 1.5×
3. greedy generation of 100 tokens with vs without the KV cache — goal ≥ 5× faster
Random full-size gpt2 weights (built offline); fp32; timings are medians, interleaved.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

import gpt2_interp as gi
from gpt2_interp.experiments.provenance import standalone, write_beside


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved(fns: dict, repeats: int) -> dict[str, float]:
    """Median time of each function, alternating them so drift affects all alike."""
    for f in fns.values():
        f()
    times = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--gen-tokens", type=int, default=100)
    ap.add_argument("--out", type=Path, default=None, help="write a markdown table here")
    a = ap.parse_args(argv)
    import transformers

    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    ours = gi.from_transformers(hf).eval()
    tokens = torch.randint(0, 50257, (8, 64), generator=torch.Generator().manual_seed(0))
    rows = []
    with torch.inference_mode():
        t = interleaved({"ours": lambda: ours(tokens), "hf": lambda: hf(tokens).logits}, a.repeats)
        rows.append(
            (
                "forward 8×64, ours ÷ transformers",
                t["ours"] / t["hf"],
                "≤ 1.05",
                f"ours {t['ours'] * 1e3:.0f} ms, transformers {t['hf'] * 1e3:.0f} ms",
            )
        )
        t = interleaved({"cache": lambda: ours.run_with_cache(tokens), "plain": lambda: ours(tokens)}, a.repeats)
        rows.append(
            (
                "run_with_cache (all 208 names) ÷ forward",
                t["cache"] / t["plain"],
                "≤ 1.5",
                f"cache {t['cache'] * 1e3:.0f} ms, plain {t['plain'] * 1e3:.0f} ms",
            )
        )
        prompt = tokens[:1, :16]
        n = a.gen_tokens
        kw = dict(max_new_tokens=n, stop_at_eos=False, do_sample=False)
        slow = median_time(lambda: ours.generate(prompt, use_kv_cache=False, **kw), max(1, a.repeats // 5))
        fast = median_time(lambda: ours.generate(prompt, use_kv_cache=True, **kw), max(1, a.repeats // 5))
        rows.append(
            (
                f"greedy {n} tokens: no cache ÷ KV cache",
                slow / fast,
                "≥ 5",
                f"KV cache {fast:.2f} s, no cache {slow:.2f} s",
            )
        )
    env = f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}"
    lines = ["| measurement | ratio | goal | times |", "|---|---|---|---|"]
    lines += [f"| {name} | {r:.2f}× | {goal} | {detail} |" for name, r, goal, detail in rows]
    text = "\n".join(lines) + f"\n\n({env}; random gpt2 weights, fp32, median of {a.repeats})\n"
    print(text)
    if a.out:
        a.out.write_text("# Forward benchmarks\n\n`python benchmarks/bench_forward.py`\n\n" + text)
        write_beside(a.out, standalone(sys.argv))  # provenance.json beside the results
    return {name: r for name, r, _, _ in rows}


if __name__ == "__main__":
    main()
