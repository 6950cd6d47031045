"""Activation patching as a few big batched forward passes.

TransformerLens's ``patching`` runs one full forward pass per (layer, position)
patch. Here every patched variant becomes a row of one batch and each row starts
at its patch layer, from the unpatched run's cached residual stream: the layers
before the patch are computed once, not once per patch. Rows are run as a
*staircase* — at layer ``L`` the rows whose patch sits at ``L`` join the batch —
so a whole sweep is ``n_layer`` block calls per memory-sized chunk. Only the
last position is unembedded (metrics are functions of the next-token logits).

>>> r = patch(model, "The capital of France is", "The capital of Italy is",
...           logit_diff(" Paris", " Rome"), hook="resid_pre", normalize=True)
>>> r.values.shape            # [n_layer, n_pos]
>>> r.save_plot("patch.png")

The batching engine (:func:`run_staircase`) is shared with causal tracing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Union

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..io import tokenizer as tok
from ..model.hooks import hook_name, layer_of, suggest
from .result import Result

if TYPE_CHECKING:
    from ..model import HookedGPT2

Metric = Callable[[torch.Tensor], torch.Tensor]
Prompts = Union[str, Sequence[str], torch.Tensor]
Ids = Union[str, int, Sequence[Union[str, int]], torch.Tensor]

#: Activation memory one chunk of patched rows may use (bytes), CPU; on CUDA a quarter of free memory.
CPU_MEMORY_BUDGET = 1 << 30


# =============================================================== ready-made metrics
def _single_id(x: str | int) -> int:
    if isinstance(x, int):
        return x
    ids = tok.encode(x)
    if len(ids) != 1:
        hint = "; GPT-2 words usually start with a space, e.g. ' Paris'" if x[:1] != " " else ""
        raise ValueError(f"{x!r} is {len(ids)} tokens {[tok.token_str(i) for i in ids]}, not one{hint}")
    return ids[0]


def _ids(x: Ids) -> torch.Tensor:
    """One id (a 0-d tensor) or one per prompt pair ([n_pairs])."""
    if isinstance(x, torch.Tensor):
        return x.long()
    if isinstance(x, (str, int)):
        return torch.tensor(_single_id(x))
    return torch.tensor([_single_id(i) for i in x])


def _pick(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``logits[..., n, d_vocab]`` at ``ids`` (scalar or ``[n]``) → ``[..., n]``."""
    ids = ids.to(logits.device).expand(logits.shape[:-1])
    return logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1)


@dataclass
class LogitDiff:
    """``logit[answer] − logit[wrong]`` at the last position (ids: one, or one per pair)."""

    answer: torch.Tensor
    wrong: torch.Tensor
    name: str = "logit_diff"

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return _pick(logits, self.answer) - _pick(logits, self.wrong)


@dataclass
class Prob:
    """Next-token probability of ``answer``."""

    answer: torch.Tensor
    name: str = "prob"

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return _pick(logits.float().log_softmax(-1), self.answer).exp()


@dataclass
class KLTo:
    """``KL(reference ‖ patched)`` of next-token distributions; lower is closer. ``reference``
    ``[n_pairs, d_vocab]`` logits, or None for "the clean run of this patch" (filled in by ``patch``)."""

    reference: torch.Tensor | None = None
    name: str = "kl_to_clean"

    def bind(self, clean_logits: torch.Tensor) -> "KLTo":
        return self if self.reference is not None else KLTo(clean_logits, self.name)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.reference is None:
            raise ValueError("kl_to() has no reference logits; pass them, or use it through patch()")
        ref = self.reference.float().to(logits.device).log_softmax(-1)
        return F.kl_div(logits.float().log_softmax(-1), ref, log_target=True, reduction="none").sum(-1)


def logit_diff(answer: Ids, wrong: Ids) -> LogitDiff:
    """Metric ``logit[answer] − logit[wrong]``; tokens as strings (one token each) or ids, one or one per pair."""
    return LogitDiff(_ids(answer), _ids(wrong), f"logit_diff({answer!r}, {wrong!r})" if isinstance(answer, str) else "logit_diff")


def prob(answer: Ids) -> Prob:
    """Metric: next-token probability of ``answer``."""
    return Prob(_ids(answer), f"prob({answer!r})" if isinstance(answer, str) else "prob")


def kl_to(clean: torch.Tensor | None = None) -> KLTo:
    """Metric: KL divergence from the clean next-token distribution (``clean`` logits ``[n_pairs, d_vocab]``,
    default: the clean run of the patch it is used in)."""
    return KLTo(clean)


def metric_name(metric: Metric) -> str:
    return str(getattr(metric, "name", getattr(metric, "__name__", "metric")))


def _apply_metric(metric: Metric, logits: torch.Tensor) -> torch.Tensor:
    """``logits [k, n_pairs, d_vocab]`` → ``[k, n_pairs]`` float, with a clear error for a reducing metric."""
    out = metric(logits.float())
    out = torch.as_tensor(out, device=logits.device)
    if out.shape != logits.shape[:-1]:
        raise ValueError(
            f"metric {metric_name(metric)} returned shape {tuple(out.shape)} for logits {tuple(logits.shape)}; "
            f"a metric maps last-position logits [..., n_pairs, d_vocab] to [..., n_pairs] (one value per run) — "
            "do not average inside it (patch averages over pairs itself)"
        )
    return out.float()


# =============================================================== the batching engine
@dataclass
class Edit:
    """Replace part of an activation for some rows of a staircase run.

    ``where``: a hook name (the edit runs as a hook there) or an int stage ``s`` (the edit applies
    to the residual stream entering block ``s`` as the rows start; ``s == n_layer`` is the final
    residual before ``ln_final``). ``act[rows, *index] = values``: ``rows`` and each ``index``
    tensor have first dim ``k`` (or 1 for ``index``) and broadcast together; ``values`` ``[k, ...]``.
    """

    where: str | int
    rows: torch.Tensor
    index: tuple[torch.Tensor, ...]
    values: torch.Tensor

    def select(self, lo: int, hi: int) -> "Edit | None":
        """The part of this edit for rows ``[lo, hi)``, with rows renumbered from ``lo``."""
        k = self.rows.shape[0]
        sel = self.rows.reshape(k, -1)[:, 0]
        sel = (sel >= lo) & (sel < hi)
        if not bool(sel.any()):
            return None
        if bool(sel.all()):
            return Edit(self.where, self.rows - lo, self.index, self.values)

        def pick(t: torch.Tensor) -> torch.Tensor:
            return t[sel] if t.shape[0] == k else t

        return Edit(self.where, pick(self.rows) - lo, tuple(pick(i) for i in self.index), pick(self.values))

    def apply(self, act: torch.Tensor) -> torch.Tensor:
        return act.index_put((self.rows, *self.index), self.values.to(act.dtype))


def _hook_fn(edits: list[Edit]) -> Callable:
    def fn(act: torch.Tensor, hook: Any) -> torch.Tensor:
        for e in edits:
            act = e.apply(act)
        return act

    return fn


def entry_name(model: "HookedGPT2", stage: int) -> str:
    """The hook whose activation is the residual entering block ``stage`` (``n_layer``: the final residual)."""
    n = model.cfg.n_layer
    return f"blocks.{stage}.hook_resid_pre" if stage < n else f"blocks.{n - 1}.hook_resid_post"


def auto_batch_size(model: "HookedGPT2", n_pos: int, materialise_attention: bool = False) -> int:
    """Rows per chunk so that a chunk's activations fit :data:`CPU_MEMORY_BUDGET` (CUDA: ¼ of free memory)."""
    c = model.cfg
    size = torch.finfo(model.dtype).bits // 8
    per_row = n_pos * (8 * c.d_model + 2 * c.d_mlp) * size + c.n_head * n_pos * n_pos * size * (3 if materialise_attention else 1)
    per_row += 3 * c.d_vocab * 4  # last-position logits and their softmax, fp32
    budget = CPU_MEMORY_BUDGET
    if model.device.type == "cuda":
        budget = torch.cuda.mem_get_info(model.device)[0] // 4
    return max(1, int(budget // per_row))


@torch.inference_mode()
def run_staircase(
    model: "HookedGPT2",
    entries: Mapping[int, torch.Tensor],
    start: torch.Tensor,
    base: torch.Tensor,
    edits: Sequence[Edit],
    readout: Callable[[torch.Tensor, int, int], torch.Tensor],
    attention_mask: torch.Tensor | None = None,
    batch_size: int | None = None,
    group: int = 1,
    progress: bool | None = None,
    desc: str = "patching",
) -> torch.Tensor:
    """Run ``R`` edited rows, each from its start stage, and read out one value per row.

    ``entries[s]``: ``[m, pos, d_model]`` residual entering block ``s`` in the unedited ("base")
    runs; row ``r`` starts at stage ``start[r]`` (nondecreasing) from ``entries[start[r]][base[r]]``.
    ``readout(last_logits [r, d_vocab], lo, hi)`` → ``[r]`` for rows ``[lo, hi)``. Rows are chunked
    (multiples of ``group``) to ``batch_size``; inside a chunk rows join the batch at their start
    layer, so each chunk costs one call per layer. Returns ``[R]`` (float32).
    """
    n = model.cfg.n_layer
    R = start.shape[0]
    start = start.cpu()
    if R and bool((start[1:] < start[:-1]).any()):
        raise ValueError("rows must be ordered by start stage")
    P = next(iter(entries.values())).shape[1]
    if batch_size is None:
        batch_size = auto_batch_size(model, P, any(isinstance(e.where, str) and ("pattern" in e.where or "scores" in e.where) for e in edits))
    batch_size = max(group, batch_size // group * group)
    base = base.to(model.device)
    out = torch.empty(R, dtype=torch.float32, device=model.device)
    chunks = [(a, min(R, a + batch_size)) for a in range(0, R, batch_size)]
    bar = tqdm(total=sum(n + 1 - int(start[a]) for a, _ in chunks), desc=desc, leave=False,
               disable=None if progress is None else not progress)  # None: only on a terminal
    for a, b in chunks:
        hooks: dict[str, list[Edit]] = defaultdict(list)
        at_entry: dict[int, list[Edit]] = defaultdict(list)
        for e in edits:
            sub = e.select(a, b)
            if sub is not None:
                (at_entry[sub.where] if isinstance(sub.where, int) else hooks[sub.where]).append(sub)
        bounds = torch.searchsorted(start[a:b], torch.arange(n + 2), right=False).tolist()  # first local row per stage
        x: torch.Tensor | None = None
        with model.hooks([(name, _hook_fn(es)) for name, es in hooks.items()]):
            for s in range(int(start[a]), n + 1):
                lo, hi = bounds[s], bounds[s + 1]
                if hi > lo:
                    new = entries[s][base[a + lo : a + hi]]
                    x = new if x is None else torch.cat([x, new])
                    for e in at_entry.get(s, ()):
                        x = e.apply(x)
                if s < n and x is not None:
                    mask = None if attention_mask is None else attention_mask[base[a : a + x.shape[0]]]
                    x = model(x, start_at_layer=s, stop_at_layer=s + 1, attention_mask=mask)
                bar.update()
            final = model.ln_final(x) if any(k.startswith("ln_final") for k in hooks) else model.ln_final(x[:, -1:])
        out[a:b] = readout(model.unembed(final[:, -1]), a, b).float()
    bar.close()
    return out


def _final_logits(model: "HookedGPT2", resid: torch.Tensor) -> torch.Tensor:
    """Last-position logits ``[batch, d_vocab]`` of a final residual ``[batch, pos, d_model]``."""
    return model.unembed(model.ln_final(resid[:, -1]))


# =============================================================== patch targets
_HEAD_SUFFIXES = ("attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_z")
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


def _classify(name: str, n: int) -> tuple[str, int | None, bool]:
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


def _target(model: "HookedGPT2", hook: str, layers: Sequence[int] | None) -> tuple[_Target, list[int]]:
    n = model.cfg.n_layer
    full = "hook_" in hook or hook.startswith("blocks.")
    if full:
        if hook not in model.hook_dict:
            raise KeyError(f"unknown hook name {hook!r}.{suggest(hook, model.hook_names())} See model.hook_names().")
        if layers is not None:
            raise ValueError(f"hook {hook!r} is one hook point; to sweep layers pass a family name such as 'resid_pre'")
        lay = layer_of(hook)
        lay = -1 if hook in ("hook_embed", "hook_pos_embed") else (n if lay is None else lay)
        kind, offset, embed = _classify(hook, n)
        return _Target(kind, {lay: hook}, offset, embed), [lay]
    hook_name(hook, 0)  # unknown families raise here, with suggestions
    if hook in ("embed", "pos_embed"):
        return _target(model, hook_name(hook), layers)
    chosen = list(range(n)) if layers is None else list(dict.fromkeys(_check_index(l, n, "layer", "the model has {n} layers") for l in layers))
    names = {l: hook_name(hook, l) for l in chosen}
    kind, offset, embed = _classify(names[chosen[0]] if chosen else hook_name(hook, 0), n)
    return _Target(kind, names, offset, embed), chosen


def _check_index(i: int, n: int, what: str, context: str) -> int:
    j = i + n if i < 0 else i
    if not 0 <= j < n:
        raise IndexError(f"{what} {i} is out of range: {context.format(n=n)} (valid: 0..{n - 1}, negatives count from the end)")
    return j


# =============================================================== inputs
def _as_rows(x: Prompts) -> list[str] | torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x if x.ndim == 2 else x[None]
    return [x] if isinstance(x, str) else list(x)


def pair_tokens(
    model: "HookedGPT2", clean: Prompts, corrupted: Prompts
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(clean [n, pos], corrupted [n, pos], attention_mask [n, pos] or None)``: prompt pairs tokenized
    together (left-padded to one width); each pair must have the same number of tokens."""
    c, k = _as_rows(clean), _as_rows(corrupted)
    if isinstance(c, torch.Tensor) != isinstance(k, torch.Tensor):
        raise TypeError("pass clean and corrupted both as text or both as token tensors")
    if len(c) != len(k):
        raise ValueError(f"{len(c)} clean prompts but {len(k)} corrupted prompts; pass one corrupted prompt per clean prompt")
    if isinstance(c, torch.Tensor):
        if c.shape != k.shape:
            raise ValueError(f"clean tokens {tuple(c.shape)} and corrupted tokens {tuple(k.shape)} differ in shape; "
                             "patching needs aligned positions")
        return model._as_tokens(c, None)[0], model._as_tokens(k, None)[0], None
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


def _position_labels(model: "HookedGPT2", clean: torch.Tensor, corrupted: torch.Tensor, mask: torch.Tensor | None) -> list[str]:
    """Pair 0's tokens, ``"clean/corrupted"`` where they differ, ``""`` for padding."""
    labels = []
    for i, (a, b) in enumerate(zip(clean[0].tolist(), corrupted[0].tolist())):
        if mask is not None and not mask[0, i]:
            labels.append("")
        else:
            sa, sb = tok.token_str(a), tok.token_str(b)
            labels.append(sa if a == b else f"{sa}/{sb}")
    return labels


# =============================================================== the result
@dataclass
class PatchResult(Result):
    """Patching metric per patched component.

    ``values``: mean over prompt pairs, shaped by ``index_names``: ``("layer", "pos")``,
    ``("layer", "head")`` (head patched at every position) or ``("layer", "pos", "head")``;
    ``pair_values``: the same per pair, ``[n_pairs, ...]``. With ``normalized`` both are
    rescaled so 0 = the corrupted run's metric and 1 = the clean run's (for ``values``, of the
    pair-averaged metrics), in both directions. Raw baselines are in ``clean_metric`` /
    ``corrupted_metric`` (pair means) and the ``*_pair_metric`` tensors.
    """

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

    def top(self, k: int = 5) -> list[tuple[tuple[int, ...], float]]:
        """The ``k`` largest-magnitude entries as ``((layer, pos|head, ...), value)``."""
        flat = self.values.flatten()
        idx = flat.abs().topk(min(k, flat.numel())).indices
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
    ps = [_check_index(p, P, "position", "the prompts have {n} tokens") for p in positions]
    return [[p] for p in ps], ps


def patch(
    model: "HookedGPT2",
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
) -> PatchResult:
    """Activation patching sweep, batched.

    ``denoise``: run the corrupted prompt(s), patch in one clean activation at a time; ``noise``:
    run clean, patch in corrupted. ``clean``/``corrupted``: a prompt, a list of prompt pairs
    (left-padded; each pair of equal token length) or token tensors ``[n, pos]``.

    ``metric(logits [..., n_pairs, d_vocab]) -> [..., n_pairs]`` sees last-position logits only
    (one value per run — cheap: no full unembedding); use :func:`logit_diff`, :func:`prob`,
    :func:`kl_to`. ``values`` is its mean over pairs; ``pair_values`` keeps each pair.

    ``hook``: a family (``resid_pre|resid_mid|resid_post|attn_out|mlp_out`` per position,
    ``z|q|k|v|pattern`` per head, anything ``hook_name`` knows) swept over ``layers`` (default
    all), or one full hook name. Per-position families give ``[layer, pos]`` over ``positions``
    (default every position; ``"all"``: all positions patched together, one column). Per-head
    families give ``[layer, head]`` patching each head at every position, or
    ``[layer, pos, head]`` when ``positions`` is a list; ``heads`` picks heads (``"all"``: together).
    """
    if direction not in ("denoise", "noise"):
        raise ValueError(f"direction must be 'denoise' (patch clean into corrupted) or 'noise' (corrupted into clean), not {direction!r}")
    n = model.cfg.n_layer
    clean_t, corr_t, mask = pair_tokens(model, clean, corrupted)
    n_pairs, P = clean_t.shape
    target, layers_ = _target(model, hook, layers)
    pos_items, pos_axis = _positions(positions, P, each=target.kind == "pos")
    head_items: list[list[int]] = [[]]
    head_axis = None
    if target.kind == "pos":
        if heads is not None:
            raise ValueError(f"heads are for per-head hooks (z, q, k, v, pattern); {hook!r} has no head axis")
    else:
        H = model.cfg.n_head
        if heads is None:
            head_axis = list(range(H))
        elif heads != "all":
            head_axis = [_check_index(h, H, "head", "the model has {n} heads") for h in heads]
        head_items = [list(range(H))] if head_axis is None else [[h] for h in head_axis]
    base_t, src_t = (corr_t, clean_t) if direction == "denoise" else (clean_t, corr_t)

    # unpatched runs: the base run's residual at every start stage, the source run's patched activations
    stages = sorted({target.stage(l) for l in layers_})
    base_names = {entry_name(model, s) for s in stages if s < n}
    if target.embed:
        base_names.add(target.names[-1])
    src_names = set(target.names.values())
    with torch.inference_mode():
        base_final, base_cache = model.run_with_cache(base_t, names_filter=list(base_names), attention_mask=mask, stop_at_layer=n)
        src_final, src_cache = model.run_with_cache(src_t, names_filter=list(src_names), attention_mask=mask, stop_at_layer=n)
        base_logits, src_logits = _final_logits(model, base_final), _final_logits(model, src_final)
    clean_logits, corr_logits = (src_logits, base_logits) if direction == "denoise" else (base_logits, src_logits)
    if hasattr(metric, "bind"):
        metric = metric.bind(clean_logits)
    clean_m = _apply_metric(metric, clean_logits[None])[0].cpu()
    corr_m = _apply_metric(metric, corr_logits[None])[0].cpu()
    entries = {s: (base_cache[entry_name(model, s)] if s < n else base_final) for s in stages}

    # one item per (layer, positions, heads); rows = items × pairs, ordered by start stage
    by_stage = sorted(layers_, key=target.stage)
    items = [(l, p, h) for l in by_stage for p in pos_items for h in head_items]
    k = len(items)
    dev = model.device
    start = torch.tensor([target.stage(l) for l, _, _ in items]).repeat_interleave(n_pairs)
    edits = [_layer_edit(target, l, [i for i, it in enumerate(items) if it[0] == l], items, n_pairs, src_cache, base_cache, entries, dev)
             for l in layers_]

    def readout(logits: torch.Tensor, a: int, b: int) -> torch.Tensor:
        return _apply_metric(metric, logits.view(-1, n_pairs, logits.shape[-1])).flatten()

    pair = torch.arange(n_pairs, device=dev).repeat(k)
    flat = run_staircase(model, entries, start, pair, edits, readout, mask, batch_size, n_pairs, progress,
                         desc=f"patching {hook}")
    # back to the caller's layer order, then [n_pairs, layer, pos items, head items]
    order = torch.argsort(torch.tensor([layers_.index(l) for l, _, _ in items]), stable=True)
    per_pair = flat.view(k, n_pairs).T.cpu()[:, order].reshape(n_pairs, len(layers_), len(pos_items), len(head_items))
    if target.kind == "pos":
        index_names, per_pair = ("layer", "pos"), per_pair[..., 0]
    elif pos_axis is None:
        index_names, per_pair = ("layer", "head"), per_pair[:, :, 0]
    else:
        index_names = ("layer", "pos", "head")
    mean = per_pair.mean(0)
    if normalize:
        gap, pair_gap = float(clean_m.mean() - corr_m.mean()), clean_m - corr_m
        if gap == 0 or bool((pair_gap == 0).any()):
            raise ValueError(f"clean and corrupted runs give the same metric ({float(clean_m.mean()):.4g}); "
                             "normalisation is undefined — check the prompts and the metric")
        mean = (mean - corr_m.mean()) / gap
        bcast = (-1,) + (1,) * mean.ndim
        per_pair = (per_pair - corr_m.view(bcast)) / pair_gap.view(bcast)
    all_labels = _position_labels(model, clean_t, corr_t, mask)
    return PatchResult(
        values=mean,
        pair_values=per_pair,
        index_names=index_names,
        layers=layers_,
        layer_labels=[("embed" if l < 0 else "ln_final" if l >= n else f"L{l}") for l in layers_],
        positions=pos_axis,
        position_labels=None if "pos" not in index_names else ["all"] if pos_axis is None else [all_labels[p] for p in pos_axis],
        heads=head_axis,
        head_labels=None if target.kind == "pos" else ["all"] if head_axis is None else [f"H{h}" for h in head_axis],
        hook=hook,
        direction=direction,
        metric=metric_name(metric),
        normalized=normalize,
        clean_metric=float(clean_m.mean()),
        corrupted_metric=float(corr_m.mean()),
        clean_pair_metric=clean_m,
        corrupted_pair_metric=corr_m,
    )


def _layer_edit(
    target: _Target, layer: int, ids: list[int], items: list, n_pairs: int,
    src_cache: Mapping[str, torch.Tensor], base_cache: Mapping[str, torch.Tensor],
    entries: Mapping[int, torch.Tensor], dev: torch.device,
) -> Edit:
    """The edit for every row of ``layer``'s items: copy the source run's activation at the item's
    positions (and heads) into its rows."""
    rows = (torch.tensor(ids, device=dev)[:, None] * n_pairs + torch.arange(n_pairs, device=dev)).flatten()  # [r]
    j = rows % n_pairs  # the pair of each row
    pos = torch.tensor([items[i][1] for i in ids], device=dev).repeat_interleave(n_pairs, 0)  # [r, m]
    name = target.names[layer]
    src = src_cache[name]
    if target.kind == "pos":  # act [b, pos, ...]
        values = src[j[:, None], pos]
        if target.embed:  # embeddings are patched as their difference on the residual entering block 0
            values = values - base_cache[name][j[:, None], pos] + entries[0][j[:, None], pos]
        where = target.stage(layer) if target.entry_offset is not None else name
        return Edit(where, rows[:, None], (pos,), values)
    hd = torch.tensor([items[i][2] for i in ids], device=dev).repeat_interleave(n_pairs, 0)  # [r, g]
    if target.kind == "head":  # act [b, pos, head, d_head]
        idx = (pos[:, :, None], hd[:, None, :])
    else:  # act [b, head, q_pos, k_pos]: patch the rows of the query positions
        idx = (hd[:, :, None], pos[:, None, :])
    return Edit(name, rows[:, None, None], idx, src[(j[:, None, None], *idx)])
