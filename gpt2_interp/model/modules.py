"""The GPT-2 building blocks: LayerNorm, attention, MLP, block. Exactly GPT-2's maths.

Weights are stored so that activations multiply on the left (``x @ W``, as in
GPT-2's Conv1D) and with TransformerLens names: ``W_E``, ``W_pos``, ``ln.w/b``,
``attn.W_QKV`` (fused, ``[d_model, 3*d_model]``) with per-head views ``W_Q/W_K/W_V``,
``attn.W_O`` ``[n_head, d_head, d_model]``, ``mlp.W_in`` ``[d_model, d_mlp]`` and
``mlp.W_out`` ``[d_mlp, d_model]`` (rows are the MLP "value vectors").
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from .config import GPT2Config
from .hooks import HookPoint


class LayerNorm(nn.Module):
    """GPT-2 LayerNorm with ``hook_scale`` ``[batch, pos, 1]`` and ``hook_normalized`` ``[batch, pos, d]``.

    As in TransformerLens, ``hook_normalized`` is the centred, scaled input
    *before* the gain ``w`` and bias ``b`` are applied.
    """

    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.w = nn.Parameter(torch.ones(d))
        self.b = nn.Parameter(torch.zeros(d))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.hook_scale.has_hooks or self.hook_normalized.has_hooks):
            return F.layer_norm(x, x.shape[-1:], self.w, self.b, self.eps)
        x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale) * self.w + self.b


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``x @ w + b`` for ``x: [..., d_in]``, ``w: [d_in, d_out]`` with one fused addmm (as GPT-2's Conv1D)."""
    return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[-1])


class KVCache:
    """Keys and values of past positions for incremental decoding, preallocated per layer.

    ``k, v: [batch, n_head, max_len, d_head]``; ``length`` positions are filled.
    """

    def __init__(self, cfg: GPT2Config, batch: int, max_len: int, device, dtype) -> None:
        shape = (cfg.n_layer, batch, cfg.n_head, max_len, cfg.d_head)
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.length = 0

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + k.shape[2]
        if end > self.k.shape[3]:
            raise ValueError(f"KV cache holds {self.k.shape[3]} positions; {end} needed")
        self.k[layer, :, :, self.length : end] = k
        self.v[layer, :, :, self.length : end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


class Attention(nn.Module):
    """Causal multi-head self-attention with a fused QKV projection.

    Uses ``scaled_dot_product_attention`` unless a hook asks for the scores or
    the pattern, in which case they are materialised (same result within fp error).
    """

    def __init__(self, cfg: GPT2Config, layer: int) -> None:
        super().__init__()
        self.cfg, self.layer = cfg, layer
        d, h, dh = cfg.d_model, cfg.n_head, cfg.d_head
        self.W_QKV = nn.Parameter(torch.empty(d, 3 * d))
        self.b_QKV = nn.Parameter(torch.zeros(3 * d))
        self.W_O = nn.Parameter(torch.empty(h, dh, d))
        self.b_O = nn.Parameter(torch.zeros(d))
        for name in ("q", "k", "v", "attn_scores", "pattern", "z"):
            setattr(self, f"hook_{name}", HookPoint())

    # Per-head views, TransformerLens shapes (writes through them edit W_QKV).
    def _head_view(self, which: int) -> torch.Tensor:
        c = self.cfg
        return self.W_QKV.view(c.d_model, 3, c.n_head, c.d_head)[:, which].permute(1, 0, 2)

    @property
    def W_Q(self) -> torch.Tensor:  # [n_head, d_model, d_head]
        return self._head_view(0)

    @property
    def W_K(self) -> torch.Tensor:
        return self._head_view(1)

    @property
    def W_V(self) -> torch.Tensor:
        return self._head_view(2)

    @property
    def b_Q(self) -> torch.Tensor:  # [n_head, d_head]
        return self.b_QKV.view(3, self.cfg.n_head, self.cfg.d_head)[0]

    @property
    def b_K(self) -> torch.Tensor:
        return self.b_QKV.view(3, self.cfg.n_head, self.cfg.d_head)[1]

    @property
    def b_V(self) -> torch.Tensor:
        return self.b_QKV.view(3, self.cfg.n_head, self.cfg.d_head)[2]

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor | None, kv: KVCache | None = None
    ) -> torch.Tensor:
        """``x: [batch, pos, d_model]``; ``mask``: bool ``[batch|1, 1, q, k]`` (True = may attend)
        or None for plain causal attention."""
        qkv = _linear(x, self.W_QKV, self.b_QKV)
        q, k, v = rearrange(qkv, "b p (three h dh) -> three b p h dh", three=3, h=self.cfg.n_head)
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [batch, head, pos, d_head]
        if kv is not None:
            k, v = kv.extend(self.layer, k, v)
        if self.hook_attn_scores.has_hooks or self.hook_pattern.has_hooks:
            scores = q @ k.transpose(-1, -2) / math.sqrt(self.cfg.d_head)
            if mask is None:
                q_len, k_len = scores.shape[-2:]
                mask = torch.ones(q_len, k_len, dtype=torch.bool, device=x.device).tril(k_len - q_len)
            scores = self.hook_attn_scores(scores.masked_fill(~mask, float("-inf")))
            pattern = self.hook_pattern(torch.softmax(scores.float(), dim=-1).to(v.dtype))
            z = pattern @ v
        else:
            causal = mask is None and q.shape[2] == k.shape[2]
            z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        z = self.hook_z(z.transpose(1, 2))  # [batch, pos, head, d_head]
        return _linear(z.flatten(-2), self.W_O.view(-1, self.cfg.d_model), self.b_O)


class MLP(nn.Module):
    """``W_out · gelu_new(W_in · x + b_in) + b_out`` with ``hook_pre`` and ``hook_post`` ``[batch, pos, d_mlp]``."""

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.b_in = nn.Parameter(torch.zeros(cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model))
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pre = self.hook_pre(_linear(x, self.W_in, self.b_in))
        post = self.hook_post(F.gelu(pre, approximate="tanh"))
        return _linear(post, self.W_out, self.b_out)


class Block(nn.Module):
    """A pre-LN transformer block: ``x + attn(ln1(x))``, then ``+ mlp(ln2(·))``."""

    def __init__(self, cfg: GPT2Config, layer: int) -> None:
        super().__init__()
        self.ln1 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.attn = Attention(cfg, layer)
        self.ln2 = LayerNorm(cfg.d_model, cfg.layer_norm_eps)
        self.mlp = MLP(cfg)
        for name in ("resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post"):
            setattr(self, f"hook_{name}", HookPoint())

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None, kv: KVCache | None = None) -> torch.Tensor:
        x = self.hook_resid_pre(x)
        x = self.hook_resid_mid(x + self.hook_attn_out(self.attn(self.ln1(x), mask, kv)))
        return self.hook_resid_post(x + self.hook_mlp_out(self.mlp(self.ln2(x))))
