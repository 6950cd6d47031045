"""Concept neurons: MLP value vectors whose vocabulary projection reads as one object class.

An object class is the set of first tokens of a relation's objects (capitals, continents, languages,
currencies, countries, US states, chemical symbols, atomic numbers). For every neuron of every layer
the top-``k`` tokens of its value vector (:func:`~gpt2_interp.analysis.vocab.neuron_vocab`, ln_final
gain applied) give its coherence = the largest fraction of them that belong to one class. Reported:
every neuron with coherence ≥ ``min_coherence``, and for each relation the neurons that
:func:`~gpt2_interp.analysis.vocab.find_neurons` ranks as promoting its class most (mean score over
the class minus the mean over every corpus token), with their coherence. Chance = the class's share
of the tokens that occur in the fact base's training corpus.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from gpt2_interp.analysis.vocab import find_neurons, neuron_vocab, project
from gpt2_interp.experiments.base import ExperimentConfig, register
from gpt2_interp.experiments.runner import RunContext
from gpt2_interp.facts.base import FactBase

if TYPE_CHECKING:
    from gpt2_interp.model import HookedGPT2


@dataclass
class Config(ExperimentConfig):
    k: int = field(default=10, metadata={"help": "top tokens per neuron"})
    min_coherence: float = field(default=0.6, metadata={"help": "list the neurons with at least this coherence"})
    search: int = field(default=10, metadata={"help": "find_neurons hits per relation"})
    last_layers: int | None = field(default=None, metadata={"help": "only the last this many layers (none: all)"})

    QUICK: ClassVar[dict[str, Any]] = {"last_layers": 2, "search": 3}

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("k", "search"):
            if getattr(self, name) < 1:
                raise ValueError(f"ffn_vocab: {name} must be >= 1, got {getattr(self, name)}")
        if self.last_layers is not None and self.last_layers < 1:
            raise ValueError(f"ffn_vocab: last_layers must be >= 1 or none, got {self.last_layers}")
        if not 0 <= self.min_coherence <= 1:
            raise ValueError(f"ffn_vocab: min_coherence must be in [0, 1], got {self.min_coherence}")


def first_token(model: HookedGPT2, text: str) -> int:
    """The first token id of ``text`` in the model's tokenizer (no BOS)."""
    return int(model.to_tokens(text, prepend_bos=False)[0, 0])


def object_classes(model: HookedGPT2, fb: FactBase) -> dict[str, set[int]]:
    """Relation → first token ids of its objects (with the leading space the model produces)."""
    return {rel: {first_token(model, " " + o) for o in fb.objects(rel)} for rel in fb.relations}


def corpus_tokens(model: HookedGPT2, fb: FactBase) -> set[int]:
    """Every token id of the fact base's training sentences (no BOS)."""
    return {t for s in fb.sentences("train") for t in model.to_tokens(s, prepend_bos=False)[0].tolist()}


def coherence(top_ids: torch.Tensor, classes: dict[str, set[int]]) -> torch.Tensor:
    """``top_ids [n, k]`` → ``[n, n_classes]`` fraction of each row's tokens in each class."""
    return torch.stack([torch.isin(top_ids, torch.tensor(sorted(c))).float().mean(-1) for c in classes.values()], -1)


def concept_neurons(
    model: HookedGPT2, layers: list[int], classes: dict[str, set[int]], cfg: Config
) -> tuple[list[dict[str, Any]], dict[str, list[int]]]:
    """Every neuron of ``layers`` with coherence ≥ ``min_coherence`` (sorted by relation, then coherence),
    and per relation the count per layer."""
    rels = list(classes)
    concept, per_layer = [], {r: [0] * model.cfg.n_layer for r in rels}
    for layer in layers:
        proj = neuron_vocab(model, layer, k=cfg.k)
        assert proj.neurons is not None, "a projection of neurons lists them"
        best, which = coherence(proj.top_ids, classes).max(-1)  # [d_mlp]
        for i in (best >= cfg.min_coherence).nonzero()[:, 0].tolist():
            rel = rels[int(which[i])]
            per_layer[rel][layer] += 1
            concept.append(
                {
                    "layer": layer,
                    "neuron": proj.neurons[i],
                    "relation": rel,
                    "coherence": float(best[i]),
                    "top_score": float(proj.top_scores[i, 0]),
                    "top_tokens": proj.top_tokens[i],
                }
            )
    concept.sort(key=lambda r: (rels.index(r["relation"]), -r["coherence"], -r["top_score"]))
    return concept, per_layer


def search_neurons(
    model: HookedGPT2, layers: list[int], classes: dict[str, set[int]], corpus: set[int], cfg: Config
) -> dict[str, list[dict[str, Any]]]:
    """Per relation, the ``search`` neurons that promote its class most against the corpus, with coherence."""
    rels = list(classes)
    out = {}
    for rel, ids in classes.items():
        hits = find_neurons(model, sorted(ids), k=cfg.search, layers=layers, contrast=sorted(corpus), n_tokens=cfg.k)
        top = torch.stack([model.blocks[l].mlp.W_out[i] for l, i, _ in hits])
        coh = coherence(project(model, top, k=cfg.k).top_ids, classes)
        out[rel] = [
            {
                "layer": l,
                "neuron": i,
                "score": s,
                "coherence": float(coh[j, rels.index(rel)]),
                "top_tokens": hits.top_tokens[j],
            }
            for j, (l, i, s) in enumerate(hits)
        ]
    return out


def _md_tokens(tokens: list[str]) -> str:
    return " ".join(repr(t).replace("|", "\\|") for t in tokens)


def markdown(data: dict, rows_per_relation: int | None = None) -> str:
    """The report: class sizes and counts, the concept neurons, and (all rows) the search hits."""
    rels = list(data["class_sizes"])
    k = data["k"]
    lines = [
        f"# Concept neurons in {data['model']} (layers {data['layers'][0]}–{data['layers'][-1]}, "
        f"{data['d_mlp']} neurons each)",
        "",
        f"Coherence = fraction of a value vector's top-{k} tokens (v · (w ⊙ W_U)) that are first tokens of one "
        f"relation's objects; listed: coherence ≥ {data['min_coherence']}.",
        "",
        "| relation | class size | chance | concept neurons | per layer |",
        "|---|---|---|---|---|",
    ]
    for r in rels:
        lines.append(
            f"| {r} | {data['class_sizes'][r]} | {data['chance'][r]:.3f} | {data['n_concept_neurons'][r]} "
            f"| {' '.join(map(str, data['concept_neurons_per_layer'][r]))} |"
        )
    lines += ["", "## Concept neurons", "", f"| relation | neuron | coherence | top-{k} tokens |", "|---|---|---|---|"]
    shown: dict[str, int] = {}
    for row in data["concept_neurons"]:
        shown[row["relation"]] = shown.get(row["relation"], 0) + 1
        if rows_per_relation is None or shown[row["relation"]] <= rows_per_relation:
            lines.append(
                f"| {row['relation']} | L{row['layer']}.N{row['neuron']} | {row['coherence']:.1f} | "
                f"{_md_tokens(row['top_tokens'])} |"
            )
    if rows_per_relation is None:
        lines += [
            "",
            "## Search: neurons promoting each class (find_neurons: class mean − corpus-token mean)",
            "",
            "| relation | neuron | score | coherence | top tokens |",
            "|---|---|---|---|---|",
        ]
        for r, hits in data["search"].items():
            lines += [
                f"| {r} | L{h['layer']}.N{h['neuron']} | {h['score']:.3f} | {h['coherence']:.1f} | "
                f"{_md_tokens(h['top_tokens'])} |"
                for h in hits
            ]
    return "\n".join(lines)


def tables(data: dict) -> dict[str, str]:
    return {"ffn_vocab": markdown(data)}


@register("ffn_vocab", Config, tables=tables)
@torch.no_grad()
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    fb = FactBase.load()
    classes = object_classes(model, fb)
    corpus = corpus_tokens(model, fb)
    n = model.cfg.n_layer
    layers = list(range(n - min(cfg.last_layers or n, n), n))
    concept, per_layer = concept_neurons(model, layers, classes, cfg)
    return {
        "model": model.cfg.name,
        "k": cfg.k,
        "min_coherence": cfg.min_coherence,
        "layers": layers,
        "d_mlp": model.cfg.d_mlp,
        "class_sizes": {r: len(c) for r, c in classes.items()},
        "chance": {r: len(c & corpus) / len(corpus) for r, c in classes.items()},
        "n_concept_neurons": {r: sum(v) for r, v in per_layer.items()},
        "concept_neurons_per_layer": per_layer,
        "concept_neurons": concept,
        "search": search_neurons(model, layers, classes, corpus, cfg),
    }
