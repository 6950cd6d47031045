"""Edge scores: every edge's effect on the metric when it alone is patched to the corrupted run,
estimated from gradients (EAP, EAP-IG) or measured exactly (edge patching).

- ``"eap"`` (Syed et al. 2023): ``(s_corrupted − s_clean) · ∂M/∂in_r`` at the clean run, summed
  over positions — one forward and one backward pass per chunk of pairs scores every edge.
- ``"eap-ig"`` (Hanna et al. 2024): the same product with the gradient averaged over ``ig_steps``
  points of a path from the clean to the corrupted run (midpoints ``α = (i + ½)/m``). ``ig_path="inputs"``
  (the paper's): the input embedding is interpolated and the gradients are read at every receiver;
  ``ig_path="activations"``: for each receiver stage (a layer's q/k/v inputs; its MLP input, read with
  them in a parallel block and after them otherwise; the logits), only that stage's receiver inputs are
  interpolated between their clean and corrupted values, everything upstream at the clean run (one pass
  per stage and step, as node attribution's activation path).
- ``"exact"``: :func:`~gpt2_interp.analysis.circuits.edges.edge_patch` on every edge (or ``edges``).

Scores are the mean over pairs of ``M(patched) − M(clean)``: the sign says whether the corrupted
sender value raises or lowers the metric; circuits rank edges by ``|score|``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
from einops import einsum, rearrange, repeat

from ...core.boundary import boundary
from ...core.checks import check_choice, check_count
from ...core.progress import progress_bar
from ...core.result import Result
from ...core.tables import format_table
from ..attribution.readout import Readout
from ..metrics import Metric, metric_name
from ..patching import Prompts
from .edges import Pairs, edge_indices, edge_patch, pairs_of, sender_differences, split_inputs
from .graph import CircuitWarning, Graph, graph_of, refuse_other_model

if TYPE_CHECKING:
    from ...model import HookedGPT2

#: The scoring methods :func:`edge_scores` knows.
EDGE_METHODS = ("eap", "eap-ig", "exact")

#: Bytes of saved activations one gradient pass may hold (sets the pairs per pass).
GRAD_MEMORY = 1 << 30


@boundary
@dataclass
class EdgeScores(Result):
    """Scores of a model's edges for prompt pairs.

    - ``scores`` ``[n_edges]`` (mean over pairs; NaN for edges not scored by ``"exact"`` on a subset),
      or ``[n_pos, n_edges]`` with ``per_position``; ``edges``: the edge names (``"a0.h1->a2.h3<q>"``);
    - ``method`` (``eap``, ``eap-ig``, ``exact``), ``ig_steps``/``ig_path`` (EAP-IG), ``metric``'s name;
    - ``clean_metric``/``corrupted_metric``: pair means of the metric on the unpatched runs;
    - ``n_pairs``; ``graph``: the :class:`~gpt2_interp.analysis.circuits.graph.Graph` (not in JSON);
    - ``model_name``, ``weights``: the model the scores were computed on and its weights fingerprint (None:
      not recorded); :meth:`check_model` refuses another model.
    """

    result_kind = "edge scores"

    scores: torch.Tensor
    edges: list[str]
    method: str
    metric: str
    clean_metric: float
    corrupted_metric: float
    n_pairs: int
    ig_steps: int | None = None
    ig_path: str | None = None
    per_position: bool = False
    model_name: str | None = None
    weights: str | None = None
    _graph: Graph | None = field(default=None, repr=False)

    @property
    def graph(self) -> Graph:
        """The graph the scores are for."""
        assert self._graph is not None, "scores carry their graph"
        return self._graph

    def check_model(self, model: HookedGPT2) -> None:
        """Refuse (ValueError naming both models) a model these scores were not computed on: other sizes than
        their graph's, or other weights (when the fingerprint was recorded)."""
        refuse_other_model("these edge scores", self.model_name, self.weights, model, self.graph)

    def total(self) -> torch.Tensor:
        """``[n_edges]`` scores summed over positions (the scores themselves without ``per_position``)."""
        return self.scores.nansum(0) if self.per_position else self.scores

    def top(self, k: int) -> list[tuple[str, float]]:
        """The ``k`` edges of largest ``|score|``, as ``(name, score)``."""
        s = self.total()
        idx = s.abs().nan_to_num(-1.0).argsort(descending=True)[: check_count(k, "k")]
        return [(self.edges[i], float(s[i])) for i in idx.tolist()]

    def table(self, k: int = 20) -> str:
        """The top ``k`` edges as a text table."""
        rows = [[e, f"{v:+.4g}"] for e, v in self.top(k)]
        return "\n".join(format_table(["edge", f"{self.method} score"], rows))

    def plot(self, **kwargs: Any):
        """The scores as a sender × receiver heatmap (:func:`gpt2_interp.plots.circuits.plot_edge_scores`)."""
        from ...plots.circuits import plot_edge_scores

        return plot_edge_scores(self, **kwargs)


@boundary
def edge_scores(
    model: HookedGPT2,
    clean: Prompts,
    corrupted: Prompts,
    metric: Metric,
    method: Literal["eap", "eap-ig", "exact"] = "eap-ig",
    ig_steps: int = 5,
    ig_path: Literal["inputs", "activations"] = "inputs",
    per_position: bool = False,
    edges: Sequence[int] | torch.Tensor | None = None,
    batch_size: int | None = None,
    progress: bool | None = None,
) -> EdgeScores:
    """Score every edge of ``model``'s graph (:func:`graph_of`) for prompt pairs.

    ``clean``/``corrupted``: prompts or token tensors ``[n, pos]`` (each pair of equal token length);
    ``metric``: last-position logits ``[..., n, d_vocab]`` → ``[..., n]`` (e.g. ``logit_diff``);
    ``method``: ``"eap"``, ``"eap-ig"`` (``ig_steps`` points along ``ig_path``) or ``"exact"``
    (edge patching of every edge, or of ``edges`` — indices into the graph's edges — the rest NaN);
    ``per_position``: scores ``[n_pos, n_edges]``, each edge from a sender at one position to its receiver
    at that position (``"exact"``: patched at that position alone; prompts of one length);
    ``batch_size``: pairs per
    gradient pass (None: from :data:`GRAD_MEMORY`), engine rows per chunk for ``"exact"``;
    ``progress``: a progress bar (None: on a terminal). Returns :class:`EdgeScores` (CPU).
    """
    method = check_choice(method, "method", EDGE_METHODS)  # type: ignore[assignment]
    check_choice(ig_path, "ig_path", ("inputs", "activations"))
    graph = graph_of(model)
    chosen = torch.arange(graph.n_edges) if edges is None else edge_indices(edges, graph)
    if edges is not None and method != "exact":
        raise ValueError(f"edges picks the edges of method='exact'; {method} scores every edge at once (drop edges)")
    pairs = pairs_of(model, clean, corrupted, metric)
    if method == "exact":
        values = edge_patch(model, graph, pairs, chosen, batch_size, progress, per_position=per_position).mean(-1)
        scores = torch.full((pairs.n_pos, graph.n_edges) if per_position else (graph.n_edges,), float("nan"))
        scores[..., chosen] = values.T if per_position else values
    else:
        steps = check_count(ig_steps, "ig_steps") if method == "eap-ig" else 1
        scores = gradient_scores(model, graph, pairs, method, steps, ig_path, per_position, batch_size, progress)
    if method != "exact" and not bool(scores.isfinite().all()):
        bad = int((~scores.isfinite()).sum())
        warnings.warn(
            f"{bad} of {scores.numel()} {method} edge scores are NaN or inf although the metric "
            f"{metric_name(pairs.metric)!r} is finite on the clean and corrupted runs: "
            + (
                "it is not finite somewhere on the integration path between them (or its gradient is not); "
                "a circuit never takes these edges"
                if method == "eap-ig"
                else "its gradient at the clean run is not finite; a circuit never takes these edges"
            ),
            CircuitWarning,
            stacklevel=3,  # the caller of edge_scores (past the boundary's wrapper)
        )
    return EdgeScores(
        scores,
        graph.edges,
        method,
        metric_name(pairs.metric),
        float(pairs.clean_metric.mean()),
        float(pairs.corrupted_metric.mean()),
        pairs.n,
        ig_steps if method == "eap-ig" else None,
        ig_path if method == "eap-ig" else None,
        per_position,
        model_name=pairs.model_name,
        weights=pairs.weights,
        _graph=graph,
    )


def gradient_scores(
    model: HookedGPT2,
    graph: Graph,
    pairs: Pairs,
    method: str,
    steps: int,
    ig_path: str,
    per_position: bool,
    batch_size: int | None = None,
    progress: bool | None = None,
) -> torch.Tensor:
    """EAP / EAP-IG scores ``[n_edges]`` (``[n_pos, n_edges]`` with ``per_position``), mean over pairs:
    ``Σ_pairs (s_corrupted − s_clean) · mean_α ∂M/∂in_r``, in chunks of pairs."""
    graph.fits(model)
    n, P = pairs.n, pairs.n_pos
    c = model.cfg
    if batch_size is None:  # activations autograd keeps per pair: the receiver copies, the MLP, the rest
        per_pair = 4 * P * c.n_layer * (3 * (c.n_head + 2 * c.n_kv) * c.d_model + 4 * c.d_mlp + 10 * c.d_model)
        batch_size = max(1, int(GRAD_MEMORY // per_pair))
    acc = torch.zeros(P, graph.n_senders, graph.n_receivers, dtype=torch.float32, device=model.device)
    chunks = range(0, n, batch_size)
    bar = progress_bar(total=len(chunks), desc=f"{method} edge scores", leave=False, enabled=progress)
    with split_inputs(model):
        _, diff = sender_differences(model, pairs)
        for a in chunks:
            b = min(n, a + batch_size) - a
            rows = slice(a, a + b)
            readout = Readout(model, pairs.metric, (a, n), b)
            if method == "eap-ig" and ig_path == "activations":
                grads = _activation_path_grads(model, graph, pairs, rows, readout, steps)
            else:
                grads = _input_path_grads(model, graph, pairs, rows, readout, steps if method == "eap-ig" else 0)
            acc += einsum(diff[rows].float(), grads, "b p s d, b p r d -> p s r")
            bar.update()
    bar.close()
    acc = acc / n * graph.valid.to(acc.device)
    out = graph.flat(acc).cpu()
    return out if per_position else out.sum(0)


def _receiver_grads(
    model: HookedGPT2, graph: Graph, run: Any, total_of: Any, receivers: Sequence[int] | None = None
) -> dict[str, torch.Tensor]:
    """Run ``run(hooks)`` with the receivers' inputs captured, and return ``∂ total_of(resid) / ∂ in``
    for every receiver hook (``receivers``: group indices; None: all)."""
    groups = graph.groups if receivers is None else [graph.groups[i] for i in receivers]
    store: dict[str, torch.Tensor] = {}

    def keep(act: torch.Tensor, hook: Any) -> torch.Tensor:
        if not act.requires_grad:
            act = act.detach().requires_grad_(True)
        store[hook.name] = act
        return act

    resid = run([(g.name, keep) for g in groups])
    total = total_of(resid)
    names = [g.name for g in groups]
    grads = torch.autograd.grad(total, [store[nm] for nm in names], allow_unused=True)
    return {nm: (torch.zeros_like(store[nm]) if g is None else g) for nm, g in zip(names, grads)}


def _stack(graph: Graph, grads: dict[str, torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """Receiver gradients by hook → ``[b, p, n_receivers, d_model]`` (float32; zeros where absent)."""
    b, P, _, d = like.shape
    out = torch.zeros(b, P, graph.n_receivers, d, dtype=torch.float32, device=like.device)
    for g in graph.groups:
        if g.name in grads:
            x = grads[g.name].float()
            out[:, :, g.first : g.first + g.count] = x if x.ndim == 4 else x[:, :, None]
    return out


def _metric_total(readout: Readout, b: int, k: int) -> Any:
    def total(resid: torch.Tensor) -> torch.Tensor:
        logits = rearrange(readout.logits(resid), "(s b) v -> s b v", s=k)
        return sum(readout(logits[i]).sum() for i in range(k))  # type: ignore[return-value]

    return total


def _input_path_grads(
    model: HookedGPT2, graph: Graph, pairs: Pairs, rows: slice, readout: Readout, steps: int
) -> torch.Tensor:
    """``[b, p, n_receivers, d_model]``: ∂M/∂in_r at the clean run (``steps`` 0, EAP), or averaged
    over ``steps`` midpoints of the input-embedding path from the clean to the corrupted prompt."""
    n_layer = model.cfg.n_layer
    tokens, mask = pairs.clean[rows], None if pairs.mask is None else pairs.mask[rows]
    b = tokens.shape[0]
    with torch.no_grad():
        e0 = model(tokens, attention_mask=mask, stop_at_layer=0)
        e1 = model(pairs.corrupted[rows], attention_mask=mask, stop_at_layer=0)
        ref = final_resid_logits(model, tokens, mask)
    readout.bind(ref)
    alphas = [0.0] if steps == 0 else [(i + 0.5) / steps for i in range(steps)]
    total = None
    for al in alphas:
        start = (e0 + al * (e1 - e0)).detach().requires_grad_(True)

        def run(hooks: list, start: torch.Tensor = start) -> torch.Tensor:
            with model.hooks(hooks):
                return model(start, attention_mask=mask, start_at_layer=0, stop_at_layer=n_layer)

        grads = _receiver_grads(model, graph, run, _metric_total(readout, b, 1))
        g = _stack(graph, grads, e0[:, :, None])
        total = g if total is None else total + g
    assert total is not None, "at least one point on the path"
    return total / len(alphas)


def final_resid_logits(model: HookedGPT2, tokens: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Last-position logits ``[b, d_vocab]`` of ``tokens`` (a KL metric's reference)."""
    resid = model(tokens, attention_mask=mask, stop_at_layer=model.cfg.n_layer)
    return model.unembed(model.ln_final(resid[:, -1]))


def _activation_path_grads(
    model: HookedGPT2, graph: Graph, pairs: Pairs, rows: slice, readout: Readout, steps: int
) -> torch.Tensor:
    """``[b, p, n_receivers, d_model]``: per receiver stage (a layer's q/k/v inputs, its MLP input — read
    beside the q/k/v inputs in a parallel block, so interpolated with them — the logits), ∂M/∂in_r averaged
    over ``steps`` midpoints of that stage's inputs interpolated between their clean and corrupted values,
    the run started at the stage's layer from the clean residual stream (upstream unchanged, downstream
    computed)."""
    n_layer = model.cfg.n_layer
    tokens, ctok = pairs.clean[rows], pairs.corrupted[rows]
    mask = None if pairs.mask is None else pairs.mask[rows]
    names = list(
        dict.fromkeys(
            [f"blocks.{l}.hook_resid_pre" for l in range(n_layer)] + [graph.input_of(g) for g in graph.groups]
        )
    )
    with torch.no_grad():
        _, c0 = model.run_with_cache(tokens, attention_mask=mask, names_filter=names, return_type=None)
        _, c1 = model.run_with_cache(ctok, attention_mask=mask, names_filter=names, return_type=None)
        ref = final_resid_logits(model, tokens, mask)
    readout.bind(ref)
    b, P = tokens.shape
    out = torch.zeros(b, P, graph.n_receivers, model.cfg.d_model, dtype=torch.float32, device=model.device)
    alphas = torch.tensor([(i + 0.5) / steps for i in range(steps)])
    by_stage: dict[int, list[int]] = {}  # receiver stage -> its groups (all read one residual)
    for i, g in enumerate(graph.groups):
        by_stage.setdefault(int(graph.receiver_stage[g.first]), []).append(i)
    for idx in by_stage.values():
        source = graph.input_of(graph.groups[idx[0]])
        lay = min(graph.groups[idx[0]].layer, n_layer - 1)
        a0, a1 = c0[source], c1[source]
        s = alphas.numel()
        path = a0[None] + alphas.view(-1, 1, 1, 1).to(a0) * (a1 - a0)[None]  # [s, b, p, d]
        path = rearrange(path, "s b p d -> (s b) p d")
        m_rows = None if mask is None else repeat(mask, "b p -> (s b) p", s=s)
        start_resid = repeat(c0[f"blocks.{lay}.hook_resid_pre"], "b p d -> (s b) p d", s=s)
        groups = [graph.groups[i] for i in idx]

        def set_path(act: torch.Tensor, hook: Any, path: torch.Tensor = path) -> torch.Tensor:
            x = path if act.ndim == 3 else repeat(path, "b p d -> b p h d", h=act.shape[2])
            return x.detach().clone().requires_grad_(True)

        def run(
            hooks: list,
            groups: list = groups,
            start_resid: torch.Tensor = start_resid,
            lay: int = lay,
            m_rows: Any = m_rows,
        ) -> Any:
            with model.hooks([(g.name, set_path) for g in groups] + hooks):
                return model(start_resid, attention_mask=m_rows, start_at_layer=lay, stop_at_layer=n_layer)

        if groups[0].kind == "logits":
            leaf = path.detach().clone().requires_grad_(True)
            total = _metric_total(readout, b, s)(leaf)
            (g_,) = torch.autograd.grad(total, [leaf])
            grads = {groups[0].name: g_}
        else:
            grads = _receiver_grads(model, graph, run, _metric_total(readout, b, s), idx)
        for g in groups:
            x = rearrange(grads[g.name].float(), "(s b) ... -> s b ...", s=s).mean(0)
            out[:, :, g.first : g.first + g.count] = x if x.ndim == 4 else x[:, :, None]
    return out


__all__ = ["EDGE_METHODS", "GRAD_MEMORY", "EdgeScores", "edge_scores", "gradient_scores"]
