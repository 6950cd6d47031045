"""Training sparse autoencoders on a hook point's activations, streamed from text.

Text (the Brown corpus, a folder of ``.txt`` files, the model's own generations, or any list of
strings) is tokenized into windows of ``context_size`` tokens (BOS first); the model runs each batch of
windows only as far as the hook point (``stop_at_layer``), and the activations of the positions
:func:`kept_positions` keeps (BOS left out, its norm an outlier no dictionary should spend latents on;
optionally the massive activations too) go into a shuffling buffer, which hands out batches mixed across
many windows (:class:`ActivationBuffer`).

Held-out text: :func:`split_windows` keeps the last ``heldout`` share of a source's windows out of training
and returns a record of the split (which source, which windows), which :func:`train_sae` stores in the
SAE's config (``SAEConfig.training``, with the windows it read and the outlier rule);
:func:`heldout_windows` rebuilds the held-out windows from it and :func:`trained_overlap` says whether
windows of a source overlap what was trained on.

Training (:func:`train_sae`) follows Gao et al. (2024): Adam, decoder rows kept at unit norm (the
gradient's component along each row removed before the step, the rows renormalised after it), ``b_dec``
initialised at the data's geometric median (or mean), and an auxiliary top-``aux_k`` loss that makes
dead latents (none firing over the last ``dead_after`` tokens) reconstruct the main loss's residual.
The loss is normalised: squared error over the batch's total variance (:func:`fvu`, the same definition
that :func:`~gpt2_interp.analysis.features.sae_eval.evaluate_sae` reports), so that a loss of 0.2 is a
fraction of variance unexplained (FVU) of 0.2. ReLU SAEs add ``l1_coefficient × Σ z``.
With ``checkpoint`` the SAE, the optimizer and the step are saved every ``checkpoint_every`` steps,
and a run given the same folder resumes after the last checkpoint (on the next unread windows).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ...core.boundary import boundary
from ...core.checks import check_choice, check_count, check_number, check_str, check_token_windows
from ...core.progress import progress_bar
from ...io.files import load_tree, save_tree
from ...model.fingerprint import weights_fingerprint
from .activations import hook_width, run_to_hook
from .sae import ARCHITECTURES, SAE, Architecture, SAEConfig

CHECKPOINT_FILE = "train_state.safetensors"  # written by save_tree: no pickle, digest-checked
TOPK_DEFAULT = 32  # k of a top-k SAE when SAETrainConfig.k is not given

if TYPE_CHECKING:
    from ...model.hooked_gpt2 import HookedGPT2


# ---------------------------------------------------------------------- text and token windows
@boundary
def text_source(model: HookedGPT2, source: str | Sequence[str], n_generated: int = 64, seed: int = 0) -> list[str]:
    """Documents to train on, from ``source``: ``"brown"`` (the Brown corpus, :mod:`gpt2_interp.io.corpora`),
    ``"generated"`` (``n_generated`` samples of the model itself from its BOS token, sampled with
    ``seed``), ``"facts"`` (the fact base's training corpus, :func:`gpt2_interp.facts.corpus.training_texts`:
    the text gpt2-facts was trained on), a path to a folder of ``.txt`` files (or one file), or a list of
    strings (as given)."""
    if not isinstance(source, str):
        docs = list(source)
        if not docs or not all(isinstance(d, str) for d in docs):
            raise TypeError(
                "texts must be 'brown', 'generated', 'facts', a folder of .txt files, or a non-empty list of strings"
            )
        return docs
    if source == "brown":
        from ...io.corpora import brown_texts

        return brown_texts()
    if source == "facts":
        from ...facts.base import FactBase
        from ...facts.corpus import training_texts

        return training_texts(FactBase.load())
    if source == "generated":
        bos = model.tokenizer.bos_id
        assert bos is not None, "generating from nothing needs a BOS token"
        start = torch.full((n_generated, 1), bos, dtype=torch.long, device=model.device)
        # stops once every sample has ended: the same samples as running to n_ctx, cut at their end-of-text
        out = model.generate(start, max_new_tokens=model.cfg.n_ctx - 1, seed=seed, stop_at_eos=True)
        eos = model.tokenizer.eos_id
        rows = [row[1:].tolist() for row in out]
        return [model.tokenizer.decode(r[: r.index(eos)] if eos in r else r) for r in rows]  # each up to its EOS
    path = Path(source)
    if path.is_file():
        return [path.read_text(errors="replace")]
    if path.is_dir():
        docs = [p.read_text(errors="replace") for p in sorted(path.rglob("*.txt"))]
        if docs:
            return docs
        raise FileNotFoundError(f"no .txt files under {path}")
    raise ValueError(f"texts {source!r} is not 'brown', 'generated', 'facts', a file or a folder of .txt files")


@boundary
def token_windows(model: HookedGPT2, docs: Sequence[str], context_size: int) -> torch.Tensor:
    """Documents as token windows ``[n, context_size]``: the documents' tokens packed in order, an
    end-of-text token after each, split into runs of ``context_size − 1`` after a BOS token (a shorter
    tail is dropped)."""
    return _windows_of(model, _token_stream(model, docs), context_size)


def _token_stream(model: HookedGPT2, docs: Sequence[str]) -> list[int]:
    """The documents' tokens packed in order, an end-of-text token after each."""
    return [i for d in docs for i in [*model.tokenizer.encode_ids(d), model.tokenizer.eos_id]]


def _body(model: HookedGPT2, context_size: int) -> int:
    """Tokens of the text in one window of ``context_size`` (all but the BOS token, where there is one)."""
    return context_size - (model.tokenizer.bos_id is not None)


def _windows_of(model: HookedGPT2, ids: list[int], context_size: int, allow_empty: bool = False) -> torch.Tensor:
    context_size = check_count(context_size, "context_size", 2)
    if context_size > model.cfg.n_ctx:
        raise ValueError(f"context_size {context_size} exceeds {model.cfg.name}'s context of {model.cfg.n_ctx}")
    bos = model.tokenizer.bos_id
    body = _body(model, context_size)
    rows = [([bos] if bos is not None else []) + ids[i : i + body] for i in range(0, len(ids) - body + 1, body)]
    if not rows:
        if allow_empty:
            return torch.empty(0, context_size, dtype=torch.long)
        raise ValueError(f"the texts give no window of {context_size} tokens; give more or longer texts")
    return torch.tensor(rows, dtype=torch.long)


def source_name(texts: str | Sequence[str]) -> str:
    """How a training record names a text source: ``"brown"``, ``"generated"``, ``"facts"``, a path made
    absolute, or ``"<N strings>"`` for a list of strings (which no later command can name again)."""
    if not isinstance(texts, str):
        return f"<{len(list(texts))} strings>"
    if texts in ("brown", "generated", "facts"):
        return texts
    return str(Path(texts).expanduser().resolve())


def split_windows(
    model: HookedGPT2,
    texts: str | Sequence[str],
    context_size: int,
    heldout: float = 0.1,
    seed: int = 0,
    n_generated: int = 64,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The token windows of ``texts`` (:func:`text_source`, :func:`token_windows`) split for training:
    ``(train_windows, record)``. The last ``heldout`` share of the windows (at least one; 0: none) is kept
    out of training; ``record`` says which source (``texts``, ``seed``, ``n_generated``), the
    ``context_size``, ``documents`` (None: every document of the source), ``train_windows`` (the
    training text is windows ``[0, train_windows)``) and ``heldout_windows`` (how many follow): give it to
    :func:`train_sae` (``record=``), which stores it in the SAE, and :func:`heldout_windows` returns the
    held-out windows from it."""
    check_number(heldout, "heldout", 0, 1, high_open=True)
    windows = token_windows(model, text_source(model, texts, n_generated=n_generated, seed=seed), context_size)
    n_held = max(1, math.ceil(heldout * len(windows))) if heldout > 0 else 0
    if n_held >= len(windows):
        raise ValueError(
            f"the texts give {len(windows)} windows of {context_size} tokens: too few to hold {heldout:g} of them out"
        )
    n_train = len(windows) - n_held
    record = {
        "texts": source_name(texts),
        "seed": seed,
        "n_generated": n_generated,
        "context_size": context_size,
        "documents": None,
        "train_windows": n_train,
        "heldout_windows": n_held,
    }
    return windows[:n_train], record


def heldout_windows(model: HookedGPT2, record: dict[str, Any], context_size: int | None = None) -> torch.Tensor:
    """The windows ``[n, context_size]`` of an SAE's training record (``sae.cfg.training``) that training
    never read: the source's text after the ``train_windows`` training windows of its first ``documents``
    documents, then the documents after those. ``context_size``: None for the record's; another size cuts
    the same held-out text (it starts at the same token) into windows of that size."""
    ctx = int(record["context_size"]) if context_size is None else context_size
    docs = text_source(model, record["texts"], n_generated=int(record.get("n_generated", 64)), seed=int(record["seed"]))
    n_docs = len(docs) if record.get("documents") is None else int(record["documents"])
    stream = _token_stream(model, docs[:n_docs])
    first = int(record["train_windows"]) * _body(model, int(record["context_size"]))
    parts = [_windows_of(model, stream[first:], ctx, allow_empty=True)]
    if n_docs < len(docs):
        parts.append(_windows_of(model, _token_stream(model, docs[n_docs:]), ctx, allow_empty=True))
    held = torch.cat(parts)
    if not len(held):
        raise ValueError(
            f"the SAE was trained on all of {record['texts']!r} (no held-out windows of {ctx} tokens): evaluate it "
            "on other text (--texts)"
        )
    return held


def trained_overlap(
    model: HookedGPT2, record: dict[str, Any] | None, texts: str, context_size: int, start: int, n: int
) -> int:
    """How many of the windows ``[start, start + n)`` of ``texts`` (cut at ``context_size``) hold text the
    SAE whose training record is ``record`` was trained on (0 for another source or no record; the
    record's ``windows_read``, else all its ``train_windows``, counted as read)."""
    if record is None or n <= 0 or source_name(texts) != record["texts"]:
        return 0
    trained = min(int(record.get("windows_read", record["train_windows"])), int(record["train_windows"]))
    end_token = trained * _body(model, int(record["context_size"]))  # training read the stream's tokens [0, end)
    body = _body(model, context_size)
    first_clear = -(-end_token // body)  # the first window starting at or after end_token
    return max(0, min(start + n, first_clear) - start)


def norm_outliers(acts: torch.Tensor, ratio: float) -> torch.Tensor:
    """Which rows of ``acts`` ``[n, d]`` are norm outliers ``[n]`` (bool): a norm above ``ratio`` × the median
    norm of the rows. Such are the *massive activations* of Llama-family models (Sun et al. 2024): a few
    positions near the start of a window (a newline or a comma right after BOS) whose residual norm is ~100 ×
    the others' and would dominate any squared-error loss or variance."""
    norms = acts.float().norm(dim=-1)
    return norms > ratio * norms.median()


def kept_positions(act: torch.Tensor, skip_first: bool, outlier_ratio: float | None) -> torch.Tensor:
    """Which positions of an activation ``act`` ``[batch, pos, ...]`` are trained on and measured ``[batch,
    pos]`` (bool) — the one rule of training (:class:`ActivationBuffer`) and of the metrics
    (:func:`~gpt2_interp.analysis.features.sae_eval.evaluate_sae`): every position but the first when
    ``skip_first`` (BOS), and with ``outlier_ratio`` not those whose norm exceeds ``outlier_ratio`` × the
    median norm of their own window's other positions (:func:`norm_outliers` per window: the massive
    activations), so that the rule does not depend on how windows are batched."""
    keep = torch.ones(act.shape[:2], dtype=torch.bool, device=act.device)
    if skip_first:
        keep[:, 0] = False
    if outlier_ratio is not None:
        body = act[:, int(skip_first) :].flatten(2).float().norm(dim=-1)  # [batch, pos - skip]
        if body.shape[1]:
            keep[:, int(skip_first) :] &= ~(body > outlier_ratio * body.median(dim=-1, keepdim=True).values)
    return keep


def fvu(x: torch.Tensor, recons: torch.Tensor) -> torch.Tensor:
    """The fraction of variance unexplained of rows ``x`` ``[n, d]`` by ``recons``: ``Σ‖x − x̂‖² / Σ‖x − x̄‖²``,
    ``x̄`` the mean row of ``x`` — a training step's loss on its batch, and ``1 − variance explained`` of
    :func:`~gpt2_interp.analysis.features.sae_eval.evaluate_sae` over all the evaluated rows."""
    return (x - recons).pow(2).sum() / (x - x.mean(0)).pow(2).sum()


@boundary
class ActivationBuffer:
    """Activations ``[batch_size, d_in]`` at ``hook_name`` for token ``windows`` ``[n, pos]``, shuffled:
    ``buffer_tokens`` activations are held; each refill runs ``forward_batch`` windows at a time until the
    store is full again, shuffles it, and hands out its first half as batches. BOS positions are
    skipped. ``epochs``: passes over the windows (each pass reshuffled); with ``cache`` the activations of
    the first pass are kept in memory (``n × (pos − 1) × d_in`` floats) and later passes read them
    instead of running the model again. Positions are kept by :func:`kept_positions`: BOS left out
    (``bos`` counts them) and, with ``outlier_ratio``, positions whose norm exceeds this × the median of
    their window (``outliers`` counts them); None keeps all but BOS.
    ``start``: the first window to read, counted over all passes (a resumed run); ``seed`` seeds the
    shuffling. Iterating yields batches until the passes run out
    (``windows_read``: how many windows were read so far, over all passes). ``on_forward``: called after
    each forward pass of the model (a progress bar counts them); :meth:`forward_passes` estimates how many
    are still to come."""

    def __init__(
        self,
        model: HookedGPT2,
        hook_name: str,
        windows: torch.Tensor,
        batch_size: int,
        buffer_tokens: int,
        forward_batch: int = 32,
        seed: int = 0,
        start: int = 0,
        epochs: int = 1,
        cache: bool = False,
        outlier_ratio: float | None = None,
    ) -> None:
        self.model, self.hook_name, self.windows = model, hook_name, windows
        self.batch_size = check_count(batch_size, "batch_size")
        self.buffer_tokens = max(check_count(buffer_tokens, "buffer_tokens"), 2 * self.batch_size)
        self.forward_batch = check_count(forward_batch, "forward_batch")
        self.epochs = check_count(epochs, "epochs")
        self.total_windows = self.epochs * len(windows)
        self.windows_read = start
        self.g = torch.Generator().manual_seed(seed)
        self.skip_first = model.tokenizer.bos_id is not None
        self.forward_seconds = 0.0
        self.cache: dict[int, torch.Tensor] | None = {} if cache else None
        self.outlier_ratio = None if outlier_ratio is None else check_number(outlier_ratio, "outlier_ratio", 1)
        self.outliers = 0
        self.bos = 0
        self.on_forward: Callable[[], None] | None = None

    def forward_passes(self, tokens: int) -> int:
        """An estimate of the model's forward passes (of up to ``forward_batch`` windows) this buffer will
        run to hand out ``tokens`` more activations: the windows they take (BOS and none of the outliers left
        out) plus one buffer fill of read-ahead, up to the end of the passes, less those a cache will serve."""
        n, per = len(self.windows), max(1, self.windows.shape[1] - int(self.skip_first))
        end = min(self.total_windows, self.windows_read + math.ceil((tokens + self.buffer_tokens) / per))
        passes, w = 0, self.windows_read
        while w < end:
            first = w % n
            take = min(n - first, end - w)
            if not (self.cache is not None and w >= n and self.windows_read < n):  # a later pass, from memory
                passes += math.ceil(take / self.forward_batch)
            w += take
        return passes

    def _read(self, n_tokens: int) -> list[torch.Tensor]:
        out, have, n = [], 0, len(self.windows)
        with torch.no_grad():
            while have < n_tokens and self.windows_read < self.total_windows:
                first = self.windows_read % n
                rows = self.windows[first : min(first + self.forward_batch, n)]  # a read never spans two passes
                self.windows_read += len(rows)
                act = self.cache.get(first) if self.cache is not None else None
                if act is None:
                    t = time.perf_counter()
                    act = run_to_hook(self.model, rows, self.hook_name)
                    keep = kept_positions(act, self.skip_first, self.outlier_ratio)
                    self.bos += len(rows) if self.skip_first else 0
                    self.outliers += int((~keep).sum()) - (len(rows) if self.skip_first else 0)
                    act = act.reshape(*act.shape[:2], -1)[keep].float()
                    self.forward_seconds += time.perf_counter() - t
                    if self.on_forward is not None:
                        self.on_forward()
                    if self.cache is not None and self.epochs > 1:
                        self.cache[first] = act
                out.append(act)
                have += len(act)
        return out

    def __iter__(self) -> Iterator[torch.Tensor]:
        store = torch.cat(self._read(self.buffer_tokens) or [torch.empty(0)])
        while len(store) >= self.batch_size:
            store = store[torch.randperm(len(store), generator=self.g).to(store.device)]
            half = max(self.batch_size, (len(store) // 2) // self.batch_size * self.batch_size)
            if self.windows_read >= self.total_windows:
                half = len(store) // self.batch_size * self.batch_size
            for i in range(0, half, self.batch_size):
                yield store[i : i + self.batch_size]
            store = store[half:]
            fresh = self._read(self.buffer_tokens - len(store))
            if fresh:
                store = torch.cat([store, *fresh])


# ---------------------------------------------------------------------- training
@boundary
@dataclass
class SAETrainConfig:
    """How to train an SAE. ``hook_name`` (e.g. ``blocks.3.hook_resid_post``); ``expansion``: latents
    per input dimension (``d_sae = expansion × d_in`` unless ``d_sae`` is given); ``architecture``:
    ``"topk"`` (default), ``"batchtopk"`` or ``"relu"``; ``k``: active latents per token (top-k kinds; None:
    32; a relu SAE refuses one, as a ``k`` above ``d_sae``);
    ``l1_coefficient``: the ReLU SAE's sparsity penalty. ``tokens``: the training budget;
    ``batch_size``: activations per step; ``lr``: Adam's step (None: Gao et al.'s ``2e-4 /
    sqrt(d_sae / 16384)``); ``context_size``: tokens per window; ``buffer_tokens``: the shuffling
    buffer's size; ``forward_batch``: windows per forward pass; ``b_dec_init``: ``"geometric_median"``,
    ``"mean"`` or ``"zeros"``; ``aux_k`` (None: ``d_in // 2``), ``aux_coefficient`` and ``dead_after``
    (tokens without firing before a latent counts as dead, for the auxiliary loss); ``lr_warmup`` and
    ``lr_decay``: fractions of the steps with a linear warm-up and a final linear decay to 0;
    ``epochs``: passes over the token windows (a corpus smaller than ``tokens`` is read again; the
    activations of the first pass are kept in memory and reused); ``outlier_ratio``: leave out positions
    whose norm exceeds this × their window's median (:func:`kept_positions`; None: keep every position but BOS);
    ``checkpoint_every``: steps between checkpoints; ``seed``."""

    hook_name: str
    expansion: int = 8
    d_sae: int | None = None
    architecture: Architecture = "topk"
    k: int | None = None
    l1_coefficient: float = 5.0
    tokens: int = 2_000_000
    batch_size: int = 4096
    lr: float | None = None
    context_size: int = 64
    buffer_tokens: int = 65_536
    forward_batch: int = 32
    b_dec_init: str = "geometric_median"
    aux_k: int | None = None
    aux_coefficient: float = 1 / 32
    dead_after: int = 200_000
    lr_warmup: float = 0.01
    lr_decay: float = 0.2
    epochs: int = 1
    outlier_ratio: float | None = None
    checkpoint_every: int = 200
    seed: int = 0

    def __post_init__(self) -> None:
        check_str(self.hook_name, "hook_name", "blocks.3.hook_resid_post")
        check_choice(self.architecture, "architecture", ARCHITECTURES)
        check_choice(self.b_dec_init, "b_dec_init", ("geometric_median", "mean", "zeros"))
        if self.architecture == "relu":
            if self.k is not None:
                raise ValueError(
                    f"k={self.k} applies to the top-k architectures (topk, batchtopk); a relu SAE's sparsity is set by "
                    "l1_coefficient: leave k unset (None)"
                )
        elif self.k is None:
            self.k = TOPK_DEFAULT
        if self.d_sae is not None:
            check_count(self.d_sae, "d_sae")
            if self.k is not None and self.k > self.d_sae:
                raise ValueError(
                    f"k={self.k} exceeds d_sae={self.d_sae}: a {self.architecture} SAE keeps k of its d_sae latents"
                )
        if self.aux_k is not None:
            check_count(self.aux_k, "aux_k")
        check_count(self.context_size, "context_size", 2)
        for name in (
            "expansion",
            "tokens",
            "batch_size",
            "context_size",
            "buffer_tokens",
            "forward_batch",
            "epochs",
        ):
            check_count(getattr(self, name), name)
        if self.k is not None:
            check_count(self.k, "k")
        check_count(self.dead_after, "dead_after")
        check_count(self.checkpoint_every, "checkpoint_every")
        check_number(self.l1_coefficient, "l1_coefficient", 0)
        check_number(self.aux_coefficient, "aux_coefficient", 0)
        check_number(self.lr_warmup, "lr_warmup", 0, 1)
        check_number(self.lr_decay, "lr_decay", 0, 1)
        if self.lr is not None:
            check_number(self.lr, "lr", 0, low_open=True)
        if self.outlier_ratio is not None:
            check_number(self.outlier_ratio, "outlier_ratio", 1)


@boundary
@dataclass
class TrainingLog:
    """What a training run did: ``steps``, ``tokens`` trained on, per-step ``fvu``, ``l0`` and ``dead``
    (the fraction of latents dead by the ``dead_after`` rule) every ``every`` steps, the seconds spent
    in the model's forward passes (``forward_seconds``) and in SAE steps (``step_seconds``),
    ``resumed_from`` (the step a checkpoint resumed at, else 0), ``outliers`` (positions left out as
    norm outliers, see :attr:`SAETrainConfig.outlier_ratio`) and ``bos`` (BOS positions left out), both
    counted over the windows this run read. ``fvu`` is each logged batch's :func:`fvu` before its step."""

    steps: int = 0
    tokens: int = 0
    every: int = 10
    fvu: list[float] = field(default_factory=list)
    l0: list[float] = field(default_factory=list)
    dead: list[float] = field(default_factory=list)
    forward_seconds: float = 0.0
    step_seconds: float = 0.0
    resumed_from: int = 0
    outliers: int = 0
    bos: int = 0


@torch.no_grad()
def geometric_median(x: torch.Tensor, iterations: int = 50, eps: float = 1e-6) -> torch.Tensor:
    """The geometric median ``[d]`` of points ``x`` ``[n, d]`` (Weiszfeld's iterations from the mean)."""
    m = x.mean(0)
    for _ in range(iterations):
        w = 1 / (x - m).norm(dim=-1).clamp_min(eps)
        new = (w[:, None] * x).sum(0) / w.sum()
        if (new - m).norm() < eps * (1 + m.norm()):
            return new
        m = new
    return m


def _step_loss(
    sae: SAE, x: torch.Tensor, cfg: SAETrainConfig, dead: torch.Tensor, target: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(loss, latents, fvu)`` of one batch ``x`` ``[batch, d_in]``; ``dead`` ``[d_sae]`` marks dead latents.
    ``target`` ``[batch, d_out]``: what the decoder predicts (None: ``x`` itself, an SAE; a transcoder's
    is another hook's activation, and its linear ``sae.skip(x)`` joins the prediction)."""
    pre = sae.pre_acts(x)
    if cfg.architecture == "topk":  # decode the k active rows only (a gather, not a [batch, d_sae] product)
        vals, idx = pre.topk(sae.cfg.k, dim=-1, sorted=False)
        vals = vals.relu()
        recons = F.embedding_bag(idx, sae.W_dec, per_sample_weights=vals, mode="sum") + sae.b_dec
        z = torch.zeros_like(pre).scatter(-1, idx, vals.detach())
    else:
        z = sae.activate(pre, batch=True)
        recons = z @ sae.W_dec + sae.b_dec
    skip = sae.skip(x)
    if skip is not None:
        recons = recons + skip
    x = x if target is None else target
    var = (x - x.mean(0)).pow(2).sum()
    err = x - recons
    batch_fvu = fvu(x, recons)
    loss = batch_fvu
    if cfg.architecture == "relu":
        loss = loss + cfg.l1_coefficient * z.sum(-1).mean() / (var / len(x)).sqrt()  # L1 in units of the data's scale
    n_dead = int(dead.sum())
    if n_dead and cfg.aux_coefficient > 0:
        aux_k = min(cfg.aux_k or sae.cfg.d_in // 2, n_dead)
        dead_pre = pre.masked_fill(~dead, float("-inf"))
        vals, idx = dead_pre.topk(aux_k, dim=-1, sorted=False)
        e_hat = F.embedding_bag(idx, sae.W_dec, per_sample_weights=vals.relu(), mode="sum")
        e = err.detach()
        aux = (e - e_hat).pow(2).sum() / (e - e.mean(0)).pow(2).sum().clamp_min(1e-12)
        loss = loss + cfg.aux_coefficient * aux.nan_to_num(0.0)
    return loss, z, batch_fvu.detach()


class SAETrainer:
    """One SAE's optimisation, a step at a time (what :func:`train_sae` loops over): Adam with
    ``cfg``'s learning-rate schedule over ``total_steps``, the unit-norm decoder constraint, dead-latent
    tracking for the auxiliary loss and BatchTopK's threshold. ``sae``: the SAE to train (in place)."""

    def __init__(self, sae: SAE, cfg: SAETrainConfig, total_steps: int) -> None:
        self.sae, self.cfg, self.total_steps = sae, cfg, check_count(total_steps, "total_steps")
        self.lr = cfg.lr if cfg.lr is not None else 2e-4 / math.sqrt(sae.cfg.d_sae / 16384)
        self.opt = torch.optim.Adam(sae.parameters(), lr=self.lr, betas=(0.9, 0.999), eps=6.25e-10)
        self.since_fired = torch.zeros(sae.cfg.d_sae, dtype=torch.long, device=sae.W_dec.device)
        self.steps = 0
        self.warm = max(1, int(cfg.lr_warmup * total_steps))
        self.decay_from = int((1 - cfg.lr_decay) * total_steps)

    @torch.no_grad()
    def init_b_dec(self, x: torch.Tensor) -> None:
        """Set ``b_dec`` from a first batch ``x`` ``[batch, d_out]`` of what the decoder predicts (an SAE's
        input, a transcoder's target) as ``cfg.b_dec_init`` says."""
        if self.cfg.b_dec_init != "zeros":
            self.sae.b_dec.copy_(geometric_median(x) if self.cfg.b_dec_init == "geometric_median" else x.mean(0))

    def step(
        self, x: torch.Tensor, target: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One optimisation step on activations ``x`` ``[batch, d_in]``: ``(fvu, latents, dead)``, the
        batch's FVU before the step, its latents ``[batch, d_sae]`` and the dead-latent mask ``[d_sae]``.
        ``target`` ``[batch, d_out]``: the activations to predict (None: ``x``, an SAE; a transcoder's
        differ)."""
        cfg, sae, step = self.cfg, self.sae, self.steps
        scale = min(1.0, (step + 1) / self.warm)
        if step >= self.decay_from:
            scale = min(scale, (self.total_steps - step) / max(1, self.total_steps - self.decay_from))
        for group in self.opt.param_groups:
            group["lr"] = self.lr * scale
        dead = self.since_fired >= cfg.dead_after
        loss, z, fvu = _step_loss(sae, x, cfg, dead, target)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            w, g = sae.W_dec, sae.W_dec.grad
            assert g is not None, "the decoder has a gradient after backward()"
            g -= (g * w).sum(-1, keepdim=True) * w  # no step along a row: rows stay unit norm
        self.opt.step()
        sae.normalize_decoder()
        with torch.no_grad():
            self.since_fired += len(x)
            self.since_fired[(z > 0).any(0)] = 0
            if cfg.architecture == "batchtopk":
                assert sae.threshold is not None, "a BatchTopK SAE has a threshold buffer"
                positive = z[z > 0]
                if positive.numel():
                    sae.threshold.lerp_(positive.min().expand_as(sae.threshold), 0.01)
        self.steps += 1
        return fvu, z, dead


def new_sae(model: HookedGPT2, cfg: SAETrainConfig) -> SAE:
    """A freshly initialised SAE for ``model`` at ``cfg.hook_name`` (width read from the model), seeded
    by ``cfg.seed``, carrying the model's weights fingerprint."""
    d_in = hook_width(model, cfg.hook_name)
    return SAE(
        SAEConfig(
            d_in=d_in,
            d_sae=cfg.d_sae if cfg.d_sae is not None else cfg.expansion * d_in,
            hook_name=cfg.hook_name,
            architecture=cfg.architecture,
            k=cfg.k if cfg.k is not None else TOPK_DEFAULT,  # a relu SAE's k is unused
            model_name=model.cfg.name,
            base_fingerprint=weights_fingerprint(model),
        ),
        seed=cfg.seed,
    ).to(model.device)


@boundary
def train_sae(
    model: HookedGPT2,
    cfg: SAETrainConfig,
    texts: str | Sequence[str] = "brown",
    checkpoint: str | Path | None = None,
    progress: bool | None = True,
    windows: torch.Tensor | None = None,
    record: dict[str, Any] | None = None,
) -> tuple[SAE, TrainingLog]:
    """Train an SAE on ``model``'s activations at ``cfg.hook_name`` (see the module's docstring):
    ``(sae, log)``. ``texts``: see :func:`text_source` (or give token ``windows`` ``[n, pos]``
    directly, with ``record``, the split :func:`split_windows` made them by). ``checkpoint``: a folder for
    resumable checkpoints. ``progress``: a bar with the live FVU, L0 and dead fraction (None: on a terminal,
    else plain lines at a steady interval, :mod:`gpt2_interp.core.progress`); it counts the training steps
    and the model's forward passes that fill the activation buffer, so its ETA includes both. The SAE's
    ``cfg.training`` records the training text (``record``, or ``texts`` read whole), ``windows_read`` and
    ``outlier_ratio``: :func:`heldout_windows` and the CLI's ``sae eval`` read it. An unknown hook raises
    KeyError; a budget the texts cannot fill is trained on what they give (``log.tokens`` says how much)."""
    torch.manual_seed(cfg.seed)
    sae = new_sae(model, cfg)
    if windows is None:
        windows = token_windows(model, text_source(model, texts, seed=cfg.seed), cfg.context_size)
        if record is None:
            record = {"texts": source_name(texts), "seed": cfg.seed, "n_generated": 64, "documents": None}
            record |= {"context_size": cfg.context_size, "train_windows": len(windows)}
    windows = check_token_windows(windows, "windows")
    total_steps = max(1, cfg.tokens // cfg.batch_size)
    trainer = SAETrainer(sae, cfg, total_steps)
    log = TrainingLog(every=max(1, total_steps // 200))
    start_window = 0
    ckpt = Path(checkpoint) / CHECKPOINT_FILE if checkpoint is not None else None
    if ckpt is not None and ckpt.is_file():
        state = load_tree(ckpt, kind="SAE training checkpoint", map_location=model.device)
        saved = state["config"] | ({"k": None} if cfg.architecture == "relu" else {})  # k was stored for relu too
        if saved != asdict(cfg) or state["weights"] != sae.cfg.base_fingerprint:
            raise ValueError(f"{ckpt} was written by a run with other settings or base weights; use another folder")
        sae.load_state_dict(state["sae"])
        trainer.opt.load_state_dict(state["optimizer"])
        trainer.since_fired, start_window, trainer.steps = state["since_fired"], state["windows_read"], state["step"]
        log = TrainingLog(**state["log"])
        log.resumed_from = trainer.steps
    buffer = ActivationBuffer(
        model,
        cfg.hook_name,
        windows,
        cfg.batch_size,
        cfg.buffer_tokens,
        cfg.forward_batch,
        cfg.seed + trainer.steps,
        start_window,
        epochs=cfg.epochs,
        cache=cfg.epochs > 1,
        outlier_ratio=cfg.outlier_ratio,
    )
    # one bar over all the work: the training steps and the forward passes that fill the buffer (a refill
    # can take minutes), so that its rate and ETA count both
    forwards = buffer.forward_passes((total_steps - trainer.steps) * cfg.batch_size)
    bar = progress_bar(
        total=total_steps + forwards,
        initial=trainer.steps,
        enabled=progress,
        desc=f"SAE {cfg.hook_name} (steps + forward passes)",
        unit="batch",
        smoothing=0,
    )
    buffer.on_forward = lambda: bar.update(1)
    batches = iter(buffer)
    pending: list[torch.Tensor] = []
    if trainer.steps == 0:
        first = next(batches, None)
        if first is None:
            bar.close()
            raise ValueError(f"the texts give fewer than batch_size={cfg.batch_size} activations")
        trainer.init_b_dec(first)
        pending.append(first)
    forward_before = 0.0  # the buffer's forward seconds already counted in log.forward_seconds
    while trainer.steps < total_steps:
        x = pending.pop() if pending else next(batches, None)
        if x is None:
            break
        t = time.perf_counter()
        fvu, z, dead = trainer.step(x)
        log.step_seconds += time.perf_counter() - t
        step = log.steps = trainer.steps
        log.tokens += len(x)
        if step % log.every == 0 or step == total_steps:
            l0, dead_frac = float((z > 0).sum(-1).float().mean()), float(dead.float().mean())
            log.fvu.append(float(fvu))
            log.l0.append(l0)
            log.dead.append(dead_frac)
            bar.set_postfix(fvu=f"{float(fvu):.3f}", l0=f"{l0:.1f}", dead=f"{dead_frac:.3f}")
        bar.update(1)
        if ckpt is not None and (step % cfg.checkpoint_every == 0 or step == total_steps):
            log.forward_seconds += buffer.forward_seconds - forward_before
            forward_before = buffer.forward_seconds
            log.outliers = buffer.outliers
            _save_state(ckpt, trainer, buffer.windows_read, log)
    bar.total = bar.n  # the forward passes were an estimate: the work is done
    bar.close()
    log.forward_seconds += buffer.forward_seconds - forward_before
    log.outliers, log.bos = buffer.outliers, buffer.bos
    if record is not None:
        sae.cfg.training = {
            **record,
            "windows_read": min(buffer.windows_read, len(windows)),
            "outlier_ratio": cfg.outlier_ratio,
            "left_out": "BOS"
            if cfg.outlier_ratio is None
            else f"BOS and positions above {cfg.outlier_ratio:g} × their window's median norm",
        }
    return sae.eval(), log


def _save_state(path: Path, trainer: SAETrainer, windows_read: int, log: TrainingLog) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "sae": trainer.sae.state_dict(),
        "optimizer": trainer.opt.state_dict(),
        "since_fired": trainer.since_fired,
        "windows_read": windows_read,
        "step": trainer.steps,
        "config": asdict(trainer.cfg),
        "weights": trainer.sae.cfg.base_fingerprint,
        "log": asdict(log),
    }
    save_tree(path, state, kind="SAE training checkpoint")


__all__ = [
    "ActivationBuffer",
    "SAETrainConfig",
    "SAETrainer",
    "TrainingLog",
    "fvu",
    "geometric_median",
    "heldout_windows",
    "hook_width",
    "kept_positions",
    "new_sae",
    "norm_outliers",
    "run_to_hook",
    "source_name",
    "split_windows",
    "text_source",
    "token_windows",
    "train_sae",
    "trained_overlap",
]
