"""How well do per-layer transcoders stand in for this model's MLPs?

Trains a transcoder for every layer (Ameisen et al. 2025: a sparse dictionary that reads the MLP's input and
predicts its output; TopK by default, with a linear skip unless ``skip`` is off) from one stream of forward passes
over a text corpus (``texts``: the Brown corpus, the model's own generations or the fact corpus), the last
``heldout`` fraction of the documents never trained on; then measures on those held-out windows, per layer, the
variance of the MLP output explained, L0 and the dead features, and for the whole set the model's next-token loss
with every MLP replaced at once against the clean model (and with the error terms, which must give the clean
loss back). The transcoders are saved under the run's folder (``transcoders/``, circuit-tracer's file layout);
``checkpoint/`` lets an interrupted run resume.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from gpt2_interp.analysis.features.sae_train import text_source, token_windows
from gpt2_interp.experiments.base import ExperimentConfig, register
from gpt2_interp.experiments.runner import RunContext
from gpt2_interp.graphs import TranscoderTrainConfig, evaluate_transcoders, train_transcoders

if TYPE_CHECKING:
    from gpt2_interp.model import HookedGPT2


@dataclass
class Config(ExperimentConfig):
    expansion: int = field(default=8, metadata={"help": "features per input dimension"})
    k: int = field(default=32, metadata={"help": "active features per token"})
    skip: bool = field(default=True, metadata={"help": "a linear skip connection from input to output"})
    tokens: int = field(default=400_000, metadata={"help": "training tokens per layer (every layer sees each)"})
    batch_size: int = field(default=1024, metadata={"help": "activations per training step"})
    lr: float | None = field(default=None, metadata={"help": "Adam's step (none: the SAE trainer's default)"})
    context_size: int = field(default=64, metadata={"help": "tokens per window (BOS first)"})
    epochs: int = field(default=1, metadata={"help": "passes over the training windows"})
    texts: str = field(default="brown", metadata={"help": "brown, generated, facts, or a folder of .txt files"})
    generated: int = field(default=64, metadata={"help": "samples of the model itself when texts=generated"})
    heldout: float = field(default=0.1, metadata={"help": "fraction of the documents held out for evaluation"})
    eval_windows: int = field(default=256, metadata={"help": "held-out windows evaluated"})

    QUICK: ClassVar[dict[str, Any]] = {
        "texts": "facts",
        "tokens": 2048,
        "batch_size": 256,
        "expansion": 2,
        "k": 8,
        "heldout": 0.25,
        "eval_windows": 8,
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.heldout < 1:
            raise ValueError(f"transcoders: heldout must be in (0, 1), got {self.heldout}")
        if self.eval_windows < 1:
            raise ValueError(f"transcoders: eval_windows must be >= 1, got {self.eval_windows}")


def tables(data: dict) -> dict[str, str]:
    """Per-layer metrics and the whole set's losses, as Markdown tables."""
    m = data["metrics"]
    rows = ["| layer | variance explained | L0 | dead features |", "|---|---|---|---|"]
    for L, (ve, l0, dead) in enumerate(zip(m["variance_explained"], m["l0"], m["dead"])):
        rows.append(f"| {L} | {ve:.3f} | {l0:.1f} | {100 * dead:.1f}% |")
    loss = [
        "| next-token loss (nats, held out) | value |",
        "|---|---|",
        f"| clean model | {m['clean_loss']:.4f} |",
        f"| every MLP replaced by its transcoder | {m['replaced_loss']:.4f} |",
        f"| replaced, with the error terms | {m['replaced_with_errors_loss']:.4f} |",
    ]
    head = (
        f"{data['model']}: {data['method']}, {data['training_tokens']} training tokens per layer in "
        f"{data['train_seconds']:.0f} s; held out: {m['tokens']} tokens."
    )
    return {"transcoders": head + "\n\n" + "\n".join(rows) + "\n\n" + "\n".join(loss)}


@register("transcoders", Config, tables=tables)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    docs = text_source(model, cfg.texts, n_generated=cfg.generated, seed=cfg.seed)
    n_held = max(1, int(len(docs) * cfg.heldout))
    if n_held >= len(docs):
        raise ValueError(f"transcoders: {len(docs)} documents cannot be split into training and held-out text")
    train = token_windows(model, docs[:-n_held], cfg.context_size)
    held = token_windows(model, docs[-n_held:], cfg.context_size)[: cfg.eval_windows]
    tcfg = TranscoderTrainConfig(
        expansion=cfg.expansion,
        k=cfg.k,
        skip=cfg.skip,
        tokens=cfg.tokens,
        batch_size=cfg.batch_size,
        lr=cfg.lr,
        epochs=cfg.epochs,
        buffer_tokens=max(8 * cfg.batch_size, 32_768) if cfg.tokens > 32_768 else 4 * cfg.batch_size,
        seed=cfg.seed,
    )
    ctx.record("train_config", asdict(tcfg))
    checkpoint = ctx.out_dir / "checkpoint" if ctx.out_dir is not None else None
    start = time.perf_counter()
    ts = train_transcoders(model, tcfg, train, checkpoint=checkpoint)
    train_seconds = time.perf_counter() - start
    if ctx.out_dir is not None:
        ts.save(ctx.out_dir / "transcoders")
    metrics = evaluate_transcoders(model, ts, held)
    return {
        "model": model.cfg.name,
        "method": f"TopK transcoders, {ts[0].d_sae} features, k={cfg.k}, skip={cfg.skip}",
        "metrics": metrics.to_dict(),
        "training_tokens": cfg.tokens,
        "train_seconds": train_seconds,
        "train_windows": len(train),
        "heldout_windows": len(held),
        "documents": {"train": len(docs) - n_held, "heldout": n_held},
    }
