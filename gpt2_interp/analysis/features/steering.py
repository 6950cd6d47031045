"""Steering directions, and the measured effect of adding one to the model.

Directions (each a float32 vector of the hook's per-position shape, ``[d_model]`` on the residual stream):

* :func:`mean_difference`: the difference of means over contrast pairs,
  ``v = mean_i h(positive_i) − mean_i h(negative_i)`` at a hook and a position (the last token, or the mean
  over a prompt's tokens) — what ``steering-vectors`` (``train_steering_vector``, mean aggregator) and
  ActAdd/CAA build;
* :func:`probe_direction`: a linear probe's weight vector in the activation's own space
  (:meth:`~gpt2_interp.analysis.probes.ProbeResult.direction`);
* :func:`decoder_direction`: an SAE latent's decoder row (``W_dec[latent]``, SAELens's layout
  ``[d_sae, d_in]``), from the SAE object or its decoder matrix;
* :func:`as_direction`: any vector, optionally unit-norm.

:func:`steering_curve` measures, over a range of scales (:meth:`HookedGPT2.steer` adds
``scale · direction``), what steering buys and what it costs, on prompts the direction was not built
from: the probability of the target behaviour (the summed next-token probability of a set of target
tokens after held-out prompts), the fluency of unrelated natural text (the steered model's next-token loss
on it) and the drift of the model's predictions on that text (KL from the unsteered next-token
distribution, averaged over its positions).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from ...core.boundary import boundary
from ...core.checks import as_int, check_count, check_index, check_number, check_prompts
from ...core.result import Result, to_jsonable
from ...core.tables import format_table
from ...model.steer import ZeroDirectionWarning

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ...model import HookedGPT2
    from ..probes import ProbeResult

POSITIONS = ("last", "mean")


# ---------------------------------------------------------------------------- directions
@boundary
def as_direction(vector: Any, normalize: bool = False, what: str = "direction") -> torch.Tensor:
    """``vector`` (a tensor, array or list of numbers, ``[d]`` or ``[*shape]``) as a float32 CPU tensor,
    unit-norm with ``normalize`` (a zero vector then raises; without it, a zero vector warns with
    :class:`~gpt2_interp.model.steer.ZeroDirectionWarning`). NaN/inf, an empty or a 0-d value raise
    ValueError naming ``what``."""
    try:
        v = torch.as_tensor(vector).detach().to("cpu", torch.float32)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{what} must be a vector of numbers, got {type(vector).__name__}") from None
    if v.ndim == 0 or v.numel() == 0:
        raise ValueError(f"{what} must be a non-empty vector such as [d_model], got shape {tuple(v.shape)}")
    if not bool(torch.isfinite(v).all()):
        raise ValueError(f"{what} holds NaN or inf")
    if float(v.norm()) == 0:
        if normalize:
            raise ValueError(f"{what} is the zero vector: it has no direction to normalise")
        warnings.warn(
            f"{what} is the zero vector: steering with it changes nothing", ZeroDirectionWarning, stacklevel=3
        )
    if normalize:
        v = v / v.norm()
    return v


@boundary
def probe_direction(
    result: ProbeResult,
    layer: int | str,
    cls: str | int | None = None,
    normalize: bool = True,
    model: HookedGPT2 | None = None,
) -> torch.Tensor:
    """The weight vector ``[d]`` of the probe ``result`` at ``layer`` for class ``cls`` (see
    :meth:`~gpt2_interp.analysis.probes.ProbeResult.direction`): adding it raises that class's logit.
    ``normalize`` (default True) makes it unit-norm; ``model`` is checked to be the probed one."""
    return result.direction(layer, cls, normalize=normalize, model=model)


@boundary
def decoder_direction(sae: Any, latent: int, normalize: bool = False) -> torch.Tensor:
    """The decoder row ``W_dec[latent]`` ``[d_in]`` of a sparse autoencoder: ``sae`` is an object with a
    ``W_dec`` ``[d_sae, d_in]`` attribute (ours, SAELens's) or that matrix itself. ``normalize``: unit-norm
    (SAE decoders usually are already). A latent out of range raises IndexError."""
    w = getattr(sae, "W_dec", sae)
    if not isinstance(w, torch.Tensor) or w.ndim != 2:
        raise TypeError(
            f"decoder_direction takes an SAE with W_dec [d_sae, d_in] or that matrix, got {type(sae).__name__}"
        )
    i = check_index(latent, w.shape[0], "latent", f"the SAE has {w.shape[0]} latents")
    return as_direction(w[i], normalize, what=f"decoder row {i}")


@boundary
@torch.no_grad()
def activations_at(
    model: HookedGPT2,
    prompts: Sequence[str],
    at: str,
    position: str | int = "last",
    batch_size: int = 32,
    prepend_bos: bool = True,
) -> torch.Tensor:
    """Activations ``[n_prompts, *shape]`` (float32, CPU) at hook point ``at``, one per prompt of ``prompts``:
    ``position`` ``"last"`` (the prompt's last token), ``"mean"`` (the mean over its tokens, BOS left
    out) or an int (a token index of the prompt, BOS = 0 when prepended; negatives from the end).
    Prompts run ``batch_size`` at a time, left-padded, caching only ``at``; ``prepend_bos`` (default True)
    puts the tokenizer's BOS first, as ``model.to_tokens`` does."""
    prompts = check_prompts(prompts, "prompts")
    batch_size = check_count(batch_size, "batch_size")
    if isinstance(position, str):
        if position not in POSITIONS:
            raise ValueError(f"position must be one of {POSITIONS} or an int, got {position!r}")
    else:
        position = as_int(position, "position")
    model.hook_points(at)  # an unknown name raises, with the closest names
    bos = 1 if prepend_bos and model.tokenizer.bos_id is not None else 0
    out = []
    for s in range(0, len(prompts), batch_size):
        chunk = prompts[s : s + batch_size]
        tokens, mask = model.tokenize(chunk, prepend_bos=prepend_bos)
        width = tokens.shape[1]
        lengths = mask.sum(-1).tolist() if mask is not None else [width] * len(chunk)
        _, cache = model.run_with_cache(tokens, names_filter=at, attention_mask=mask, return_type=None)
        act = cache[at].float()  # [b, width, *shape]
        if act.ndim < 3 or act.shape[1] != width:
            raise ValueError(f"hook {at!r} gives activations of shape {tuple(act.shape)}, not [batch, pos, ...]")
        w = torch.zeros(len(chunk), width, device=act.device)
        for b, n in enumerate(lengths):
            first = width - n  # left padding: the row's tokens are its last n columns
            if position == "last":
                w[b, width - 1] = 1
            elif position == "mean":
                lo = first + (bos if n > bos else 0)
                w[b, lo:] = 1.0 / (width - lo)
            else:
                if not -n <= int(position) < n:
                    raise IndexError(f"position {position} is outside prompt {s + b} of {n} tokens")
                w[b, first + int(position) % n] = 1
        out.append(torch.einsum("bp,bp...->b...", w, act).cpu())
    return torch.cat(out)


@boundary
def mean_difference(
    model: HookedGPT2,
    positive: Sequence[str],
    negative: Sequence[str],
    at: str,
    position: str | int = "last",
    normalize: bool = False,
    batch_size: int = 32,
    prepend_bos: bool = True,
) -> torch.Tensor:
    """The difference of means ``mean h(positive) − mean h(negative)`` ``[*shape]`` of the activations
    at hook point ``at`` and ``position`` (see :func:`activations_at`): for contrast pairs (equal
    lengths), the mean of the pairs' differences. ``normalize``: unit-norm (the default keeps the
    natural scale, so ``scale=1`` adds one mean difference). ``batch_size`` and ``prepend_bos`` go to
    :func:`activations_at`."""
    pos = activations_at(model, positive, at, position, batch_size, prepend_bos)
    neg = activations_at(model, negative, at, position, batch_size, prepend_bos)
    return as_direction(pos.mean(0) - neg.mean(0), normalize, what="the difference of means")


# ---------------------------------------------------------------------------- the measured effect
@boundary
@dataclass
class SteeringCurve(Result):
    """What adding ``scale · direction`` at hook ``at`` does, for each of ``scales`` ``[n_scales]``:

    - ``target_prob`` ``[n_scales]``: the mean over held-out ``prompts`` of the summed next-token
      probability of the ``target`` tokens (``target_sem``: its standard error over prompts;
      ``shift_sem``: the standard error of the per-prompt shift from the unsteered probability, paired);
    - ``loss`` ``[n_scales]``: the mean next-token cross-entropy (nats/token) on ``n_unrelated`` unrelated
      texts; ``loss_change`` = ``loss / loss(unsteered) − 1`` (the fluency cost, 0.05 = 5% worse);
    - ``kl`` ``[n_scales]``: the mean KL(unsteered ‖ steered) of the next-token distributions over the
      unrelated texts' positions (drift, nats).

    ``baseline_prob``, ``baseline_loss``: the unsteered values; ``direction_norm``: the direction's norm;
    ``method``: how the direction was made (e.g. ``"mean difference at last token"``); ``positions``: the
    steered positions (None: all); ``model_name``: the steered model; ``n_prompts``: the held-out prompts;
    ``n_tokens``: the predicted tokens of the unrelated texts; ``generation_nll`` ``[n_scales]`` (None
    unless asked for): the unsteered model's mean NLL (nats/token) of the steered model's greedy
    continuations of the prompts — the fluency of what steering makes the model write.

    Steering only some positions (e.g. ``[-1]``) leaves the loss of the text before them unchanged: the
    fluency cost then shows in what the model goes on to generate, not in this loss."""

    result_kind = "steering curve"

    model_name: str
    at: str
    method: str
    scales: torch.Tensor
    target: list[str]
    target_prob: torch.Tensor
    target_sem: torch.Tensor
    shift_sem: torch.Tensor
    loss: torch.Tensor
    kl: torch.Tensor
    baseline_prob: float
    baseline_loss: float
    direction_norm: float
    n_prompts: int
    n_unrelated: int
    n_tokens: int
    positions: list[int] | None = None
    generation_nll: torch.Tensor | None = None

    @property
    def loss_change(self) -> torch.Tensor:
        """``loss / baseline_loss − 1`` ``[n_scales]``: the relative rise of the loss on unrelated text."""
        return self.loss / self.baseline_loss - 1

    @property
    def prob_shift(self) -> torch.Tensor:
        """``target_prob − baseline_prob`` ``[n_scales]``."""
        return self.target_prob - self.baseline_prob

    def within_budget(self, max_loss_change: float = 0.05) -> list[int]:
        """Indices of the steered scales (scale ≠ 0) whose ``loss_change`` stays below ``max_loss_change``."""
        return [
            i for i in range(len(self.scales)) if float(self.scales[i]) != 0 and self.loss_change[i] < max_loss_change
        ]

    def _record(self, i: int) -> dict[str, float]:
        return {
            "scale": float(self.scales[i]),
            "target_prob": float(self.target_prob[i]),
            "prob_shift": float(self.prob_shift[i]),
            "shift_sem": float(self.shift_sem[i]),
            "loss_change": float(self.loss_change[i]),
            "kl": float(self.kl[i]),
        }

    def best(self, max_loss_change: float = 0.05) -> dict[str, float] | None:
        """The scale whose target probability is highest among those whose ``loss_change`` stays below
        ``max_loss_change`` (default 5%) and that raise it (``prob_shift`` > 0): ``{scale, target_prob,
        prob_shift, shift_sem, loss_change, kl}``, or None when no steered scale qualifies — none within the
        budget, or none of those raises the target (see :meth:`finding` for which)."""
        ok = [i for i in self.within_budget(max_loss_change) if float(self.prob_shift[i]) > 0]
        if not ok:
            return None
        return self._record(max(ok, key=lambda j: float(self.target_prob[j])))

    def finding(
        self, max_loss_change: float = 0.05, target: str = "P(target)", unrelated: str = "unrelated text"
    ) -> str:
        """One sentence from the numbers, its verbs from their signs: the best scale within the
        ``max_loss_change`` budget (:meth:`best`) with its shift ± the paired standard error and the loss
        change it costs — or, when there is none, that no steered scale stays within the budget, or that
        none within it lifts ``target`` above its unsteered value (the closest one's shift is given), so no
        best scale is named.
        ``target`` and ``unrelated`` name the target probability and the fluency text in the sentence."""
        budget = f"{100 * max_loss_change:g}%"
        n = f"over {self.n_prompts} prompt{'s' if self.n_prompts != 1 else ''}"
        steered = [i for i in range(len(self.scales)) if float(self.scales[i]) != 0]
        if not steered:
            return "No steered scale was measured (every scale is 0): no best scale."
        within = self.within_budget(max_loss_change)
        if not within:
            i = min(steered, key=lambda j: float(self.loss_change[j]))
            return (
                f"No steered scale keeps the loss on {unrelated} within {budget} of the unsteered model's (the "
                f"gentlest, {float(self.scales[i]):g}, {_change(float(self.loss_change[i]))}): no best scale."
            )
        b = self.best(max_loss_change)
        if b is None:
            r = self._record(max(within, key=lambda j: float(self.target_prob[j])))
            of = f" of {len(within)}" if len(within) > 1 else ""
            return (
                f"No steered scale within the {budget} loss budget lifts {target} above its unsteered "
                f"{self.baseline_prob:.3g}: the closest{of}, {r['scale']:g}, "
                f"{_moves(r['prob_shift'], self.baseline_prob, r['target_prob'])} ({r['prob_shift']:+.3g} ± "
                f"{r['shift_sem']:.3g} paired s.e. {n}): no best scale."
            )
        ratio = f", {b['target_prob'] / self.baseline_prob:.1f}×" if self.baseline_prob > 0 else ""
        weak = (
            "; within two paired standard errors of no change"
            if b["prob_shift"] <= 2 * b["shift_sem"] and self.n_prompts > 1
            else ""
        )
        return (
            f"Best scale within the {budget} loss budget: {b['scale']:g}, which raises {target} from "
            f"{self.baseline_prob:.3g} to {b['target_prob']:.3g} ({b['prob_shift']:+.3g} ± {b['shift_sem']:.3g} "
            f"paired s.e. {n}{ratio}{weak}) while the loss on {unrelated} {_change(b['loss_change'])} "
            f"(KL drift {b['kl']:.3f} nats/token)."
        )

    def to_dict(self) -> dict[str, Any]:
        """The fields plus ``loss_change``, ``prob_shift`` and ``best`` (at a 5% loss rise), JSON-ready."""
        d = super().to_dict()
        d.update(loss_change=self.loss_change, prob_shift=self.prob_shift, best=self.best())
        return to_jsonable(d)

    def table(self) -> str:
        """The setting, then one row per scale: P(target) ± s.e., its shift, the loss on unrelated text
        and its relative change, the KL drift (and the plain model's NLL of the steered continuations,
        when measured)."""
        tgt = ", ".join(repr(t) for t in self.target[:6]) + (" …" if len(self.target) > 6 else "")
        head = (
            f"steering {self.model_name} at {self.at} with {self.method} (norm {self.direction_norm:.3g}), "
            f"positions {'all' if self.positions is None else self.positions}; target tokens {tgt} after "
            f"{self.n_prompts} held-out prompts; fluency and KL on {self.n_unrelated} unrelated texts "
            f"({self.n_tokens} tokens)"
        )
        rows = [
            [
                f"{float(s):g}",
                f"{float(p):.4f} ± {float(e):.4f}",
                f"{float(p) - self.baseline_prob:+.4f} ± {float(se):.4f}",
                f"{float(lo):.3f}",
                f"{100 * float(c):+.1f}%",
                f"{float(k):.4f}",
            ]
            for s, p, e, se, lo, c, k in zip(
                self.scales, self.target_prob, self.target_sem, self.shift_sem, self.loss, self.loss_change, self.kl
            )
        ]
        header = ["scale", "P(target) ± s.e.", "shift ± paired s.e.", "loss (nats)", "loss change", "KL drift"]
        if self.generation_nll is not None:
            header.append("NLL of steered text")
            for row, g in zip(rows, self.generation_nll):
                row.append(f"{float(g):.3f}")
        return "\n".join([head, *format_table(header, rows, right=[True] * len(header))])

    def plot(self, **kwargs: Any) -> Figure:
        """P(target), the loss change on unrelated text and the KL drift against the scale
        (:func:`~gpt2_interp.plots.steering.plot_steering_curve`)."""
        from ...plots.steering import plot_steering_curve

        return plot_steering_curve(self, **kwargs)


def _moves(shift: float, before: float, after: float) -> str:
    """``"raises it from A to B"``, ``"lowers it from A to B"`` or ``"leaves it at A"``, by the sign of ``shift``."""
    if shift == 0:
        return f"leaves it at {before:.3g}"
    return f"{'raises' if shift > 0 else 'lowers'} it from {before:.3g} to {after:.3g}"


def _change(loss_change: float) -> str:
    """``"rises 4.3%"``, ``"falls 0.5%"`` or ``"is unchanged"`` for a relative loss change."""
    pct = 100 * loss_change
    if round(pct, 1) == 0:
        return f"is unchanged ({pct:+.1f}%)"
    return f"{'rises' if pct > 0 else 'falls'} {abs(pct):.1f}%"


@boundary
def target_token_ids(model: HookedGPT2, target: Sequence[str | int]) -> list[int]:
    """Token ids of a set of target tokens: ints as they are (checked against the vocabulary), strings
    each of exactly one token (``" le"``, ``" great"``; a string of several tokens raises ValueError
    showing its tokens)."""
    if isinstance(target, (str, int)) or not hasattr(target, "__iter__"):
        raise TypeError(f"target must be a list of token strings or ids, got {type(target).__name__}")
    ids = []
    for t in target:
        if isinstance(t, str):
            got = model.tokenizer.encode_ids(t)
            if len(got) != 1:
                raise ValueError(
                    f"target {t!r} is {len(got)} tokens {[model.tokenizer.token_str(i) for i in got]}; give "
                    "single tokens (with their leading space, e.g. ' le')"
                )
            ids.append(got[0])
        else:
            ids.append(check_index(t, model.cfg.d_vocab, "target id", f"the vocabulary has {model.cfg.d_vocab}"))
    if not ids:
        raise ValueError("target is empty: give at least one target token")
    return sorted(set(ids))


@torch.no_grad()
def generation_nll(
    model: HookedGPT2,
    direction: torch.Tensor,
    at: str,
    scale: float,
    prompts: Sequence[str],
    positions: Sequence[int] | None,
    n_tokens: int,
) -> float:
    """The unsteered model's mean NLL (nats/token) of the ``n_tokens``-token greedy continuations that the
    model steered with ``scale · direction`` at ``at`` (``positions``: see :meth:`HookedGPT2.steer`) writes
    after each of ``prompts`` (one at a time, the end-of-text token suppressed)."""
    from ...model.steer import Steer

    n_tokens = check_count(n_tokens, "generate_tokens")
    steer = Steer(direction, at, scale, None if positions is None else tuple(positions))
    total = 0.0
    for p in prompts:
        tokens, _ = model.tokenize(p)
        out = model.generate(tokens, max_new_tokens=n_tokens, do_sample=False, suppress_eos=True, steer=steer)
        logp = model(out).float().log_softmax(-1)[0, tokens.shape[1] - 1 : -1]  # predicting the new tokens
        total += float(-logp.gather(-1, out[0, tokens.shape[1] :, None]).sum())
    return total / (n_tokens * len(prompts))


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[s : s + size] for s in range(0, len(items), size)]


@boundary
@torch.no_grad()
def steering_curve(
    model: HookedGPT2,
    direction: torch.Tensor,
    at: str,
    scales: Sequence[float],
    prompts: Sequence[str],
    target: Sequence[str] | Sequence[int],
    unrelated: Sequence[str],
    positions: Sequence[int] | None = None,
    max_tokens: int = 64,
    batch_size: int = 16,
    method: str = "a given direction",
    generate_tokens: int = 0,
) -> SteeringCurve:
    """Measure steering with ``direction`` at hook ``at`` over ``scales`` (:class:`SteeringCurve`).

    ``prompts``: held-out prompts after which the target behaviour is read (the summed next-token
    probability of the ``target`` tokens, :func:`target_token_ids`); ``unrelated``: natural texts (e.g.
    Brown passages, :func:`gpt2_interp.io.corpora.brown_texts`), each cut to its first ``max_tokens``
    tokens, on which the fluency cost (loss) and the drift (KL from the unsteered model) are measured.
    ``positions``: the steered positions (None: all; see :meth:`HookedGPT2.steer`). ``method`` says in
    the result how the direction was made. Every forward pass runs ``batch_size`` texts.
    A zero ``direction`` is refused (the curve would be flat).
    ``generate_tokens`` > 0 also measures the fluency of what the steered model writes: a greedy
    continuation of that many tokens per prompt (one prompt at a time), scored by the unsteered model
    (``generation_nll``)."""
    prompts = check_prompts(prompts, "prompts")
    unrelated = check_prompts(unrelated, "unrelated")
    batch_size = check_count(batch_size, "batch_size")
    max_tokens = check_count(max_tokens, "max_tokens", minimum=2)
    scale_list = [check_number(s, "scale") for s in scales]
    if not scale_list:
        raise ValueError("scales is empty: give the scales to measure, e.g. [0, 2, 4, 8]")
    if direction.numel() and not bool(direction.any()):
        raise ValueError(f"direction is the zero vector: steering at {at} with it changes nothing at any scale")
    ids = torch.tensor(target_token_ids(model, target), device=model.device)
    direction = as_direction(direction)
    bos = [model.tokenizer.bos_id] if model.tokenizer.bos_id is not None else []
    rows = [(bos + model.tokenizer.encode_ids(t))[:max_tokens] for t in unrelated]
    if any(len(r) < 2 for r in rows):
        raise ValueError("every unrelated text needs at least one token to predict")
    text_batches = [model.pad(r, "left") for r in _chunks(rows, batch_size)]
    prompt_batches = _chunks(prompts, batch_size)

    def measure(scale: float | None, base: list[torch.Tensor] | None) -> tuple[torch.Tensor, float, float, list]:
        ctx = model.steer(direction, at, scale, positions) if scale is not None else nullcontext()
        with ctx:
            probs = torch.cat([model.last_logits(p).float().softmax(-1)[:, ids].sum(-1).cpu() for p in prompt_batches])
            nll = kl = count = 0.0
            logps = []
            for j, (tokens, mask) in enumerate(text_batches):
                logp = model(tokens, attention_mask=mask).float().log_softmax(-1)[:, :-1]  # [b, pos-1, vocab]
                # a prediction counts when both its position and its target are real tokens (left padding)
                real = (mask[:, :-1] * mask[:, 1:] if mask is not None else torch.ones_like(tokens[:, 1:])).to(
                    logp.dtype
                )
                nll += float(-(logp.gather(-1, tokens[:, 1:, None])[..., 0] * real).sum())
                count += float(real.sum())
                if base is None:
                    logps.append(logp)
                else:
                    ref = base[j]
                    kl += float((F.kl_div(logp, ref, log_target=True, reduction="none").sum(-1) * real).sum())
        return probs, nll / count, kl / count, logps

    base_probs, base_loss, _, base_logps = measure(None, None)
    probs, losses, kls = [], [], []
    for s in scale_list:
        p, lo, k, _ = measure(s, base_logps) if s != 0 else (base_probs, base_loss, 0.0, None)
        probs.append(p)
        losses.append(lo)
        kls.append(k)
    p = torch.stack(probs)  # [n_scales, n_prompts]
    n = p.shape[1]

    def sem(x: torch.Tensor) -> torch.Tensor:
        return x.std(1) / math.sqrt(n) if n > 1 else torch.zeros(x.shape[0])

    n_tokens = int(sum(len(r) - 1 for r in rows))
    return SteeringCurve(
        model_name=model.cfg.name,
        at=at,
        method=method,
        scales=torch.tensor(scale_list),
        target=[model.tokenizer.token_str(int(i)) for i in ids],
        target_prob=p.mean(1),
        target_sem=sem(p),
        shift_sem=sem(p - base_probs),
        loss=torch.tensor(losses),
        kl=torch.tensor(kls),
        baseline_prob=float(base_probs.mean()),
        baseline_loss=base_loss,
        direction_norm=float(direction.norm()),
        n_prompts=len(prompts),
        n_unrelated=len(unrelated),
        n_tokens=n_tokens,
        positions=None if positions is None else [int(x) for x in positions],
        generation_nll=None
        if not generate_tokens
        else torch.tensor(
            [generation_nll(model, direction, at, s, prompts, positions, generate_tokens) for s in scale_list]
        ),
    )


__all__ = [
    "POSITIONS",
    "SteeringCurve",
    "activations_at",
    "as_direction",
    "decoder_direction",
    "mean_difference",
    "probe_direction",
    "steering_curve",
    "target_token_ids",
]
