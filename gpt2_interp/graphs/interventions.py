"""Interventions that test an attribution graph: set or scale features and compare what follows with what the
graph predicts.

An intervention changes features ``(layer, position, feature)`` of a graph — one, or a group (a *supernode*)
— to new activations: ``value`` (each set to it) or ``scale`` (each multiplied by it). With ``a_s`` a
feature's clean activation and ``Δ_s = new_s − a_s`` its change, the same change is measured four ways:

- **the graph, direct** (``graph_direct``): a target's change through the intervened features' own edges,
  ``Σ_s A[t, s] Δ_s / a_s`` (an edge is the effect of the whole activation ``a_s``, so ``A[t, s] / a_s`` is the
  effect per unit);
- **the graph, direct and indirect** (``graph_total``): the same change carried on through the feature nodes
  in layer order, each active feature's activation moving with its pre-activation (slope 1, the transcoders'
  nonlinearity linearised at the clean point; intervened features keep their set change);
- **the frozen replacement model** (:class:`~gpt2_interp.graphs.replacement.ReplacementModel`: attention
  patterns, norm scales and error terms frozen): with the downstream features held at their clean
  activations (``frozen_held``) only the intervened writes change, so every downstream node moves by exactly
  ``graph_direct``; with them free (``frozen_free``) each layer's features are recomputed by its transcoder
  from that run's MLP input (the intervened ones set to their new values), the transcoders' nonlinearity live;
- **the real model** (``real``): live attention, norms and MLPs, with ``Δ_s · W_dec[f]`` added to layer
  ``L``'s ``hook_mlp_out`` at position ``p``. What the transcoder misses stays in the MLP's output (the error
  is the model's own), so an intervention that changes nothing leaves the model's logits exactly as they
  are. ``Δ_s`` is the clean run's: a group spanning several layers adds each member's clean change (the
  frozen runs and the graph set each member's value).

Logit changes are those of de-meaned logits (logit − mean logit, the value of the graph's logit nodes) at the
last position; a feature node's change is that of its pre-activation.

:func:`two_hop_check` asks one question of a two-hop prompt's graph (:mod:`gpt2_interp.facts.two_hop`): are
there features of the bridge entity (features whose top logit effects promote its token), and does
suppressing them move the answer in the real model?
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ..core.boundary import boundary
from ..core.checks import check_count, check_number
from ..core.result import Result
from ..core.tables import format_table
from ..facts.templates import templates
from ..facts.two_hop import TwoHopCase
from ..views.interventions import view_intervention, view_two_hop_check
from ..views.page import View
from .attribution import AttributionGraph
from .clt import CrossLayerTranscoder
from .replacement import ReplacementModel
from .transcoder import TARGET_HOOK, TranscoderSet

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..model.hooked_gpt2 import HookedGPT2

#: A feature of a graph: ``(layer, position, feature index)``.
FeatureKey = tuple[int, int, int]


def _fmt(x: float) -> str:
    return "—" if math.isnan(x) else f"{x:+.4f}"


@boundary
@dataclass
class InterventionResult(Result):
    """What an intervention did (see the module's docstring). ``features`` ``[k, 3]`` (layer, position,
    feature), their clean activations ``old`` and set ones ``new`` ``[k]``; ``tokens`` ``[n]`` the tracked
    tokens (``token_strs`` as text) and, per token, the change of its de-meaned last-position logit:
    ``graph_direct``, ``graph_total`` (NaN for a token that is not a logit node of the graph), ``frozen_held``,
    ``frozen_free``, ``real`` ``[n]``; ``graph_pruned`` ``[n]``: ``graph_total`` through a pruned graph's kept
    edges only (None for an unpruned graph). ``prob_before``/``prob_after`` ``[n]``: the tokens'
    probabilities in the real model; ``top_before``/``top_after``: its most probable tokens ``(token, p)``.
    Per feature node of the graph ``[n_features]``, the change of its pre-activation: ``node_direct`` (the
    graph's direct prediction), ``node_held`` (the frozen model with downstream features held, which equals
    it), ``node_total`` (the graph's direct and indirect prediction) and ``node_free`` (the frozen model with
    features free)."""

    result_kind: ClassVar[str] = "graph_intervention"
    features: torch.Tensor
    old: torch.Tensor
    new: torch.Tensor
    tokens: torch.Tensor
    token_strs: list[str]
    graph_direct: torch.Tensor
    graph_total: torch.Tensor
    frozen_held: torch.Tensor
    frozen_free: torch.Tensor
    real: torch.Tensor
    prob_before: torch.Tensor
    prob_after: torch.Tensor
    top_before: list[tuple[str, float]]
    top_after: list[tuple[str, float]]
    node_direct: torch.Tensor
    node_held: torch.Tensor
    node_total: torch.Tensor
    node_free: torch.Tensor
    graph_pruned: torch.Tensor | None = None
    _direct_error: float | None = field(default=None, repr=False)  # read back from JSON: measured at full precision

    @property
    def direct_error(self) -> float:
        """The largest ``|node_held − node_direct|`` over the feature nodes and tracked logit nodes, divided by
        the largest ``|node_direct|`` there (0 when nothing moves): how far the frozen model is from the
        graph's edges. A result read back from its JSON (:meth:`from_dict`) gives the value stored there, which
        was measured at full precision (the stored changes hold 6 significant digits)."""
        if self._direct_error is not None:
            return self._direct_error
        pred = torch.cat([self.node_direct, self.graph_direct[~self.graph_direct.isnan()]])
        got = torch.cat([self.node_held, self.frozen_held[~self.graph_direct.isnan()]])
        scale = float(pred.abs().max()) if len(pred) else 0.0
        return float((got - pred).abs().max()) / scale if scale > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values (:meth:`Result.to_dict`), a graph prediction of a token that is not a
        logit node (NaN) as None, and ``direct_error``."""
        d = super().to_dict()
        for name in ("graph_direct", "graph_total", "graph_pruned"):
            if d[name] is not None:
                d[name] = [None if math.isnan(v) else v for v in d[name]]
        d["direct_error"] = float(f"{self.direct_error:.6g}")
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> InterventionResult:
        """The result back from its JSON form (:meth:`to_dict`; None as NaN), e.g. to draw a saved result's
        figure. ``direct_error`` is kept as stored; other keys that are not fields (the kind) are ignored."""

        def floats(name: str, dtype: torch.dtype = torch.float64) -> torch.Tensor:
            return torch.tensor([math.nan if v is None else float(v) for v in d[name]], dtype=dtype)

        return cls(
            features=torch.tensor(d["features"], dtype=torch.long).reshape(-1, 3),
            old=floats("old", torch.float32),
            new=floats("new", torch.float32),
            tokens=torch.tensor(d["tokens"], dtype=torch.long).reshape(-1),
            token_strs=[str(t) for t in d["token_strs"]],
            graph_direct=floats("graph_direct"),
            graph_total=floats("graph_total"),
            frozen_held=floats("frozen_held"),
            frozen_free=floats("frozen_free"),
            real=floats("real"),
            prob_before=floats("prob_before"),
            prob_after=floats("prob_after"),
            top_before=[(str(t), float(p)) for t, p in d["top_before"]],
            top_after=[(str(t), float(p)) for t, p in d["top_after"]],
            node_direct=floats("node_direct"),
            node_held=floats("node_held"),
            node_total=floats("node_total"),
            node_free=floats("node_free"),
            graph_pruned=None if d.get("graph_pruned") is None else floats("graph_pruned"),
            _direct_error=None if d.get("direct_error") is None else float(d["direct_error"]),
        )

    def plot(self, **kwargs: Any) -> Figure:
        """Each tracked token's logit change as the graph predicts it and as the frozen and the real model
        measure it, the graph's prediction against the measured changes, and the real model's top tokens
        before and after (:func:`~gpt2_interp.plots.interventions.plot_intervention`; ``kwargs`` go to it)."""
        from ..plots.interventions import plot_intervention

        return plot_intervention(self, **kwargs)

    def view(self, **kwargs: Any) -> View:
        """The interactive page of this result (:func:`~gpt2_interp.views.interventions.view_intervention`;
        ``kwargs`` go to it): ``.save(path)`` writes it, ``.show()`` opens it, and a notebook cell displays it."""
        return view_intervention(self, **kwargs)

    def table(self) -> str:
        """The features changed, then one row per tracked token (its logit's change each way, its probability
        in the real model before and after), then the real model's top tokens before and after."""
        lines = [
            "intervention: "
            + ", ".join(
                f"L{L} p{p} F{f} {float(o):.3f} → {float(n):.3f}"
                for (L, p, f), o, n in zip(self.features.tolist(), self.old, self.new)
            ),
            f"frozen model, downstream held, vs the graph's edges: largest difference {self.direct_error:.1e} "
            "of the largest change",
        ]
        head = ["token", "graph direct", "frozen held", "graph total"]
        head += ["pruned graph"] * (self.graph_pruned is not None) + ["frozen free", "real", "p before", "p after"]
        rows = []
        for i, s in enumerate(self.token_strs):
            row = [repr(s), _fmt(float(self.graph_direct[i])), _fmt(float(self.frozen_held[i]))]
            row.append(_fmt(float(self.graph_total[i])))
            if self.graph_pruned is not None:
                row.append(_fmt(float(self.graph_pruned[i])))
            row += [_fmt(float(self.frozen_free[i])), _fmt(float(self.real[i]))]
            row += [f"{float(self.prob_before[i]):.4f}", f"{float(self.prob_after[i]):.4f}"]
            rows.append(row)
        lines += format_table(head, rows, right=[False] + [True] * (len(head) - 1), indent="")
        for name, top in (("real model top before", self.top_before), ("real model top after", self.top_after)):
            lines.append(f"{name}: " + ", ".join(f"{t!r} {p:.3f}" for t, p in top))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"InterventionResult(\n{self.table()}\n)"


def _check_features(
    graph: AttributionGraph, transcoders: TranscoderSet | CrossLayerTranscoder, features: Any
) -> tuple[list[FeatureKey], list[int]]:
    """``features`` (one ``(layer, position, feature)`` or a list of them) as a list, and their node indices;
    a ValueError naming the first bad value."""
    if isinstance(features, tuple) and len(features) == 3 and all(isinstance(x, int) for x in features):
        features = [features]
    if not isinstance(features, (list, tuple)) or not features:
        raise ValueError(f"features must be a (layer, position, feature) or a non-empty list of them, got {features!r}")
    keys: list[FeatureKey] = []
    for item in features:
        if not isinstance(item, (tuple, list)) or len(item) != 3 or not all(isinstance(x, int) for x in item):
            raise ValueError(f"features: each must be (layer, position, feature) ints, got {item!r}")
        L, p, f = (int(x) for x in item)
        if not 0 <= L < graph.n_layers:
            raise ValueError(f"features: layer {L} is out of range: the graph has layers 0..{graph.n_layers - 1}")
        if not 0 <= p < graph.n_pos:
            raise ValueError(f"features: position {p} is out of range: the prompt has positions 0..{graph.n_pos - 1}")
        d_tc = transcoders.d_sae(L)
        if not 0 <= f < d_tc:
            raise ValueError(
                f"features: feature {f} is out of range: layer {L}'s transcoder has features 0..{d_tc - 1}"
            )
        if (L, p, f) in keys:
            raise ValueError(f"features: ({L}, {p}, {f}) is given twice")
        keys.append((L, p, f))
    nodes = []
    for L, p, f in keys:
        try:
            nodes.append(graph.feature_index(L, p, f))
        except ValueError:
            raise ValueError(
                f"features: ({L}, {p}, {f}) is not a node of the graph (inactive on this prompt, or at position 0): "
                "the graph predicts nothing for it"
            ) from None
    return keys, nodes


def _propagate(graph: AttributionGraph, adjacency: torch.Tensor, nodes: list[int], delta: torch.Tensor):
    """``(direct, total)`` ``[n_nodes]`` changes of every node's value for activation changes ``delta`` ``[k]``
    of the feature ``nodes``: through their own edges, and through the feature nodes in layer order."""
    n_f = graph.n_features
    per_unit = adjacency[:, :n_f] / graph.activations.clamp_min(1e-30)  # [n_nodes, n_features]
    start = torch.zeros(n_f, dtype=per_unit.dtype)
    start[nodes] = delta.to(per_unit.dtype)
    direct = per_unit @ start
    change = start.clone()
    clamped = torch.zeros(n_f, dtype=torch.bool)
    clamped[nodes] = True
    layers = graph.features[:, 0]
    for L in range(graph.n_layers):  # sources of layer L's nodes lie in earlier layers: one pass is exact
        here = (layers == L) & ~clamped
        change[here] = per_unit[:n_f][here] @ change
    return direct, per_unit @ change


def _demeaned(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``logits[..., tokens] − mean(logits)`` of last-position logits ``[..., d_vocab]``."""
    logits = logits.double()
    return logits[..., tokens] - logits.mean(-1, keepdim=True)


@boundary
def intervene(
    model: HookedGPT2,
    transcoders: TranscoderSet | CrossLayerTranscoder,
    graph: AttributionGraph,
    features: FeatureKey | list[FeatureKey],
    scale: float | None = None,
    value: float | None = None,
    tokens: list[int] | None = None,
    top: int = 5,
) -> InterventionResult:
    """Set (``value``) or scale (``scale``; give exactly one) the graph's feature ``features`` — one
    ``(layer, position, feature)`` or a group — and measure the change of the de-meaned logits of ``tokens``
    (token ids; the graph's logit nodes when None) and of every feature node's pre-activation, in the graph,
    the frozen replacement model and the real model (see the module's docstring): an
    :class:`InterventionResult`. ``top``: the real model's most probable tokens shown before and after.
    ``graph`` is the graph of ``model`` with ``transcoders`` (pruned or not); each feature must be one of its
    nodes (active on its prompt, from position 1 on unless it was built with position 0's features)."""
    transcoders.check_model(model)
    if transcoders.n_layers != graph.n_layers:
        raise ValueError(f"transcoders: {transcoders.n_layers} layers for a graph of n_layers={graph.n_layers}")
    keys, nodes = _check_features(graph, transcoders, features)
    if (scale is None) == (value is None):
        raise ValueError(f"give exactly one of scale and value, got scale={scale!r}, value={value!r}")
    top = check_count(top, "top")
    old = graph.activations[nodes].double()
    if scale is not None:
        new = old * check_number(scale, "scale")
    else:
        new = torch.full_like(old, check_number(value, "value"))
    d_vocab = model.cfg.d_vocab
    track = graph.logit_tokens.tolist() if tokens is None else list(tokens)
    for t in track:
        if not 0 <= t < d_vocab:
            raise ValueError(f"tokens: token id {t} is out of range: the vocabulary has ids 0..{d_vocab - 1}")
    ids = torch.tensor(track, dtype=torch.long)
    delta = new - old
    n_f = graph.n_features
    logit_node = {int(t): graph.logit_index(i) for i, t in enumerate(graph.logit_tokens.tolist())}
    adjacency = graph.adjacency.double()
    direct, total = _propagate(graph, adjacency, nodes, delta)
    pruned = None
    if graph.edge_mask is not None:
        pruned = _propagate(graph, adjacency * graph.edge_mask, nodes, delta)[1]

    def at_logits(change: torch.Tensor) -> torch.Tensor:
        return torch.tensor(
            [float(change[logit_node[t]]) if t in logit_node else math.nan for t in track], dtype=torch.float64
        )

    # the frozen replacement model: features held (inputs) and free (recomputed, the intervened ones set)
    rm = ReplacementModel(model, transcoders, graph.tokens)
    by_layer: dict[int, list[tuple[int, int, float]]] = {}
    for (L, p, f), v in zip(keys, new.tolist()):
        by_layer.setdefault(L, []).append((p, f, v))
    held = [a.clone() for a in rm.activations]
    for L, items in by_layer.items():
        for p, f, v in items:
            held[L][p, f] = v

    def clamp(layer: int, a: torch.Tensor) -> torch.Tensor:
        if layer not in by_layer:
            return a
        a = a.clone()
        for p, f, v in by_layer[layer]:
            a[:, p, f] = v
        return a

    @torch.no_grad()
    def node_pre(run: Any) -> torch.Tensor:
        pre = run.pre_acts(transcoders)
        return torch.stack([pre[L][0, p, f] for L, p, f in graph.features.tolist()]).double().cpu()

    with torch.no_grad():  # logits in the model's dtype (the run's own are float32 or finer)
        clean_run = rm.run(grad=False, unembed=False)
        held_run = rm.run(grad=False, activations=held, unembed=False)
        free_run = rm.run(grad=False, live=clamp, unembed=False)
        ids_dev = ids.to(clean_run.final.device)
        base, frozen_held, frozen_free = (
            _demeaned(model.unembed(r.final[0, -1]), ids_dev).cpu() for r in (clean_run, held_run, free_run)
        )
    frozen_held, frozen_free = frozen_held - base, frozen_free - base
    pre0 = node_pre(clean_run) if n_f else torch.zeros(0, dtype=torch.float64)
    node_held = node_pre(held_run) - pre0 if n_f else pre0
    node_free = node_pre(free_run) - pre0 if n_f else pre0

    # the real model: Δ · W_dec[f] added to the MLP output of each layer the feature writes (a per-layer
    # transcoder's: its own; a CLT's: its own and every later one) at the feature's position
    adds: dict[int, torch.Tensor] = {}
    for (L, p, f), d in zip(keys, delta.tolist()):
        w = transcoders.decoder_weight(L).detach()[f]  # [n_out, d_model]
        for j in range(len(w)):
            add = adds.setdefault(L + j, torch.zeros(rm.n_pos, w.shape[-1], dtype=w.dtype, device=w.device))
            add[p] += d * w[j]

    def add_hook(layer: int) -> Any:
        def hook(x: torch.Tensor, hook: Any) -> torch.Tensor:
            return x + adds[layer].to(x.dtype)

        return hook

    with torch.no_grad():
        before = model(graph.tokens[None].to(model.device))[0, -1]
        with model.hooks([(TARGET_HOOK.format(layer=L), add_hook(L)) for L in adds]):
            after = model(graph.tokens[None].to(model.device))[0, -1]
    ids_dev = ids.to(before.device)
    real = (_demeaned(after, ids_dev) - _demeaned(before, ids_dev)).cpu()
    p_before, p_after = before.double().softmax(-1).cpu(), after.double().softmax(-1).cpu()

    def top_tokens(p: torch.Tensor) -> list[tuple[str, float]]:
        vals, idx = p.topk(min(top, len(p)))
        return [(model.tokenizer.decode([i]), float(v)) for i, v in zip(idx.tolist(), vals)]

    return InterventionResult(
        features=torch.tensor(keys, dtype=torch.long).reshape(-1, 3),
        old=old.float(),
        new=new.float(),
        tokens=ids,
        token_strs=[model.tokenizer.decode([t]) for t in track],
        graph_direct=at_logits(direct),
        graph_total=at_logits(total),
        frozen_held=frozen_held,
        frozen_free=frozen_free,
        real=real,
        prob_before=p_before[ids],
        prob_after=p_after[ids],
        top_before=top_tokens(p_before),
        top_after=top_tokens(p_after),
        node_direct=direct[:n_f],
        node_held=node_held,
        node_total=total[:n_f],
        node_free=node_free,
        graph_pruned=None if pruned is None else at_logits(pruned),
    )


@boundary
@dataclass
class TwoHopCheck(Result):
    """The two-hop check of one prompt's graph (:func:`two_hop_check`): the ``prompt``, its ``bridge`` entity
    and ``answer`` (each ``" " + name``), the answer's probability ``answer_prob`` and rank ``answer_rank`` (0:
    the top token) in the model; ``first_hop_prob`` and ``second_hop_prob``: the model's probability of the
    bridge after the first fact's own prompt and of the answer after the second's (does it know each hop?);
    the bridge features ``bridge_features`` ``[m, 3]`` (layer, position, feature), their activations
    ``bridge_activations`` and the bridge token's rank among each one's promoted tokens ``bridge_ranks``
    ``[m]``; ``suppressed``: setting them all to zero (:func:`intervene`, tracking the answer and the bridge),
    None when there are none."""

    result_kind: ClassVar[str] = "two_hop_check"
    prompt: str
    bridge: str
    answer: str
    answer_prob: float
    answer_rank: int
    first_hop_prob: float
    second_hop_prob: float
    bridge_features: torch.Tensor
    bridge_activations: torch.Tensor
    bridge_ranks: torch.Tensor
    suppressed: InterventionResult | None

    @property
    def present(self) -> bool:
        """Whether the graph has features of the bridge entity."""
        return len(self.bridge_features) > 0

    def to_dict(self) -> dict[str, Any]:
        """The fields as JSON-ready values, ``suppressed`` as its own dict."""
        d = super().to_dict()
        d["suppressed"] = None if self.suppressed is None else self.suppressed.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TwoHopCheck:
        """The check back from its JSON form (:meth:`to_dict`), ``suppressed`` through
        :meth:`InterventionResult.from_dict`."""
        return cls(
            prompt=str(d["prompt"]),
            bridge=str(d["bridge"]),
            answer=str(d["answer"]),
            answer_prob=float(d["answer_prob"]),
            answer_rank=int(d["answer_rank"]),
            first_hop_prob=float(d["first_hop_prob"]),
            second_hop_prob=float(d["second_hop_prob"]),
            bridge_features=torch.tensor(d["bridge_features"], dtype=torch.long).reshape(-1, 3),
            bridge_activations=torch.tensor(d["bridge_activations"], dtype=torch.float32).reshape(-1),
            bridge_ranks=torch.tensor(d["bridge_ranks"], dtype=torch.long).reshape(-1),
            suppressed=None if d.get("suppressed") is None else InterventionResult.from_dict(d["suppressed"]),
        )

    def plot(self, **kwargs: Any) -> Figure:
        """The answer's and the hops' probabilities, what suppressing the bridge features does to the answer's
        and the bridge's logits (the graph's prediction beside the frozen and the real model's), and the bridge
        features' activations (:func:`~gpt2_interp.plots.interventions.plot_two_hop_check`; ``kwargs`` go to
        it)."""
        from ..plots.interventions import plot_two_hop_check

        return plot_two_hop_check(self, **kwargs)

    def view(self, **kwargs: Any) -> View:
        """The interactive page of this check (:func:`~gpt2_interp.views.interventions.view_two_hop_check`;
        ``kwargs`` go to it)."""
        return view_two_hop_check(self, **kwargs)

    def table(self) -> str:
        """The prompt, the answer's and the hops' probabilities, the bridge features, and what suppressing
        them did."""
        lines = [
            f"{self.prompt!r} → {self.answer!r} (bridge {self.bridge!r}): p {self.answer_prob:.4f}, rank "
            f"{self.answer_rank}; first hop alone p({self.bridge!r}) {self.first_hop_prob:.4f}, second hop alone "
            f"p({self.answer!r}) {self.second_hop_prob:.4f}",
            f"bridge features (promote {self.bridge!r} among their top tokens): {len(self.bridge_features)}",
        ]
        rows = [
            [f"L{L}", str(p), str(f), f"{float(a):.3f}", str(int(r))]
            for (L, p, f), a, r in zip(self.bridge_features.tolist(), self.bridge_activations, self.bridge_ranks)
        ]
        if rows:
            lines += format_table(["layer", "position", "feature", "activation", "bridge rank"], rows, indent="")
        if self.suppressed is not None:
            lines += ["suppressed (set to 0):", self.suppressed.table()]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"TwoHopCheck(\n{self.table()}\n)"


def _first_token(model: HookedGPT2, text: str) -> int:
    return int(model.to_tokens(text, prepend_bos=False)[0, 0])


@torch.no_grad()
def _prob(model: HookedGPT2, prompt: str, token: int) -> float:
    return float(model(model.to_tokens(prompt))[0, -1].double().softmax(-1)[token])


def _logit_effects(
    model: HookedGPT2, transcoders: TranscoderSet | CrossLayerTranscoder, layer: int, features: list[int]
) -> torch.Tensor:
    """``[len(features), d_vocab]``: each of layer ``layer``'s ``features``' decoders summed over the MLP outputs
    it writes (its whole write into the residual stream), through the final norm's gain and the unembedding as
    :func:`~gpt2_interp.analysis.features.sae_views.logit_effect` does for one decoder row."""
    w = transcoders.decoder_weight(layer).detach()[features].sum(1).to(model.dtype)
    gain = getattr(model.ln_final, "w", None)
    if gain is not None:
        w = w * gain.detach()
    return w @ model.W_U.detach()


@boundary
def two_hop_check(
    model: HookedGPT2,
    transcoders: TranscoderSet | CrossLayerTranscoder,
    graph: AttributionGraph,
    case: TwoHopCase,
    rank: int = 10,
) -> TwoHopCheck:
    """Whether ``graph`` (of ``case.prompt`` for ``model`` with ``transcoders``; pruned or not, every feature
    node is read) has features of the bridge entity — feature nodes among whose ``rank`` most promoted tokens
    (decoder row through the final norm's gain and the unembedding, as a graph page's top logit effects) is the
    bridge's first token, ``" " + case.bridge`` — and what setting them all to zero does to the answer in the
    real model, beside what the graph predicts (:func:`intervene`): a :class:`TwoHopCheck`."""
    rank = check_count(rank, "rank")
    transcoders.check_model(model)
    prompt_ids = model.to_tokens(case.prompt)[0].cpu()
    if not torch.equal(prompt_ids, graph.tokens.cpu()):
        raise ValueError(f"graph is not the graph of case.prompt {case.prompt!r}: its tokens differ")
    bridge, answer = _first_token(model, " " + case.bridge), _first_token(model, case.target)
    found: list[tuple[int, int]] = []  # (node, rank)
    for L in range(graph.n_layers):
        nodes = (graph.features[:, 0] == L).nonzero()[:, 0].tolist()
        for start in range(0, len(nodes), 256):
            chunk = nodes[start : start + 256]
            effects = _logit_effects(model, transcoders, L, graph.features[chunk, 2].tolist()).double()
            ranks = (effects > effects[:, bridge : bridge + 1]).sum(1).cpu()
            found += [(n, int(r)) for n, r in zip(chunk, ranks.tolist()) if r < rank]
    feats = graph.features[[n for n, _ in found]].reshape(-1, 3)
    with torch.no_grad():
        p = model(graph.tokens[None].to(model.device))[0, -1].double().softmax(-1).cpu()
    suppressed = None
    if found:
        keys = [(int(L), int(q), int(f)) for L, q, f in feats.tolist()]
        suppressed = intervene(model, transcoders, graph, keys, value=0.0, tokens=[answer, bridge])
    first_prompt = templates(case.first.relation, "train")[0].format(case.first.subject)
    second_prompt = templates(case.second.relation, "train")[0].format(case.second.subject)
    return TwoHopCheck(
        prompt=case.prompt,
        bridge=" " + case.bridge,
        answer=case.target,
        answer_prob=float(p[answer]),
        answer_rank=int((p > p[answer]).sum()),
        first_hop_prob=_prob(model, first_prompt, bridge),
        second_hop_prob=_prob(model, second_prompt, answer),
        bridge_features=feats,
        bridge_activations=graph.activations[[n for n, _ in found]],
        bridge_ranks=torch.tensor([r for _, r in found], dtype=torch.long),
        suppressed=suppressed,
    )


__all__ = ["InterventionResult", "TwoHopCheck", "intervene", "two_hop_check"]
