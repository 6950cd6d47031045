"""Edge-level circuits: the model as a graph of senders and receivers, every edge scored at once
(EAP, EAP-IG) or exactly (edge patching through the prefix-reuse engine), circuits chosen from the
scores with dangling nodes pruned, and their faithfulness measured exactly.

>>> scores = edge_scores(model, clean, corrupted, logit_diff(" Paris", " Rome"), method="eap-ig")
>>> c = evaluate(model, circuit(scores, top=200), clean, corrupted, logit_diff(" Paris", " Rome"))
>>> c.faithfulness, c.save("circuit.json")

- ``graph``: :class:`Graph` and :func:`graph_of` (senders, receivers, edges; GPT-2, GQA and parallel blocks alike);
  :class:`CircuitWarning` for degenerate results (no edges, fewer pairs, non-finite scores)
- ``edges``: :func:`pairs_of`, :func:`run_with_edges` (any set of edges patched), :func:`edge_patch` (exact)
- ``scores``: :func:`edge_scores` → :class:`EdgeScores`
- ``circuit``: :func:`circuit` (top edges or :func:`greedy_order`), :func:`prune`, :func:`evaluate`,
  :func:`faithfulness_curve` →
  :class:`Circuit`, :class:`FaithfulnessCurve`
- ``tasks``: the tasks a circuit is found on (:func:`ioi`, :func:`greater_than`, :func:`fact_recall`:
  prompt pairs with their metric, a :class:`Task`) and the model's own :func:`performance` on them
"""

from .circuit import (
    FAITHFUL_ENOUGH,
    Circuit,
    FaithfulnessCurve,
    circuit,
    default_sizes,
    evaluate,
    faithfulness_curve,
    faithfulness_text,
    greedy_order,
    prune,
)
from .edges import Pairs, edge_patch, pairs_of, run_with_edges, split_inputs
from .graph import CircuitWarning, Graph, graph_of
from .scores import EDGE_METHODS, EdgeScores, edge_scores
from .tasks import (
    GREATER_THAN_NOUNS,
    IOI_NAMES,
    IOI_TEMPLATES,
    TASKS,
    ProbMassDiff,
    Task,
    TaskPerformance,
    fact_recall,
    greater_than,
    ioi,
    ioi_names,
    last_logits,
    make_task,
    performance,
    performs_reliably,
    year_tokens,
)

__all__ = [
    "EDGE_METHODS",
    "FAITHFUL_ENOUGH",
    "GREATER_THAN_NOUNS",
    "IOI_NAMES",
    "IOI_TEMPLATES",
    "TASKS",
    "Circuit",
    "CircuitWarning",
    "EdgeScores",
    "FaithfulnessCurve",
    "Graph",
    "Pairs",
    "ProbMassDiff",
    "Task",
    "TaskPerformance",
    "circuit",
    "default_sizes",
    "edge_patch",
    "edge_scores",
    "evaluate",
    "fact_recall",
    "faithfulness_curve",
    "faithfulness_text",
    "graph_of",
    "greater_than",
    "greedy_order",
    "ioi",
    "ioi_names",
    "last_logits",
    "make_task",
    "pairs_of",
    "performance",
    "performs_reliably",
    "prune",
    "run_with_edges",
    "split_inputs",
    "year_tokens",
]
