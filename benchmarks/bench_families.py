"""Forward time of each model family against transformers, as ratios measured in one run on the same weights.

    python benchmarks/bench_families.py [--layers 2] [--shape 4x64] [--repeats 5] [--out benchmarks/RESULTS_families.md]

Each family's real shape (``KNOWN_CONFIGS``: widths, heads, vocabulary, its norms, rotary and attention options)
with its layers cut to ``--layers`` so that it fits this machine; random weights built by gpt2-interp and handed to
transformers with ``to_transformers()``, so both run the same weights; fp32, no hooks, transformers' default
attention (sdpa); medians of interleaved timings (``harness.interleaved``). The logits are compared as well.
Goal: ours ÷ transformers ≤ 1.05 on each family.
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
from pathlib import Path

import torch
from harness import interleaved

from gpt2_interp.experiments.provenance import standalone, write_beside
from gpt2_interp.model import KNOWN_CONFIGS, HookedGPT2

FAMILIES = [
    "llama-3.2-1b",
    "qwen2.5-0.5b",
    "qwen3-0.6b",
    "mistral-7b",
    "phi-3-mini",
    "olmo-2-1b",
    "pythia-410m",
    "gpt-j-6b",
    "gemma-2-2b",
    "gemma-3-1b",
]


def measure(name: str, layers: int, batch: int, positions: int, repeats: int) -> dict:
    """Ours and transformers' median forward seconds on ``name``'s shape with ``layers`` layers, and the largest
    logit difference."""
    cfg = dataclasses.replace(KNOWN_CONFIGS[name], n_layer=layers)
    ours = HookedGPT2(cfg, seed=0).eval()
    hf = ours.to_transformers().eval()
    tokens = torch.randint(0, cfg.d_vocab, (batch, positions), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        diff = float((ours(tokens) - hf(tokens).logits).abs().max())
        t = interleaved({"ours": lambda: ours(tokens), "hf": lambda: hf(tokens).logits}, repeats)
    return {"name": name, "ours": t["ours"], "hf": t["hf"], "ratio": t["ours"] / t["hf"], "max_diff": diff}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2, help="layers kept of each real shape")
    ap.add_argument("--shape", default="4x64", help="batch × positions")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated KNOWN_CONFIGS names")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None, help="write a markdown table here (and its provenance beside)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    batch, positions = (int(x) for x in a.shape.split("x"))
    rows = []
    for name in a.families.split(","):
        r = measure(name, a.layers, batch, positions, a.repeats)
        rows.append(r)
        print(
            f"{name:14s} ours {r['ours'] * 1e3:8.1f} ms  transformers {r['hf'] * 1e3:8.1f} ms  "
            f"ratio {r['ratio']:.3f}  max |Δlogit| {r['max_diff']:.1e}",
            flush=True,
        )
    if a.out:
        head = "| family | ours (ms) | transformers (ms) | ours ÷ transformers | max \\|Δlogit\\| |\n"
        head += "|---|---|---|---|---|\n"
        body = "".join(
            f"| {r['name']} | {r['ours'] * 1e3:.1f} | {r['hf'] * 1e3:.1f} | {r['ratio']:.3f} | {r['max_diff']:.1e} |\n"
            for r in rows
        )
        met = sum(r["ratio"] <= 1.05 for r in rows)
        command = " ".join(["python benchmarks/bench_families.py", *(sys.argv[1:] if argv is None else argv)])
        a.out.write_text(
            f"# Forward time by family\n\n`{command}` on {platform.processor() or platform.machine()}, "
            f"{torch.get_num_threads()} threads: each real shape cut to "
            f"{a.layers} layers, batch {batch} × {positions}, fp32, medians of {a.repeats} interleaved runs.\n\n"
            f"{head}{body}\n{met} of {len(rows)} families at ≤ 1.05×.\n"
        )
        write_beside(a.out, standalone(sys.argv))
    return rows


if __name__ == "__main__":
    main()
