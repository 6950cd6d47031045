"""MLP value vectors read in vocabulary space (Geva et al. 2021, 2022; LM-Debugger).

An MLP writes ``Σ_i m_i · v_i`` to the residual stream, with ``m_i`` the neuron's
activation (``mlp.hook_post``) and ``v_i = W_out[i]`` its value vector. Projecting
``v_i`` onto the unembedding says which tokens the neuron promotes when it fires. Where the
block normalises its MLP output before adding it (Gemma's and OLMo 2's post-feedforward norm),
``v_i`` is ``W_out[i]`` times that norm's gain (:func:`value_vectors`): the norm's ``1/scale`` is
one positive number per position, so the direction it writes is that, not ``W_out[i]``.

What ``apply_ln=True`` applies, exactly: ``score[t] = Σ_d v[d] · w[d] · W_U[d, t]`` with
``w`` ln_final's gain. Not applied: ln_final's centring (subtracting ``mean(v)``; it
shifts scores by ``mean(v) · Σ_d w[d] W_U[d, t]``), its ``1/scale`` (a positive number
per position, which does not change any ranking) and its bias ``b`` (a per-token
constant that does not depend on ``v``), nor the head's bias (GPT-J; a per-token constant) and
the final soft-cap (Gemma 2; monotone, so no ranking changes). ``apply_ln=False`` is the raw ``v @ W_U``.
On a real prompt, :func:`top_subupdates` reports the exact direct effect instead
(centred, divided by the run's scale — the same formula as ``logit_attribution``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..core.boundary import boundary
from ..core.checks import check_count
from ..core.progress import progress_bar
from ..core.result import Result
from ..core.tables import format_table
from ..model.hooks import hook_name
from .lens import direct_effect, logit_direction
from .tokens import prompt_position

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..model import HookedGPT2

Token = str | int
CHUNK = 1024  # vectors per [chunk, d_vocab] score matmul (1024 × 50257 fp32 ≈ 206 MB)


def _check_neurons(model: HookedGPT2, neurons: Sequence[int] | torch.Tensor | None) -> torch.Tensor:
    d = model.cfg.d_mlp
    if neurons is None:
        return torch.arange(d, device=model.device)
    idx = torch.as_tensor(neurons, dtype=torch.long, device=model.device).flatten()
    if idx.numel() == 0:
        raise ValueError("neurons is empty: give neuron indices, or None for all")
    if int(idx.min()) < 0 or int(idx.max()) >= d:
        raise IndexError(f"neuron indices must be in 0..{d - 1} (d_mlp = {d}); got {idx.tolist()[:8]}")
    return idx


def _readout_in(model: HookedGPT2, vectors: torch.Tensor, apply_ln: bool) -> torch.Tensor:
    """Vectors ``[n, d_model]`` as the unembedding sees them: times ln_final's ``w`` if ``apply_ln``."""
    return vectors * model.ln_final.gain if apply_ln else vectors


@boundary
def vocab_scores(model: HookedGPT2, vectors: torch.Tensor, apply_ln: bool = True) -> torch.Tensor:
    """Vocabulary scores ``[n, d_vocab]`` of ``vectors [n, d_model]`` (see the module doc): the linear
    readout ``v · w · W_U``, without the head's bias (GPT-J) or the final soft-cap (Gemma 2), which are a
    per-token constant and a monotone map."""
    return _readout_in(model, vectors, apply_ln) @ model.W_U


@boundary
def value_vectors(model: HookedGPT2, layer: int, neurons: Sequence[int] | torch.Tensor | None = None) -> torch.Tensor:
    """What each neuron of ``layer``'s MLP writes to the residual stream per unit activation, ``[n, d_model]``:
    ``W_out[neurons]`` (all neurons by default), passed through the block's post-feedforward norm where it has
    one (Gemma's and OLMo 2's ``ln2_post``: times its gain, centred first for a LayerNorm), up to that norm's
    ``1/scale``, a positive number per position that no ranking depends on. Refused: a layer or neuron index
    out of range (IndexError), an empty neuron list (ValueError)."""
    layer = model.check_layer(layer)
    block = model.blocks[layer]
    V = block.mlp.W_out[_check_neurons(model, neurons)]
    post = getattr(block, "ln2_post", None)
    if post is None:
        return V
    return (V - V.mean(-1, keepdim=True) if post.centred else V) * post.gain


@torch.no_grad()
def _top_bottom(
    model: HookedGPT2, vectors: torch.Tensor, k: int, apply_ln: bool, progress: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(top_scores, top_ids, bottom_scores, bottom_ids)``, each ``[n, k]``, of ``vectors [n, d_model]``,
    CHUNK vectors per matmul."""
    k = min(k, model.cfg.d_vocab)
    outs: list[tuple[torch.Tensor, ...]] = []
    for s in progress_bar(range(0, len(vectors), CHUNK), desc="vocab projection", enabled=progress):
        scores = vocab_scores(model, vectors[s : s + CHUNK], apply_ln).float()  # [chunk, d_vocab]
        ts, ti = scores.topk(k, dim=-1)
        bs, bi = scores.topk(k, dim=-1, largest=False)
        outs.append((ts, ti, bs, bi))
    ts, ti, bs, bi = (torch.cat(parts).cpu() for parts in zip(*outs))
    return ts, ti, bs, bi


def _strs(model: HookedGPT2, ids: torch.Tensor) -> list[list[str]]:
    return [[model.tokenizer.token_str(int(i)) for i in row] for row in ids]


@boundary
@dataclass
class VocabProjection(Result):
    """Top-``k`` and bottom-``k`` tokens (and scores) of vectors projected onto the vocabulary,
    ``[n, k]`` each, one row per ``labels`` entry (``L5.N123`` for a neuron's value vector).

    ``top_ids``/``top_scores`` and ``bottom_ids``/``bottom_scores`` ``[n, k]`` with ``top_tokens`` and
    ``bottom_tokens`` (strings); ``apply_ln``: whether ln_final's gain was applied (see the module
    doc); ``layer`` and ``neurons``: which value vectors the rows are (None for arbitrary vectors)."""

    result_kind = "vocabulary projection"

    labels: list[str]
    top_ids: torch.Tensor
    top_tokens: list[list[str]]
    top_scores: torch.Tensor
    bottom_ids: torch.Tensor
    bottom_tokens: list[list[str]]
    bottom_scores: torch.Tensor
    apply_ln: bool
    layer: int | None = None
    neurons: list[int] | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def select(self, rows: Sequence[int]) -> VocabProjection:
        """The given rows only, in that order."""
        rows = list(rows)

        def pick(xs: Sequence[Any]) -> list[Any]:
            return [xs[i] for i in rows]

        return VocabProjection(
            pick(self.labels),
            self.top_ids[rows],
            pick(self.top_tokens),
            self.top_scores[rows],
            self.bottom_ids[rows],
            pick(self.bottom_tokens),
            self.bottom_scores[rows],
            self.apply_ln,
            self.layer,
            None if self.neurons is None else pick(self.neurons),
        )

    def strongest(self, n: int) -> VocabProjection:
        """The ``n`` rows whose top token scores highest (the most strongly promoting vectors)."""
        return self.select(self.top_scores[:, 0].argsort(descending=True)[:n].tolist())

    def table(self, k: int | None = None, rows: int | None = None) -> str:
        """A header row naming the columns, then two rows per vector: its ``k`` highest-scoring
        tokens (promoted) and its ``k`` lowest (suppressed), each with its score — the vector's dot
        product with the token's unembedding (through ``ln_final``'s gain when ``apply_ln``). ``k``: tokens per
        row (default: all kept); ``rows``: the first vectors shown (default: all)."""
        k = k or self.top_scores.shape[1]
        body = []
        for r in range(len(self.labels) if rows is None else min(rows, len(self.labels))):
            for sign, toks, scores in (
                ("+ top", self.top_tokens[r], self.top_scores[r]),
                ("− bottom", self.bottom_tokens[r], self.bottom_scores[r]),
            ):
                body.append(
                    [self.labels[r], sign, " ".join(f"{t!r}({float(v):.2f})" for t, v in zip(toks[:k], scores[:k]))]
                )
        unembed = "(w ⊙ W_U[:, t])" if self.apply_ln else "W_U[:, t]"
        return "\n".join(format_table(["vector", "end", f"tokens (score = v · {unembed})"], body, indent=""))

    def plot(self, rows: int | None = None, **kwargs: Any) -> Figure:
        """Top/bottom token bars of the first ``rows`` vectors (default: all, at most 64)."""
        from ..plots.lens import plot_vocab

        return plot_vocab(self, rows=rows, **kwargs)


def _projection(
    model: HookedGPT2,
    vectors: torch.Tensor,
    labels: list[str],
    k: int,
    apply_ln: bool,
    progress: bool = False,
    **kw: Any,
) -> VocabProjection:
    ts, ti, bs, bi = _top_bottom(model, vectors, k, apply_ln, progress)
    return VocabProjection(labels, ti, _strs(model, ti), ts, bi, _strs(model, bi), bs, apply_ln, **kw)


@boundary
@torch.no_grad()
def neuron_vocab(
    model: HookedGPT2,
    layer: int,
    neurons: Sequence[int] | torch.Tensor | None = None,
    k: int = 10,
    apply_ln: bool = True,
) -> VocabProjection:
    """Top/bottom-``k`` vocabulary tokens (default 10) of the value vectors ``W_out[layer][neurons]``
    (all neurons by default), scored as the module doc says (``apply_ln``, default True: times
    ln_final's gain). Returns a :class:`VocabProjection` with ``[n_neurons, k]`` rows. Refused: ``k`` <
    1 or an empty neuron list (ValueError), a layer or neuron index out of range (IndexError)."""
    k = check_count(k, "k")
    layer = model.check_layer(layer)
    idx = _check_neurons(model, neurons)
    V = value_vectors(model, layer, idx)  # [n, d_model]
    return _projection(
        model,
        V,
        [f"L{layer}.N{int(i)}" for i in idx],
        k,
        apply_ln,
        progress=len(idx) > 4 * CHUNK,
        layer=layer,
        neurons=idx.tolist(),
    )


@boundary
@torch.no_grad()
def project(
    model: HookedGPT2, vector: torch.Tensor, k: int = 10, apply_ln: bool = True, labels: Sequence[str] | None = None
) -> VocabProjection:
    """Top/bottom-``k`` tokens (default 10) of any direction(s) ``vector`` ``[d_model]`` or ``[n, d_model]``
    (a residual, a ``W_in`` column, an edit's ``v*``), by the same code path as :func:`neuron_vocab`
    (``apply_ln`` as there). ``labels`` name the rows (default ``vector``/``vector i``). Another shape
    raises ValueError."""
    k = check_count(k, "k")
    v = torch.as_tensor(vector).to(model.device, model.dtype)
    v = v[None] if v.ndim == 1 else v
    if v.ndim != 2 or v.shape[-1] != model.cfg.d_model:
        raise ValueError(
            f"vector must be [d_model] or [n, d_model] with d_model = {model.cfg.d_model}; got {tuple(v.shape)}"
        )
    labels = (
        list(labels) if labels is not None else (["vector"] if len(v) == 1 else [f"vector {i}" for i in range(len(v))])
    )
    return _projection(model, v, labels, k, apply_ln)


# ---------------------------------------------------------------------------- neuron search
@boundary
@dataclass
class NeuronSearch(Result):
    """Neurons ranked by how much their value vectors promote ``tokens``; iterates as
    ``(layer, neuron, score)`` tuples. ``top_tokens`` are each neuron's own top tokens.

    ``tokens``: the searched tokens (strings); ``layers``/``neurons``/``scores`` ``[k]``: the ranked
    neurons, best first; ``apply_ln``: whether ln_final's gain weighted the scores; ``baseline``: what
    each neuron's mean score was subtracted over (``"vocabulary"``, ``"contrast"`` or None)."""

    result_kind = "neuron search"

    tokens: list[str]
    layers: list[int]
    neurons: list[int]
    scores: torch.Tensor
    top_tokens: list[list[str]]
    apply_ln: bool
    baseline: str | None  # what each neuron's mean score was subtracted over: "vocabulary", "contrast" or None

    def __iter__(self) -> Iterator[tuple[int, int, float]]:
        return iter(zip(self.layers, self.neurons, self.scores.tolist()))

    def __len__(self) -> int:
        return len(self.neurons)

    def __getitem__(self, i: int) -> tuple[int, int, float]:
        return self.layers[i], self.neurons[i], float(self.scores[i])

    def table(self, k: int = 8) -> str:
        """What the score is, then a header row naming the columns and one row per neuron: its
        rank, name, score and its own ``k`` top tokens."""
        what = ", ".join(map(repr, self.tokens[:6])) + (" …" if len(self.tokens) > 6 else "")
        score = (
            f"v · {'(w ⊙ ' if self.apply_ln else '('}W_U[:, t])"
            f"{f', minus its {self.baseline} mean' if self.baseline else ''}"
        )
        lines = [f"neurons promoting {what}  (score = {score})"]
        rows = [
            [f"{r + 1}", f"L{l}.N{i}", f"{s:+.3f}", " ".join(map(repr, self.top_tokens[r][:k]))]
            for r, (l, i, s) in enumerate(self)
        ]
        lines += format_table(
            ["rank", "neuron", "score", "the neuron's top tokens"], rows, right=[True, False, True, False]
        )
        return "\n".join(lines)

    def plot(self, **kwargs: Any) -> Figure:
        from ..plots.lens import plot_neuron_search

        return plot_neuron_search(self, **kwargs)


def _token_ids(model: HookedGPT2, token_or_tokens: Token | Sequence[Token]) -> list[int]:
    items = [token_or_tokens] if isinstance(token_or_tokens, (str, int)) else list(token_or_tokens)
    if not items:
        raise ValueError("no tokens given: pass a token such as ' Paris' or a list of tokens")
    return [model.to_single_token(t) for t in items]


def _layers(model: HookedGPT2, layers: int | Sequence[int] | None) -> list[int]:
    if layers is None:
        return list(range(model.cfg.n_layer))
    return [model.check_layer(l) for l in ([layers] if not isinstance(layers, (list, tuple, range)) else layers)]


@boundary
@torch.no_grad()
def find_neurons(
    model: HookedGPT2,
    token_or_tokens: Token | Sequence[Token],
    k: int = 20,
    layers: int | Sequence[int] | None = None,
    apply_ln: bool = True,
    relative: bool = False,
    n_tokens: int = 10,
    contrast: Sequence[Token] | None = None,
) -> NeuronSearch:
    """The ``k`` neurons (over ``layers``, default all) whose value vectors most promote a token,
    or a set of tokens on average: ``score = v · (w ⊙ W_U[:, t])`` (``apply_ln``; raw ``W_U``
    otherwise), averaged over the tokens. ``relative`` subtracts each neuron's mean score over
    the whole vocabulary, so a neuron that raises every logit does not rank first; ``contrast``
    subtracts its mean score over those tokens instead (e.g. every token the model was trained
    to produce: the set's real competitors).

    ``token_or_tokens``: one token or a list (strings or ids, each a single token); ``n_tokens``
    (default 10): how many top tokens of each found neuron to list. Returns a :class:`NeuronSearch`.
    Refused: ``k`` < 1, no tokens, a string that is not one token, and ``relative`` together with
    ``contrast`` (ValueError); a layer out of range (IndexError)."""
    k = check_count(k, "k")
    ids = _token_ids(model, token_or_tokens)
    ls = _layers(model, layers)
    if relative and contrast is not None:
        raise ValueError("give relative=True (contrast with the whole vocabulary) or contrast tokens, not both")
    w = model.ln_final.gain if apply_ln else torch.ones_like(model.ln_final.w)
    readout = (w[:, None] * model.W_U[:, ids]).mean(-1)  # [d_model]
    if relative:
        readout = readout - w * model.W_U.mean(-1)
    elif contrast is not None:
        readout = readout - w * model.W_U[:, _token_ids(model, contrast)].mean(-1)
    W_out = torch.stack([value_vectors(model, l) for l in ls])  # [n_layers, d_mlp, d_model]
    scores = (W_out @ readout).float()  # [n_layers, d_mlp]
    top = scores.flatten().topk(min(k, scores.numel()))
    d = model.cfg.d_mlp
    li = [ls[int(i) // d] for i in top.indices]
    ni = [int(i) % d for i in top.indices]
    V = W_out[[ls.index(l) for l in li], ni]
    _, tids, _, _ = _top_bottom(model, V, n_tokens, apply_ln)
    return NeuronSearch(
        [model.tokenizer.token_str(i) for i in ids],
        li,
        ni,
        top.values.cpu(),
        _strs(model, tids),
        apply_ln,
        "vocabulary" if relative else "contrast" if contrast is not None else None,
    )


# ---------------------------------------------------------------------------- sub-updates on a prompt
@boundary
@dataclass
class SubupdateResult(Result):
    """The largest MLP sub-updates ``m_i · v_i`` at one position of a prompt, largest norm first.

    ``top_tokens`` project ``m_i · v_i`` (sign included) onto the vocabulary; ``target_effects``
    are their exact direct effects on the target's logit (centred, / ln_final's scale).

    ``prompt``, ``position`` (non-negative, BOS = 0) and its ``token``; per sub-update ``[k]``:
    ``layers``, ``neurons``, ``activations`` (``m_i``), ``norms`` (``|m_i| · ‖v_i‖``), ``top_tokens``
    and ``top_scores`` ``[k, n_tokens]``; ``target`` and ``target_effects`` ``[k]`` when a target
    was given.
    """

    result_kind = "MLP sub-updates"

    prompt: str
    position: int
    token: str
    layers: list[int]
    neurons: list[int]
    activations: torch.Tensor
    norms: torch.Tensor
    top_tokens: list[list[str]]
    top_scores: torch.Tensor
    target: str | None = None
    target_effects: torch.Tensor | None = None

    def table(self, k: int = 6) -> str:
        """A header row naming the columns, then one row per sub-update ``m_i·v_i``: the neuron, its
        activation ``m_i``, the update's norm ``|m_i|·‖v_i‖``, with a target its direct effect on the
        target's logit, and the update's top tokens. ``k``: top tokens shown per row."""
        lines = [f"MLP sub-updates at position {self.position} ({self.token!r}) of {self.prompt!r}"]
        header = ["neuron", "activation m_i", "norm |m_i|·‖v_i‖"]
        if self.target_effects is not None:
            header.append(f"logit({self.target!r}) effect")
        header.append("top tokens of m_i·v_i")
        rows = []
        for r in range(len(self.neurons)):
            row = [
                f"L{self.layers[r]}.N{self.neurons[r]}",
                f"{float(self.activations[r]):+.3f}",
                f"{float(self.norms[r]):.3f}",
            ]
            if self.target_effects is not None:
                row.append(f"{float(self.target_effects[r]):+.3f}")
            rows.append([*row, " ".join(map(repr, self.top_tokens[r][:k]))])
        right = [False, True, True] + ([True] if self.target_effects is not None else []) + [False]
        return "\n".join(lines + format_table(header, rows, right=right, indent=""))

    def plot(self, **kwargs: Any) -> Figure:
        from ..plots.lens import plot_subupdates

        return plot_subupdates(self, **kwargs)


@boundary
@torch.no_grad()
def top_subupdates(
    model: HookedGPT2,
    prompt: str,
    position: int = -1,
    layer: int | None = None,
    k: int = 20,
    target: Token | None = None,
    n_tokens: int = 10,
    apply_ln: bool = True,
) -> SubupdateResult:
    """On a real prompt, the ``k`` neurons (of ``layer``, or all layers) whose contribution
    ``m_i · v_i`` at ``position`` has the largest norm ``|m_i| · ‖v_i‖``, with the top tokens of
    that contribution and, given a ``target``, its direct effect on the target's logit.

    ``position``: index into the prompt's tokens, BOS = 0 (default -1, the last); ``k`` default 20;
    ``n_tokens`` (default 10) top tokens per sub-update, scored with ln_final's gain when
    ``apply_ln`` (default True). Returns a :class:`SubupdateResult`. Refused: ``k`` < 1 or a target
    that is not one token (ValueError), a non-string prompt (TypeError), a layer or position out of
    range (IndexError)."""
    k = check_count(k, "k")
    ls = _layers(model, layer)
    tokens, pos = prompt_position(model, prompt, position, "top_subupdates")
    post = model.cfg.norm_position != "pre"  # the MLP output is normalised before it joins the residual
    names = [hook_name("post", l) for l in ls] + (["ln_final.hook_scale"] if target is not None else [])
    names += [f"blocks.{l}.ln2_post.hook_scale" for l in ls] if post else []
    # ln_final (and its scale hook) only runs when logits are asked for
    _, cache = model.run_with_cache(tokens, names_filter=names, return_type=None if target is None else "logits")
    m = torch.stack([cache[hook_name("post", l)][0, pos] for l in ls])  # [n_layers, d_mlp]
    W_out = torch.stack([value_vectors(model, l) for l in ls])  # [n_layers, d_mlp, d_model]
    if post:  # the post-feedforward norm's scale of this run: W_out rows become what reaches the residual
        W_out = W_out / torch.stack([cache[f"blocks.{l}.ln2_post.hook_scale"][0, pos] for l in ls])[:, None]
    norms = m.abs() * W_out.norm(dim=-1)  # [n_layers, d_mlp]
    top = norms.flatten().topk(min(k, norms.numel()))
    d = model.cfg.d_mlp
    li = [int(i) // d for i in top.indices]
    ni = [int(i) % d for i in top.indices]
    acts = m[li, ni]  # [k]
    updates = acts[:, None] * W_out[li, ni]  # [k, d_model]
    ts, tids, _, _ = _top_bottom(model, updates, n_tokens, apply_ln)
    effects = None
    if target is not None:
        scale = cache["ln_final.hook_scale"][0, pos].float()
        effects = direct_effect(
            updates.float(), logit_direction(model, target).float(), scale, model.ln_final.centred
        ).cpu()
    return SubupdateResult(
        prompt=prompt,
        position=pos,
        token=model.tokenizer.token_str(int(tokens[0, pos])),
        layers=[ls[i] for i in li],
        neurons=ni,
        activations=acts.float().cpu(),
        norms=top.values.float().cpu(),
        top_tokens=_strs(model, tids),
        top_scores=ts,
        target=None if target is None else model.tokenizer.token_str(model.to_single_token(target)),
        target_effects=effects,
    )
