"""The metric of a chunk of prompt pairs, read from the final residual stream, differentiably.

Attribution runs the pairs in chunks; a metric may hold one answer per pair of the whole set, so a
chunk's logits are placed at their rows among zeros before the metric sees them (:func:`chunk_metric`).
For a logit difference only the columns of its tokens are unembedded (:class:`Readout`). The
metric is checked where attribution needs more of it than exact patching does: finite on the
unpatched runs (:func:`check_finite`) and differentiable in the logits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..metrics import LogitDiff, Metric, apply_metric, bind_metric, metric_name, require_finite_metric

if TYPE_CHECKING:
    from ...model import HookedGPT2


def chunk_metric(metric: Metric, logits: torch.Tensor, rows: tuple[int, int] | None = None) -> torch.Tensor:
    """``logits [b, d_vocab]`` → ``[b]`` (float), differentiable. ``rows = (first, n_pairs)`` when the
    ``b`` pairs are a chunk of ``n_pairs``: the metric (which may hold one answer per pair) sees them
    at their place among zero logits for the other pairs, whose values are dropped."""
    out = apply_metric(metric, place(logits, rows)[None])[0]
    return out if rows is None else out[rows[0] : rows[0] + logits.shape[0]]


def place(x: torch.Tensor, rows: tuple[int, int] | None) -> torch.Tensor:
    """Chunk rows ``x [b, ...]`` at rows ``first…first+b`` of ``n_pairs`` rows of zeros."""
    if rows is None or (rows[0] == 0 and rows[1] == x.shape[0]):
        return x
    first, n = rows
    return torch.cat([x.new_zeros(first, *x.shape[1:]), x, x.new_zeros(n - first - x.shape[0], *x.shape[1:])])


class Readout:
    """The metric of one chunk of ``b`` pairs (rows ``first…first+b`` of ``n_pairs``), read from the
    residual stream at the last position — the only logits any metric uses.

    For a logit difference only the columns of its tokens are unembedded (``[b, k]`` logits, ``k`` ≤
    ``2b`` distinct tokens, instead of ``[b, d_vocab]``): the same values without the full unembedding,
    in the forward and in the backward pass, where it is a sizeable share of a small model's cost
    (gpt2-facts: ~18% of a forward pass). Any other metric reads the full last-position logits."""

    def __init__(self, model: HookedGPT2, metric: Metric, rows: tuple[int, int], b: int) -> None:
        self.model, self.metric, self.rows = model, metric, rows
        self.cols: torch.Tensor | None = None
        self.bound: Metric | None = None
        pre = bind_metric(metric, model)
        ids = chunk_ids(pre, rows, b) if isinstance(pre, LogitDiff) else None
        if ids is not None:
            assert isinstance(pre, LogitDiff), "token ids come from a logit difference"
            with torch.inference_mode(False):  # normal tensors: autograd saves these indices
                cols, inv = torch.unique(torch.cat(ids), return_inverse=True)
            self.cols = cols.to(model.device)
            self.bound = LogitDiff(inv[:b], inv[b:], pre.name)

    def logits(self, resid: torch.Tensor) -> torch.Tensor:
        """``resid [b, pos, d_model]`` (after the last block) → last-position logits ``[b, d_vocab | k]``."""
        x = self.model.ln_final(resid[:, -1])
        return self.model.unembed(x) if self.cols is None else self.model.unembed.columns(x, self.cols)

    def bind(self, reference: torch.Tensor) -> None:
        """Bind the metric; ``reference``: the clean run's logits of the chunk (a KL metric's reference)."""
        if self.cols is None:
            self.bound = bind_metric(self.metric, self.model, place(reference, self.rows))

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` from :meth:`logits` → the metric ``[b]`` (float; differentiable where ``logits``
        is, else a ValueError naming the metric)."""
        if self.bound is None:
            raise RuntimeError("bind() the readout before reading the metric")
        out = chunk_metric(self.bound, logits, None if self.cols is not None else self.rows)
        if logits.requires_grad and not out.requires_grad:
            raise ValueError(
                f"metric {metric_name(self.metric)} is not differentiable in the logits (its value carries no "
                "gradient: argmax, comparisons, .detach(), .item() or a new tensor cut the graph); attribution "
                "needs ∂metric/∂logits — build it from differentiable operations such as logit_diff, prob or kl_to, "
                "or use exact patching (patch), which takes any metric"
            )
        return out

    def check_finite(self, base_m: torch.Tensor, src_m: torch.Tensor, direction: str) -> None:
        """Refuse NaN/inf metric values on the chunk's unpatched runs (``[b]`` each), as ``patch`` does."""
        clean, corrupted = (src_m, base_m) if direction == "denoise" else (base_m, src_m)
        require_finite_metric(self.metric, {"clean": clean, "corrupted": corrupted})


def chunk_ids(m: LogitDiff, rows: tuple[int, int], b: int) -> list[torch.Tensor] | None:
    """A bound logit difference's answer and wrong ids for the chunk's ``b`` rows, ``[b]`` each, or
    None where they are not one id or one per pair (the metric itself then reports the mismatch)."""
    first, n = rows
    out = []
    for x in (m.answer, m.wrong):
        if not isinstance(x, torch.Tensor):
            return None
        x = x.long().cpu()
        if x.ndim == 0:
            x = x.expand(b)
        elif tuple(x.shape) == (n,):
            x = x[first : first + b]
        else:
            return None
        out.append(x)
    return out


__all__ = ["Readout", "chunk_ids", "chunk_metric", "place"]
