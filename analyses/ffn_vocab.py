"""Concept neurons: MLP value vectors whose vocabulary projection reads as one object class.

An object class is the set of first tokens of a relation's objects (capitals, continents,
languages, currencies, countries, US states, chemical symbols, atomic numbers). For every
neuron of every layer we take the top-10 tokens of its value vector (``neuron_vocab``,
ln_final gain applied) and its coherence = the largest fraction of them that belong to one
class. We report every neuron with coherence ≥ ``--min-coherence``, and for each relation
the neurons that ``find_neurons`` ranks as promoting its class most (mean score over the
class minus the mean over every corpus token), with their coherence. Chance = the class's share of the tokens that occur in the corpus.
Writes ``ffn_vocab.md`` and ``ffn_vocab.json``.

    python analyses/ffn_vocab.py [--quick] [--model gpt2-facts] [--out analyses/results]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import gpt2_interp as gi
from gpt2_interp.analysis.vocab import find_neurons, neuron_vocab, project
from gpt2_interp.facts.base import FactBase
from gpt2_interp.io import tokenizer as tok

HERE = Path(__file__).resolve().parent


def object_classes(fb: FactBase) -> dict[str, set[int]]:
    """Relation → first token ids of its objects (with the leading space the model produces)."""
    return {rel: {tok.encode(" " + o)[0] for o in fb.objects(rel)} for rel in fb.relations}


def coherence(top_ids: torch.Tensor, classes: dict[str, set[int]]) -> torch.Tensor:
    """``top_ids [n, k]`` → ``[n, n_classes]`` fraction of each row's tokens in each class."""
    return torch.stack([torch.isin(top_ids, torch.tensor(sorted(c))).float().mean(-1) for c in classes.values()], -1)


def _md_tokens(tokens: list[str]) -> str:
    return " ".join(repr(t).replace("|", "\\|") for t in tokens)


@torch.no_grad()
def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt2-facts")
    p.add_argument("--quick", action="store_true", help="last two layers only, 5 search hits (for the test suite)")
    p.add_argument("--out", type=Path, default=HERE / "results")
    p.add_argument("-k", type=int, default=10, help="top tokens per neuron (default 10)")
    p.add_argument("--min-coherence", type=float, default=0.6)
    p.add_argument("--search", type=int, default=10, help="find_neurons hits per relation (default 10)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    model = gi.load(args.model)
    fb = FactBase.load()
    classes = object_classes(fb)
    rels = list(classes)
    corpus = {t for s in fb.sentences("train") for t in tok.encode(s)}
    chance = {r: len(c & corpus) / len(corpus) for r, c in classes.items()}
    n = model.cfg.n_layer
    layers = list(range(n - 2, n)) if args.quick else list(range(n))

    concept, per_layer = [], {r: [0] * n for r in rels}
    for layer in layers:
        proj = neuron_vocab(model, layer, k=args.k)
        coh = coherence(proj.top_ids, classes)  # [d_mlp, n_classes]
        best, which = coh.max(-1)
        for i in (best >= args.min_coherence).nonzero()[:, 0].tolist():
            rel = rels[int(which[i])]
            per_layer[rel][layer] += 1
            concept.append({"layer": layer, "neuron": proj.neurons[i], "relation": rel, "coherence": float(best[i]),
                            "top_score": float(proj.top_scores[i, 0]), "top_tokens": proj.top_tokens[i]})
    concept.sort(key=lambda r: (rels.index(r["relation"]), -r["coherence"], -r["top_score"]))

    search = {}
    for rel, ids in classes.items():
        hits = find_neurons(model, sorted(ids), k=3 if args.quick else args.search, layers=layers,
                            contrast=sorted(corpus), n_tokens=args.k)
        top = torch.stack([model.blocks[l].mlp.W_out[i] for l, i, _ in hits])
        coh = coherence(project(model, top, k=args.k).top_ids, classes)
        search[rel] = [{"layer": l, "neuron": i, "score": s, "coherence": float(coh[j, rels.index(rel)]),
                        "top_tokens": hits.top_tokens[j]} for j, (l, i, s) in enumerate(hits)]

    result = {
        "model": args.model, "quick": args.quick, "k": args.k, "min_coherence": args.min_coherence, "layers": layers,
        "d_mlp": model.cfg.d_mlp, "class_sizes": {r: len(c) for r, c in classes.items()}, "chance": chance,
        "n_concept_neurons": {r: sum(per_layer[r]) for r in rels}, "concept_neurons_per_layer": per_layer,
        "concept_neurons": concept, "search": search, "seconds": round(time.perf_counter() - t0, 1),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "ffn_vocab_quick" if args.quick else "ffn_vocab"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / f"{stem}.md").write_text(markdown(result) + "\n")
    print(markdown(result, rows_per_relation=3))
    print(f"wrote {args.out / stem}.md/.json in {result['seconds']} s")
    return result


def markdown(result: dict, rows_per_relation: int | None = None) -> str:
    rels = list(result["class_sizes"])
    k = result["k"]
    lines = [f"# Concept neurons in {result['model']} (layers {result['layers'][0]}–{result['layers'][-1]}, "
             f"{result['d_mlp']} neurons each)", "",
             f"Coherence = fraction of a value vector's top-{k} tokens (v · (w ⊙ W_U)) that are first tokens of one "
             f"relation's objects; listed: coherence ≥ {result['min_coherence']}.", "",
             "| relation | class size | chance | concept neurons | per layer |", "|---|---|---|---|---|"]
    for r in rels:
        lines.append(f"| {r} | {result['class_sizes'][r]} | {result['chance'][r]:.3f} | {result['n_concept_neurons'][r]} "
                     f"| {' '.join(map(str, result['concept_neurons_per_layer'][r]))} |")
    lines += ["", "## Concept neurons", "", f"| relation | neuron | coherence | top-{k} tokens |", "|---|---|---|---|"]
    shown: dict[str, int] = {}
    for row in result["concept_neurons"]:
        shown[row["relation"]] = shown.get(row["relation"], 0) + 1
        if rows_per_relation is not None and shown[row["relation"]] > rows_per_relation:
            continue
        lines.append(f"| {row['relation']} | L{row['layer']}.N{row['neuron']} | {row['coherence']:.1f} | "
                     f"{_md_tokens(row['top_tokens'])} |")
    if rows_per_relation is None:
        lines += ["", "## Search: neurons promoting each class (find_neurons: class mean − corpus-token mean)", "",
                  "| relation | neuron | score | coherence | top tokens |", "|---|---|---|---|---|"]
        for r, hits in result["search"].items():
            for h in hits:
                lines.append(f"| {r} | L{h['layer']}.N{h['neuron']} | {h['score']:.3f} | {h['coherence']:.1f} | "
                             f"{_md_tokens(h['top_tokens'])} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
