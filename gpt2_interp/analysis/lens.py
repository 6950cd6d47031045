"""Reading the residual stream in vocabulary space: the logit lens and direct logit attribution.

Logit lens (nostalgebraist 2020): decode the residual stream at every layer boundary
as if it were the last one, ``logits_l = ln_final(resid_l) @ W_U``, with ln_final
recomputed on that residual (its own centring and scale, and the model's ``w``/``b``).
No weights are folded or centred, so the last boundary gives the model's own logits.

Direct logit attribution: ``ln_final`` is linear once its scale is fixed to the one of
the actual run, so a logit splits exactly into one term per component that writes to the
residual stream: ``(c - mean(c)) / scale · (w ⊙ W_U[:, t])``, plus ``b · W_U[:, t]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from einops import einsum

from ..core.boundary import boundary
from ..core.checks import check_count, check_prompts
from ..core.finite import nonfinite_summary
from ..core.progress import progress_bar
from ..core.result import Result
from ..core.tables import format_table
from ..model.hooks import hook_name
from .tokens import prompt_position

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..model import HookedGPT2

Prompts = str | Sequence[str] | torch.Tensor
Positions = int | Sequence[int] | str
Target = str | int


# ---------------------------------------------------------------------------- helpers
@boundary
def decode_resid(model: HookedGPT2, resid: torch.Tensor) -> torch.Tensor:
    """Logit-lens logits ``[..., d_vocab]`` of residuals ``[..., d_model]``: ln_final
    (recomputed on ``resid``, with its ``w``, ``b`` and ``eps``; LayerNorm or RMSNorm), then ``W_U``."""
    return model.unembed(model.ln_final.unhooked(resid))


def _tokens(model: HookedGPT2, prompts: Prompts) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """``(tokens [batch, width], lengths [batch], texts)``; text is left-padded with BOS prepended."""
    if isinstance(prompts, torch.Tensor):
        tokens = prompts if prompts.ndim == 2 else prompts[None]
        if tokens.shape[0] == 0 or tokens.shape[1] == 0:
            raise ValueError("no prompts: the token tensor is empty")
        tokens = tokens.to(model.device, torch.long)
        lengths = torch.full((tokens.shape[0],), tokens.shape[1], device=model.device)
        return tokens, lengths, [model.tokenizer.decode_ids(r.tolist()) for r in tokens]
    texts = check_prompts(prompts, "prompts")
    tokens, mask = model.tokenize(texts)
    lengths = mask.sum(-1) if mask is not None else torch.full((len(texts),), tokens.shape[1], device=tokens.device)
    return tokens, lengths, texts


def _columns(positions: Positions, lengths: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Columns of the left-padded batch ``[batch, n_pos]`` for each prompt's ``positions``
    (index into the prompt's own tokens, BOS = 0; negative counts from its end), and a
    validity mask (``"all"`` on prompts of different lengths leaves pad cells invalid)."""
    pad = (width - lengths)[:, None]  # [batch, 1]
    if isinstance(positions, str):
        if positions != "all":
            raise ValueError(f"positions must be an int, a list of ints or 'all', got {positions!r}")
        cols = torch.arange(width, device=lengths.device).expand(len(lengths), -1)
        return cols, cols >= pad
    pos = [positions] if isinstance(positions, int) else list(positions)
    if not pos:
        raise ValueError("positions is empty: give an int, a list of ints or 'all'")
    p = torch.tensor(pos, device=lengths.device)[None]  # [1, n_pos]
    n = lengths[:, None]
    bad = ((p >= n) | (p < -n)).any(0)
    if bad.any():
        q = pos[int(bad.nonzero()[0])]
        shortest = int(lengths.min())
        raise IndexError(
            f"position {q} is out of range: the shortest prompt has {shortest} tokens (BOS included), "
            f"so positions run from {-shortest} to {shortest - 1}"
        )
    cols = torch.where(p < 0, width + p, pad + p)
    return cols, torch.ones_like(cols, dtype=torch.bool)


def _target_list(model: HookedGPT2, targets: Target | Sequence[Target] | None, batch: int) -> list[int] | None:
    if targets is None:
        return None
    if isinstance(targets, (str, int)):
        return [model.to_single_token(targets)] * batch
    ids = [model.to_single_token(t) for t in targets]
    if len(ids) != batch:
        raise ValueError(f"got {len(ids)} targets for {batch} prompts; give one target, or one per prompt")
    return ids


def _resid_names(model: HookedGPT2, include_mid: bool) -> tuple[list[str], list[str]]:
    names, labels = [hook_name("resid_pre", 0)], ["embed"]
    for i in range(model.cfg.n_layer):
        if include_mid:
            names.append(hook_name("resid_mid", i))
            labels.append(f"L{i}_mid")
        names.append(hook_name("resid_post", i))
        labels.append(f"L{i}")
    return names, labels


def _rank(logits: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(target logit, rank)`` for ``logits [..., d_vocab]`` and ids broadcastable to ``[...]``;
    rank 1 = the top token (ties count in the target's favour)."""
    t = logits.gather(-1, ids.expand(logits.shape[:-1])[..., None])
    return t[..., 0], (logits > t).sum(-1, dtype=torch.int32).long() + 1


# ---------------------------------------------------------------------------- logit lens
@boundary
@dataclass
class LensResult(Result):
    """Logit lens over ``layers`` (boundaries), prompts and positions.

    Tensors are ``[n_layers, batch, n_pos(, k)]``; ``positions [batch, n_pos]`` index each
    prompt's own tokens (BOS = 0; -1 where ``valid`` is False). Target rank 1 = top token.

    - ``prompts``: the texts; ``layers``: boundary labels (``embed``, ``L0``, ``L0_mid``, …);
      ``str_tokens``: each prompt's tokens as strings;
    - ``valid`` ``[batch, n_pos]``: False for cells that fall on padding (``positions="all"`` over
      prompts of different lengths); invalid cells hold -1 ids and NaN probabilities;
    - ``top_ids``/``top_probs`` ``[n_layers, batch, n_pos, k]`` and ``top_tokens`` (nested lists of
      strings, same layout): the ``k`` most probable tokens at each cell;
    - with targets: ``targets`` (strings), ``target_ids``, and ``target_prob``, ``target_logit``,
      ``target_rank`` ``[n_layers, batch, n_pos]``;
    - ``logits`` ``[n_layers, batch, n_pos, d_vocab]`` with ``return_logits`` (left out of
      :meth:`to_dict`); ``lens``: ``"logit lens"`` or ``"tuned lens"``.
    """

    result_kind = "lens"

    prompts: list[str]
    layers: list[str]
    str_tokens: list[list[str]]
    positions: torch.Tensor
    valid: torch.Tensor
    top_ids: torch.Tensor
    top_tokens: list[list[list[list[str]]]]
    top_probs: torch.Tensor
    targets: list[str] | None = None
    target_ids: list[int] | None = None
    target_prob: torch.Tensor | None = None
    target_logit: torch.Tensor | None = None
    target_rank: torch.Tensor | None = None
    logits: torch.Tensor | None = field(default=None, repr=False)
    lens: str = "logit lens"  # or "tuned lens"

    def to_dict(self) -> dict[str, Any]:
        """:meth:`Result.to_dict` without ``logits`` (too large for JSON)."""
        d = super().to_dict()
        d.pop("logits")
        return d

    def input_token(self, prompt: int, j: int) -> str:
        """The input token at column ``j`` of prompt number ``prompt`` (``""`` for an invalid cell)."""
        p = int(self.positions[prompt, j])
        return self.str_tokens[prompt][p] if p >= 0 else ""

    def table(self, k: int = 5, prompts: Sequence[int] | None = None) -> str:
        """Per prompt and position: a header row naming the columns, then one row per layer with the
        top-``k`` tokens and their probabilities under the lens and, with a target, its probability
        and rank (1 = top-1). ``prompts``: the prompt
        indices to show (None: all)."""
        lines = []
        for b in prompts if prompts is not None else range(len(self.prompts)):
            for j in range(self.positions.shape[1]):
                if not self.valid[b, j]:
                    continue
                head = f"prompt {self.prompts[b]!r} · position {int(self.positions[b, j])} ({self.input_token(b, j)!r})"
                if self.lens == "tuned lens":
                    head = "tuned lens · " + head
                if self.targets is not None:
                    head += f" · target {self.targets[b]!r}"
                n_top = min(k, self.top_probs.shape[-1])
                header = ["layer"] + [f"top-{i + 1} token (p)" for i in range(n_top)]
                if self.target_prob is not None:
                    header += ["p(target)", "rank(target)"]
                rows = []
                for li, name in enumerate(self.layers):
                    row = [name] + [
                        f"{self.top_tokens[li][b][j][i]!r} {float(self.top_probs[li, b, j, i]):.3f}"
                        for i in range(n_top)
                    ]
                    if self.target_prob is not None and self.target_rank is not None:
                        row += [f"{float(self.target_prob[li, b, j]):.3f}", str(int(self.target_rank[li, b, j]))]
                    rows.append(row)
                right = [False] * (1 + n_top) + [True, True][: len(header) - 1 - n_top]
                lines += [head, *format_table(header, rows, right=right), ""]
        return "\n".join(lines).rstrip()

    def plot(self, prompt: int = 0, position: int = -1, **kwargs: Any) -> Figure:
        """Heatmap (layers × positions, top token as text) + per-layer target curve at column ``position``."""
        from ..plots.lens import plot_lens

        return plot_lens(self, prompt=prompt, position=position, **kwargs)


def _lens_chunk(
    model: HookedGPT2,
    tokens: torch.Tensor,
    lengths: torch.Tensor,
    cols: torch.Tensor,
    names: list[str],
    k: int,
    tids: list[int] | None,
    keep_logits: bool,
    lens: Any = None,
) -> dict[str, torch.Tensor]:
    """One forward pass over a chunk of left-padded prompts ``tokens [b, width]``, caching only
    ``names``; decodes the residuals at ``cols [b, n_pos]``. Tensors are ``[n_layers, b, n_pos(, k)]``."""
    width, w = tokens.shape[1], int(lengths.max())
    tokens = tokens[:, width - w :]  # drop columns that are padding in every row of this chunk
    mask = (torch.arange(w, device=tokens.device)[None] >= (w - lengths)[:, None]).long()
    _, cache = model.run_with_cache(tokens, names_filter=names, attention_mask=mask, return_type=None)
    resid = torch.stack([cache[n] for n in names])  # [n_layers, b, w, d_model]
    c = (cols - (width - w)).clamp(min=0)  # invalid cells read any column; they are masked later
    picked = resid[:, torch.arange(len(c), device=c.device)[:, None], c]  # [n_layers, b, n_pos, d_model]
    if lens is not None:  # a tuned lens: each boundary's translator first
        picked = torch.stack([lens.translate(picked[i], i) for i in range(len(picked))])
    logits = decode_resid(model, picked).float()  # [n_layers, b, n_pos, d_vocab]
    finite = torch.isfinite(logits.sum(-1)).flatten(1).all(-1)  # [n_layers]: NaN/inf propagate into the sum
    if not bool(finite.all()):  # ranks and top-k among NaN logits would be meaningless: refuse
        first = int((~finite).nonzero()[0])
        raise ValueError(
            f"logit lens: the residual stream at {names[first]} (and {int((~finite).sum()) - 1} later boundaries) "
            f"decodes to non-finite logits ({nonfinite_summary(logits[first])}), so ranks and probabilities are "
            "undefined; check the model's weights and any active hooks (a NonFiniteWarning names the hook)"
        )
    lse = logits.logsumexp(-1)  # [n_layers, b, n_pos]
    top, top_ids = logits.topk(k, dim=-1)
    out = {"ids": top_ids, "probs": (top - lse[..., None]).exp()}
    if tids is not None:
        t = torch.tensor(tids, device=logits.device)[None, :, None]  # [1, b, 1]
        out["tl"], out["tr"] = _rank(logits, t)
        out["tp"] = (out["tl"] - lse).exp()
    if keep_logits:
        out["logits"] = logits
    return out


@boundary
@torch.no_grad()
def logit_lens(
    model: HookedGPT2,
    prompts: Prompts,
    targets: Target | Sequence[Target] | None = None,
    positions: Positions = -1,
    k: int = 10,
    include_mid: bool = False,
    batch_size: int = 64,
    return_logits: bool = False,
    progress: bool | None = None,
    lens: Any = None,
) -> LensResult:
    """The logit lens at every layer boundary (embeddings, after each block; ``include_mid``
    adds the mid-block residuals) for each prompt at ``positions``.

    ``prompts``: a prompt, a list (left-padded and batched, ``batch_size`` per forward pass)
    or tokens ``[batch, pos]``. ``positions``: an int, a list of ints (into each prompt's own
    tokens, BOS = 0; -1 = its last token) or ``"all"``. ``targets``: one single-token target
    (string or id) for all prompts, or one per prompt. ``return_logits`` keeps the full lens
    logits ``[n_layers, batch, n_pos, d_vocab]`` (large). One forward pass per batch,
    caching only the residual stream. ``lens``: a trained
    :class:`~gpt2_interp.analysis.tuned_lens.TunedLens` decodes each boundary through its
    translator first (the tuned lens; it must have been trained for this model's weights).
    ``k`` (default 10): how many top tokens each cell keeps. ``progress``: a progress bar over
    batches (None: shown when there are more than 4).

    Returns a :class:`LensResult` with tensors ``[n_layers, batch, n_pos(, k)]`` on the CPU, where
    ``n_layers`` is ``n_layer + 1`` boundaries (``2·n_layer + 1`` with ``include_mid``).

    Refused: ``k`` < 1; an empty prompt list or token tensor, an unknown ``positions`` string, an
    empty position list, a number of targets that is neither 1 nor the number of prompts, a
    target that is not one token, ``include_mid`` with a tuned lens, a tuned lens trained for
    other weights and non-finite lens logits (ValueError); a position outside the shortest prompt
    (IndexError).
    """
    k = check_count(k, "k")
    if lens is not None:
        if include_mid:
            raise ValueError("a tuned lens has translators for the layer boundaries only; use include_mid=False")
        lens.check(model)
    tokens, lengths, texts = _tokens(model, prompts)
    batch, width = tokens.shape
    cols, valid = _columns(positions, lengths, width)
    tids = _target_list(model, targets, batch)
    names, labels = _resid_names(model, include_mid)
    starts = range(0, batch, batch_size)
    chunks = [
        _lens_chunk(
            model,
            tokens[s : s + batch_size],
            lengths[s : s + batch_size],
            cols[s : s + batch_size],
            names,
            min(k, model.cfg.d_vocab),
            None if tids is None else tids[s : s + batch_size],
            return_logits,
            lens,
        )
        for s in progress_bar(
            starts,
            desc="tuned lens" if lens is not None else "logit lens",
            enabled=progress if progress is not None else len(starts) > 4,
        )
    ]
    out = {key: torch.cat([c[key] for c in chunks], dim=1) for key in chunks[0]}  # [n_layers, batch, n_pos(, k)]
    for key, fill in (("ids", -1), ("probs", float("nan")), ("tp", float("nan")), ("tl", float("nan")), ("tr", -1)):
        if key in out:
            out[key] = out[key].masked_fill(~valid.view(1, batch, -1, *[1] * (out[key].ndim - 3)), fill).cpu()
    pos_index = torch.where(valid, cols - (width - lengths)[:, None], torch.full_like(cols, -1))
    str_tokens = [
        [model.tokenizer.token_str(int(i)) for i in tokens[b, width - int(lengths[b]) :]] for b in range(batch)
    ]
    top_tokens = [
        [[[model.tokenizer.token_str(i) if i >= 0 else "" for i in cell] for cell in row] for row in layer]
        for layer in out["ids"].tolist()
    ]
    return LensResult(
        prompts=texts,
        layers=labels,
        str_tokens=str_tokens,
        positions=pos_index.cpu(),
        valid=valid.cpu(),
        top_ids=out["ids"],
        top_tokens=top_tokens,
        top_probs=out["probs"],
        targets=None if tids is None else [model.tokenizer.token_str(i) for i in tids],
        target_ids=tids,
        target_prob=out.get("tp"),
        target_logit=out.get("tl"),
        target_rank=out.get("tr"),
        logits=out.get("logits"),
        lens="logit lens" if lens is None else "tuned lens",
    )


# ---------------------------------------------------------------------------- direct logit attribution
@boundary
@dataclass
class DLAResult(Result):
    """A logit (or logit difference) split into the direct contributions of each component.

    ``parts`` ``[n_parts]`` with ``labels`` (``embed``, ``pos_embed``, ``L{i}.attn``, ``L{i}.mlp``)
    sum to ``logit - ln_bias``; ``head_parts`` ``[n_layer, n_head]`` plus ``b_O_parts``
    ``[n_layer]`` sum to the attention parts. ``scale`` is ln_final's scale at the position.

    ``prompt`` and its ``str_tokens`` (BOS included); ``position``: the non-negative index read;
    ``target`` and ``baseline`` (None without one): the tokens as strings; ``logit``: the model's
    logit (difference) there; ``ln_bias``: ``b · (W_U[:, target] - W_U[:, baseline])``.
    """

    result_kind = "direct logit attribution"

    prompt: str
    str_tokens: list[str]
    position: int
    target: str
    baseline: str | None
    labels: list[str]
    parts: torch.Tensor
    head_parts: torch.Tensor | None
    b_O_parts: torch.Tensor
    ln_bias: float
    logit: float
    scale: float

    @property
    def total(self) -> float:
        """Sum of the parts plus the LN bias term: equals ``logit`` up to float error."""
        return float(self.parts.sum()) + self.ln_bias

    @property
    def what(self) -> str:
        """What is attributed, as text: ``logit(' Paris')`` or ``logit(' Paris') − logit(' Rome')``."""
        return f"logit({self.target!r})" + (f" − logit({self.baseline!r})" if self.baseline is not None else "")

    def table(self) -> str:
        """A header row naming the columns, then each component's direct contribution to the logit
        (or logit difference) through the frozen final LayerNorm scale, the LN bias term and their
        sum; then the model's own value and the largest heads."""
        rows = [[lab, f"{float(v):+.4f}"] for lab, v in zip(self.labels, self.parts)]
        rows += [["ln_final.b", f"{self.ln_bias:+.4f}"], ["sum", f"{self.total:+.4f}"]]
        lines = [f"{self.what} at position {self.position} ({self.str_tokens[self.position]!r}) of {self.prompt!r}"]
        lines += format_table(["component", f"direct effect on {self.what}"], rows, right=[False, True])
        lines += ["", f"the model's {self.what}: {self.logit:+.4f}"]
        if self.head_parts is not None:
            top = self.head_parts.flatten().abs().topk(min(5, self.head_parts.numel())).indices
            nh = self.head_parts.shape[1]
            lines.append(
                "largest heads: "
                + ", ".join(f"L{int(i) // nh}H{int(i) % nh} {float(self.head_parts.flatten()[i]):+.3f}" for i in top)
            )
        return "\n".join(lines)

    def plot(self, **kwargs: Any) -> Figure:
        """Bar chart of the parts (and a layer × head heatmap when per-head parts exist)."""
        from ..plots.lens import plot_attribution

        return plot_attribution(self, **kwargs)


@boundary
def logit_direction(model: HookedGPT2, target: Target, baseline: Target | None = None) -> torch.Tensor:
    """``w ⊙ (W_U[:, t] - W_U[:, b])`` ``[d_model]`` (``w``: ln_final's gain, ``1 + w`` for Gemma's norm): what a
    centred, scaled residual is dotted with
    (``t``: the single-token ``target``, ``b``: the ``baseline``, left out when None)."""
    u = model.W_U[:, model.to_single_token(target)]
    if baseline is not None:
        u = u - model.W_U[:, model.to_single_token(baseline)]
    return model.ln_final.gain * u


@boundary
def direct_effect(
    component: torch.Tensor, direction: torch.Tensor, scale: torch.Tensor | float, centre: bool = True
) -> torch.Tensor:
    """``(c - mean(c)) / scale · direction`` for ``component [..., d_model]`` → ``[...]``; without the
    mean when ``centre`` is False (RMSNorm: ``model.ln_final.centred``)."""
    c = component - component.mean(-1, keepdim=True) if centre else component
    return (c @ direction) / scale


def _through_post_norm(
    model: HookedGPT2, heads: torch.Tensor, b_O: torch.Tensor, cache: Any, pos: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each head's output ``heads [n_layer, n_head, d_model]`` and the output bias ``b_O [n_layer, d_model]`` as
    each block's post-attention norm (``ln1_post``) passes them to the residual with the scale of the run:
    ``(x − mean(x)) / scale · w`` (no centring for RMSNorm); the norm's own bias joins ``b_O``'s term. The
    parts then sum to ``hook_attn_out``."""
    outs, biases = [], []
    for i, block in enumerate(model.blocks):
        ln = block.ln1_post
        s = cache[f"blocks.{i}.ln1_post.hook_scale"][0, pos].float()
        x = torch.cat([heads[i], b_O[i][None]])  # [n_head + 1, d_model]
        x = (x - x.mean(-1, keepdim=True) if ln.centred else x) / s * ln.gain.float()
        bias = getattr(ln, "b", None)
        outs.append(x[:-1])
        biases.append(x[-1] + (0 if bias is None else bias.float()))
    return torch.stack(outs), torch.stack(biases)


@boundary
@torch.no_grad()
def logit_attribution(
    model: HookedGPT2,
    prompt: str,
    target: Target,
    baseline: Target | None = None,
    position: int = -1,
    per_head: bool = True,
) -> DLAResult:
    """Direct logit attribution of ``target``'s logit (minus ``baseline``'s) at ``position``.

    Uses ln_final's scale of the actual run, so the parts (token and position embeddings,
    each attention and MLP output; per head via ``hook_z @ W_O`` with ``b_O`` apart) sum
    exactly to the model's logit (difference) minus the LN bias term ``b · W_U[:, t]`` (plus GPT-J's head bias
    ``b_U[t]``). Where each attention output is normalised before it joins the residual (Gemma, OLMo 2), the
    heads and ``b_O`` pass through that norm at the run's scale, so they still sum to the attention part.
    Where the logits are soft-capped (Gemma 2's ``cap · tanh(x / cap)``), the parts split the readout before the
    cap (``unembed.hook_out``), which the cap maps monotonically to the model's logit: ``logit`` is then that
    uncapped logit (difference).

    ``prompt``: one string (BOS is prepended); ``target``/``baseline``: single tokens (strings or
    ids); ``position``: index into the prompt's tokens, BOS = 0 (default -1, the last);
    ``per_head`` (default True) also splits each attention output per head (``head_parts``
    ``[n_layer, n_head]``). Returns a :class:`DLAResult`. A non-string prompt raises TypeError, a
    position out of range IndexError, a target or baseline that is not one token ValueError.
    """
    n = model.cfg.n_layer
    tokens, pos = prompt_position(model, prompt, position, "logit_attribution")
    learned = "hook_pos_embed" in model.hook_dict  # rotary models have no position embedding
    names = ["hook_embed", "ln_final.hook_scale", "unembed.hook_out"] + (["hook_pos_embed"] if learned else [])
    post = model.cfg.norm_position != "pre"  # Gemma, OLMo 2: the attention output is normalised before it is added
    for i in range(n):
        names += [hook_name("attn_out", i), hook_name("mlp_out", i)] + ([hook_name("z", i)] if per_head else [])
        names += [f"blocks.{i}.ln1_post.hook_scale"] if per_head and post else []
    _, cache = model.run_with_cache(tokens, names_filter=names)
    logits = cache["unembed.hook_out"]  # the linear readout: before Gemma 2's final soft-cap, the logits elsewhere
    direction = logit_direction(model, target, baseline).float()  # [d_model]
    scale = cache["ln_final.hook_scale"][0, pos].float()  # [1]

    def at(name: str) -> torch.Tensor:
        return cache[name][0, pos].float()  # [d_model] (or [n_head, d_head] for z)

    comps, labels = [at("hook_embed")], ["embed"]
    if learned:
        comps, labels = [*comps, at("hook_pos_embed")], [*labels, "pos_embed"]
    centre = model.ln_final.centred
    for i in range(n):
        comps += [at(hook_name("attn_out", i)), at(hook_name("mlp_out", i))]
        labels += [f"L{i}.attn", f"L{i}.mlp"]
    parts = direct_effect(torch.stack(comps), direction, scale, centre)  # [n_parts]
    zeros = torch.zeros(model.cfg.d_model, device=model.device)
    b_O = torch.stack([zeros if b.attn.b_O is None else b.attn.b_O.float() for b in model.blocks])  # [n_layer, d_model]
    head_parts = None
    if per_head:
        z = torch.stack([at(hook_name("z", i)) for i in range(n)])  # [n_layer, n_head, d_head]
        W_O = torch.stack([b.attn.W_O.float() for b in model.blocks])  # [n_layer, n_head, d_head, d_model]
        heads = einsum(z, W_O, "l h dh, l h dh d -> l h d")
        if post:  # the post-attention norm is linear at the run's scale: each head and b_O go through it
            heads, b_O = _through_post_norm(model, heads, b_O, cache, pos)
        head_parts = direct_effect(heads, direction, scale, centre)  # [n_layer, n_head]
    b_O_parts = direct_effect(b_O, direction, scale, centre)
    tid = model.to_single_token(target)
    ln_b = zeros if model.ln_final.b is None else model.ln_final.b.float()  # RMSNorm: no bias term
    b_U = model.unembed.b_U.float()  # zeros but for GPT-J's head bias
    ln_bias = ln_b @ model.W_U[:, tid].float() + b_U[tid]
    logit = logits[0, pos, tid].float()
    if baseline is not None:
        bid = model.to_single_token(baseline)
        ln_bias = ln_bias - ln_b @ model.W_U[:, bid].float() - b_U[bid]
        logit = logit - logits[0, pos, bid].float()
    return DLAResult(
        prompt=prompt,
        str_tokens=model.to_str_tokens(tokens[0]),
        position=pos,
        target=model.tokenizer.token_str(tid),
        baseline=None if baseline is None else model.tokenizer.token_str(model.to_single_token(baseline)),
        labels=labels,
        parts=parts.cpu(),
        head_parts=None if head_parts is None else head_parts.cpu(),
        b_O_parts=b_O_parts.cpu(),
        ln_bias=float(ln_bias),
        logit=float(logit),
        scale=float(scale),
    )
