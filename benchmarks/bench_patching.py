"""Causal-experiment benchmarks, as ratios measured in one run on the same weights.

    python benchmarks/bench_patching.py [--out benchmarks/RESULTS_patching.md]

Random full-size gpt2 weights (transformers ``GPT2Config()`` init), fp32, one 16-token prompt pair.

1. resid_pre patching sweep, 12 layers × 16 positions: ``gpt2_interp.analysis.patching.patch`` vs
   TransformerLens ``get_act_patch_resid_pre`` (one full forward per patch) — goal ≥ 10× faster.
2. The same sweep vs its FLOP floor — goal ≤ 2×. The floor counts the matmul FLOPs of the minimal
   set of forward passes: the clean and corrupted runs (16 tokens through 12 layers each) plus,
   per patch (L, p), layers L…11 over the 16 tokens (the unpatched prefix is reused), with
   2·(non-embedding params per layer) FLOPs per token-layer, 2·pos²·d_model per layer-sequence
   for causal attention scores and mixing (half of QKᵀ and AV), and 2·d_model·d_vocab for the
   unembedding of each run's last position. It is divided by this machine's measured fp32 matmul
   throughput on the sweep's biggest GEMM shape (``[rows·16, 768] @ [768, 3072]``). Elementwise work
   (LayerNorm, GELU, softmax, residual adds) is not counted, so the floor is optimistic.
   Also shown: the floor without prefix reuse (192 full forwards + the 2 unpatched ones), and a
   strict floor that also counts only the positions a patch can change (p…15 for a patch at p) —
   which ``patch`` exploits too, so it can beat the prefix-reuse floor.
3. Causal trace (hidden states, every token × layer, 10 noise samples) vs ROME's
   one-forward-per-cell loop (written below as ROME's ``trace_with_patch`` does it: a batch of the
   clean prompt + 10 noised copies, the clean state copied into the noised rows by a hook, full
   logits) — goal ≥ 10×. The loop is timed on a spread of cells and scaled to all cells (every
   cell is one forward of identical cost); its scores are checked against ours on those cells.
   Two prompts: the subject right at the start (nearly every cell must run: the hard case) and
   the subject late (cells before it cost nothing). The notes give each method's matmul FLOPs:
   the ratio is the speed-up exact computation can reach on a CPU, where a big batch is not
   much faster per FLOP than the loop's 11-row batches.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from harness import timed

import gpt2_interp as gi
from gpt2_interp.analysis.patching import logit_diff, patch
from gpt2_interp.analysis.tokens import subject_span
from gpt2_interp.analysis.tracing import causal_trace
from gpt2_interp.experiments.provenance import standalone, write_beside

CLEAN = "When Mary and John went to the store, John gave a cold drink to"  # 15 tokens + BOS
CORRUPT = "When Mary and John went to the store, Mary gave a cold drink to"
TRACES = [  # (label, prompt, subject), 15 tokens + BOS each
    ("subject first", "The Eiffel Tower is located in the heart of the French city of", "Eiffel Tower"),
    ("subject late", "After a long walk along the river we saw the Eiffel Tower in", "Eiffel Tower"),
]


def matmul_gflops(rows: int, d: int, d_mlp: int, repeats: int = 10) -> float:
    """Measured fp32 GEMM throughput of ``[rows, d] @ [d, d_mlp]`` (GFLOP/s)."""
    a, b = torch.randn(rows, d), torch.randn(d, d_mlp)
    a @ b
    t, _ = timed(lambda: a @ b, repeats)
    return 2 * rows * d * d_mlp / t / 1e9


def sweep_flops(cfg, P: int, reuse: str) -> float:
    """Matmul FLOPs of a resid_pre sweep over every (layer, position), last-position metrics.

    ``reuse``: ``"none"`` — every patch is a full forward; ``"prefix"`` — patch (L, p) runs layers
    L…n−1 over all P tokens; ``"prefix+suffix"`` — and only tokens p…P−1 (earlier ones are unchanged
    under causal attention)."""
    d, n = cfg.d_model, cfg.n_layer
    dense = 2 * (4 * d * d + 2 * d * cfg.d_mlp)  # per token per layer
    total = 2 * n * (P * dense + 2 * P * P * d)  # the clean and corrupted runs
    for L in range(n):
        for p in range(P):
            layers = n if reuse == "none" else n - L
            tokens = P - p if reuse == "prefix+suffix" else P
            total += layers * (tokens * dense + 2 * tokens * P * d)
    return total + (2 + n * P) * 2 * d * cfg.d_vocab


def naive_trace_cell(model, tokens, span, std_noise, target, t, layer, seed=0):
    """ROME's ``trace_with_patch`` for one cell: one forward of [clean, noised × samples] (full logits),
    the noised rows' hidden state after ``layer`` at token ``t`` set to the clean row's."""
    s, e = span
    samples = tokens.shape[0] - 1
    noise = std_noise * torch.randn(samples, e - s, model.cfg.d_model, generator=torch.Generator().manual_seed(seed))
    name = f"blocks.{layer}.hook_resid_post"

    def add_noise(act, hook):
        act = act.clone()
        act[1:, s:e] += noise
        return act

    def restore(act, hook):
        act = act.clone()
        act[1:, t] = act[0, t]
        return act

    logits = model.run_with_hooks(tokens, fwd_hooks=[("hook_embed", add_noise), (name, restore)])
    return torch.softmax(logits[1:, -1], -1)[:, target].mean().item()


def trace_flops(cfg, P: int, first: int, samples: int) -> tuple[float, float]:
    """Matmul FLOPs of (ROME's loop, ours) for a hidden-state trace of a ``P``-token input (BOS included)
    whose subject starts at input position ``first``. The loop: one forward of ``samples + 1`` rows
    per cell, full logits. Ours: the clean and corrupted runs, then per cell (t ≥ first, L) and
    sample, layers L+1… over positions t…P−1, the last block's queries/W_O/MLP at the last position
    only (keys and values elsewhere), and last-position logits."""
    d, n = cfg.d_model, cfg.n_layer
    dense, kv, unembed = 2 * (4 * d * d + 2 * d * cfg.d_mlp), 2 * 2 * d * d, 2 * d * cfg.d_vocab
    cells = (P - 1) * n
    loop = cells * (samples + 1) * P * (n * dense + unembed)
    ours = (samples + 1) * P * n * dense + (samples + 1) * unembed
    for t in range(first, P):
        for L in range(n):
            layers = range(L + 1, n)
            full = sum(P - t for l in layers if l < n - 1)
            last = ((P - t - 1) * kv + dense) if n - 1 in layers else 0
            ours += samples * (full * dense + last + unembed)
    return loop, ours


def trace_benchmark(model, label: str, prompt: str, subject: str, naive_cells: int, samples: int = 10):
    """Our batched hidden-state trace vs ROME's per-cell loop (timed on ``naive_cells`` cells, scaled)."""
    c = model.cfg
    with torch.inference_mode():
        causal_trace(model, prompt, subject, samples=2, progress=False)  # warm-up
        t_ours, tr = timed(lambda: causal_trace(model, prompt, subject, samples=samples, progress=False))
        tokens = model.to_tokens(prompt).repeat(samples + 1, 1)
        span = subject_span(model, prompt, subject)
        std = tr.noise_std  # the trace's own noise (ROME's rule by default)
        n_tok = len(tr.tokens)
        all_cells = [(t, l) for t in range(n_tok) for l in range(c.n_layer)]
        step = max(1, len(all_cells) // naive_cells)
        cells = all_cells[::step][:naive_cells]
        t0 = time.perf_counter()
        naive = [naive_trace_cell(model, tokens, span, std, tr.target_id, t + 1, l) for t, l in cells]
        t_cell = (time.perf_counter() - t0) / len(cells)
    t_naive = t_cell * len(all_cells)
    err = max(abs(v - tr.scores[t, l].item()) / max(v, 1e-12) for v, (t, l) in zip(naive, cells))
    row = (
        f"causal trace, {label}, {n_tok}×{c.n_layer}×{samples} samples: per-cell loop ÷ ours",
        t_naive / t_ours,
        "≥ 10×",
        f"ours {t_ours:.2f} s, loop {t_naive:.1f} s ({len(all_cells)} cells × {t_cell:.3f} s, timed on {len(cells)}); "
        f"max relative difference {err:.1e}",
    )
    b, e = tr.subject_range
    loop_flops, our_flops = trace_flops(c, n_tok + 1, b + 1, samples)
    note = (
        f"{label}: {prompt!r} ({n_tok} tokens + BOS), subject {subject!r} = tokens {b}–{e - 1}; the {b} tokens before "
        f"the subject ({b * c.n_layer} cells) are not run: their score is the corrupted score exactly. Matmul work: "
        f"loop {loop_flops / 1e12:.2f} TFLOP, ours {our_flops / 1e12:.2f} TFLOP — a {loop_flops / our_flops:.1f}× ratio"
    )
    return row, note


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="repeats of our (fast) runs; TL runs once")
    ap.add_argument("--naive-cells", type=int, default=24, help="cells of the naive trace loop to time")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--note", default="", help="a line added to the results (e.g. machine load)")
    ap.add_argument("--out", type=Path, default=None, help="write a markdown report here")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    load0 = os.getloadavg()[0]
    import transformer_lens as tl
    import transformer_lens.patching as tlp
    import transformers
    from transformer_lens.loading_from_pretrained import convert_gpt2_weights

    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    ours = gi.from_transformers(hf).eval().requires_grad_(False)
    cfg = tl.HookedTransformerConfig(
        n_layers=12,
        d_model=768,
        n_heads=12,
        d_head=64,
        d_mlp=3072,
        n_ctx=1024,
        d_vocab=50257,
        act_fn="gelu_new",
        normalization_type="LN",
        positional_embedding_type="standard",
    )
    ref = tl.HookedTransformer(cfg)
    ref.load_state_dict(convert_gpt2_weights(hf, cfg), strict=False)
    ref.eval()
    del hf
    c = ours.cfg

    clean, corrupt = ours.to_tokens(CLEAN), ours.to_tokens(CORRUPT)
    P = clean.shape[1]
    assert P == 16 and (clean != corrupt).sum() == 1
    answer, wrong = ours.to_single_token(" Mary"), ours.to_single_token(" John")
    metric = logit_diff(answer, wrong)

    def tl_metric(logits):
        return (logits[:, -1, answer] - logits[:, -1, wrong]).mean()

    rows, notes = [], []
    with torch.inference_mode():
        patch(ours, clean, corrupt, metric, progress=False)  # warm-up
        t_ours, r = timed(lambda: patch(ours, clean, corrupt, metric, hook="resid_pre", progress=False), a.repeats)
        _, clean_cache = ref.run_with_cache(clean)
        t_tl, expected = timed(lambda: tlp.get_act_patch_resid_pre(ref, corrupt, clean_cache, tl_metric))
    err = (r.values - expected).abs().max().item()
    rows.append(
        (
            "resid_pre sweep 12×16: TransformerLens ÷ ours",
            t_tl / t_ours,
            "≥ 10×",
            f"ours {t_ours:.2f} s, TransformerLens {t_tl:.1f} s; max |difference| {err:.1e}",
        )
    )

    gflops = matmul_gflops(P * P * c.n_layer // 2, c.d_model, c.d_mlp)
    floors = {k: sweep_flops(c, P, k) for k in ("none", "prefix", "prefix+suffix")}
    sec = {k: v / (gflops * 1e9) for k, v in floors.items()}
    rows.append(
        (
            "resid_pre sweep: ours ÷ FLOP floor (prefix reuse)",
            t_ours / sec["prefix"],
            "≤ 2×",
            f"floor {sec['prefix']:.2f} s = {floors['prefix'] / 1e9:.0f} GFLOP at {gflops:.0f} GFLOP/s; without reuse "
            f"{sec['none']:.2f} s ({floors['none'] / 1e9:.0f} GFLOP)",
        )
    )
    rows.append(
        (
            "resid_pre sweep: ours ÷ strict FLOP floor (prefix + suffix reuse)",
            t_ours / sec["prefix+suffix"],
            "—",
            f"{sec['prefix+suffix']:.2f} s = {floors['prefix+suffix'] / 1e9:.0f} GFLOP",
        )
    )

    # causal trace: hidden, all cells, 10 samples; the subject early (the hard case) and late
    for label, prompt, subject in TRACES:
        row, note = trace_benchmark(ours, label, prompt, subject, a.naive_cells)
        rows.append(row)
        notes.append(note)

    env = (
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, load average {load0:.1f} "
        f"at the start, {os.getloadavg()[0]:.1f} at the end"
    )
    lines = ["| measurement | ratio | goal | details |", "|---|---|---|---|"]
    lines += [f"| {name} | {v:.2f}× | {goal} | {detail} |" for name, v, goal, detail in rows]
    text = (
        "\n".join(lines)
        + "\n\n"
        + "\n".join(f"- {x}" for x in notes + ([a.note] if a.note else []))
        + f"\n\n({env}; random gpt2 weights, fp32; patching: median of {a.repeats}, trace: one run)\n"
    )
    print(text)
    if a.out:
        a.out.write_text(
            "# Causal-experiment benchmarks\n\n`python benchmarks/bench_patching.py`\n\n"
            + (__doc__.split("\n\n", 2)[2].strip() + "\n\n")
            + text
        )
        write_beside(a.out, standalone(sys.argv))  # provenance.json beside the results
    return {name: v for name, v, _, _ in rows}


if __name__ == "__main__":
    main()
