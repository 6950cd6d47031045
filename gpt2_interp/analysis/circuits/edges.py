"""Running the model with edges patched: the prompt pairs, the senders' outputs, and two ways to
patch — a general forward pass with any set of edges patched per row (:func:`run_with_edges`, for
circuits and faithfulness) and exact single-edge patching through the prefix-reuse engine
(:func:`edge_patch`, the ground truth the gradient scores are checked against).

Patching an edge ``s → r`` replaces sender ``s``'s term in receiver ``r``'s input by its value in the
corrupted run: ``in_r ← in_r + (s_corrupted − s_current)``, where ``s_current`` is the sender's
output in the run being patched (with several edges patched, a sender may itself have changed).
Every other receiver, and the residual stream itself, keep their values.

A block that normalises its attention output before adding it (``norm_position`` ``"post"`` or
``"sandwich"``: OLMo 2, Gemma 2 and 3) adds ``g ⊙ Σ_h z_h W_O[h] / σ`` to the residual, ``σ`` the
post-attention norm's scale in that run (``ln1_post.hook_scale``) and ``g`` its gain: head ``h``'s output is
its share ``g ⊙ z_h W_O[h] / σ`` at the scale of the run it is read from, so the residual stream of every
run is still the sum of its senders' outputs (the MLP's output is read after its own post-norm).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from einops import einsum, rearrange

from ...core.boundary import boundary
from ...core.checks import check_indices
from ..attribution.readout import Readout, chunk_metric
from ..engine import Patch, base_kv_from, entry_name, final_logits, kv_names, run_staircase
from ..metrics import Metric, apply_metric, bind_metric, refuse_degenerate, require_finite_metric
from ..patching import Prompts, pair_tokens
from .graph import Graph, model_identity, refuse_other_model

if TYPE_CHECKING:
    from ...model import HookedGPT2

#: Activation memory (bytes) one chunk of patched rows may hold in sender differences.
EDGE_MEMORY = 1 << 29


@boundary
@contextmanager
def split_inputs(model: HookedGPT2) -> Iterator[None]:
    """Turn on the model's receiver-input hooks (``use_split_qkv_input``, ``use_hook_mlp_in``) for the
    block, and restore the switches after it."""
    cfg = model.cfg
    if not hasattr(cfg, "use_split_qkv_input"):
        raise RuntimeError("this model has no split receiver inputs (use_split_qkv_input); edges cannot be patched")
    before = (cfg.use_split_qkv_input, cfg.use_hook_mlp_in, getattr(cfg, "use_attn_in", False))
    try:
        if before[2]:
            cfg.use_attn_in = False
        cfg.use_split_qkv_input = True
        cfg.use_hook_mlp_in = True
        yield
    finally:
        cfg.use_split_qkv_input = before[0]
        cfg.use_hook_mlp_in = before[1]
        if before[2]:
            cfg.use_attn_in = True


def post_norm(model: HookedGPT2) -> bool:
    """Whether ``model``'s blocks normalise the attention output before adding it (``norm_position``
    ``"post"`` or ``"sandwich"``): a head's output is then its share at the run's post-norm scale."""
    return model.cfg.norm_position != "pre"


def scale_hook(layer: int) -> str:
    """The hook of layer ``layer``'s post-attention norm scale ``σ`` ``[batch, pos, 1]`` (post-norm blocks)."""
    return f"blocks.{layer}.ln1_post.hook_scale"


def sender_hooks(model: HookedGPT2) -> list[str]:
    """The hooks the senders' outputs are read from: the residual entering block 0 (``input``), each
    layer's ``attn.hook_z`` (head ``h``'s output is ``z_h · W_O[h]``; in post-norm blocks with the
    post-attention norm's scale, :func:`scale_hook`) and ``hook_mlp_out``."""
    out = ["blocks.0.hook_resid_pre"]
    for l in range(model.cfg.n_layer):
        out += [f"blocks.{l}.attn.hook_z", f"blocks.{l}.hook_mlp_out"]
        if post_norm(model):
            out.append(scale_hook(l))
    return out


def head_outputs(model: HookedGPT2, layer: int, z: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Each head's output ``[batch, pos, n_head, d_model]`` of ``z [batch, pos, n_head, d_head]``: ``z_h · W_O[h]``,
    and in post-norm blocks its share of the normalised output, ``g ⊙ z_h · W_O[h] / σ`` with ``scale`` ``σ``
    ``[batch, pos, 1]`` of the run ``z`` comes from and ``g`` the post-attention norm's gain."""
    out = einsum(z, model.blocks[layer].attn.W_O, "b p h e, h e d -> b p h d")
    if not post_norm(model):
        return out
    if scale is None:
        raise ValueError(f"{model.cfg.name} normalises each attention output: a head's output needs the run's scale")
    return out * (model.blocks[layer].ln1_post.gain / scale[:, :, :, None])


def sender_outputs(model: HookedGPT2, cache: Any) -> torch.Tensor:
    """Every sender's output ``[batch, pos, n_senders, d_model]`` from a cache holding :func:`sender_hooks`."""
    parts = [cache["blocks.0.hook_resid_pre"][:, :, None]]
    for l in range(model.cfg.n_layer):
        scale = cache[scale_hook(l)] if post_norm(model) else None
        parts += [
            head_outputs(model, l, cache[f"blocks.{l}.attn.hook_z"], scale),
            cache[f"blocks.{l}.hook_mlp_out"][:, :, None],
        ]
    return torch.cat(parts, 2)


@boundary
@dataclass
class Pairs:
    """Prompt pairs ready to score: ``clean``/``corrupted`` tokens ``[n, pos]``, ``mask`` ``[n, pos]``
    (None without padding), the bound ``metric`` and its values on the unpatched runs
    (``clean_metric``/``corrupted_metric`` ``[n]``, CPU), and ``first``: the first position where any
    pair differs (every sender's output is the same in both runs before it); ``model_name`` and ``weights``
    (its weights fingerprint): the model the metric values were computed on (None: not recorded), which
    :func:`run_with_edges` requires of its model."""

    clean: torch.Tensor
    corrupted: torch.Tensor
    mask: torch.Tensor | None
    metric: Metric
    clean_metric: torch.Tensor
    corrupted_metric: torch.Tensor
    first: int
    model_name: str | None = None
    weights: str | None = None

    @property
    def n(self) -> int:
        """Number of pairs."""
        return self.clean.shape[0]

    @property
    def n_pos(self) -> int:
        """Positions per prompt (after padding)."""
        return self.clean.shape[1]


@boundary
def pairs_of(model: HookedGPT2, clean: Prompts, corrupted: Prompts, metric: Metric) -> Pairs:
    """Tokenize prompt pairs as :func:`~gpt2_interp.analysis.patching.patch` does and bind ``metric``.

    ``clean``/``corrupted``: a prompt, a list of prompts or token tensors ``[n, pos]`` (each pair of
    equal length); ``metric``: last-position logits ``[..., n, d_vocab]`` → ``[..., n]``. Refused: pairs
    that are identical (no position differs), a degenerate logit difference, a non-finite metric."""
    metric = refuse_degenerate(bind_metric(metric, model), model)
    c, k, mask = pair_tokens(model, clean, corrupted)
    diff = (c != k).any(0).nonzero()
    if diff.numel() == 0:
        raise ValueError("every clean prompt equals its corrupted prompt: no edge can change anything")
    with torch.inference_mode():
        n = model.cfg.n_layer
        cl = final_logits(model, model(c, attention_mask=mask, stop_at_layer=n))
        co = final_logits(model, model(k, attention_mask=mask, stop_at_layer=n))
    metric = bind_metric(metric, model, cl)
    cm, km = apply_metric(metric, cl[None])[0].cpu(), apply_metric(metric, co[None])[0].cpu()
    require_finite_metric(metric, {"clean": cm, "corrupted": km})
    name, weights = model_identity(model)
    return Pairs(c, k, mask, metric, cm, km, int(diff.min()), name, weights)


def _cache(model: HookedGPT2, tokens: torch.Tensor, mask: torch.Tensor | None, names: Sequence[str]) -> dict:
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=list(names), return_type=None)
    return {k: cache[k] for k in names}


def sender_differences(model: HookedGPT2, pairs: Pairs) -> tuple[torch.Tensor, torch.Tensor]:
    """``(clean, corrupted − clean)`` sender outputs, ``[n, pos, n_senders, d_model]`` each."""
    names = sender_hooks(model)
    with torch.no_grad():
        clean = sender_outputs(model, _cache(model, pairs.clean, pairs.mask, names))
        corr = sender_outputs(model, _cache(model, pairs.corrupted, pairs.mask, names))
    return clean, corr - clean


def _check_masks(graph: Graph, patched: torch.Tensor, n_pos: int) -> torch.Tensor:
    """Edge masks as ``[rows, S, R]`` (or ``[rows, n_pos, S, R]`` per position), zero where no edge exists."""
    S, R, E = graph.n_senders, graph.n_receivers, graph.n_edges
    x = patched.float()
    if x.ndim >= 1 and x.shape[-1] == E and x.ndim <= 3:
        x = graph.matrix(x)
    if x.ndim == 2:
        x = x[None]
    ok = x.ndim in (3, 4) and tuple(x.shape[-2:]) == (S, R) and (x.ndim == 3 or x.shape[1] == n_pos)
    if not ok:
        raise ValueError(
            f"patched edges: [rows, {E}] edge masks or [rows, {S}, {R}] sender × receiver masks (per position: "
            f"[rows, {n_pos}, {E}] or [rows, {n_pos}, {S}, {R}]), got {tuple(patched.shape)}"
        )
    return x * graph.valid.to(x.device)


def _one_length(pairs: Pairs) -> None:
    if pairs.mask is not None and not bool(pairs.mask.all()):
        raise ValueError(
            "per-position edges need prompts of one token length (these are padded): choose pairs of one length"
        )


@dataclass
class _Corrupted:
    """The corrupted run's pieces :func:`run_with_edges` reads, every pair: the input embedding
    ``input [n, pos, d_model]``, per layer the heads' ``z [n, pos, n_head, d_head]`` and ``mlp`` outputs
    ``[n, pos, d_model]``, each receiver group's corrupted input ``[n, pos, d_model]`` (by hook name), and in
    post-norm blocks each layer's post-attention norm ``scale`` ``[n, pos, 1]`` (empty otherwise)."""

    input: torch.Tensor
    z: list[torch.Tensor]
    mlp: list[torch.Tensor]
    inputs: dict[str, torch.Tensor]
    scale: list[torch.Tensor]


def _corrupted(model: HookedGPT2, graph: Graph, pairs: Pairs) -> _Corrupted:
    L = model.cfg.n_layer
    source = {g.name: graph.input_of(g) for g in graph.groups}
    names = list(dict.fromkeys([*sender_hooks(model), *source.values()]))
    c = _cache(model, pairs.corrupted, pairs.mask, names)
    return _Corrupted(
        c["blocks.0.hook_resid_pre"],
        [c[f"blocks.{l}.attn.hook_z"] for l in range(L)],
        [c[f"blocks.{l}.hook_mlp_out"] for l in range(L)],
        {g: c[s] for g, s in source.items()},
        [c[scale_hook(l)] for l in range(L)] if post_norm(model) else [],
    )


@dataclass
class _Term:
    """How one mask row corrects one receiver group: its input is ``base`` (``"run"``: the patched run's
    own input; ``"corrupted"``: the corrupted run's) plus ``Σ_s weights[s] · (current − corrupted)[s]``
    over the senders ``senders`` (``weights`` ``[a, count]``, or ``[a, pos, count]`` per position);
    ``prefix``: the senders are the first ``a`` (their differences are read in place, not gathered)."""

    base: str
    senders: torch.Tensor
    weights: torch.Tensor
    prefix: bool = False


def _terms(graph: Graph, masks: torch.Tensor) -> list[list[_Term]]:
    """Per mask row (``[rows, S, R]`` or ``[rows, pos, S, R]``) and receiver group, the cheaper of two
    equal forms of the patched input: the run's input with the patched edges' ``corrupted − current``
    added (weights ``−m``), or the corrupted input with the kept edges' ``current − corrupted`` added
    (weights ``1 − m``) — whichever has fewer senders with a non-zero weight."""
    stage = graph.sender_stage
    out = []
    for row in masks:
        per = row.ndim == 3  # [pos, S, R]
        terms = []
        for g in graph.groups:
            ns = int((stage < graph.receiver_stage[g.first]).sum())  # senders (a prefix) written before g reads
            m = row[..., :ns, g.first : g.first + g.count]  # [(pos,) ns, count]
            if per:
                m = rearrange(m, "p s c -> s p c")
            used_p = (m != 0).flatten(1).any(1)
            used_k = (m != 1).flatten(1).any(1)
            base, used, w = (
                ("run", used_p, -m) if int(used_p.sum()) <= int(used_k.sum()) else ("corrupted", used_k, 1 - m)
            )
            idx = used.nonzero()[:, 0]
            if 2 * idx.numel() > ns:  # most senders: read all of them in place rather than gather
                terms.append(_Term(base, torch.arange(ns, device=m.device), w, prefix=True))
            else:
                terms.append(_Term(base, idx, w[idx]))
        out.append(terms)
    return out


@boundary
def run_with_edges(
    model: HookedGPT2,
    graph: Graph,
    pairs: Pairs,
    patched: torch.Tensor,
    batch_rows: int | None = None,
) -> torch.Tensor:
    """The metric with a set of edges patched to the corrupted run, for each row of masks and each pair.

    ``patched``: ``[rows, n_edges]`` (in ``Graph.edges`` order) or ``[rows, n_senders, n_receivers]``,
    1 where the edge is patched (fractions interpolate: ``in_r += m · (s_corrupted − s_current)``); per
    position, ``[rows, n_pos, n_edges]`` or ``[rows, n_pos, n_senders, n_receivers]``: the edge from a
    sender at position ``p`` to a receiver at ``p`` (the residual stream carries nothing across
    positions; attention does, inside its node). Every row runs the clean prompts with its edges patched,
    all layers at once: each receiver's input is corrected from the senders' outputs *in that run*. The
    corrupted run is computed once for all rows. Per row and receiver the input is built from whichever
    of two equal sums holds fewer senders: the run's own input plus ``m · (corrupted − current)`` over
    the patched edges, or the corrupted run's input plus ``(1 − m) · (current − corrupted)`` over the
    kept ones (a small circuit reads few senders, a large one patches few edges).

    Returns ``[rows, n]`` (float32, CPU). ``graph``: the model's :class:`Graph`; ``pairs``: from
    :func:`pairs_of`; ``batch_rows``: mask rows per forward pass (None: sized from :data:`EDGE_MEMORY`;
    when one row of every pair would not fit, the pairs are run in chunks too).
    """
    graph.fits(model)
    refuse_other_model("these prompt pairs", pairs.model_name, pairs.weights, model)
    masks = _check_masks(graph, patched.to(model.device), pairs.n_pos)
    if masks.ndim == 4:
        _one_length(pairs)
    terms = _terms(graph, masks.to(model.dtype))
    with torch.no_grad():
        corr = _corrupted(model, graph, pairs)
    n, P = pairs.n, pairs.n_pos
    per_pair = P * graph.n_senders * model.cfg.d_model * torch.finfo(model.dtype).bits // 8  # current − corrupted
    per_chunk = max(1, min(n, EDGE_MEMORY // per_pair))  # pairs per pass
    per_chunk = -(-n // -(-n // per_chunk))  # even chunks
    if batch_rows is None:
        batch_rows = max(1, EDGE_MEMORY // (per_pair * per_chunk))
    out = torch.empty(len(terms), n)
    with split_inputs(model), torch.inference_mode():
        for a in range(0, len(terms), batch_rows):
            for p0 in range(0, n, per_chunk):
                p1 = min(n, p0 + per_chunk)
                m = _patched_metric(model, graph, pairs, corr, terms[a : a + batch_rows], (p0, p1))
                out[a : a + batch_rows, p0:p1] = m.cpu()
    return out


def _patched_metric(
    model: HookedGPT2,
    graph: Graph,
    pairs: Pairs,
    corr: _Corrupted,
    terms: list[list[_Term]],
    span: tuple[int, int],
) -> torch.Tensor:
    """One chunk of :func:`run_with_edges`: the terms of ``k`` mask rows and the pairs ``span = (first,
    end)`` → metric ``[k, end − first]`` (batch row ``i·m + j``: mask row ``i``, pair ``first + j``)."""
    p0, p1 = span
    k, m, P = len(terms), p1 - p0, pairs.n_pos
    H, d, b = model.cfg.n_head, model.cfg.d_model, k * (p1 - p0)
    needed = torch.zeros(graph.n_senders, dtype=torch.bool)
    for row in terms:
        for t in row:
            needed[t.senders.cpu()] = True
    # current − corrupted output of every sender, sender-major so that a receiver's sum is one matmul
    diff = torch.zeros(graph.n_senders, b, P, d, dtype=model.dtype, device=model.device)

    def minus(act: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:  # [b, ...] − [m, ...] per mask row
        return (act.view(k, m, *act.shape[1:]) - ref[p0:p1]).view(act.shape)

    post = post_norm(model)
    z_run: dict[int, torch.Tensor] = {}  # post-norm blocks: this run's z, until its scale is known

    def put(lo: int, hi: int, layer: int | None) -> Any:
        def fn(act: torch.Tensor, hook: Any) -> None:
            if not bool(needed[lo:hi].any()):
                return None
            if layer is None:
                ref = corr.input if lo == 0 else corr.mlp[(lo - 1) // (H + 1)]
                diff[lo] = minus(act, ref)
            elif post:
                z_run[layer] = act
            else:
                out = head_outputs(model, layer, minus(act, corr.z[layer]))
                diff[lo:hi] = rearrange(out, "b p h d -> h b p d")
            return None

        return fn

    def put_scaled(lo: int, hi: int, layer: int) -> Any:
        """A post-norm layer's head shares: this run's ``z`` at its scale minus the corrupted run's at its own."""

        def fn(scale: torch.Tensor, hook: Any) -> None:
            z = z_run.pop(layer, None)
            if z is None:
                return None
            ref = head_outputs(model, layer, corr.z[layer][p0:p1], corr.scale[layer][p0:p1])  # [m, P, H, d]
            out = head_outputs(model, layer, z, scale).view(k, m, *ref.shape[1:]) - ref
            diff[lo:hi] = rearrange(out, "k m p h d -> h (k m) p d")
            return None

        return fn

    hooks: list[tuple[str, Any]] = [("blocks.0.hook_resid_pre", put(0, 1, None))]
    for l in range(model.cfg.n_layer):
        s0 = 1 + l * (H + 1)
        hooks.append((f"blocks.{l}.attn.hook_z", put(s0, s0 + H, l)))
        if post:
            hooks.append((scale_hook(l), put_scaled(s0, s0 + H, l)))
        hooks.append((f"blocks.{l}.hook_mlp_out", put(s0 + H, s0 + H + 1, None)))

    def patch_in(act: torch.Tensor, hook: Any, gi: int) -> torch.Tensor | None:
        row_terms = [row[gi] for row in terms]
        if all(t.base == "run" and t.senders.numel() == 0 for t in row_terms):
            return None
        cin = corr.inputs[hook.name][p0:p1]  # [m, P, d]
        out = torch.empty(act.shape, dtype=act.dtype, device=act.device)
        for i, t in enumerate(row_terms):
            rows = slice(i * m, (i + 1) * m)
            base = act[rows] if t.base == "run" else (cin if act.ndim == 3 else cin[:, :, None])
            if t.senders.numel() == 0:
                out[rows] = base
                continue
            a = t.senders.numel()
            dd = diff[:a, rows] if t.prefix else diff[:, rows].index_select(0, t.senders)  # [a, m, P, d]
            if t.weights.ndim == 2:  # one matmul: [count, a] @ [a, m·P·d]
                delta = rearrange(t.weights.T @ dd.reshape(a, -1), "c (m p d) -> m p c d", m=m, p=P)
            else:
                delta = einsum(t.weights, dd, "a p c, a m p d -> m p c d")
            out[rows] = base + (delta if act.ndim == 4 else delta[:, :, 0])
        return out

    hooks += [(g.name, partial(patch_in, gi=gi)) for gi, g in enumerate(graph.groups)]
    tokens = pairs.clean[p0:p1].repeat(k, 1)
    mask = None if pairs.mask is None else pairs.mask[p0:p1].repeat(k, 1)
    with model.hooks(hooks):
        resid = model(tokens, attention_mask=mask, stop_at_layer=model.cfg.n_layer)
    logits = rearrange(final_logits(model, resid), "(k n) v -> k n v", k=k)
    if (p0, p1) == (0, pairs.n):
        return apply_metric(pairs.metric, logits)
    return torch.stack([chunk_metric(pairs.metric, logits[i], (p0, pairs.n)) for i in range(k)])


def edge_indices(edges: Sequence[int] | torch.Tensor, graph: Graph) -> torch.Tensor:
    """``edges`` (indices into ``graph.edges``; negatives count from the end) as a long tensor: a boolean
    mask, a float, an index out of range or an empty list is refused naming ``edges``."""
    what = f"this graph has {graph.n_edges} edges"
    if isinstance(edges, (torch.Tensor, np.ndarray)):
        t = torch.as_tensor(edges).flatten()
        if t.dtype == torch.bool:
            raise TypeError(
                "edges must be edge indices, got a boolean mask; pass mask.nonzero().flatten() for the edges it marks"
            )
        if t.is_floating_point() or t.is_complex():
            raise TypeError(f"edges must be integer edge indices, got a tensor of {t.dtype}")
        if t.numel() and (int(t.min()) < -graph.n_edges or int(t.max()) >= graph.n_edges):
            bad = int(t[(t < -graph.n_edges) | (t >= graph.n_edges)][0])
            raise IndexError(
                f"edge {bad} is out of range: {what} (0..{graph.n_edges - 1}), negatives count from the end (in edges)"
            )
        idx = t.long() % graph.n_edges if t.numel() else t.long()
    else:
        idx = torch.tensor(check_indices(edges, graph.n_edges, "edge", "edges", what), dtype=torch.long)
    if not idx.numel():
        raise ValueError("edges is empty: give edge indices to score, or None for every edge")
    return idx


@boundary
def edge_patch(
    model: HookedGPT2,
    graph: Graph,
    pairs: Pairs,
    edges: torch.Tensor | Sequence[int] | None = None,
    batch_size: int | None = None,
    progress: bool | None = None,
    max_rows: int = 4096,
    per_position: bool = False,
) -> torch.Tensor:
    """Exact edge patching: the metric's change ``[n_edges_chosen, n]`` (patched − clean, CPU) when one
    edge at a time carries its sender's corrupted output into its receiver, every pair; with
    ``per_position``, ``[n_edges_chosen, n_pos, n]``: the edge patched at one position at a time (zero
    before the first position where any pair differs, where no sender differs).

    ``edges``: indices into ``Graph.edges`` (None: all). Each (edge, pair) is a row of the
    prefix-reuse engine (:func:`~gpt2_interp.analysis.engine.run_staircase`): it starts at the
    receiver's layer from the clean run's residual stream and computes only the positions from the
    first one where the pairs differ, its receiver's input set to the clean input plus the sender's
    corrupted − clean output. ``graph``: the model's :class:`Graph`; ``pairs``: from :func:`pairs_of`;
    ``batch_size``: engine rows per chunk (None: from memory); ``progress``: a progress bar (None: on a
    terminal); ``max_rows``: rows per engine call (bounds the patch values' memory). A row patched at
    position ``p`` computes only the positions from ``p`` (the clean run's keys and values before it).
    """
    graph.fits(model)
    n_layer, n = model.cfg.n_layer, pairs.n
    es, er = graph.edge_index
    chosen = torch.arange(graph.n_edges) if edges is None else edge_indices(edges, graph)
    f = pairs.first
    if per_position:
        _one_length(pairs)
    with split_inputs(model):
        _, diff = sender_differences(model, pairs)
        resid = [f"blocks.{l}.hook_resid_pre" for l in range(n_layer)]
        inputs = [graph.input_of(g) for g in graph.groups]  # each receiver's input before the patch
        names = list(dict.fromkeys(resid + inputs + [entry_name(model, n_layer)] + kv_names(model, 0)))
        cache = _cache(model, pairs.clean, pairs.mask, names)
        entries = {s: cache[entry_name(model, s)] for s in range(n_layer + 1)}
        group_of = torch.empty(graph.n_receivers, dtype=torch.long)
        for i, g in enumerate(graph.groups):
            group_of[g.first : g.first + g.count] = i
        # a logit difference reads only its tokens' columns of the unembedding (rows × d_vocab would dominate)
        cols = Readout(model, pairs.metric, (0, n), n)
        metric = pairs.metric if cols.cols is None or cols.bound is None else cols.bound
        unembed = None if cols.cols is None else _columns(model, cols.cols)

        def readout(logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            return apply_metric(metric, logits.view(-1, n, logits.shape[-1])).flatten()

        P = pairs.n_pos
        # the (edge, position) items: position −1 patches every position from the first differing one
        at = torch.arange(f, P).repeat(chosen.numel()) if per_position else torch.full((chosen.numel(),), -1)
        items = chosen.repeat_interleave(P - f) if per_position else chosen
        base_kv = base_kv_from(cache, model, 0) if f > 0 or per_position else None
        out = []
        per_call = max(1, max_rows // n)
        for a in range(0, items.numel(), per_call):
            part = items[a : a + per_call]
            out.append(
                _edge_rows(
                    model,
                    graph,
                    pairs,
                    (part, at[a : a + per_call]),
                    (es, er, group_of),
                    cache,
                    entries,
                    base_kv,
                    diff,
                    (readout, unembed),
                    batch_size,
                    progress,
                )
            )
    flat = torch.cat(out) if out else torch.empty(0)
    change = flat.view(-1, n).cpu() - pairs.clean_metric[None]
    if not per_position:
        return change
    full = torch.zeros(chosen.numel(), P, n)
    full[:, f:] = change.view(chosen.numel(), P - f, n)
    return full


def _edge_rows(
    model: HookedGPT2,
    graph: Graph,
    pairs: Pairs,
    items: tuple[torch.Tensor, torch.Tensor],
    index: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    cache: dict,
    entries: dict,
    base_kv: Any,
    diff: torch.Tensor,
    read: tuple[Any, Any],
    batch_size: int | None,
    progress: bool | None,
) -> torch.Tensor:
    """Engine rows for ``items = (edges, at)`` (row ``i·n + j``: edge ``edges[i]`` patched at position
    ``at[i]``, −1 for every position from the first differing one, pair ``j``) → metric ``[len(edges)·n]``.
    ``index``: each edge's sender and receiver and each receiver's group; ``read``: ``(readout, unembed)``."""
    part, at = items
    es, er, group_of = index
    readout, unembed = read
    n, P, f = pairs.n, pairs.n_pos, pairs.first
    n_layer = model.cfg.n_layer
    dev = model.device
    k = part.numel()
    pos = torch.arange(f, P, device=dev)[None]  # [1, P − f]
    pair = torch.arange(n).repeat(k)
    rcv = er[part]
    groups = group_of[rcv]
    start = torch.tensor([graph.groups[int(g)].layer for g in groups]).repeat_interleave(n)
    patches = []
    for gi in groups.unique().tolist():
        g = graph.groups[gi]
        which = (groups == gi).nonzero()[:, 0]  # positions in part
        rows = (which[:, None] * n + torch.arange(n)[None]).flatten()  # [m]
        e = part[which].repeat_interleave(n)
        p_idx = torch.arange(n).repeat(which.numel())
        base_in = cache[graph.input_of(g)]  # [n, pos, d_model]
        where = at[which].repeat_interleave(n)  # [m]
        if bool((where < 0).all()):
            p = pos
            values = base_in[p_idx, f:] + diff[p_idx.to(diff.device), f:, es[e].to(diff.device)]  # [m, P − f, d]
        else:
            p = where.to(dev)[:, None]  # [m, 1]
            d_idx = p_idx.to(diff.device)[:, None], where.to(diff.device)[:, None], es[e].to(diff.device)[:, None]
            values = base_in[p_idx[:, None], where[:, None]] + diff[d_idx]  # [m, 1, d]
        r = rows.to(dev)[:, None]
        if g.kind in ("q", "k", "v"):
            head = (er[e] - g.first).to(dev)[:, None]
            patches.append(Patch(g.name, r, (p, head), values))
        elif g.kind == "mlp":
            patches.append(Patch(g.name, r, (p,), values))
        else:
            patches.append(Patch(n_layer, r, (p,), values))
    return run_staircase(
        model,
        entries,
        start,
        pair,
        patches,
        readout,
        pairs.mask,
        batch_size,
        n,
        progress,
        desc="edge patching",
        first_pos=torch.where(at < 0, f, at).repeat_interleave(n),
        base_kv=base_kv,
        unembed=unembed,
    )


def _columns(model: HookedGPT2, cols: torch.Tensor) -> Any:
    """The unembedding restricted to columns ``cols``: ``[r, d_model]`` → ``[r, len(cols)]``."""

    def unembed(x: torch.Tensor) -> torch.Tensor:
        return model.unembed.columns(x, cols)

    return unembed


def chunked_metric(metric: Metric, logits: torch.Tensor, first: int, n: int) -> torch.Tensor:
    """The metric ``[b]`` of a chunk of ``b`` pairs (rows ``first…`` of ``n``), differentiable."""
    return chunk_metric(metric, logits, (first, n))


__all__ = [
    "EDGE_MEMORY",
    "Pairs",
    "edge_patch",
    "head_outputs",
    "pairs_of",
    "post_norm",
    "run_with_edges",
    "scale_hook",
    "sender_differences",
    "sender_hooks",
    "sender_outputs",
    "split_inputs",
]
