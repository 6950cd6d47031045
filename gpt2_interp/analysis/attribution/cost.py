"""What an attribution costs, counted before it runs, against the exact sweep it estimates.

Work is counted as in :mod:`~gpt2_interp.analysis.engine` (:class:`~..engine.Work`): in forward
passes of one prompt, a backward pass through ``k`` of the ``n`` blocks counting
``BACKWARD · k / n``. Per prompt pair:

* AtP: the source run (1), the base run with autograd (1), one backward pass from the metric down
  to the lowest attributed activation (``BACKWARD · (n − d) / n``, ``d``: :func:`first_gated_block`
  of the lowest attributed layer). The QK fix (``atp*`` on ``q``/``k``) adds no pass: the patched
  pattern rows are closed-form.
* AtP* with GradDrop: one more backward pass per layer of :func:`graddrop_layers`.
* IG, input path: the base and source runs (2), then per step a forward (1) and a backward.
  Activation path: the base and source runs (2), then per layer ``l`` and step a forward and a
  backward through blocks ``l…n−1``.

Exact patching (:func:`~gpt2_interp.analysis.patching.sweep_work`): the two unpatched runs, then
each patched row through the blocks and positions it changes. When that is no more than the
estimate, :func:`check_cost` warns (:class:`CostWarning`): the exact answer is then the cheaper one.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from ..engine import BACKWARD, Work
from .plan import Sweep

if TYPE_CHECKING:
    from .cells import Family


class CostWarning(UserWarning):
    """The exact computation costs no more than the estimate asked for."""


def first_gated_block(fam: Family, layer: int) -> int:
    """The first block whose residual contribution (``attn_out``, ``mlp_out``) lies downstream of
    the attributed activation at ``layer``: ``layer + 1`` for ``resid_post`` (block ``layer``'s
    outputs are already in it), 0 for the embeddings, else ``layer`` (every other activation of
    block ``layer`` feeds its ``mlp_out``; ``attn_out``/``mlp_out`` themselves are gated after
    they are read, so dropping their own layer removes their gradient)."""
    post = fam.names[layer].endswith("hook_resid_post")
    return max(layer, 0) + (1 if post else 0)


def graddrop_layers(sweep: Sweep) -> range:
    """The layers ``ℓ`` whose GradDrop pass can change some cell's estimate ``Î_ℓ``: from the lowest
    :func:`first_gated_block` of the attributed layers on. For an earlier ``ℓ`` the dropped
    contribution lies upstream of every attributed activation, so no path from them to the metric
    crosses it and ``Î_ℓ`` equals the undropped estimate exactly (the same backward graph)."""
    n = sweep.model.cfg.n_layer
    return range(min((first_gated_block(sweep.fam, l) for l in sweep.layers), default=0), n)


def backward_share(sweep: Sweep) -> float:
    """One backward pass from the metric to the lowest attributed activation, in forward passes."""
    n = sweep.model.cfg.n_layer
    low = min((first_gated_block(sweep.fam, l) for l in sweep.layers), default=0)
    return BACKWARD * (n - low) / n


def estimate_passes(sweep: Sweep) -> tuple[float, int]:
    """``(passes, forward runs)`` of one prompt pair under the sweep's method (module docstring)."""
    n = sweep.model.cfg.n_layer
    if sweep.method != "ig":
        drops = len(graddrop_layers(sweep)) if sweep.graddrop else 0
        return 2 + backward_share(sweep) * (1 + drops), 2
    m = sweep.ig_steps
    if sweep.ig_path == "input":
        return 2 + m * (1 + backward_share(sweep)), 2 + m
    share = sum((n - max(l, 0)) / n for l in sweep.layers)
    return 2 + m * (1 + BACKWARD) * share, 2 + m * len(sweep.layers)


def estimate_work(sweep: Sweep, n_pos: int, n_pairs: int) -> Work:
    """The :class:`~..engine.Work` of an attribution over ``n_pairs`` pairs of ``n_pos`` tokens."""
    passes, runs = estimate_passes(sweep)
    what = f"attribution ({sweep.method}{', GradDrop' if sweep.graddrop else ''}) of {sweep.fam.name}"
    return Work(what, runs * n_pairs, runs * n_pairs * n_pos, passes * n_pairs)


def check_cost(estimate: Work, exact: Work, stacklevel: int = 3) -> None:
    """Warn (:class:`CostWarning`) when the exact sweep ``exact`` costs no more than ``estimate``,
    stating both costs (forward passes) and their ratio."""
    if exact.passes <= estimate.passes:
        warnings.warn(
            f"{estimate.what} costs ≈ {estimate.passes:.1f} forward passes, exact patching of the same cells "
            f"≈ {exact.passes:.1f}: the estimate costs {estimate.passes / max(exact.passes, 1e-9):.1f}× the exact "
            "answer (patch() gives it)",
            CostWarning,
            stacklevel=stacklevel,
        )


__all__ = [
    "CostWarning",
    "backward_share",
    "check_cost",
    "estimate_passes",
    "estimate_work",
    "first_gated_block",
    "graddrop_layers",
]
