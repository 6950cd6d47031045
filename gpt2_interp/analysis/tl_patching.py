"""TransformerLens's ``patching.get_act_patch_*`` call shapes, as thin entry points over :func:`.patching.patch`.

``get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, patching_metric)`` returns the same
``[layer, pos]`` tensor as TransformerLens (denoising: each clean activation patched into the
corrupted run), computed by our batched engine. TransformerLens metrics take full logits
``[batch, pos, d_vocab]`` and return a scalar; the engine computes last-position logits only, so the
metric is called with ``[batch, 1, d_vocab]`` — checked once on the clean run: a metric that reads
other positions raises (use :func:`.patching.patch` with a metric of your own then).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from .patching import patch

if TYPE_CHECKING:
    from ..model import ActivationCache, HookedGPT2

TLMetric = Callable[[torch.Tensor], torch.Tensor]


def tokens_of(model: HookedGPT2, cache: ActivationCache) -> torch.Tensor:
    """The token ids ``[batch, pos]`` a cache was recorded on, recovered exactly from ``hook_embed``
    (each row is a row of ``W_E``)."""
    if "hook_embed" not in cache:
        raise KeyError("the clean cache needs 'hook_embed' to know its tokens; record it with run_with_cache")
    embed = cache["hook_embed"].to(model.W_E.dtype)
    dist = torch.cdist(embed.flatten(0, -2), model.W_E.detach())
    return dist.argmin(-1).view(embed.shape[:-1])


def _wrap(model: HookedGPT2, metric: TLMetric, clean: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
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


def _act_patch(
    model: HookedGPT2,
    corrupted_tokens: torch.Tensor,
    clean_cache: ActivationCache,
    patching_metric: TLMetric,
    hook: str,
    positions: Any,
    heads: Any,
) -> torch.Tensor:
    clean = tokens_of(model, clean_cache).to(corrupted_tokens.device)
    metric = _wrap(model, patching_metric, clean)
    return patch(
        model, clean, corrupted_tokens, metric, hook=hook, positions=positions, heads=heads, progress=False
    ).values


def _named(fn: Callable[..., torch.Tensor], name: str) -> Callable[..., torch.Tensor]:
    fn.__name__ = fn.__qualname__ = name
    return fn


def _heads(model: HookedGPT2, hook: str) -> list[int]:
    """The heads TransformerLens sweeps: key/value heads for k and v (grouped-query attention), else query heads."""
    return list(range(model.cfg.n_kv if hook in ("k", "v") else model.cfg.n_head))


def _all_pos(hook: str) -> Callable[..., torch.Tensor]:
    def get(model: Any, corrupted_tokens: torch.Tensor, clean_cache: Any, patching_metric: TLMetric) -> torch.Tensor:
        return _act_patch(model, corrupted_tokens, clean_cache, patching_metric, hook, None, _heads(model, hook))

    get.__doc__ = (
        f"``[layer, head]``: each head's ``{hook}`` patched clean → corrupted at every position "
        "(TransformerLens's call and result; key/value heads for k and v)."
    )
    return get


def _by_pos(hook: str) -> Callable[..., torch.Tensor]:
    def get(model: Any, corrupted_tokens: torch.Tensor, clean_cache: Any, patching_metric: TLMetric) -> torch.Tensor:
        P = corrupted_tokens.shape[-1]
        return _act_patch(
            model, corrupted_tokens, clean_cache, patching_metric, hook, list(range(P)), _heads(model, hook)
        )

    get.__doc__ = f"``[layer, pos, head]``: each head's ``{hook}`` patched clean → corrupted at one position at a time."
    return get


def _per_pos(hook: str) -> Callable[..., torch.Tensor]:
    def get(model: Any, corrupted_tokens: torch.Tensor, clean_cache: Any, patching_metric: TLMetric) -> torch.Tensor:
        return _act_patch(model, corrupted_tokens, clean_cache, patching_metric, hook, None, None)

    get.__doc__ = f"``[layer, pos]``: ``{hook}`` of each layer and position patched clean → corrupted."
    return get


get_act_patch_resid_pre = _named(_per_pos("resid_pre"), "get_act_patch_resid_pre")
get_act_patch_resid_mid = _named(_per_pos("resid_mid"), "get_act_patch_resid_mid")
get_act_patch_attn_out = _named(_per_pos("attn_out"), "get_act_patch_attn_out")
get_act_patch_mlp_out = _named(_per_pos("mlp_out"), "get_act_patch_mlp_out")
get_act_patch_attn_head_out_all_pos = _named(_all_pos("z"), "get_act_patch_attn_head_out_all_pos")
get_act_patch_attn_head_q_all_pos = _named(_all_pos("q"), "get_act_patch_attn_head_q_all_pos")
get_act_patch_attn_head_k_all_pos = _named(_all_pos("k"), "get_act_patch_attn_head_k_all_pos")
get_act_patch_attn_head_v_all_pos = _named(_all_pos("v"), "get_act_patch_attn_head_v_all_pos")
get_act_patch_attn_head_pattern_all_pos = _named(_all_pos("pattern"), "get_act_patch_attn_head_pattern_all_pos")
get_act_patch_attn_head_out_by_pos = _named(_by_pos("z"), "get_act_patch_attn_head_out_by_pos")
get_act_patch_attn_head_q_by_pos = _named(_by_pos("q"), "get_act_patch_attn_head_q_by_pos")
get_act_patch_attn_head_k_by_pos = _named(_by_pos("k"), "get_act_patch_attn_head_k_by_pos")
get_act_patch_attn_head_v_by_pos = _named(_by_pos("v"), "get_act_patch_attn_head_v_by_pos")


def get_act_patch_attn_head_pattern_by_pos(
    model: Any, corrupted_tokens: torch.Tensor, clean_cache: Any, patching_metric: TLMetric
) -> torch.Tensor:
    """``[layer, head, dest_pos]`` (TransformerLens's axis order): each head's attention pattern row of one
    destination position patched clean → corrupted."""
    return _by_pos("pattern")(model, corrupted_tokens, clean_cache, patching_metric).transpose(1, 2)


def get_act_patch_attn_head_pattern_dest_src_pos(
    model: Any, corrupted_tokens: torch.Tensor, clean_cache: Any, patching_metric: TLMetric
) -> torch.Tensor:
    """``[layer, head, dest_pos, src_pos]``: one attention-pattern entry patched clean → corrupted at a time.
    One entry per run (as TransformerLens: ``layers·heads·pos²`` forward passes), with the metric on full
    logits; entries above the diagonal are 0 in both runs, so they give the corrupted metric."""
    tokens = corrupted_tokens if corrupted_tokens.ndim == 2 else corrupted_tokens[None]
    L, H, P = model.cfg.n_layer, model.cfg.n_head, tokens.shape[-1]
    out = torch.zeros(L, H, P, P)
    with torch.no_grad():
        for layer in range(L):
            clean = clean_cache["pattern", layer]
            for head, dest, src in itertools.product(range(H), range(P), range(P)):

                def put(
                    pattern: torch.Tensor, hook: Any, head: int = head, dest: int = dest, src: int = src, clean=clean
                ) -> torch.Tensor:
                    pattern = pattern.clone()
                    pattern[:, head, dest, src] = clean[:, head, dest, src].to(pattern.dtype)
                    return pattern

                logits = model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_pattern", put)])
                out[layer, head, dest, src] = float(patching_metric(logits))
    return out


def _pad_heads(t: torch.Tensor, n: int) -> torch.Tensor:
    """Zero-pad the last (head) axis to ``n`` (key/value heads beside query heads, as TransformerLens)."""
    return torch.nn.functional.pad(t, (0, n - t.shape[-1]))


def _heads_every(
    model: Any,
    corrupted_tokens: torch.Tensor,
    clean_cache: Any,
    metric: TLMetric,
    z: Callable,
    q: Callable,
    k: Callable,
    v: Callable,
    pattern: torch.Tensor,
) -> torch.Tensor:
    """Stack head output (z), q, k, v and ``pattern`` (already computed), k/v zero-padded to the query heads."""
    out = [fn(model, corrupted_tokens, clean_cache, metric) for fn in (z, q)]
    H = out[-1].shape[-1]
    out += [_pad_heads(fn(model, corrupted_tokens, clean_cache, metric), H) for fn in (k, v)]
    return torch.stack([*out, pattern])


def get_act_patch_attn_head_all_pos_every(
    model: Any, corrupted_tokens: torch.Tensor, clean_cache: Any, metric: TLMetric
) -> torch.Tensor:
    """``[5, layer, head]``: head output (z), q, k, v and pattern, each patched at every position."""
    return _heads_every(
        model,
        corrupted_tokens,
        clean_cache,
        metric,
        get_act_patch_attn_head_out_all_pos,
        get_act_patch_attn_head_q_all_pos,
        get_act_patch_attn_head_k_all_pos,
        get_act_patch_attn_head_v_all_pos,
        get_act_patch_attn_head_pattern_all_pos(model, corrupted_tokens, clean_cache, metric),
    )


def get_act_patch_attn_head_by_pos_every(
    model: Any, corrupted_tokens: torch.Tensor, clean_cache: Any, metric: TLMetric
) -> torch.Tensor:
    """``[5, layer, pos, head]``: head output (z), q, k, v and pattern, each patched at one position at a time."""
    pattern = get_act_patch_attn_head_pattern_by_pos(model, corrupted_tokens, clean_cache, metric).transpose(1, 2)
    return _heads_every(
        model,
        corrupted_tokens,
        clean_cache,
        metric,
        get_act_patch_attn_head_out_by_pos,
        get_act_patch_attn_head_q_by_pos,
        get_act_patch_attn_head_k_by_pos,
        get_act_patch_attn_head_v_by_pos,
        pattern,
    )


def get_act_patch_block_every(
    model: Any, corrupted_tokens: torch.Tensor, clean_cache: Any, metric: TLMetric
) -> torch.Tensor:
    """``[3, layer, pos]``: the residual stream entering each block, each attention output and each MLP output."""
    return torch.stack(
        [
            get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, metric),
            get_act_patch_attn_out(model, corrupted_tokens, clean_cache, metric),
            get_act_patch_mlp_out(model, corrupted_tokens, clean_cache, metric),
        ]
    )


__all__ = [name for name in dir() if name.startswith("get_act_patch_")] + ["tokens_of"]
