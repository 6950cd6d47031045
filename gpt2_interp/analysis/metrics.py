"""Patching metrics: functions of last-position logits ``[..., n_pairs, d_vocab] -> [..., n_pairs]``.

``logit_diff``, ``prob`` and ``kl_to`` build them; any callable with that contract works too.
Token strings are resolved by the model's tokenizer when the metric is bound (``bind_metric``,
which ``patch``, tracing and attribution call), so metrics hold for any tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import torch
import torch.nn.functional as F

from ..core.boundary import boundary
from ..core.finite import require_finite

if TYPE_CHECKING:
    from ..model import HookedGPT2

Metric = Callable[[torch.Tensor], torch.Tensor]
_M = TypeVar("_M", bound=Metric)  # a metric, returned as the type it came in
Ids = Annotated[
    str | int | Sequence[str | int] | torch.Tensor,
    "a token (a string of one token, or its id), one per pair as a list, or a tensor of ids",
]


def _ids(x: Ids, model: HookedGPT2 | None, what: str = "token") -> torch.Tensor | Ids:
    """One id (a 0-d tensor) or one per prompt pair (``[n_pairs]``); token strings stay strings
    until a model (its tokenizer) resolves them. ``what`` names the argument in errors (``"logit_diff answer"``)."""
    if isinstance(x, torch.Tensor):
        return x.long()
    items: list[Any]
    if isinstance(x, (str, int)) or hasattr(x, "__index__"):
        items, one = [x], True
    elif isinstance(x, Sequence) and len(x) > 0:
        items, one = list(x), False
    else:
        raise TypeError(
            f"{what}: token ids are given as a string (e.g. ' Paris'), an int, a list of them (one per pair) "
            f"or a tensor; got {type(x).__name__}"
        )
    for i in items:
        if isinstance(i, bool) or not (isinstance(i, str) or hasattr(i, "__index__")):
            raise TypeError(f"{what}: a token is a string (e.g. ' Paris') or an int id, got {type(i).__name__}")
    if model is None and any(isinstance(i, str) for i in items):
        return x  # resolved by bind(model)
    ids = [i if model is None else _one_token(model, i, what if one else f"{what}[{j}]") for j, i in enumerate(items)]
    return torch.tensor(ids[0] if one else ids)


def _one_token(model: HookedGPT2, token: str | int, what: str) -> int:
    """``model.to_single_token(token)``, its error prefixed by the argument ``what`` (a metric reads
    one next-token logit: a text of several tokens is refused, not cut to its first)."""
    try:
        return model.to_single_token(token)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{what}: {e}; a metric scores one next token") from None


def _resolved(ids: torch.Tensor | Ids, name: str) -> torch.Tensor:
    if not isinstance(ids, torch.Tensor):
        raise ValueError(
            f"metric {name} holds token strings that no model has resolved yet; build it with "
            f"model=... (e.g. logit_diff(' Paris', ' Rome', model=model)) or use it through patch()"
        )
    return ids


def _same_everywhere(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two id tensors (one id, or one per pair) hold the same id for every pair (False when
    their shapes do not broadcast: the metric reports that when it runs)."""
    try:
        torch.broadcast_shapes(a.shape, b.shape)
    except RuntimeError:
        return False
    return bool((a.cpu() == b.cpu()).all())


def _pick(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``logits[..., n, d_vocab]`` at ``ids`` (scalar or ``[n]``) → ``[..., n]``."""
    ids = ids.to(logits.device).expand(logits.shape[:-1])
    return logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1)


@dataclass
class LogitDiff:
    """``logit[answer] − logit[wrong]`` at the last position (ids: one, or one per pair)."""

    answer: torch.Tensor | Ids
    wrong: torch.Tensor | Ids
    name: str = "logit_diff"

    def bind(self, model: HookedGPT2, clean_logits: torch.Tensor | None = None) -> LogitDiff:
        """This metric with its token strings resolved by ``model``'s tokenizer."""
        return LogitDiff(
            _ids(self.answer, model, f"{self.name} answer"), _ids(self.wrong, model, f"{self.name} wrong"), self.name
        )

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return _pick(logits, _resolved(self.answer, self.name)) - _pick(logits, _resolved(self.wrong, self.name))


@dataclass
class Prob:
    """Next-token probability of ``answer``."""

    answer: torch.Tensor | Ids
    name: str = "prob"

    def bind(self, model: HookedGPT2, clean_logits: torch.Tensor | None = None) -> Prob:
        """This metric with its token strings resolved by ``model``'s tokenizer."""
        return Prob(_ids(self.answer, model, f"{self.name} answer"), self.name)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        return _pick(logits.float().log_softmax(-1), _resolved(self.answer, self.name)).exp()


@dataclass
class KLTo:
    """``KL(reference ‖ patched)`` of next-token distributions; lower is closer. ``reference``
    ``[n_pairs, d_vocab]`` logits, or None for "the clean run of this patch" (filled in by ``patch``)."""

    reference: torch.Tensor | None = None
    name: str = "kl_to_clean"

    def bind(self, model: HookedGPT2, clean_logits: torch.Tensor | None = None) -> KLTo:
        """This metric with the clean run's logits as reference, unless it has one."""
        return self if self.reference is not None or clean_logits is None else KLTo(clean_logits, self.name)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if self.reference is None:
            raise ValueError("kl_to() has no reference logits; pass them, or use it through patch()")
        ref = self.reference.float().to(logits.device).log_softmax(-1)
        return F.kl_div(logits.float().log_softmax(-1), ref, log_target=True, reduction="none").sum(-1)


@boundary
def logit_diff(answer: Ids, wrong: Ids, model: HookedGPT2 | None = None) -> LogitDiff:
    """Metric ``logit[answer] − logit[wrong]``; tokens as strings (one token each) or ids, one or one
    per pair. Strings are resolved by ``model``'s tokenizer (now, or when ``patch`` binds it)."""
    name = f"logit_diff({answer!r}, {wrong!r})" if isinstance(answer, str) else "logit_diff"
    return refuse_degenerate(
        LogitDiff(_ids(answer, model, "logit_diff answer"), _ids(wrong, model, "logit_diff wrong"), name), model
    )


@boundary
def prob(answer: Ids, model: HookedGPT2 | None = None) -> Prob:
    """Metric: next-token probability of ``answer`` (strings resolved as in :func:`logit_diff`)."""
    return Prob(_ids(answer, model, "prob answer"), f"prob({answer!r})" if isinstance(answer, str) else "prob")


@boundary
def kl_to(clean: torch.Tensor | None = None) -> KLTo:
    """Metric: KL divergence from the clean next-token distribution (``clean`` logits ``[n_pairs, d_vocab]``,
    default: the clean run of the patch it is used in)."""
    return KLTo(clean)


def metric_name(metric: Metric) -> str:
    """A metric's display name (its ``name``, else its function name)."""
    return str(getattr(metric, "name", getattr(metric, "__name__", "metric")))


def bind_metric(metric: Metric, model: HookedGPT2, clean_logits: torch.Tensor | None = None) -> Metric:
    """``metric`` ready to run on ``model``'s logits: token strings resolved, KL reference filled in.
    Plain callables are returned as they are."""
    if not callable(metric):
        raise TypeError(
            f"metric must be a callable logits [..., n_pairs, d_vocab] -> [..., n_pairs] "
            f"(e.g. logit_diff(' Paris', ' Rome')), got {type(metric).__name__}"
        )
    bind = getattr(metric, "bind", None)
    return bind(model, clean_logits) if callable(bind) else metric


def apply_metric(metric: Metric, logits: torch.Tensor) -> torch.Tensor:
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


def refuse_degenerate(metric: _M, model: HookedGPT2 | None = None) -> _M:
    """``metric``, unless it is 0 on every run whatever the model: a logit difference whose answer
    and wrong are the same token for every pair (a ValueError naming the metric and the token,
    through ``model``'s tokenizer when given). Checked on the whole set of pairs (``patch`` and
    ``attribute`` check before they shard or chunk it), since some equal pairs among others are fine."""
    if not isinstance(metric, LogitDiff):
        return metric
    answer, wrong = metric.answer, metric.wrong
    if not (isinstance(answer, torch.Tensor) and isinstance(wrong, torch.Tensor)):
        return metric
    if _same_everywhere(answer, wrong):
        ids = answer.flatten().unique().tolist()
        token = f" {model.tokenizer.token_str(ids[0])!r}" if model is not None and len(ids) == 1 else ""
        raise ValueError(
            f"{metric.name}: answer and wrong are the same token (id {', '.join(map(str, ids))}{token}) for "
            "every pair, so the logit difference is 0 for every run; give the corrupted prompt's answer as wrong"
        )
    return metric


def require_finite_metric(metric: Metric, values: dict[str, torch.Tensor]) -> None:
    """Refuse a metric that is NaN or inf on an unpatched run: ``values`` maps the run (``"clean"``,
    ``"corrupted"``) to the metric there ``[n_pairs]``; the error names the metric, the run and the
    non-finite values. Patching and every attribution estimate check their metric with it."""
    for run, m in values.items():
        require_finite(
            m,
            f"metric {metric_name(metric)} on the {run} run",
            "a patching sweep (or its estimate) would be meaningless; check the metric (and any hooks that are active)",
        )


__all__ = [
    "Ids",
    "KLTo",
    "LogitDiff",
    "Metric",
    "Prob",
    "apply_metric",
    "bind_metric",
    "kl_to",
    "logit_diff",
    "metric_name",
    "prob",
    "refuse_degenerate",
    "require_finite_metric",
]
