"""Forward-pass benchmarks, as ratios measured in one run on the same weights.

    python benchmarks/bench_forward.py [--repeats 10] [--out benchmarks/RESULTS_forward.md]
    python benchmarks/bench_forward.py --size gpt2-xl --shape 1x64 --no-generate --out benchmarks/RESULTS_forward_xl.md

1. forward (no hooks) vs transformers' GPT2LMHeadModel, batch 8 × 64 — goal ≤ 1.05×
2. run_with_cache (every hook name) vs plain forward — goal ≤ 1.5×
3. run_with_cache of one hook family (``hook_resid_post`` of every block) vs plain forward — goal ≤ 1.1×
4. greedy generation of 100 tokens with vs without the KV cache — goal ≥ 5× faster
Random weights of the ``--size`` configuration (gpt2 by default; built offline); fp32; timings are
medians, interleaved.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from pathlib import Path

import torch
from harness import interleaved, timed

import gpt2_interp as gi
from gpt2_interp.experiments.provenance import standalone, write_beside

#: GPT-2 configurations (transformers' GPT2Config arguments) the benchmark can build with random weights
SIZES = {
    "gpt2": {},
    "gpt2-medium": dict(n_layer=24, n_embd=1024, n_head=16),
    "gpt2-large": dict(n_layer=36, n_embd=1280, n_head=20),
    "gpt2-xl": dict(n_layer=48, n_embd=1600, n_head=25),
}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--gen-tokens", type=int, default=100)
    ap.add_argument("--size", choices=sorted(SIZES), default="gpt2", help="GPT-2 configuration (random weights)")
    ap.add_argument("--shape", default="8x64", help="batch × positions, e.g. 1x64")
    ap.add_argument("--no-generate", action="store_true", help="skip the generation comparison")
    ap.add_argument("--out", type=Path, default=None, help="write a markdown table here")
    a = ap.parse_args(argv)
    import transformers

    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**SIZES[a.size])).eval()
    ours = gi.from_transformers(hf).eval()
    batch, n_pos = (int(x) for x in a.shape.split("x"))
    tokens = torch.randint(0, 50257, (batch, n_pos), generator=torch.Generator().manual_seed(0))
    rows = []
    with torch.inference_mode():
        t = interleaved({"ours": lambda: ours(tokens), "hf": lambda: hf(tokens).logits}, a.repeats)
        rows.append(
            (
                f"forward {batch}×{n_pos}, ours ÷ transformers",
                t["ours"] / t["hf"],
                "≤ 1.05",
                f"ours {t['ours'] * 1e3:.0f} ms, transformers {t['hf'] * 1e3:.0f} ms",
            )
        )
        t = interleaved({"cache": lambda: ours.run_with_cache(tokens), "plain": lambda: ours(tokens)}, a.repeats)
        rows.append(
            (
                f"run_with_cache (all {len(ours.hook_dict)} names) ÷ forward",
                t["cache"] / t["plain"],
                "≤ 1.5",
                f"cache {t['cache'] * 1e3:.0f} ms, plain {t['plain'] * 1e3:.0f} ms",
            )
        )
        resid = lambda: ours.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_resid_post"))  # noqa: E731
        t = interleaved({"cache": resid, "plain": lambda: ours(tokens)}, a.repeats)
        rows.append(
            (
                "run_with_cache (hook_resid_post of every block) ÷ forward",
                t["cache"] / t["plain"],
                "≤ 1.1",
                f"cache {t['cache'] * 1e3:.0f} ms, plain {t['plain'] * 1e3:.0f} ms",
            )
        )
    if a.no_generate:
        return _report(a, rows)
    with torch.inference_mode():
        prompt = tokens[:1, :16]
        n = a.gen_tokens
        kw = dict(max_new_tokens=n, stop_at_eos=False, do_sample=False)
        slow = timed(lambda: ours.generate(prompt, use_kv_cache=False, **kw), max(1, a.repeats // 5), warmup=True)[0]
        fast = timed(lambda: ours.generate(prompt, use_kv_cache=True, **kw), max(1, a.repeats // 5), warmup=True)[0]
        rows.append(
            (
                f"greedy {n} tokens: no cache ÷ KV cache",
                slow / fast,
                "≥ 5",
                f"KV cache {fast:.2f} s, no cache {slow:.2f} s",
            )
        )
    return _report(a, rows)


def _report(a: argparse.Namespace, rows: list[tuple[str, float, str, str]]) -> dict:
    env = f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}"
    lines = ["| measurement | ratio | goal | times |", "|---|---|---|---|"]
    lines += [f"| {name} | {r:.2f}× | {goal} | {detail} |" for name, r, goal, detail in rows]
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    text = (
        "\n".join(lines)
        + f"\n\n({env}; random {a.size} weights, fp32, median of {a.repeats}; load average at the end {load})\n"
    )
    print(text)
    if a.out:
        cmd = " ".join(["python", "benchmarks/bench_forward.py", *sys.argv[1:]])
        a.out.write_text(f"# Forward benchmarks ({a.size})\n\n`{cmd}`\n\n" + text)
        write_beside(a.out, standalone(sys.argv))  # provenance.json beside the results
    return {name: r for name, r, _, _ in rows}


if __name__ == "__main__":
    main()
