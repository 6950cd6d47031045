"""The batched prefix-reuse engine behind patching, causal tracing and attribution checks.

Every patched variant of a run is a *row* of one batch, and a row computes only what its patch
can change:

* it starts at its patch layer, from the unpatched ("base") run's cached residual stream (the
  layers before the patch are computed once, not once per patch);
* it computes only the positions from its first patched position on — causal attention leaves
  earlier positions as in the base run, whose cached keys and values the row attends to;
* the final block runs its queries, W_O and MLP at the last position only, and only the last
  position is unembedded (metrics see next-token logits).

Rows run as a *staircase*: at layer ``L`` the rows whose patch sits at ``L`` join the batch, so a
sweep is ``n_layer`` model calls per (first position, memory-sized chunk). A :class:`Patch`
says what a row replaces; :func:`run_staircase` runs rows and reads one value out of each.

Cost accounting (:class:`Work`, :func:`staircase_work`): work is counted in *token-layers* (one
position through one block) and reported in *forward passes* — token-layers over ``n_pos · n_layer``,
so one full forward of one prompt is 1 and a backward pass counts as :data:`BACKWARD` forwards. It
is the floor of ``benchmarks/bench_patching.py`` (per token-layer the dense work is the same) without
the attention-score and unembedding terms; the expected time is the token-layers times the seconds
per token-layer measured on the unpatched runs that every sweep makes first (:func:`timed`).

Public surface: :class:`Patch`, :func:`run_staircase`, :func:`entry_name`, :func:`kv_names`,
:func:`base_kv_from`, :func:`auto_batch_size`, :func:`final_logits`, :data:`CPU_MEMORY_BUDGET`,
:class:`Work`, :func:`staircase_work`, :func:`timed`, :data:`BACKWARD`; memory: :func:`memory_budget`,
:func:`row_bytes`, :func:`weight_bytes`, :func:`staircase_memory`, :func:`check_fits`.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..core.memory import free_memory
from ..core.progress import note, progress_bar
from ..model.hooks import model_computed_inputs

if TYPE_CHECKING:
    from ..model import HookedGPT2

#: A backward pass in forward passes (two matmuls per forward matmul: gradients of inputs and of weights' inputs).
BACKWARD = 2.0

#: Activation memory one chunk of patched rows may use on the CPU at most (bytes); less when a quarter of
#: the free memory is less (:func:`memory_budget`); on CUDA a quarter of the free memory.
CPU_MEMORY_BUDGET = 1 << 30


@dataclass
class Patch:
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

    def renumber(self, new_index: torch.Tensor) -> Patch:
        return Patch(self.where, new_index[self.rows], self.index, self.values, self.pos_dim)

    def select(self, lo: int, hi: int, first_pos: int = 0, keys: torch.Tensor | None = None) -> Patch | None:
        """The part of this edit for rows ``[lo, hi)``, rows renumbered from ``lo``, positions from ``first_pos``.

        ``keys``: ``rows[:, 0]`` on the CPU. The rows are chosen there and only their indices go to
        the device, so a staircase run reads nothing back from the device per chunk."""
        k = self.rows.shape[0]
        if keys is None:
            keys = self.rows.reshape(k, -1)[:, 0].cpu()
        idx = ((keys >= lo) & (keys < hi)).nonzero()[:, 0]  # on the CPU
        if idx.numel() == 0:
            return None
        on_device: dict[torch.device, torch.Tensor] = {}

        def pick(t: torch.Tensor) -> torch.Tensor:
            if t.shape[0] != k or idx.numel() == k:
                return t
            if t.device not in on_device:
                on_device[t.device] = idx.to(t.device, non_blocking=True)
            return t.index_select(0, on_device[t.device])

        index = [pick(i) for i in self.index]
        if self.pos_dim is not None and first_pos:
            index[self.pos_dim] = index[self.pos_dim] - first_pos
        return Patch(self.where, pick(self.rows) - lo, tuple(index), pick(self.values), self.pos_dim)

    def apply(self, act: torch.Tensor) -> torch.Tensor:
        return act.index_put((self.rows, *self.index), self.values.to(act.dtype))


def _hook_fn(patches: list[Patch]) -> Callable:
    def fn(act: torch.Tensor, hook: Any) -> torch.Tensor:
        for e in patches:
            act = e.apply(act)
        return act

    return fn


class PrefixKV:
    """The keys and values of positions ``< first_pos`` taken from the base runs, so that a row whose
    patches all sit at positions ``≥ first_pos`` computes only that suffix (causal attention: the
    prefix is unchanged). Stands in for the model's ``KVCache`` (``length`` + ``extend``)."""

    def __init__(self, base_kv: Mapping[int, tuple[torch.Tensor, torch.Tensor]], first_pos: int) -> None:
        # base k, v: [m, pos, head, d_head] (hook_k / hook_v) -> prefix [m, head, first_pos, d_head]
        self.prefix = {
            l: (k[:, :first_pos].transpose(1, 2), v[:, :first_pos].transpose(1, 2)) for l, (k, v) in base_kv.items()
        }
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


def _keys_values(
    model: HookedGPT2, layer: int, x: torch.Tensor, start: int, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The keys (after RoPE) and values ``[batch, kv_head, pos, d_head]`` block ``layer``'s attention
    computes from the residual ``x [batch, pos, d_model]`` whose first column is position ``start``."""
    block = model.blocks[layer]
    rope = model.rotary(model.positions(x.shape[1], start, mask))
    return block.attn.keys_values(block.ln1(x), rope)


def _last_block(model: HookedGPT2, x: torch.Tensor, mask: torch.Tensor | None, kv: PrefixKV | None) -> torch.Tensor:
    """The final block's output at the last position only, ``[batch, 1, d_model]``: the other positions
    are needed only as keys and values, so they skip the queries, W_O and the MLP."""
    n = model.cfg.n_layer
    k, v = _keys_values(model, n - 1, x[:, :-1], 0 if kv is None else kv.first_pos, mask)
    if kv is not None:
        pk, pv = kv.prefix[n - 1]
        k, v = torch.cat([pk[kv.base], k], 2), torch.cat([pv[kv.base], v], 2)
    return model(x[:, -1:], start_at_layer=n - 1, stop_at_layer=n, attention_mask=mask, past_kv=_FixedKV(k, v))


def entry_name(model: HookedGPT2, stage: int) -> str:
    """The hook whose activation is the residual entering block ``stage`` (``n_layer``: the final residual)."""
    n = model.cfg.n_layer
    return f"blocks.{stage}.hook_resid_pre" if stage < n else f"blocks.{n - 1}.hook_resid_post"


def kv_names(model: HookedGPT2, first_layer: int) -> list[str]:
    """The base-run keys and values :func:`run_staircase` needs for suffix rows from ``first_layer`` on
    (keys after RoPE, ``hook_rot_k``, when the model is rotary)."""
    k = "rot_k" if model.cfg.positional == "rotary" else "k"
    return [f"blocks.{l}.attn.hook_{x}" for l in range(first_layer, model.cfg.n_layer) for x in (k, "v")]


def base_kv_from(
    cache: Mapping[str, torch.Tensor], model: HookedGPT2, first_layer: int
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    k = "rot_k" if model.cfg.positional == "rotary" else "k"
    return {
        l: (cache[f"blocks.{l}.attn.hook_{k}"], cache[f"blocks.{l}.attn.hook_v"])
        for l in range(first_layer, model.cfg.n_layer)
    }


def memory_budget(device: torch.device | str) -> int:
    """Bytes one chunk of patched rows may use: a quarter of the device's free memory
    (:func:`~gpt2_interp.core.memory.free_memory`), on the CPU at most :data:`CPU_MEMORY_BUDGET`
    (bigger chunks are no faster there)."""
    dev = torch.device(device)
    free = free_memory(dev) // 4
    return free if dev.type == "cuda" else min(CPU_MEMORY_BUDGET, free)


def row_bytes(model: HookedGPT2, n_pos: int, materialise_attention: bool = False, n_keys: int | None = None) -> int:
    """Peak activation bytes of one staircase row computing ``n_pos`` positions (attending to
    ``n_keys``, default ``n_pos``): per position the residual, its norm, the queries, keys and values
    (rotated and repeated for grouped-query attention) and the attention's output (``6 · d_model``)
    and the MLP's hidden activations (``4 · d_mlp``: SwiGLU's gate, its activation, up and product) —
    an upper bound of what a block holds at once, measured on GPT-2 and Llama shapes with
    :class:`~gpt2_interp.core.memory.TensorMemory` — plus the attention scores per head
    (``n_head · n_pos · n_keys``, three copies when ``materialise_attention``: scores or patterns are
    hooked), and the row's share of the last-position logits read out afterwards (fp32: the logits
    and two of their size, ``3 · d_vocab``)."""
    return _block_bytes(model, n_pos, materialise_attention, n_keys) + 3 * model.cfg.d_vocab * 4


def _block_bytes(model: HookedGPT2, n_pos: int, materialise_attention: bool, n_keys: int | None) -> int:
    c = model.cfg
    size = torch.finfo(model.dtype).bits // 8
    act = n_pos * (6 * c.d_model + 4 * c.d_mlp) * size
    return act + c.n_head * n_pos * (n_keys or n_pos) * size * (3 if materialise_attention else 1)


def auto_batch_size(model: HookedGPT2, n_pos: int, materialise_attention: bool = False) -> int:
    """Rows per chunk so that a chunk's activations (:func:`row_bytes` each) fit the
    :func:`memory_budget` of the model's device (``materialise_attention``: scores or patterns are hooked)."""
    return max(1, int(memory_budget(model.device) // row_bytes(model, n_pos, materialise_attention)))


def weight_bytes(model: HookedGPT2) -> int:
    """Bytes of the model's parameters (a tied unembedding counted once)."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


def staircase_memory(
    model: HookedGPT2,
    n_pos: int,
    first_pos: Sequence[int],
    cached: int,
    batch_size: int | None = None,
    materialise_attention: bool = False,
) -> int:
    """Expected peak bytes of staircase rows over prompts of ``n_pos`` tokens, row ``r`` computing
    positions ``first_pos[r]…n_pos−1``: the weights, ``cached`` bytes held through the sweep (the
    unpatched runs' activations), and the larger of the biggest chunk's block activations — chunks
    never mix first positions, so it is ``min(rows sharing a first position, batch_size)`` rows — and
    the last-position logits of one read-out block (``batch_size // 2`` rows, fp32, three of
    ``d_vocab`` each); see :func:`row_bytes` (``batch_size`` None: :func:`auto_batch_size`;
    ``materialise_attention`` as there)."""
    b = auto_batch_size(model, n_pos, materialise_attention) if batch_size is None else batch_size
    rows = Counter(first_pos)
    chunk = max(
        (min(k, b) * _block_bytes(model, n_pos - p, materialise_attention, n_pos) for p, k in rows.items()),
        default=0,
    )
    readout = min(len(first_pos), max(1, b // 2)) * 3 * model.cfg.d_vocab * 4
    return weight_bytes(model) + cached + max(chunk, readout)


def check_fits(work: Work, device: torch.device | str, resident: int = 0) -> None:
    """Raise MemoryError, before any work, when ``work.memory`` less the ``resident`` bytes already
    allocated (the loaded weights) exceeds what ``device`` has free now (nothing when the work has
    no memory estimate)."""
    if work.memory is None:
        return
    free = free_memory(device)
    if work.memory - resident > free:
        raise MemoryError(
            f"{work.what} needs ≈ {_bytes(work.memory)} but {torch.device(device)} has {_bytes(free)} free; "
            "run fewer prompt pairs (or layers) per call, or store activations in a lower precision"
        )


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


@dataclass
class Work:
    """The size of a run, planned before it starts.

    ``runs``: forward runs (one prompt or patched row each, through the layers it needs);
    ``tokens``: token positions those runs compute (a row computing positions ``p…P−1`` counts
    ``P − p``); ``passes``: the work in forward passes of one full prompt (token-layers over
    ``n_pos · n_layer``; backward passes counted as :data:`BACKWARD` each); ``seconds``: the
    expected time, from a measured forward (None: not measured); ``memory``: the expected peak
    bytes, weights included (None: not estimated); ``split``: how the rows are split to fit memory
    (e.g. ``"4 chunks of ≤ 512 rows"``; empty when not planned)."""

    what: str
    runs: int
    tokens: int
    passes: float
    seconds: float | None = None
    memory: int | None = None
    split: str = ""

    def line(self) -> str:
        """``"patching mlp_out: 300 runs over 2 100 tokens ≈ 52.5 forward passes, expected 3.1 s,
        peak memory ≈ 1.2 GB, in 2 chunks of ≤ 256 rows"``."""
        when = "" if self.seconds is None else f", expected ≈ {_duration(self.seconds)}"
        mem = "" if self.memory is None else f", peak memory ≈ {_bytes(self.memory)}"
        split = f", in {self.split}" if self.split else ""
        return (
            f"{self.what}: {self.runs} runs over {self.tokens} tokens ≈ {self.passes:.1f} forward passes"
            f"{when}{mem}{split}"
        )


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def staircase_work(
    n_layer: int, n_pos: int, start: Sequence[int], first_pos: Sequence[int] | None = None
) -> tuple[int, int, int]:
    """``(runs, tokens, token_layers)`` of staircase rows (:func:`run_staircase`): row ``r`` runs
    blocks ``start[r]…n_layer−1`` over positions ``first_pos[r]…n_pos−1`` (all when None)."""
    first = [0] * len(start) if first_pos is None else list(first_pos)
    tokens = sum(n_pos - p for p in first)
    return len(start), tokens, sum((n_layer - s) * (n_pos - p) for s, p in zip(start, first))


@dataclass
class Speed:
    """Measured speed of the model here: seconds per token-layer, and the fixed seconds each call of
    a block costs whatever its size (launches, hooks, Python) — which dominates rows that compute a
    position or two."""

    token_layer: float
    call: float

    def seconds(self, token_layers: float, calls: float) -> float:
        return token_layers * self.token_layer + calls * self.call

    @classmethod
    def measure(cls, model: HookedGPT2, seconds: float, token_layers: float, calls: int) -> Speed:
        """From a run timed by the caller (``seconds`` for ``token_layers`` in ``calls`` block calls)
        and a one-token forward timed here (its time per block is the fixed cost of a call). That
        forward runs only when no hook is attached to the model (a caller's hooks must not see an
        extra run); otherwise the fixed cost is taken as 0 and the rate per token-layer carries it."""
        if any(hp.has_hooks for hp in model.hook_dict.values()):
            return cls(seconds / max(token_layers, 1), 0.0)
        one = torch.zeros(1, 1, dtype=torch.long, device=model.device)
        with torch.inference_mode():
            t1 = min(timed(model, lambda: model(one, stop_at_layer=model.cfg.n_layer))[1] for _ in range(2))
        call = t1 / model.cfg.n_layer
        return cls(max(seconds - calls * call, 0.0) / max(token_layers, 1), call)


def unembed_share(model: HookedGPT2) -> float:
    """The unembedding of one position in token-layers (its weights over one block's): each
    patched row unembeds its last position, which on a small model with a large vocabulary costs
    more than the few token-layers the row runs."""
    block = sum(p.numel() for p in model.blocks[0].parameters())
    return model.cfg.d_vocab * model.cfg.d_model / max(block, 1)


def staircase_calls(n_layer: int, start: Sequence[int], first_pos: Sequence[int]) -> int:
    """Block calls of staircase rows when each first position fits one chunk: per first position,
    the blocks from its rows' earliest start stage on (a lower bound when chunks are split by memory)."""
    low: dict[int, int] = {}
    for s, p in zip(start, first_pos):
        low[p] = min(low.get(p, s), s)
    return sum(n_layer - s for s in low.values())


def timed(model: HookedGPT2, fn: Callable[[], Any]) -> tuple[Any, float]:
    """``(fn(), seconds)``, the device synchronised before and after (CUDA runs asynchronously)."""
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda *a: None)
    sync(model.device)
    t0 = time.perf_counter()
    out = fn()
    sync(model.device)
    return out, time.perf_counter() - t0


@torch.inference_mode()
def run_staircase(
    model: HookedGPT2,
    entries: Mapping[int, torch.Tensor],
    start: torch.Tensor,
    base: torch.Tensor,
    patches: Sequence[Patch],
    readout: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    attention_mask: torch.Tensor | None = None,
    batch_size: int | None = None,
    group: int = 1,
    progress: bool | None = None,
    desc: str = "patching",
    first_pos: torch.Tensor | None = None,
    base_kv: Mapping[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
    speed: Speed | None = None,
    unembed: Callable[[torch.Tensor], torch.Tensor] | None = None,
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

    Before the rows run, their :class:`Work` is written beside the progress bar (when it shows), the
    expected time at ``speed`` (:meth:`Speed.measure`, on the caller's timed unpatched runs).
    ``unembed``: what ``readout`` reads instead of the full logits (e.g. a few columns of ``W_U``), from
    the final normalised residual ``[r, d_model]``; None: ``model.unembed``.
    """
    n = model.cfg.n_layer
    R = start.shape[0]
    dev = model.device
    # Host syncs: everything that decides which rows run where (order, chunks, stages, patch rows) is
    # worked out on the CPU here, once; inside the chunk loop nothing is read back from the device.
    # Pass ``start``, ``first_pos`` and the patches' ``rows`` as CPU tensors to make the call sync-free.
    plan = _Plan.of(model, start, base, first_pos if base_kv is not None else None)
    if attention_mask is not None and bool(attention_mask.all()):  # no padding: plain causal attention
        attention_mask = None
    patches, keys = _renumber(patches, plan.inverse, dev)
    at_entry: dict[int, list[Patch]] = defaultdict(list)
    for e in patches:
        if isinstance(e.where, int):
            at_entry[e.where].append(e)
    P = next(iter(entries.values())).shape[1]
    if batch_size is None:
        batch_size = auto_batch_size(
            model, P, any(isinstance(e.where, str) and ("pattern" in e.where or "scores" in e.where) for e in patches)
        )
    batch_size = max(group, batch_size // group * group)
    chunks = plan.chunks(batch_size)
    runs, tokens, token_layers = staircase_work(n, P, plan.start, plan.first)
    calls = sum(n - plan.start[a] for a, _ in chunks)
    held = sum(e.numel() * e.element_size() for e in entries.values())
    held += sum(k.numel() * k.element_size() * 2 for k, _ in (base_kv or {}).values())
    work = Work(
        desc,
        runs,
        tokens,
        token_layers / (P * n),
        None if speed is None else speed.seconds(token_layers + runs * unembed_share(model), calls),
        staircase_memory(model, P, plan.first, held, batch_size),
        f"{len(chunks)} chunk{'s' if len(chunks) != 1 else ''} of ≤ {batch_size} rows",
    )
    note(work.line(), enabled=progress)
    finals = torch.empty(R, model.cfg.d_model, dtype=model.dtype, device=dev)  # ln_final(resid) at the last position
    bar = progress_bar(
        total=sum(n + 1 - plan.start[a] for a, _ in chunks), desc=desc, leave=False, enabled=progress
    )  # None: only on a terminal
    for a, b in chunks:
        finals[plan.order_dev[a:b]] = _run_chunk(
            model, plan, a, b, entries, patches, keys, at_entry, attention_mask, base_kv, bar
        )
    bar.close()
    return _read_out(model, finals, readout, max(group, (batch_size // 2) // group * group), unembed)


@dataclass
class _Plan:
    """Where each row runs, worked out once on the CPU: rows sorted by first position, then start stage."""

    order: torch.Tensor  # [R] row order (CPU)
    inverse: torch.Tensor  # [R] position of each original row in that order
    order_dev: torch.Tensor  # the order on the model's device
    base: torch.Tensor  # [R] the sorted rows' base runs, on the device
    start: list[int]  # sorted rows' start stages
    first: list[int]  # sorted rows' first computed positions

    @classmethod
    def of(cls, model: HookedGPT2, start: torch.Tensor, base: torch.Tensor, first_pos: torch.Tensor | None) -> _Plan:
        n, R, dev = model.cfg.n_layer, start.shape[0], model.device
        q = torch.zeros(R, dtype=torch.long) if first_pos is None else first_pos.cpu().long()
        order = torch.argsort(q * (n + 2) + start.cpu().long(), stable=True)  # by first position, then start
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(R)
        order_dev = order.to(dev, non_blocking=True)
        return cls(
            order,
            inverse,
            order_dev,
            base.to(dev, non_blocking=True)[order_dev],
            start.cpu()[order].tolist(),
            q[order].tolist(),
        )

    def chunks(self, batch_size: int) -> list[tuple[int, int]]:
        """``(a, b)`` row ranges of at most ``batch_size`` rows that never mix first positions."""
        q, R = self.first, len(self.first)
        out, lo = [], 0
        for hi in [i for i in range(1, R + 1) if i == R or q[i] != q[i - 1]]:
            out += [(a, min(hi, a + batch_size)) for a in range(lo, hi, batch_size)]
            lo = hi
        return out


def _renumber(
    patches: Sequence[Patch], inverse: torch.Tensor, dev: torch.device
) -> tuple[list[Patch], dict[int, torch.Tensor]]:
    """The patches with their rows renumbered into the plan's order, and ``{id(patch): rows[:, 0]}`` on the CPU."""
    keys: dict[int, torch.Tensor] = {}
    renumbered = []
    for e in patches:
        rows = inverse[e.rows.cpu()]
        e = Patch(e.where, rows.to(dev, non_blocking=True), e.index, e.values, e.pos_dim)
        keys[id(e)] = rows.reshape(rows.shape[0], -1)[:, 0]
        renumbered.append(e)
    return renumbered, keys


def _run_chunk(
    model: HookedGPT2,
    plan: _Plan,
    a: int,
    b: int,
    entries: Mapping[int, torch.Tensor],
    patches: Sequence[Patch],
    keys: dict[int, torch.Tensor],
    at_entry: Mapping[int, list[Patch]],
    attention_mask: torch.Tensor | None,
    base_kv: Mapping[int, tuple[torch.Tensor, torch.Tensor]] | None,
    bar: Any,
) -> torch.Tensor:
    """Rows ``a:b`` of the plan, each joining the batch at its start stage; returns ``ln_final`` of the
    last position, ``[b - a, d_model]``."""
    n = model.cfg.n_layer
    p0 = plan.first[a]
    kv = PrefixKV(base_kv, p0) if p0 > 0 and base_kv is not None else None
    hooks: dict[str, list[Patch]] = defaultdict(list)
    for e in patches:
        sub = e.select(a, b, p0, keys[id(e)]) if isinstance(e.where, str) else None
        if sub is not None:
            assert isinstance(sub.where, str), "a selected patch keeps its hook name"
            hooks[sub.where].append(sub)
    steps = [bisect_left(plan.start, s, a, b) - a for s in range(n + 2)]  # first local row per stage
    x: torch.Tensor | None = None
    with model.hooks([(name, _hook_fn(es)) for name, es in hooks.items()]), model_computed_inputs():
        for s in range(plan.start[a], n + 1):
            r0, r1 = a + steps[s], a + steps[s + 1]
            if r1 > r0:  # rows starting here join the batch, with their entry patches applied
                new = entries[s][plan.base[r0:r1], p0:]
                for e in at_entry.get(s, ()):
                    sub = e.select(r0, r1, p0, keys[id(e)])
                    new = new if sub is None else sub.apply(new)
                if x is not None and x.shape[1] < new.shape[1]:  # after _last_block only the last position is kept
                    new = new[:, -x.shape[1] :]
                x = new if x is None else torch.cat([x, new])
            if s < n and x is not None:
                rows_base = plan.base[a : a + x.shape[0]]
                if kv is not None:
                    kv.base = rows_base
                mask = None if attention_mask is None else attention_mask[rows_base]
                if (
                    s == n - 1
                    and x.shape[1] > 1
                    and not any(nm.startswith((f"blocks.{s}.", "ln_final")) for nm in hooks)
                ):
                    x = _last_block(model, x, mask, kv)
                else:
                    x = model(x, start_at_layer=s, stop_at_layer=s + 1, attention_mask=mask, past_kv=kv)
            bar.update()
        assert x is not None
        return model.ln_final(x)[:, -1] if any(k.startswith("ln_final") for k in hooks) else model.ln_final(x[:, -1])


def _read_out(
    model: HookedGPT2,
    finals: torch.Tensor,
    readout: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    block: int,
    unembed: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Unembed in big blocks (the ``[d_vocab, d_model]`` matrix is read once per block, not once per
    chunk) and read out one float per row: ``[R]``."""
    R, dev = finals.shape[0], finals.device
    out = torch.empty(R, dtype=torch.float32, device=dev)
    for a in range(0, R, block):
        rows = torch.arange(a, min(R, a + block), device=dev)
        out[rows] = readout((unembed or model.unembed)(finals[rows]), rows).float()
    return out


def final_logits(model: HookedGPT2, resid: torch.Tensor) -> torch.Tensor:
    """Last-position logits ``[batch, d_vocab]`` of a final residual ``[batch, pos, d_model]``."""
    return model.unembed(model.ln_final(resid[:, -1]))


__all__ = [
    "BACKWARD",
    "CPU_MEMORY_BUDGET",
    "Patch",
    "PrefixKV",
    "Speed",
    "Work",
    "auto_batch_size",
    "base_kv_from",
    "check_fits",
    "entry_name",
    "final_logits",
    "kv_names",
    "memory_budget",
    "row_bytes",
    "run_staircase",
    "staircase_calls",
    "staircase_memory",
    "staircase_work",
    "timed",
    "unembed_share",
    "weight_bytes",
]
