"""What do attribution graphs of fact prompts look like on this model, and what does one cost?

For the first ``n_prompts`` facts the model knows (their first training prompt; the fact base's order), builds
the attribution graph (Ameisen et al. 2025) with the transcoders a ``transcoders`` run saved, prunes it by
influence on the logits (the paper's node and edge thresholds) and records per prompt: the prompt's length, the
wall time of the graph and of its pruning, the active features, the nodes and edges kept, the pruned graph's
replacement and completeness scores, and whether the answer is among the graph's logit nodes. ``prompts`` adds
texts of the user's (e.g. a longer one, for the cost at 10 tokens), answered by the model's own top token.

Then it tests each graph by intervention (:func:`gpt2_interp.graphs.intervene`): the ``n_interventions``
features with the largest direct edges into the answer's logit node are each set to 0, and the change of the
answer's de-meaned logit is recorded as the graph predicts it (direct, and direct plus indirect), in the frozen
replacement model with the downstream features free, and in the real model, with the answer's probability
before and after. Quick mode uses freshly initialised transcoders (untrained: the error nodes carry the graph),
so it checks the machinery only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from gpt2_interp.analysis.known import known_facts
from gpt2_interp.experiments.base import ExperimentConfig, register
from gpt2_interp.experiments.runner import RunContext
from gpt2_interp.facts.base import FactBase
from gpt2_interp.graphs import (
    AttributionConfig,
    TranscoderSet,
    TranscoderTrainConfig,
    attribute,
    intervene,
    new_transcoders,
    prune_graph,
)

if TYPE_CHECKING:
    from gpt2_interp.model import HookedGPT2


@dataclass
class Config(ExperimentConfig):
    transcoders: str = field(
        default="analyses/results/transcoders/{model}/transcoders",
        metadata={"help": "folder of the transcoders ({model}: the model's name); 'untrained' for fresh ones"},
    )
    n_prompts: int = field(default=5, metadata={"help": "fact prompts graphed"})
    node_threshold: float = field(default=0.8, metadata={"help": "share of the influence the kept nodes carry"})
    edge_threshold: float = field(default=0.98, metadata={"help": "share of the influence the kept edges carry"})
    max_n_logits: int = field(default=10, metadata={"help": "logit nodes at most"})
    batch_size: int = field(default=64, metadata={"help": "targets per backward pass"})
    prompts: list[str] = field(
        default_factory=list,
        metadata={"help": "texts graphed after the facts (comma-separated), answered by the model"},
    )
    n_interventions: int = field(
        default=5, metadata={"help": "top features by direct edge into the answer, each set to 0"}
    )

    QUICK: ClassVar[dict[str, Any]] = {
        "transcoders": "untrained",
        "n_prompts": 2,
        "max_n_logits": 3,
        "n_interventions": 2,
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_prompts < 0 or self.n_prompts + len(self.prompts) < 1:
            raise ValueError(
                f"attribution_graphs: give n_prompts >= 1 or some prompts, got n_prompts={self.n_prompts} and "
                f"{len(self.prompts)} prompts"
            )
        if self.n_interventions < 0:
            raise ValueError(f"attribution_graphs: n_interventions must be >= 0, got {self.n_interventions}")


def tables(data: dict) -> dict[str, str]:
    """One row per prompt."""
    rows = [
        "| prompt | answer | tokens | graph s | active features | nodes kept | edges kept | replacement | "
        "completeness | answer a logit node |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g in data["graphs"]:
        rows.append(
            f"| {g['prompt']} | {g['answer']} | {g['tokens']} | {g['graph_seconds']:.1f} | {g['features']} | "
            f"{g['nodes_kept']} | {g['edges_kept']} | {g['replacement_score']:.3f} | "
            f"{g['completeness_score']:.3f} | {'yes' if g['answer_is_logit_node'] else 'no'} |"
        )
    head = f"{data['model']}, transcoders: {data['transcoders']}."
    out = {"attribution_graphs": head + "\n\n" + "\n".join(rows)}
    rows = [
        "| prompt | feature (layer, position, index) | activation | graph direct | graph total | "
        "frozen, features free | real model | answer p before → after |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for g in data["graphs"]:
        for i in g.get("interventions", []):
            rows.append(
                f"| {g['prompt']} | {tuple(i['feature'])} | {i['activation']:.3f} | {i['graph_direct']:+.3f} | "
                f"{i['graph_total']:+.3f} | {i['frozen_free']:+.3f} | {i['real']:+.3f} | "
                f"{i['prob_before']:.3f} → {i['prob_after']:.3f} |"
            )
    if len(rows) > 2:
        same = [i for g in data["graphs"] for i in g.get("interventions", [])]
        agree = sum(1 for i in same if i["real"] * i["graph_total"] > 0)
        note = (
            "Each feature set to 0; the change of the answer's de-meaned logit. The real model moves the answer the "
            f"way the graph predicts (same sign) in {agree} of {len(same)} interventions."
        )
        out["interventions"] = note + "\n\n" + "\n".join(rows)
    return out


def _transcoders(model: HookedGPT2, where: str) -> tuple[TranscoderSet, str]:
    if where == "untrained":
        return new_transcoders(model, TranscoderTrainConfig(expansion=2, k=8)), "untrained (seed 0)"
    folder = Path(where.format(model=model.cfg.name)).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(
            f"attribution_graphs: no transcoders at {folder}; run `gpt2-interp run transcoders --model "
            f"{model.cfg.name}` first, or --set transcoders=FOLDER"
        )
    return TranscoderSet.load(folder, model), str(folder)


@register("attribution_graphs", Config, tables=tables)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    ts, where = _transcoders(model, cfg.transcoders)
    fb = FactBase.load()
    facts = known_facts(model, fb)[: cfg.n_prompts] if cfg.n_prompts else []
    cases = [(prompt, answer) for prompt, _, answer in fb.cases(facts, "train", 0)] if facts else []
    for text in cfg.prompts:
        top = int(model(model.to_tokens(text))[0, -1].argmax())
        cases.append((text, str(model.to_string([top]))))
    acfg = AttributionConfig(max_n_logits=cfg.max_n_logits, batch_size=cfg.batch_size)
    graphs = []
    for prompt, answer in cases:
        tokens = model.to_tokens(prompt)[0]
        start = time.perf_counter()
        graph = attribute(model, ts, tokens, acfg)
        graph_seconds = time.perf_counter() - start
        start = time.perf_counter()
        pruned = prune_graph(graph, cfg.node_threshold, cfg.edge_threshold)
        prune_seconds = time.perf_counter() - start
        assert pruned.node_mask is not None and pruned.edge_mask is not None
        answer_id = model.to_tokens(answer, prepend_bos=False)[0, 0]
        graphs.append(
            {
                "prompt": prompt,
                "answer": answer,
                "tokens": len(tokens),
                "graph_seconds": graph_seconds,
                "prune_seconds": prune_seconds,
                "features": graph.n_features,
                "nodes_kept": int(pruned.node_mask.sum()),
                "edges_kept": int(pruned.edge_mask.sum()),
                "replacement_score": pruned.replacement_score,
                "completeness_score": pruned.completeness_score,
                "answer_is_logit_node": bool((graph.logit_tokens == answer_id).any()),
                "interventions": _interventions(model, ts, graph, int(answer_id), cfg.n_interventions),
            }
        )
    return {"model": model.cfg.name, "transcoders": where, "graphs": graphs}


def _interventions(model: HookedGPT2, ts: TranscoderSet, graph: Any, answer: int, n: int) -> list[dict]:
    """The ``n`` features with the largest direct edges into the answer's logit node (none when the answer is not a
    logit node), each set to 0: the answer's change each way."""
    hit = (graph.logit_tokens == answer).nonzero().flatten()
    if not n or not len(hit):
        return []
    row = graph.adjacency[graph.logit_index(int(hit[0])), : graph.n_features]
    out = []
    for i in row.abs().argsort(descending=True)[:n].tolist():
        key = tuple(graph.features[i].tolist())
        res = intervene(model, ts, graph, key, value=0.0, tokens=[answer])
        out.append(
            {
                "feature": list(key),
                "activation": float(graph.activations[i]),
                "edge_to_answer": float(row[i]),
                "graph_direct": float(res.graph_direct[0]),
                "graph_total": float(res.graph_total[0]),
                "frozen_free": float(res.frozen_free[0]),
                "real": float(res.real[0]),
                "prob_before": float(res.prob_before[0]),
                "prob_after": float(res.prob_after[0]),
            }
        )
    return out
