"""The model as a graph of senders and receivers, whose edges a circuit is made of.

Every component that *writes* to the residual stream is a **sender**: the input embedding
(``input``: token plus position embedding, the residual entering block 0), each attention head's
output (``a{l}.h{h}``: ``z_h · W_O[h]``, without the layer's output bias) and each MLP's output
(``m{l}``). Every input that *reads* it is a **receiver**: the query input of each head
(``a{l}.h{h}<q>``), the key and value inputs of each key/value head (``a{l}.h{g}<k>``,
``a{l}.h{g}<v>``; under grouped-query attention ``g`` indexes the ``n_kv`` KV heads), each MLP's
input (``m{l}``) and the final residual that the logits read (``logits``). An **edge** joins every
sender to every receiver after it: a receiver's input is the sum of its senders' outputs (plus
biases, which no patch changes), so patching an edge changes one term of one receiver's input.

The receivers' inputs are the model's split hook points (TransformerLens's
``use_split_qkv_input`` and ``use_hook_mlp_in``): ``blocks.{l}.hook_q_input``
``[batch, pos, n_head, d_model]``, ``hook_k_input``/``hook_v_input`` ``[batch, pos, n_kv, d_model]``,
``hook_mlp_in`` ``[batch, pos, d_model]``, and ``blocks.{n-1}.hook_resid_post`` for the logits.

**Parallel blocks** (GPT-NeoX with ``use_parallel_residual``, GPT-J: config ``parallel`` ``"two_norms"`` or
``"one_norm"``) add ``attn(ln1(x)) + mlp(ln(x))`` to the block's input ``x``: the MLP of layer ``l`` reads
the same residual as that layer's heads, the sum of every sender before layer ``l``, so there is no edge
``a{l}.h{h} → m{l}``; its input hook ``hook_mlp_in`` is a copy of ``hook_resid_pre`` (not ``hook_resid_mid``,
which such a block does not have). :meth:`Graph.input_of` names the residual each receiver reads.

Scores and masks are ``[n_senders, n_receivers]`` matrices, ``-inf``/False where no edge exists
(``Graph.valid``); :meth:`Graph.flat` lists the edges' values in ``Graph.edges`` order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ...core.boundary import boundary
from ...core.checks import check_count

if TYPE_CHECKING:
    from ...model import HookedGPT2

#: The receiver input kinds, in the order a block reads them.
INPUT_KINDS = ("q", "k", "v", "mlp", "logits")


@dataclass(frozen=True)
class Receivers:
    """The receivers that read one hook point: ``kind`` (``q|k|v|mlp|logits``), the block ``layer``,
    the hook ``name``, ``count`` receivers (heads or KV heads; 1 for ``mlp``/``logits``) and the
    index ``first`` of the first in :attr:`Graph.receivers`."""

    kind: str
    layer: int
    name: str
    count: int
    first: int


@boundary
class Graph:
    """The sender/receiver graph of a model (:func:`graph_of` builds it).

    - ``senders``: names, in forward order: ``input``, then per layer ``a{l}.h0…`` and ``m{l}``;
    - ``receivers``: names, per layer ``<q>`` of each head, ``<k>``/``<v>`` of each KV head, ``m{l}``, then ``logits``;
    - ``sender_stage``/``receiver_stage`` ``[n]``: position in the forward pass (``input`` 0, the
      heads of layer ``l`` read at and write after ``2l + 1``, its MLP writes after ``2l + 2`` and reads at
      ``2l + 2``, or with ``parallel`` at ``2l + 1``, beside the heads); an edge exists where the sender's
      stage is below the receiver's (``valid`` ``[n_senders, n_receivers]``);
    - ``groups``: the receivers by hook point (:class:`Receivers`), in forward order;
    - ``n_layer``, ``n_head``, ``n_kv``: the model's sizes (each ≥ 1); ``parallel``: parallel blocks (each
      MLP reads its block's input, no edge from its own layer's heads); ``model``: the name of the model the
      graph was built for (None: not known), named when another model does not fit it.
    """

    def __init__(self, n_layer: int, n_head: int, n_kv: int, model: str | None = None, parallel: bool = False) -> None:
        for what, value in (("n_layer", n_layer), ("n_head", n_head), ("n_kv", n_kv)):
            check_count(value, f"Graph(): {what}")
        if n_head % n_kv:
            raise ValueError(f"Graph(): n_kv {n_kv} must divide n_head {n_head} (each KV head serves a group of heads)")
        if not isinstance(parallel, bool):
            raise TypeError(f"Graph(): parallel must be a bool, got {parallel!r}")
        self.n_layer, self.n_head, self.n_kv, self.model, self.parallel = n_layer, n_head, n_kv, model, parallel
        self.senders = ["input"]
        stages = [0]
        for l in range(n_layer):
            self.senders += [f"a{l}.h{h}" for h in range(n_head)] + [f"m{l}"]
            stages += [2 * l + 1] * n_head + [2 * l + 2]
        self.sender_stage = torch.tensor(stages)
        self.receivers: list[str] = []
        self.groups: list[Receivers] = []
        rstages: list[int] = []

        def add(kind: str, layer: int, name: str, labels: list[str], stage: int) -> None:
            self.groups.append(Receivers(kind, layer, name, len(labels), len(self.receivers)))
            self.receivers += labels
            rstages.extend([stage] * len(labels))

        for l in range(n_layer):
            add("q", l, f"blocks.{l}.hook_q_input", [f"a{l}.h{h}<q>" for h in range(n_head)], 2 * l + 1)
            for kind in ("k", "v"):
                add(kind, l, f"blocks.{l}.hook_{kind}_input", [f"a{l}.h{g}<{kind}>" for g in range(n_kv)], 2 * l + 1)
            add("mlp", l, f"blocks.{l}.hook_mlp_in", [f"m{l}"], 2 * l + 1 if parallel else 2 * l + 2)
        add("logits", n_layer, f"blocks.{n_layer - 1}.hook_resid_post", ["logits"], 2 * n_layer + 1)
        self.receiver_stage = torch.tensor(rstages)
        self.valid = self.sender_stage[:, None] < self.receiver_stage[None, :]
        s, r = self.valid.nonzero(as_tuple=True)
        self._edge_s, self._edge_r = s, r
        self.edges = [f"{self.senders[i]}->{self.receivers[j]}" for i, j in zip(s.tolist(), r.tolist())]

    @property
    def n_senders(self) -> int:
        """Number of senders: ``1 + n_layer · (n_head + 1)``."""
        return len(self.senders)

    @property
    def n_receivers(self) -> int:
        """Number of receivers: ``n_layer · (n_head + 2 n_kv + 1) + 1``."""
        return len(self.receivers)

    @property
    def n_edges(self) -> int:
        """Number of edges (sender → later receiver)."""
        return len(self.edges)

    @property
    def edge_index(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(sender [n_edges], receiver [n_edges])`` indices of every edge, in :attr:`edges` order."""
        return self._edge_s, self._edge_r

    def flat(self, matrix: torch.Tensor) -> torch.Tensor:
        """``[..., n_senders, n_receivers]`` → ``[..., n_edges]`` (the edges' entries, in :attr:`edges` order)."""
        self._check_matrix(matrix)
        return matrix[..., self._edge_s, self._edge_r]

    def matrix(self, flat: torch.Tensor, fill: Any = 0) -> torch.Tensor:
        """``[..., n_edges]`` → ``[..., n_senders, n_receivers]``, ``fill`` where no edge exists."""
        if flat.shape[-1] != self.n_edges:
            raise ValueError(f"expected [..., {self.n_edges}] edge values for this graph, got {tuple(flat.shape)}")
        out = flat.new_full((*flat.shape[:-1], self.n_senders, self.n_receivers), fill)
        out[..., self._edge_s, self._edge_r] = flat
        return out

    def input_of(self, group: Receivers) -> str:
        """The residual-stream hook whose value is ``group``'s input before any patch (every receiver's input
        is a copy of it): ``blocks.{l}.hook_resid_pre`` for the heads' q/k/v inputs and, in parallel blocks,
        the MLP's; ``blocks.{l}.hook_resid_mid`` for a sequential block's MLP; ``blocks.{n-1}.hook_resid_post``
        for the logits."""
        if group.kind == "logits":
            return f"blocks.{self.n_layer - 1}.hook_resid_post"
        if group.kind == "mlp" and not self.parallel:
            return f"blocks.{group.layer}.hook_resid_mid"
        return f"blocks.{group.layer}.hook_resid_pre"

    def edge(self, name: str) -> int:
        """The index of edge ``name`` (``"a0.h1->a2.h3<q>"``) in :attr:`edges`; KeyError (with the
        closest names) for an unknown edge."""
        try:
            return self._edge_ids[name]
        except KeyError:
            from difflib import get_close_matches

            close = get_close_matches(name, self.edges, n=3)
            hint = f"; closest: {', '.join(close)}" if close else ""
            raise KeyError(f"no edge {name!r} in this graph ({self.n_edges} edges){hint}") from None

    @property
    def _edge_ids(self) -> dict[str, int]:
        ids = self.__dict__.get("_ids")
        if ids is None:
            ids = self.__dict__["_ids"] = {e: i for i, e in enumerate(self.edges)}
        return ids

    def _check_matrix(self, m: torch.Tensor) -> None:
        if tuple(m.shape[-2:]) != (self.n_senders, self.n_receivers):
            raise ValueError(
                f"expected [..., {self.n_senders}, {self.n_receivers}] (senders × receivers) for this graph, "
                f"got {tuple(m.shape)}"
            )

    def fits(self, model: HookedGPT2, what: str = "this graph", made_for: str | None = None) -> None:
        """Refuse (ValueError, one line naming both models) a model whose sizes are not this graph's;
        ``what`` names the object made for the graph (``"this circuit"``), ``made_for`` its model (default:
        the graph's)."""
        c = model.cfg
        par = c.parallel != "none"
        if (c.n_layer, c.n_head, c.n_kv, par) != (self.n_layer, self.n_head, self.n_kv, self.parallel):
            made_for = made_for or self.model or "a model whose name was not recorded"
            raise ValueError(
                f"{what} {_was(what)} made for {made_for} ({self.n_layer} layers × {self.n_head} heads, {self.n_kv} "
                f"KV heads{_blocks(self.parallel, par)}); the model is {c.name} ({c.n_layer} × {c.n_head}, {c.n_kv} "
                f"KV heads{_blocks(par, self.parallel)}): "
                + (
                    "build the graph with graph_of(model)"
                    if what == "this graph"
                    else "use them with their own model"
                    if _was(what) == "were"
                    else "use it with its own model"
                )
            )

    def describe(self) -> str:
        """``"graph: 301 senders, 481 receivers, 72 000 edges (30 layers × 9 heads, 3 KV heads)"`` (``, parallel
        blocks`` added for a graph of parallel blocks)."""
        return (
            f"graph: {self.n_senders} senders, {self.n_receivers} receivers, {self.n_edges} edges "
            f"({self.n_layer} layers × {self.n_head} heads, {self.n_kv} KV heads{', parallel blocks' * self.parallel})"
        )

    def __repr__(self) -> str:
        return f"Graph({self.describe()})"


@boundary
def graph_of(model: HookedGPT2) -> Graph:
    """The sender/receiver :class:`Graph` of ``model`` (GPT-2 and Llama-family configs alike; under
    grouped-query attention the key and value receivers are the ``n_kv`` KV heads).

    Parallel blocks (config ``parallel`` not ``"none"``: GPT-NeoX/Pythia with ``use_parallel_residual``,
    GPT-J) give a graph whose MLP of layer ``l`` reads the block's input, the sum of the senders before layer
    ``l``: it has every edge of the sequential graph except ``a{l}.h{h} → m{l}`` (``Graph.parallel``).

    Blocks that normalise each attention and MLP output before adding it (``norm_position`` ``"post"`` or
    ``"sandwich"``: OLMo 2, Gemma 2 and 3) have the same graph: a head's output is its share of the normalised
    attention output at the post-norm scale of the run it is read from (``g ⊙ z_h W_O[h] / σ``), so each run's
    residual stream is still the sum of its senders' outputs and the edges patch exactly.

    Refused (ValueError): a post-norm block with an attention output bias, whose normalised bias belongs to
    no head."""
    c = model.cfg
    if c.norm_position != "pre" and c.has_attn_out_bias:
        raise ValueError(
            f"edge circuits read a post-norm head's output as its share of the normalised attention output; "
            f"{c.name} adds an attention output bias before the norm (norm_position={c.norm_position!r}, "
            "has_attn_out_bias=True), which belongs to no head: use patch() per head or attribute() instead"
        )
    return Graph(c.n_layer, c.n_head, c.n_kv, model=c.name, parallel=c.parallel != "none")


class CircuitWarning(UserWarning):
    """A circuit result that is degenerate (no edges, fewer prompt pairs than asked for, scores that are
    not finite): computed, but the warning says why it may mean nothing."""


@boundary
def refuse_other_model(
    what: str, made_for: str | None, weights: str | None, model: HookedGPT2, graph: Graph | None = None
) -> None:
    """Refuse (ValueError naming both models) ``model`` where an object ``what`` (``"this circuit"``, ``"these
    edge scores"``) made for the model ``made_for`` with weights fingerprint ``weights`` meets it: other sizes than
    ``graph``'s (when given), or other weights (when the fingerprint was recorded)."""
    if graph is not None:
        graph.fits(model, what, made_for)
    if not weights:
        return
    from ...model.fingerprint import weights_fingerprint

    fp = weights_fingerprint(model)
    if fp != weights:
        it = (
            "they hold only for the weights they were"
            if _was(what) == "were"
            else "it holds only for the weights it was"
        )
        raise ValueError(
            f"{what} {_was(what)} made for {made_for or 'another model'} (weights {weights[:12]}…); the model is "
            f"{model.cfg.name} (weights {fp[:12]}…): {it} computed on, so use them with that model"
        )


def _blocks(parallel: bool, other: bool) -> str:
    """How a model's blocks read, for a message where ``other`` (the other side's) differs: ``""`` when both agree."""
    if parallel == other:
        return ""
    return ", parallel blocks" if parallel else ", sequential blocks"


def _was(what: str) -> str:
    return "were" if what.startswith("these") else "was"


@boundary
def model_identity(model: HookedGPT2) -> tuple[str, str]:
    """``(name, weights fingerprint)`` of ``model``: what a circuit, edge scores and prompt pairs record
    of the model they were made for."""
    from ...model.fingerprint import weights_fingerprint

    return model.cfg.name, weights_fingerprint(model)


__all__ = ["INPUT_KINDS", "CircuitWarning", "Graph", "Receivers", "graph_of", "model_identity", "refuse_other_model"]
