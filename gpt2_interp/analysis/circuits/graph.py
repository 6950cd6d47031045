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

Scores and masks are ``[n_senders, n_receivers]`` matrices, ``-inf``/False where no edge exists
(``Graph.valid``); :meth:`Graph.flat` lists the edges' values in ``Graph.edges`` order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ...core.boundary import boundary

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
      heads of layer ``l`` read at and write after ``2l + 1``, its MLP at ``2l + 2``); an edge exists
      where the sender's stage is below the receiver's (``valid`` ``[n_senders, n_receivers]``);
    - ``groups``: the receivers by hook point (:class:`Receivers`), in forward order;
    - ``n_layer``, ``n_head``, ``n_kv``: the model's sizes.
    """

    def __init__(self, n_layer: int, n_head: int, n_kv: int) -> None:
        self.n_layer, self.n_head, self.n_kv = n_layer, n_head, n_kv
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
            add("mlp", l, f"blocks.{l}.hook_mlp_in", [f"m{l}"], 2 * l + 2)
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

    def fits(self, model: HookedGPT2) -> None:
        """Refuse (ValueError, one line) a model whose sizes are not this graph's."""
        c = model.cfg
        if (c.n_layer, c.n_head, c.n_kv) != (self.n_layer, self.n_head, self.n_kv):
            raise ValueError(
                f"this graph is for {self.n_layer} layers × {self.n_head} heads ({self.n_kv} KV heads); the model "
                f"has {c.n_layer} × {c.n_head} ({c.n_kv} KV heads): build the graph with graph_of(model)"
            )

    def describe(self) -> str:
        """``"graph: 301 senders, 481 receivers, 72 000 edges (30 layers × 9 heads, 3 KV heads)"``."""
        return (
            f"graph: {self.n_senders} senders, {self.n_receivers} receivers, {self.n_edges} edges "
            f"({self.n_layer} layers × {self.n_head} heads, {self.n_kv} KV heads)"
        )

    def __repr__(self) -> str:
        return f"Graph({self.describe()})"


@boundary
def graph_of(model: HookedGPT2) -> Graph:
    """The sender/receiver :class:`Graph` of ``model`` (GPT-2 and Llama-family configs alike; under
    grouped-query attention the key and value receivers are the ``n_kv`` KV heads)."""
    c = model.cfg
    return Graph(c.n_layer, c.n_head, c.n_kv)


__all__ = ["INPUT_KINDS", "Graph", "Receivers", "graph_of"]
