"""Probe and tuned-lens speed on gpt2-facts, as seconds and as ratios to a forward pass in the same run.

    python benchmarks/bench_probes.py [--lens-steps 5]

1. ``probe`` of the continent task (1,880 prompts × every layer boundary, by-type control, 5 subject
   folds) — goal ≤ 60 s on our CPU; peer: one plain forward pass over the same prompts.
2. tuned-lens training: seconds per step (default batch of 256 token positions), and the projected
   time of the default 100 steps — goal ≤ 15 min; peer: a forward pass over the step's batch.
Timings depend on how busy the machine is: read the ratios, and the absolute numbers only from an
idle machine.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import gpt2_interp as gi
from gpt2_interp.analysis.probes import probe
from gpt2_interp.analysis.tuned_lens import corpus_texts, token_rows, train_tuned_lens
from gpt2_interp.facts.probing import probing_set


@torch.no_grad()
def forward_s(model, prompts: list[str], batch_size: int = 64) -> float:
    t = time.perf_counter()
    for s in range(0, len(prompts), batch_size):
        tokens, mask = model.tokenize(prompts[s : s + batch_size])
        model(tokens, attention_mask=mask, return_type=None)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lens-steps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ.get("THREADS", 2)))
    model = gi.load("gpt2-facts")
    ds = probing_set("continent")
    fwd = forward_s(model, ds.prompts)
    t = time.perf_counter()
    r = probe(model, ds, hook="resid", control="by-type", progress=False)
    p = time.perf_counter() - t
    print(
        f"probe: {len(ds)} prompts × {len(r.layers)} boundaries: {p:.1f} s (goal ≤ 60 s); "
        f"forward pass over the prompts {fwd:.2f} s; ratio {p / fwd:.1f}×; load average {os.getloadavg()[0]:.1f}"
    )
    texts = corpus_texts(model, "generated", 16, seed=0)
    tokens, _ = token_rows(model, texts, model.cfg.n_ctx)
    with torch.no_grad():
        t = time.perf_counter()
        model(tokens[:4])
        f1 = time.perf_counter() - t
    t = time.perf_counter()
    train_tuned_lens(model, texts, steps=args.lens_steps, progress=False)
    per = (time.perf_counter() - t) / args.lens_steps
    print(
        f"tuned lens: {per:.1f} s per step of 256 positions ({per / f1:.0f}× a forward pass over them); "
        f"100 steps ≈ {100 * per / 60:.1f} min (goal ≤ 15 min); load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
