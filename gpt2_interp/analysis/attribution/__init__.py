"""Gradient attribution of activation patching: every patch estimated from a few passes, then verified.

Activation patching (:func:`~gpt2_interp.analysis.patching.patch`) runs one patched model per
cell. Attribution patching estimates all cells at once from the gradient of the metric ``M`` in
the unpatched ("base") run. For a cell ``c`` whose activation goes from ``a`` (base run) to
``a'`` (source run) when patched:

* **AtP** (Nanda 2023): ``M(patched c) − M(base) ≈ (a' − a) · ∂M/∂a``, all cells from one source
  pass, one base pass and one backward pass.
* **AtP\\*** (Kramár et al. 2024) fixes AtP's two failure modes. *QK fix*: for queries and keys the
  attention softmax saturates, so the linear step is taken from the *pattern* on: the pattern row(s)
  a patched query/key changes are recomputed exactly, ``ΔM ≈ Σ (A_patched − A) · ∂M/∂A``. For a key
  at position ``s`` only the score ``(t, s)`` of each query ``t`` moves, by ``δ = q_t·(k'_s − k_s)·scale``,
  and the new row is closed-form: ``Σ_s' ΔA_ts' G_ts' = a·(e^δ − 1)(G_ts − Σ_s' A_ts' G_ts') /
  (1 + a(e^δ − 1))`` with ``a = A_ts``. *GradDrop*: cancellation between a node's direct and indirect
  paths can hide it, so the estimate is also taken with the gradient through each layer's residual
  contribution (its ``attn_out`` and ``mlp_out``) dropped in turn, ``Î_ℓ``, and the node is ranked by
  ``(1/(L−1)) Σ_ℓ |Î_ℓ|`` (their equation 11) — a magnitude used to rank (``score``), not a signed
  estimate; ``values`` stay the QK-fixed signed estimate. The QK fix touches only ``q``/``k``;
  GradDrop applies to every family (MLPs included), but a pass whose dropped layer lies upstream of
  every attributed activation equals the undropped estimate and is not run (:mod:`.atp`).
* **IG** (integrated gradients, EAP-IG of Hanna et al. 2024): the gradient is averaged along the
  straight path from the base input embeddings to the source ones (``ig_steps`` midpoints,
  ``α = (i + ½)/m``), then multiplied by the activation difference:
  ``ΔM ≈ (a' − a) · mean_α ∂M/∂a(x(α))``. Where a cell's activation is linear in the input and the
  metric is additive over cells this converges to exact patching. In general it does *not* estimate
  one cell's patch: along the input path every other cell (upstream, and the same layer's other
  positions/heads) moves too, so IG shares out the joint clean→corrupted effect among cells
  (completeness), and a cell that matters only together with others gets credit that patching it
  alone does not show. On gpt2-facts its ρ against exact patching per pair × cell is lower than
  AtP's (mlp_out 0.61 vs 0.90) while its ρ on the mean over pairs is close; converged IG (20 steps)
  is no closer, so it is what input-path IG measures, not a discretisation or alignment error.
* **IG on the activation path** (``ig_path="activations"``): for each layer, only the attributed
  hook's activations are interpolated, ``a + α(a' − a)`` with everything upstream at the base run
  (the pass starts at that layer from the base residual stream), so the estimate integrates exactly
  the patch of that layer's cells together; where a layer has one cell (``positions="all"`` for
  position families, ``heads="all"`` for head families) it converges to exact patching. Cost: ``m``
  forward+backward passes per layer from that layer on (≈ ``m·L`` forwards for an ``L``-layer
  sweep), steps folded into the batch axis.

Every estimate comes back as an :class:`AttributionResult`, a :class:`~.patching.PatchResult` with
the same axes and labels as ``patch`` (``values`` = the estimated patched metric), so the two can
be plotted and compared cell by cell; :func:`verify` (or ``result.verify()``) runs exact batched
patching on the estimate's top cells and a random control sample.

>>> est = attribute(model, clean, corrupted, logit_diff(" Paris", " Rome"), hook="z", method="atp*")
>>> v = est.verify(k=20)          # exact patching of the top cells + controls
>>> v.spearman, v.verified_top    # rank agreement; the top-20 by exact effect

Gradients are taken with ``torch.autograd.grad`` on activations captured by temporary hooks: no
hook, ``.grad`` or ``retain_grad`` state is left on the model, also when a call raises, and it works
inside a caller's ``torch.no_grad()``. The metric must be finite on the clean and corrupted runs (as
for ``patch``) and differentiable in the logits; either failure is a ValueError naming the metric.

A package rather than sibling modules of ``analysis``: its parts serve attribution alone and share
its types (``Sweep``, ``Chunk``, ``Family``), and the public import path stays
``gpt2_interp.analysis.attribution``. One job per module (the public names are re-exported here):

- ``estimate``: :func:`attribute` — checks the options, runs the chunks of pairs, assembles the result
- ``cells``: which hooks and cells a ``hook=`` argument names (on :mod:`..hook_targets`, patching's rule),
  per-cell effects
- ``readout``: the metric of a chunk of pairs, read differentiably from the last position (and checked)
- ``plan``: the sweep's settings, a chunk of pairs, their unpatched runs
- ``grad_hooks``: hooks that capture activations for autograd, and GradDrop's gradient gate
- ``atp``: AtP and AtP* (with GradDrop) on a chunk; ``qk``: AtP*'s closed-form QK fix
- ``cost``: the passes an estimate costs against the exact sweep, counted before running
  (:class:`~.cost.CostWarning` when the exact sweep is no dearer), and the GradDrop passes that can
  change a result
- ``ig``: integrated gradients on the input path or each layer's activation path
- ``result``: :class:`AttributionResult`; ``compare``: :func:`spearman` (scipy), :func:`agreement`;
  ``verification``: :func:`verify` by exact patching
"""

from .cells import FAMILIES
from .compare import Agreement, agreement, recall, spearman, top_cells
from .cost import CostWarning
from .estimate import ATTRIBUTION_METHODS, attribute
from .result import AttributionResult
from .verification import Verification, cell_label, verify

__all__ = [
    "ATTRIBUTION_METHODS",
    "FAMILIES",
    "Agreement",
    "AttributionResult",
    "CostWarning",
    "Verification",
    "agreement",
    "attribute",
    "cell_label",
    "recall",
    "spearman",
    "top_cells",
    "verify",
]
