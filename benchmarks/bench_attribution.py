"""Attribution-patching cost, as ratios measured in one run on the same weights.

    python benchmarks/bench_attribution.py [--pairs 50] [--deep-pairs 100] [--out benchmarks/RESULTS_attribution.md]

1. Cost of the estimate against one forward pass of the pair batch, on gpt2-facts over ``--pairs``
   prompt pairs from the fact base (``facts.pairs.subject_swaps``): the denominator is one forward of
   the corrupted prompts (``--pairs`` rows, last-position logits over the whole vocabulary, no
   autograd). Goals: AtP (hook ``z``: a source pass, a base pass with autograd, one backward pass
   for the activations' gradients only; the logit-difference metric reads just its tokens' columns
   of the unembedding) ≤ 3.5×; IG with 5 steps ≤ 12×.
   AtP* on ``k`` (QK fix, GradDrop: one backward per layer) is shown too.
2. A full head × position map (hook ``z``, every layer, position and head) of a deep random model
   (30 layers, d_model 576, 9 heads, d_mlp 1536: SmolLM2-135M's depth and width in GPT-2 form) over
   ``--deep-pairs`` pairs of 16-token prompts (random tokens, 3 positions differ): AtP's time vs
   exact batched patching (``patching.patch``). Exact patching is timed on ``--exact-pairs`` pairs
   and scaled linearly to all pairs (its rows are independent: cost ∝ pairs); the estimate is
   compared with exact patching on those pairs (Spearman ρ over the cells).

Each ratio is a ratio of medians measured in the same run, interleaved.
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
from harness import interleaved

import gpt2_interp as gi
from gpt2_interp.analysis.attribution import agreement, attribute
from gpt2_interp.analysis.metrics import logit_diff
from gpt2_interp.analysis.patching import pair_tokens, patch
from gpt2_interp.experiments.provenance import standalone, write_beside
from gpt2_interp.facts.base import FactBase
from gpt2_interp.facts.pairs import subject_swaps
from gpt2_interp.model import GPT2Config, HookedGPT2


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--deep-pairs", type=int, default=100)
    ap.add_argument("--exact-pairs", type=int, default=4, help="pairs on which exact patching of the deep map is timed")
    ap.add_argument("--deep-layers", type=int, default=30)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--note", default="", help="a line added to the results (e.g. machine load)")
    ap.add_argument("--out", type=Path, default=None, help="write a markdown report here")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    load0 = os.getloadavg()[0]
    rows, notes = [], []

    # ---- 1. cost on gpt2-facts
    model = gi.load("gpt2-facts").eval()
    fp = subject_swaps(FactBase.load(), model.tokenizer, a.pairs)
    clean, corr, mask = pair_tokens(model, fp.clean, fp.corrupted)
    metric = logit_diff(fp.answers, fp.wrongs)

    def forward():
        with torch.inference_mode():
            model.last_logits(corr, attention_mask=mask)

    fns = {
        "forward": forward,
        "atp": lambda: attribute(model, fp.clean, fp.corrupted, metric, hook="z", method="atp"),
        "ig5": lambda: attribute(model, fp.clean, fp.corrupted, metric, hook="z", method="ig", ig_steps=5),
        "atp*": lambda: attribute(model, fp.clean, fp.corrupted, metric, hook="k", method="atp*"),
    }
    for fn in fns.values():  # warm-up
        fn()
    t = interleaved(fns, a.repeats, warmup=False)
    n, P = clean.shape
    rows.append(
        (
            f"AtP (z, all {model.cfg.n_layer}×{model.cfg.n_head} heads) ÷ one forward of the pair batch",
            t["atp"] / t["forward"],
            "≤ 3.5×",
            f"AtP {t['atp'] * 1e3:.0f} ms, forward {t['forward'] * 1e3:.0f} ms ({n} pairs × {P} tokens, gpt2-facts)",
        )
    )
    rows.append(
        (
            "IG, 5 steps (z) ÷ one forward of the pair batch",
            t["ig5"] / t["forward"],
            "≤ 12×",
            f"IG {t['ig5'] * 1e3:.0f} ms",
        )
    )
    rows.append(
        (
            f"AtP* (k: QK fix + GradDrop, {model.cfg.n_layer} extra backward passes) ÷ one forward",
            t["atp*"] / t["forward"],
            "—",
            f"AtP* {t['atp*'] * 1e3:.0f} ms",
        )
    )

    # ---- 2. a deep model's full head × position map
    cfg = GPT2Config(n_layer=a.deep_layers, d_model=576, n_head=9, d_mlp=1536, n_ctx=64, name="deep")
    deep = HookedGPT2(cfg, seed=0).eval()
    g = torch.Generator().manual_seed(0)
    dclean = torch.randint(0, 50000, (a.deep_pairs, 16), generator=g)
    dcorr = dclean.clone()
    dcorr[:, [3, 4, 9]] = torch.randint(0, 50000, (a.deep_pairs, 3), generator=g)
    dmetric = logit_diff(
        torch.randint(0, 50000, (a.deep_pairs,), generator=g), torch.randint(0, 50000, (a.deep_pairs,), generator=g)
    )
    positions = list(range(16))
    t0 = time.perf_counter()
    est = attribute(deep, dclean, dcorr, dmetric, hook="z", positions=positions, method="atp", batch_size=25)
    t_atp = time.perf_counter() - t0
    k = a.exact_pairs
    sub = logit_diff(dmetric.answer[:k], dmetric.wrong[:k])
    t0 = time.perf_counter()
    with torch.inference_mode():
        exact = patch(deep, dclean[:k], dcorr[:k], sub, hook="z", positions=positions, progress=False)
    t_exact = (time.perf_counter() - t0) * a.deep_pairs / k
    est_k = attribute(deep, dclean[:k], dcorr[:k], sub, hook="z", positions=positions, method="atp")
    agr = agreement(est_k, exact, k=20)
    cells = est.values.numel()
    rows.append(
        (
            f"head × position map, {cfg.n_layer} layers × 16 positions × {cfg.n_head} heads, {a.deep_pairs} pairs: "
            "exact patching ÷ AtP",
            t_exact / t_atp,
            "AtP < 60 s",
            f"AtP {t_atp:.1f} s for {cells} cells; exact patching {t_exact:.0f} s (timed on {k} pairs: "
            f"{t_exact * k / a.deep_pairs:.1f} s, scaled ×{a.deep_pairs / k:g}); AtP vs exact on those pairs: "
            f"Spearman ρ {agr.spearman:.3f}, top-20 recall {agr.recall:.0%}",
        )
    )
    notes.append(
        "The deep model is randomly initialised (GPT-2 init), so its agreement numbers say little about trained "
        "models; it measures cost. Agreement on a trained model: `gpt2-interp run attribution` "
        "(analyses/results/attribution/)."
    )

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
        + f"\n\n({env}; fp32; medians of {a.repeats} interleaved runs for 1., one run for 2.)\n"
    )
    print(text)
    if a.out:
        a.out.write_text(
            "# Attribution-patching benchmarks\n\n`python benchmarks/bench_attribution.py`\n\n"
            + (__doc__.split("\n\n", 2)[2].strip() + "\n\n")
            + text
        )
        write_beside(a.out, standalone(sys.argv))  # provenance.json beside the results
    return {name: v for name, v, _, _ in rows}


if __name__ == "__main__":
    main()
