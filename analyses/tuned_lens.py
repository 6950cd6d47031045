"""How much better does a trained tuned lens read a model than the logit lens?

    python analyses/tuned_lens.py [--model gpt2-facts] [--steps N] [--quick] [--out-dir analyses/results]
    python analyses/tuned_lens.py --model smollm2-135m --train-texts 64 --heldout-texts 16 --seq-len 96 --steps 0

Trains a tuned lens (Belrose et al. 2023: one affine translator per layer boundary, objective
KL(final ‖ lens); here started at the least-squares translators, then refined by Adam on the KL)
on the model's own generations (seed 0), then measures on held-out text — fresh generations
(another seed) and, for gpt2-facts, the fact base's held-out paraphrase sentences, which the
model never saw in training — the per-boundary KL(final ‖ lens) in bits and the top-1 agreement
with the model's final prediction, for the tuned and the logit lens (and, with
``--compare-start``, for the least-squares start alone). Records the time of each phase on this
machine. Writes ``tuned_lens[_MODEL].json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

import gpt2_interp as gi
from gpt2_interp.analysis.tuned_lens import (
    TunedLens, corpus_texts, least_squares_translators, lens_divergence, token_rows, train_tuned_lens,
)
from gpt2_interp.facts.base import FactBase
from gpt2_interp.plots.lens import plot_lens_divergence

RESULTS = Path(__file__).resolve().parent / "results"


def draw(model: str, labels: list[str], evals: dict):
    """The figure: KL and top-1 agreement by boundary, one line per lens, on held-out generations."""
    return plot_lens_divergence(labels, {k: v["kl_bits"] for k, v in evals.items()},
                                {k: v["top1_agreement"] for k, v in evals.items()},
                                title=f"{model}: logit vs tuned lens on held-out generations")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2-facts")
    ap.add_argument("--steps", type=int, default=40, help="KL steps after the least-squares start")
    ap.add_argument("--batch-tokens", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--init", choices=["least-squares", "identity"], default="least-squares")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per row (default: min(context, 128))")
    ap.add_argument("--corpus", choices=["generated", "facts"], default="generated",
                    help="train on the model's own generations, or (gpt2-facts) on its training sentences")
    ap.add_argument("--train-texts", type=int, default=256, help="generated training texts")
    ap.add_argument("--heldout-texts", type=int, default=64, help="generated held-out texts (another seed)")
    ap.add_argument("--paraphrases", type=int, default=128, help="held-out paraphrase sentences (gpt2-facts)")
    ap.add_argument("--compare-start", action="store_true", help="also measure the least-squares start alone")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--save", type=Path, default=None, help="also save the trained lens here")
    ap.add_argument("--quick", action="store_true", help="a few steps on a few texts (for the test suite)")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    ap.add_argument("--render", type=Path, default=None, metavar="JSON",
                    help="only redraw the figure of a saved result (no model run)")
    args = ap.parse_args(argv)
    if args.render:
        saved = json.loads(args.render.read_text())
        draw(saved["model"], saved["labels"], saved["heldout"]["generated (seed 10000)"]).savefig(
            args.render.with_suffix(".png"), dpi=130, bbox_inches="tight")
        return saved
    if args.quick:
        args.steps, args.train_texts, args.heldout_texts, args.batch_tokens = 3, 8, 4, 256
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = gi.load(args.model)
    seq_len = min(args.seq_len or min(model.cfg.n_ctx, 128), model.cfg.n_ctx)

    t0 = time.perf_counter()
    if args.corpus == "facts":
        train = corpus_texts(model, FactBase.load().sentences("train"))
    else:
        train = corpus_texts(model, "generated", args.train_texts, seed=0, length=seq_len - 1)
    held = {"generated (seed 10000)": corpus_texts(model, "generated", args.heldout_texts, seed=10_000, length=seq_len - 1)}
    gen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    lens = train_tuned_lens(model, train, steps=args.steps, batch_tokens=args.batch_tokens, lr=args.lr, init=args.init,
                            seq_len=seq_len, progress=None)
    train_s = time.perf_counter() - t0
    if args.save:
        lens.save(args.save)
    lenses: dict[str, TunedLens | None] = {"logit lens": None, "tuned lens": lens}
    if args.compare_start:
        start = TunedLens.identity(model)
        start.weight, start.bias, _ = least_squares_translators(model, *token_rows(model, train, seq_len))
        lenses["least-squares start"] = start
    if args.model == "gpt2-facts":
        sentences = FactBase.load().sentences("heldout")
        held["held-out paraphrases"] = random.Random(0).sample(sentences, 8 if args.quick else args.paraphrases)
    t0 = time.perf_counter()
    evals = {name: {lab: lens_divergence(model, texts, ln, seq_len=seq_len) for lab, ln in lenses.items()}
             for name, texts in held.items()}
    eval_s = time.perf_counter() - t0
    labels = lens.labels
    main_eval = evals["generated (seed 10000)"]
    kl_l, kl_t = main_eval["logit lens"]["kl_bits"], main_eval["tuned lens"]["kl_bits"]
    ag_l, ag_t = main_eval["logit lens"]["top1_agreement"], main_eval["tuned lens"]["top1_agreement"]
    ratio = [t / l if l > 0 else None for t, l in zip(kl_t, kl_l)]
    goal_kl = all(r is not None and r <= 0.5 for r in ratio[:-1])
    goal_top1 = all(t > l for t, l in zip(ag_t[:-1], ag_l[:-1]))
    worst = max(range(len(ratio) - 1), key=lambda i: ratio[i])
    finding = (
        f"{args.model}: on held-out generations ({main_eval['tuned lens']['n_tokens']} tokens), the tuned lens's "
        f"KL(final ‖ lens) is " + ", ".join(f"{lab} {100 * r:.0f}%" for lab, r in zip(labels[:-1], ratio[:-1]))
        + f" of the logit lens's ({'≤' if goal_kl else 'not ≤'} 50% at every boundary but the last; worst "
        f"{labels[worst]} {100 * ratio[worst]:.0f}%), and its top-1 agreement with the final prediction is "
        f"{'higher' if goal_top1 else 'not higher'} at every boundary but the last ("
        + ", ".join(f"{lab} {100 * l:.0f}→{100 * t:.0f}%" for lab, l, t in zip(labels[:-1], ag_l, ag_t))
        + f"). Training took {train_s:.0f} s (least-squares start on {lens.meta['least_squares_tokens']} tokens, then "
        f"{args.steps} KL steps of {lens.meta['batch_tokens']} token positions)."
    )
    print(finding)
    fig = draw(args.model, labels, main_eval)
    stem = ("tuned_lens" + ("" if args.model == "gpt2-facts" else f"_{args.model}") + ("_facts" if args.corpus == "facts" else "")
            + ("_quick" if args.quick else ""))
    fig.savefig(args.out_dir / f"{stem}.png", dpi=130, bbox_inches="tight")
    out = {"model": args.model, "labels": labels,
           "command": "python analyses/tuned_lens.py " + " ".join(argv if argv is not None else __import__("sys").argv[1:]),
           "train": {**lens.meta, "generation_seconds": round(gen_s, 1), "train_seconds": round(train_s, 1),
                     "eval_seconds": round(eval_s, 1), "texts": len(train), "corpus": args.corpus,
                     "torch_threads": torch.get_num_threads()},
           "heldout": evals, "kl_ratio": ratio, "goal_kl_half": goal_kl, "goal_top1_better": goal_top1,
           "finding": finding}
    (args.out_dir / f"{stem}.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


if __name__ == "__main__":
    main()
