"""Logit-lens accuracy by layer on the embedded fact model, over the whole fact base.

For every fact, the first training prompt and every held-out prompt is decoded at each
layer boundary (logit lens: ln_final + W_U on the residual at the last token); we record
the rank of the correct object's first token. Per layer, per relation and split: top-1
accuracy and mean reciprocal rank. Writes ``logit_lens.json`` and ``logit_lens.png``.

    python analyses/logit_lens.py [--quick] [--model gpt2-facts] [--out analyses/results]
    python analyses/logit_lens.py --model smollm2-135m --known-only

``--known-only`` keeps the facts the model knows (``known_facts.known_facts``; a real model knows a
fraction of the fact base, and the lens of a fact it does not know says little); a model other than
gpt2-facts writes ``logit_lens_<model>.*``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import gpt2_interp as gi
from gpt2_interp.analysis.lens import logit_lens
from gpt2_interp.analysis.tokens import target_ids
from gpt2_interp.facts.base import FactBase

HERE = Path(__file__).resolve().parent


def prompt_set(model, fb: FactBase, split: str, per_relation: int | None,
               among: set | None = None) -> tuple[list[str], list[int], list[str]]:
    """``(prompts, first target token ids, relations)``: the first training prompt of each fact
    (``train``) or all its held-out prompts (``heldout``); ``per_relation`` facts per relation,
    only those in ``among`` when given."""
    prompts, targets, relations = [], [], []
    for rel in fb.relations:
        for fact in [f for f in fb.facts(rel) if among is None or f in among][:per_relation]:
            ps = fb.prompts(fact, split)
            ps = ps[:1] if split == "train" else ps
            prompts += ps
            targets += [target_ids(model, fact.target)[0]] * len(ps)
            relations += [rel] * len(ps)
    return prompts, targets, relations


def metrics(ranks: torch.Tensor) -> dict[str, list[float]]:
    """``ranks [n_layers, n]`` → per-layer top-1 accuracy and mean reciprocal rank."""
    r = ranks.double()
    return {"top1": (r == 1).double().mean(-1).tolist(), "mrr": (1 / r).mean(-1).tolist()}


def plot(result: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    layers = result["layers"]
    fig = Figure(figsize=(12, 7.5))
    axes = fig.subplots(2, 2, sharex=True)
    for row, split in enumerate(result["splits"]):
        res = result["splits"][split]
        for col, metric in enumerate(("top1", "mrr")):
            ax = axes[row, col]
            for rel, m in res["per_relation"].items():
                ax.plot(layers, m[metric], "o-", ms=3, lw=1, alpha=0.8, label=rel)
            ax.plot(layers, res["all"][metric], "k-", lw=2.5, label="all facts")
            ax.set_ylim(0, 1.02)
            ax.set_title(f"{'first' if split == 'train' else 'held-out'} prompts (n={res['n_prompts']}): "
                         f"{'top-1 accuracy' if metric == 'top1' else 'mean reciprocal rank'}", fontsize=10)
            ax.set_ylabel("top-1 accuracy" if metric == "top1" else "MRR")
            ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("layer boundary (logit lens: ln_final + W_U)")
        if len(layers) > 12:  # a deep model: label every third boundary and the last
            ticks = list(range(0, len(layers), 3)) + ([len(layers) - 1] if (len(layers) - 1) % 3 else [])
            ax.set_xticks(ticks, [layers[i] for i in ticks])
    axes[0, 1].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"Logit lens on {result['model']}: rank of the correct object's first token at the last prompt token")
    fig.tight_layout()
    fig.savefig(path, dpi=130)


def run(model, fb: FactBase, per_relation: int | None, batch_size: int, among: set | None = None) -> dict:
    out: dict = {"splits": {}}
    for split in ("train", "heldout"):
        prompts, targets, relations = prompt_set(model, fb, split, per_relation, among)
        lens = logit_lens(model, prompts, targets=targets, k=1, batch_size=batch_size, progress=True)
        ranks = lens.target_rank[:, :, 0]  # [n_layers, n_prompts]
        out["layers"] = lens.layers
        rel_idx = {r: [i for i, x in enumerate(relations) if x == r] for r in fb.relations}
        out["splits"][split] = {
            "n_prompts": len(prompts),
            "all": metrics(ranks),
            "per_relation": {r: metrics(ranks[:, idx]) for r, idx in rel_idx.items() if idx},
            "n_per_relation": {r: len(idx) for r, idx in rel_idx.items()},
        }
    return out


@torch.no_grad()
def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt2-facts")
    p.add_argument("--quick", action="store_true", help="8 facts per relation (for the test suite)")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--known-only", action="store_true", help="only the facts the model knows (see module doc)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    model = gi.load(args.model)
    fb = FactBase.load()
    among = None
    if args.known_only:
        sys.path.insert(0, str(HERE))
        from known_facts import known_facts_saved

        among = set(known_facts_saved(model, fb))
    result = {"model": args.model, "quick": args.quick, "known_only": args.known_only}
    result |= run(model, fb, 8 if args.quick else None, args.batch_size, among)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = ("logit_lens" if args.model == "gpt2-facts" else f"logit_lens_{args.model}") + ("_quick" if args.quick else "")
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, args.out / f"{stem}.png")
    print(f"{'layer':<8}" + "".join(f"{s + ' top1':>14}{s + ' MRR':>13}" for s in result["splits"]))
    for i, name in enumerate(result["layers"]):
        print(f"{name:<8}" + "".join(f"{r['all']['top1'][i]:>14.3f}{r['all']['mrr'][i]:>13.3f}"
                                      for r in result["splits"].values()))
    print(f"wrote {args.out / stem}.json/.png in {result['seconds']} s")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
