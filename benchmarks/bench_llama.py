"""Llama-family forward benchmarks, as ratios measured in one run on the same weights.

    python benchmarks/bench_llama.py [--repeats 10] [--out benchmarks/RESULTS_llama.md]

1. forward (no hooks) vs transformers' LlamaForCausalLM (sdpa), batch 8 × 64 by default — goal ≤ 1.1×
2. run_with_cache (every hook name) vs plain forward — goal ≤ 1.5×
SmolLM2-135M's shape (30 layers, d_model 576, 9 heads / 3 KV heads, d_mlp 1536, vocab 49,152, tied) with
random weights built offline, so it runs without the GGUF; fp32; medians of interleaved timings.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from pathlib import Path

import torch

import gpt2_interp as gi


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
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--pos", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None, help="write a markdown table here")
    a = ap.parse_args(argv)
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, attn_implementation="sdpa",
    )
    hf = transformers.LlamaForCausalLM(cfg).eval()
    ours = gi.from_transformers(hf).eval()
    tokens = torch.randint(0, cfg.vocab_size, (a.batch, a.pos), generator=torch.Generator().manual_seed(0))
    shape = f"{a.batch}×{a.pos}"
    n_hooks = len(ours.hook_names())
    rows = []
    with torch.inference_mode():
        t = interleaved({"ours": lambda: ours(tokens), "hf": lambda: hf(tokens, use_cache=False).logits}, a.repeats)
        rows.append((f"forward {shape}, ours ÷ transformers", t["ours"] / t["hf"], "≤ 1.1", f"ours {t['ours']*1e3:.0f} ms, transformers {t['hf']*1e3:.0f} ms"))
        t = interleaved({"cache": lambda: ours.run_with_cache(tokens), "plain": lambda: ours(tokens)}, a.repeats)
        rows.append((f"run_with_cache (all {n_hooks} names) ÷ forward", t["cache"] / t["plain"], "≤ 1.5", f"cache {t['cache']*1e3:.0f} ms, plain {t['plain']*1e3:.0f} ms"))
    env = f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}"
    lines = ["| measurement | ratio | goal | times |", "|---|---|---|---|"]
    lines += [f"| {name} | {r:.2f}× | {goal} | {detail} |" for name, r, goal, detail in rows]
    text = "\n".join(lines) + f"\n\n({env}; SmolLM2-135M shape, random weights, fp32, median of {a.repeats})\n"
    print(text)
    if a.out:
        cmd = f"python benchmarks/bench_llama.py --batch {a.batch} --pos {a.pos} --repeats {a.repeats} --out {a.out}"
        a.out.write_text(f"# Llama-family benchmarks\n\n`{cmd}`\n\n" + text)
    return {name: r for name, r, _, _ in rows}


if __name__ == "__main__":
    main()
