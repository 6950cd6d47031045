"""TransformerLens's ``patching.get_act_patch_*`` call shapes, as thin entry points over :func:`.patching.patch`.

``get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, patching_metric)`` returns the same
``[layer, pos]`` tensor as TransformerLens (denoising: each clean activation patched into the
corrupted run), computed by our batched engine. TransformerLens metrics take full logits
``[batch, pos, d_vocab]`` and return a scalar; the engine computes last-position logits only, so the
metric is called with ``[batch, 1, d_vocab]`` — checked once on the clean run: a metric that reads
other positions raises (use :func:`.patching.patch` with a metric of your own then).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch

from .patching import patch

if TYPE_CHECKING:
    from ..model import ActivationCache, HookedGPT2

TLMetric = Callable[[torch.Tensor], torch.Tensor]


def tokens_of(model: "HookedGPT2", cache: "ActivationCache") -> torch.Tensor:
    """The token ids ``[batch, pos]`` a cache was recorded on, recovered exactly from ``hook_embed``
    (each row is a row of ``W_E``)."""
    if "hook_embed" not in cache:
        raise KeyError("the clean cache needs 'hook_embed' to know its tokens; record it with run_with_cache")
    embed = cache["hook_embed"].to(model.W_E.dtype)
    dist = torch.cdist(embed.flatten(0, -2), model.W_E.detach())
    return dist.argmin(-1).view(embed.shape[:-1])


def _wrap(model: "HookedGPT2", metric: TLMetric, clean: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    with torch.no_grad():
        full = model(clean)
        a, b = metric(full), metric(full[:, -1:])
    if not torch.allclose(torch.as_tensor(a).float(), torch.as_tensor(b).float(), atol=1e-5):
        raise ValueError(
            "this patching metric reads positions other than the last (its value on the full logits differs "
            "from its value on logits[:, -1:]); the engine only computes last-position logits. Use "
            "analysis.patching.patch with a metric of last-position logits [..., n_pairs, d_vocab] -> [..., n_pairs]"
        )

    def per_run(logits: torch.Tensor) -> torch.Tensor:  # [..., n_pairs, d_vocab] -> [..., n_pairs]
        flat = logits.reshape(-1, *logits.shape[-2:])
        vals = torch.stack([torch.as_tensor(metric(run[:, None, :])).float().reshape(()) for run in flat])
        return vals.view(logits.shape[:-2])[..., None].expand(logits.shape[:-1])

    return per_run


def _act_patch(model: "HookedGPT2", corrupted_tokens: torch.Tensor, clean_cache: "ActivationCache",
               patching_metric: TLMetric, hook: str, positions: Any, heads: Any) -> torch.Tensor:
    clean = tokens_of(model, clean_cache).to(corrupted_tokens.device)
    metric = _wrap(model, patching_metric, clean)
    return patch(model, clean, corrupted_tokens, metric, hook=hook, positions=positions, heads=heads,
                 progress=False).values


def get_act_patch_resid_pre(model: Any, corrupted_tokens: torch.Tensor, clean_cache: Any, patching_metric: TLMetric) -> torch.Tensor:
    """``[layer, pos]``: ``resid_pre`` of each layer and position patched clean → corrupted."""
    return _act_patch(model, corrupted_tokens, clean_cache, patching_metric, "resid_pre", None, None)


def get_act_patch_resid_mid(model: Any, corrupted_tokens: torch.Tensor, clean_cache: Any, patching_metric: TLMetric) -> torch.Tensor:
    return _act_patch(model, corrupted_tokens, clean_cache, patching_metric, "resid_mid", None, None)


def get_act_patch_attn_out(model: Any, corrupted_tokens: torch.Tensor, clean_cache: Any, patching_metric: TLMetric) -> torch.Tensor:
    return _act_patch(model, corrupted_tokens, clean_cache, patching_metric, "attn_out", None, None)


def get_act_patch_mlp_out(model: Any, corrupted_tokens: torch.Tensor, clean_cache: Any, patching_metric: TLMetric) -> torch.Tensor:
    return _act_patch(model, corrupted_tokens, clean_cache, patching_metric, "mlp_out", None, None)


def get_act_patch_attn_head_out_all_pos(model: Any, corrupted_tokens: torch.Tensor, clean_cache: Any, patching_metric: TLMetric) -> torch.Tensor:
    """``[layer, head]``: each head's ``z`` patched at every position."""
    return _act_patch(model, corrupted_tokens, clean_cache, patching_metric, "z", None, None)


__all__ = ["get_act_patch_resid_pre", "get_act_patch_resid_mid", "get_act_patch_attn_out", "get_act_patch_mlp_out",
           "get_act_patch_attn_head_out_all_pos", "tokens_of"]
