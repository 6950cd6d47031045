"""Circuits: a set of edges chosen from edge scores, pruned of dangling nodes, and measured.

A circuit keeps the ``top`` edges by ``|score|`` (or those above a ``threshold``, or a ``fraction``
of all edges) — or, with ``selection="greedy"``, grows from the logits up as the EAP-IG authors' greedy
rule does: it takes the highest-``|score|`` edge into a node already in the circuit (at first only the
logits), and a new sender joins with its own inputs as candidates, so every edge it takes reaches the
logits through the circuit. With ``prune`` the edges that cannot matter are dropped until none is left: an edge
whose sender receives no circuit edge (it cannot carry anything from the input) or whose receiver's
node sends none (nothing it computes reaches the logits). A node here is the input, a head, an MLP or
the logits; a head reads its own query input and its key/value head's inputs.

**Per position** (scores from ``edge_scores(..., per_position=True)``): the items are (position, edge)
pairs — the edge from a sender at position ``p`` to its receiver at ``p`` — and a circuit keeps some
positions of an edge and not others. Pruning follows attention across positions: a head at ``p`` reads its
query input at ``p`` and its key/value inputs at every position up to ``p``; an MLP reads its input at
``p``; the metric reads the logits at the last position only.

**Faithfulness** (exact): run the clean prompts with every edge *outside* the circuit patched to the
corrupted run (:func:`~gpt2_interp.analysis.circuits.edges.run_with_edges`) and normalise the metric,
``(M_circuit − M_corrupted) / (M_clean − M_corrupted)`` (pair means): 1 for the whole graph, 0 for
the empty circuit. **Completeness** is the same with the circuit's own edges patched instead
(``0`` means the rest of the graph does nothing without the circuit).

A circuit whose faithfulness is below :data:`FAITHFUL_ENOUGH` (0.8) does not reproduce the behaviour it was
scored on, so it is no evidence of the mechanism: :meth:`Circuit.table`, the command line and the plot's title
flag it (:attr:`Circuit.caveat`).
"""

from __future__ import annotations

import heapq
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from ...core.boundary import ArgumentError, boundary
from ...core.checks import check_choice, check_count, check_number
from ...core.circuit_layout import FAITHFUL_ENOUGH, faithfulness_text
from ...core.ranking import totals_by_size
from ...core.result import Result
from ...core.tables import format_table
from ...io.files import FileFormatError, read_json, write_json
from ..metrics import Metric, metric_name
from ..patching import Prompts
from .edges import Pairs, pairs_of, run_with_edges
from .graph import CircuitWarning, Graph, graph_of, refuse_other_model
from .scores import EdgeScores

if TYPE_CHECKING:
    from ...model import HookedGPT2


def _receiver_nodes(graph: Graph) -> torch.Tensor:
    """``[n_receivers, n_senders]`` bool: which sender nodes read each receiver input (a query
    input: its head; a key/value input: every head of its group; an MLP input: the MLP; logits: none)."""
    out = torch.zeros(graph.n_receivers, graph.n_senders, dtype=torch.bool)
    H, per = graph.n_head, graph.n_head // graph.n_kv
    for g in graph.groups:
        base = 1 + g.layer * (H + 1)
        for i in range(g.count):
            r = g.first + i
            if g.kind == "q":
                out[r, base + i] = True
            elif g.kind in ("k", "v"):
                out[r, base + i * per : base + (i + 1) * per] = True
            elif g.kind == "mlp":
                out[r, base + H] = True
    return out


@boundary
def prune(graph: Graph, keep: torch.Tensor) -> torch.Tensor:
    """``keep [n_edges]`` (or per position ``[n_pos, n_edges]``) bool without dangling edges (see the
    module docstring), repeated until stable."""
    if keep.ndim == 2:
        return _prune_per_position(graph, keep)
    m = graph.matrix(keep.bool().cpu(), False)  # [S, R]
    feeds = _receiver_nodes(graph)  # [R, S]
    logits = torch.tensor([g.kind == "logits" for g in graph.groups for _ in range(g.count)])
    while True:
        has_in = (m.any(0)[:, None] & feeds).any(0)  # [S]: a circuit edge reaches one of its inputs
        has_in[0] = True  # the input embedding needs no parent
        has_out = m.any(1)  # [S]
        useful = logits | (feeds & has_out[None]).any(1)  # [R]
        new = m & has_in[:, None] & useful[None]
        if torch.equal(new, m):
            return graph.flat(m)
        m = new


def _prune_per_position(graph: Graph, keep: torch.Tensor) -> torch.Tensor:
    """:func:`prune` for ``keep [n_pos, n_edges]``: a head's output at ``p`` depends on its query input at
    ``p`` and its key/value inputs at positions ≤ ``p``; an MLP's on its input at ``p``; only the logits at
    the last position are read."""
    m = torch.stack([graph.matrix(k, False) for k in keep.bool().cpu()])  # [P, S, R]
    feeds = _receiver_nodes(graph).float()  # [R, S]
    kinds = [g.kind for g in graph.groups for _ in range(g.count)]
    across = torch.tensor([k in ("k", "v") for k in kinds])  # [R]: read at every later position
    logits = torch.zeros(m.shape[0], graph.n_receivers, dtype=torch.bool)  # [P, R]
    logits[-1] = torch.tensor([k == "logits" for k in kinds])
    while True:
        into = m.any(1)  # [P, R]: a circuit edge reaches receiver r at p
        into = torch.where(across, into.int().cummax(0).values.bool(), into)  # k/v: at some position ≤ p
        has_in = (into.float() @ feeds) > 0  # [P, S]
        has_in[:, 0] = True  # the input embedding needs no parent
        out = m.any(2).float() @ feeds.T > 0  # [P, R]: r's node sends a circuit edge at p
        later = out.int().flip(0).cummax(0).values.flip(0).bool()  # ... at some position ≥ p
        useful = logits | torch.where(across, later, out)  # [P, R]
        new = m & has_in[:, :, None] & useful[:, None, :]
        if torch.equal(new, m):
            return torch.stack([graph.flat(x) for x in m])
        m = new


@boundary
@dataclass
class Circuit(Result):
    """A set of edges of a model's graph.

    - ``edges``: the circuit's edge names, by decreasing ``|score|``; ``scores``: their scores;
    - ``method``: the scoring method the edges were chosen by; ``metric``: its metric's name;
    - ``n_layer``, ``n_head``, ``n_kv``: the graph's sizes; ``total_edges``: edges in the whole graph;
    - ``faithfulness``/``completeness``: filled by :func:`evaluate` (None until measured);
    - ``positions``: per position, each edge's position (parallel to ``edges``; None for a circuit of whole
      edges) and ``n_pos`` the prompts' length; ``total_edges`` then counts (position, edge) items;
    - ``model_name``, ``weights``: the model the circuit was found on and its weights fingerprint (None: not
      recorded, as in older files); :meth:`check_model` refuses another model;
    - ``parallel``: the model has parallel blocks (no edge from a layer's heads to its own MLP; see
      :func:`~gpt2_interp.analysis.circuits.graph.graph_of`).
    """

    result_kind = "circuit"

    edges: list[str]
    scores: list[float]
    method: str
    metric: str
    n_layer: int
    n_head: int
    n_kv: int
    total_edges: int
    faithfulness: float | None = None
    completeness: float | None = None
    positions: list[int] | None = None
    n_pos: int | None = None
    model_name: str | None = None
    weights: str | None = None
    parallel: bool = False
    _mask: torch.Tensor | None = field(default=None, repr=False)

    @property
    def per_position(self) -> bool:
        """Whether the circuit keeps (position, edge) items rather than whole edges."""
        return self.positions is not None

    @property
    def share(self) -> float:
        """The circuit's edges as a share of all edges."""
        return len(self.edges) / max(self.total_edges, 1)

    @property
    def graph(self) -> Graph:
        """The graph the circuit lives in."""
        return Graph(self.n_layer, self.n_head, self.n_kv, model=self.model_name, parallel=self.parallel)

    def check_model(self, model: HookedGPT2) -> None:
        """Refuse (ValueError naming both models) a model this circuit was not found on: other sizes than its
        graph's, or other weights (when the fingerprint was recorded)."""
        refuse_other_model("this circuit", self.model_name, self.weights, model, self.graph)

    def mask(self, graph: Graph | None = None) -> torch.Tensor:
        """``[n_edges]`` bool, True for the circuit's edges (in ``graph``'s edge order); per position
        ``[n_pos, n_edges]``."""
        graph = self.graph if graph is None else graph
        if self._mask is not None and self._mask.shape[-1] == graph.n_edges:
            return self._mask
        if self.positions is None:
            out = torch.zeros(graph.n_edges, dtype=torch.bool)
            for e in self.edges:
                out[graph.edge(e)] = True
            return out
        assert self.n_pos is not None
        out = torch.zeros(self.n_pos, graph.n_edges, dtype=torch.bool)
        for e, p in zip(self.edges, self.positions):
            if not 0 <= p < self.n_pos:
                raise ValueError(
                    f"edge {e} at position {p}: outside the circuit's {self.n_pos} positions (0..{self.n_pos - 1})"
                )
            out[p, graph.edge(e)] = True
        return out

    def collapsed(self) -> Circuit:
        """The circuit of whole edges: every edge kept at some position, its score summed over them
        (itself when it is not per position)."""
        if self.positions is None:
            return self
        edges, scores = totals_by_size(self.edges, self.scores)
        return Circuit(
            edges,
            scores,
            self.method,
            self.metric,
            self.n_layer,
            self.n_head,
            self.n_kv,
            self.graph.n_edges,
            model_name=self.model_name,
            weights=self.weights,
            parallel=self.parallel,
        )

    def nodes(self) -> list[str]:
        """The nodes the circuit's edges join (``input``, ``a{l}.h{h}``, ``m{l}``, ``logits``), in forward
        order (at any position)."""
        graph = self.graph
        m = graph.matrix(self.collapsed().mask(graph), False)
        feeds = _receiver_nodes(graph)
        used = m.any(1) | (m.any(0)[:, None] & feeds).any(0)
        out = [s for s, u in zip(graph.senders, used.tolist()) if u]
        return out + (["logits"] if m[:, -1].any() else [])

    @property
    def caveat(self) -> str | None:
        """Why the circuit should not be read as the mechanism — its faithfulness is below
        :data:`FAITHFUL_ENOUGH` — or None when it reaches it (or was not measured)."""
        if self.faithfulness is None or self.faithfulness >= FAITHFUL_ENOUGH:
            return None
        return (
            f"caveat: faithfulness {self.faithfulness:.3f} is below {FAITHFUL_ENOUGH:g} (FAITHFUL_ENOUGH): this "
            "circuit does not reproduce the behaviour, so it is no evidence of the mechanism; keep more edges "
            "(top/fraction) until it reaches it"
        )

    def __repr__(self) -> str:
        what = "items" if self.per_position else "edges"
        return (
            f"Circuit({self.method}, {len(self.edges)} of {self.total_edges} {what}"
            f"{faithfulness_text(self.faithfulness)}"
            + ("" if self.completeness is None else f", completeness {self.completeness:.3f}")
            + ")"
        )

    def table(self, k: int = 20) -> str:
        """The first ``k`` edges with their scores, and the measured faithfulness and completeness; a
        circuit below :data:`FAITHFUL_ENOUGH` is flagged in the first line and ends with its :attr:`caveat`."""
        what = "(position, edge) items" if self.per_position else "edges"
        if self.positions is None:
            cols, rows = ["edge", "score"], [[e, f"{s:+.4g}"] for e, s in zip(self.edges[:k], self.scores[:k])]
        else:
            cols = ["edge", "position", "score"]
            rows = [[e, str(p), f"{s:+.4g}"] for e, p, s in zip(self.edges[:k], self.positions[:k], self.scores[:k])]
        head = (
            f"circuit ({self.method}): {len(self.edges)} of {self.total_edges} {what} ({100 * self.share:.2f}%)"
            + faithfulness_text(self.faithfulness)
            + ("" if self.completeness is None else f", completeness {self.completeness:.3f}")
        )
        return "\n".join([head, *format_table(cols, rows), *([self.caveat] if self.caveat else [])])

    def save(self, path: str | Path) -> Path:
        """Write the circuit as JSON (:meth:`to_dict` with a sha256 digest,
        :func:`~gpt2_interp.io.files.write_json`); :meth:`load` reads it back."""
        return write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> Circuit:
        """A circuit from a JSON file written by :meth:`save` (its digest checked); a ValueError naming the
        file (and the field) for one that is not a circuit file, is damaged, holds a field of the wrong type or
        does not fit its own graph. Files written before circuits recorded their model load with
        ``model_name``/``weights`` None, and a file without ``parallel`` as a circuit of sequential blocks."""
        need = ("edges", "scores", "method", "metric", "n_layer", "n_head", "n_kv", "total_edges")
        optional = ("faithfulness", "completeness", "positions", "n_pos", "model_name", "weights")
        data = read_json(path, "circuit", required=need)
        fields: dict[str, Any] = {k: data[k] for k in need} | {k: data.get(k) for k in optional}
        fields["parallel"] = data.get("parallel", False)
        try:
            c = cls(**fields)
            graph = c.graph
        except ArgumentError as e:  # a field of the wrong type or value: name the file and the field
            raise FileFormatError(f"{path}: not a valid circuit file: field {e.reason}") from None
        except ValueError as e:  # the graph's sizes
            raise FileFormatError(
                f"{path}: not a valid circuit file: {str(e).replace('Graph(): ', 'field ')}"
            ) from None
        if len(c.scores) != len(c.edges):
            raise FileFormatError(f"{path}: field scores holds {len(c.scores)} scores for {len(c.edges)} edges")
        items = graph.n_edges * (c.n_pos or 1) if c.positions is not None else graph.n_edges
        if (c.positions is None) != (c.n_pos is None) or (c.positions is not None and len(c.positions) != len(c.edges)):
            raise FileFormatError(f"{path}: positions and n_pos go together, one position per edge")
        if items != c.total_edges:
            raise FileFormatError(f"{path}: total_edges {c.total_edges} does not match its graph ({items} items)")
        try:
            c.mask(graph)
        except (KeyError, ValueError) as e:  # an unknown edge name, a position outside n_pos
            raise FileFormatError(f"{path}: field edges/positions: {str(e).strip(chr(34))}") from None
        return c

    def plot(self, **kwargs: Any):
        """The circuit graph (:func:`gpt2_interp.plots.circuits.plot_circuit`)."""
        from ...plots.circuits import plot_circuit

        if self.positions is not None and "title" not in kwargs:
            f = faithfulness_text(self.faithfulness, 2)
            whole = self.collapsed()
            kwargs["title"] = (
                f"circuit ({self.method}, per position): {len(self.edges)} of {self.total_edges} (position, edge) "
                f"items on {len(whole.edges)} edges{f}"
            )
        return plot_circuit(self.collapsed(), **kwargs)


SELECTIONS = ("top", "greedy")


@boundary
def greedy_order(graph: Graph, scores: torch.Tensor) -> torch.Tensor:
    """Edge indices in the order the greedy rule takes them: from the logits up, always the
    highest-``|score|`` edge whose receiver a node already in the circuit reads (the logits' at first);
    when its sender is new to the circuit, the sender's own inputs become candidates. NaN scores are
    never taken. Every edge taken reaches the logits through the ones taken before it."""
    feeds = _receiver_nodes(graph)  # [R, S]: which sender nodes read each receiver
    es, er = graph.edge_index
    m = scores.float().abs().cpu().tolist()
    into: list[list[int]] = [[] for _ in range(graph.n_receivers)]
    for e, r in enumerate(er.tolist()):
        if not math.isnan(m[e]):
            into[r].append(e)
    inputs_of = [feeds[:, n].nonzero()[:, 0].tolist() for n in range(graph.n_senders)]
    logits = [g.first + i for g in graph.groups if g.kind == "logits" for i in range(g.count)]
    opened = [False] * graph.n_receivers
    joined = [False] * graph.n_senders
    heap: list[tuple[float, int]] = []

    def open_receivers(rs: list[int]) -> None:
        for r in rs:
            if not opened[r]:
                opened[r] = True
                for e in into[r]:
                    heapq.heappush(heap, (-m[e], e))

    open_receivers(logits)
    order: list[int] = []
    senders = es.tolist()
    while heap:
        _, e = heapq.heappop(heap)
        order.append(e)
        n = senders[e]
        if not joined[n]:
            joined[n] = True
            open_receivers(inputs_of[n])
    return torch.tensor(order, dtype=torch.long)


@boundary
def circuit(
    scores: EdgeScores,
    top: int | None = None,
    threshold: float | None = None,
    fraction: float | None = None,
    prune_dangling: bool = True,
    selection: Literal["top", "greedy"] = "top",
) -> Circuit:
    """A :class:`Circuit` of the edges with the largest ``|score|``: the ``top`` edges, those with
    ``|score| ≥ threshold``, or the top ``fraction`` of all edges (exactly one of the three), then
    with ``prune_dangling`` the dangling edges removed (:func:`prune`). NaN scores are never chosen.
    ``selection="greedy"``: the first ``top`` (or ``fraction``) edges of :func:`greedy_order` instead of
    the global top (no ``threshold``).

    Per-position scores (``edge_scores(..., per_position=True)``) give a per-position circuit: ``top``,
    ``threshold`` and ``fraction`` count (position, edge) items, pruned per position (module docstring);
    greedy selection takes scores of whole edges."""
    if sum(x is not None for x in (top, threshold, fraction)) != 1:
        raise ValueError("give exactly one of top (an edge count), threshold (a |score|) or fraction (of all edges)")
    check_choice(selection, "selection", SELECTIONS)
    graph = scores.graph
    if scores.per_position:
        return _circuit_per_position(scores, top, threshold, fraction, prune_dangling, selection)
    s = scores.total().float()
    mag = s.abs().nan_to_num(-1.0)
    if threshold is not None:
        if selection == "greedy":
            raise ValueError("selection='greedy' takes top or fraction (an edge count), not threshold")
        keep = mag >= check_number(threshold, "threshold", low=0.0)
    else:
        k = (
            check_count(top, "top", minimum=0)
            if top is not None
            else round(check_number(fraction, "fraction", low=0.0, high=1.0) * graph.n_edges)
        )
        keep = _first(s, _order(graph, s, selection), k)
    if prune_dangling:
        keep = prune(graph, keep)
    return _circuit_of(graph, keep, s, scores, asked(top, threshold, fraction))


def _circuit_per_position(
    scores: EdgeScores,
    top: int | None,
    threshold: float | None,
    fraction: float | None,
    prune_dangling: bool,
    selection: str,
) -> Circuit:
    if selection == "greedy":
        raise ValueError("selection='greedy' takes scores of whole edges; these are per position (use 'top')")
    graph = scores.graph
    s = scores.scores.float().cpu()  # [P, E]
    flat = s.reshape(-1)
    if threshold is not None:
        keep = flat.abs().nan_to_num(-1.0) >= check_number(threshold, "threshold", low=0.0)
    else:
        k = (
            check_count(top, "top", minimum=0)
            if top is not None
            else round(check_number(fraction, "fraction", low=0.0, high=1.0) * flat.numel())
        )
        keep = _first(flat, flat.abs().nan_to_num(-1.0).argsort(descending=True), k)
    keep = keep.view(s.shape)
    if prune_dangling:
        keep = prune(graph, keep)
    return _circuit_of(graph, keep, s, scores, asked(top, threshold, fraction), depth=1)


def _order(graph: Graph, s: torch.Tensor, selection: str) -> torch.Tensor:
    """Every edge index, in the order ``selection`` takes them (NaN scores last; greedy: never)."""
    return greedy_order(graph, s) if selection == "greedy" else s.abs().nan_to_num(-1.0).argsort(descending=True)


def _first(s: torch.Tensor, order: torch.Tensor, k: int) -> torch.Tensor:
    """``[n_edges]`` bool: the first ``k`` edges of ``order`` that have a score (not NaN)."""
    keep = torch.zeros(s.shape[0], dtype=torch.bool)
    keep[order[:k]] = True
    return keep & ~s.isnan()


def asked(top: int | None, threshold: float | None, fraction: float | None) -> str:
    """What a circuit was asked to keep, for a message (``"top=0"``)."""
    return (
        f"top={top}"
        if top is not None
        else f"threshold={threshold}"
        if threshold is not None
        else f"fraction={fraction}"
    )


def _circuit_of(
    graph: Graph, keep: torch.Tensor, s: torch.Tensor, scores: EdgeScores, how: str, depth: int = 0
) -> Circuit:
    """The circuit of ``keep`` (``[n_edges]``, or ``[n_pos, n_edges]`` per position) with scores ``s`` of the
    same shape, its items by decreasing ``|score|``; a circuit of no edge warns (:class:`CircuitWarning`,
    ``how``: what was asked for; ``depth``: calls between circuit() and here)."""
    if not bool(keep.any()):
        if how.startswith("threshold"):
            why = "no edge's |score| reaches the threshold"
        elif how == "top=0" or (how.startswith("fraction") and round(float(how[9:]) * keep.numel()) == 0):
            why = "none was asked for"
        else:
            why = "every edge taken was dangling (pruned) or had no score"
        warnings.warn(
            f"the circuit ({how}) has no edges: {why}; its faithfulness is 0 by definition (the corrupted run)",
            CircuitWarning,
            stacklevel=4 + depth,  # the caller of circuit() (past the boundary's wrapper)
        )
    flat_keep, flat_s = keep.reshape(-1), s.reshape(-1)
    idx = flat_keep.nonzero()[:, 0]
    idx = idx[flat_s[idx].abs().argsort(descending=True)]
    E = graph.n_edges
    return Circuit(
        [graph.edges[i % E] for i in idx.tolist()],
        [float(flat_s[i]) for i in idx.tolist()],
        scores.method,
        scores.metric,
        graph.n_layer,
        graph.n_head,
        graph.n_kv,
        keep.numel(),
        positions=[i // E for i in idx.tolist()] if keep.ndim == 2 else None,
        n_pos=keep.shape[0] if keep.ndim == 2 else None,
        model_name=scores.model_name,
        weights=scores.weights,
        parallel=graph.parallel,
        _mask=keep.clone(),
    )


def _normalise(m: torch.Tensor, pairs: Pairs) -> torch.Tensor:
    """Pair-mean metric ``[rows, n]`` → ``(mean − corrupted) / (clean − corrupted)`` ``[rows]``."""
    clean, corr = float(pairs.clean_metric.mean()), float(pairs.corrupted_metric.mean())
    if clean == corr:
        raise ValueError("the clean and corrupted runs give the same metric: faithfulness is undefined")
    return (m.mean(1) - corr) / (clean - corr)


@boundary
def evaluate(
    model: HookedGPT2,
    circ: Circuit,
    clean: Prompts,
    corrupted: Prompts,
    metric: Metric,
    completeness: bool = True,
) -> Circuit:
    """``circ`` (a :class:`Circuit`) with its exact ``faithfulness`` (every edge outside it patched to the
    corrupted run) and, with ``completeness``, the normalised metric with only its own edges patched, on the
    prompt pairs ``clean``/``corrupted`` and ``metric`` (as :func:`~gpt2_interp.analysis.circuits.edge_scores`
    takes them). Returns a copy. A model the circuit was not found on (other sizes, or other weights when the
    circuit records them) is refused, naming both models."""
    circ.check_model(model)
    graph = graph_of(model)
    inside = circ.mask(graph)
    rows = [~inside] + ([inside] if completeness else [])
    pairs = pairs_of(model, clean, corrupted, metric)
    if circ.per_position and circ.n_pos != pairs.n_pos:
        raise ValueError(
            f"a per-position circuit of {circ.n_pos} positions cannot be evaluated on prompts of {pairs.n_pos} tokens"
        )
    values = _normalise(run_with_edges(model, graph, pairs, torch.stack(rows)), pairs)
    out = Circuit(**{k: getattr(circ, k) for k in Circuit.__dataclass_fields__})
    out.faithfulness = float(values[0])
    out.completeness = float(values[1]) if completeness else None
    return out


@boundary
@dataclass
class FaithfulnessCurve(Result):
    """Faithfulness of circuits of growing size, per scoring method.

    - ``faithfulness`` ``[n_methods, n_sizes]``; ``sizes``: requested edge counts; ``kept``
      ``[n_methods, n_sizes]``: edges left after pruning; ``methods``: labels (``eap``, ``eap-ig``, …);
    - ``total_edges`` ((position, edge) items for per-position scores); ``metric``;
      ``clean_metric``/``corrupted_metric`` (pair means).
    """

    result_kind = "faithfulness curve"

    faithfulness: torch.Tensor
    sizes: list[int]
    kept: torch.Tensor
    methods: list[str]
    total_edges: int
    metric: str
    clean_metric: float
    corrupted_metric: float

    def smallest(self, target: float = 0.8) -> dict[str, int | None]:
        """Per method, the fewest kept edges whose faithfulness reaches ``target`` (None: no size does)."""
        out: dict[str, int | None] = {}
        for i, m in enumerate(self.methods):
            ok = (self.faithfulness[i] >= target).nonzero()
            out[m] = None if ok.numel() == 0 else int(self.kept[i, ok[:, 0]].min())
        return out

    def table(self) -> str:
        """Faithfulness per size (rows) and method (columns)."""
        rows = [
            [f"{s}", *[f"{self.faithfulness[i, j]:.3f} ({int(self.kept[i, j])})" for i in range(len(self.methods))]]
            for j, s in enumerate(self.sizes)
        ]
        return "\n".join(format_table(["top edges", *[f"{m} (kept)" for m in self.methods]], rows))

    def plot(self, **kwargs: Any):
        """The curves (:func:`gpt2_interp.plots.circuits.plot_faithfulness`)."""
        from ...plots.circuits import plot_faithfulness

        return plot_faithfulness(self, **kwargs)


@boundary
def default_sizes(n_edges: int, points: int = 20) -> list[int]:
    """``points`` edge counts spaced evenly in log scale from ~0.1% of ``n_edges`` to all of them."""
    lo = max(1.0, n_edges / 1000)
    raw = torch.logspace(torch.log10(torch.tensor(lo)), torch.log10(torch.tensor(float(n_edges))), points)
    return sorted({max(1, round(float(x))) for x in raw})


@boundary
def faithfulness_curve(
    model: HookedGPT2,
    scores: EdgeScores | Sequence[EdgeScores],
    clean: Prompts,
    corrupted: Prompts,
    metric: Metric,
    sizes: Sequence[int] | int = 20,
    prune_dangling: bool = True,
    selection: Literal["top", "greedy"] = "top",
) -> FaithfulnessCurve:
    """Exact faithfulness of the top-``k`` circuit of each of ``scores`` (one per method) for every
    ``k`` in ``sizes`` (an int: that many sizes from :func:`default_sizes`), on the prompt pairs
    ``clean``/``corrupted`` and ``metric`` (as :func:`~gpt2_interp.analysis.circuits.edge_scores` takes
    them); ``prune_dangling``: prune each circuit (:func:`prune`); ``selection``: how each circuit takes
    its edges (:func:`circuit`). Per-position scores (all of them, or none) give per-position circuits of
    the top ``k`` (position, edge) items. All circuits run as rows of
    :func:`~gpt2_interp.analysis.circuits.edges.run_with_edges`."""
    results = [scores] if isinstance(scores, EdgeScores) else list(scores)
    if not results:
        raise ValueError("scores is empty: give at least one EdgeScores")
    for r in results:
        r.check_model(model)
    graph = graph_of(model)
    per = {r.per_position for r in results}
    if len(per) > 1:
        raise ValueError("give scores that are all per position or all of whole edges, not both")
    per_position = per.pop()
    if per_position and selection == "greedy":
        raise ValueError("selection='greedy' takes scores of whole edges; these are per position (use 'top')")
    n_items = graph.n_edges * (results[0].scores.shape[0] if per_position else 1)
    if isinstance(sizes, int):
        ks = default_sizes(n_items, check_count(sizes, "sizes"))
    else:
        ks = [check_count(k, f"sizes[{i}]", minimum=0) for i, k in enumerate(sizes)]
        if not ks:
            raise ValueError("sizes is empty: give the edge counts to measure (or an int: that many sizes)")
    check_choice(selection, "selection", SELECTIONS)
    masks, kept = [], []
    for r in results:
        s = r.scores.float().cpu().reshape(-1) if per_position else r.total().float()
        order = _order(graph, s, selection) if not per_position else s.abs().nan_to_num(-1.0).argsort(descending=True)
        for k in ks:  # once per method: each size takes its first k edges (or (position, edge) items)
            m = _first(s, order, k)
            if per_position:
                m = m.view(r.scores.shape)
            if prune_dangling:
                m = prune(graph, m)
            masks.append(~m)
            kept.append(int(m.sum()))
    pairs = pairs_of(model, clean, corrupted, metric)
    f = _normalise(run_with_edges(model, graph, pairs, torch.stack(masks)), pairs)
    shape = (len(results), len(ks))
    return FaithfulnessCurve(
        f.view(shape),
        [int(k) for k in ks],
        torch.tensor(kept).view(shape),
        [
            r.method
            + (f"-{r.ig_path}" if r.ig_path == "activations" else "")
            + ("-greedy" if selection == "greedy" else "")
            + ("-per-position" if per_position else "")
            for r in results
        ],
        n_items,
        metric_name(pairs.metric),
        float(pairs.clean_metric.mean()),
        float(pairs.corrupted_metric.mean()),
    )


__all__ = [
    "FAITHFUL_ENOUGH",
    "Circuit",
    "FaithfulnessCurve",
    "circuit",
    "default_sizes",
    "evaluate",
    "faithfulness_curve",
    "faithfulness_text",
    "greedy_order",
    "prune",
]
