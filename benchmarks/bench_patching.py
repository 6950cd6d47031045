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
   The floor without prefix reuse (192 full forwards + the 2 unpatched ones) is shown too.
3. Causal trace (hidden states, every token × layer, 10 noise samples) vs the one-forward-per-cell
   loop of ROME (written below: noise hook + restore hook, full forward) — goal ≥ 10×. The loop
   is timed on a spread of cells and scaled to all cells (each cell is one identical-cost forward);
   its scores are checked against ours on those cells.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

import gpt2_interp as gi
from gpt2_interp.analysis.patching import logit_diff, patch
from gpt2_interp.analysis.tokens import subject_span
from gpt2_interp.analysis.tracing import causal_trace, noise_std

CLEAN = "When Mary and John went to the store, John gave a cold drink to"  # 15 tokens + BOS
CORRUPT = "When Mary and John went to the store, Mary gave a cold drink to"
TRACE_PROMPT, TRACE_SUBJECT = "The Eiffel Tower is located in the heart of the French city of", "Eiffel Tower"  # 15 + BOS


def timed(fn, repeats: int = 1) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def matmul_gflops(rows: int, d: int, d_mlp: int, repeats: int = 10) -> float:
    """Measured fp32 GEMM throughput of ``[rows, d] @ [d, d_mlp]`` (GFLOP/s)."""
    a, b = torch.randn(rows, d), torch.randn(d, d_mlp)
    a @ b
    t, _ = timed(lambda: a @ b, repeats)
    return 2 * rows * d * d_mlp / t / 1e9


def sweep_flops(cfg, P: int, prefix_reuse: bool) -> float:
    """Matmul FLOPs of a resid_pre sweep over every (layer, position) with last-position metrics."""
    d, n = cfg.d_model, cfg.n_layer
    per_layer = 2 * P * (4 * d * d + 2 * d * cfg.d_mlp) + 2 * P * P * d  # weights + causal attention
    unembed = 2 * d * cfg.d_vocab
    layer_runs = 2 * n + P * (sum(n - L for L in range(n)) if prefix_reuse else n * n)
    return layer_runs * per_layer + (2 + n * P) * unembed


def naive_trace_cell(model, tokens, span, std_noise, target, t, layer, clean_cache, seed=0):
    """ROME's loop body: one forward of the noised samples with one clean hidden state restored."""
    s, e = span
    samples = tokens.shape[0]
    noise = std_noise * torch.randn(samples, e - s, model.cfg.d_model, generator=torch.Generator().manual_seed(seed))
    name = f"blocks.{layer}.hook_resid_post"

    def add_noise(act, hook):
        act = act.clone()
        act[:, s:e] += noise
        return act

    def restore(act, hook):
        act = act.clone()
        act[:, t] = clean_cache[name][0, t]
        return act

    logits = model.run_with_hooks(tokens, fwd_hooks=[("hook_embed", add_noise), (name, restore)])
    return torch.softmax(logits[:, -1], -1)[:, target].mean().item()


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
    import transformer_lens as tl
    import transformer_lens.patching as tlp
    import transformers
    from transformer_lens.loading_from_pretrained import convert_gpt2_weights

    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    ours = gi.from_transformers(hf).eval().requires_grad_(False)
    cfg = tl.HookedTransformerConfig(
        n_layers=12, d_model=768, n_heads=12, d_head=64, d_mlp=3072, n_ctx=1024, d_vocab=50257,
        act_fn="gelu_new", normalization_type="LN", positional_embedding_type="standard",
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
    rows.append(("resid_pre sweep 12×16: TransformerLens ÷ ours", t_tl / t_ours, "≥ 10×",
                 f"ours {t_ours:.2f} s, TransformerLens {t_tl:.1f} s; max |difference| {err:.1e}"))

    gflops = matmul_gflops(P * P * c.n_layer // 2, c.d_model, c.d_mlp)
    floor = sweep_flops(c, P, prefix_reuse=True) / (gflops * 1e9)
    floor_full = sweep_flops(c, P, prefix_reuse=False) / (gflops * 1e9)
    rows.append(("resid_pre sweep: ours ÷ FLOP floor", t_ours / floor, "≤ 2×",
                 f"floor {floor:.2f} s ({sweep_flops(c, P, True) / 1e9:.0f} GFLOP at {gflops:.0f} GFLOP/s); "
                 f"without prefix reuse {floor_full:.2f} s ({sweep_flops(c, P, False) / 1e9:.0f} GFLOP)"))

    # causal trace: hidden, all cells, 10 samples
    samples = 10
    with torch.inference_mode():
        causal_trace(ours, TRACE_PROMPT, TRACE_SUBJECT, samples=2, progress=False)  # warm-up
        t_trace, tr = timed(lambda: causal_trace(ours, TRACE_PROMPT, TRACE_SUBJECT, samples=samples, progress=False), a.repeats)
        tokens = ours.to_tokens(TRACE_PROMPT).repeat(samples, 1)
        span = subject_span(ours, TRACE_PROMPT, TRACE_SUBJECT)
        _, cache = ours.run_with_cache(TRACE_PROMPT, names_filter=lambda nm: nm.endswith("hook_resid_post"))
        std = noise_std(ours, 3.0)
        n_tok = len(tr.tokens)
        all_cells = [(t, l) for t in range(n_tok) for l in range(c.n_layer)]
        step = max(1, len(all_cells) // a.naive_cells)
        cells = all_cells[::step][: a.naive_cells]
        t0 = time.perf_counter()
        naive = [naive_trace_cell(ours, tokens, span, std, tr.target_id, t + 1, l, cache) for t, l in cells]
        t_cell = (time.perf_counter() - t0) / len(cells)
    t_naive = t_cell * len(all_cells)
    trace_err = max(abs(v - tr.scores[t, l].item()) / max(v, 1e-12) for v, (t, l) in zip(naive, cells))
    rows.append((f"causal trace {n_tok}×{c.n_layer}×{samples} samples: per-cell loop ÷ ours", t_naive / t_trace, "≥ 10×",
                 f"ours {t_trace:.2f} s, loop {t_naive:.1f} s ({len(all_cells)} cells × {t_cell:.3f} s, timed on "
                 f"{len(cells)}); max relative difference {trace_err:.1e}"))
    notes.append(f"trace prompt {TRACE_PROMPT!r} ({n_tok} tokens + BOS), subject {TRACE_SUBJECT!r} at tokens "
                 f"{tr.subject_range[0]}–{tr.subject_range[1] - 1}; the {tr.subject_range[0]} cells per layer before the "
                 "subject are not run (their score is the corrupted score exactly)")

    env = (f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}, "
           f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    lines = ["| measurement | ratio | goal | details |", "|---|---|---|---|"]
    lines += [f"| {name} | {v:.2f}× | {goal} | {detail} |" for name, v, goal, detail in rows]
    text = "\n".join(lines) + "\n\n" + "\n".join(f"- {x}" for x in notes + ([a.note] if a.note else [])) + f"\n\n({env}; random gpt2 weights, fp32; ours: median of {a.repeats})\n"
    print(text)
    if a.out:
        a.out.write_text("# Causal-experiment benchmarks\n\n`python benchmarks/bench_patching.py`\n\n"
                         + (__doc__.split("\n\n", 2)[2].strip() + "\n\n") + text)
    return {name: v for name, v, _, _ in rows}


if __name__ == "__main__":
    main()
