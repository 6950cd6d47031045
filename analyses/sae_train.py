"""How good an SAE does this model's residual stream get, for how much compute?

Trains a sparse autoencoder (TopK by default, 8 × d_model latents) on one hook point — the residual
stream after the middle block unless ``hook`` says otherwise — from text streamed through the
shuffling activation buffer (a small corpus read in several ``epochs``, the first pass's activations
kept in memory for the others), then measures it on held-out text (the last ``heldout`` fraction of the
documents, never trained on, or ``eval_texts``): L0, variance explained, cross-entropy loss recovered, dead and dense
latents. Also measured, same run: the buffer's throughput against a plain forward pass up to the hook
over the same windows, and the cost of a training step as a ratio of the forward that made its
activations. The SAE is saved under the run's folder (``sae/``, SAELens's layout); training checkpoints
in ``checkpoint/`` let an interrupted run resume.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from gpt2_interp.analysis.features.sae_eval import evaluate_sae
from gpt2_interp.analysis.features.sae_train import (
    ActivationBuffer,
    SAETrainConfig,
    run_to_hook,
    source_name,
    text_source,
    token_windows,
    train_sae,
)
from gpt2_interp.core.tables import format_table
from gpt2_interp.experiments.base import ExperimentConfig, register
from gpt2_interp.experiments.runner import RunContext

if TYPE_CHECKING:
    from gpt2_interp.model import HookedGPT2


@dataclass
class Config(ExperimentConfig):
    hook: str | None = field(
        default=None, metadata={"help": "hook point to train on (none: blocks.{n_layer // 2}.hook_resid_pre)"}
    )
    architecture: str = field(default="topk", metadata={"help": "topk, batchtopk or relu"})
    expansion: int = field(default=8, metadata={"help": "latents per input dimension"})
    k: int = field(default=32, metadata={"help": "active latents per token (topk, batchtopk)"})
    l1_coefficient: float = field(default=5.0, metadata={"help": "L1 penalty of a relu SAE"})
    tokens: int = field(default=1_000_000, metadata={"help": "training tokens"})
    batch_size: int = field(default=4096, metadata={"help": "activations per training step"})
    lr: float | None = field(default=None, metadata={"help": "Adam's step (none: 2e-4 / sqrt(d_sae / 16384))"})
    context_size: int = field(default=64, metadata={"help": "tokens per window (BOS first)"})
    epochs: int = field(
        default=1,
        metadata={"help": "passes over the training text (later passes reuse the first pass's activations, in memory)"},
    )
    texts: str = field(
        default="brown", metadata={"help": "brown, generated, facts (the fact corpus), or a folder of .txt files"}
    )
    generated: int = field(default=64, metadata={"help": "samples of the model itself when texts=generated"})
    heldout: float = field(default=0.1, metadata={"help": "fraction of the documents held out for evaluation"})
    eval_windows: int = field(default=256, metadata={"help": "held-out windows evaluated"})
    eval_texts: str = field(
        default="heldout",
        metadata={
            "help": "text to evaluate on: heldout (the held-out documents of texts), or another source (generated: "
            "the model's own samples, where CE loss recovered means most for a model trained on narrow text)"
        },
    )
    outlier_ratio: float | None = field(
        default=None,
        metadata={
            "help": "leave out positions whose norm exceeds this × their batch's median (massive activations) in "
            "training and in the metrics, kept clean in the CE ablations as BOS is (none: keep all)"
        },
    )
    timing_windows: int = field(default=256, metadata={"help": "windows for the buffer-vs-forward timing"})

    QUICK: ClassVar[dict[str, Any]] = {
        "texts": "generated",
        "tokens": 4096,
        "batch_size": 512,
        "expansion": 2,
        "k": 8,
        "heldout": 0.25,
        "eval_windows": 8,
        "timing_windows": 16,
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.heldout < 1:
            raise ValueError(f"sae_train: heldout must be in (0, 1), got {self.heldout}")
        for name in ("eval_windows", "timing_windows"):
            if getattr(self, name) < 1:
                raise ValueError(f"sae_train: {name} must be >= 1, got {getattr(self, name)}")


def buffer_timing(model: HookedGPT2, hook: str, windows: torch.Tensor, batch_size: int) -> dict[str, float]:
    """Seconds for the activation buffer to hand out every activation of ``windows``, and for a plain
    forward pass up to the hook over the same windows (the peer), interleaved twice, best of each."""
    best = {"buffer_seconds": float("inf"), "forward_seconds": float("inf")}
    for _ in range(2):
        t = time.perf_counter()
        for _ in ActivationBuffer(model, hook, windows, batch_size, 4 * batch_size):
            pass
        best["buffer_seconds"] = min(best["buffer_seconds"], time.perf_counter() - t)
        t = time.perf_counter()
        with torch.no_grad():
            for i in range(0, len(windows), 32):
                run_to_hook(model, windows[i : i + 32], hook)
        best["forward_seconds"] = min(best["forward_seconds"], time.perf_counter() - t)
    n = windows.numel()
    best["tokens"] = n
    best["buffer_tokens_per_second"] = n / best["buffer_seconds"]
    best["forward_tokens_per_second"] = n / best["forward_seconds"]
    best["throughput_ratio"] = best["buffer_tokens_per_second"] / best["forward_tokens_per_second"]
    return best


def tables(data: dict) -> dict[str, str]:
    """The held-out metrics and the costs, as text tables."""
    ev, t = data["evaluation"], data["timing"]
    rows = [[k, f"{v:.4g}" if isinstance(v, float) else str(v)] for k, v in ev.items()]
    cost = [
        ["buffer throughput / plain forward to the hook", f"{t['throughput_ratio']:.3f}"],
        ["training step / activation forward (per token)", f"{data['step_cost_ratio']:.3f}"],
        ["training tokens", str(data["training"]["tokens"])],
        ["training wall seconds", f"{data['train_seconds']:.1f}"],
    ]
    return {
        "metrics": "\n".join(format_table(["metric (held-out)", "value"], rows, right=[False, True])),
        "cost": "\n".join(format_table(["cost", "value"], cost, right=[False, True])),
    }


@register("sae_train", Config, tables=tables)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    hook = cfg.hook or f"blocks.{model.cfg.n_layer // 2}.hook_resid_pre"
    docs = text_source(model, cfg.texts, n_generated=cfg.generated, seed=cfg.seed)
    n_held = max(1, int(len(docs) * cfg.heldout))
    if n_held >= len(docs):
        raise ValueError(f"sae_train: {len(docs)} documents cannot be split into training and held-out text")
    train_windows = token_windows(model, docs[:-n_held], cfg.context_size)
    held_docs = (
        docs[-n_held:]
        if cfg.eval_texts == "heldout"
        else text_source(model, cfg.eval_texts, n_generated=5 * cfg.eval_windows, seed=cfg.seed + 1)
    )
    held = token_windows(model, held_docs, cfg.context_size)[: cfg.eval_windows]
    tcfg = SAETrainConfig(
        hook_name=hook,
        expansion=cfg.expansion,
        architecture=cfg.architecture,  # type: ignore[arg-type]  # checked by SAETrainConfig
        k=cfg.k if cfg.architecture != "relu" else None,  # a ReLU SAE has no k (refused when given)
        l1_coefficient=cfg.l1_coefficient,
        tokens=cfg.tokens,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        context_size=cfg.context_size,
        epochs=cfg.epochs,
        outlier_ratio=cfg.outlier_ratio,
        buffer_tokens=max(16 * cfg.batch_size, 65_536) if cfg.tokens > 65_536 else 4 * cfg.batch_size,
        seed=cfg.seed,
    )
    ctx.record("train_config", asdict(tcfg))
    t = time.perf_counter()
    checkpoint = ctx.out_dir / "checkpoint" if ctx.out_dir is not None else None
    record = {  # the split, stored in the SAE: `gpt2-interp sae eval` reads the same held-out documents
        "texts": source_name(cfg.texts),
        "seed": cfg.seed,
        "n_generated": cfg.generated,
        "context_size": cfg.context_size,
        "documents": len(docs) - n_held,
        "train_windows": len(train_windows),
        "heldout_windows": len(token_windows(model, docs[-n_held:], cfg.context_size)),
    }
    sae, log = train_sae(
        model, tcfg, windows=train_windows, checkpoint=checkpoint, progress=ctx.progress, record=record
    )
    train_seconds = time.perf_counter() - t
    if ctx.out_dir is not None:
        sae.save(ctx.out_dir / "sae")
    ev = evaluate_sae(model, sae, held, outlier_ratio=cfg.outlier_ratio, progress=ctx.progress)
    ev.text = (
        f"held out: the last {n_held} of {len(docs)} documents of {cfg.texts}, never trained on"
        if cfg.eval_texts == "heldout"
        else f"{cfg.eval_texts} (not the training text)"
    )
    timing = buffer_timing(model, hook, train_windows[: cfg.timing_windows], min(cfg.batch_size, 1024))
    return {
        "hook": hook,
        "model": model.cfg.name,
        "method": f"{cfg.architecture} SAE, {sae.cfg.d_sae} latents, k={cfg.k}",
        "evaluation": ev.summary(),
        "eval_texts": cfg.eval_texts,
        "training": {
            "steps": log.steps,
            "tokens": log.tokens,
            "resumed_from": log.resumed_from,
            "fvu": log.fvu,
            "l0": log.l0,
            "dead": log.dead,
            "every": log.every,
            "outliers": log.outliers,
            "bos": log.bos,
        },
        "train_seconds": train_seconds,
        "step_cost_ratio": log.step_seconds / max(log.forward_seconds, 1e-9),
        "timing": timing,
        "train_windows": len(train_windows),
        "heldout_windows": len(held),
    }
