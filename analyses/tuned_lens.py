"""How much better does a trained tuned lens read a model than the logit lens?

Trains a tuned lens (Belrose et al. 2023: one affine translator per layer boundary, objective
KL(final ‖ lens); started at the least-squares translators, then refined by Adam on the KL) on the
model's own generations (seed 0) or, with ``corpus=facts``, on the fact base's training sentences;
then measures on held-out text — fresh generations (seed 10000) and, for gpt2-facts, the fact base's
held-out paraphrase sentences, which the model never saw in training — the per-boundary
KL(final ‖ lens) in bits and the top-1 agreement with the model's final prediction, for the tuned and
the logit lens (and, with ``compare_start``, for the least-squares start alone). Records the time of
each phase.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch

from gpt2_interp.analysis.tuned_lens import (
    TunedLens,
    corpus_texts,
    least_squares_translators,
    lens_divergence,
    token_rows,
    train_tuned_lens,
)
from gpt2_interp.experiments.base import ExperimentConfig, register
from gpt2_interp.experiments.runner import RunContext
from gpt2_interp.facts.base import FactBase
from gpt2_interp.plots.lens import plot_lens_divergence

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from gpt2_interp.model import HookedGPT2

GENERATED = "generated (seed 10000)"


@dataclass
class Config(ExperimentConfig):
    steps: int = field(default=40, metadata={"help": "KL steps after the least-squares start"})
    batch_tokens: int = field(default=512, metadata={"help": "token positions per KL step"})
    lr: float = field(default=3e-3, metadata={"help": "Adam's learning rate (linear decay)"})
    init: Literal["least-squares", "identity"] = field(default="least-squares", metadata={"help": "the start"})
    seq_len: int | None = field(default=None, metadata={"help": "tokens per row (none: min(context, 128))"})
    corpus: Literal["generated", "facts"] = field(
        default="generated",
        metadata={"help": "train on the model's own generations, or on the fact base's training sentences"},
    )
    train_texts: int = field(default=256, metadata={"help": "generated training texts"})
    heldout_texts: int = field(default=64, metadata={"help": "generated held-out texts (seed 10000)"})
    paraphrases: int = field(default=128, metadata={"help": "held-out paraphrase sentences (gpt2-facts only)"})
    compare_start: bool = field(default=False, metadata={"help": "also measure the least-squares start alone"})
    save: Path | None = field(default=None, metadata={"help": "also save the trained lens to this file"})

    QUICK: ClassVar[dict[str, Any]] = {
        "steps": 3,
        "train_texts": 8,
        "heldout_texts": 4,
        "batch_tokens": 256,
        "paraphrases": 8,
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("batch_tokens", "train_texts", "heldout_texts"):
            if getattr(self, name) < 1:
                raise ValueError(f"tuned_lens: {name} must be >= 1, got {getattr(self, name)}")
        for name in ("steps", "paraphrases"):
            if getattr(self, name) < 0:
                raise ValueError(f"tuned_lens: {name} must be >= 0, got {getattr(self, name)}")
        if self.seq_len is not None and self.seq_len < 2:
            raise ValueError(f"tuned_lens: seq_len must be >= 2 or none, got {self.seq_len}")


def heldout_sets(model: HookedGPT2, cfg: Config, seq_len: int) -> dict[str, list[str]]:
    """The held-out texts: fresh generations and, for gpt2-facts, a sample of the held-out paraphrases."""
    held = {GENERATED: corpus_texts(model, "generated", cfg.heldout_texts, seed=10_000, length=seq_len - 1)}
    if model.cfg.name == "gpt2-facts" and cfg.paraphrases:
        sentences = FactBase.load().sentences("heldout")
        held["held-out paraphrases"] = random.Random(0).sample(sentences, cfg.paraphrases)
    return held


def training_texts(model: HookedGPT2, cfg: Config, seq_len: int) -> list[str]:
    """The training texts: the model's own generations (seed 0), or the fact base's training sentences."""
    if cfg.corpus == "facts":
        return corpus_texts(model, FactBase.load().sentences("train"))
    return corpus_texts(model, "generated", cfg.train_texts, seed=0, length=seq_len - 1)


def finding(model_name: str, labels: list[str], main: dict, steps: int, train: dict) -> dict[str, Any]:
    """The KL ratio per boundary, whether both goals hold, and the sentence that says so."""
    kl_l, kl_t = main["logit lens"]["kl_bits"], main["tuned lens"]["kl_bits"]
    ag_l, ag_t = main["logit lens"]["top1_agreement"], main["tuned lens"]["top1_agreement"]
    ratio = [t / l if l > 0 else None for t, l in zip(kl_t, kl_l)]
    goal_kl = all(r is not None and r <= 0.5 for r in ratio[:-1])
    goal_top1 = all(t > l for t, l in zip(ag_t[:-1], ag_l[:-1]))
    ranked = [-math.inf if r is None else r for r in ratio[:-1]]  # None: the logit lens's KL is 0 there
    worst = max(range(len(ranked)), key=ranked.__getitem__)

    def pct(r: float | None) -> str:
        return "–" if r is None else f"{100 * r:.0f}%"

    sentence = (
        f"{model_name}: on held-out generations ({main['tuned lens']['n_tokens']} tokens), the tuned lens's "
        f"KL(final ‖ lens) is "
        + ", ".join(f"{lab} {pct(r)}" for lab, r in zip(labels[:-1], ratio[:-1]))
        + f" of the logit lens's ({'≤' if goal_kl else 'not ≤'} 50% at every boundary but the last; worst "
        f"{labels[worst]} {pct(ratio[worst])}), and its top-1 agreement with the final prediction is "
        f"{'higher' if goal_top1 else 'not higher'} at every boundary but the last ("
        + ", ".join(f"{lab} {100 * l:.0f}→{100 * t:.0f}%" for lab, l, t in zip(labels[:-1], ag_l, ag_t))
        + f"). Training took {train['train_seconds']:.0f} s (least-squares start on {train['least_squares_tokens']} "
        f"tokens, then {steps} KL steps of {train['batch_tokens']} token positions)."
    )
    return {"kl_ratio": ratio, "goal_kl_half": goal_kl, "goal_top1_better": goal_top1, "finding": sentence}


def figures(data: dict) -> dict[str, Figure]:
    evals = data["heldout"][GENERATED]
    return {
        "tuned_lens": plot_lens_divergence(
            data["labels"],
            {k: v["kl_bits"] for k, v in evals.items()},
            {k: v["top1_agreement"] for k, v in evals.items()},
            title=f"{data['model']}: logit vs tuned lens on held-out generations",
        )
    }


def tables(data: dict) -> dict[str, str]:
    rows = ["| held-out set | lens | " + " | ".join(data["labels"]) + " |", "|---|---|" + "---|" * len(data["labels"])]
    for name, evals in data["heldout"].items():
        for lens, e in evals.items():
            rows.append(f"| {name} | {lens} KL bits | " + " | ".join(f"{v:.3f}" for v in e["kl_bits"]) + " |")
            rows.append(
                f"| {name} | {lens} top-1 agreement | " + " | ".join(f"{v:.3f}" for v in e["top1_agreement"]) + " |"
            )
    return {"tuned_lens": data["finding"] + "\n\n" + "\n".join(rows)}


@register("tuned_lens", Config, tables=tables, figures=figures)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    seq_len = min(cfg.seq_len or min(model.cfg.n_ctx, 128), model.cfg.n_ctx)
    t0 = time.perf_counter()
    train, held = training_texts(model, cfg, seq_len), heldout_sets(model, cfg, seq_len)
    seconds = {"generation_seconds": round(time.perf_counter() - t0, 1)}
    t0 = time.perf_counter()
    lens = train_tuned_lens(
        model,
        train,
        steps=cfg.steps,
        batch_tokens=cfg.batch_tokens,
        lr=cfg.lr,
        init=cfg.init,
        seq_len=seq_len,
        progress=None,
    )
    seconds["train_seconds"] = round(time.perf_counter() - t0, 1)
    if cfg.save:
        lens.save(cfg.save)
    lenses: dict[str, TunedLens | None] = {"logit lens": None, "tuned lens": lens}
    if cfg.compare_start:
        start = TunedLens.identity(model)
        start.weight, start.bias, _ = least_squares_translators(model, *token_rows(model, train, seq_len))
        lenses["least-squares start"] = start
    t0 = time.perf_counter()
    evals = {
        name: {lab: lens_divergence(model, texts, ln, seq_len=seq_len) for lab, ln in lenses.items()}
        for name, texts in held.items()
    }
    meta = {
        **lens.meta,
        **seconds,
        "eval_seconds": round(time.perf_counter() - t0, 1),
        "texts": len(train),
        "corpus": cfg.corpus,
        "torch_threads": torch.get_num_threads(),
    }
    return {
        "model": model.cfg.name,
        "labels": lens.labels,
        "train": meta,
        "heldout": evals,
        **finding(model.cfg.name, lens.labels, evals[GENERATED], cfg.steps, meta),
    }
