"""Llama-family forward benchmarks, as ratios measured in one run on the same weights.

    python benchmarks/bench_llama.py [--repeats 10] [--out benchmarks/RESULTS_llama.md]

1. forward (no hooks) vs transformers' LlamaForCausalLM (sdpa), batch 8 × 64 by default — goal ≤ 1.1×
2. run_with_cache (every hook name) vs plain forward — goal ≤ 1.5×
3. resid_pre patching sweep (every layer × position of one prompt pair) vs TransformerLens 3.9's
   ``get_act_patch_resid_pre`` on the same weights — goal ≥ 10× faster. TransformerLens gets a
   Llama config it can build (RMSNorm, rotary half-split, SwiGLU, GQA) and the weights through its own
   ``convert_llama_weights``; the two sweeps' values are compared.
1–2 use SmolLM2-135M's shape (30 layers, d_model 576, 9 heads / 3 KV heads, d_mlp 1536, vocab 49,152, tied)
with random weights built offline, so it runs without the GGUF; 3 uses the same shape by default
(``--sweep-layers``/``--sweep-pos`` shrink it for a smoke test); fp32; medians of interleaved timings.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from harness import interleaved

import gpt2_interp as gi
from gpt2_interp.experiments.provenance import standalone, write_beside

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.families_cases import tl_llama as transformer_lens_twin  # noqa: E402 (the Llama tests' own twin)


def llama_config(
    layers: int, d_model: int = 576, heads: int = 9, kv_heads: int = 3, d_mlp: int = 1536, vocab: int = 49152
):
    """A transformers LlamaConfig (SmolLM2-135M's shape by default)."""
    import transformers

    return transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=d_model,
        intermediate_size=d_mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=8192,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )


def sweep_benchmark(layers: int, pos: int, repeats: int, **shape) -> tuple[str, float, str, str]:
    """Our resid_pre patching sweep vs TransformerLens's on the same random Llama weights."""
    import transformer_lens.patching as tlp

    from gpt2_interp.analysis.patching import logit_diff, patch

    torch.manual_seed(1)
    import transformers

    hf = transformers.LlamaForCausalLM(llama_config(layers, **shape)).eval()
    ours = gi.from_transformers(hf).eval()
    ref = transformer_lens_twin(hf)
    del hf
    vocab = ours.cfg.d_vocab
    g = torch.Generator().manual_seed(2)
    clean = torch.randint(0, vocab, (1, pos), generator=g)
    corrupt = clean.clone()
    corrupt[0, pos // 3] = (clean[0, pos // 3] + 1) % vocab  # one token differs
    answer, wrong = 11, 12
    metric = logit_diff(answer, wrong)

    def tl_metric(logits):
        return (logits[:, -1, answer] - logits[:, -1, wrong]).mean()

    with torch.inference_mode():
        patch(ours, clean, corrupt, metric, progress=False)  # warm-up
        t = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            r = patch(ours, clean, corrupt, metric, hook="resid_pre", progress=False)
            t.append(time.perf_counter() - t0)
        t_ours = statistics.median(t)
        _, clean_cache = ref.run_with_cache(clean)
        t0 = time.perf_counter()
        expected = tlp.get_act_patch_resid_pre(ref, corrupt, clean_cache, tl_metric)
        t_tl = time.perf_counter() - t0
    err = (r.values - expected).abs().max().item()
    return (
        f"resid_pre sweep {layers}×{pos}: TransformerLens ÷ ours",
        t_tl / t_ours,
        "≥ 10",
        f"ours {t_ours:.2f} s, TransformerLens {t_tl:.1f} s; max |difference| {err:.1e}",
    )


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--pos", type=int, default=64)
    ap.add_argument("--sweep-layers", type=int, default=30, help="layers of the patching-sweep model (0: skip)")
    ap.add_argument("--sweep-pos", type=int, default=16, help="prompt length of the patching sweep")
    ap.add_argument("--layers", type=int, default=30, help="layers of the forward-benchmark model")
    ap.add_argument("--small", action="store_true", help="a tiny shape (d_model 64, vocab 512) for a smoke test")
    ap.add_argument("--out", type=Path, default=None, help="write a markdown table here")
    a = ap.parse_args(argv)
    import transformers

    dims = dict(d_model=64, heads=4, kv_heads=2, d_mlp=160, vocab=512) if a.small else {}
    torch.manual_seed(0)
    cfg = llama_config(a.layers, **dims)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    ours = gi.from_transformers(hf).eval()
    tokens = torch.randint(0, cfg.vocab_size, (a.batch, a.pos), generator=torch.Generator().manual_seed(0))
    shape = f"{a.batch}×{a.pos}"
    n_hooks = len(ours.hook_names())
    rows = []
    with torch.inference_mode():
        # the models are bound as default arguments: `del hf, ours` below then frees them
        t = interleaved(
            {"ours": lambda m=ours: m(tokens), "hf": lambda m=hf: m(tokens, use_cache=False).logits}, a.repeats
        )
        rows.append(
            (
                f"forward {shape}, ours ÷ transformers",
                t["ours"] / t["hf"],
                "≤ 1.1",
                f"ours {t['ours'] * 1e3:.0f} ms, transformers {t['hf'] * 1e3:.0f} ms",
            )
        )
        t = interleaved(
            {"cache": lambda m=ours: m.run_with_cache(tokens), "plain": lambda m=ours: m(tokens)}, a.repeats
        )
        rows.append(
            (
                f"run_with_cache (all {n_hooks} names) ÷ forward",
                t["cache"] / t["plain"],
                "≤ 1.5",
                f"cache {t['cache'] * 1e3:.0f} ms, plain {t['plain'] * 1e3:.0f} ms",
            )
        )
    del hf, ours
    if a.sweep_layers:
        rows.append(sweep_benchmark(a.sweep_layers, a.sweep_pos, max(1, a.repeats // 3), **dims))
    env = f"torch {torch.__version__}, {torch.get_num_threads()} threads, {platform.processor() or platform.machine()}"
    lines = ["| measurement | ratio | goal | times |", "|---|---|---|---|"]
    lines += [f"| {name} | {r:.2f}× | {goal} | {detail} |" for name, r, goal, detail in rows]
    what = "tiny Llama shape (--small)" if a.small else "SmolLM2-135M shape"
    text = (
        "\n".join(lines)
        + f"\n\n({env}; {what}, random weights, fp32, median of {a.repeats}; TransformerLens's sweep runs once)\n"
    )
    print(text)
    if a.out:
        cmd = (
            f"python benchmarks/bench_llama.py --batch {a.batch} --pos {a.pos} --repeats {a.repeats} --layers "
            f"{a.layers} "
            f"--sweep-layers {a.sweep_layers} --sweep-pos {a.sweep_pos}{' --small' * a.small} --out {a.out}"
        )
        a.out.write_text(f"# Llama-family benchmarks\n\n`{cmd}`\n\n" + text)
        write_beside(a.out, standalone(sys.argv))  # provenance.json beside the results
    return {name: r for name, r, _, _ in rows}


if __name__ == "__main__":
    main()
