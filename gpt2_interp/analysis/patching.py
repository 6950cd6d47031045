"""Activation patching: patch one activation of one run into another, for every layer, position
and head at once, and measure the effect on a metric of the next-token logits.

>>> r = patch(model, "The capital of France is", "The capital of Italy is",
...           logit_diff(" Paris", " Rome"), hook="resid_pre", normalize=True)
>>> r.values.shape            # [n_layer, n_pos]
>>> r.save_plot("patch.png")

Each patched variant is a row of one batch run by the prefix-reuse engine
(:mod:`gpt2_interp.analysis.engine`), which computes only what a patch can change; the
metrics live in :mod:`gpt2_interp.analysis.metrics`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from ..core import distributed
from ..core.boundary import boundary
from ..core.checks import as_selection, check_count, check_indices
from ..core.finite import NonFiniteWarning, is_finite, nonfinite_summary
from ..core.progress import shown
from ..core.result import Result
from ..core.tables import format_table
from ..model.hooks import hook_name
from .engine import (
    Patch,
    Speed,
    Work,
    auto_batch_size,
    base_kv_from,
    check_fits,
    entry_name,
    final_logits,
    kv_names,
    run_staircase,
    staircase_memory,
    staircase_work,
    timed,
    weight_bytes,
)
from .hook_targets import resolve_hook
from .metrics import (
    Metric,
    apply_metric,
    bind_metric,
    kl_to,
    logit_diff,
    metric_name,
    prob,
    refuse_degenerate,
    require_finite_metric,
)

if TYPE_CHECKING:
    from ..model import HookedGPT2

Prompts = str | Sequence[str] | torch.Tensor


# =============================================================== patch targets
_HEAD_SUFFIXES = (
    *("attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z"),
    *("hook_q_input", "hook_k_input", "hook_v_input", "hook_attn_in"),  # the receiver inputs (model switches)
)
_KV_HEAD_SUFFIXES = ("attn.hook_k", "attn.hook_v", "hook_k_input", "hook_v_input")  # n_kv heads under GQA
_PATTERN_SUFFIXES = ("attn.hook_pattern", "attn.hook_attn_scores")


@dataclass
class _Target:
    """What a hook argument patches: its shape kind, and per layer the hook name and start stage."""

    kind: Literal["pos", "head", "pattern"]
    names: dict[int, str]  # layer (or -1 for embeddings, n for ln_final) -> hook name
    entry_offset: int | None  # resid_pre: 0, resid_post: 1 (patched at entry of stage L + offset); None: a hook
    embed: bool = False

    def stage(self, layer: int) -> int:
        return max(layer, 0) + (self.entry_offset or 0)


def _classify(name: str, n: int) -> tuple[Literal["pos", "head", "pattern"], int | None, bool]:
    if name.endswith(_HEAD_SUFFIXES):
        return "head", None, False
    if name.endswith(_PATTERN_SUFFIXES):
        return "pattern", None, False
    if name.endswith("hook_resid_pre"):
        return "pos", 0, False
    if name.endswith("hook_resid_post"):
        return "pos", 1, False
    if name in ("hook_embed", "hook_pos_embed"):
        return "pos", 0, True
    return "pos", None, False


def _target(model: HookedGPT2, hook: str, layers: Sequence[int] | None) -> tuple[_Target, list[int]]:
    _, names = resolve_hook(model, hook, layers)
    chosen = list(names)
    kind, offset, embed = _classify(names[chosen[0]] if chosen else hook_name(hook, 0), model.cfg.n_layer)
    return _Target(kind, names, offset, embed), chosen


# =============================================================== inputs
def _as_rows(x: Prompts) -> list[str] | torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x if x.ndim == 2 else x[None]
    return [x] if isinstance(x, str) else list(x)


def pair_tokens(
    model: HookedGPT2, clean: Prompts, corrupted: Prompts
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(clean [n, pos], corrupted [n, pos], attention_mask [n, pos] or None)``: prompt pairs tokenized
    together (left-padded to one width); each pair must have the same number of tokens."""
    c, k = _as_rows(clean), _as_rows(corrupted)
    if isinstance(c, torch.Tensor) != isinstance(k, torch.Tensor):
        raise TypeError("pass clean and corrupted both as text or both as token tensors")
    if len(c) != len(k):
        raise ValueError(
            f"{len(c)} clean prompts but {len(k)} corrupted prompts; pass one corrupted prompt per clean prompt"
        )
    if isinstance(c, torch.Tensor) and isinstance(k, torch.Tensor):
        if c.shape != k.shape:
            raise ValueError(
                f"clean tokens {tuple(c.shape)} and corrupted tokens {tuple(k.shape)} differ in shape; "
                "patching needs aligned positions"
            )
        return model.as_tokens(c, None)[0], model.as_tokens(k, None)[0], None
    assert isinstance(c, list) and isinstance(k, list), "both are text (checked above)"
    for a, b in zip(c, k):
        ta, tb = model.to_str_tokens(a), model.to_str_tokens(b)
        if len(ta) != len(tb):
            raise ValueError(
                f"clean and corrupted prompts must have the same number of tokens to patch position by position:\n"
                f"  clean     {a!r} -> {len(ta)} tokens {ta}\n  corrupted {b!r} -> {len(tb)} tokens {tb}\n"
                "reword one of them (e.g. swap in a subject with the same token count)"
            )
    tokens, mask = model.tokenize(c + k)
    return tokens[: len(c)], tokens[len(c) :], None if mask is None else mask[: len(c)]


def position_labels(
    model: HookedGPT2, clean: torch.Tensor, corrupted: torch.Tensor, mask: torch.Tensor | None
) -> list[str]:
    """Position labels of a patching result: pair 0's tokens, ``"clean/corrupted"`` where they differ,
    ``""`` for padding."""
    labels = []
    for i, (a, b) in enumerate(zip(clean[0].tolist(), corrupted[0].tolist())):
        if mask is not None and not mask[0, i]:
            labels.append("")
        else:
            sa, sb = model.tokenizer.token_str(a), model.tokenizer.token_str(b)
            labels.append(sa if a == b else f"{sa}/{sb}")
    return labels


# =============================================================== the result
@boundary
@dataclass
class PatchResult(Result):
    """Patching metric per patched component.

    ``values``: mean over prompt pairs, shaped by ``index_names``: ``("layer", "pos")``,
    ``("layer", "head")`` (head patched at every position) or ``("layer", "pos", "head")``;
    ``pair_values``: the same per pair, ``[n_pairs, ...]``. With ``normalized`` both are
    rescaled so 0 = the corrupted run's metric and 1 = the clean run's (for ``values``, of the
    pair-averaged metrics), in both directions. Raw baselines are in ``clean_metric`` /
    ``corrupted_metric`` (pair means) and the ``*_pair_metric`` tensors.

    - ``layers`` (block indices) and ``layer_labels`` label the layer axis; ``positions`` and
      ``position_labels`` the position axis (None without one; labels show ``"clean/corrupted"``
      where the pair's tokens differ); ``heads`` and ``head_labels`` the head axis (None without one);
    - ``hook``: the patched hook family or name; ``direction``: ``"denoise"`` or ``"noise"``;
      ``metric``: the metric's name; ``normalized``: whether values are rescaled as above;
    - ``clean_pair_metric``/``corrupted_pair_metric`` ``[n_pairs]``: the metric on each unpatched run.
    """

    result_kind = "patching"

    values: torch.Tensor
    pair_values: torch.Tensor
    index_names: tuple[str, ...]
    layers: list[int]
    layer_labels: list[str]
    positions: list[int] | None
    position_labels: list[str] | None
    heads: list[int] | None
    head_labels: list[str] | None
    hook: str
    direction: str
    metric: str
    normalized: bool
    clean_metric: float
    corrupted_metric: float
    clean_pair_metric: torch.Tensor = field(repr=False)
    corrupted_pair_metric: torch.Tensor = field(repr=False)

    def plot(self, **kwargs: Any):
        from ..plots.causal import plot_patch

        return plot_patch(self, **kwargs)

    @property
    def baseline(self) -> float:
        """The value meaning "no effect": the unpatched (base) run's metric — the corrupted run when
        denoising, the clean run when noising (0 and 1 when normalised)."""
        if self.normalized:
            return 0.0 if self.direction == "denoise" else 1.0
        return self.corrupted_metric if self.direction == "denoise" else self.clean_metric

    def table(self, k: int = 8) -> str:
        """The baselines, then the ``k`` largest effects, one per row under a header naming the columns:
        the patched cell, the metric with it patched, and the effect (that minus :attr:`baseline`)."""
        k = check_count(k, "k", minimum=0)
        return "\n".join([self.heading("patching") + "; largest effects:", *self.effect_rows(k)])

    def heading(self, what: str) -> str:
        """The sweep's line above its table: direction, hook, metric, the clean, corrupted and baseline values."""
        norm = " (values normalised: 0 = corrupted, 1 = clean)" if self.normalized else ""
        base = "corrupted" if self.direction == "denoise" else "clean"
        return (
            f"{self.direction} {what} of {self.hook}, metric {self.metric}: clean {self.clean_metric:.4g}, "
            f"corrupted {self.corrupted_metric:.4g}{norm}; baseline (the unpatched {base} run) {self.baseline:.4g}"
        )

    def label(self, idx: tuple[int, ...]) -> str:
        """``"L3 ' Paris' H2"``-style label of the cell at ``idx`` (an index into :attr:`values`)."""
        parts = [self.layer_labels[idx[0]]]
        pos_labels, head_labels = self.position_labels or [], self.head_labels or []  # set where indexed
        for name, i in zip(self.index_names[1:], idx[1:]):
            parts.append(repr(pos_labels[i]) if name == "pos" else head_labels[i])
        return " ".join(parts)

    def effect_rows(self, k: int, estimated: str = "") -> list[str]:
        """The table of the ``k`` cells :meth:`top` ranks first: a header naming the columns (prefixed
        with ``estimated``), then the cell, its patched metric and its effect."""
        cell = "cell (" + ", ".join("position" if n == "pos" else n for n in self.index_names) + ")"
        rows = [[self.label(idx), f"{v:+.4f}", f"{v - self.baseline:+.4f}"] for idx, v in self.top(k)]
        header = [cell, f"{estimated}patched metric", f"{estimated}effect (patched − baseline)"]
        return format_table(header, rows, right=[False, True, True])

    def top(self, k: int = 5) -> list[tuple[tuple[int, ...], float]]:
        """The ``k`` entries that move the metric most from :attr:`baseline`, as ``((layer, pos|head, ...), value)``."""
        k = check_count(k, "k", minimum=0)
        flat = self.values.flatten()
        idx = (flat - self.baseline).abs().topk(min(k, flat.numel())).indices
        return [(tuple(int(i) for i in torch.unravel_index(j, self.values.shape)), float(flat[j])) for j in idx]


# =============================================================== patch()
def _positions(positions: Sequence[int] | str | None, P: int, each: bool) -> tuple[list[list[int]], list[int] | None]:
    """Per item, the positions it patches; and the position axis (None when all are patched together).
    ``None`` means every position one by one when ``each``, else all together."""
    if positions is None and each:
        positions = range(P)
    if positions is None or positions == "all":
        return [list(range(P))], None
    if isinstance(positions, str):
        raise ValueError(f"positions must be a list of ints, None or 'all', not {positions!r}")
    ps = check_indices(positions, P, "position", "positions", f"the prompts have {P} tokens")
    return [[p] for p in ps], ps


def _items(
    model: HookedGPT2, hook: str, layers: Any, positions: Any, heads: Any, P: int
) -> tuple[_Target, list[int], list[tuple[int, list[int], list[int]]], list[int] | None, list[int] | None]:
    """What a sweep patches: ``(target, layers, items, position axis, head axis)``, one item
    ``(layer, positions, heads)`` per patched run of a pair, ordered by start stage."""
    target, layers_ = _target(model, hook, layers)
    pos_items, pos_axis = _positions(positions, P, each=target.kind == "pos")
    head_items, head_axis = _heads(model, target, heads, hook)
    items = [(l, p, h) for l in sorted(layers_, key=target.stage) for p in pos_items for h in head_items]
    return target, layers_, items, pos_axis, head_axis


@boundary
def sweep_work(
    model: HookedGPT2,
    n_pos: int,
    hook: str = "resid_pre",
    layers: Sequence[int] | None = None,
    positions: Sequence[int] | Literal["all"] | None = None,
    heads: Sequence[int] | Literal["all"] | None = None,
    n_pairs: int = 1,
    batch_size: int | None = None,
) -> Work:
    """The work of :func:`patch` on ``n_pairs`` prompt pairs (default 1) of ``n_pos`` tokens,
    counted before running (:class:`~.engine.Work`): the two unpatched runs, then one row per
    patched item and pair, computing blocks from its start stage on over positions from its first
    patched one on. ``memory`` is the expected peak (:func:`~.engine.staircase_memory`: the weights,
    the unpatched runs' cached residuals, keys/values and patched-in activations, one chunk of
    ``batch_size`` rows — None: sized from the free memory) and ``split`` the chunks it takes.
    ``hook``, ``layers``, ``positions``, ``heads`` as in :func:`patch`. ``n_pos``, ``n_pairs`` and
    ``batch_size`` below 1 are refused (ValueError naming the argument)."""
    check_count(n_pos, "n_pos")
    check_count(n_pairs, "n_pairs")
    positions, heads = as_selection(positions, "positions"), as_selection(heads, "heads")
    target, layers_, items, _, _ = _items(model, hook, layers, positions, heads, n_pos)
    n, c = model.cfg.n_layer, model.cfg
    runs, tokens, token_layers = staircase_work(
        n, n_pos, [target.stage(l) for l, _, _ in items], [min(p) for _, p, _ in items]
    )
    stages = sorted({target.stage(l) for l in layers_})
    suffix = any(min(p) > 0 for _, p, _ in items) and stages[0] < n
    per_pos = sum(1 for s in stages if s < n) * c.d_model + (2 * (n - stages[0]) * c.n_kv * c.d_head if suffix else 0)
    per_pos += len(layers_) * (c.n_head * n_pos if "pattern" in hook or "scores" in hook else c.d_model)
    size = torch.finfo(model.dtype).bits // 8
    attention = "pattern" in hook or "scores" in hook
    b = auto_batch_size(model, n_pos, attention) if batch_size is None else batch_size
    b = max(n_pairs, b // n_pairs * n_pairs)
    return Work(
        f"exact patching of {hook}",
        (runs + 2) * n_pairs,
        (tokens + 2 * n_pos) * n_pairs,
        (2 + token_layers / (n_pos * n)) * n_pairs,
        memory=staircase_memory(
            model,
            n_pos,
            [min(p) for _, p, _ in items for _ in range(n_pairs)],
            n_pairs * n_pos * per_pos * size,
            b,
            attention,
        ),
        split=f"chunks of ≤ {b} rows",
    )


@boundary
def estimate(
    model: HookedGPT2,
    clean: Prompts,
    corrupted: Prompts,
    hook: str = "resid_pre",
    layers: Sequence[int] | None = None,
    positions: Sequence[int] | Literal["all"] | None = None,
    heads: Sequence[int] | Literal["all"] | None = None,
    batch_size: int | None = None,
) -> Work:
    """What :func:`patch` with these arguments would cost, before running it: :func:`sweep_work` for
    the tokenized pairs (runs, forward passes, peak memory and the split into chunks) with the
    expected seconds — its forward passes at the time of one unpatched forward of the pairs measured
    here (an upper bound: batched rows run faster per pass). Arguments as in :func:`patch`."""
    clean_t, _, mask = pair_tokens(model, clean, corrupted)
    n_pairs, P = clean_t.shape
    work = sweep_work(model, P, hook, layers, positions, heads, n_pairs, batch_size)
    with torch.inference_mode():
        model(clean_t, attention_mask=mask, stop_at_layer=model.cfg.n_layer)  # warm-up
        _, seconds = timed(model, lambda: model(clean_t, attention_mask=mask, stop_at_layer=model.cfg.n_layer))
    work.seconds = work.passes / n_pairs * seconds
    return work


@boundary
def patch(
    model: HookedGPT2,
    clean: Prompts,
    corrupted: Prompts,
    metric: Metric,
    hook: str = "resid_pre",
    layers: Sequence[int] | None = None,
    positions: Sequence[int] | Literal["all"] | None = None,
    heads: Sequence[int] | Literal["all"] | None = None,
    direction: Literal["denoise", "noise"] = "denoise",
    normalize: bool = False,
    batch_size: int | None = None,
    progress: bool | None = None,
    group: Any = None,
) -> PatchResult:
    """Activation patching sweep, batched.

    ``denoise``: run the corrupted prompt(s), patch in one clean activation at a time; ``noise``:
    run clean, patch in corrupted. ``clean``/``corrupted``: a prompt, a list of prompt pairs
    (left-padded; each pair of equal token length) or token tensors ``[n, pos]``.

    ``metric(logits [..., n_pairs, d_vocab]) -> [..., n_pairs]`` sees last-position logits only
    (one value per run — cheap: no full unembedding); use :func:`logit_diff`, :func:`prob`,
    :func:`kl_to`. ``values`` is its mean over pairs; ``pair_values`` keeps each pair.

    ``hook``: a family (``resid_pre|resid_mid|resid_post|attn_out|mlp_out`` per position,
    ``z|q|k|v|pattern`` per head, and per head the receiver inputs ``q_input|k_input|v_input|attn_in``
    while the model's switch is on, e.g. ``model.set_use_split_qkv_input(True)``; anything
    ``hook_name`` knows) swept over ``layers`` (default all), or one full hook name. Per-position
    families give ``[layer, pos]`` over ``positions`` (default every position; ``"all"``: all
    positions patched together, one column). Per-head families give ``[layer, head]`` patching each
    head at every position, or ``[layer, pos, head]`` when ``positions`` is a list; ``heads`` picks
    heads (``"all"``: together); ``k``, ``v``, ``k_input`` and ``v_input`` have the key/value heads.

    ``direction``: ``"denoise"`` (default) or ``"noise"``; ``normalize`` (default False) rescales
    the values so 0 = the corrupted run's metric and 1 = the clean run's. ``batch_size``: rows per
    staircase chunk (None: sized from the free memory); ``progress``: a progress bar (None:
    automatic). Returns a :class:`PatchResult` (tensors on the CPU).

    Distributed (an initialised process group, or ``group``), with at least one pair per rank and
    one of our metrics: each rank patches its share of the pairs and every rank returns the
    single-process result (pair values gathered in order). Other metrics run every pair on every rank.

    Refused before any work: text on one side and tokens on the other (TypeError); another
    ``direction``, different numbers of clean and corrupted prompts, a pair of different token
    lengths, ``layers`` with one full hook name, ``heads`` with a per-position hook, a logit difference whose answer
    and wrong are the same token for every pair, a non-finite metric on the unpatched runs, and
    ``normalize`` when the clean and corrupted metrics coincide (ValueError); a layer, position or
    head out of range (IndexError); an unknown hook name or family (KeyError, with the closest).
    """
    if direction not in ("denoise", "noise"):
        raise ValueError(
            "direction must be 'denoise' (patch clean into corrupted) or 'noise' (corrupted into clean), not "
            f"{direction!r}"
        )
    n = model.cfg.n_layer
    metric = refuse_degenerate(
        bind_metric(metric, model), model
    )  # token strings resolved (and checked) before any work
    all_t = pair_tokens(model, clean, corrupted)  # every pair, for the position labels
    n_all = all_t[0].shape[0]
    metric, (clean_t, corr_t, mask), mine = _my_pairs(metric, all_t, group)
    n_pairs, P = clean_t.shape
    positions, heads = as_selection(positions, "positions"), as_selection(heads, "heads")
    target, layers_, items, pos_axis, head_axis = _items(model, hook, layers, positions, heads, P)
    base_t, src_t = (corr_t, clean_t) if direction == "denoise" else (clean_t, corr_t)

    # refused before any work when the sweep's own estimate says it cannot fit (rows are chunked to fit;
    # the unpatched runs' caches are not)
    check_fits(
        sweep_work(model, P, hook, layers, positions, heads, n_pairs, batch_size), model.device, weight_bytes(model)
    )
    # a patch at positions ≥ p leaves positions < p as in the base run: rows compute only the suffix
    first = [min(p) for _, p, _ in items]
    runs, seconds = timed(model, lambda: _unpatched(model, target, layers_, base_t, src_t, mask, suffix=max(first) > 0))
    clean_logits, corr_logits = (
        (runs.src_logits, runs.base_logits) if direction == "denoise" else (runs.base_logits, runs.src_logits)
    )
    metric = bind_metric(metric, model, clean_logits)
    clean_m = apply_metric(metric, clean_logits[None])[0].cpu()
    corr_m = apply_metric(metric, corr_logits[None])[0].cpu()
    require_finite_metric(metric, {"clean": clean_m, "corrupted": corr_m})

    # one item per (layer, positions, heads); rows = items × pairs
    k = len(items)
    start = torch.tensor([target.stage(l) for l, _, _ in items]).repeat_interleave(n_pairs)
    edits = [
        _layer_edit(
            target,
            l,
            [i for i, it in enumerate(items) if it[0] == l],
            items,
            n_pairs,
            runs.src_cache,
            runs.base_cache,
            runs.entries,
            model.device,
        )
        for l in layers_
    ]

    def readout(logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:  # rows come whole items at a time
        return apply_metric(metric, logits.view(-1, n_pairs, logits.shape[-1])).flatten()

    pair = torch.arange(n_pairs).repeat(k)
    flat = run_staircase(
        model,
        runs.entries,
        start,
        pair,
        edits,
        readout,
        mask,
        batch_size,
        n_pairs,
        progress,
        desc=f"patching {hook}",
        first_pos=torch.tensor(first).repeat_interleave(n_pairs),
        base_kv=base_kv_from(runs.base_cache, model, runs.stages[0]) if runs.suffix else None,
        speed=Speed.measure(model, seconds, 2 * n_pairs * P * n, 2 * n) if shown(progress) else None,
    )
    # back to the caller's layer order, then [n_pairs, layer, pos items, head items]
    order = torch.argsort(torch.tensor([layers_.index(l) for l, _, _ in items]), stable=True)
    per_pair = (
        flat.view(k, n_pairs).T.cpu()[:, order].reshape(n_pairs, len(layers_), -1, len({tuple(h) for _, _, h in items}))
    )
    if mine is not None:
        per_pair, clean_m, corr_m = (
            torch.stack(distributed.gather_in_order(list(x), n_all, group)) for x in (per_pair, clean_m, corr_m)
        )
    index_names: tuple[str, ...]
    if target.kind == "pos":
        index_names, per_pair = ("layer", "pos"), per_pair[..., 0]
    elif pos_axis is None:
        index_names, per_pair = ("layer", "head"), per_pair[:, :, 0]
    else:
        index_names = ("layer", "pos", "head")
    _warn_nonfinite(per_pair, hook, metric, index_names)
    mean = per_pair.mean(0)
    if normalize:
        mean, per_pair, _ = normalize_effects(mean, per_pair, clean_m, corr_m)
    return PatchResult(
        **result_fields(
            model,
            mean,
            per_pair,
            index_names,
            layers_,
            pos_axis,
            head_axis,
            position_labels(model, *all_t),
            hook,
            direction,
            metric,
            normalize,
            clean_m,
            corr_m,
        )
    )


def _my_pairs(
    metric: Any, tokens: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None], group: Any
) -> tuple[Any, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None], list[int] | None]:
    """The pairs this process patches: all of them, or under ``torch.distributed`` (at least one pair
    per rank, one of our metrics) its share — tokenised together first, so positions line up — with
    the metric restricted to those rows. Returns ``(metric, (clean, corrupted, mask), mine or None)``."""
    clean_t, corr_t, mask = tokens
    n_all = clean_t.shape[0]
    if not (distributed.is_distributed(group) and n_all >= distributed.world_size(group)):
        return metric, tokens, None
    mine = list(distributed.shard_indices(n_all, group))
    local_metric = _metric_rows(metric, mine, n_all)
    if local_metric is None:
        return metric, tokens, None
    return local_metric, (clean_t[mine], corr_t[mine], None if mask is None else mask[mine]), mine


def _heads(model: HookedGPT2, target: Any, heads: Any, hook: str) -> tuple[list[list[int]], list[int] | None]:
    """``(head items, head axis)``: one item of no head for per-position families; else each head
    (or the chosen ``heads``), or all heads together for ``"all"`` (no axis)."""
    if target.kind == "pos":
        if heads is not None:
            raise ValueError(
                f"heads are for per-head hooks (z, q, k, v, pattern, q_input, …); {hook!r} has no head axis"
            )
        return [[]], None
    kv = next(iter(target.names.values()), hook).endswith(_KV_HEAD_SUFFIXES)
    H = model.cfg.n_kv if kv else model.cfg.n_head
    if heads is None:
        axis: list[int] | None = list(range(H))
    elif heads == "all":
        axis = None
    else:
        axis = check_indices(heads, H, "head", "heads", f"the model has {H} {'key/value ' if kv else ''}heads")
    return ([list(range(H))] if axis is None else [[h] for h in axis]), axis


@dataclass
class _Unpatched:
    """The base and source runs a sweep starts from."""

    stages: list[int]  # start stages of the patched layers, ascending
    suffix: bool  # rows compute only the positions from their first patched one on
    base_final: torch.Tensor
    base_cache: Any
    src_cache: Any
    base_logits: torch.Tensor  # [n_pairs, d_vocab], last position
    src_logits: torch.Tensor
    entries: dict[int, torch.Tensor]  # stage -> the base run's residual entering it


def _unpatched(
    model: HookedGPT2,
    target: Any,
    layers_: list[int],
    base_t: torch.Tensor,
    src_t: torch.Tensor,
    mask: torch.Tensor | None,
    suffix: bool,
) -> _Unpatched:
    """The base run (its residual at every start stage, and the keys/values a suffix row reuses) and
    the source run (the activations patched in), without autograd."""
    n = model.cfg.n_layer
    stages = sorted({target.stage(l) for l in layers_})
    suffix = suffix and stages[0] < n
    base_names = {entry_name(model, s) for s in stages if s < n} | set(kv_names(model, stages[0]) if suffix else ())
    if target.embed:
        base_names.add(target.names[-1])
    src_names = set(target.names.values())
    src_cache: Mapping[str, torch.Tensor]  # the run's ActivationCache, or the ln_final activations alone
    with torch.inference_mode():
        base_final, base_cache = model.run_with_cache(
            base_t, names_filter=list(base_names), attention_mask=mask, stop_at_layer=n
        )
        src_final, src_cache = model.run_with_cache(
            src_t, names_filter=list(src_names), attention_mask=mask, stop_at_layer=n
        )
        base_logits, src_logits = final_logits(model, base_final), final_logits(model, src_final)
        if any(name.startswith("ln_final") for name in src_names):  # not reached by stop_at_layer=n
            store: dict[str, torch.Tensor] = {}
            with model.hooks([(name, lambda act, hook: store.__setitem__(hook.name, act)) for name in src_names]):
                model.ln_final(src_final)
            src_cache = store
    entries = {s: (base_cache[entry_name(model, s)] if s < n else base_final) for s in stages}
    return _Unpatched(stages, suffix, base_final, base_cache, src_cache, base_logits, src_logits, entries)


def _warn_nonfinite(per_pair: torch.Tensor, hook: str, metric: Any, index_names: tuple[str, ...]) -> None:
    """Warn (naming the first cell) when the metric is NaN/inf for some patched runs."""
    if not is_finite(per_pair):
        bad = (~torch.isfinite(per_pair)).nonzero()[0].tolist()
        warnings.warn(
            f"patching {hook}: metric {metric_name(metric)} is not finite for some patched runs "
            f"({nonfinite_summary(per_pair)}; first at pair {bad[0]}, index {tuple(bad[1:])} of "
            f"{index_names}); those cells are NaN/inf in the result",
            NonFiniteWarning,
            stacklevel=3,
        )


def normalize_effects(
    mean: torch.Tensor, per_pair: torch.Tensor, clean_m: torch.Tensor, corr_m: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Effects rescaled so 0 = the corrupted run's metric and 1 = the clean run's: ``mean`` by the
    pair-averaged metrics, ``per_pair`` ``[n_pairs, ...]`` by each pair's own; also returns the
    averaged gap. Raises when the clean and corrupted metrics coincide (undefined)."""
    gap, pair_gap = float(clean_m.mean() - corr_m.mean()), clean_m - corr_m
    if gap == 0 or bool((pair_gap == 0).any()):
        raise ValueError(
            f"clean and corrupted runs give the same metric ({float(clean_m.mean()):.4g}); "
            "normalisation is undefined — check the prompts and the metric"
        )
    bcast = (-1,) + (1,) * mean.ndim
    return (mean - corr_m.mean()) / gap, (per_pair - corr_m.view(bcast)) / pair_gap.view(bcast), gap


def result_fields(
    model: HookedGPT2,
    mean: torch.Tensor,
    per_pair: torch.Tensor,
    index_names: tuple[str, ...],
    layers: list[int],
    pos_axis: list[int] | None,
    head_axis: list[int] | None,
    labels: list[str],
    hook: str,
    direction: str,
    metric: Metric,
    normalize: bool,
    clean_m: torch.Tensor,
    corr_m: torch.Tensor,
) -> dict[str, Any]:
    """The fields of a :class:`PatchResult` (shared by patching and attribution estimates): values,
    their axes and labels (``labels``: every position's label), the metric and its baselines."""
    n = model.cfg.n_layer
    return dict(
        values=mean,
        pair_values=per_pair,
        index_names=index_names,
        layers=layers,
        layer_labels=[("embed" if l < 0 else "ln_final" if l >= n else f"L{l}") for l in layers],
        positions=pos_axis,
        position_labels=None
        if "pos" not in index_names
        else ["all"]
        if pos_axis is None
        else [labels[p] for p in pos_axis],
        heads=head_axis,
        head_labels=None
        if "head" not in index_names
        else ["all"]
        if head_axis is None
        else [f"H{h}" for h in head_axis],
        hook=hook,
        direction=direction,
        metric=metric_name(metric),
        normalized=normalize,
        clean_metric=float(clean_m.mean()),
        corrupted_metric=float(corr_m.mean()),
        clean_pair_metric=clean_m,
        corrupted_pair_metric=corr_m,
    )


def _metric_rows(metric: Metric, rows: list[int], n_pairs: int) -> Metric | None:
    """``metric`` restricted to pairs ``rows``: a dataclass metric (ours) with its per-pair tensor
    fields (first dim ``n_pairs``) indexed; None for other callables, which may depend on the pairs
    in ways we cannot see (the caller then runs every pair itself)."""
    if not dataclasses.is_dataclass(metric):
        return None
    changes = {
        f.name: getattr(metric, f.name)[rows]
        for f in dataclasses.fields(metric)
        if isinstance(getattr(metric, f.name), torch.Tensor)
        and getattr(metric, f.name).ndim >= 1
        and getattr(metric, f.name).shape[0] == n_pairs
    }
    return dataclasses.replace(metric, **changes)


def _layer_edit(
    target: _Target,
    layer: int,
    ids: list[int],
    items: list,
    n_pairs: int,
    src_cache: Mapping[str, torch.Tensor],
    base_cache: Mapping[str, torch.Tensor],
    entries: Mapping[int, torch.Tensor],
    dev: torch.device,
) -> Patch:
    """The edit for every row of ``layer``'s items: copy the source run's activation at the item's
    positions (and heads) into its rows."""
    # index tensors are built on the CPU and sent with non_blocking (no host sync); rows stay on the
    # CPU, where run_staircase chooses each chunk's rows
    rows = (torch.tensor(ids)[:, None] * n_pairs + torch.arange(n_pairs)).flatten()  # [r]
    j = (rows % n_pairs).to(dev, non_blocking=True)  # the pair of each row
    pos = torch.tensor([items[i][1] for i in ids]).repeat_interleave(n_pairs, 0).to(dev, non_blocking=True)  # [r, m]
    name = target.names[layer]
    src = src_cache[name]
    if target.kind == "pos":  # act [b, pos, ...]
        values = src[j[:, None], pos]
        if target.embed:  # embeddings are patched as their difference on the residual entering block 0
            values = values - base_cache[name][j[:, None], pos] + entries[0][j[:, None], pos]
        where = target.stage(layer) if target.entry_offset is not None else name
        return Patch(where, rows[:, None], (pos,), values, pos_dim=0)
    hd = torch.tensor([items[i][2] for i in ids]).repeat_interleave(n_pairs, 0).to(dev, non_blocking=True)  # [r, g]
    if target.kind == "head":  # act [b, pos, head, d_head]
        idx, pos_dim = (pos[:, :, None], hd[:, None, :]), 0
    else:  # act [b, head, q_pos, k_pos]: patch the rows of the query positions
        idx, pos_dim = (hd[:, :, None], pos[:, None, :]), 1
    at = (j[:, None, None], *idx)
    return Patch(name, rows[:, None, None], idx, src[at], pos_dim)


__all__ = [
    "PatchResult",
    "Prompts",
    "estimate",
    "normalize_effects",
    "pair_tokens",
    "patch",
    "position_labels",
    "result_fields",
    "sweep_work",
]
# the metrics, re-exported: patching code usually wants them in one import
__all__ += ["Metric", "kl_to", "logit_diff", "metric_name", "prob"]
