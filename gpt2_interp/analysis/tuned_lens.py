"""The tuned lens (Belrose et al. 2023): one learned affine translator per layer boundary.

The logit lens decodes a residual ``h_ℓ`` as if it were the last one, ``ln_final(h_ℓ) W_U``.
Early layers use another basis, so it reads them badly. The tuned lens decodes
``ln_final(T_ℓ(h_ℓ)) W_U`` with ``T_ℓ(h) = h + h A_ℓ + b_ℓ`` (``A = 0, b = 0`` *is* the logit lens),
trained to minimise

    KL(p_final ‖ p_ℓ) = Σ_v p_final(v) (log p_final(v) − log p_ℓ(v))

averaged over the token positions of a corpus (BOS excluded). The model is frozen; each
translator is independent, so each layer's loss is backpropagated on its own (the full-vocabulary
lens logits of one layer at a time are in memory). The last boundary *is* the output
(``h = h_final``, KL = 0 under the identity): its translator is kept the identity and not trained.

Training starts from the least-squares translators (:func:`least_squares_translators`: the affine
map that best predicts the final residual from ``h_ℓ``, solved from the normal equations after one
forward pass over the corpus) rather than from the identity. The KL gradient costs a
vocabulary-sized product per token and layer, so on a CPU only a few tens of thousands of token
positions fit in minutes — about 0.01% of the reference recipe's 250 steps × 2¹⁸ tokens (SGD with
Nesterov momentum). The least-squares start uses every token of the corpus for the price of a
forward pass and already does most of the work; the KL steps (Adam, linear decay) then correct it where the squared
error in the residual stream and the KL of the decoded distribution disagree.

A :class:`TunedLens` is a value: tensors ``weight [n_boundaries, d_model, d_model]`` and
``bias [n_boundaries, d_model]`` with the base model's ``weights_fingerprint``; saved as one
integrity-checked safetensors file (``io.integrity``: a sha256 of the tensors + header, checked at
load) whose JSON header holds the metadata; a model whose weights differ is refused.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..core import distributed
from ..core.boundary import boundary
from ..core.checks import check_count, check_prompts
from ..core.finite import require_finite
from ..core.progress import progress_bar
from ..io.integrity import load_checked, save_checked
from ..model.fingerprint import weights_fingerprint
from ..model.hooks import hook_name
from .lens import decode_resid

if TYPE_CHECKING:
    from ..model import HookedGPT2

FORMAT = "gpt2-interp/tuned-lens/1"
Corpus = str | Path | Sequence[str]


def boundary_names(model: HookedGPT2) -> tuple[list[str], list[str]]:
    """``(hook names, labels)`` of the layer boundaries: ``embed`` (resid_pre 0), then ``L{i}`` (resid_post i)."""
    n = model.cfg.n_layer
    return (
        [hook_name("resid_pre", 0)] + [hook_name("resid_post", i) for i in range(n)],
        ["embed"] + [f"L{i}" for i in range(n)],
    )


@boundary
@dataclass
class TunedLens:
    """Affine translators ``T_ℓ(h) = h + h @ weight[ℓ] + bias[ℓ]`` for the ``labels`` boundaries
    (``embed``, ``L0``, …), made for the model whose weights have ``base_fingerprint``.

    ``weight`` ``[n_boundaries, d_model, d_model]``, ``bias`` ``[n_boundaries, d_model]``;
    ``model_name``: the model it was trained for (shown in errors); ``meta``: how it was trained
    (corpus, steps, the training losses per boundary, …)."""

    labels: list[str]
    weight: torch.Tensor  # [n_boundaries, d_model, d_model]
    bias: torch.Tensor  # [n_boundaries, d_model]
    base_fingerprint: str
    model_name: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def identity(cls, model: HookedGPT2) -> TunedLens:
        """Every translator the identity: decodes exactly as the logit lens does."""
        _, labels = boundary_names(model)
        d = model.cfg.d_model
        return cls(
            labels=labels,
            weight=torch.zeros(len(labels), d, d),
            bias=torch.zeros(len(labels), d),
            base_fingerprint=weights_fingerprint(model),
            model_name=model.cfg.name,
        )

    def index(self, layer: int | str) -> int:
        """Boundary index of a label (``"embed"``, ``"L3"``) or an index into :attr:`labels`."""
        if isinstance(layer, str):
            if layer not in self.labels:
                raise KeyError(f"the tuned lens has no boundary {layer!r}; it has {', '.join(self.labels)}")
            return self.labels.index(layer)
        if not -len(self.labels) <= layer < len(self.labels):
            raise IndexError(f"boundary index {layer} is out of range for {len(self.labels)} boundaries")
        return layer % len(self.labels)

    def translate(self, resid: torch.Tensor, layer: int | str) -> torch.Tensor:
        """``resid [..., d_model]`` at boundary ``layer`` mapped to the final layer's basis."""
        i = self.index(layer)
        w, b = self.weight[i].to(resid), self.bias[i].to(resid)
        return resid + resid @ w + b

    def decode(self, model: HookedGPT2, resid: torch.Tensor, layer: int | str) -> torch.Tensor:
        """Tuned-lens logits ``[..., d_vocab]`` of ``resid [..., d_model]`` at boundary ``layer`` of
        ``model``, which must be the model the lens was trained for (see :meth:`check`)."""
        self.check(model)
        return decode_resid(model, self.translate(resid, layer))

    def check(self, model: HookedGPT2) -> None:
        """Raise a ValueError unless ``model`` has the weights this lens was trained for. The weights
        are hashed once per state of the model (a change in place, ``load_state_dict`` or an edit
        makes the next check hash them again)."""
        state = _weights_state(model)
        if self.__dict__.get("_checked") == state:
            return
        d = model.cfg.d_model
        if tuple(self.weight.shape[1:]) != (d, d) or len(self.labels) != model.cfg.n_layer + 1:
            raise ValueError(
                f"this tuned lens is for a model with {len(self.labels) - 1} layers and d_model "
                f"{self.weight.shape[-1]} ({self.model_name!r}), not {model.cfg.name!r} ({model.cfg.n_layer} layers, "
                f"d_model {d}); train one for it: train_tuned_lens(model, …)"
            )
        fp = weights_fingerprint(model)
        if fp != self.base_fingerprint:
            raise ValueError(
                f"this tuned lens was trained on {self.model_name!r} with weights {self.base_fingerprint[:12]}…, "
                f"but the model's weights are {fp[:12]}… ({model.cfg.name!r}); a lens only reads the model it was "
                "trained for: train one for this model with train_tuned_lens(model, …)"
            )
        self.__dict__["_checked"] = state

    # ------------------------------------------------------------------ save / load
    def save(self, path: str | Path) -> Path:
        """One integrity-checked safetensors file (``io.integrity.save_checked``): ``weight``, ``bias`` and
        a JSON header (metadata, base fingerprint), with a sha256 over the tensors and the header."""
        path = Path(path)
        tensors = {"weight": self.weight.detach().float(), "bias": self.bias.detach().float()}
        header = {
            "labels": self.labels,
            "base_fingerprint": self.base_fingerprint,
            "model_name": self.model_name,
            "meta": self.meta,
            "saved": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        return save_checked(path, tensors, {"format": FORMAT, "lens": json.dumps(header, sort_keys=True)})

    @staticmethod
    def load(path: str | Path, model: HookedGPT2 | None = None) -> TunedLens:
        """Read a lens written by :meth:`save`, verifying its digest (a damaged or modified file raises
        ``IntegrityError``); with ``model``, also check it was trained for that model's weights."""
        tensors, meta, _ = load_checked(path, kind="tuned lens", allow_unverified=False)
        if meta.get("format") != FORMAT or set(tensors) != {"weight", "bias"}:
            raise ValueError(
                f"{path} is a safetensors file but not a gpt2-interp tuned lens (format "
                f"{meta.get('format')!r}); train one with train_tuned_lens(model, …).save(path)"
            )
        lens = _lens_from_file(path, tensors, meta)
        if model is not None:
            lens.check(model)
        return lens


def _weights_state(model: HookedGPT2) -> tuple:
    """What identifies the model's weights as they are now without hashing them: the model, and each
    parameter's storage and in-place version counter."""
    return (id(model), *((p.data_ptr(), p._version) for p in model.parameters()))


def _lens_from_file(path: str | Path, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> TunedLens:
    """A :class:`TunedLens` from a verified file's tensors and header, once they are consistent
    (labels, shapes, finite values), else a ValueError naming the file and the field."""
    try:
        h = json.loads(meta["lens"])
        labels, fp = h["labels"], h["base_fingerprint"]
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: the tuned-lens header is not valid ({type(e).__name__}: {e})") from None
    w, b = tensors["weight"], tensors["bias"]
    if not (isinstance(labels, list) and all(isinstance(x, str) for x in labels)) or not isinstance(fp, str):
        raise ValueError(
            f"{path}: the tuned-lens header's labels must be a list of strings and base_fingerprint a string"
        )
    n = len(labels)
    if w.ndim != 3 or w.shape[0] != n or w.shape[1] != w.shape[2] or tuple(b.shape) != (n, w.shape[-1]):
        raise ValueError(
            f"{path}: weight {tuple(w.shape)} and bias {tuple(b.shape)} do not fit {n} boundaries "
            f"(expected weight [{n}, d_model, d_model] and bias [{n}, d_model])"
        )
    for name, t in (("weight", w), ("bias", b)):
        require_finite(t, f"the tuned lens's {name} in {path}")
    return TunedLens(
        labels=labels,
        weight=w,
        bias=b,
        base_fingerprint=fp,
        model_name=str(h.get("model_name", "")),
        meta=h.get("meta", {}),
    )


# ---------------------------------------------------------------------------- corpus
def corpus_texts(
    model: HookedGPT2,
    corpus: Corpus = "generated",
    n_texts: int = 256,
    seed: int = 0,
    length: int | None = None,
    group: Any = None,
) -> list[str]:
    """Texts to train or evaluate a lens on: a list of texts as given (e.g. the fact base's sentences); a path
    to a text file or a folder of ``*.txt`` (documents split at blank lines); or ``"generated"``: ``n_texts`` samples of
    the model itself from BOS (temperature 1, ``length`` new tokens, default :func:`default_seq_len` − 1;
    ``seed``: a different seed gives held-out text). Distributed (a process group, or ``group``), the
    ranks generate their share of the samples and every rank gets them all, in the single-process order."""
    n_texts = check_count(n_texts, "n_texts")
    if not isinstance(corpus, (str, Path)):
        texts = [t for t in check_prompts(corpus, "corpus") if t.strip()]
        if not texts:
            raise ValueError("the corpus holds no text: give non-empty texts, a text file, or corpus='generated'")
        return texts
    if str(corpus) == "generated":
        length = length or default_seq_len(model) - 1
        starts = list(range(0, n_texts, 64))

        def chunk(s: int) -> list[str]:
            n = min(64, n_texts - s)
            return model.generate([""] * n, max_new_tokens=length, temperature=1.0, seed=seed + s, stop_at_eos=False)

        chunks = distributed.gather_in_order([chunk(s) for s in distributed.shard(starts, group)], len(starts), group)
        return [t for c in chunks for t in c if t.strip()]
    path = Path(corpus).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"corpus {corpus} is neither 'generated' nor an existing text file or folder")
    files = sorted(p for p in path.rglob("*.txt") if p.is_file()) if path.is_dir() else [path]
    docs = [
        d.strip() for f in files for d in f.read_text(encoding="utf-8", errors="replace").split("\n\n") if d.strip()
    ]
    if not docs:
        raise ValueError(f"corpus {path} holds no text")
    return docs


def default_seq_len(model: HookedGPT2) -> int:
    """Row length for training and evaluating a lens: the context size, at most 128 tokens (the
    translators do not depend on the position; short rows keep CPU runs cheap)."""
    return min(model.cfg.n_ctx, 128)


def check_seq_len(model: HookedGPT2, seq_len: int | None) -> int:
    """``seq_len`` (default :func:`default_seq_len`) capped at the context size, else an error naming it:
    a row holds the BOS token (when the tokenizer has one) and at least one more."""
    if seq_len is None:
        return default_seq_len(model)
    least = 2 if model.tokenizer.bos_id is not None else 1
    return min(check_count(seq_len, "seq_len", minimum=least), model.cfg.n_ctx)


def token_rows(model: HookedGPT2, texts: Iterable[str], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Texts tokenized and packed: each text preceded by the tokenizer's BOS (if it has one), all
    concatenated and cut into rows of ``seq_len`` tokens, each row starting with BOS (short texts
    share rows, so no position is wasted on padding; the last row is right-padded, see the mask).
    Returns ``(tokens, mask)``, ``[n_rows, seq_len]`` each."""
    bos = [model.tokenizer.bos_id] if model.tokenizer.bos_id is not None else []
    seq_len = check_count(seq_len, "seq_len", minimum=len(bos) + 1)
    stream: list[int] = []
    for text in texts:
        stream += bos + model.tokenizer.encode_ids(text)
    stream = stream[len(bos) :]  # every row gets its own BOS below
    step = seq_len - len(bos)
    rows = [bos + stream[i : i + step] for i in range(0, len(stream), step)]
    if not rows:
        raise ValueError("the corpus yielded no tokens")
    tokens = torch.zeros(len(rows), seq_len, dtype=torch.long)
    mask = torch.zeros(len(rows), seq_len, dtype=torch.bool)
    for r, ids in enumerate(rows):
        tokens[r, : len(ids)] = torch.tensor(ids)
        mask[r, : len(ids)] = True
    return tokens, mask


def _kl(final_logp: torch.Tensor, lens_logits: torch.Tensor) -> torch.Tensor:
    """KL(final ‖ lens) per row of ``[N, d_vocab]`` log-probs / logits (nats)."""
    logq = lens_logits.float().log_softmax(-1)
    return (final_logp.exp() * (final_logp - logq)).sum(-1)


def _keep(model: HookedGPT2, mask: torch.Tensor) -> torch.Tensor:
    """The positions a lens is trained and measured on: real tokens, BOS excluded."""
    keep = mask.clone()
    if model.tokenizer.bos_id is not None:
        keep[:, 0] = False
    return keep


def _batch_states(
    model: HookedGPT2, tokens: torch.Tensor, mask: torch.Tensor, names: list[str]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(residuals [n_boundaries, N, d_model], final log-probs [N, d_vocab])`` at the real, non-BOS
    positions of a right-padded batch (causal attention: padding after a token never reaches it)."""
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens.to(model.device), names_filter=names)
        keep = _keep(model, mask).to(model.device)
        resid = torch.stack([cache[n][keep] for n in names]).float()
        final = logits[keep].float().log_softmax(-1)
    return resid, final


# ---------------------------------------------------------------------------- training
class _Translators(torch.nn.Module):
    """The trainable translators as one module (so that DistributedDataParallel can wrap them)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight)
        self.bias = torch.nn.Parameter(bias)

    def forward(self, h: torch.Tensor, i: int) -> torch.Tensor:
        return h + h @ self.weight[i] + self.bias[i]


@torch.no_grad()
def least_squares_translators(
    model: HookedGPT2,
    tokens: torch.Tensor,
    mask: torch.Tensor,
    ridge: float = 1e-4,
    batch_rows: int = 16,
    progress: bool | None = None,
    group: Any = None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """The affine translators that best predict the final residual in least squares:
    ``argmin_{A,b} Σ ‖h_ℓ + h_ℓ A + b − h_final‖²`` over the real non-BOS positions of ``tokens``
    (``[n_rows, seq_len]`` with ``mask``), per boundary, with a small ridge ``ridge × mean(diag hᵀh)``
    on ``A`` (towards the identity translator). One forward pass per row, no vocabulary-sized work:
    the cheap start :func:`train_tuned_lens` refines with the KL objective. Returns ``(weight
    [n_boundaries, d, d], bias [n_boundaries, d], n_tokens)``; the last boundary's map is the identity.
    Distributed, each rank reads its share of the rows and the normal equations are all-reduced."""
    names, _ = boundary_names(model)
    n_b, d = len(names), model.cfg.d_model
    xtx = torch.zeros(n_b - 1, d + 1, d + 1, dtype=torch.float64, device=model.device)
    xty = torch.zeros(n_b - 1, d + 1, d, dtype=torch.float64, device=model.device)
    rows = list(distributed.shard_indices(len(tokens), group))
    n_tok = 0
    chunks = range(0, len(rows), batch_rows)
    for s in progress_bar(chunks, desc="tuned lens: least squares", enabled=progress and distributed.is_main(group)):
        idx = rows[s : s + batch_rows]
        _, cache = model.run_with_cache(tokens[idx].to(model.device), names_filter=names)
        keep = _keep(model, mask[idx]).to(model.device)
        y = cache[names[-1]][keep].double()
        ones = torch.ones(len(y), 1, dtype=torch.float64, device=model.device)
        n_tok += len(y)
        for i in range(n_b - 1):
            h = cache[names[i]][keep].double()
            x = torch.cat([h, ones], 1)
            xtx[i] += x.T @ x
            xty[i] += x.T @ (y - h)
    xtx, xty = distributed.all_reduce_sum(xtx, group), distributed.all_reduce_sum(xty, group)
    n_tok = int(distributed.all_reduce_number(n_tok, group))
    if n_tok == 0:
        raise ValueError("the corpus has no token positions after BOS; give longer texts")
    weight = torch.zeros(n_b, d, d)
    bias = torch.zeros(n_b, d)
    for i in range(n_b - 1):
        reg = torch.zeros(d + 1, dtype=torch.float64, device=model.device)
        reg[:d] = ridge * xtx[i].diagonal()[:d].mean().clamp(min=1e-12)
        beta = torch.linalg.solve(xtx[i] + torch.diag(reg), xty[i])
        weight[i], bias[i] = beta[:d].float().cpu(), beta[d].float().cpu()
    return weight, bias, n_tok


@boundary
def train_tuned_lens(
    model: HookedGPT2,
    corpus: Corpus = "generated",
    steps: int = 40,
    batch_tokens: int = 512,
    lr: float = 3e-3,
    init: str = "least-squares",
    n_texts: int = 256,
    seq_len: int | None = None,
    seed: int = 0,
    progress: bool | None = None,
    group: Any = None,
) -> TunedLens:
    """Train a tuned lens for ``model`` (frozen) on ``corpus`` (see :func:`corpus_texts`).

    ``init="least-squares"`` (default) starts every translator at :func:`least_squares_translators`
    on the whole corpus (one forward pass, cheap); ``"identity"`` starts at the logit lens. Then
    ``steps`` Adam steps (learning rate ``lr``, linear decay to 0) on KL(final ‖ lens), summed over
    the boundaries, each step on ``batch_tokens`` token positions (whole rows of ``seq_len`` tokens,
    default :func:`default_seq_len`, drawn at random with ``seed``). ``steps=0`` keeps the start.
    Returns the :class:`TunedLens` with the training losses per boundary in ``meta``. Defaults:
    ``steps`` 40, ``batch_tokens`` 512, ``lr`` 3e-3; ``n_texts`` (default 256) texts are generated
    for ``corpus="generated"``; ``progress``: progress bars (None: automatic).

    Refused (ValueError): negative ``steps``, ``batch_tokens`` < 1, ``lr`` not a finite number > 0,
    another ``init``, ``seq_len`` below 2 (1 without BOS), fewer rows per step than ranks, and a
    corpus holding no text.

    Distributed (an initialised process group, or ``group``; e.g. under ``torchrun``): every rank
    draws the same global batch and takes its share of the rows; the translators are wrapped in
    ``DistributedDataParallel``, which all-reduces the gradients once per step, so every rank ends
    with the single-process translators (up to float summation order). The least-squares start and a
    generated corpus are sharded too.
    """
    steps = check_count(steps, "steps", minimum=0)
    batch_tokens = check_count(batch_tokens, "batch_tokens")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    if init not in ("least-squares", "identity"):
        raise ValueError(f"init must be 'least-squares' or 'identity', not {init!r}")
    seq_len = check_seq_len(model, seq_len)
    W = distributed.world_size(group)
    rows_per_step = max(1, batch_tokens // seq_len)
    if steps and rows_per_step < W:
        raise ValueError(
            f"batch_tokens={batch_tokens} gives {rows_per_step} rows of {seq_len} tokens per step, fewer than "
            f"the {W} ranks; raise batch_tokens to at least {W * seq_len}"
        )
    t0 = time.perf_counter()
    texts = corpus_texts(model, corpus, n_texts, seed, length=seq_len - 1, group=group)
    tokens, mask = token_rows(model, texts, seq_len)
    names, _ = boundary_names(model)
    n_b, d = len(names), model.cfg.d_model
    lens = TunedLens.identity(model)
    if init == "least-squares":
        weight, bias, n_lsq = least_squares_translators(model, tokens, mask, progress=progress, group=group)
    else:
        weight, bias, n_lsq = torch.zeros(n_b, d, d), torch.zeros(n_b, d), 0
    # the last boundary is the output: its translator stays the identity and is not trained
    net = _Translators(weight[:-1].clone().to(model.device), bias[:-1].clone().to(model.device))
    ddp = None
    if distributed.is_distributed(group):
        ddp = torch.nn.parallel.DistributedDataParallel(
            net, device_ids=[model.device] if model.device.type == "cuda" else None, process_group=group
        )
    step_fn = ddp if ddp is not None else net
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1.0 - s / max(steps, 1)))
    gen = torch.Generator().manual_seed(seed)
    history: list[list[float]] = []
    frozen = [p.requires_grad for p in model.parameters()]
    r = distributed.rank(group)
    try:
        for p in model.parameters():
            p.requires_grad_(False)
        bar = progress_bar(range(steps), desc="tuned lens", enabled=progress and distributed.is_main(group))
        for _ in bar:
            idx = torch.randint(
                len(tokens), (rows_per_step,), generator=gen
            )  # the global batch, the same on every rank
            n_global = int(_keep(model, mask[idx]).sum())
            mine = idx[r::W]
            resid, final = _batch_states(model, tokens[mine], mask[mine], names)
            opt.zero_grad(set_to_none=True)
            # DDP averages gradients over the ranks: scale the local KL sum so that the average is the
            # gradient of the global batch's mean KL
            scale = W / max(n_global, 1)
            losses = torch.zeros(n_b - 1, dtype=torch.float64)
            for i in range(n_b - 1):  # independent translators: one layer's vocabulary-sized logits at a time
                sync = ddp is None or i == n_b - 2  # one all-reduce per step, after the last backward
                with contextlib.nullcontext() if sync or ddp is None else ddp.no_sync():
                    kl = _kl(final, decode_resid(model, step_fn(resid[i], i))).sum()
                    (kl * scale).backward()
                losses[i] = float(kl.detach()) / max(n_global, 1)
            opt.step()
            sched.step()
            losses = distributed.all_reduce_sum(losses, group)
            history.append(losses.tolist())
            bar.set_postfix(kl=f"{float(losses.mean()):.3f}")
    finally:
        for p, g in zip(model.parameters(), frozen):
            p.requires_grad_(g)
    lens.weight = torch.cat([net.weight.detach().cpu(), torch.zeros(1, d, d)])
    lens.bias = torch.cat([net.bias.detach().cpu(), torch.zeros(1, d)])
    last = history[-10:]
    lens.meta = {
        "steps": steps,
        "lr": lr,
        "init": init,
        "least_squares_tokens": n_lsq,
        "optimizer": "adam, linear decay",
        "batch_tokens": rows_per_step * seq_len,
        "seq_len": seq_len,
        "seed": seed,
        "world_size": W,
        "corpus": corpus if isinstance(corpus, str) else f"{len(texts)} texts",
        "n_rows": len(tokens),
        "seconds": round(time.perf_counter() - t0, 1),
        "final_kl_nats": ([round(sum(h[i] for h in last) / len(last), 5) for i in range(n_b - 1)] if last else [])
        + [0.0],
    }
    return lens


# ---------------------------------------------------------------------------- evaluation
@boundary
@torch.no_grad()
def lens_divergence(
    model: HookedGPT2,
    texts: Corpus,
    lens: TunedLens | None = None,
    seq_len: int | None = None,
    batch_rows: int = 16,
    n_texts: int = 64,
    seed: int = 1,
    group: Any = None,
) -> dict[str, Any]:
    """Per boundary, over every real non-BOS position of ``texts``: mean KL(final ‖ lens) in bits,
    and top-1 agreement with the model's own prediction, for ``lens`` (the logit lens when None).
    Distributed (a process group, or ``group``), the ranks measure their share of the rows and every
    rank returns the totals.

    ``texts``: a corpus as :func:`corpus_texts` takes it (``n_texts`` generated with ``seed``, default
    1, for ``"generated"``), packed into rows of ``seq_len`` tokens (default :func:`default_seq_len`)
    and run ``batch_rows`` (default 16) rows at a time. Returns ``{"labels", "kl_bits",
    "top1_agreement", "n_tokens"}`` (per-boundary lists). A lens trained for other weights raises
    ValueError."""
    if lens is not None:
        lens.check(model)
    batch_rows = check_count(batch_rows, "batch_rows")
    seq_len = check_seq_len(model, seq_len)
    tokens, mask = token_rows(
        model, corpus_texts(model, texts, n_texts, seed, length=seq_len - 1, group=group), seq_len
    )
    names, labels = boundary_names(model)
    kl = torch.zeros(len(names), dtype=torch.float64)
    agree = torch.zeros(len(names), dtype=torch.float64)
    count = 0
    mine = list(distributed.shard_indices(len(tokens), group))
    for s in range(0, len(mine), batch_rows):
        idx = mine[s : s + batch_rows]
        resid, final = _batch_states(model, tokens[idx], mask[idx], names)
        top = final.argmax(-1)
        for i in range(len(names)):
            logits = decode_resid(model, resid[i] if lens is None else lens.translate(resid[i], i))
            kl[i] += _kl(final, logits).sum().double().cpu()
            agree[i] += (logits.argmax(-1) == top).sum().double().cpu()
        count += final.shape[0]
    kl, agree = distributed.all_reduce_sum(kl, group), distributed.all_reduce_sum(agree, group)
    count = int(distributed.all_reduce_number(count, group))
    return {
        "labels": labels,
        "kl_bits": (kl / count / math.log(2)).tolist(),
        "top1_agreement": (agree / count).tolist(),
        "n_tokens": count,
    }


__all__ = [
    "TunedLens",
    "boundary_names",
    "corpus_texts",
    "default_seq_len",
    "least_squares_translators",
    "lens_divergence",
    "token_rows",
    "train_tuned_lens",
]
