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
  estimate; ``values`` stay the QK-fixed signed estimate.
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

Every estimate comes back as a :class:`AttributionResult`, a :class:`~.patching.PatchResult` with
the same axes and labels as ``patch`` (``values`` = the estimated patched metric), so the two can
be plotted and compared cell by cell; :func:`verify` (or ``result.verify()``) runs exact batched
patching on the estimate's top cells and a random control sample.

>>> est = attribute(model, clean, corrupted, logit_diff(" Paris", " Rome"), hook="z", method="atp*")
>>> v = est.verify(k=20)          # exact patching of the top cells + controls
>>> v.spearman, v.verified_top    # rank agreement; the top-20 by exact effect

Gradients are taken with ``torch.autograd.grad`` on activations captured by temporary hooks: no
hook, ``.grad`` or ``retain_grad`` state is left on the model, also when a call raises, and it works
inside a caller's ``torch.no_grad()``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch
from einops import einsum, rearrange, reduce, repeat

from ..core.checks import check_count, check_index
from ..core.progress import progress_bar
from ..core.result import Result
from ..model.hooks import hook_name, layer_of, suggest
from .metrics import LogitDiff, Metric, apply_metric, bind_metric, metric_name
from .patching import PatchResult, Prompts, normalize_effects, pair_tokens, patch, position_labels, result_fields

if TYPE_CHECKING:
    from ..model import HookedGPT2

METHODS = ("atp", "atp*", "ig")
_POS_FAMILIES = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "mlp_pre", "mlp_post", "pre", "post")
_HEAD_FAMILIES = ("z", "q", "k", "v")
FAMILIES = _POS_FAMILIES + _HEAD_FAMILIES + ("pattern",)


# =============================================================== metric plumbing
def _metric(metric: Metric, logits: torch.Tensor, rows: tuple[int, int] | None = None) -> torch.Tensor:
    """``logits [b, d_vocab]`` → ``[b]`` (float), differentiable. ``rows = (first, n_pairs)`` when the
    ``b`` pairs are a chunk of ``n_pairs``: the metric (which may hold one answer per pair) sees them
    at their place among zero logits for the other pairs, whose values are dropped."""
    out = apply_metric(metric, _place(logits, rows)[None])[0]
    return out if rows is None else out[rows[0] : rows[0] + logits.shape[0]]


def _place(x: torch.Tensor, rows: tuple[int, int] | None) -> torch.Tensor:
    """Chunk rows ``x [b, ...]`` at rows ``first…first+b`` of ``n_pairs`` rows of zeros."""
    if rows is None or (rows[0] == 0 and rows[1] == x.shape[0]):
        return x
    first, n = rows
    return torch.cat([x.new_zeros(first, *x.shape[1:]), x, x.new_zeros(n - first - x.shape[0], *x.shape[1:])])


# =============================================================== what is attributed
@dataclass
class _Family:
    kind: Literal["pos", "head", "pattern"]
    name: str  # family name, e.g. "z"
    names: dict[int, str]  # layer -> hook name


def _family(model: "HookedGPT2", hook: str, layers: Sequence[int] | None) -> tuple[_Family, list[int]]:
    n = model.cfg.n_layer
    family = hook
    if "hook_" in hook or hook.startswith("blocks."):  # one full hook name
        if hook not in model.hook_dict:
            raise KeyError(f"unknown hook name {hook!r}.{suggest(hook, model.hook_names())} See model.hook_names().")
        if layers is not None:
            raise ValueError(f"hook {hook!r} is one hook point; to sweep layers pass a family name such as 'resid_pre'")
        lay = layer_of(hook)
        family = next((f for f in FAMILIES if lay is not None and hook == hook_name(f, lay)), None)
        if family is None:  # any other per-position activation [batch, pos, ...]: embeddings, MLP neurons
            if hook.startswith("ln_final") or hook.endswith("hook_attn_scores"):
                raise ValueError(f"attribution does not take {hook!r} (the final LayerNorm runs on the last position "
                                 "only; scores hold −inf): use a residual hook, or 'pattern' for attention")
            lay = -1 if lay is None else lay
            return _Family("pos", hook, {lay: hook}), [lay]
        chosen = [lay]
    else:
        if family == "attn":
            family = "pattern"
        if family in ("embed", "pos_embed"):
            return _family(model, hook_name(family), None)
        if family not in FAMILIES:
            raise KeyError(f"attribution covers the hook families {', '.join(FAMILIES)}, embed, pos_embed and full hook "
                           f"names of per-position activations, not {hook!r}.{suggest(hook, list(FAMILIES))}")
        chosen = list(range(n)) if layers is None else list(dict.fromkeys(check_index(l, n, "layer", f"the model has {n} layers") for l in layers))
    kind = "pos" if family in _POS_FAMILIES else "head" if family in _HEAD_FAMILIES else "pattern"
    return _Family(kind, family, {l: hook_name(family, l) for l in chosen}), chosen


def _rot_name(model: "HookedGPT2", layer: int, x: str) -> str:
    """The hook holding the keys/queries as they enter the scores (rotary models: ``hook_rot_{x}``)."""
    rot = f"blocks.{layer}.attn.hook_rot_{x}"
    return rot if rot in model.hook_dict else f"blocks.{layer}.attn.hook_{x}"


# =============================================================== gradient plumbing
class _Gate(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by ``keep[0]`` (read at backward time)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, keep: list) -> torch.Tensor:
        ctx.keep = keep
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.keep[0], None


def _capture(store: dict[str, torch.Tensor]):
    def fn(act: torch.Tensor, hook: Any) -> torch.Tensor | None:
        if act.requires_grad:  # already in the graph: record it, leave it
            store[hook.name] = act
            return None
        act = act.detach().requires_grad_(True)  # the first captured point starts the graph (nothing upstream is needed)
        store[hook.name] = act
        return act

    return fn


def _gate(keep: list):
    return lambda act, hook: _Gate.apply(act, keep)


class _Readout:
    """The metric of one chunk of ``b`` pairs (rows ``first…first+b`` of ``n_pairs``), read from the
    residual stream at the last position — the only logits any metric uses.

    For a logit difference only the columns of its tokens are unembedded (``[b, k]`` logits, ``k`` ≤
    ``2b`` distinct tokens, instead of ``[b, d_vocab]``): the same values without the full unembedding,
    in the forward and in the backward pass, where it is a sizeable share of a small model's cost
    (gpt2-facts: ~18% of a forward pass). Any other metric reads the full last-position logits."""

    def __init__(self, model: "HookedGPT2", metric: Metric, rows: tuple[int, int], b: int) -> None:
        self.model, self.metric, self.rows = model, metric, rows
        self.cols: torch.Tensor | None = None
        self.bound: Metric | None = None
        pre = bind_metric(metric, model)
        ids = _chunk_ids(pre, rows, b) if isinstance(pre, LogitDiff) else None
        if ids is not None:
            with torch.inference_mode(False):  # normal tensors: autograd saves these indices
                cols, inv = torch.unique(torch.cat(ids), return_inverse=True)
            self.cols = cols.to(model.device)
            self.bound = LogitDiff(inv[:b], inv[b:], pre.name)

    def logits(self, resid: torch.Tensor) -> torch.Tensor:
        """``resid [b, pos, d_model]`` (after the last block) → last-position logits ``[b, d_vocab | k]``."""
        x = self.model.ln_final(resid[:, -1])
        return self.model.unembed(x) if self.cols is None else x @ self.model.W_U[:, self.cols]

    def bind(self, reference: torch.Tensor) -> None:
        """Bind the metric; ``reference``: the clean run's logits of the chunk (a KL metric's reference)."""
        if self.cols is None:
            self.bound = bind_metric(self.metric, self.model, _place(reference, self.rows))

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` from :meth:`logits` → the metric ``[b]`` (float, differentiable)."""
        if self.bound is None:
            raise RuntimeError("bind() the readout before reading the metric")
        return _metric(self.bound, logits, None if self.cols is not None else self.rows)


def _chunk_ids(m: LogitDiff, rows: tuple[int, int], b: int) -> list[torch.Tensor] | None:
    """A bound logit difference's answer and wrong ids for the chunk's ``b`` rows, ``[b]`` each, or
    None where they are not one id or one per pair (the metric itself then reports the mismatch)."""
    first, n = rows
    out = []
    for x in (m.answer, m.wrong):
        if not isinstance(x, torch.Tensor):
            return None
        x = x.long().cpu()
        if x.ndim == 0:
            x = x.expand(b)
        elif tuple(x.shape) == (n,):
            x = x[first : first + b]
        else:
            return None
        out.append(x)
    return out


# =============================================================== per-cell estimates
def _cell_effects(fam: _Family, delta: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """First-order effect per cell: ``[b, pos]`` (pos kinds) or ``[b, pos, head]`` (per-head kinds)."""
    if fam.kind == "pos":  # [b, pos, ...]
        return (delta.float() * grad.float()).flatten(2).sum(-1)
    if fam.kind == "head":  # [b, pos, head, d_head]  (a product and a sum: einsum would make it a slow bmm)
        return (delta.float() * grad.float()).sum(-1)
    return rearrange((delta.float() * grad.float()).sum(-1), "b h q -> b q h")  # pattern [b, h, q, k]: rows = query positions


def _qk_fixed(family: str, q: torch.Tensor, k: torch.Tensor, q_src: torch.Tensor, k_src: torch.Tensor,
              pattern: torch.Tensor, scores: torch.Tensor, G: torch.Tensor, scale: float,
              together: bool) -> torch.Tensor:
    """AtP* effect of patching queries or keys, linear only from the attention pattern on.

    ``q, k`` ``[b, pos, head(_kv), d_head]`` base run (as they enter the scores), ``*_src`` the source
    run's; ``pattern``, ``scores`` (masked: −inf) and ``G = ∂M/∂pattern`` ``[b, head, q, k]``.
    Returns ``[b, pos, head(_kv)]`` (per query / key position), or with ``together`` the effect of
    patching every position at once in position 0 (``[b, 1, head(_kv)]``)."""
    H, Hk = q.shape[2], k.shape[2]
    group = H // Hk  # query heads per key/value head (grouped-query attention)
    allowed = torch.isfinite(scores)
    A, G = pattern.double(), G.double()
    if family == "q" or together:
        if family == "q":
            new = einsum(q_src.double(), k.double().repeat_interleave(group, 2), "b t h d, b s h d -> b h t s")
        else:
            new = einsum(q.double(), k_src.double().repeat_interleave(group, 2), "b t h d, b s h d -> b h t s")
        new = (new * scale).masked_fill(~allowed, float("-inf")).softmax(-1)
        per_row = ((new - A) * G).nan_to_num().sum(-1)  # [b, h, t]
        if family == "q":
            out = rearrange(per_row, "b h t -> b t h")
            return out.sum(1, keepdim=True) if together else out
        out = per_row.sum(-1)[:, None]  # [b, 1, h]
    else:
        # a key at s moves only column s: closed-form new row, see the module docstring
        dk = (k_src - k).double().repeat_interleave(group, 2)
        delta = einsum(q.double(), dk, "b t h d, b s h d -> b h t s") * scale
        delta = torch.where(allowed, delta, torch.zeros((), dtype=delta.dtype, device=delta.device)).clamp(max=600.0)
        S = (A * G).sum(-1, keepdim=True)  # [b, h, t, 1]
        e = torch.expm1(delta)
        ratio = A * e / (1 + A * e)  # δ ≤ 600 keeps e^δ finite in float64
        ratio = torch.where(allowed, ratio, torch.zeros((), dtype=ratio.dtype, device=ratio.device))
        out = rearrange((ratio * (G - S)).sum(2), "b h s -> b s h")  # sum over queries t
    if group > 1:
        out = reduce(out, "b p (hk g) -> b p hk", "sum", g=group)
    return out.float()


def _select(fam: _Family, per: torch.Tensor, positions: Any, heads: Any, P: int, H: int
            ) -> tuple[torch.Tensor, tuple[str, ...], list[int] | None, list[int] | None]:
    """``per`` ``[b, layer, pos(, head)]`` (``pos`` may be 1 = every position together) → the result's
    cells, axes as ``patch`` gives them."""
    if fam.kind == "pos":
        if heads is not None:
            raise ValueError(f"heads are for per-head hooks (z, q, k, v, pattern); {fam.name!r} has no head axis")
        if positions == "all":
            return per.sum(2, keepdim=True), ("layer", "pos"), None, None
        if positions is None:
            return per, ("layer", "pos"), list(range(P)), None
        ps = [check_index(p, P, "position", f"the prompts have {P} tokens") for p in positions]
        return per[:, :, ps], ("layer", "pos"), ps, None
    if heads is None:
        hs: list[int] | None = list(range(H))
    elif heads == "all":
        hs = None
    else:
        hs = [check_index(h, H, "head", f"the model has {H} heads") for h in heads]
    per = per.sum(-1, keepdim=True) if hs is None else per[..., hs]
    if positions is None or positions == "all":
        return per.sum(2), ("layer", "head"), None, hs
    if isinstance(positions, str):
        raise ValueError(f"positions must be a list of ints, None or 'all', not {positions!r}")
    ps = [check_index(p, P, "position", f"the prompts have {P} tokens") for p in positions]
    return per[:, :, ps], ("layer", "pos", "head"), ps, hs


# =============================================================== the result
@dataclass
class AttributionResult(PatchResult):
    """An attribution estimate, shaped and labelled exactly like :class:`~.patching.PatchResult`.

    ``values`` / ``pair_values``: the *estimated* patched metric (baseline + estimated effect, or
    normalised like ``patch``). ``score`` (same shape as ``values``): what the cells are ranked by —
    ``|values − baseline|``, or for ``atp*`` with GradDrop the GradDrop magnitude
    ``mean_pairs (1/(L−1)) Σ_ℓ |Î_ℓ|`` (in the units of the effect). ``method``: ``atp``, ``atp*``
    or ``ig``; ``ig_steps`` for IG; ``graddrop``: whether ``score`` is GradDrop's.
    """

    method: str = "atp"
    ig_steps: int | None = None
    ig_path: str | None = None
    graddrop: bool = False
    score: torch.Tensor | None = field(default=None, repr=False)
    _spec: dict | None = field(default=None, repr=False, compare=False)

    def table(self, k: int = 8) -> str:
        """Like ``PatchResult.table``, the ``k`` highest-ranked cells, marked as an estimate."""
        steps = f" ({self.ig_steps} steps, {self.ig_path} path)" if self.method == "ig" else ""
        rank = "; ranked by GradDrop" if self.graddrop else ""
        return f"{self.method}{steps} estimate{rank} — " + super().table(k)

    def top(self, k: int = 5) -> list[tuple[tuple[int, ...], float]]:
        """The ``k`` cells ranked highest by :attr:`score`, as ``((layer, pos|head, ...), value)``."""
        flat = self.values.flatten()
        score = (flat - self.baseline).abs() if self.score is None else self.score.flatten()
        idx = score.topk(min(k, flat.numel())).indices
        return [(tuple(int(i) for i in torch.unravel_index(j, self.values.shape)), float(flat[j])) for j in idx]

    def verify(self, k: int = 20, candidates: int | None = None, controls: int = 20, seed: int = 0,
               batch_size: int | None = None, progress: bool | None = None,
               exact: PatchResult | None = None) -> "Verification":
        """Exact batched patching of this estimate's top cells and a random control sample; see :func:`verify`."""
        return verify(self, k=k, candidates=candidates, controls=controls, seed=seed, batch_size=batch_size,
                      progress=progress, exact=exact)


# =============================================================== attribute()
def attribute(
    model: "HookedGPT2",
    clean: Prompts,
    corrupted: Prompts,
    metric: Metric,
    hook: str = "resid_pre",
    method: Literal["atp", "atp*", "ig"] = "atp",
    ig_steps: int = 5,
    layers: Sequence[int] | None = None,
    positions: Sequence[int] | Literal["all"] | None = None,
    heads: Sequence[int] | Literal["all"] | None = None,
    direction: Literal["denoise", "noise"] = "denoise",
    normalize: bool = False,
    graddrop: bool | None = None,
    batch_size: int | None = None,
    progress: bool | None = None,
    ig_path: Literal["input", "activations"] = "input",
) -> AttributionResult:
    """Estimate a whole :func:`~.patching.patch` sweep from gradients (see the module docstring).

    Arguments mean what they mean for ``patch`` (``hook``: ``resid_pre|resid_mid|resid_post|attn_out|
    mlp_out`` per position, ``z|q|k|v|pattern`` per head, or one of their hook names; ``layers``,
    ``positions``, ``heads``, ``direction``, ``normalize``), and the result has ``patch``'s axes and
    labels. ``method``: ``"atp"``, ``"atp*"`` (QK fix for ``q``/``k``; GradDrop ranking unless
    ``graddrop=False``) or ``"ig"`` (``ig_steps`` points on the input-embedding path, or with
    ``ig_path="activations"`` on each layer's own activations; see the module docstring).
    ``batch_size``: prompt pairs per pass (default: all at once).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(repr(m) for m in METHODS)}, not {method!r}")
    if direction not in ("denoise", "noise"):
        raise ValueError(f"direction must be 'denoise' (patch clean into corrupted) or 'noise' (corrupted into clean), not {direction!r}")
    if method == "ig":
        ig_steps = check_count(ig_steps, "ig_steps (points on the interpolation path)")
    if ig_path not in ("input", "activations"):
        raise ValueError(f"ig_path must be 'input' (EAP-IG) or 'activations' (each layer's own), not {ig_path!r}")
    if ig_path != "input" and method != "ig":
        raise ValueError("ig_path is for method='ig'")
    if graddrop and method != "atp*":
        raise ValueError("graddrop is part of method='atp*'")
    graddrop = method == "atp*" if graddrop is None else bool(graddrop)
    fam, layers_ = _family(model, hook, layers)
    clean_t, corr_t, mask = pair_tokens(model, clean, corrupted)
    n_pairs, P = clean_t.shape
    H = model.cfg.n_head
    base_t, src_t = (corr_t, clean_t) if direction == "denoise" else (clean_t, corr_t)
    bs = n_pairs if batch_size is None else max(1, int(batch_size))
    if positions is not None and not isinstance(positions, str):
        positions = list(positions)
    if heads is not None and not isinstance(heads, str):
        heads = list(heads)

    together = fam.kind != "pos" and (positions is None or positions == "all")  # heads patched at every position
    chunks = [(a, min(n_pairs, a + bs)) for a in range(0, n_pairs, bs)]
    bar = progress_bar(total=len(chunks), desc=f"attribution ({method}) {hook}", leave=False, enabled=progress)
    effs, drops, base_ms, src_ms = [], [], [], []
    for a, b in chunks:
        m = None if mask is None else mask[a:b]
        e, d, bm, sm = _attribute_chunk(model, fam, layers_, base_t[a:b].clone(), src_t[a:b].clone(), m, metric,
                                        direction, method, ig_steps, graddrop, together, (a, n_pairs), ig_path)
        effs.append(e)
        drops.append(d)
        base_ms.append(bm)
        src_ms.append(sm)
        bar.update()
    bar.close()
    eff = torch.cat(effs)  # [n_pairs, layer, pos|1, (head)]
    base_m, src_m = torch.cat(base_ms), torch.cat(src_ms)
    clean_m, corr_m = (src_m, base_m) if direction == "denoise" else (base_m, src_m)
    n_heads = H if fam.kind == "pos" else eff.shape[-1]  # k/v: the key/value heads (fewer under grouped-query attention)
    per_pair, index_names, pos_axis, head_axis = _select(fam, eff, positions, heads, P, n_heads)
    drop = _select(fam, torch.cat(drops), positions, heads, P, n_heads)[0] if graddrop else None
    per_pair = per_pair + base_m.view((-1,) + (1,) * (per_pair.ndim - 1))
    mean = per_pair.mean(0)
    score = (mean - mean.new_tensor(float(base_m.mean()))).abs() if drop is None else drop.mean(0)
    if normalize:
        mean, per_pair, gap = normalize_effects(mean, per_pair, clean_m, corr_m)
        score = score / abs(gap)
    labels = position_labels(model, clean_t, corr_t, mask)
    spec = dict(model=model, clean=clean, corrupted=corrupted, metric=metric, hook=hook,
                layers=layers, positions=positions, heads=heads, direction=direction, normalize=normalize)
    return AttributionResult(
        **result_fields(model, mean, per_pair, index_names, layers_, pos_axis, head_axis, labels, hook, direction,
                        metric, normalize, clean_m, corr_m),
        method=method,
        ig_steps=ig_steps if method == "ig" else None,
        ig_path=ig_path if method == "ig" else None,
        graddrop=graddrop,
        score=score,
        _spec=spec,
    )


def _attribute_chunk(model: "HookedGPT2", fam: _Family, layers_: list[int], base_t: torch.Tensor, src_t: torch.Tensor,
                     mask: torch.Tensor | None, metric: Metric, direction: str, method: str, ig_steps: int,
                     graddrop: bool, together: bool, rows: tuple[int, int], ig_path: str = "input"
                     ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """Per-pair effects ``[b, layer, pos|1, (head)]``, GradDrop magnitudes (or None) and the base and
    source metrics ``[b]`` of one chunk of pairs."""
    n = model.cfg.n_layer
    names = [fam.names[l] for l in layers_]
    qk = method == "atp*" and fam.name in ("q", "k")
    pattern_names = [f"blocks.{l}.attn.hook_pattern" for l in layers_] if qk else []
    qk_names = [x for l in layers_ for x in (_rot_name(model, l, "q"), _rot_name(model, l, "k"), f"blocks.{l}.attn.hook_attn_scores")] if qk else []
    b = base_t.shape[0]
    ig = method == "ig"
    readout = _Readout(model, metric, rows, b)
    # unpatched runs without autograd: the source run (and for IG the base run and both embeddings)
    tokens = torch.cat([src_t, base_t]) if ig else src_t
    rmask = None if mask is None else (torch.cat([mask, mask]) if ig else mask)
    act_path = ig and ig_path == "activations"
    starts = [f"blocks.{l}.hook_resid_pre" for l in layers_ if 0 <= l < n] if act_path else []
    extra_names = (starts if act_path else ["hook_embed"]) if ig else []
    with torch.inference_mode():
        resid, cache = model.run_with_cache(tokens, names_filter=list(dict.fromkeys(names + qk_names + extra_names)),
                                            attention_mask=rmask, stop_at_layer=n)
        logits = readout.logits(resid)
    with torch.inference_mode(False), torch.enable_grad():  # also inside a caller's no_grad / inference_mode
        # normal tensors (not inference tensors) that autograd may use
        cache = {k: v.clone() for k, v in cache.items()}
        logits, base_t = logits.clone(), base_t.clone()
        mask = None if mask is None else mask.clone()
        src = {k: v[:b] for k, v in cache.items()}
        src_logits = logits[:b]
        if ig:
            base = {k: v[b:] for k, v in cache.items()}
            base_logits = logits[b:]
            readout.bind(src_logits if direction == "denoise" else base_logits)
            base_m = readout(base_logits).detach().cpu()
            if act_path:
                eff = []
                for l, nm in zip(layers_, names):
                    resid0 = base.get(f"blocks.{l}.hook_resid_pre") if 0 <= l < n else None
                    g = _activation_path_grad(model, readout, nm, l, base[nm], src[nm], resid0, base_t, mask, ig_steps)
                    eff.append(_cell_effects(fam, src[nm] - base[nm], g))
                return _stack(fam, eff, together), None, base_m, readout(src_logits).detach().cpu()
            e0, e1 = base["hook_embed"], src["hook_embed"]
            grads = {nm: torch.zeros_like(base[nm], dtype=torch.float32) for nm in names}
            P = base_t.shape[1]
            per_pass = max(1, min(ig_steps, int(_IG_BUDGET // max(1, b * P * model.cfg.d_model * n))))
            alphas = (torch.arange(ig_steps, dtype=torch.float32, device=e0.device) + 0.5) / ig_steps  # midpoints
            for first in range(0, ig_steps, per_pass):  # steps folded into the batch axis: (s b) rows per pass
                al = alphas[first : first + per_pass]
                k = al.numel()
                path = rearrange(e0[None] + al.view(-1, 1, 1, 1).to(e0.dtype) * (e1 - e0)[None], "s b p d -> (s b) p d")
                store: dict[str, torch.Tensor] = {}
                hooks = [("hook_embed", lambda act, hook, path=path: path)] + [(nm, _capture(store)) for nm in names]
                rows_mask = None if mask is None else repeat(mask, "b p -> (s b) p", s=k)
                with model.hooks(hooks):
                    resid = model(repeat(base_t, "b p -> (s b) p", s=k), attention_mask=rows_mask, stop_at_layer=n)
                logits = rearrange(readout.logits(resid), "(s b) v -> s b v", s=k)
                total = sum(readout(logits[i]).sum() for i in range(k))
                for nm, g in zip(names, torch.autograd.grad(total, [store[nm] for nm in names])):
                    grads[nm] += reduce(rearrange(g.float(), "(s b) ... -> s b ...", s=k), "s b ... -> b ...", "sum") / ig_steps
            eff = [_cell_effects(fam, src[nm] - base[nm], grads[nm]) for nm in names]
            return _stack(fam, eff, together), None, base_m, readout(src_logits).detach().cpu()

        # AtP / AtP*: the base run with autograd, activations captured where the gradient is wanted
        store = {}
        keeps = [[1.0] for _ in range(n)]
        inputs = list(dict.fromkeys(names + pattern_names))
        extra: dict[str, torch.Tensor] = {}
        hooks = [(nm, _capture(store)) for nm in inputs]
        hooks += [(x, lambda act, hook: extra.__setitem__(hook.name, act.detach())) for x in qk_names]
        if graddrop:  # after the captures: a dropped layer's own nodes get no gradient (hence 1/(L−1))
            hooks += [(f"blocks.{l}.hook_{x}", _gate(keeps[l])) for l in range(n) for x in ("attn_out", "mlp_out")]
        with model.hooks(hooks):
            base_logits = readout.logits(model(base_t, attention_mask=mask, stop_at_layer=n))
        readout.bind(src_logits if direction == "denoise" else base_logits.detach())
        m = readout(base_logits)
        base_m, src_m = m.detach().cpu(), readout(src_logits).detach().cpu()
        acts = [store[x] for x in inputs]

        def estimate(grads: Sequence[torch.Tensor | None]) -> torch.Tensor:
            grad = {x: torch.zeros_like(store[x]) if g is None else g for x, g in zip(inputs, grads)}
            out = []
            for l, nm in zip(layers_, names):
                if qk:
                    qn, kn = _rot_name(model, l, "q"), _rot_name(model, l, "k")
                    scores, q, k = extra[f"blocks.{l}.attn.hook_attn_scores"], extra[qn], extra[kn]
                    pn = f"blocks.{l}.attn.hook_pattern"
                    out.append(_qk_fixed(fam.name, q, k, src[qn], src[kn], store[pn].detach(), scores, grad[pn],
                                         _check_scale(q, k, scores, l), together))
                else:
                    out.append(_cell_effects(fam, src[nm] - store[nm].detach(), grad[nm]))
            return _stack(fam, out, together and not qk)

        if not graddrop:
            return estimate(torch.autograd.grad(m.sum(), acts)), None, base_m, src_m
        eff = estimate(torch.autograd.grad(m.sum(), acts, retain_graph=True))
        total = torch.zeros_like(eff)
        for l in range(n):
            keeps[l][0] = 0.0
            try:
                total += estimate(torch.autograd.grad(m.sum(), acts, retain_graph=l < n - 1, allow_unused=True)).abs()
            finally:
                keeps[l][0] = 1.0
        return eff, total / max(n - 1, 1), base_m, src_m


_IG_BUDGET = 1.5e7  # rows × positions × d_model × layers run per activation-path pass (bounds the saved activations)


def _activation_path_grad(model: "HookedGPT2", readout: _Readout, name: str, layer: int, a0: torch.Tensor,
                          a1: torch.Tensor, resid0: torch.Tensor | None, base_t: torch.Tensor, mask: torch.Tensor | None,
                          steps: int) -> torch.Tensor:
    """``mean_α ∂M/∂a`` at ``a = a0 + α(a1 − a0)`` of hook ``name`` (``a0``: base run, ``a1``: source run;
    α at the ``steps`` midpoints), everything upstream at the base run: the pass starts at ``layer``
    from the base residual stream ``resid0`` (or, for a hook before the first block, at the tokens).
    Steps are folded into the batch axis (``(s b)`` rows), as many per pass as the memory budget
    allows. Returns ``[b, ...]``, shaped like the hook's activation."""
    n = model.cfg.n_layer
    b, P = base_t.shape
    run = n - max(layer, 0)
    per_pass = max(1, min(steps, int(_IG_BUDGET // max(1, b * P * model.cfg.d_model * run))))
    alphas = (torch.arange(steps, dtype=torch.float32, device=a0.device) + 0.5) / steps
    grad = torch.zeros_like(a0, dtype=torch.float32)
    for first in range(0, steps, per_pass):
        al = alphas[first : first + per_pass]
        s = al.numel()
        path = a0.float()[None] + al.view(-1, *([1] * a0.ndim)) * (a1.float() - a0.float())[None]
        leaf = rearrange(path.to(a0.dtype), "s b ... -> (s b) ...").requires_grad_(True)
        m_rows = None if mask is None else repeat(mask, "b p -> (s b) p", s=s)
        with model.hooks([(name, lambda act, hook: leaf)]):
            if resid0 is None:
                resid = model(repeat(base_t, "b p -> (s b) p", s=s), attention_mask=m_rows, stop_at_layer=n)
            else:
                resid = model(repeat(resid0, "b p d -> (s b) p d", s=s), attention_mask=m_rows, start_at_layer=layer,
                              stop_at_layer=n)
        logits = rearrange(readout.logits(resid), "(s b) k -> s b k", s=s)
        total = sum(readout(logits[i]).sum() for i in range(s))
        (g,) = torch.autograd.grad(total, [leaf])
        grad += reduce(rearrange(g.float(), "(s b) ... -> s b ...", s=s), "s b ... -> b ...", "sum") / steps
    return grad


def _check_scale(q: torch.Tensor, k: torch.Tensor, scores: torch.Tensor, layer: int) -> float:
    """The attention scale, checked: the QK fix recomputes scores as ``q·k·scale``, which must reproduce
    the model's own scores (a model that scores differently is refused rather than estimated wrongly)."""
    H, Hk, dh = q.shape[2], k.shape[2], q.shape[-1]
    scale = 1 / math.sqrt(dh)
    s = einsum(q.float(), k.float().repeat_interleave(H // Hk, 2), "b t h d, b s h d -> b h t s") * scale
    ok = torch.isfinite(scores)
    err = (s[ok] - scores.float()[ok]).abs().max() if bool(ok.any()) else torch.tensor(0.0)
    if float(err) > 1e-3 * (1 + float(scores.float()[ok].abs().max())):
        raise NotImplementedError(f"layer {layer}: q·k/√d_head does not reproduce the model's attention scores "
                                  f"(max error {float(err):.3g}); the AtP* QK fix needs that — use method='atp' or 'ig'")
    return scale


def _stack(fam: _Family, effects: list[torch.Tensor], sum_positions: bool) -> torch.Tensor:
    """Per-layer cell effects → ``[b, layer, pos, (head)]``; with ``sum_positions`` (a per-head family
    patched at every position at once) the positions are summed into one slot."""
    out = torch.stack(effects, 1)
    if sum_positions and fam.kind != "pos":
        out = out.sum(2, keepdim=True)
    return out.detach().cpu()


# =============================================================== verification
def spearman(x: torch.Tensor, y: torch.Tensor) -> float:
    """Spearman rank correlation of two flat tensors (ties get their average rank)."""
    x, y = x.flatten().double(), y.flatten().double()
    if x.numel() != y.numel():
        raise ValueError(f"spearman needs two tensors of one size, got {x.numel()} and {y.numel()}")
    if x.numel() < 2:
        return float("nan")
    rx, ry = _ranks(x), _ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = float((rx.square().sum() * ry.square().sum()).sqrt())
    return float((rx * ry).sum()) / den if den > 0 else float("nan")


def _ranks(x: torch.Tensor) -> torch.Tensor:
    order = x.argsort()
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(x.numel(), dtype=x.dtype)
    vals, inv = torch.unique(x, return_inverse=True)
    if vals.numel() < x.numel():  # average the ranks of ties
        sums = torch.zeros(vals.numel(), dtype=x.dtype).index_add_(0, inv, ranks)
        counts = torch.zeros(vals.numel(), dtype=x.dtype).index_add_(0, inv, torch.ones_like(ranks))
        ranks = (sums / counts)[inv]
    return ranks


def top_cells(score: torch.Tensor, k: int) -> list[tuple[int, ...]]:
    """The ``k`` cells with the largest ``score`` (index tuples into its shape)."""
    idx = score.flatten().topk(min(k, score.numel())).indices
    return [tuple(int(i) for i in torch.unravel_index(j, score.shape)) for j in idx]


def recall(predicted: Sequence[tuple[int, ...]], truth: Sequence[tuple[int, ...]]) -> float:
    """Share of the ``truth`` cells found among ``predicted``."""
    return len(set(predicted) & set(truth)) / max(len(truth), 1)


@dataclass
class Agreement(Result):
    """How an attribution estimate agrees with an exact patching sweep over all cells."""

    method: str
    hook: str
    n_cells: int
    spearman: float  # of the effects (value − baseline), signed
    spearman_abs: float  # of |effect| against the estimate's ranking score
    k: int
    recall: float  # exact top-k (by |effect|) among the estimate's top-k (by score)
    estimate: torch.Tensor = field(repr=False)
    exact: torch.Tensor = field(repr=False)

    def plot(self, **kwargs: Any):
        from ..plots.attribution import plot_estimate_vs_exact

        return plot_estimate_vs_exact(self.estimate.numpy(), self.exact.numpy(),
                                      title=f"{self.method} vs exact patching, {self.hook} (ρ = {self.spearman:.3f})", **kwargs)

    def table(self) -> str:
        return (f"{self.method} on {self.hook}: {self.n_cells} cells, Spearman ρ {self.spearman:.3f} "
                f"(|effect| {self.spearman_abs:.3f}), top-{self.k} recall {self.recall:.0%}")


def agreement(estimate: AttributionResult, exact: PatchResult, k: int = 20) -> Agreement:
    """Compare an estimate with an exact sweep of the same cells: Spearman ρ of the effects and the
    share of the exact top-``k`` cells (largest ``|effect|``) among the estimate's top-``k``."""
    if estimate.values.shape != exact.values.shape:
        raise ValueError(f"estimate {tuple(estimate.values.shape)} and exact {tuple(exact.values.shape)} cover different cells")
    est = estimate.values - estimate.baseline
    ex = exact.values - exact.baseline
    score = est.abs() if estimate.score is None else estimate.score
    return Agreement(estimate.method, estimate.hook, est.numel(), spearman(est, ex), spearman(score, ex.abs()), k,
                     recall(top_cells(score, k), top_cells(ex.abs(), k)), est.flatten().float(), ex.flatten().float())


@dataclass
class Verification(Result):
    """Exact patching of an estimate's top cells (and random controls).

    ``cells``: the verified cells (index tuples into the estimate's ``values``); ``estimate``,
    ``exact``: their effects (value − baseline) by each; ``kind``: ``"top"`` (the estimate's
    ``candidates`` best) or ``"control"`` (random others). ``verified_top``: the ``k`` cells with the
    largest exact ``|effect|`` among those verified — the answer to use; ``spearman``: rank correlation
    of estimate and exact over every verified cell; ``recall``: the share of ``verified_top`` already
    in the estimate's top-``k``; ``controls_above``: controls whose exact ``|effect|`` beats the
    ``k``-th of ``verified_top`` (a false-negative warning: the estimate missed them).
    """

    method: str
    hook: str
    k: int
    cells: list[tuple[int, ...]]
    labels: list[str]
    kind: list[str]
    estimate: torch.Tensor
    exact: torch.Tensor
    verified_top: list[tuple[int, ...]]
    spearman: float
    recall: float
    controls_above: int

    def plot(self, **kwargs: Any):
        from ..plots.attribution import plot_verification

        top = [c == "top" for c in self.kind]
        return plot_verification(self.estimate.numpy(), self.exact.numpy(), top, self.labels,
                                 title=f"{self.method} estimate vs exact patching, {self.hook}: "
                                       f"ρ = {self.spearman:.3f}, top-{self.k} recall {self.recall:.0%}", **kwargs)

    def table(self) -> str:
        lines = [f"verified {self.kind.count('top')} top cells + {self.kind.count('control')} controls of {self.method} "
                 f"on {self.hook}: Spearman ρ {self.spearman:.3f}, top-{self.k} recall {self.recall:.0%}, "
                 f"{self.controls_above} control(s) above the {self.k}-th exact effect",
                 f"  {'cell':<28} {'estimate':>10} {'exact':>10}"]
        order = self.exact.abs().argsort(descending=True)
        for i in order[: self.k].tolist():
            lines.append(f"  {self.labels[i]:<28} {float(self.estimate[i]):>+10.4f} {float(self.exact[i]):>+10.4f}"
                         f"{'  (control)' if self.kind[i] == 'control' else ''}")
        return "\n".join(lines)


def cell_label(result: PatchResult, cell: tuple[int, ...]) -> str:
    """``"L3 ' Paris' H2"``-style label of a cell of a patching/attribution result."""
    parts = [result.layer_labels[cell[0]]]
    for name, i in zip(result.index_names[1:], cell[1:]):
        parts.append(repr(result.position_labels[i]) if name == "pos" else result.head_labels[i])
    return " ".join(parts)


def verify(result: AttributionResult, k: int = 20, candidates: int | None = None, controls: int = 20, seed: int = 0,
           batch_size: int | None = None, progress: bool | None = None, exact: PatchResult | None = None) -> Verification:
    """Run exact batched patching (:func:`~.patching.patch`) on the estimate's top ``candidates``
    cells (default ``2k``) and ``controls`` random other cells, and compare.

    Cells are patched one layer at a time (``patch`` restricted to that layer and the positions and
    heads of its cells), on the same prompt pairs, metric, direction and normalisation. ``exact``:
    a full exact sweep of the same cells (``patch`` with the same arguments) when one is at hand —
    the cells are then looked up in it instead of patched again (the same values, no extra runs)."""
    spec = result._spec
    if exact is not None:
        if exact.values.shape != result.values.shape or exact.index_names != result.index_names:
            raise ValueError(f"exact covers {exact.index_names} {tuple(exact.values.shape)}, the estimate "
                             f"{result.index_names} {tuple(result.values.shape)}: pass patch() run with the same arguments")
    elif spec is None:
        raise ValueError("this result carries no run to verify (was it loaded from JSON?); call attribute() again")
    k = check_count(k, "k")
    cand = 2 * k if candidates is None else max(k, candidates)
    score = (result.values - result.baseline).abs() if result.score is None else result.score
    top = top_cells(score, cand)
    chosen = set(top)
    rest = [c for c in (tuple(int(i) for i in torch.unravel_index(torch.tensor(j), score.shape)) for j in range(score.numel()))
            if c not in chosen]
    ctrl = random.Random(seed).sample(rest, min(controls, len(rest)))
    cells = top + ctrl
    if exact is None:
        ex = torch.tensor(_exact_cells(result, cells, batch_size, progress)) - result.baseline
    else:
        ex = torch.stack([exact.values[c] for c in cells]).float() - exact.baseline
    est = torch.stack([result.values[c] for c in cells]) - result.baseline
    by_exact = ex.abs().argsort(descending=True)[:k].tolist()
    verified_top = [cells[i] for i in by_exact]
    kth = float(ex.abs()[by_exact[-1]]) if by_exact else float("inf")
    n_top = len(top)
    return Verification(
        method=result.method, hook=result.hook, k=k, cells=cells, labels=[cell_label(result, c) for c in cells],
        kind=["top"] * n_top + ["control"] * len(ctrl), estimate=est.float(), exact=ex.float(),
        verified_top=verified_top, spearman=spearman(est, ex), recall=recall(top[:k], verified_top),
        controls_above=int((ex[n_top:].abs() > kth).sum()),
    )


def _exact_cells(result: AttributionResult, cells: list[tuple[int, ...]], batch_size: int | None,
                 progress: bool | None) -> list[float]:
    """Exact patched metric of each cell, by ``patch`` calls over groups of cells: one per layer
    (its positions × heads grid), or for ``[layer, pos, head]`` cells one per (layer, position) when
    that patches fewer rows than the layer's grid (each call also pays two unpatched runs)."""
    spec = result._spec
    names = result.index_names
    groups: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for c in cells:
        groups.setdefault(c[:1], []).append(c)
    if names == ("layer", "pos", "head"):
        regrouped: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        for key, cs in groups.items():
            ps, hs = {c[1] for c in cs}, {c[2] for c in cs}
            if len(cs) + 2 * len(ps) < len(ps) * len(hs) + 2:
                for c in cs:
                    regrouped.setdefault(c[:2], []).append(c)
            else:
                regrouped[key] = cs
        groups = regrouped
    got: dict[tuple[int, ...], float] = {}
    family = spec["hook"]
    full = "hook_" in family or family.startswith("blocks.")
    for key, cs in groups.items():
        kw: dict[str, Any] = dict(hook=family, direction=spec["direction"], normalize=spec["normalize"],
                                  batch_size=batch_size, progress=progress)
        if not full and result.layers[key[0]] >= 0:
            kw["layers"] = [result.layers[key[0]]]
        if names == ("layer", "pos"):
            kw["positions"] = "all" if result.positions is None else sorted({result.positions[c[1]] for c in cs})
        elif names == ("layer", "head"):
            kw["heads"] = "all" if result.heads is None else sorted({result.heads[c[1]] for c in cs})
        else:
            kw["positions"] = sorted({result.positions[c[1]] for c in cs})
            kw["heads"] = "all" if result.heads is None else sorted({result.heads[c[2]] for c in cs})
        r = patch(spec["model"], spec["clean"], spec["corrupted"], spec["metric"], **kw)
        for c in cs:
            j = [0]
            for name, i in zip(names[1:], c[1:]):
                if name == "pos":
                    j.append(0 if result.positions is None else kw["positions"].index(result.positions[i]))
                else:
                    j.append(0 if result.heads is None else kw["heads"].index(result.heads[i]))
            got[c] = float(r.values[tuple(j)])
    return [got[c] for c in cells]


__all__ = ["attribute", "AttributionResult", "verify", "Verification", "agreement", "Agreement", "spearman",
           "top_cells", "recall", "cell_label", "METHODS", "FAMILIES"]
