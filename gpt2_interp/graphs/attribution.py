"""Attribution graphs: the direct effects between the nodes of a prompt's replacement model.

Nodes, in this order (circuit-tracer's): the active transcoder features ``(layer, pos, feature)`` (every
``a > 0``), one error node per ``(layer, pos)``, one token-embedding node per position, and the top output
logits at the last position (by probability, at most ``max_n_logits`` and no more than it takes to reach
``desired_logit_prob`` in total).

In the replacement model (:mod:`gpt2_interp.graphs.replacement`) every target is affine in the sources, so

    value(t) = Σ_s A[t, s] + bias(t),

with ``A[t, s]`` the direct effect of ``s`` on ``t`` through the frozen residual stream (attention with
frozen patterns, norms with frozen scales, the transcoders' skips; never through another feature):

- a feature target's value is its pre-activation ``h = x_L W_enc[:, f] + b_enc[f]``, read along ``W_enc[:, f]``
  at ``blocks.L.ln2.hook_normalized``;
- a logit target's is its de-meaned logit ``logit[v] − mean(logit)``, read along ``onehot(v) − 1/d_vocab``;
- a feature source writes ``a · W_dec[f]`` into layer ``L``'s MLP output, so ``A[t, s] = a · W_dec[f] · g_L[p]``
  with ``g_L`` the gradient of the target with respect to that output; an error source writes ``e_L[p]``
  (``A = e_L[p] · g_L[p]``) and a token node its embedding (``A = embed[p] · g_embed[p]``);
- ``bias(t)``: the constant part (biases, positional embeddings, the transcoders' ``b_dec``), the value
  with every source set to zero.

The gradients come from batched backward passes through one forward pass of ``batch_size`` copies of the
prompt: the ``b``-th copy carries one target's read direction as the gradient at its reading point, and one
backward pass gives the row ``A[t, :]`` of every target of the batch.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from einops import einsum

from ..core.boundary import boundary
from ..core.checks import check_count, check_number
from ..core.result import KIND_KEY, Result
from ..io.files import FileFormatError, read_json, write_json
from ..views.graphs import view_graph
from ..views.page import View
from .replacement import ReplacementModel
from .transcoder import TranscoderSet

if TYPE_CHECKING:
    from ..model.hooked_gpt2 import HookedGPT2

FEATURE_SLICE = 1 << 26  # floats of the [batch, features, d_model] gradient gather made at once


@boundary
@dataclass
class AttributionConfig:
    """How to build a graph: ``max_n_logits`` (10) and ``desired_logit_prob`` (0.95), which logits become
    nodes (circuit-tracer's defaults); ``batch_size``: targets per backward pass (memory: one forward pass
    of this many copies of the prompt)."""

    max_n_logits: int = 10
    desired_logit_prob: float = 0.95
    batch_size: int = 64

    def __post_init__(self) -> None:
        check_count(self.max_n_logits, "max_n_logits")
        check_number(self.desired_logit_prob, "desired_logit_prob", 0, 1, low_open=True)
        check_count(self.batch_size, "batch_size")


@boundary
@dataclass
class AttributionGraph(Result):
    """A prompt's attribution graph (see the module's docstring). ``tokens`` ``[pos]``; ``features``
    ``[n_features, 3]`` (layer, position, feature index) and their ``activations`` ``[n_features]``;
    ``logit_tokens`` and ``logit_probabilities`` ``[n_logits]``; ``adjacency`` ``[n_nodes, n_nodes]``, row
    the target, column the source, nodes ordered features, errors (layer-major, ``n_layers × pos``),
    tokens, logits. A pruned graph (:func:`~gpt2_interp.graphs.prune.prune_graph`) also has ``node_mask``
    ``[n_nodes]``, ``edge_mask`` ``[n_nodes, n_nodes]`` (the nodes and edges kept) and its
    ``replacement_score`` and ``completeness_score``.

    What the page (:meth:`view`) shows beside the numbers, each optional: ``str_tokens`` ``[pos]`` and
    ``logit_strs`` ``[n_logits]`` (the tokens as text, filled by :func:`attribute`); ``feature_labels``
    ``[n_features]`` (a name per feature, e.g. from automatic interpretation); and, filled by
    :func:`~gpt2_interp.graphs.annotate.annotate_graph` (None for a feature left out),
    ``feature_logits`` ``[n_features]`` (``{"promoted": [[token, effect], …], "suppressed": […]}``: the
    decoder row through the unembedding) and ``feature_contexts`` ``[n_features]`` (top-activating contexts,
    each ``{"tokens", "acts", "max_act", "window", "position"}`` as a feature view's)."""

    result_kind: ClassVar[str] = "attribution_graph"
    tokens: torch.Tensor
    features: torch.Tensor
    activations: torch.Tensor
    logit_tokens: torch.Tensor
    logit_probabilities: torch.Tensor
    adjacency: torch.Tensor
    n_layers: int
    node_mask: torch.Tensor | None = None
    edge_mask: torch.Tensor | None = None
    replacement_score: float | None = None
    completeness_score: float | None = None
    str_tokens: list[str] | None = None
    logit_strs: list[str] | None = None
    feature_labels: list[str] | None = None
    feature_logits: list[dict[str, Any] | None] | None = None
    feature_contexts: list[list[dict[str, Any]] | None] | None = None

    @property
    def n_features(self) -> int:
        """The number of feature nodes."""
        return len(self.features)

    @property
    def n_pos(self) -> int:
        """The prompt's length."""
        return len(self.tokens)

    def error_index(self, layer: int, pos: int) -> int:
        """The node index of the error node at ``(layer, pos)``."""
        return self.n_features + layer * self.n_pos + pos

    def token_index(self, pos: int) -> int:
        """The node index of the token node at ``pos``."""
        return self.n_features + self.n_layers * self.n_pos + pos

    def logit_index(self, i: int) -> int:
        """The node index of the ``i``-th logit node."""
        return self.n_features + (self.n_layers + 1) * self.n_pos + i

    def feature_index(self, layer: int, pos: int, feature: int) -> int:
        """The node index of feature ``feature`` at ``(layer, pos)`` (ValueError when it is not active)."""
        hit = (self.features == torch.tensor([layer, pos, feature])).all(-1).nonzero()
        if not len(hit):
            raise ValueError(f"feature {feature} at layer {layer}, position {pos} is not a node of this graph")
        return int(hit[0])

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values at full precision (float32 values as exact decimals)."""
        out: dict[str, Any] = {KIND_KEY: self.result_kind}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = (
                {"dtype": str(v.dtype).removeprefix("torch."), "data": v.tolist()} if torch.is_tensor(v) else v
            )
        return out

    def view(self, **kwargs: Any) -> View:
        """The interactive page of this graph (:func:`~gpt2_interp.views.graphs.view_graph`; ``kwargs`` go to
        it): ``.save(path)`` writes it, ``.show()`` opens it, and a notebook cell displays it."""
        fields_ = {f.name: getattr(self, f.name) for f in fields(self)}  # tensors as they are: no list copy
        return view_graph({KIND_KEY: self.result_kind, **fields_}, **kwargs)

    def save(self, path: str | Path) -> Path:
        """Write the graph as JSON with a digest (:func:`~gpt2_interp.io.files.write_json`); returns the path."""
        return write_json(path, self.to_dict(), indent=None)

    @staticmethod
    def load(path: str | Path) -> AttributionGraph:
        """The graph :meth:`save` wrote to ``path`` (its digest checked)."""
        d = read_json(path, "attribution graph", required=[f.name for f in fields(AttributionGraph)][:7])
        if d.get(KIND_KEY) != AttributionGraph.result_kind:
            raise FileFormatError(f"{path} holds a {d.get(KIND_KEY)!r} result, not an attribution graph")
        kw: dict[str, Any] = {}
        for f in fields(AttributionGraph):
            v = d.get(f.name)
            kw[f.name] = torch.tensor(v["data"], dtype=getattr(torch, v["dtype"])) if isinstance(v, dict) else v
        return AttributionGraph(**kw)


def _select_logits(logits: torch.Tensor, cfg: AttributionConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The top tokens ``[n]`` and probabilities ``[n]`` of last-position ``logits`` ``[d_vocab]``."""
    probs = logits.float().softmax(-1)
    top_p, top_i = probs.topk(min(cfg.max_n_logits, len(probs)))
    n = int((top_p.cumsum(0) < cfg.desired_logit_prob).sum()) + 1
    return top_i[:n], top_p[:n]


@boundary
def attribute(
    model: HookedGPT2,
    transcoders: TranscoderSet,
    tokens: torch.Tensor,
    cfg: AttributionConfig | None = None,
) -> AttributionGraph:
    """The unpruned :class:`AttributionGraph` of the prompt ``tokens`` ``[pos]`` (see the module's
    docstring): the replacement model is built and run once on ``cfg.batch_size`` copies, then one backward
    pass per batch of targets (features and logits) fills their rows of the adjacency (the feature sources'
    columns read in slices, so that no gather exceeds ``FEATURE_SLICE`` floats)."""
    cfg = cfg or AttributionConfig()
    rm = ReplacementModel(model, transcoders, tokens)
    n_layers, pos = model.cfg.n_layer, rm.n_pos
    active = [a.nonzero() for a in rm.activations]  # per layer [k_L, 2]: (position, feature)
    feats = torch.cat([torch.cat([torch.full_like(ix[:, :1], L), ix], 1) for L, ix in enumerate(active)]).cpu()
    acts = [a[ix[:, 0], ix[:, 1]] for a, ix in zip(rm.activations, active)]
    logit_tokens, logit_probs = _select_logits(rm.logits[-1], cfg)
    n_f, n_logits = len(feats), len(logit_tokens)
    n = n_f + (n_layers + 1) * pos + n_logits
    adjacency = torch.zeros(n, n)
    targets = [*range(n_f), *range(n - n_logits, n)]
    B = min(cfg.batch_size, len(targets))
    run = rm.run(batch=B)
    outputs = [*run.mlp_inputs, run.logits]
    d_vocab = run.logits.shape[-1]
    for start in range(0, len(targets), B):
        chunk = targets[start : start + B]
        grads = [torch.zeros_like(o) for o in outputs]
        for b, t in enumerate(chunk):
            if t < n_f:
                L, p, f = (int(v) for v in feats[t])
                grads[L][b, p] = transcoders[L].W_enc[:, f].detach()
            else:
                grads[-1][b, -1] = -1 / d_vocab
                grads[-1][b, -1, int(logit_tokens[t - (n - n_logits)])] += 1
        probes = [*run.mlp_probes, run.embed_probe]
        got = torch.autograd.grad(outputs, probes, grads, retain_graph=True, allow_unused=True)
        g = [torch.zeros_like(p) if x is None else x for p, x in zip(probes, got)]
        cols = []
        for L in range(n_layers):  # feature sources: a · W_dec[f] · g_L[p], in slices of features
            step = max(1, FEATURE_SLICE // (B * model.cfg.d_model))
            for i in range(0, len(active[L]), step):
                p_ix, f_ix = active[L][i : i + step, 0], active[L][i : i + step, 1]
                w_dec = transcoders[L].W_dec.detach()[f_ix]
                cols.append(einsum(g[L][:, p_ix], w_dec, "b k d, k d -> b k") * acts[L][i : i + step])
        cols += [einsum(g[L], rm.errors[L], "b p d, p d -> b p") for L in range(n_layers)]
        cols.append(einsum(g[-1], rm.embed.float(), "b p d, p d -> b p"))
        rows = torch.cat(cols, 1)[: len(chunk)]
        adjacency[torch.tensor(chunk), : n - n_logits] = rows.detach().float().cpu()
    return AttributionGraph(
        tokens=rm.tokens.cpu(),
        features=feats,
        activations=torch.cat(acts).detach().float().cpu(),
        logit_tokens=logit_tokens.cpu(),
        logit_probabilities=logit_probs.cpu(),
        adjacency=adjacency,
        n_layers=n_layers,
        str_tokens=[model.tokenizer.decode([i]) for i in rm.tokens.tolist()],
        logit_strs=[model.tokenizer.decode([i]) for i in logit_tokens.tolist()],
    )


__all__ = ["AttributionConfig", "AttributionGraph", "attribute"]
