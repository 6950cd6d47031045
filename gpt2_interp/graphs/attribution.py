"""Attribution graphs: the direct effects between the nodes of a prompt's replacement model.

Nodes, in this order (circuit-tracer's): the active transcoder features ``(layer, pos, feature)`` (every
``a > 0`` at positions 1 and on), one error node per ``(layer, pos)``, one token-embedding node per position,
and the top output logits at the last position (by probability, at most ``max_n_logits`` and no more than
it takes to reach ``desired_logit_prob`` in total). As in circuit-tracer, position 0 (BOS, whose residual
stream has an unusually large norm and many active features) has no feature nodes and its error nodes no edges:
what its MLPs write is part of every target's constant part (``AttributionConfig.first_position_features``
makes them sources like any other position's).

In the replacement model (:mod:`gpt2_interp.graphs.replacement`) every target is affine in the sources, so

    value(t) = Σ_s A[t, s] + bias(t),

with ``A[t, s]`` the direct effect of ``s`` on ``t`` through the frozen residual stream (attention with
frozen patterns, norms with frozen scales, the transcoders' skips; never through another feature):

- a feature target's value is its pre-activation ``h = x_L W_enc[:, f] + b_enc[f]``, read along ``W_enc[:, f]``
  at ``blocks.L.ln2.hook_normalized``;
- a logit target's is its de-meaned logit ``logit[v] − mean(logit)``, read along ``W_U[:, v] − mean_v W_U``
  at the unembedding's input (``ln_final``'s output), so that no backward pass goes through the unembedding;
- a feature source writes ``a · W_dec[f]`` into layer ``L``'s MLP output, so ``A[t, s] = a · W_dec[f] · g_L[p]``
  with ``g_L`` the gradient of the target with respect to that output (a cross-layer transcoder's feature
  writes ``a · W_dec[L][f, j]`` into layer ``L + j``'s output for every ``j``, so ``A[t, s] = Σ_j a · W_dec[L][f, j] ·
  g_{L+j}[p]``); an error source writes ``e_L[p]``
  (``A = e_L[p] · g_L[p]``) and a token node its embedding (``A = embed[p] · g_embed[p]``);
- ``bias(t)``: the constant part (biases, positional embeddings, the transcoders' ``b_dec``, position 0's
  MLP outputs), the value with every source set to zero.

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
from .clt import CrossLayerTranscoder
from .replacement import ReplacementModel
from .transcoder import TranscoderSet

if TYPE_CHECKING:
    from ..model.hooked_gpt2 import HookedGPT2


@boundary
@dataclass
class AttributionConfig:
    """How to build a graph: ``max_n_logits`` (10) and ``desired_logit_prob`` (0.95), which logits become
    nodes (circuit-tracer's defaults); ``batch_size``: targets per backward pass (memory: one forward pass
    of this many copies of the prompt); ``first_position_features``: position 0's features and error terms
    are sources (False, circuit-tracer's choice: what position 0's MLPs write is constant)."""

    max_n_logits: int = 10
    desired_logit_prob: float = 0.95
    batch_size: int = 64
    first_position_features: bool = False

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
    probs = logits.to(torch.promote_types(logits.dtype, torch.float32)).softmax(-1)
    top_p, top_i = probs.topk(min(cfg.max_n_logits, len(probs)))
    n = int((top_p.cumsum(0) < cfg.desired_logit_prob).sum()) + 1
    return top_i[:n], top_p[:n]


@boundary
def attribute(
    model: HookedGPT2,
    transcoders: TranscoderSet | CrossLayerTranscoder,
    tokens: torch.Tensor,
    cfg: AttributionConfig | None = None,
) -> AttributionGraph:
    """The unpruned :class:`AttributionGraph` of the prompt ``tokens`` ``[pos]`` for ``model`` with
    ``transcoders`` (one per layer, or a cross-layer transcoder) and settings ``cfg`` (see the module's
    docstring): the replacement model is built and run once on ``cfg.batch_size`` copies, then one backward
    pass per batch of targets (features and logits), from the highest layer the batch reads down, fills their
    rows of the adjacency (a feature source's
    column is one product per position: ``g_L[p]`` ``[batch, d_model]``, or for a cross-layer transcoder the
    gradients at every output it writes concatenated ``[batch, n_out · d_model]``, times that position's
    writes)."""
    cfg = cfg or AttributionConfig()
    rm = ReplacementModel(model, transcoders, tokens)
    n_layers, pos = model.cfg.n_layer, rm.n_pos
    first = 0 if cfg.first_position_features else 1  # the first position whose MLP writes are sources
    active = [a[first:].nonzero() + torch.tensor([first, 0], device=a.device) for a in rm.activations]
    errors = [torch.cat([torch.zeros_like(e[:first]), e[first:]]) for e in rm.errors]  # [pos, d_model]
    feats = torch.cat([torch.cat([torch.full_like(ix[:, :1], L), ix], 1) for L, ix in enumerate(active)]).cpu()
    acts = [a[ix[:, 0], ix[:, 1]] for a, ix in zip(rm.activations, active)]
    logit_tokens, logit_probs = _select_logits(rm.logits[-1], cfg)
    n_f, n_logits = len(feats), len(logit_tokens)
    n = n_f + (n_layers + 1) * pos + n_logits
    adjacency = torch.zeros(n, n)
    targets = torch.cat([torch.arange(n_f), torch.arange(n - n_logits, n)])
    B = min(cfg.batch_size, len(targets))
    run = rm.run(batch=B, unembed=False)
    outputs = [*run.mlp_inputs, run.final]
    probes = [*run.mlp_probes, run.embed_probe]
    dev = run.final.device
    W_U = model.unembed.W_U.detach()  # [d_model, d_vocab]
    logit_dirs = (W_U[:, logit_tokens] - W_U.mean(1, keepdim=True)).T  # [n_logits, d_model]
    # per layer, over its active features (ordered by position): what each reads, W_enc[:, f] [k_L, d_model],
    # what each writes, a · W_dec[f] [k_L, n_out · d_model] into the MLP outputs of layers L … L + n_out − 1
    # (n_out = 1 for per-layer transcoders), and where each position's features start and end
    reads = [transcoders.encoder_weight(L).detach()[:, ix[:, 1]].T for L, ix in enumerate(active)]
    decoders = [transcoders.decoder_weight(L).detach() for L in range(n_layers)]  # [d_tc, n_out, d_model]
    writes = [(a[:, None, None] * w[ix[:, 1]]).flatten(1) for a, w, ix in zip(acts, decoders, active)]
    spans = [
        torch.searchsorted(ix[:, 0].contiguous(), torch.arange(pos + 1, device=ix.device)).tolist() for ix in active
    ]
    first_of_layer = torch.tensor([0, *torch.tensor([len(ix) for ix in active]).cumsum(0).tolist()])
    for start in range(0, len(targets), B):
        chunk = targets[start : start + B]
        rows_b = torch.arange(len(chunk))
        grads = [torch.zeros_like(o) for o in outputs]
        is_feature = chunk < n_f
        feature_t, feature_b = chunk[is_feature], rows_b[is_feature]
        for L in feats[feature_t, 0].unique().tolist():
            here = feats[feature_t, 0] == L
            t_L = feature_t[here]
            grads[L][feature_b[here].to(dev), feats[t_L, 1].to(dev)] = reads[L][(t_L - first_of_layer[L]).to(dev)]
        logit_b = rows_b[~is_feature]
        grads[-1][logit_b.to(dev), -1] = logit_dirs[(chunk[~is_feature] - (n - n_logits)).to(dev)]
        # only the outputs this chunk's targets read: the backward pass then stops at their layers' tops
        used = sorted({*feats[feature_t, 0].tolist(), *([len(outputs) - 1] if len(logit_b) else [])})
        got = torch.autograd.grad(
            [outputs[i] for i in used], probes, [grads[i] for i in used], retain_graph=True, allow_unused=True
        )
        g = [torch.zeros_like(p) if x is None else x for p, x in zip(probes, got)]
        cols = []
        for L in range(n_layers):  # feature sources: Σ_j g_{L+j}[p] · a W_dec[f, j], one product per position
            n_out = decoders[L].shape[1]
            g_out = g[L] if n_out == 1 else torch.cat(g[L : L + n_out], -1)  # [batch, pos, n_out · d_model]
            for p, (s, e) in enumerate(zip(spans[L], spans[L][1:])):
                if e > s:
                    cols.append(g_out[:, p] @ writes[L][s:e].T)
        cols += [einsum(g[L], errors[L], "b p d, p d -> b p") for L in range(n_layers)]
        cols.append(einsum(g[-1], rm.embed.to(g[-1].dtype), "b p d, p d -> b p"))
        rows = torch.cat(cols, 1)[: len(chunk)]
        adjacency[chunk, : n - n_logits] = rows.detach().float().cpu()
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
