"""What do attribution graphs of fact prompts look like on this model, and what does one cost?

For the first ``n_prompts`` facts the model knows (their first training prompt; the fact base's order), builds
the attribution graph (Ameisen et al. 2025) with the transcoders a ``transcoders`` run saved, prunes it by
influence on the logits (the paper's node and edge thresholds) and records per prompt: the prompt's length, the
wall time of the graph and of its pruning, the active features, the nodes and edges kept, the pruned graph's
replacement and completeness scores, and whether the answer is among the graph's logit nodes. Quick mode uses
freshly initialised transcoders (untrained: the error nodes carry the graph), so it checks the machinery only.
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

    QUICK: ClassVar[dict[str, Any]] = {"transcoders": "untrained", "n_prompts": 2, "max_n_logits": 3}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n_prompts < 1:
            raise ValueError(f"attribution_graphs: n_prompts must be >= 1, got {self.n_prompts}")


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
    return {"attribution_graphs": head + "\n\n" + "\n".join(rows)}


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
    facts = known_facts(model, fb)[: cfg.n_prompts]
    cases = fb.cases(facts, "train", 0)
    acfg = AttributionConfig(max_n_logits=cfg.max_n_logits, batch_size=cfg.batch_size)
    graphs = []
    for prompt, _, answer in cases:
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
            }
        )
    return {"model": model.cfg.name, "transcoders": where, "graphs": graphs}
