"""How an edge-level circuit is shown: when its faithfulness is too low for a claim (:data:`FAITHFUL_ENOUGH`), and
where the nodes of its graph sit: one layout for the circuit's figure (plots) and its
interactive view (views), which sit side by side below the analysis layer.

Rows in forward order: ``input`` at the bottom, layer ``l``'s attention heads on row ``2l + 1`` spread across
columns ``0 … n_head − 1``, its MLP on row ``2l + 2`` in a column of its own to the right of the heads
(:func:`mlp_x`), ``logits`` on top, centred over the heads. No node shares a column with a node one row
away, so a label above its node never runs into the node above it; edge names are the circuits graph's
(senders ``input``, ``a{l}.h{h}``, ``m{l}``; receivers ``a{l}.h{h}<q>``, ``a{l}.h{g}<k>``/``<v>``, ``m{l}``,
``logits``).
"""

from __future__ import annotations

import re

from .boundary import boundary

#: the faithfulness a circuit needs before it is read as explaining the behaviour (a common bar in the
#: circuit-discovery literature, and the ``target`` of :meth:`FaithfulnessCurve.smallest`); below it the circuit
#: is printed with a caveat
FAITHFUL_ENOUGH = 0.8


@boundary
def faithfulness_text(faithfulness: float | None, digits: int = 3) -> str:
    """``", faithfulness 0.905"``, with ``" (below 0.8: not faithful)"`` when under :data:`FAITHFUL_ENOUGH`;
    empty when not measured (None)."""
    if faithfulness is None:
        return ""
    low = f" (below {FAITHFUL_ENOUGH:g}: not faithful)" if faithfulness < FAITHFUL_ENOUGH else ""
    return f", faithfulness {faithfulness:.{digits}f}{low}"


_HEAD = re.compile(r"a(\d+)\.h(\d+)")
_RECEIVER = re.compile(r"a(\d+)\.h(\d+)<([qkv])>")

#: How far right of the last head the MLP column stands (in head columns).
MLP_GAP = 1.25


def mlp_x(n_head: int) -> float:
    """The column of every MLP node: :data:`MLP_GAP` to the right of the last head."""
    return n_head - 1 + MLP_GAP


def x_range(n_head: int) -> tuple[float, float]:
    """The horizontal extent of the graph with a margin of one column each side: heads, then the MLP column."""
    return -1.0, mlp_x(n_head) + 1.0


def row_ticks(n_layer: int) -> tuple[list[float], list[str]]:
    """The rows named on the vertical axis: ``input``, each layer's head row ``L{l}``, ``logits``."""
    return [0.0, *[2.0 * l + 1 for l in range(n_layer)], 2.0 * n_layer + 1], [
        "input",
        *[f"L{l}" for l in range(n_layer)],
        "logits",
    ]


def node_xy(name: str, n_layer: int, n_head: int) -> tuple[float, float]:
    """Where node ``name`` sits (see the module's layout): ``input`` and ``logits`` centred over the heads,
    head ``a{l}.h{h}`` at ``(h, 2l + 1)``, MLP ``m{l}`` at ``(mlp_x(n_head), 2l + 2)``."""
    mid = (n_head - 1) / 2
    if name == "input":
        return mid, 0.0
    if name == "logits":
        return mid, 2.0 * n_layer + 1
    m = _HEAD.fullmatch(name)
    if m:
        return float(m.group(2)), 2.0 * int(m.group(1)) + 1
    if re.fullmatch(r"m\d+", name):
        return mlp_x(n_head), 2.0 * int(name[1:]) + 2
    raise ValueError(f"{name!r} is not a node of a circuit graph (input, a{{l}}.h{{h}}, m{{l}}, logits)")


def receiver_port(receiver: str, n_layer: int, n_head: int, n_kv: int) -> tuple[str, float, float]:
    """``(kind, x, y)`` where an edge into ``receiver`` ends: a head's query port just below-left of the head,
    a key/value head's key and value ports below the middle of its query heads (left and right), an MLP
    or the logits at the node."""
    m = _RECEIVER.fullmatch(receiver)
    if m is None:
        kind = "logits" if receiver == "logits" else "mlp"
        return (kind, *node_xy(receiver, n_layer, n_head))
    layer, idx, kind = int(m.group(1)), int(m.group(2)), m.group(3)
    y = 2.0 * layer + 1 - 0.32
    if kind == "q":
        return kind, idx - 0.18, y
    per = n_head // max(n_kv, 1)
    return kind, idx * per + (per - 1) / 2 + (-0.06 if kind == "k" else 0.3), y


__all__ = ["MLP_GAP", "mlp_x", "node_xy", "receiver_port", "row_ticks", "x_range"]
