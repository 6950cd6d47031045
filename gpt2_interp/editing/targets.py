"""The target of an edit, shared by ROME and MEMIT: the keys and context prefixes of a request, and the
optimisation of δ (Meng et al. 2022, §3.1; 2023, eq. 16), the change of an MLP's output at the subject's last
token that makes the model say the target.

``v* = v₀ + δ`` with ``δ`` optimised (Adam) for the NLL of every target token over all prompt variants, plus
``kl_factor`` × KL between the edited and unedited next-token distributions on ``"{subject} is a"``, plus
``weight_decay`` × ‖δ‖/‖v₀‖², kept in the ball ‖δ‖ ≤ ``clamp_factor`` × ‖v₀‖; the settings are
:class:`.settings.RomeHparams`. Many requests are optimised together (:func:`optimise_deltas`), each with its
own δ and its own stopping, prompt variants packed into shared rows.
"""

from __future__ import annotations

import unicodedata
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..analysis.tokens import subject_span, target_ids, token_span
from ..core.checks import check_choice
from ..core.progress import progress_bar
from ..model.modules import KVCache
from .edit import (
    Request,
    TargetSpacingWarning,
)

if TYPE_CHECKING:
    from ..model import HookedGPT2

from .settings import MEMIT_PREFIX_SEEDS, PREFIX_STYLES, RomeHparams

RequestLike = Request | Mapping[str, Any]
#: Where the δ optimisation adds δ (:func:`optimise_deltas`' ``delta_site``): the edited MLP's output
#: (before a post-MLP norm; ROME) or the residual stream after the block (MEMIT).
DELTA_SITES = ("mlp_out", "resid_post")


# ---------------------------------------------------------------- prompts and positions
def context_prefixes(
    model: HookedGPT2, lengths: Sequence[int] = (5, 10), per_length: int = 5, seed: int = 0, style: str = "sampled"
) -> list[str]:
    """Short texts sampled from the model (top-5 sampling), used as ``"{prefix}. {prompt}"`` so that k*
    and v* hold across contexts: :func:`context_prefix_groups` flattened. Cached on the model
    (computed once, like ROME's)."""
    return [p for group in context_prefix_groups(model, lengths, per_length, seed, style) for p in group]


def context_prefix_groups(
    model: HookedGPT2, lengths: Sequence[int] = (5, 10), per_length: int = 5, seed: int = 0, style: str = "sampled"
) -> list[list[str]]:
    """The context prefixes per length (MEMIT's context types), ``per_length`` texts for each of ``lengths``.

    ``style`` (:attr:`RomeHparams.prefix_style`): ``"sampled"`` — ``n`` new tokens after BOS, braces and
    trailing dots removed, empty texts dropped; ``"rome"`` — ROME's ``get_context_templates``: ``n − 1``
    new tokens after ``<|endoftext|>`` (ROME's ``max_out_len`` counts it), NFKD, ``"\\n\\n"`` → space;
    ``"memit"`` — MEMIT's: ``per_length / 5`` texts from each seed word of :data:`MEMIT_PREFIX_SEEDS`
    (no BOS), ``n`` tokens counting the seed, braces replaced by spaces. Sampling is top-5 at temperature
    1 with ``seed`` (the authors' texts are unseeded). Cached on the model."""
    style = check_choice(style, "prefix style", PREFIX_STYLES)
    cache = model.__dict__.setdefault("_rome_prefixes", {})
    key = (tuple(lengths), per_length, seed) + (() if style == "sampled" else (style,))
    if key not in cache:
        groups: list[list[str]] = []
        for i, n in enumerate(lengths):
            if per_length == 0:  # no prefixes of this length: the bare prompt alone
                groups.append([])
            elif style == "sampled":
                texts = model.generate([""] * per_length, max_new_tokens=n, temperature=1.0, top_k=5, seed=seed + i)
                cleaned = (" ".join(t.replace("{", " ").replace("}", " ").split()).rstrip(". ") for t in texts)
                groups.append([t for t in cleaned if t])
            elif style == "rome":
                texts = model.generate(
                    [""] * per_length, max_new_tokens=n - 1, temperature=1.0, top_k=5, seed=seed + i, stop_at_eos=False
                )
                groups.append([_authors_text(t) for t in texts])
            else:
                group = []
                for j, word in enumerate(MEMIT_PREFIX_SEEDS):
                    new = n - len(model.tokenizer.encode_ids(word))
                    texts = model.generate(
                        [word] * (per_length // len(MEMIT_PREFIX_SEEDS)),
                        max_new_tokens=max(new, 0),
                        temperature=1.0,
                        top_k=5,
                        seed=seed + i * len(MEMIT_PREFIX_SEEDS) + j,
                        prepend_bos=False,
                        stop_at_eos=False,
                    )
                    group += [_authors_text(t).replace("{", " ").replace("}", " ") for t in texts]
                groups.append(group)
        cache[key] = groups
    return [list(g) for g in cache[key]]


def _authors_text(text: str) -> str:
    """A generated text cleaned as ROME/MEMIT's ``generate_fast`` cleans it."""
    return unicodedata.normalize("NFKD", text).replace("\n\n", " ").replace("<|endoftext|>", "")


def variant_weights(hp: RomeHparams, groups: Sequence[Sequence[str]]) -> list[float] | None:
    """The weight of each prompt variant (the bare prompt, then every prefix of ``groups`` in order) in a
    request's key k*: None for ``key_weighting="uniform"`` (a plain mean), else MEMIT's per-context-type
    weights: ``1/G`` for the bare prompt and ``1/(G·|g|)`` for each prefix of group ``g``, with ``G`` the
    bare prompt plus the non-empty groups (MEMIT's one group of 5: 1/2 and 1/10 each)."""
    if hp.key_weighting == "uniform":
        return None
    full = [g for g in groups if g]
    G = 1 + len(full)
    return [1.0 / G] + [1.0 / (G * len(g)) for g in full for _ in g]


def _filled(prompt: str, subject: str, prefix: str = "") -> tuple[str, int, int]:
    """``(text, lo, hi)``: ``[prefix. ]prompt`` with the subject filled in, and its char range."""
    head = f"{prefix}. " if prefix else ""
    before, after = prompt.split("{}")
    lo = len(head) + len(before)
    return head + before + subject + after, lo, lo + len(subject)


def validate_request(model: HookedGPT2, request: RequestLike, index: int | None = None) -> tuple[Request, list[int]]:
    """The request as a :class:`Request` and its target ids; bad input raises saying what to fix (and
    ``index``, the request's position in a list). A target whose first token is unlikely to follow the
    prompt as written gets a :class:`~.edit.TargetSpacingWarning` (:data:`~.edit.TARGET_SPACING_RULE`)."""
    req = Request.of(request, index)
    where = "request" if index is None else f"request {index}"
    try:
        subject_span(model, req.text, req.subject)  # raises if the subject cannot be located
    except (TypeError, ValueError) as e:
        raise type(e)(f"{where}: {e}") from None
    ids = target_ids(model, req.target)
    _warn_unspaced_target(model, req, ids, where)
    return req, ids


def _warn_unspaced_target(model: HookedGPT2, req: Request, ids: list[int], where: str) -> None:
    """Warn by :data:`~.edit.TARGET_SPACING_RULE`: the edit would teach a word glued to the prompt's last
    word while the model expects a new word (one forward pass, only when the spellings differ)."""
    if req.text[-1:].isspace() or req.target[:1].isspace():
        return
    spaced = model.tokenizer.encode_ids(" " + req.target)
    if not spaced or spaced[0] == ids[0]:
        return
    with torch.no_grad():
        probs = model.last_logits([req.text]).float().softmax(-1)[0]
    p_plain, p_spaced = float(probs[ids[0]]), float(probs[spaced[0]])
    if p_spaced <= p_plain:
        return
    tok = model.tokenizer.token_str
    warnings.warn(
        f"{where}: the target {req.target!r} has no leading space and the prompt {req.text!r} ends "
        f"without one, so its first token {tok(ids[0])!r} (id {ids[0]}, P = {p_plain:.2g} after the prompt) "
        f"must continue the prompt's last word; the model expects a new word, {tok(spaced[0])!r} "
        f"(id {spaced[0]}, P = {p_spaced:.2g}). Give target {' ' + req.target!r} unless the word really "
        "continues the prompt",
        TargetSpacingWarning,
        stacklevel=3,
    )


@contextmanager
def _frozen(model: HookedGPT2) -> Iterator[None]:
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, f in flags:
            p.requires_grad_(f)


@dataclass
class _Batch:
    """All prompt variants, aligned at the subject's last token so that it sits in ONE column ``c``
    for every row: ``[left pad | prefix (< subject's last token) | suffix (from it on) | right pad]``."""

    tokens: torch.Tensor  # [b, c + s]
    mask: torch.Tensor  # [b, c + s], 1 = real token
    c: int  # column of the subject's last token
    n_rewrite: int  # rows 0..n_rewrite-1: rewrite prompts (+ target[:-1]); then the KL prompt
    target_pos: torch.Tensor  # [n_rewrite, T] columns predicting the target tokens
    kl_pos: torch.Tensor  # [P] columns of the KL row (subject's last token on)
    keep_cols: torch.Tensor  # [K] column of each keep row's last token (rows n_rewrite+1 …)


def _build_batch(
    model: HookedGPT2,
    req: Request,
    ids: list[int],
    prefixes: list[str],
    kl_prompt: str,
    kl_last_only: bool = False,
    bos: bool = True,
) -> _Batch:
    rows, splits = [], []
    for prefix in ["", *prefixes]:
        text, lo, hi = _filled(req.prompt, req.subject, prefix)
        rows.append(model.to_tokens(text, prepend_bos=bos)[0].tolist() + ids[:-1])
        splits.append(token_span(model, text, lo, hi, prepend_bos=bos)[1] - 1)
    if kl_prompt.count("{}") != 1:
        raise ValueError(f"kl_prompt must hold '{{}}' once, got {kl_prompt!r}")
    for prompt in (kl_prompt, *req.keep):  # the essence KL row, then the keep rows
        text, lo, hi = _filled(prompt, req.subject)
        rows.append(model.to_tokens(text, prepend_bos=bos)[0].tolist())
        splits.append(token_span(model, text, lo, hi, prepend_bos=bos)[1] - 1)
    c = max(splits)
    s = max(len(r) - i for r, i in zip(rows, splits))
    model.check_length(c + s)
    tokens = torch.full((len(rows), c + s), model.tokenizer.pad_id, dtype=torch.long)
    mask = torch.zeros_like(tokens)
    for j, (r, i) in enumerate(zip(rows, splits)):
        tokens[j, c - i : c - i + len(r)] = torch.tensor(r)
        mask[j, c - i : c - i + len(r)] = 1
    T, n_rw = len(ids), len(rows) - 1 - len(req.keep)
    ends = [len(r) - i for r, i in zip(rows, splits)]  # suffix lengths
    target_pos = torch.tensor([[c + e - T + t for t in range(T)] for e in ends[:n_rw]])
    dev = model.device
    return _Batch(
        tokens.to(dev),
        mask.to(dev),
        c,
        n_rw,
        target_pos.to(dev),
        torch.arange(c, c + (1 if kl_last_only else ends[n_rw]), device=dev),
        torch.tensor([c + e - 1 for e in ends[n_rw + 1 :]], dtype=torch.long, device=dev),
    )


@torch.no_grad()
def subject_states(
    model: HookedGPT2,
    requests: Sequence[Request],
    layers: Sequence[int],
    prefixes: Sequence[str],
    resid_layer: int | None = None,
    batch_size: int = 256,
    key_weights: Sequence[float] | None = None,
    resid_weights: Sequence[float] | None = None,
    prepend_bos: bool = True,
) -> tuple[dict[int, torch.Tensor], torch.Tensor | None]:
    """At the subject's last token, averaged over each request's prompt variants (the bare rewrite
    prompt and ``"{prefix}. {prompt}"`` for each prefix — ROME's k*): the MLP keys
    ``{layer: [n, d_mlp]}`` of ``layers`` and, with ``resid_layer``, the residual stream after that
    block ``[n, d_model]`` (``blocks.{resid_layer}.hook_resid_post``). ``key_weights`` /
    ``resid_weights`` ``[1 + len(prefixes)]``: a weighted sum over the variants instead of the mean
    (:func:`variant_weights`; ``[1, 0, …]`` is the bare prompt's state). ``prepend_bos``: the prompts start
    with BOS (False: as the authors' code tokenises)."""
    rows, pos = [], []
    for req in requests:
        for prefix in ["", *list(prefixes)]:
            text, lo, hi = _filled(req.prompt, req.subject, prefix)
            rows.append(model.to_tokens(text, prepend_bos=prepend_bos)[0].tolist())
            pos.append(token_span(model, text, lo, hi, prepend_bos=prepend_bos)[1] - 1)
    names = [f"blocks.{l}.mlp.hook_post" for l in layers]
    if resid_layer is not None:
        names.append(f"blocks.{resid_layer}.hook_resid_post")
    top = max(list(layers) + ([resid_layer] if resid_layer is not None else []))
    sums: dict[str, torch.Tensor] = {}
    for s in range(0, len(rows), batch_size):
        chunk, p = rows[s : s + batch_size], torch.tensor(pos[s : s + batch_size], device=model.device)
        width = max(map(len, chunk))
        model.check_length(width)
        tokens = torch.full((len(chunk), width), model.tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros_like(tokens)
        for j, r in enumerate(chunk):  # right padding: positions and causal keys are unchanged
            tokens[j, : len(r)] = torch.tensor(r)
            mask[j, : len(r)] = 1
        _, cache = model.run_with_cache(
            tokens.to(model.device),
            names_filter=names,
            stop_at_layer=top + 1,
            attention_mask=mask.to(model.device),
            return_type=None,
        )
        for name in names:
            got = cache[name][torch.arange(len(chunk), device=model.device), p].float()
            sums[name] = got if name not in sums else torch.cat([sums[name], got])
    v = 1 + len(prefixes)
    mean = {}
    for name, x in sums.items():
        w = resid_weights if name.endswith("hook_resid_post") else key_weights
        x = x.view(len(requests), v, -1)
        mean[name] = x.mean(1) if w is None else torch.einsum("nvd,v->nd", x, _weights(w, v, x))
    keys = {l: mean[f"blocks.{l}.mlp.hook_post"] for l in layers}
    return keys, (mean[f"blocks.{resid_layer}.hook_resid_post"] if resid_layer is not None else None)


def _weights(w: Sequence[float], v: int, like: torch.Tensor) -> torch.Tensor:
    """``w`` as a ``[v]`` tensor on ``like``'s device; another length raises ValueError."""
    if len(w) != v:
        raise ValueError(f"variant weights must give one weight per prompt variant ({v}), got {len(w)}")
    return torch.tensor(list(w), dtype=like.dtype, device=like.device)


@dataclass(frozen=True)
class TargetOutcome:
    """What the model says after a prompt about one target: ``logprob`` = log P(target ids | BOS + prompt),
    ``took`` = whether the target is its greedy continuation (:data:`~.edit.EDIT_TOOK_RULE`), ``top1`` =
    its top-1 next token after the prompt (text)."""

    logprob: float
    took: bool
    top1: str


@torch.no_grad()
def target_outcomes(
    model: HookedGPT2, texts: Sequence[str], ids: Sequence[list[int]], batch_size: int = 64
) -> list[TargetOutcome]:
    """:class:`TargetOutcome` for each ``(text, target ids)`` under the model as it is (hooks included),
    batched (right padding: positions and causal attention of the real tokens are unchanged)."""
    out: list[TargetOutcome] = []
    rows = [model.to_tokens(t)[0].tolist() + i[:-1] for t, i in zip(texts, ids)]
    for s in range(0, len(rows), batch_size):
        chunk, tgt = rows[s : s + batch_size], ids[s : s + batch_size]
        tokens, mask = model.pad(chunk, padding_side="right")
        model.check_length(tokens.shape[1])
        resid = model(tokens, attention_mask=mask, stop_at_layer=model.cfg.n_layer)
        for j, (r, i) in enumerate(zip(chunk, tgt)):
            pos = torch.arange(len(r) - len(i), len(r), device=resid.device)
            lp = model.unembed(model.ln_final(resid[j, pos])).float().log_softmax(-1)  # [len(i), d_vocab]
            want = torch.tensor(i, device=lp.device)
            top = lp.argmax(-1)
            out.append(
                TargetOutcome(
                    float(lp[torch.arange(len(i)), want].sum()),
                    bool((top == want).all()),
                    model.tokenizer.token_str(int(top[0])),
                )
            )
    return out


def target_logprobs(
    model: HookedGPT2, texts: Sequence[str], ids: Sequence[list[int]], batch_size: int = 64
) -> list[float]:
    """log P(target ids | BOS + text) for each ``(text, target ids)`` under the model as it is, batched
    (:func:`target_outcomes`)."""
    return [o.logprob for o in target_outcomes(model, texts, ids, batch_size)]


def optimise_delta(
    model: HookedGPT2,
    req: Request,
    ids: list[int],
    layer: int,
    prefixes: list[str],
    hp: RomeHparams,
    solve: Callable[[torch.Tensor], torch.Tensor] | None = None,
    progress: bool | None = None,
    key_weights: Sequence[float] | None = None,
) -> dict[str, Any]:
    """Find δ for one request (see module doc). Returns ``k_star [d_mlp]``, ``k_bare [d_mlp]`` (the bare
    prompt's key), ``delta [d_model]``, ``v0 [d_model]`` and a log of the losses. See
    :func:`optimise_deltas` (``progress`` and ``key_weights`` too)."""
    return optimise_deltas(model, [(req, ids)], layer, prefixes, hp, solve, progress=progress, key_weights=key_weights)[
        0
    ]


def optimise_deltas(
    model: HookedGPT2,
    items: Sequence[tuple[Request, list[int]]],
    layer: int,
    prefixes: list[str],
    hp: RomeHparams,
    solve: Callable[[torch.Tensor], torch.Tensor] | None = None,
    chunk: int | None = None,
    progress: bool | None = None,
    norm_reference: str = "mlp_out",
    desc: str | None = None,
    key_weights: Sequence[float] | None = None,
    packed: bool = False,
    delta_site: str = "mlp_out",
) -> list[dict[str, Any]]:
    """One δ per ``(request, target ids)``, optimised together: every request's prompt variants sit
    in one batch (its δ reaches only its own rows), the loss is the sum of the requests' losses, so
    each δ follows exactly the trajectory it would follow alone (Adam is elementwise); a request that
    meets the early-stop rule is frozen and its rows leave the batch. ``chunk`` requests at a time
    (default: all on an accelerator, 32 on CPU). Used by ROME (one request) and MEMIT (δ at the top
    edit layer: adding δ to that layer's MLP output is adding it to the residual stream after it).

    One no-grad forward over every variant gives the keys, v₀ and the residual entering the edit
    layer; each step adds δ to the residual stream after the edit layer (whose attention and MLP do not change)
    and reruns the layers above it (see ``exact_edit``). With ``exact_edit`` off (δ at the subject's last
    token only, the authors' ROME and MEMIT) the columns before that token never see δ: one more no-grad
    pass keeps their keys and values in every block above the edit layer, and each step runs only the
    columns from the subject's last token on (the rest of the prompt and the target) against them, which
    skips the context prefixes' tokens (about 3× fewer tokens per step in the paper preset on
    SmolLM2-135M, ``benchmarks/RESULTS_delta.md``); ``packed`` then has no effect.
    ``packed``: each step runs only the real tokens of the active requests' rows, packed
    end to end into sequences of at most :data:`PACK_TOKENS` tokens (or the longest row) with a
    block-diagonal causal mask and every token's own position, instead of the rows padded to the
    batch's common width; the result is the same within float rounding (the rows' prompt variants
    differ in length by their context prefixes, so the padded batch is up to half padding). Off by
    default, as ROME uses it (one request: packing measured 0.85× the padded speed on SmolLM2-135M);
    MEMIT and AlphaEdit pack (1.21× faster on 50 gpt2-facts requests, ``benchmarks/RESULTS_edit_cost.md``). The
    vocabulary projection is made only at the positions the loss reads, and the KL's reference
    distribution once, at the first evaluation.

    ``norm_reference``: the vector whose norm scales δ's clamp (``clamp_factor``·‖ref‖) and weight
    decay (‖δ‖/‖ref‖²), at the subject's last token of the bare prompt: ``"mlp_out"`` (ROME's v₀, the
    edited MLP's output) or ``"resid"`` (MEMIT's ``compute_z``: the residual stream after the block,
    which δ is added to). They differ where the MLP's output is small next to the residual: then δ
    clamped to a multiple of ‖v₀‖ cannot move the prediction.

    ``progress`` (None: on a terminal or in a notebook, see :mod:`~gpt2_interp.core.progress`): a bar
    over the Adam steps of every chunk (its time left is the estimate for the whole optimisation) showing
    the current loss and P(target) (averaged over the prompt variants; over the requests still
    optimised when there are several) and how many requests are done; ``desc`` labels it.

    ``delta_site``: where δ is added, ``"mlp_out"`` (ROME's v* = v₀ + δ: the output of the edited ``W_out``,
    before the norm a block applies to its MLP's output, OLMo 2's and Gemma's ``ln2_post``; so v* is the value
    the rank-one update writes and the edited model's loss is the optimised one) or ``"resid_post"`` (MEMIT's
    z: the residual stream after the block). The two are the same point in a block without a post-MLP norm;
    with one, δ at ``"mlp_out"`` passes through it (``resid_mid + ln2_post(v₀ + δ)``) and v₀ is the MLP's
    output before it.

    ``key_weights`` ``[1 + len(prefixes)]``: k* as a weighted sum over the variants instead of their mean
    (:func:`variant_weights`). ``hp.n_updates`` Adam updates at most (:attr:`RomeHparams.step_count`);
    ``hp.kl_positions`` picks the KL's positions."""
    if norm_reference not in ("mlp_out", "resid"):
        raise ValueError(f"norm_reference must be 'mlp_out' (ROME) or 'resid' (MEMIT), got {norm_reference!r}")
    if delta_site not in DELTA_SITES:
        raise ValueError(f"delta_site must be 'mlp_out' (ROME) or 'resid_post' (MEMIT), got {delta_site!r}")
    chunk = chunk or (len(items) if model.device.type != "cpu" else 32)
    n_chunks = -(-len(items) // chunk) if items else 0
    out: list[dict[str, Any]] = []
    bar = progress_bar(
        total=hp.n_updates * n_chunks or None,
        unit="step",
        desc=desc or f"δ at layer {layer}",
        enabled=progress,
        leave=False,
    )
    with torch.inference_mode(False), torch.enable_grad():  # works inside a caller's no_grad/inference_mode
        for s in range(0, len(items), chunk):
            report = _StepReport(bar, len(items), len(out), hp.n_updates)
            out += _optimise_deltas(
                model,
                items[s : s + chunk],
                layer,
                prefixes,
                hp,
                solve,
                norm_reference,
                report,
                key_weights,
                packed,
                delta_site,
            )
            report.finish()
    bar.close()
    return out


class _StepReport:
    """Feeds :func:`optimise_deltas`' bar from one chunk's steps: one tick per Adam step, the rest of the
    chunk's ticks when it stops early, and a postfix with the loss, P(target) and the requests done."""

    def __init__(self, bar: Any, n_total: int, n_before: int, v_steps: int) -> None:
        self.bar, self.n_total, self.n_before, self.v_steps, self.ticks = bar, n_total, n_before, v_steps, 0

    def __call__(self, step: int, active: list[dict[str, float]], n_done: int) -> None:
        """``step``: the evaluation just made (0: before any update); ``active``: the log entries of the
        requests still optimised at it; ``n_done``: the chunk's requests finished after it."""
        if self.bar.disable or not active:
            return
        loss = sum(a["loss"] for a in active) / len(active)
        p = sum(a["p_target"] for a in active) / len(active)
        done = "" if self.n_total == 1 else f"requests {self.n_before + n_done}/{self.n_total}, "
        self.bar.set_postfix_str(f"{done}loss {loss:.3g}, p(target) {p:.3g}", refresh=False)
        if step > self.ticks:
            self.bar.update(step - self.ticks)
            self.ticks = step

    def finish(self) -> None:
        if self.v_steps > self.ticks:
            self.bar.update(self.v_steps - self.ticks)
            self.ticks = self.v_steps


@dataclass
class _Rows:
    """The δ optimisation's one batch: every request's rows (rewrite variants, the KL prompt, keep
    prompts), right-shifted so that every subject's last token is column ``c``, and the index tensors
    that pick what the loss reads: ``nll_*`` one entry per (variant, target token), ``kl_*`` per KL
    position, ``keep_*`` per keep prompt (its last token)."""

    c: int
    tokens: torch.Tensor  # [rows, width]
    mask: torch.Tensor  # [rows, width]
    r0: list[int]  # each request's first row
    row_req: list[int]  # each row's request
    row_req_t: torch.Tensor
    r0_t: torch.Tensor
    nll_rows: torch.Tensor
    nll_cols: torch.Tensor
    nll_ids: torch.Tensor
    nll_req: torch.Tensor
    nll_w: torch.Tensor
    kl_rows: torch.Tensor
    kl_cols: torch.Tensor
    kl_req: torch.Tensor
    kl_count: torch.Tensor  # [n] KL positions per request
    keep_rows: torch.Tensor
    keep_cols: torch.Tensor
    keep_req: torch.Tensor
    keep_count: torch.Tensor  # [n] keep prompts per request
    rw_rows: torch.Tensor  # the rewrite variants' rows
    rw_req: torch.Tensor
    n_rw: torch.Tensor  # [n] variants per request
    n_tok: torch.Tensor  # [n] target tokens per request

    @classmethod
    def of(cls, model: HookedGPT2, items: Sequence[tuple[Request, list[int]]], bs: list[Any], hp: RomeHparams) -> _Rows:
        dev, n = model.device, len(items)
        c = max(b.c for b in bs)
        width = max(c + b.tokens.shape[1] - b.c for b in bs)
        tokens = torch.full(
            (sum(b.tokens.shape[0] for b in bs), width), model.tokenizer.pad_id, dtype=torch.long, device=dev
        )
        mask = torch.zeros_like(tokens)
        row_req: list[int] = []
        r0: list[int] = []
        nll: list[list[Any]] = [[], [], [], [], []]  # rows, cols, ids, request, weight
        kl: list[list[int]] = [[], [], []]  # rows, cols, request
        kp: list[list[int]] = [[], [], []]
        for i, (b, (_req, ids)) in enumerate(zip(bs, items)):
            sh, r = c - b.c, len(row_req)
            tokens[r : r + b.tokens.shape[0], sh : sh + b.tokens.shape[1]] = b.tokens
            mask[r : r + b.tokens.shape[0], sh : sh + b.tokens.shape[1]] = b.mask
            r0.append(r)
            row_req += [i] * b.tokens.shape[0]
            n_rw, T = b.n_rewrite, len(ids)
            w = torch.full((n_rw,), 1.0 / n_rw)  # NLL weight of each variant
            if hp.bare_weight is not None and n_rw > 1:
                w.fill_((1 - hp.bare_weight) / (n_rw - 1))
                w[0] = hp.bare_weight
            for j in range(n_rw):
                for part, x in zip(
                    nll, ([r + j] * T, (b.target_pos[j] + sh).tolist(), ids, [i] * T, [float(w[j]) / T] * T)
                ):
                    part += x
            for part, x in zip(kl, ([r + n_rw] * len(b.kl_pos), (b.kl_pos + sh).tolist(), [i] * len(b.kl_pos))):
                part += x
            for part, x in zip(
                kp,
                (
                    [r + n_rw + 1 + j for j in range(len(b.keep_cols))],
                    (b.keep_cols + sh).tolist(),
                    [i] * len(b.keep_cols),
                ),
            ):
                part += x

        def L(x, dt=torch.long):
            return torch.tensor(x, dtype=dt, device=dev)

        row_req_t = L(row_req)
        rw_rows = L([r + j for r, b in zip(r0, bs) for j in range(b.n_rewrite)])
        kl_req, keep_req = L(kl[2]), L(kp[2])
        return cls(
            c,
            tokens,
            mask,
            r0,
            row_req,
            row_req_t,
            L(r0),
            L(nll[0]),
            L(nll[1]),
            L(nll[2]),
            L(nll[3]),
            L(nll[4], torch.float32),
            L(kl[0]),
            L(kl[1]),
            kl_req,
            torch.bincount(kl_req, minlength=n).float(),
            L(kp[0]),
            L(kp[1]),
            keep_req,
            torch.bincount(keep_req, minlength=n).float(),
            rw_rows,
            row_req_t[rw_rows],
            L([b.n_rewrite for b in bs], torch.float32),
            L([len(ids) for _, ids in items], torch.float32),
        )


#: Tokens per packed sequence of the δ optimisation's steps (:func:`optimise_deltas`, ``packed``); a
#: longer prompt variant gets a sequence of its own. Attention inside a pack costs ∝ its length² (every
#: query-key pair of the pack is computed, then masked), the rest ∝ its tokens: on 32 gpt2-facts requests
#: 128 took 1.08× and 256 1.17× the time of 64 (benchmarks/RESULTS_edit_cost.md, idle machine).
PACK_TOKENS = 64


@dataclass
class _Packing:
    """The real tokens of some rows of a right-/left-padded batch ``[rows, width]``, packed end to end
    into ``[packs, L]`` sequences: ``src`` the flat index ``row · width + col`` of each slot's token
    (0 in a pad slot), ``real`` whether a slot holds one, ``mask`` ``[packs, 1, L, L]`` causal within each
    row's segment (a pad slot sees itself only), ``rope`` the RoPE of each token's own position (None
    without rotary positions), ``slot`` ``[rows · width]`` each token's flat slot (−1: not packed)."""

    n_rows: int
    src: torch.Tensor
    real: torch.Tensor
    mask: torch.Tensor
    rope: tuple[torch.Tensor, ...] | None
    slot: torch.Tensor

    @classmethod
    def of(cls, model: HookedGPT2, mask: torch.Tensor, rows: torch.Tensor) -> _Packing:
        """Pack ``rows`` (indices into ``mask`` ``[rows, width]``, whose real tokens are contiguous) first
        fit, longest first, into sequences of :data:`PACK_TOKENS` tokens (or the longest row's)."""
        dev, width = mask.device, mask.shape[1]
        m = mask.bool()
        length = m.sum(1).tolist()
        start = m.int().argmax(1).tolist()  # the first real column
        pos_all = (mask.long().cumsum(-1) - 1).clamp(min=0).reshape(-1)  # as the model counts positions
        order = sorted(rows.tolist(), key=lambda r: -length[r])
        cap = max([PACK_TOKENS] + [length[r] for r in order])
        bins: list[list[int]] = []
        room: list[int] = []
        for r in order:
            for b, left in enumerate(room):
                if length[r] <= left:
                    bins[b].append(r)
                    room[b] -= length[r]
                    break
            else:
                bins.append([r])
                room.append(cap - length[r])
        L = max(cap - left for left in room) if bins else 1
        src: list[list[int]] = []
        seg: list[list[int]] = []
        for rs in bins:
            s_b: list[int] = []
            g_b: list[int] = []
            for j, r in enumerate(rs):
                s_b += range(r * width + start[r], r * width + start[r] + length[r])
                g_b += [j] * length[r]
            pad = L - len(s_b)
            src.append(s_b + [0] * pad)
            seg.append(g_b + [-1 - i for i in range(pad)])  # each pad slot a segment of its own
        src_t = torch.tensor(src, dtype=torch.long, device=dev).reshape(len(bins), L)
        seg_t = torch.tensor(seg, dtype=torch.long, device=dev).reshape(len(bins), L)
        real = seg_t >= 0
        causal = torch.ones(L, L, dtype=torch.bool, device=dev).tril()
        att = (seg_t[:, :, None] == seg_t[:, None, :]) & causal  # [packs, L, L]
        slot = torch.full((mask.numel(),), -1, dtype=torch.long, device=dev)
        slot[src_t[real]] = torch.arange(src_t.numel(), device=dev).reshape(src_t.shape)[real]
        return cls(len(rows), src_t, real, att[:, None], model.rotary(pos_all[src_t] * real), slot)


class _PrefixCache(KVCache):
    """The keys and values of the columns before the subject's last token in every block above the edit
    layer, ``{layer: [rows, n_kv, c, d_head]}`` each: where δ is added at that token only
    (``exact_edit=False``), those columns never see δ (attention is causal), so one no-grad pass gives them
    and every step runs the columns from the subject's last token on against them. Made by
    :meth:`record`; :meth:`rows` picks some rows; a block's attention calls :meth:`extend`."""

    def __init__(self, keys: dict[int, torch.Tensor], values: dict[int, torch.Tensor], recording: bool) -> None:
        self.keys, self.values, self.recording, self.length = keys, values, recording, 0

    @classmethod
    @torch.no_grad()
    def record(cls, model: HookedGPT2, resid: torch.Tensor, mask: torch.Tensor, layer: int) -> _PrefixCache:
        """Run the blocks above ``layer`` on ``resid`` ``[rows, c, d_model]`` (the residual leaving it, the
        columns before the subject's last token; ``mask`` ``[rows, c]``) and keep their keys and values."""
        cache = cls({}, {}, recording=True)
        q = resid.shape[1]
        att, rope = _attention_inputs(model, mask, 0, q)
        x = resid
        for block in model.blocks[layer + 1 :]:
            x = block(x, att, cache, rope)
        cache.recording = False
        return cache

    def rows(self, rows: torch.Tensor) -> _PrefixCache:
        """The cache of ``rows`` (indices) only."""
        return _PrefixCache(
            {l: k[rows] for l, k in self.keys.items()}, {l: v[rows] for l, v in self.values.items()}, False
        )

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Recording: keep ``k``, ``v`` ``[rows, n_kv, c, d_head]`` of block ``layer`` and return them;
        else the cached columns followed by ``k``, ``v``."""
        if self.recording:
            self.keys[layer], self.values[layer] = k, v
            return k, v
        return torch.cat([self.keys[layer], k], 2), torch.cat([self.values[layer], v], 2)


def _attention_inputs(
    model: HookedGPT2, mask: torch.Tensor, past: int, q: int
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
    """The bool attention mask ``[rows, 1, q, past + q]`` and the RoPE of ``q`` query columns after
    ``past`` columns of the padded rows ``mask`` ``[rows, past + q]``, as the model's forward makes them
    (positions counted over real tokens; a pad query sees itself only)."""
    keys = mask[:, None, None, : past + q].bool()
    causal = torch.ones(q, past + q, dtype=torch.bool, device=mask.device).tril(past)
    own = torch.zeros_like(causal)
    own[:, past:] = torch.eye(q, dtype=torch.bool, device=mask.device)
    pos = (mask.long().cumsum(-1) - 1).clamp(min=0)[:, past : past + q]
    return (causal & keys) | own, model.rotary(pos)


@dataclass
class _Start:
    """What the δ optimisation starts from, read by one no-grad forward to the edit layer: the batch
    (:class:`_Rows`, each request's :class:`_Batch`), the keys ``k_star``/``k_bare`` ``[n, d_mlp]``,
    δ's ``scale`` at every position ``[rows, width]``, ``v0`` ``[n, d_model]`` and the norm ``v0_norm``
    ``[n]`` of the clamp and weight decay, and the residual leaving the edit layer without δ ``resid0``
    ``[rows, width, d_model]``; with a post-MLP norm (``post_norm``) also the residual before the MLP
    ``resid_mid`` and the MLP's output before the norm ``raw``, both ``[rows, width, d_model]``."""

    rows: _Rows
    bs: list[_Batch]
    k_star: torch.Tensor
    k_bare: torch.Tensor
    scale: torch.Tensor
    v0: torch.Tensor
    v0_norm: torch.Tensor
    resid0: torch.Tensor
    resid_mid: torch.Tensor | None
    raw: torch.Tensor | None
    post_norm: Any

    @classmethod
    def of(
        cls,
        model: HookedGPT2,
        items: Sequence[tuple[Request, list[int]]],
        layer: int,
        prefixes: list[str],
        hp: RomeHparams,
        solve: Callable[[torch.Tensor], torch.Tensor] | None,
        norm_reference: str,
        key_weights: Sequence[float] | None,
        delta_site: str,
    ) -> _Start:
        """The start of :func:`optimise_deltas` for ``items`` (see its arguments)."""
        kl_last = hp.kl_positions == "subject_last"
        bs = [_build_batch(model, req, ids, prefixes, hp.kl_prompt, kl_last, hp.prepend_bos) for req, ids in items]
        R = _Rows.of(model, items, bs, hp)
        block = model.blocks[layer]
        # a norm on the MLP's output (OLMo 2, Gemma): δ at "mlp_out" enters before it, as the rank-one update does
        post_norm = getattr(block, "ln2_post", None) if delta_site == "mlp_out" else None
        cache = _edit_layer_cache(model, R, layer, post_norm is not None)
        bare = torch.tensor(R.r0, device=model.device)  # the bare prompts' rows
        keys = cache[f"blocks.{layer}.mlp.hook_post"].float()  # [rows, width, d_mlp]
        k_star = _key_star(keys, R, bs, key_weights)  # [n, d_mlp]
        k_bare = keys[bare, R.c]  # [n, d_mlp], the bare prompts'
        raw = None if post_norm is None else _mlp_output(block, cache[f"blocks.{layer}.mlp.hook_post"])
        scale = _delta_scale(keys, k_star, R, hp.exact_edit, solve)
        del keys
        v0 = (cache[f"blocks.{layer}.hook_mlp_out"] if raw is None else raw)[bare, R.c].float()  # [n, d_model]
        # δ enters after the edit layer's MLP, so that layer's attention and MLP are the same at every step:
        # each step starts from the residual stream after the edit layer with δ added, and runs the layers above
        resid0 = cache[f"blocks.{layer}.hook_resid_post"]  # [rows, width, d_model], leaving the edit layer
        resid_mid = cache[f"blocks.{layer}.hook_resid_mid"] if post_norm is not None else None
        ref = v0 if norm_reference == "mlp_out" else resid0[bare, R.c].float()
        return cls(R, bs, k_star, k_bare, scale, v0, ref.norm(dim=-1), resid0, resid_mid, raw, post_norm)


@torch.no_grad()
def _edit_layer_cache(model: HookedGPT2, R: _Rows, layer: int, mid: bool) -> Mapping[str, torch.Tensor]:
    """The edit layer's MLP keys, MLP output and residual after it (and before its MLP with ``mid``) for
    every row of ``R``, ``[rows, width, d]`` each, by name."""
    names = [f"blocks.{layer}.{x}" for x in ("mlp.hook_post", "hook_mlp_out", "hook_resid_post")]
    _, cache = model.run_with_cache(
        R.tokens,
        names_filter=names + ([f"blocks.{layer}.hook_resid_mid"] if mid else []),
        attention_mask=R.mask,
        stop_at_layer=layer + 1,
        return_type=None,
    )
    return cache


def _key_star(keys: torch.Tensor, R: _Rows, bs: list[_Batch], key_weights: Sequence[float] | None) -> torch.Tensor:
    """k* ``[n, d_mlp]``: each request's keys ``[rows, width, d_mlp]`` at the subject's last token over its
    rewrite variants, their mean or their ``key_weights`` sum."""
    if key_weights is None:
        return torch.stack([keys[r : r + b.n_rewrite, R.c].mean(0) for r, b in zip(R.r0, bs)])
    return torch.stack(
        [_weights(key_weights, b.n_rewrite, keys) @ keys[r : r + b.n_rewrite, R.c] for r, b in zip(R.r0, bs)]
    )


@torch.no_grad()
def _mlp_output(block: Any, post: torch.Tensor) -> torch.Tensor:
    """The MLP's output before its post norm ``[rows, width, d_model]`` from its keys ``post``."""
    w_out, b_out = block.mlp.W_out, block.mlp.b_out
    return post @ w_out if b_out is None else post @ w_out + b_out


def _delta_scale(
    keys: torch.Tensor,
    k_star: torch.Tensor,
    R: _Rows,
    exact_edit: bool,
    solve: Callable[[torch.Tensor], torch.Tensor] | None,
) -> torch.Tensor:
    """How much of δ each position ``[rows, width]`` gets: ``exact_edit``, what the rank-one update adds
    there, ``(k_t·u)/(k*·u)``; else 1 at the subject's last token (ROME) and 0 elsewhere."""
    if exact_edit:
        c_inv_k = (solve(k_star) if solve is not None else k_star).float()  # [n, d_mlp]
        num = torch.einsum("bpk,bk->bp", keys, c_inv_k[R.row_req_t])
        return num / (k_star * c_inv_k).sum(-1)[R.row_req_t][:, None] * R.mask
    scale = torch.zeros(R.mask.shape, device=R.mask.device)
    scale[:, R.c] = 1.0
    return scale


@dataclass
class _Leaving:
    """The residual leaving the edit layer with δ ``[n, d_model]`` added (the tensor optimised in place)."""

    start: _Start
    delta: torch.Tensor

    def __call__(self, at: Callable[[torch.Tensor], torch.Tensor], sc: torch.Tensor, req: torch.Tensor) -> torch.Tensor:
        """``at`` picks the rows/slots of a ``[rows, width, d_model]`` tensor; ``sc`` δ's scale and ``req``
        the request at each of them: the residual after the edit layer plus δ, or, with a post-MLP norm,
        δ added to the MLP's output before it."""
        s = self.start
        if s.post_norm is None or s.raw is None or s.resid_mid is None:
            return self._with_delta(at(s.resid0), sc, req)
        return at(s.resid_mid) + s.post_norm(self._with_delta(at(s.raw), sc, req))

    def _with_delta(self, x: torch.Tensor, sc: torch.Tensor, req: torch.Tensor) -> torch.Tensor:
        return x + (sc[:, :, None] * self.delta[req]).to(x.dtype)  # x: [rows|packs, width, d]


def _row_numbers(rows: torch.Tensor, n_rows: int) -> torch.Tensor:
    """``[n_rows]``: each of ``rows``' index among them, −1 for the other rows."""
    new_row = torch.full((n_rows,), -1, dtype=torch.long, device=rows.device)
    new_row[rows] = torch.arange(len(rows), device=rows.device)
    return new_row


# The forward of the layers above the edit layer, one per way of batching the active rows. Each is called
# with the active rows (indices) and the residual leaving the edit layer (:class:`_Leaving`) and returns
# ``(flat, index_of)``: the last block's output ``[tokens, d_model]`` and, for every ``row · width + col``
# of the padded batch, its token in ``flat``.
class _TailForward:
    """δ at the subject's last token only (column ``c`` of every row): the columns before it never see δ,
    so their keys and values above the edit layer are computed once (:class:`_PrefixCache`) and each step
    runs columns ``c…`` only."""

    def __init__(self, model: HookedGPT2, layer: int, start: _Start) -> None:
        R = start.rows
        self.model, self.layer, self.R, self.start = model, layer, R, start
        self.prefix = None if R.c == 0 else _PrefixCache.record(model, start.resid0[:, : R.c], R.mask[:, : R.c], layer)
        self.tail: tuple[int, torch.Tensor, tuple[torch.Tensor, ...] | None, _PrefixCache | None] | None = None

    def __call__(self, rows: torch.Tensor, leave: _Leaving) -> tuple[torch.Tensor, torch.Tensor]:
        R, c, width = self.R, self.R.c, self.R.tokens.shape[1]
        s_w = width - c
        if self.tail is None or self.tail[0] != len(rows):  # the active rows only ever shrink
            att, rope = _attention_inputs(self.model, R.mask[rows], c, s_w)
            self.tail = (len(rows), att, rope, None if self.prefix is None else self.prefix.rows(rows))
        tail = self.tail
        new_row = _row_numbers(rows, len(R.row_req))

        def tail_cols(t: torch.Tensor, r: torch.Tensor = rows) -> torch.Tensor:  # [rows, width − c, d]
            return t[r][:, c:]

        x = leave(tail_cols, self.start.scale[rows][:, c:], R.row_req_t[rows][:, None])
        for block in self.model.blocks[self.layer + 1 : self.model.cfg.n_layer]:
            x = block(x, tail[1], tail[3], tail[2])
        index_of = (new_row[:, None] * s_w + torch.arange(width, device=rows.device) - c).reshape(-1)
        return x.reshape(-1, x.shape[-1]), index_of


class _PackedForward:
    """The active rows' real tokens packed end to end (:class:`_Packing`)."""

    def __init__(self, model: HookedGPT2, layer: int, start: _Start) -> None:
        self.model, self.layer, self.start = model, layer, start
        self.pack: _Packing | None = None

    def __call__(self, rows: torch.Tensor, leave: _Leaving) -> tuple[torch.Tensor, torch.Tensor]:
        R, width = self.start.rows, self.start.rows.tokens.shape[1]
        if self.pack is None or self.pack.n_rows != len(rows):  # the active rows only ever shrink
            self.pack = _Packing.of(self.model, R.mask, rows)
        pack = self.pack
        src = pack.src

        def slots(t: torch.Tensor, s: torch.Tensor = src) -> torch.Tensor:  # [packs, L, d_model]
            return t.reshape(-1, t.shape[-1])[s]

        x = leave(slots, self.start.scale.reshape(-1)[src] * pack.real, R.row_req_t[src // width])
        for block in self.model.blocks[self.layer + 1 : self.model.cfg.n_layer]:
            x = block(x, pack.mask, None, pack.rope)
        return x.reshape(-1, x.shape[-1]), pack.slot  # (row · width + col) → flat slot


class _RowsForward:
    """The active rows padded to the batch's width."""

    def __init__(self, model: HookedGPT2, layer: int, start: _Start) -> None:
        self.model, self.layer, self.start = model, layer, start

    def __call__(self, rows: torch.Tensor, leave: _Leaving) -> tuple[torch.Tensor, torch.Tensor]:
        R, width, n_layer = self.start.rows, self.start.rows.tokens.shape[1], self.model.cfg.n_layer
        new_row = _row_numbers(rows, len(R.row_req))

        def active_rows(t: torch.Tensor, r: torch.Tensor = rows) -> torch.Tensor:  # [rows, width, d_model]
            return t[r]

        x = leave(active_rows, self.start.scale[rows], R.row_req_t[rows][:, None])
        if self.layer + 1 < n_layer:
            x = self.model(x, start_at_layer=self.layer + 1, stop_at_layer=n_layer, attention_mask=R.mask[rows])
        index_of = (new_row[:, None] * width + torch.arange(width, device=rows.device)).reshape(-1)
        return x.reshape(-1, x.shape[-1]), index_of


def _forward_above(
    model: HookedGPT2, layer: int, start: _Start, exact_edit: bool, packed: bool
) -> _TailForward | _PackedForward | _RowsForward:
    """The forward of the layers above the edit layer that the settings call for."""
    if not exact_edit:
        return _TailForward(model, layer, start)
    return _PackedForward(model, layer, start) if packed else _RowsForward(model, layer, start)


@dataclass
class _Terms:
    """One step's loss ``[n]`` and its terms ``[n]`` per request, with the target tokens' log-probabilities
    ``lp_t`` ``[entries]`` of the NLL entries ``e_nll`` read."""

    loss: torch.Tensor
    nll: torch.Tensor
    kl: torch.Tensor
    keep: torch.Tensor
    lp_t: torch.Tensor
    e_nll: torch.Tensor


class _Loss:
    """The loss of each request from the last block's output: the NLL of the target tokens, the KL of the
    essence prompt's and the keep prompts' next-token distributions to the unedited ones (taken at the
    first call, when every request is active), and the weight decay of δ."""

    def __init__(self, model: HookedGPT2, R: _Rows, hp: RomeHparams, v0_norm: torch.Tensor) -> None:
        self.model, self.R, self.hp, self.v0_norm = model, R, hp, v0_norm
        self.kl_init: torch.Tensor | None = None
        self.keep_init: torch.Tensor | None = None

    def _log_probs(
        self, flat: torch.Tensor, index_of: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor
    ) -> torch.Tensor:
        """Log-probabilities ``[positions, d_vocab]`` (float32) at the padded batch's ``rows``, ``cols``."""
        width = self.R.tokens.shape[1]
        return self.model.unembed(self.model.ln_final(flat[index_of[rows * width + cols]])).float().log_softmax(-1)

    def __call__(self, flat: torch.Tensor, index_of: torch.Tensor, active: torch.Tensor, delta: torch.Tensor) -> _Terms:
        R, hp, n, dev = self.R, self.hp, len(active), active.device
        e_nll = active[R.nll_req].nonzero()[:, 0]
        e_kl = active[R.kl_req].nonzero()[:, 0]
        e_keep = active[R.keep_req].nonzero()[:, 0]
        # only the positions the loss reads are unembedded, each group on its own (slices of one
        # vocabulary-wide tensor would each build a vocabulary-wide gradient in the backward)
        lp_t = self._log_probs(flat, index_of, R.nll_rows[e_nll], R.nll_cols[e_nll])
        lp_t = lp_t.gather(-1, R.nll_ids[e_nll, None])[:, 0]  # [entries]
        kl_lp = self._log_probs(flat, index_of, R.kl_rows[e_kl], R.kl_cols[e_kl])
        keep_lp = self._log_probs(flat, index_of, R.keep_rows[e_keep], R.keep_cols[e_keep])
        if self.kl_init is None or self.keep_init is None:  # step 0 (both set together): every request is active
            self.kl_init, self.keep_init = kl_lp.detach(), keep_lp.detach()
        nll = torch.zeros(n, device=dev).index_add(0, R.nll_req[e_nll], -lp_t * R.nll_w[e_nll])
        kl_pos = (kl_lp.exp() * (kl_lp - self.kl_init[e_kl])).sum(-1)  # KL(edited || unedited) per position
        kl = torch.zeros(n, device=dev).index_add(0, R.kl_req[e_kl], kl_pos) / R.kl_count.clamp(min=1)
        keep_pos = (keep_lp.exp() * (keep_lp - self.keep_init[e_keep])).sum(-1)
        keep = torch.zeros(n, device=dev).index_add(0, R.keep_req[e_keep], keep_pos) / R.keep_count.clamp(min=1)
        wd = delta.norm(dim=-1) / self.v0_norm**2
        loss = nll + hp.kl_factor * kl + hp.keep_factor * keep + hp.weight_decay * wd  # [n]
        return _Terms(loss, nll, kl, keep, lp_t, e_nll)


_LOG_KEYS = ("loss", "nll", "kl", "p_target", "bare_nll", "keep_kl")


class _StepLog:
    """Each request's log of the δ optimisation (one entry per evaluation while it is optimised), its
    early stop, and the report of each step."""

    def __init__(
        self, R: _Rows, hp: RomeHparams, report: Callable[[int, list[dict[str, float]], int], None] | None
    ) -> None:
        self.R, self.hp, self.report = R, hp, report
        self.logs: list[list[dict[str, float]]] = [[] for _ in range(len(R.r0))]

    @torch.no_grad()
    def _stats(self, t: _Terms) -> list[list[float]]:
        """Per request, the values of :data:`_LOG_KEYS` (P(target | variant) from each row's target tokens)."""
        R, n, dev = self.R, len(self.R.r0), t.loss.device
        per_row = torch.zeros(len(R.row_req), device=dev).index_add(0, R.nll_rows[t.e_nll], t.lp_t.detach())
        p_tgt = torch.zeros(n, device=dev).index_add(0, R.rw_req, per_row[R.rw_rows].exp()) / R.n_rw
        bare_nll = -per_row[R.r0_t] / R.n_tok
        return torch.stack(
            [t.loss.detach(), t.nll.detach(), t.kl.detach(), p_tgt, bare_nll, t.keep.detach()], 1
        ).tolist()

    def _stops(self, last: dict[str, float]) -> bool:
        hp = self.hp
        return last["loss"] < hp.early_stop and (hp.bare_early_stop is None or last["bare_nll"] < hp.bare_early_stop)

    def record(self, step: int, t: _Terms, active: torch.Tensor) -> torch.Tensor:
        """Log step ``step``'s terms for the ``active`` requests and report; returns the requests done
        ``[n]`` (bool: met the early stop, or the last step)."""
        stat = self._stats(t)
        done = torch.zeros(len(active), dtype=torch.bool, device=active.device)
        for i in active.nonzero()[:, 0].tolist():
            self.logs[i].append(dict(zip(_LOG_KEYS, stat[i])))
            if step == self.hp.n_updates or self._stops(self.logs[i][-1]):
                done[i] = True
        if self.report is not None:
            now = active.nonzero()[:, 0].tolist()
            n = len(active)
            self.report(step, [self.logs[i][-1] for i in now], n - len(now) + int(done[now].sum()) if now else n)
        return done


@torch.no_grad()
def _clamped_step(
    delta: torch.Tensor,
    grad: torch.Tensor,
    adam: dict[str, Any],
    lr: float,
    max_norm: torch.Tensor,
    frozen: torch.Tensor,
) -> None:
    """One Adam step on ``delta`` ``[n, d_model]`` in place, each row then scaled back into its ball
    ‖δ‖ ≤ ``max_norm``; the ``frozen`` requests' rows are left as they were."""
    keep = delta.detach().clone()
    _adam_step(delta, grad, adam, lr)
    nrm = delta.norm(dim=-1)
    over = nrm > max_norm
    delta[over] *= (max_norm[over] / nrm[over])[:, None]
    delta[frozen] = keep[frozen]  # frozen requests do not move


def _optimise_deltas(
    model: HookedGPT2,
    items: Sequence[tuple[Request, list[int]]],
    layer: int,
    prefixes: list[str],
    hp: RomeHparams,
    solve: Callable[[torch.Tensor], torch.Tensor] | None,
    norm_reference: str = "mlp_out",
    report: Callable[[int, list[dict[str, float]], int], None] | None = None,
    key_weights: Sequence[float] | None = None,
    packed: bool = True,
    delta_site: str = "mlp_out",
) -> list[dict[str, Any]]:
    """One chunk of :func:`optimise_deltas`: the start, then Adam steps until every request has stopped."""
    n = len(items)
    start = _Start.of(model, items, layer, prefixes, hp, solve, norm_reference, key_weights, delta_site)
    R = start.rows
    delta = torch.zeros(n, model.cfg.d_model, device=model.device, requires_grad=True)
    max_norm = hp.clamp_factor * start.v0_norm
    adam = {"t": 0, "m": torch.zeros_like(delta), "v": torch.zeros_like(delta)}
    active = torch.ones(n, dtype=torch.bool, device=model.device)
    leave, loss_of, log = _Leaving(start, delta), _Loss(model, R, hp, start.v0_norm), _StepLog(R, hp, report)
    forward = _forward_above(model, layer, start, hp.exact_edit, packed)
    with _frozen(model):
        for step in range(hp.n_updates + 1):
            rows = active[R.row_req_t].nonzero()[:, 0]  # the active requests' rows
            t = loss_of(*forward(rows, leave), active, delta)
            done = log.record(step, t, active)
            if not bool((active & ~done).any()) or step == hp.n_updates:  # every request has stopped
                break
            (grad,) = torch.autograd.grad(t.loss[active].sum(), delta)
            _clamped_step(delta, grad, adam, hp.v_lr, max_norm, done | ~active)
            active &= ~done
    return [_outcome(start, delta, log.logs, i) for i in range(n)]


def _outcome(start: _Start, delta: torch.Tensor, logs: list[list[dict[str, float]]], i: int) -> dict[str, Any]:
    """Request ``i``'s entry of :func:`optimise_deltas`' result."""
    r0, b, c = start.rows.r0[i], start.bs[i], start.rows.c
    return {
        "k_star": start.k_star[i],
        "k_bare": start.k_bare[i],
        "delta": delta[i].detach(),
        "v0": start.v0[i],
        "log": logs[i],
        "n_prompts": b.n_rewrite,
        "key_scale": start.scale[r0 : r0 + b.tokens.shape[0], c].tolist(),
    }


def _adam_step(
    x: torch.Tensor,
    g: torch.Tensor,
    state: dict[str, Any],
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> None:
    """One Adam step on ``x`` in place (torch.optim.Adam's defaults, without importing torch.optim,
    whose first import costs seconds)."""
    state["t"] += 1
    state["m"].mul_(betas[0]).add_(g, alpha=1 - betas[0])
    state["v"].mul_(betas[1]).addcmul_(g, g, value=1 - betas[1])
    m_hat = state["m"] / (1 - betas[0] ** state["t"])
    v_hat = state["v"] / (1 - betas[1] ** state["t"])
    x.sub_(lr * m_hat / (v_hat.sqrt() + eps))


__all__ = [
    "DELTA_SITES",
    "PACK_TOKENS",
    "RequestLike",
    "TargetOutcome",
    "context_prefix_groups",
    "context_prefixes",
    "optimise_delta",
    "optimise_deltas",
    "subject_states",
    "target_logprobs",
    "target_outcomes",
    "validate_request",
    "variant_weights",
]
