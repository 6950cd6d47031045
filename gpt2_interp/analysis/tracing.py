"""ROME-style causal tracing, batched.

Meng et al. (2022) corrupt a prompt by adding Gaussian noise to the subject's
token embeddings (the output of ``hook_embed``, before position embeddings)
and then restore one clean state at a time — a (token, layer) cell — to see
which states carry the fact. ``kind="hidden"`` restores the residual stream
after block ``L`` (``resid_post``); ``"mlp"``/``"attn"`` restore the MLP/attention
outputs of a window of ``window`` layers centred on ``L`` (layers
``max(0, L − window//2) … min(n, L + ceil(window/2)) − 1``). The score is the
probability of the target (default: the clean top-1) at the last position,
averaged over ``samples`` noise draws; the same draws are used for every cell.

Every cell × sample is one row of a staircase batch (see
:func:`~gpt2_interp.analysis.engine.run_staircase`): a row starts from the
corrupted run's cached residual at the first layer it changes. Cells before the
subject are never computed — nothing there differs from the corrupted run, so
their score *is* the corrupted score.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

import torch

from ..core import distributed
from ..core.boundary import boundary
from ..core.checks import check_count
from ..core.finite import require_finite
from ..core.progress import note, progress_bar, shown
from ..core.result import Result
from ..core.tables import format_table
from .engine import (
    Patch,
    Speed,
    Work,
    base_kv_from,
    entry_name,
    kv_names,
    run_staircase,
    staircase_calls,
    staircase_memory,
    staircase_work,
    timed,
    unembed_share,
)
from .known import knows
from .tokens import subject_span, target_ids

if TYPE_CHECKING:
    from ..model import HookedGPT2

Kind = Literal["hidden", "mlp", "attn"]
KINDS: tuple[str, ...] = ("hidden", "mlp", "attn")
#: ROME's Figure-2 position buckets, in order.
BUCKETS: tuple[str, ...] = (
    "first subject token",
    "middle subject tokens",
    "last subject token",
    "first subsequent token",
    "further tokens",
    "last token",
)


# =============================================================== results
@boundary
@dataclass
class TraceResult(Result):
    """One causal trace.

    ``scores [n_tokens, n_layers]``: target probability with the cell restored (mean over noise
    samples); ``indirect_effect`` = ``scores − corrupted_score``. Tokens exclude the prepended BOS;
    ``subject_range`` indexes ``tokens`` (end exclusive).

    ``prompt``, ``subject``, ``kind`` (``"hidden"``, ``"mlp"`` or ``"attn"``); ``layer_labels``
    (``L0`` …); ``target`` and ``target_id``: the scored token; ``clean_score`` and
    ``corrupted_score``: its probability on the clean run and on the corrupted runs (mean over
    samples); ``noise_std``: the absolute std of the embedding noise; ``samples`` noise draws,
    ``window`` layers restored together (mlp/attn), ``seed`` of the draws.
    """

    result_kind = "causal trace"

    prompt: str
    subject: str
    kind: str
    tokens: list[str]
    subject_range: tuple[int, int]
    layer_labels: list[str]
    target: str
    target_id: int
    scores: torch.Tensor
    indirect_effect: torch.Tensor
    clean_score: float
    corrupted_score: float
    noise_std: float
    samples: int
    window: int
    seed: int

    def plot(self, **kwargs: Any):
        from ..plots.causal import plot_trace

        return plot_trace(self, **kwargs)

    def clean_cells(self) -> torch.Tensor:
        """``[n_tokens, n_layers]`` bool: the cells whose restoration reproduces the clean run by construction
        (:func:`clean_by_construction`), which say nothing about where the fact is stored."""
        return clean_by_construction(self.kind, len(self.tokens), self.subject_range, self.scores.shape[1], self.window)

    def _best(self, rows: Sequence[int]) -> tuple[str, str, float] | None:
        """``(token, layer label, score)`` of the best cell in ``rows`` that is not clean by construction."""
        if not rows:
            return None
        scores = self.scores[list(rows)].masked_fill(self.clean_cells()[list(rows)], float("-inf"))
        i = int(scores.argmax())
        t, l = divmod(i, scores.shape[1])
        if scores[t, l] == float("-inf"):
            return None
        return self.tokens[rows[t]], self.layer_labels[l], float(scores[t, l])

    def peak(self) -> tuple[str, str, float]:
        """``(token, layer label, score)`` of the highest-scoring cell that is not clean by construction
        (:meth:`clean_cells`: e.g. the final layer's hidden state at the last token, which *is* the clean
        output); the most informative single cell."""
        best = self._best(list(range(len(self.tokens))))
        if best is None:  # every cell is the clean run (a one-layer model's last token): report it as such
            i = int(self.scores.argmax())
            t, l = divmod(i, self.scores.shape[1])
            return self.tokens[t], self.layer_labels[l], float(self.scores[t, l])
        return best

    def subject_peak(self) -> tuple[str, str, float] | None:
        """The best cell among the subject's tokens (ROME's early site, usually its last token), clean-by-
        construction cells left out; None when every subject cell is one."""
        return self._best(list(range(*self.subject_range)))

    def late_peak(self) -> tuple[str, str, float] | None:
        """The best cell at the last token (ROME's late site), clean-by-construction cells left out; None
        when the last token is a subject token (then it is the subject's peak) or every cell there is clean
        by construction."""
        last = len(self.tokens) - 1
        return None if self.subject_range[1] > last else self._best([last])

    def header(self) -> str:
        """Prompt, target, clean and corrupted probability, and the noise: the trace's baselines."""
        weak = "  [weak corruption]" if self.corrupted_score > WEAK_CORRUPTION * self.clean_score else ""
        return (
            f"{self.prompt!r} → {self.target!r}: clean p = {self.clean_score:.4f}, corrupted p = "
            f"{self.corrupted_score:.4f}{weak} (noise std {self.noise_std:.4g}, {self.samples} samples)"
        )

    def peak_line(self) -> str:
        """The subject's peak and the last token's peak, each with its indirect effect; cells that are the
        clean run by construction are never named (the line says which were left out)."""

        def site(p: tuple[str, str, float]) -> str:
            effect = p[2] - self.corrupted_score
            return f"restoring {p[0]!r} at {p[1]} gives p = {p[2]:.4f} (indirect effect {effect:+.4f})"

        subj, late = self.subject_peak(), self.late_peak()
        parts = [f"subject peak: {site(subj)}" if subj else "subject peak: none (every subject cell is the clean run)"]
        if late is not None:
            parts.append(f"last-token peak: {site(late)}")
        clean = self.clean_cells().nonzero().tolist()
        line = f"  {self.kind:<6} " + "; ".join(parts)
        if clean:
            cells = ", ".join(f"{self.tokens[t]!r} at {self.layer_labels[l]}" for t, l in clean[:3])
            more = f" and {len(clean) - 3} more" if len(clean) > 3 else ""
            line += f" ({cells}{more} left out: the clean run by construction)"
        return line

    def table(self) -> str:
        """:meth:`header` and :meth:`peak_line`."""
        return self.header() + "\n" + self.peak_line()


@boundary
@dataclass
class TraceSet(Result):
    """Traces of one prompt for several kinds; ``.plot()`` draws ROME's side-by-side panels."""

    result_kind = "trace set"

    traces: list[TraceResult]

    def __getitem__(self, kind: str) -> TraceResult:
        for t in self.traces:
            if t.kind == kind:
                return t
        raise KeyError(f"no {kind!r} trace; have {[t.kind for t in self.traces]}")

    def table(self) -> str:
        """The first trace's header, then the peak line of each kind."""
        return "\n".join([self.traces[0].header()] + [t.peak_line() for t in self.traces])

    def plot(self, **kwargs: Any):
        return plot_traces(self.traces, **kwargs)


def plot_traces(traces: Sequence[TraceResult], **kwargs: Any):
    """ROME's figure: one heatmap per trace (hidden, mlp, attn) side by side."""
    from ..plots.causal import plot_traces as _plot

    return _plot(traces, **kwargs)


# =============================================================== noise
#: ROME's noise rule: the std of the subject-embedding noise is this multiple of the std of the
#: subject tokens' embeddings (Meng et al. 2022, §2.1: 3σ, σ measured on the traced subjects).
NOISE_MULTIPLE = 3.0
#: A corruption that leaves more than this fraction of the clean probability is reported as weak.
WEAK_CORRUPTION = 0.5


def embedding_std(model: HookedGPT2, texts: Sequence[str] | None = None, ids: Sequence[int] | None = None) -> float:
    """Std of the token embeddings (all entries) of ``texts`` (each tokenized alone) or of token ``ids``.
    ``3 × embedding_std`` of the subjects is ROME's noise scale — measured on subject tokens, not on
    all of W_E, whose untrained rows (47k of them in gpt2-facts) would make the noise far too weak."""
    if ids is None:
        if texts is None or isinstance(texts, str):
            raise TypeError("embedding_std takes a list of texts (e.g. subjects) or ids=[token ids]")
        ids = [i for t in texts for i in model.tokenizer.encode_ids(t)]
    ids = sorted({int(i) for i in ids})
    if not ids:
        raise ValueError("no tokens in the given texts")
    return float(model.W_E.detach()[ids].float().std())


def resolve_noise(model: HookedGPT2, noise: float | None, subject_ids: Sequence[int]) -> float:
    """The absolute noise std: ``noise`` if given (a number ≥ 0), else ROME's rule,
    ``NOISE_MULTIPLE`` × the std of the embeddings of the traced subjects' tokens ``subject_ids``."""
    if noise is None:
        return NOISE_MULTIPLE * embedding_std(model, ids=subject_ids)
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not math.isfinite(noise) or noise < 0:
        raise ValueError(
            f"noise is the absolute std of the embedding noise, a finite number ≥ 0 (or None for "
            f"ROME's rule, 3 × the std of the subject tokens' embeddings); got {noise!r}"
        )
    return float(noise)


def _subject_ids(model: HookedGPT2, cases: Sequence[_Case]) -> list[int]:
    """The token ids the noise lands on: the subject span of every case."""
    out = []
    for c in cases:
        s, e = subject_span(model, c.prompt, c.subject)
        out += model.to_tokens(c.prompt)[0, s:e].tolist()
    return out


def _check_corruption(clean: float, corrupted: float, where: str) -> None:
    if clean > 0 and corrupted > WEAK_CORRUPTION * clean:
        warnings.warn(
            f"weak corruption in {where}: the noise only lowers P(target) from {clean:.3g} to {corrupted:.3g} "
            f"(> {WEAK_CORRUPTION:.0%} of clean), so restoring states can show little; raise `noise` "
            f"(ROME's rule is the default, noise=None)",
            stacklevel=3,
        )


def _draws(samples: int, n_tok: int, d: int, seed: int) -> torch.Tensor:
    """``[samples, n_tok, d]`` standard normal draws, the same for a seed whatever else is batched."""
    return torch.randn(samples, n_tok, d, generator=torch.Generator().manual_seed(seed))


def default_window(n_layer: int) -> int:
    """The MLP/attention window used when ``window=None``: ROME restores 10 of gpt2-xl's 48 layers;
    we keep that fraction of the depth (gpt2-xl 10, gpt2-medium 5, gpt2 2, 6-layer gpt2-facts 1),
    so a small model's trace is not smeared over most of its layers."""
    return max(1, round(10 * n_layer / 48))


def _window(layer: int, window: int, n: int) -> range:
    return range(max(0, layer - window // 2), min(n, layer + math.ceil(window / 2)))


def clean_by_construction(
    kind: str, n_tokens: int, subject_range: tuple[int, int], n_layers: int, window: int
) -> torch.Tensor:
    """``[n_tokens, n_layers]`` bool: the trace cells whose restoration reproduces the clean run exactly,
    whatever the model: restoring them measures nothing about where a fact lives.

    * ``hidden``: the last token's state after the final layer (all the unembedding reads); and the last
      token's state after any layer when the subject is the last token alone (nothing else is corrupted).
    * ``attn``: the last token's attention outputs when the window spans every layer and the last token is
      not a subject token (its embedding is clean, so every later state at it is too).
    * ``mlp``: none (the attention at the last token still reads the corrupted subject).
    """
    mask = torch.zeros(n_tokens, n_layers, dtype=torch.bool)
    last = n_tokens - 1
    if kind == "hidden":
        mask[last, n_layers - 1] = True
        if subject_range[0] == last:
            mask[last] = True
    elif kind == "attn" and subject_range[1] <= last:
        for l in range(n_layers):
            if len(_window(l, window, n_layers)) == n_layers:
                mask[last, l] = True
    return mask


# =============================================================== the batched trace
@dataclass
class _Case:
    prompt: str
    subject: str
    target: str | int | None


def _check_trace_args(model: HookedGPT2, kind: str, samples: int, window: int | None) -> int:
    """Validate the trace settings; returns the window (the default when ``None``)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    samples = check_count(samples, "samples")
    return default_window(model.cfg.n_layer) if window is None else check_count(window, "window")


@dataclass
class _Runs:
    """The clean and corrupted runs a batched trace starts from."""

    targets: torch.Tensor  # [F] target token per prompt
    clean_score: torch.Tensor  # [F] P(target), clean
    clean_cache: Any  # the restored hook family, clean
    corr_score: torch.Tensor  # [F] P(target), corrupted, mean over samples
    entries: dict[int, torch.Tensor]  # stage -> corrupted residual entering it, [F*S, P, d_model]
    base_kv: dict[int, tuple[torch.Tensor, torch.Tensor]]  # corrupted keys/values for prefix reuse
    rep_mask: torch.Tensor | None  # [F*S, P]


def _runs(
    model: HookedGPT2,
    cases: Sequence[_Case],
    tokens: torch.Tensor,
    mask: torch.Tensor | None,
    spans: list[tuple[int, int]],
    src_names: list[str],
    stages: list[int],
    std: float,
    S: int,
    seed: int,
) -> _Runs:
    """The clean run (caching the restored family) and ``S`` noisy copies of each prompt (caching the
    residual entering each stage and the keys/values the staircase reuses)."""
    n, dev = model.cfg.n_layer, model.device
    Fn, P = tokens.shape
    clean_final, clean_cache = model.run_with_cache(
        tokens, names_filter=src_names, attention_mask=mask, stop_at_layer=n
    )
    clean_logp = model.unembed(model.ln_final(clean_final[:, -1])).float().log_softmax(-1)  # [F, d_vocab]
    # no host syncs here (the GPU check counts them): index tensors are built on the CPU and sent
    # non_blocking; the results come back in one transfer at the end
    given = torch.tensor([-1 if c.target is None else model.to_single_token(c.target) for c in cases]).to(
        dev, non_blocking=True
    )
    targets = torch.where(given >= 0, given, clean_logp.argmax(-1))  # default: the clean top-1
    clean_score = clean_logp.gather(-1, targets[:, None])[:, 0].exp()
    noise = torch.zeros(Fn * S, P, model.cfg.d_model, dtype=model.dtype, device=dev)
    for i, (s, e) in enumerate(spans):
        noise[i * S : (i + 1) * S, s:e] = (std * _draws(S, e - s, model.cfg.d_model, seed)).to(dev, model.dtype)
    rep_mask = None if mask is None else mask.repeat_interleave(S, 0)
    with model.hooks([("hook_embed", lambda act, hook: act + noise)]):
        corr_final, corr_cache = model.run_with_cache(
            tokens.repeat_interleave(S, 0),
            names_filter=[entry_name(model, s) for s in stages if s < n] + kv_names(model, min(stages)),
            attention_mask=rep_mask,
            stop_at_layer=n,
        )
    corr_logp = model.unembed(model.ln_final(corr_final[:, -1])).float().log_softmax(-1)
    fact_of = torch.arange(Fn, device=dev).repeat_interleave(S)
    corr_score = corr_logp.gather(-1, targets[fact_of][:, None])[:, 0].exp().view(Fn, S).mean(1)
    require_finite(
        clean_score, "causal trace: P(target) on the clean run", "check the model's weights and active hooks"
    )
    require_finite(
        corr_score, "causal trace: P(target) on the corrupted runs", "check the noise level and active hooks"
    )
    entries = {s: corr_cache[entry_name(model, s)] if s < n else corr_final for s in stages}
    return _Runs(
        targets, clean_score, clean_cache, corr_score, entries, base_kv_from(corr_cache, model, min(stages)), rep_mask
    )


def _restorations(
    model: HookedGPT2,
    kind: str,
    cells: list[tuple[int, int, int]],
    window: int,
    S: int,
    src_names: list[str],
    clean_cache: Any,
) -> list[Patch]:
    """One patch per layer restoring the clean value at each cell's token (``S`` rows a cell): the
    hidden state as the row enters block ``l + 1``, or the output of layer ``l`` for every cell whose
    window covers ``l``."""
    n, dev, C = model.cfg.n_layer, model.device, len(cells)
    cf_c, ct_c, cl_c = (torch.tensor([c[j] for c in cells], dtype=torch.long) for j in range(3))  # on the CPU
    cf, ct = cf_c.to(dev, non_blocking=True), ct_c.to(dev, non_blocking=True)
    edits: list[Patch] = []
    for l in range(n):
        if kind == "hidden":
            sel = (cl_c == l).nonzero()[:, 0]
            where: str | int = l + 1
        else:
            sel = torch.tensor([c for c in range(C) if l in _window(cells[c][2], window, n)], dtype=torch.long)
            where = src_names[l]
        if sel.numel() == 0:
            continue
        rows = (sel[:, None] * S + torch.arange(S)).flatten()
        sel_d = sel.to(dev, non_blocking=True)
        pos = ct_c[sel].repeat_interleave(S).to(dev, non_blocking=True)
        values = clean_cache[src_names[l]][cf[sel_d], ct[sel_d]].repeat_interleave(S, 0)  # [rows, d_model]
        edits.append(Patch(where, rows, (pos,), values))
    return edits


@torch.inference_mode()
def _trace_batch(
    model: HookedGPT2,
    cases: Sequence[_Case],
    kind: str,
    std: float,
    samples: int,
    window: int | None,
    seed: int,
    batch_size: int | None,
    progress: bool | None,
) -> list[TraceResult]:
    """Causal traces of several prompts in one staircase run (prompts left-padded together)."""
    window = _check_trace_args(model, kind, samples, window)
    n, S, dev = model.cfg.n_layer, samples, model.device
    spans = [subject_span(model, c.prompt, c.subject) for c in cases]
    tokens, mask = model.tokenize([c.prompt for c in cases])  # [F, P]
    Fn, P = tokens.shape
    lengths = [P] * Fn if mask is None else mask.sum(1).tolist()
    spans = [(s + P - ln, e + P - ln) for (s, e), ln in zip(spans, lengths)]  # in padded coordinates
    restored = "hook_resid_post" if kind == "hidden" else "hook_mlp_out" if kind == "mlp" else "hook_attn_out"
    src_names = [f"blocks.{l}.{restored}" for l in range(n)]
    stages = list(range(1, n + 1)) if kind == "hidden" else sorted({_window(l, window, n)[0] for l in range(n)})
    runs, seconds = timed(model, lambda: _runs(model, cases, tokens, mask, spans, src_names, stages, std, S, seed))

    # cells (fact, token ≥ subject start, layer), ordered by start stage; rows = cells × samples
    def start_of(l: int) -> int:
        return _start_stage(kind, l, window, n)

    cells = _cells(spans, P, n, start_of)
    C = len(cells)
    cf_c, ct_c = (torch.tensor([c[j] for c in cells], dtype=torch.long) for j in range(2))
    start = torch.tensor([start_of(c[2]) for c in cells]).repeat_interleave(S)
    base = (cf_c[:, None] * S + torch.arange(S)).flatten()  # the corrupted row each row starts from
    edits = _restorations(model, kind, cells, window, S, src_names, runs.clean_cache)
    row_target = runs.targets[cf_c.to(dev, non_blocking=True)].repeat_interleave(S)

    def readout(logits: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        return logits.float().log_softmax(-1).gather(-1, row_target[rows, None])[:, 0].exp()

    probs = run_staircase(
        model,
        runs.entries,
        start,
        base,
        edits,
        readout,
        runs.rep_mask,
        batch_size,
        S,
        progress,
        desc=f"tracing {kind}",
        first_pos=ct_c.repeat_interleave(S),
        base_kv=runs.base_kv,
        speed=Speed.measure(model, seconds, Fn * (S + 1) * P * n, 2 * n) if shown(progress) else None,
    )
    cell_score = probs.view(C, S).mean(1).cpu()
    return _results(model, cases, kind, tokens, lengths, spans, cells, cell_score, runs, std, S, window, seed)


def _start_stage(kind: str, layer: int, window: int, n: int) -> int:
    """The stage a row restoring cell layer ``layer`` starts at: after the layer for hidden states,
    at the first layer of the window for mlp/attn."""
    return layer + 1 if kind == "hidden" else _window(layer, window, n)[0]


def _cells(spans: list[tuple[int, int]], P: int, n: int, start_of: Any) -> list[tuple[int, int, int]]:
    """Cells ``(fact, token ≥ subject start, layer)``, ordered by start stage."""
    return [(i, t, l) for l in sorted(range(n), key=start_of) for i, (s, _) in enumerate(spans) for t in range(s, P)]


def trace_work(
    model: HookedGPT2,
    cases: Sequence[tuple[str, str]],
    kind: str = "hidden",
    samples: int = 10,
    window: int | None = None,
    speed: Speed | None = None,
) -> Work:
    """The work of tracing ``cases`` — ``(prompt, subject)`` pairs traced together in one batch —
    counted before running (:class:`~.engine.Work`): the clean run and ``samples`` noised runs per
    prompt, then ``samples`` rows per cell from the subject on, each from its start stage and its
    token; the expected time at ``speed`` when given, and the expected peak memory
    (:func:`~.engine.staircase_memory`: the weights, the noised runs' cached residuals, keys and
    values, the noise, the clean run's restored family and one chunk of rows sized from the free memory)."""
    window = _check_trace_args(model, kind, samples, window)
    n = model.cfg.n_layer
    spans = [subject_span(model, p, subj) for p, subj in cases]
    tokens, mask = model.tokenize([p for p, _ in cases])
    Fn, P = tokens.shape
    lengths = [P] * Fn if mask is None else mask.sum(1).tolist()
    spans = [(a + P - ln, b + P - ln) for (a, b), ln in zip(spans, lengths)]
    cells = _cells(spans, P, n, lambda l: _start_stage(kind, l, window, n))
    start = [_start_stage(kind, l, window, n) for _, _, l in cells for _ in range(samples)]
    first = [t for _, t, _ in cells for _ in range(samples)]
    runs, toks, token_layers = staircase_work(n, P, start, first)
    unpatched = Fn * (samples + 1)
    token_layers += unpatched * P * n
    seconds = (
        None
        if speed is None
        else speed.seconds(token_layers + runs * unembed_share(model), staircase_calls(n, start, first) + 2 * n)
    )
    c, size = model.cfg, torch.finfo(model.dtype).bits // 8
    noised = Fn * samples * P * (((n + 1) + 1) * c.d_model + 2 * n * c.n_kv * c.d_head)  # entries, noise, k/v
    restored = Fn * P * n * c.d_model
    memory = staircase_memory(model, P, first, (noised + restored) * size)
    return Work(f"tracing {kind}", runs + unpatched, toks + unpatched * P, token_layers / (P * n), seconds, memory)


def _results(
    model: HookedGPT2,
    cases: Sequence[_Case],
    kind: str,
    tokens: torch.Tensor,
    lengths: list[int],
    spans: list[tuple[int, int]],
    cells: list[tuple[int, int, int]],
    cell_score: torch.Tensor,
    runs: _Runs,
    std: float,
    S: int,
    window: int,
    seed: int,
) -> list[TraceResult]:
    """One :class:`TraceResult` per prompt: the cells' scores on a ``[tokens after BOS, layers]`` grid
    (cells before the subject keep the corrupted score)."""
    n, P = model.cfg.n_layer, tokens.shape[1]
    bos = 1 if model.tokenizer.bos_id is not None else 0
    cf_c, ct_c, cl_c = (torch.tensor([c[j] for c in cells], dtype=torch.long) for j in range(3))
    corr_score, clean_score, target_f = torch.stack([runs.corr_score, runs.clean_score, runs.targets.float()]).tolist()
    tokens_c = tokens.cpu()
    results = []
    for i, c in enumerate(cases):
        first = P - lengths[i] + bos  # skip padding and BOS
        grid = torch.full((P - first, n), corr_score[i])
        mine = cf_c == i
        grid[ct_c[mine] - first, cl_c[mine]] = cell_score[mine]
        tid = int(target_f[i])
        s, e = spans[i]
        results.append(
            TraceResult(
                prompt=c.prompt,
                subject=c.subject,
                kind=kind,
                tokens=[model.tokenizer.token_str(x) for x in tokens_c[i, first:].tolist()],
                subject_range=(s - first, e - first),
                layer_labels=[f"L{l}" for l in range(n)],
                target=model.tokenizer.token_str(tid),
                target_id=tid,
                scores=grid,
                indirect_effect=grid - corr_score[i],
                clean_score=clean_score[i],
                corrupted_score=corr_score[i],
                noise_std=std,
                samples=S,
                window=window,
                seed=seed,
            )
        )
    return results


@boundary
def causal_trace(
    model: HookedGPT2,
    prompt: str,
    subject: str,
    target: str | int | None = None,
    kind: Kind = "hidden",
    noise: float | None = None,
    samples: int = 10,
    window: int | None = None,
    seed: int = 0,
    batch_size: int | None = None,
    progress: bool | None = None,
) -> TraceResult:
    """ROME causal trace of ``prompt`` over every (token, layer) cell.

    ``noise``: the absolute std of the subject-embedding noise; None (default) is ROME's rule,
    3 × the std of the subject tokens' embeddings (:func:`resolve_noise`). A corruption that keeps
    more than half of the clean probability is warned about (the result's ``corrupted_score`` says
    how far it fell). ``target``: a one-token string or id (default: the clean top-1). ``window``:
    layers restored together for mlp/attn (None: :func:`default_window`). Deterministic for a ``seed``.

    ``kind``: ``"hidden"`` (default), ``"mlp"`` or ``"attn"``; ``samples`` (default 10) noise draws
    per cell; ``batch_size``: rows per staircase chunk (None: sized from the free memory);
    ``progress``: a progress bar (None: automatic). Returns a :class:`TraceResult` with ``scores``
    ``[n_tokens, n_layer]`` (tokens after BOS).

    Refused (ValueError): an unknown kind, ``samples`` or ``window`` < 1, a negative or non-finite
    ``noise``, a subject that does not occur in the prompt, a target that is not one token, and a
    non-finite target probability on the clean or corrupted runs.
    """
    case = _Case(prompt, subject, target)
    std = resolve_noise(model, noise, _subject_ids(model, [case]))
    r = _trace_batch(model, [case], kind, std, samples, window, seed, batch_size, progress)[0]
    _check_corruption(r.clean_score, r.corrupted_score, f"the trace of {prompt!r}")
    return r


@boundary
def causal_trace_all(
    model: HookedGPT2,
    prompt: str,
    subject: str,
    target: str | int | None = None,
    kinds: Sequence[str] = KINDS,
    **kwargs: Any,
) -> TraceSet:
    """:func:`causal_trace` of ``prompt`` (``subject``, ``target`` as there) for each of ``kinds``
    (default: hidden, mlp, attn) → a :class:`TraceSet` (three-panel plot); ``kwargs`` go to each
    trace (``noise``, ``samples``, ``window``, ``seed``, …)."""
    # each kind is checked by causal_trace
    return TraceSet([causal_trace(model, prompt, subject, target, kind=cast(Kind, k), **kwargs) for k in kinds])


# =============================================================== averaging over facts
def _as_case(c: Any) -> tuple[str, str, str]:
    if isinstance(c, (tuple, list)) and len(c) == 3 and all(isinstance(x, str) for x in c):
        return tuple(c)
    raise TypeError(
        f"a case is a (prompt, subject, target) triple of strings, got {c!r:.80}; "
        "build them from the fact base with FactBase.cases(...)"
    )


@boundary
@dataclass
class AverageTrace(Result):
    """Causal traces averaged over facts by ROME's position buckets (their Figure 2).

    ``scores [n_kinds, 6, n_layers]`` (target probability, mean over the bucket's tokens of every
    known fact) and ``indirect_effect`` (minus each fact's corrupted score); ``counts [6]`` how
    many (fact, token) cells fed each bucket. Only facts the model knows (clean top-1 = the
    target's first token) are traced: ``n_known`` of ``n_facts``.

    ``kinds``, ``buckets`` (:data:`BUCKETS`) and ``layer_labels`` label the three axes;
    ``clean_score``: mean clean target probability; ``corrupted_score``: its mean on the corrupted
    runs, one per kind; ``noise_std``, ``samples`` and ``window`` as in :class:`TraceResult`;
    ``facts``: the traced (known) facts as ``"prompt →target"``.
    """

    result_kind = "average trace"

    kinds: list[str]
    buckets: list[str]
    layer_labels: list[str]
    scores: torch.Tensor
    indirect_effect: torch.Tensor
    counts: list[int]
    n_facts: int
    n_known: int
    clean_score: float
    corrupted_score: list[float]
    noise_std: float
    samples: int
    window: int
    facts: list[str] = field(default_factory=list)

    def __getitem__(self, kind: str) -> torch.Tensor:
        """``scores`` of one kind, ``[6, n_layers]``."""
        return self.scores[self.kinds.index(kind)]

    def clean_layers(self, kind: str, bucket: str) -> list[int]:
        """The layers at which ``bucket``'s cells of ``kind`` are the clean run by construction
        (:func:`clean_by_construction`, for a subject that does not end the prompt): for ``hidden`` the
        last token's final layer; for ``attn`` the last token's windows that span every layer."""
        if bucket != "last token":
            return []
        n = len(self.layer_labels)
        return clean_by_construction(kind, 2, (0, 1), n, self.window)[1].nonzero()[:, 0].tolist()

    def peak(self, kind: str, bucket: str, effect: bool = True) -> tuple[int, float]:
        """``(layer, value)`` of the largest average indirect effect (or score) of ``kind`` in ``bucket``,
        leaving out the layers where the bucket is the clean run by construction (:meth:`clean_layers`)."""
        row = (self.indirect_effect if effect else self.scores)[self.kinds.index(kind), self.buckets.index(bucket)]
        row = row.clone()
        skip = self.clean_layers(kind, bucket)
        if len(skip) < len(row):
            row[skip] = float("-inf")
        layer = int(row.argmax())
        return layer, float(row[layer])

    def table(self) -> str:
        """The baselines, then per kind the peak average indirect effect in each position bucket."""
        lines = [
            f"average causal trace over {self.n_known} known of {self.n_facts} facts: "
            f"clean p = {self.clean_score:.4f}, corrupted p = "
            + ", ".join(f"{k} {c:.4f}" for k, c in zip(self.kinds, self.corrupted_score))
            + f" (noise std {self.noise_std:.4g}, {self.samples} samples)"
        ]
        for kind in self.kinds:
            lines.append(f"  {kind} — peak average indirect effect by bucket:")
            rows = []
            for b, bucket in enumerate(self.buckets):
                if self.counts[b]:
                    layer, value = self.peak(kind, bucket)
                    rows.append([bucket, self.layer_labels[layer], f"{value:+.4f}", str(self.counts[b])])
            header = ["bucket", "peak layer", "average indirect effect (Δp)", "cells"]
            lines += format_table(header, rows, right=[False, True, True, True], indent="    ")
            for b, bucket in enumerate(self.buckets):
                if self.counts[b] and (skip := self.clean_layers(kind, bucket)):
                    left = ", ".join(self.layer_labels[l] for l in skip)
                    lines.append(f"  (note: in {bucket}, {left} left out: the clean run by construction)")
        return "\n".join(lines)

    def plot(self, **kwargs: Any):
        from ..plots.causal import plot_average_trace

        return plot_average_trace(self, **kwargs)


def _average_work(
    model: HookedGPT2,
    cases: Sequence[tuple[str, str, str]],
    batches: list[list[int]],
    kinds: list[str],
    samples: int,
    window: int | None,
    group: Any,
) -> Work:
    """The work of an averaged trace (this rank's share of the batches, every kind), with the time
    expected from one timed forward of the first batch's clean and noised runs (not run, and no
    time given, while hooks are attached to the model)."""
    mine = list(distributed.shard(batches, group))
    n = model.cfg.n_layer
    tokens, mask = model.tokenize([cases[i][0] for i in mine[0]])
    reps = samples + 1
    if any(hp.has_hooks for hp in model.hook_dict.values()):  # a caller's hooks must not see an extra run
        what = f"average trace ({', '.join(kinds)}) of {sum(len(b) for b in mine)} known facts"
        works = [trace_work(model, [cases[i][:2] for i in idx], k, samples, window) for idx in mine for k in kinds]
        return Work(what, sum(w.runs for w in works), sum(w.tokens for w in works), sum(w.passes for w in works))
    with torch.inference_mode():
        _, seconds = timed(
            model,
            lambda: model(
                tokens.repeat(reps, 1), attention_mask=None if mask is None else mask.repeat(reps, 1), stop_at_layer=n
            ),
        )
    speed = Speed.measure(model, seconds, tokens.numel() * reps * n, n)
    works = [trace_work(model, [cases[i][:2] for i in idx], k, samples, window, speed) for idx in mine for k in kinds]
    what = f"average trace ({', '.join(kinds)}) of {sum(len(b) for b in mine)} known facts in {len(mine)} batch(es)"
    return Work(
        what,
        sum(w.runs for w in works),
        sum(w.tokens for w in works),
        sum(w.passes for w in works),
        sum(w.seconds or 0.0 for w in works),
    )


def bucket_cells(n_tokens: int, subject_range: tuple[int, int]) -> list[list[int]]:
    """Token indices of each of ROME's buckets (they may overlap, as in ROME: a one-token subject is
    both first and last; the first subsequent token may be the last token)."""
    b, e = subject_range
    last = n_tokens - 1
    return [
        [b],
        list(range(b + 1, e - 1)),
        [e - 1],
        [e] if e <= last else [],
        list(range(e + 1, last)),
        [last],
    ]


@boundary
def average_trace(
    model: HookedGPT2,
    cases: Sequence[tuple[str, str, str]],
    kind: str | Sequence[str] = "hidden",
    noise: float | None = None,
    samples: int = 10,
    window: int | None = None,
    seed: int = 0,
    facts_per_batch: int = 16,
    batch_size: int | None = None,
    progress: bool | None = None,
    group: Any = None,
) -> AverageTrace:
    """Average causal traces over ``cases`` — ``(prompt, subject, target)`` triples, e.g. from
    ``FactBase.cases()`` — in ROME's six position buckets.

    The target is scored by its first token; cases whose clean top-1 is not that token are
    skipped (``n_known`` says how many remain). ``kind``: one kind or several (e.g. ``KINDS``).
    ``noise``: as in :func:`causal_trace`; the default rule pools the subjects of the known cases
    (one σ for the whole average, as ROME measures it over its dataset).

    Distributed (an initialised process group, or ``group``): every rank finds the known facts,
    then traces its share of the fact batches; the bucket sums are all-reduced, so every rank
    returns the single-process result (up to float summation order).

    ``samples`` (default 10), ``window`` and ``seed`` as in :func:`causal_trace`;
    ``facts_per_batch`` (default 16) prompts are traced together in one staircase run, in chunks
    of ``batch_size`` rows (None: sized from the free memory); ``progress``: a bar over the fact
    batches. Returns an :class:`AverageTrace` with ``scores`` ``[n_kinds, 6, n_layer]``.

    Refused: a case that is not a triple of strings (TypeError); no cases, no case the model knows,
    and the refusals of :func:`causal_trace` (ValueError).
    """
    kinds = [kind] if isinstance(kind, str) else list(kind)
    cases = [_as_case(c) for c in cases]
    if not cases:
        raise ValueError("no cases to trace: pass (prompt, subject, target) triples")
    with torch.inference_mode():  # the one "known" rule (analysis.known): top-1 = an informative first token
        known = [i for i, k in enumerate(knows(model, [p for p, _, _ in cases], [t for _, _, t in cases])) if k]
    if not known:
        raise ValueError(
            f"the model knows none of the {len(cases)} facts (clean top-1 ≠ the target's first token, "
            "or a whitespace-only first token); nothing to average"
        )
    std = resolve_noise(model, noise, _subject_ids(model, [_Case(*cases[i]) for i in known]))
    n = model.cfg.n_layer
    sums = torch.zeros(len(kinds), len(BUCKETS), n)
    effect = torch.zeros_like(sums)
    counts = [0] * len(BUCKETS)
    clean: list[float] = []
    low: list[list[float]] = [[] for _ in kinds]
    batches = [known[a : a + facts_per_batch] for a in range(0, len(known), facts_per_batch)]
    if shown(progress and distributed.is_main(group)):
        note(_average_work(model, cases, batches, kinds, samples, window, group).line(), enabled=True)
    # distributed: each rank traces its share of the batches; sums and counts are all-reduced below
    for idx in progress_bar(
        distributed.shard(batches, group), desc="average trace", enabled=progress and distributed.is_main(group)
    ):
        batch = [_Case(cases[i][0], cases[i][1], target_ids(model, cases[i][2])[0]) for i in idx]
        for k, kd in enumerate(kinds):
            for r in _trace_batch(model, batch, kd, std, samples, window, seed, batch_size, False):
                low[k].append(r.corrupted_score)
                if k == 0:
                    clean.append(r.clean_score)
                for j, cells in enumerate(bucket_cells(len(r.tokens), r.subject_range)):
                    if cells:
                        sums[k, j] += r.scores[cells].sum(0)
                        effect[k, j] += r.indirect_effect[cells].sum(0)
                        if k == 0:
                            counts[j] += len(cells)
    clean_score, corrupted = sum(clean) / len(known), [sum(v) / len(known) for v in low]
    if distributed.is_distributed(group):
        sums, effect = distributed.all_reduce_sum(sums, group), distributed.all_reduce_sum(effect, group)
        counts = [int(c) for c in distributed.all_reduce_sum(torch.tensor(counts), group).tolist()]
        means = distributed.all_reduce_sum(
            torch.tensor([sum(clean)] + [sum(v) for v in low], dtype=torch.float64), group
        ) / len(known)
        clean_score, corrupted = float(means[0]), means[1:].tolist()
    div = torch.tensor(counts, dtype=torch.float).clamp(min=1)[None, :, None]
    _check_corruption(clean_score, max(corrupted), "the averaged trace")
    return AverageTrace(
        kinds=kinds,
        buckets=list(BUCKETS),
        layer_labels=[f"L{l}" for l in range(n)],
        scores=sums / div,
        indirect_effect=effect / div,
        counts=counts,
        n_facts=len(cases),
        n_known=len(known),
        clean_score=clean_score,
        corrupted_score=corrupted,
        noise_std=std,
        samples=samples,
        window=default_window(n) if window is None else window,
        facts=[f"{cases[i][0]} →{cases[i][2]}" for i in known],
    )
