"""Activation patching as a few big batched forward passes.

TransformerLens's ``patching`` runs one full forward pass per (layer, position)
patch. Here every patched variant becomes a row of one batch, and a row computes
only what its patch can change:

* it starts at its patch layer, from the unpatched run's cached residual stream
  (the layers before the patch are computed once, not once per patch);
* it computes only the positions from its first patched position on — causal
  attention leaves earlier positions as in the unpatched run, whose cached keys
  and values the row attends to;
* the final block runs its queries, W_O and MLP at the last position only, and
  only the last position is unembedded (metrics see next-token logits).

Rows are run as a *staircase*: at layer ``L`` the rows whose patch sits at ``L``
join the batch, so a sweep is ``n_layer`` model calls per (first position,
memory-sized chunk).

>>> r = patch(model, "The capital of France is", "The capital of Italy is",
...           logit_diff(" Paris", " Rome"), hook="resid_pre", normalize=True)
>>> r.values.shape            # [n_layer, n_pos]
>>> r.save_plot("patch.png")

The batching engine (:func:`run_staircase`) is shared with causal tracing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Union

import torch
import torch.nn.functional as F
from einops import rearrange

from ..io import tokenizer as tok
from ..model.hooks import hook_name, layer_of, suggest
from ..core.progress import progress_bar
from ..core.result import Result

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
    ``index[pos_dim]`` holds positions (shifted when a row runs only a suffix of the positions).
    """

    where: str | int
    rows: torch.Tensor
    index: tuple[torch.Tensor, ...]
    values: torch.Tensor
    pos_dim: int | None = 0

    def renumber(self, new_index: torch.Tensor) -> "Edit":
        return Edit(self.where, new_index[self.rows], self.index, self.values, self.pos_dim)

    def select(self, lo: int, hi: int, first_pos: int = 0) -> "Edit | None":
        """The part of this edit for rows ``[lo, hi)``, rows renumbered from ``lo``, positions from ``first_pos``."""
        k = self.rows.shape[0]
        sel = self.rows.reshape(k, -1)[:, 0]
        sel = (sel >= lo) & (sel < hi)
        if not bool(sel.any()):
            return None

        def pick(t: torch.Tensor) -> torch.Tensor:
            return t if t.shape[0] != k or bool(sel.all()) else t[sel]

        index = [pick(i) for i in self.index]
        if self.pos_dim is not None and first_pos:
            index[self.pos_dim] = index[self.pos_dim] - first_pos
        return Edit(self.where, pick(self.rows) - lo, tuple(index), pick(self.values), self.pos_dim)

    def apply(self, act: torch.Tensor) -> torch.Tensor:
        return act.index_put((self.rows, *self.index), self.values.to(act.dtype))


def _hook_fn(edits: list[Edit]) -> Callable:
    def fn(act: torch.Tensor, hook: Any) -> torch.Tensor:
        for e in edits:
            act = e.apply(act)
        return act

    return fn


class PrefixKV:
    """The keys and values of positions ``< first_pos`` taken from the base runs, so that a row whose
    edits all sit at positions ``≥ first_pos`` computes only that suffix (causal attention: the
    prefix is unchanged). Stands in for the model's ``KVCache`` (``length`` + ``extend``)."""

    def __init__(self, base_kv: Mapping[int, tuple[torch.Tensor, torch.Tensor]], first_pos: int) -> None:
        # base k, v: [m, pos, head, d_head] (hook_k / hook_v) -> prefix [m, head, first_pos, d_head]
        self.prefix = {l: (k[:, :first_pos].transpose(1, 2), v[:, :first_pos].transpose(1, 2)) for l, (k, v) in base_kv.items()}
        self.first_pos = first_pos
        self.base: torch.Tensor | None = None  # base row of each row in the current batch

    @property
    def length(self) -> int:
        return self.first_pos

    @length.setter
    def length(self, _: int) -> None:  # the model advances a decoding cache after each call; a prefix stays put
        pass

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pk, pv = self.prefix[layer]
        return torch.cat([pk[self.base], k], 2), torch.cat([pv[self.base], v], 2)


class _FixedKV:
    """Given keys and values ``[batch, head, pos, d_head]`` of every earlier position, for a run of
    the final block at the last position only. Stands in for ``KVCache``."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k, self.v = k, v

    @property
    def length(self) -> int:
        return self.k.shape[2]

    @length.setter
    def length(self, _: int) -> None:
        pass

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat([self.k, k], 2), torch.cat([self.v, v], 2)


def _keys_values(model: "HookedGPT2", layer: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys and values ``[batch, head, pos, d_head]`` block ``layer``'s attention computes from the
    residual ``x [batch, pos, d_model]`` (its LayerNorm and the K, V columns of ``W_QKV``)."""
    block, d = model.blocks[layer], model.cfg.d_model
    h = block.ln1(x)
    kv = torch.addmm(block.attn.b_QKV[d:], h.reshape(-1, d), block.attn.W_QKV[:, d:])
    k, v = rearrange(kv.view(*x.shape[:2], 2 * d), "b p (two h dh) -> two b h p dh", two=2, h=model.cfg.n_head)
    return k, v


def _last_block(model: "HookedGPT2", x: torch.Tensor, mask: torch.Tensor | None, kv: "PrefixKV | None") -> torch.Tensor:
    """The final block's output at the last position only, ``[batch, 1, d_model]``: the other positions
    are needed only as keys and values, so they skip the queries, W_O and the MLP."""
    n = model.cfg.n_layer
    k, v = _keys_values(model, n - 1, x[:, :-1])
    if kv is not None:
        pk, pv = kv.prefix[n - 1]
        k, v = torch.cat([pk[kv.base], k], 2), torch.cat([pv[kv.base], v], 2)
    return model(x[:, -1:], start_at_layer=n - 1, stop_at_layer=n, attention_mask=mask, past_kv=_FixedKV(k, v))


def entry_name(model: "HookedGPT2", stage: int) -> str:
    """The hook whose activation is the residual entering block ``stage`` (``n_layer``: the final residual)."""
    n = model.cfg.n_layer
    return f"blocks.{stage}.hook_resid_pre" if stage < n else f"blocks.{n - 1}.hook_resid_post"


def kv_names(model: "HookedGPT2", first_layer: int) -> list[str]:
    """The base-run keys and values :func:`run_staircase` needs for suffix rows from ``first_layer`` on."""
    return [f"blocks.{l}.attn.hook_{x}" for l in range(first_layer, model.cfg.n_layer) for x in "kv"]


def base_kv_from(cache: Mapping[str, torch.Tensor], model: "HookedGPT2", first_layer: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    return {l: (cache[f"blocks.{l}.attn.hook_k"], cache[f"blocks.{l}.attn.hook_v"]) for l in range(first_layer, model.cfg.n_layer)}


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
    readout: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    attention_mask: torch.Tensor | None = None,
    batch_size: int | None = None,
    group: int = 1,
    progress: bool | None = None,
    desc: str = "patching",
    first_pos: torch.Tensor | None = None,
    base_kv: Mapping[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> torch.Tensor:
    """Run ``R`` edited rows, each from the layer and position where it first differs from its base run,
    and read out one value per row.

    ``entries[s]``: ``[m, pos, d_model]`` residual entering block ``s`` in the unedited ("base")
    runs; row ``r`` starts at stage ``start[r]`` from ``entries[start[r]][base[r]]``. With
    ``first_pos`` ``[R]`` and ``base_kv`` (the base runs' ``hook_k``/``hook_v`` for every layer a
    row runs, see :func:`kv_names`), row ``r`` computes only positions ``≥ first_pos[r]`` and
    attends to the base run's keys and values before them. ``readout(last_logits [r, d_vocab],
    rows [r])`` → ``[r]`` (``rows``: the rows' indices). Rows are grouped by first position and
    chunked (multiples of ``group`` consecutive rows, which must share start and first position)
    to ``batch_size``; in a chunk, rows join the batch at their start layer — one model call per
    layer per chunk. Returns ``[R]`` (float32).
    """
    n = model.cfg.n_layer
    R = start.shape[0]
    dev = model.device
    q = torch.zeros(R, dtype=torch.long) if first_pos is None or base_kv is None else first_pos.cpu().long()
    order = torch.argsort(q * (n + 2) + start.cpu().long(), stable=True)  # by first position, then start
    start_o, q_o = start.cpu()[order], q[order]
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(R)
    inverse_dev, order_dev = inverse.to(dev), order.to(dev)
    base_o = base.to(dev)[order_dev]
    edits = [e.renumber(inverse_dev) for e in edits]
    at_entry: dict[int, list[Edit]] = defaultdict(list)
    for e in edits:
        if isinstance(e.where, int):
            at_entry[e.where].append(e)
    P = next(iter(entries.values())).shape[1]
    if batch_size is None:
        batch_size = auto_batch_size(model, P, any(isinstance(e.where, str) and ("pattern" in e.where or "scores" in e.where) for e in edits))
    batch_size = max(group, batch_size // group * group)
    chunks = []
    bounds = torch.unique_consecutive(q_o, return_counts=True)[1].cumsum(0).tolist() if R else []
    lo = 0
    for hi in bounds:  # chunks never mix first positions
        chunks += [(a, min(hi, a + batch_size)) for a in range(lo, hi, batch_size)]
        lo = hi
    finals = torch.empty(R, model.cfg.d_model, dtype=model.dtype, device=dev)  # ln_final(resid) at the last position
    bar = progress_bar(total=sum(n + 1 - int(start_o[a]) for a, _ in chunks), desc=desc, leave=False,
                       enabled=progress)  # None: only on a terminal
    for a, b in chunks:
        p0 = int(q_o[a])
        kv = PrefixKV(base_kv, p0) if p0 > 0 else None
        hooks: dict[str, list[Edit]] = defaultdict(list)
        for e in edits:
            sub = e.select(a, b, p0) if isinstance(e.where, str) else None
            if sub is not None:
                hooks[sub.where].append(sub)
        steps = torch.searchsorted(start_o[a:b].contiguous(), torch.arange(n + 2)).tolist()  # first local row per stage
        x: torch.Tensor | None = None
        with model.hooks([(name, _hook_fn(es)) for name, es in hooks.items()]):
            for s in range(int(start_o[a]), n + 1):
                r0, r1 = a + steps[s], a + steps[s + 1]
                if r1 > r0:  # rows starting here join the batch, with their entry edits applied
                    new = entries[s][base_o[r0:r1], p0:]
                    for e in at_entry.get(s, ()):
                        sub = e.select(r0, r1, p0)
                        new = new if sub is None else sub.apply(new)
                    if x is not None and x.shape[1] < new.shape[1]:  # after _last_block only the last position is kept
                        new = new[:, -x.shape[1]:]
                    x = new if x is None else torch.cat([x, new])
                if s < n and x is not None:
                    rows_base = base_o[a : a + x.shape[0]]
                    if kv is not None:
                        kv.base = rows_base
                    mask = None if attention_mask is None else attention_mask[rows_base]
                    if s == n - 1 and x.shape[1] > 1 and not any(nm.startswith((f"blocks.{s}.", "ln_final")) for nm in hooks):
                        x = _last_block(model, x, mask, kv)
                    else:
                        x = model(x, start_at_layer=s, stop_at_layer=s + 1, attention_mask=mask, past_kv=kv)
                bar.update()
            last = model.ln_final(x)[:, -1] if any(k.startswith("ln_final") for k in hooks) else model.ln_final(x[:, -1])
        finals[order_dev[a:b]] = last
    bar.close()
    # unembed in big blocks (the [d_vocab, d_model] matrix is read once per block, not once per chunk)
    out = torch.empty(R, dtype=torch.float32, device=dev)
    block = max(group, (batch_size // 2) // group * group)
    for a in range(0, R, block):
        rows = torch.arange(a, min(R, a + block), device=dev)
        out[rows] = readout(model.unembed(finals[rows]), rows).float()
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
        return model.as_tokens(c, None)[0], model.as_tokens(k, None)[0], None
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

    @property
    def baseline(self) -> float:
        """The value meaning "no effect": the unpatched (base) run's metric — the corrupted run when
        denoising, the clean run when noising (0 and 1 when normalised)."""
        if self.normalized:
            return 0.0 if self.direction == "denoise" else 1.0
        return self.corrupted_metric if self.direction == "denoise" else self.clean_metric

    def top(self, k: int = 5) -> list[tuple[tuple[int, ...], float]]:
        """The ``k`` entries that move the metric most from :attr:`baseline`, as ``((layer, pos|head, ...), value)``."""
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
    # a patch at positions ≥ p leaves positions < p as in the base run: rows compute only the suffix
    by_stage = sorted(layers_, key=target.stage)
    items = [(l, p, h) for l in by_stage for p in pos_items for h in head_items]
    first = [min(p) for _, p, _ in items]
    suffix = max(first) > 0 and stages[0] < n
    base_names = {entry_name(model, s) for s in stages if s < n} | set(kv_names(model, stages[0]) if suffix else ())
    if target.embed:
        base_names.add(target.names[-1])
    src_names = set(target.names.values())
    with torch.inference_mode():
        base_final, base_cache = model.run_with_cache(base_t, names_filter=list(base_names), attention_mask=mask, stop_at_layer=n)
        src_final, src_cache = model.run_with_cache(src_t, names_filter=list(src_names), attention_mask=mask, stop_at_layer=n)
        base_logits, src_logits = _final_logits(model, base_final), _final_logits(model, src_final)
        if any(name.startswith("ln_final") for name in src_names):  # not reached by stop_at_layer=n
            store: dict[str, torch.Tensor] = {}
            with model.hooks([(name, lambda act, hook: store.__setitem__(hook.name, act)) for name in src_names]):
                model.ln_final(src_final)
            src_cache = store
    clean_logits, corr_logits = (src_logits, base_logits) if direction == "denoise" else (base_logits, src_logits)
    if hasattr(metric, "bind"):
        metric = metric.bind(clean_logits)
    clean_m = _apply_metric(metric, clean_logits[None])[0].cpu()
    corr_m = _apply_metric(metric, corr_logits[None])[0].cpu()
    entries = {s: (base_cache[entry_name(model, s)] if s < n else base_final) for s in stages}

    # one item per (layer, positions, heads); rows = items × pairs
    k = len(items)
    dev = model.device
    start = torch.tensor([target.stage(l) for l, _, _ in items]).repeat_interleave(n_pairs)
    edits = [_layer_edit(target, l, [i for i, it in enumerate(items) if it[0] == l], items, n_pairs, src_cache, base_cache, entries, dev)
             for l in layers_]

    def readout(logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:  # rows come whole items at a time
        return _apply_metric(metric, logits.view(-1, n_pairs, logits.shape[-1])).flatten()

    pair = torch.arange(n_pairs, device=dev).repeat(k)
    flat = run_staircase(model, entries, start, pair, edits, readout, mask, batch_size, n_pairs, progress,
                         desc=f"patching {hook}", first_pos=torch.tensor(first).repeat_interleave(n_pairs),
                         base_kv=base_kv_from(base_cache, model, stages[0]) if suffix else None)
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
        return Edit(where, rows[:, None], (pos,), values, pos_dim=0)
    hd = torch.tensor([items[i][2] for i in ids], device=dev).repeat_interleave(n_pairs, 0)  # [r, g]
    if target.kind == "head":  # act [b, pos, head, d_head]
        idx, pos_dim = (pos[:, :, None], hd[:, None, :]), 0
    else:  # act [b, head, q_pos, k_pos]: patch the rows of the query positions
        idx, pos_dim = (hd[:, :, None], pos[:, None, :]), 1
    return Edit(name, rows[:, None, None], idx, src[(j[:, None, None], *idx)], pos_dim)
