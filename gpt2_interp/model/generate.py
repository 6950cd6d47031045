"""Batched text generation with a KV cache (left padding, greedy or sampled)."""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch

from ..core.checks import check_count
from .modules import KVCache
from .steer import for_generation, steering

if TYPE_CHECKING:
    from .hooked_gpt2 import HookedGPT2, Input


def sample_next(
    logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None, gen: torch.Generator | None
) -> torch.Tensor:
    """Next token ids ``[batch]`` from last-position logits ``[batch, d_vocab]``."""
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise ValueError(f"temperature must be a finite number ≥ 0, got {temperature!r}")
    if temperature == 0:
        return logits.argmax(-1)
    logits = logits.float() / temperature
    if top_k is not None:
        top_k = check_count(top_k, "top_k")
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= top_p  # keep the smallest prefix reaching top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = logits.softmax(-1)
    if gen is not None and gen.device != probs.device:  # a seeded draw is made where its generator lives
        return torch.multinomial(probs.cpu(), 1, generator=gen)[:, 0].to(probs.device)
    return torch.multinomial(probs, 1, generator=gen)[:, 0]


def generate(
    model: HookedGPT2,
    input: Input,
    max_new_tokens: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    stop_at_eos: bool,
    seed: int | None,
    use_kv_cache: bool,
    prepend_bos: bool,
    suppress_eos: bool = False,
    steer: Any = None,
) -> Any:
    max_new_tokens = check_count(max_new_tokens, "max_new_tokens", minimum=0)
    if isinstance(input, torch.Tensor):
        tokens, mask = model.as_tokens(input, None)
    else:
        tokens, mask = model.tokenize(input, prepend_bos=prepend_bos, what="input")
    batch, prompt_len = tokens.shape
    model.check_length(prompt_len + max_new_tokens)
    every, prompt_only = for_generation(model, steer, prompt_len) if steer is not None else ([], [])
    gen = None
    if seed is not None:
        # a CPU generator whatever the model's device: a seed then samples the same text on CPU and GPU
        # (a CUDA generator's stream differs), so seeded results such as ROME's context prefixes match
        gen = torch.Generator().manual_seed(seed)
    padded = mask is not None  # unpadded prompts run with plain causal attention (no mask to build)
    if mask is None:
        mask = torch.ones_like(tokens)
    cache = KVCache(model.cfg, batch, prompt_len + max_new_tokens, model.device, model.dtype) if use_kv_cache else None
    eos = model.tokenizer.eos_id
    out, finished = tokens, torch.zeros(batch, dtype=torch.bool, device=model.device)
    for step in range(max_new_tokens):
        step_input = out[:, -1:] if (cache is not None and step > 0) else out
        active = every + (prompt_only if step == 0 or cache is None else [])
        with steering(model, active) if active else nullcontext():
            logits = model(step_input, attention_mask=mask if padded else None, past_kv=cache)[:, -1]
        if suppress_eos:
            logits[:, eos] = -float("inf")
        nxt = sample_next(logits, temperature, top_k, top_p, gen)
        nxt = torch.where(finished, torch.full_like(nxt, eos), nxt)
        out = torch.cat([out, nxt[:, None]], dim=1)
        mask = torch.cat([mask, torch.ones_like(nxt[:, None])], dim=1)
        finished |= nxt == eos
        if stop_at_eos and bool(finished.all()):
            break
    if isinstance(input, torch.Tensor):
        return out
    texts, skip = [], 1 if prepend_bos and model.tokenizer.bos_id is not None else 0
    for row, m in zip(out, mask):
        prompt = row[:prompt_len][m[:prompt_len].bool()].tolist()[skip:]
        new = row[prompt_len:].tolist()
        if stop_at_eos and eos in new:
            new = new[: new.index(eos)]
        texts.append(model.to_string(prompt + new))
    return texts[0] if isinstance(input, str) else texts
