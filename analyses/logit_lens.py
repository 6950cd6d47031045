"""Logit-lens accuracy by layer over the fact base: where the answer enters the output basis.

For every fact, the first training prompt and every held-out prompt is decoded at each layer
boundary (logit lens: the final norm and the unembedding applied to the residual at the last token);
the rank of the correct object's first token gives, per layer, relation and split, top-1 accuracy
and mean reciprocal rank. ``known_only`` keeps the facts the model knows
(:func:`gpt2_interp.analysis.known.known_facts`): a real model knows a fraction of the fact base,
and the lens of a fact it does not know says little.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from gpt2_interp.analysis.known import known_facts
from gpt2_interp.analysis.lens import logit_lens
from gpt2_interp.analysis.tokens import target_ids
from gpt2_interp.experiments.base import ExperimentConfig, register
from gpt2_interp.experiments.runner import RunContext
from gpt2_interp.facts.base import FactBase

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from gpt2_interp.model import HookedGPT2


@dataclass
class Config(ExperimentConfig):
    per_relation: int | None = field(default=None, metadata={"help": "facts per relation (none: all)"})
    known_only: bool = field(default=False, metadata={"help": "only the facts the model knows"})
    batch_size: int = field(default=128, metadata={"help": "prompts per forward pass"})

    QUICK: ClassVar[dict[str, Any]] = {"per_relation": 8}


def prompt_set(
    model: HookedGPT2, fb: FactBase, split: str, per_relation: int | None, among: set | None = None
) -> tuple[list[str], list[int], list[str]]:
    """``(prompts, first target token ids, relations)``: the first training prompt of each fact
    (``train``) or all its held-out prompts (``heldout``)."""
    prompts, targets, relations = [], [], []
    for rel in fb.relations:
        for fact in [f for f in fb.facts(rel) if among is None or f in among][:per_relation]:
            ps = fb.prompts(fact, split)
            ps = ps[:1] if split == "train" else ps
            prompts += ps
            targets += [target_ids(model, fact.target)[0]] * len(ps)
            relations += [rel] * len(ps)
    return prompts, targets, relations


def rank_metrics(ranks: torch.Tensor) -> dict[str, list[float]]:
    """``ranks [n_layers, n]`` → per-layer top-1 accuracy and mean reciprocal rank."""
    r = ranks.double()
    return {"top1": (r == 1).double().mean(-1).tolist(), "mrr": (1 / r).mean(-1).tolist()}


@torch.no_grad()
def split_metrics(
    model: HookedGPT2, fb: FactBase, split: str, cfg: Config, among: set | None, progress: bool
) -> tuple[list[str], dict[str, Any]]:
    """The lens over one split's prompts: layer names and the split's metrics, overall and per relation."""
    prompts, targets, relations = prompt_set(model, fb, split, cfg.per_relation, among)
    lens = logit_lens(model, prompts, targets=targets, k=1, batch_size=cfg.batch_size, progress=progress)
    assert lens.target_rank is not None, "the lens ranks the targets it is given"
    ranks = lens.target_rank[:, :, 0]  # [n_layers, n_prompts]
    rel_idx = {r: [i for i, x in enumerate(relations) if x == r] for r in fb.relations}
    return list(lens.layers), {
        "n_prompts": len(prompts),
        "all": rank_metrics(ranks),
        "per_relation": {r: rank_metrics(ranks[:, idx]) for r, idx in rel_idx.items() if idx},
        "n_per_relation": {r: len(idx) for r, idx in rel_idx.items()},
    }


def tables(data: dict) -> dict[str, str]:
    splits = data["splits"]
    head = "| layer | " + " | ".join(f"{s} top-1 | {s} MRR" for s in splits) + " |"
    rows = [head, "|---|" + "---|---|" * len(splits)]
    for i, name in enumerate(data["layers"]):
        rows.append(
            f"| {name} | "
            + " | ".join(f"{r['all']['top1'][i]:.3f} | {r['all']['mrr'][i]:.3f}" for r in splits.values())
            + " |"
        )
    counts = ", ".join(f"{s}: {r['n_prompts']} prompts" for s, r in splits.items())
    return {
        "logit_lens": f"Logit lens, rank of the correct object's first token at the last position ({counts}).\n\n"
        + "\n".join(rows)
    }


def figures(data: dict) -> dict[str, Figure]:
    from matplotlib.figure import Figure

    from gpt2_interp.plots.layout import finish_layout

    layers = data["layers"]
    fig = Figure(figsize=(12, 7.5))
    axes = fig.subplots(2, 2, sharex=True)
    for row, split in enumerate(data["splits"]):
        res = data["splits"][split]
        for col, metric in enumerate(("top1", "mrr")):
            ax = axes[row, col]
            for rel, m in res["per_relation"].items():
                ax.plot(layers, m[metric], "o-", ms=3, lw=1, alpha=0.8, label=rel)
            ax.plot(layers, res["all"][metric], "k-", lw=2.5, label="all facts")
            ax.set_ylim(0, 1.02)
            ax.set_title(
                f"{'first' if split == 'train' else 'held-out'} prompts (n={res['n_prompts']}): "
                f"{'top-1 accuracy' if metric == 'top1' else 'mean reciprocal rank'}",
                fontsize=10,
            )
            ax.set_ylabel("top-1 accuracy" if metric == "top1" else "MRR")
            ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("layer boundary (logit lens: final norm + unembedding)")
        if len(layers) > 12:  # a deep model: label every third boundary and the last
            ticks = list(range(0, len(layers), 3)) + ([len(layers) - 1] if (len(layers) - 1) % 3 else [])
            ax.set_xticks(ticks, [layers[i] for i in ticks])
    axes[0, 1].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Logit lens on {data['model']}: rank of the correct object's first token at the last prompt token")
    finish_layout(fig)
    return {"logit_lens": fig}


@register("logit_lens", Config, tables=tables, figures=figures)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    fb = FactBase.load()
    among = set(known_facts(model, fb)) if cfg.known_only else None
    data: dict[str, Any] = {"model": model.cfg.name, "splits": {}}
    for split in ("train", "heldout"):
        data["layers"], data["splits"][split] = split_metrics(model, fb, split, cfg, among, ctx.progress)
    return data
