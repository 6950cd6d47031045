"""Before/after views of an edit: the top-k next tokens of prompts without and with it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..analysis.tokens import target_ids
from ..core.checks import check_count
from ..core.result import Result
from .edit import Edit, Request
from .evaluate import target_logprobs

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..model import HookedGPT2


@dataclass
class TopKComparison(Result):
    """Top-k next tokens of prompts without and with an edit (``.table()``, ``.plot()``)."""

    result_kind = "top-k comparison"

    prompts: list[str]
    before: list[list[tuple[str, float]]]
    after: list[list[tuple[str, float]]]
    target: str = ""
    target_token: str = ""  # the target's first token: the bar to highlight
    p_target_before: list[float] = field(default_factory=list)
    p_target_after: list[float] = field(default_factory=list)

    def table(self) -> str:
        lines = []
        for p, b, a, pb, pa in zip(self.prompts, self.before, self.after, self.p_target_before, self.p_target_after):
            lines.append(f"{p!r}   P({self.target!r}): {pb:.3g} → {pa:.3g}")
            for (tb, xb), (ta, xa) in zip(b, a):
                lines.append(f"    {tb!r:>16} {xb:8.3g}   |   {ta!r:>16} {xa:8.3g}")
        return "\n".join(lines)

    def plot(self, **kwargs: Any) -> Figure:
        from ..plots.editing import plot_topk_comparison

        return plot_topk_comparison(self, **kwargs)


@torch.no_grad()
def compare_topk(
    model: HookedGPT2, edit: Edit, prompts: Sequence[str], k: int = 5, request: Request | None = None
) -> TopKComparison:
    """Top-k next tokens (with probabilities) of each prompt before and after ``edit``; a prompt
    holding ``{}`` gets the subject of ``request`` (default: the edit's only request; one of
    ``edit.requests`` for a MEMIT edit), whose target's probability is shown."""
    k = check_count(k, "k")
    req = request if request is not None else edit.request
    prompts = [p.format(req.subject) if "{}" in p else p for p in prompts]
    targets = [req.target] * len(prompts)

    def top(probs: torch.Tensor) -> list[list[tuple[str, float]]]:
        v, i = probs.topk(k, -1)
        return [[(model.tokenizer.token_str(int(t)), float(x)) for t, x in zip(ii, vv)] for ii, vv in zip(i, v)]

    before = model.last_logits(prompts).float().softmax(-1)
    pb = target_logprobs(model, prompts, targets).exp().tolist()
    with model.edited(edit):
        after = model.last_logits(prompts).float().softmax(-1)
        pa = target_logprobs(model, prompts, targets).exp().tolist()
    first = model.tokenizer.token_str(target_ids(model, req.target)[0])
    return TopKComparison(list(prompts), top(before), top(after), req.target, first, pb, pa)


__all__ = ["TopKComparison", "compare_topk"]
