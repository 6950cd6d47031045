"""The transformer building blocks: GPT-2's (LayerNorm, GELU MLP, learned positions) and its
descendants' (RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention, and the later families'
options: q/k norms, sliding windows, soft-caps, parallel and sandwich blocks), chosen by the config.

Weights are stored so that activations multiply on the left (``x @ W``, as in
GPT-2's Conv1D) and with TransformerLens names: ``W_E``, ``W_pos``, ``ln.w/b``,
``attn.W_QKV`` (fused, ``[d_model, (n_head + 2·n_kv)·d_head]``) with per-head views ``W_Q/W_K/W_V``,
``attn.W_O`` ``[n_head, d_head, d_model]``, ``mlp.W_in`` ``[d_model, d_mlp]`` (SwiGLU's "up"),
``mlp.W_gate`` (SwiGLU only) and ``mlp.W_out`` ``[d_mlp, d_model]`` (rows are the MLP "value
vectors"; SwiGLU's "down"). Without biases (``cfg.bias=False``) the ``b_*`` attributes are None.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import einsum, repeat
from torch import nn

from ..core.boundary import boundary
from .config import GPT2Config
from .hooks import HookPoint


class LayerNorm(nn.Module):
    """GPT-2 LayerNorm with ``hook_scale`` ``[batch, pos, 1]`` and ``hook_normalized`` ``[batch, pos, d]``.

    As in TransformerLens, ``hook_normalized`` is the centred, scaled input
    *before* the gain ``w`` and bias ``b`` are applied.
    """

    centred = True  # subtracts the mean (direct logit attribution centres each component too)

    def __init__(self, d: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.w = nn.Parameter(torch.ones(d))
        self.b = nn.Parameter(torch.zeros(d))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def unhooked(self, x: torch.Tensor) -> torch.Tensor:
        """The norm of ``x`` without running its hooks (e.g. the logit lens on any residual)."""
        return F.layer_norm(x, x.shape[-1:], self.w, self.b, self.eps)

    @property
    def gain(self) -> torch.Tensor:
        """The weight the normalised input is multiplied by (``w``; RMSNorm's may be ``1 + w``)."""
        return self.w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.hook_scale.has_hooks or self.hook_normalized.has_hooks):
            return self.unhooked(x)
        x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale) * self.w + self.b


class RMSNorm(nn.Module):
    """``w · x / sqrt(mean(x²) + eps)`` (no centring, no bias) with LayerNorm's hooks:
    ``hook_scale`` ``[batch, pos, 1]`` and ``hook_normalized`` ``[batch, pos, d]`` (before the gain).
    With ``offset`` (Gemma) the gain is ``1 + w`` (``w`` starts at zero)."""

    def __init__(self, d: int, eps: float, offset: bool = False) -> None:
        super().__init__()
        self.eps, self.offset = eps, offset
        self.w = nn.Parameter(torch.zeros(d) if offset else torch.ones(d))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    b = None  # no bias (LayerNorm's ``b``)
    centred = False  # what direct logit attribution needs to know: RMSNorm does not subtract the mean

    def unhooked(self, x: torch.Tensor) -> torch.Tensor:
        """The norm of ``x`` without running its hooks (e.g. the logit lens on any residual)."""
        return F.rms_norm(x, x.shape[-1:], self.gain, self.eps)

    @property
    def gain(self) -> torch.Tensor:
        """The weight the normalised input is multiplied by: ``w``, or ``1 + w`` with ``offset``."""
        return self.w + 1.0 if self.offset else self.w

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (self.hook_scale.has_hooks or self.hook_normalized.has_hooks):
            return self.unhooked(x)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale) * self.gain


def norm(cfg: GPT2Config, d: int | None = None) -> LayerNorm | RMSNorm:
    """The config's normalisation layer over ``d`` (default ``d_model``)."""
    if cfg.norm == "rmsnorm":
        return RMSNorm(d or cfg.d_model, cfg.layer_norm_eps, cfg.norm_offset)
    return LayerNorm(d or cfg.d_model, cfg.layer_norm_eps)


class Embed(nn.Module):
    """The token embedding ``W_E`` ``[d_vocab, d_model]``; called on tokens ``[batch, pos]`` it gives
    ``W_E[tokens]`` ``[batch, pos, d_model]`` (TransformerLens's ``model.embed(tokens)``)."""

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.W_E[tokens]


class PosEmbed(nn.Module):
    """The learned position embedding ``W_pos`` ``[n_ctx, d_model]``; called on tokens ``[batch, pos]``
    it gives each position's row ``[batch, pos, d_model]``, as TransformerLens's ``model.pos_embed(tokens)``:
    positions start at ``past_kv_pos_offset``; with an ``attention_mask`` ``[batch, offset + pos]`` they
    are counted over real tokens and padding gets zeros."""

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))

    def forward(
        self, tokens: torch.Tensor, past_kv_pos_offset: int = 0, attention_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        batch, n = tokens.shape[0], tokens.shape[-1]
        if attention_mask is None:
            return self.W_pos[past_kv_pos_offset : past_kv_pos_offset + n].expand(batch, -1, -1).clone()
        pos = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, past_kv_pos_offset : past_kv_pos_offset + n]
        pad = ~attention_mask[:, past_kv_pos_offset : past_kv_pos_offset + n].bool()
        return self.W_pos[pos].masked_fill(pad[..., None], 0.0)


class Unembed(nn.Module):
    """Logits ``[..., d_vocab]`` of normalised residuals ``[..., d_model]``: ``x @ W_U``, with
    TransformerLens's hook points ``hook_in`` (the residual) and ``hook_out`` (the logits). Tied (GPT-2):
    ``W_U`` is ``W_Eᵀ`` of ``embed`` and the module holds no parameter; untied: its own ``W_U``
    ``[d_model, d_vocab]`` (state-dict key ``unembed.W_U``). ``b_U`` is zeros unless the config has
    ``unembed_bias`` (GPT-J). With ``final_softcap`` (Gemma 2) the returned logits are
    ``cap · tanh(logits / cap)``; ``hook_out`` sees them before the cap, as in TransformerLens."""

    def __init__(self, cfg: GPT2Config, embed: Embed) -> None:
        super().__init__()
        self.softcap = cfg.final_softcap
        if cfg.unembed_bias:
            self.register_parameter("b_U", nn.Parameter(torch.zeros(cfg.d_vocab)))
        if cfg.tied_embeddings:
            self.__dict__["_embed"] = embed  # read, not owned: not a submodule, not in the state dict
        else:
            self.register_parameter("W_U", nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab)))  # W_U: a property
        self.hook_in = HookPoint()
        self.hook_out = HookPoint()

    @property
    def W_U(self) -> torch.Tensor:  # [d_model, d_vocab]
        own = self._parameters.get("W_U")
        if own is not None:
            return own
        if "_embed" not in self.__dict__:
            raise AttributeError("W_U")  # an untied Unembed before its W_U is registered
        return self.__dict__["_embed"].W_E.T

    @property
    def b_U(self) -> torch.Tensor:  # [d_vocab] zeros without an unembedding bias
        own = self._parameters.get("b_U")
        if own is not None:
            return own
        W_U = self.W_U
        return W_U.new_zeros(W_U.shape[-1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        own = self._parameters.get("b_U")
        logits = self.hook_out(_linear(self.hook_in(x), self.W_U, own))
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def columns(self, x: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """The logits of the tokens ``cols [k]`` only, ``[..., k]``, of normalised residuals ``x [..., d_model]``:
        the same values as ``forward(x)[..., cols]`` (head bias and soft-cap included) without the full
        unembedding, and without the hooks."""
        logits = x @ self.W_U[:, cols]
        own = self._parameters.get("b_U")
        if own is not None:
            logits = logits + own[cols]
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """``x @ w + b`` for ``x: [..., d_in]``, ``w: [d_in, d_out]`` with one fused addmm (as GPT-2's Conv1D)."""
    if b is None:
        return x @ w
    return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).view(*x.shape[:-1], w.shape[-1])


def _bias(cfg: GPT2Config, n: int, on: bool | None = None) -> nn.Parameter | None:
    return nn.Parameter(torch.zeros(n)) if (cfg.bias if on is None else on) else None


def _yarn(inv_freq: torch.Tensor, d: int, theta: float, cfg: GPT2Config) -> torch.Tensor:
    """YaRN's frequencies (as transformers): interpolated (÷ ``rope_factor``) below the ramp between the dimensions
    that turn ``rope_beta_fast`` and ``rope_beta_slow`` times over the original context, kept above it."""

    def dim_of(rotations: float) -> float:
        return d * math.log(cfg.rope_original_ctx / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dim_of(cfg.rope_beta_fast), dim_of(cfg.rope_beta_slow)
    if cfg.rope_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float32, device=inv_freq.device) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp
    return inv_freq / cfg.rope_factor * (1 - keep) + inv_freq * keep


@boundary
def rope_inv_freq(
    d: int, theta: float, device: torch.device | None = None, cfg: GPT2Config | None = None
) -> torch.Tensor:
    """RoPE's inverse frequencies ``theta^(-2i/d)`` ``[d/2]`` (fp32) for ``d`` rotated dimensions, rescaled
    as ``cfg.rope_scaling`` says: ``"linear"`` divides them by ``rope_factor``; ``"llama3"`` divides the low
    frequencies by ``rope_factor`` and interpolates the middle band (Llama 3.1's scheme, as transformers)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d)
    if cfg is None or cfg.rope_scaling == "none":
        return inv_freq
    factor = cfg.rope_factor
    if cfg.rope_scaling == "linear":
        return inv_freq / factor
    if cfg.rope_scaling == "yarn":
        return _yarn(inv_freq, d, theta, cfg)
    low, high, old = cfg.rope_low_freq_factor, cfg.rope_high_freq_factor, cfg.rope_original_ctx
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


def rotary_cos_sin(
    pos: torch.Tensor,
    d_head: int,
    theta: float,
    dtype: torch.dtype,
    inv_freq: torch.Tensor | None = None,
    interleaved: bool = False,
    scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's ``(cos, sin)`` ``[batch|1, pos, 1, d_head]`` for integer positions ``pos: [batch|1, pos]``,
    in the half-split layout of ``transformers``' Llama: frequency ``i`` rotates the pair of dimensions
    ``(i, i + d_head/2)`` by ``pos · theta^(-2i/d_head)`` (``inv_freq`` replaces those frequencies);
    ``interleaved`` (GPT-J): the pair ``(2i, 2i + 1)``; ``scale`` multiplies cos and sin (YaRN's attention
    factor). Angles are computed in fp32."""
    if inv_freq is None:
        inv_freq = rope_inv_freq(d_head, theta, pos.device)
    angles = pos.float()[..., None] * inv_freq.to(pos.device)  # [batch, pos, d_head/2]
    if interleaved:
        angles = angles.repeat_interleave(2, dim=-1)[:, :, None]
    else:
        angles = torch.cat([angles, angles], dim=-1)[:, :, None]
    if scale != 1.0:
        return (angles.cos() * scale).to(dtype), (angles.sin() * scale).to(dtype)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """Apply RoPE to the first ``cos.shape[-1]`` dimensions of ``x: [batch, pos, head, d_head]``:
    ``x·cos + rotate_half(x)·sin`` (``interleaved``: GPT-J's ``rotate_every_two``); the rest pass through."""
    d = cos.shape[-1]
    if d < x.shape[-1]:
        return torch.cat([rotate(x[..., :d], cos, sin, interleaved), x[..., d:]], dim=-1)
    if interleaved:
        x1, x2 = x[..., ::2], x[..., 1::2]
        return x * cos + torch.stack([-x2, x1], dim=-1).flatten(-2) * sin
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


@boundary
class KVCache:
    """Keys and values of past positions for incremental decoding, preallocated per layer.

    ``k, v: [n_layer, batch, n_kv, max_len, d_head]`` (keys after RoPE), shaped from the model's
    config ``cfg`` for ``batch`` rows of up to ``max_len`` positions, allocated on ``device`` in
    ``dtype``; ``length`` positions are filled (the model's forward advances it after each call).
    """

    def __init__(self, cfg: GPT2Config, batch: int, max_len: int, device, dtype) -> None:
        shape = (cfg.n_layer, batch, cfg.n_kv, max_len, cfg.d_head)
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.length = 0

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new keys ``k`` and values ``v`` ``[batch, n_kv, new, d_head]`` of block ``layer`` after the
        ``length`` cached positions and return all of them so far, ``[batch, n_kv, length + new,
        d_head]`` each. More than ``max_len`` positions in all raise ValueError."""
        end = self.length + k.shape[2]
        if end > self.k.shape[3]:
            raise ValueError(f"KV cache holds {self.k.shape[3]} positions; {end} needed")
        self.k[layer, :, :, self.length : end] = k
        self.v[layer, :, :, self.length : end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


class Attention(nn.Module):
    """Causal self-attention with a fused QKV projection; grouped-query when ``n_kv < n_head``
    (query head ``i`` reads key/value head ``i // (n_head / n_kv)``); RoPE on q and k when the
    config is rotary (``hook_rot_q``/``hook_rot_k``; on the first ``rotary_dim`` dimensions, interleaved for
    GPT-J). With the config's q/k norm, ``q_norm``/``k_norm`` normalise the queries and keys after ``hook_q``/
    ``hook_k`` and before RoPE; a sliding layer (``cfg.is_sliding``) sees keys less than ``sliding_window``
    positions back; scores are scaled by ``attn_scale`` (default ``d_head ** -0.5``) and soft-capped by
    ``attn_softcap``.

    Uses ``scaled_dot_product_attention`` unless a hook asks for the scores or the pattern, or the scores are
    soft-capped, in which case they are materialised (same result within fp error). The per-head results
    ``hook_result`` ``[batch, pos, head, d_model]`` are computed only when the model's ``cfg.use_attn_result`` is
    on (as in TransformerLens); otherwise ``hook_result`` never fires.
    """

    # set in __init__ by name (hook_rot_q, hook_rot_k with rotary positions only)
    hook_q: HookPoint
    hook_k: HookPoint
    hook_v: HookPoint
    hook_attn_scores: HookPoint
    hook_pattern: HookPoint
    hook_z: HookPoint
    hook_result: HookPoint
    hook_rot_q: HookPoint
    hook_rot_k: HookPoint

    def __init__(self, cfg: GPT2Config, layer: int) -> None:
        super().__init__()
        self.cfg, self.layer = cfg, layer
        d, h, kv, dh = cfg.d_model, cfg.n_head, cfg.n_kv, cfg.d_head
        self.W_QKV = nn.Parameter(torch.empty(d, (h + 2 * kv) * dh))
        self.b_QKV = _bias(cfg, (h + 2 * kv) * dh, cfg.has_qkv_bias)
        self.W_O = nn.Parameter(torch.empty(h, dh, d))
        self.b_O = _bias(cfg, d, cfg.has_attn_out_bias)
        # q/k norms: Qwen 3 and Gemma 3 per head over d_head, OLMo 2 over the whole projection
        if cfg.qk_norm != "none":
            full = cfg.qk_norm == "full"
            self.q_norm = norm(cfg, h * dh if full else dh)
            self.k_norm = norm(cfg, kv * dh if full else dh)
        self.window = cfg.sliding_window if cfg.is_sliding(layer) else None
        self.local_rope = self.window is not None and cfg.rope_local_theta is not None
        self.scale = cfg.attn_scale if cfg.attn_scale is not None else 1 / math.sqrt(dh)
        self.softcap = cfg.attn_softcap
        names = ["q", "k", "v", "attn_scores", "pattern", "z", "result"]  # result: only with cfg.use_attn_result
        if cfg.positional == "rotary":
            names += ["rot_q", "rot_k"]
        for name in names:
            setattr(self, f"hook_{name}", HookPoint())

    # Per-head views, TransformerLens shapes (writes through them edit W_QKV).
    def _split(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        c = self.cfg
        return t.split([c.n_head * c.d_head, c.n_kv * c.d_head, c.n_kv * c.d_head], dim=-1)

    def _head_view(self, which: int) -> torch.Tensor:
        w = self._split(self.W_QKV)[which]
        return w.view(self.cfg.d_model, -1, self.cfg.d_head).permute(1, 0, 2)

    @property
    def W_Q(self) -> torch.Tensor:  # [n_head, d_model, d_head]
        return self._head_view(0)

    @property
    def W_K(self) -> torch.Tensor:  # [n_kv, d_model, d_head]
        return self._head_view(1)

    @property
    def W_V(self) -> torch.Tensor:  # [n_kv, d_model, d_head]
        return self._head_view(2)

    def _bias_view(self, which: int) -> torch.Tensor | None:  # [n_head | n_kv, d_head]
        return None if self.b_QKV is None else self._split(self.b_QKV)[which].view(-1, self.cfg.d_head)

    @property
    def b_Q(self) -> torch.Tensor | None:
        return self._bias_view(0)

    @property
    def b_K(self) -> torch.Tensor | None:
        return self._bias_view(1)

    @property
    def b_V(self) -> torch.Tensor | None:
        return self._bias_view(2)

    def _per_head(self, x: torch.Tensor, which: int) -> torch.Tensor:
        """Head ``i``'s projection of its own input: ``x: [batch, pos, head, d_model]`` (query heads for
        ``which`` 0, key/value heads for 1 and 2) → ``[batch, pos, head, d_head]``; the same arithmetic
        as the fused projection (one ``d_model × d_head`` product per head and position)."""
        out = einsum(x, self._head_view(which), "b p h d, h d e -> b p h e")
        bias = self._bias_view(which)
        return out if bias is None else out + bias

    def _qk_norm(self, t: torch.Tensor, which: str) -> torch.Tensor:
        """``t: [batch, pos, head, d_head]`` through the q or k norm (``which``), if the config has one."""
        if self.cfg.qk_norm == "none":
            return t
        n = self.q_norm if which == "q" else self.k_norm
        return n(t) if self.cfg.qk_norm == "head" else n(t.flatten(-2)).unflatten(-1, t.shape[-2:])

    def _rope(self, rope: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's ``(cos, sin)`` of the model's ``rope`` (Gemma 3's local layers take the second pair)."""
        return (rope[2], rope[3]) if self.local_rope and len(rope) == 4 else (rope[0], rope[1])

    def keys_values(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, ...] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (after RoPE) and values ``[batch, n_kv, pos, d_head]`` of normalised input
        ``x: [batch, pos, d_model]``, as the forward pass would cache them (no hooks run)."""
        c = self.cfg
        kv = _linear(
            x, self.W_QKV[:, c.n_head * c.d_head :], None if self.b_QKV is None else self.b_QKV[c.n_head * c.d_head :]
        )
        k, v = (t.unflatten(-1, (c.n_kv, c.d_head)) for t in kv.chunk(2, dim=-1))
        k = self._qk_norm(k, "k")
        if rope is not None:
            k = rotate(k, *self._rope(rope), interleaved=c.rotary_interleaved)
        return k.transpose(1, 2), v.transpose(1, 2)

    def _window_mask(
        self, mask: torch.Tensor | None, q_len: int, k_len: int, device: torch.device
    ) -> torch.Tensor | None:
        """``mask`` narrowed to the sliding window: query column ``i`` sees key column ``j`` only when
        ``i - j < window`` (transformers' rule); unchanged when no key is that far back."""
        if self.window is None or k_len <= self.window:
            return mask
        qcol = torch.arange(k_len - q_len, k_len, device=device)[:, None]
        kcol = torch.arange(k_len, device=device)[None]
        band = (kcol <= qcol) & (qcol - kcol < self.window)
        return band[None, None] if mask is None else mask & band

    def forward(
        self,
        x: torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None,
        kv: KVCache | None = None,
        rope: tuple[torch.Tensor, ...] | None = None,
    ) -> torch.Tensor:
        """``x: [batch, pos, d_model]``, or per-head inputs ``(query [batch, pos, head, d_model], key and
        value [batch, pos, kv_head, d_model])`` (the block's split inputs, already normalised): head ``i``
        projects only its own slice; ``mask``: bool ``[batch|1, 1, q, k]`` (True = may attend) or None for
        plain causal attention; ``rope``: ``(cos, sin)`` of :func:`rotary_cos_sin`."""
        c = self.cfg
        if isinstance(x, tuple):
            q, k, v = (self._per_head(t, which) for which, t in enumerate(x))
        else:
            q, k, v = (t.unflatten(-1, (-1, c.d_head)) for t in self._split(_linear(x, self.W_QKV, self.b_QKV)))
        q, k, v = self.hook_q(q), self.hook_k(k), self.hook_v(v)  # [batch, pos, head | kv_head, d_head]
        q, k = self._qk_norm(q, "q"), self._qk_norm(k, "k")
        if rope is not None:
            cos, sin = self._rope(rope)
            q = self.hook_rot_q(rotate(q, cos, sin, c.rotary_interleaved))
            k = self.hook_rot_k(rotate(k, cos, sin, c.rotary_interleaved))
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # [batch, head, pos, d_head]
        if kv is not None:
            k, v = kv.extend(self.layer, k, v)
        mask = self._window_mask(mask, q.shape[2], k.shape[2], q.device)
        gqa = c.n_kv != c.n_head
        if self.hook_attn_scores.has_hooks or self.hook_pattern.has_hooks or self.softcap is not None:
            if gqa:
                k, v = (t.repeat_interleave(c.n_head // c.n_kv, dim=1) for t in (k, v))
            scores = q @ k.transpose(-1, -2) * self.scale
            if self.softcap is not None:
                scores = torch.tanh(scores / self.softcap) * self.softcap
            if mask is None:
                q_len, k_len = scores.shape[-2:]
                mask = torch.ones(q_len, k_len, dtype=torch.bool, device=q.device).tril(k_len - q_len)
            scores = self.hook_attn_scores(scores.masked_fill(~mask, float("-inf")))
            exact = torch.promote_types(scores.dtype, torch.float32)  # half precision softmaxes in float32
            pattern = self.hook_pattern(torch.softmax(scores.to(exact), dim=-1).to(v.dtype))
            z = pattern @ v
        else:
            causal = mask is None and q.shape[2] == k.shape[2]
            if gqa:
                z = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True, scale=self.scale
                )
            else:
                z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=self.scale)
        z = self.hook_z(z.transpose(1, 2))  # [batch, pos, head, d_head]
        if c.use_attn_result:  # TransformerLens's opt-in per-head results (model.set_use_attn_result(True))
            result = self.hook_result(einsum(z, self.W_O, "b p h dh, h dh d -> b p h d"))
            out = result.sum(-2)
            return out if self.b_O is None else out + self.b_O
        return _linear(z.flatten(-2), self.W_O.view(-1, c.d_model), self.b_O)


class MLP(nn.Module):
    """GPT-2: ``W_out · gelu_new(W_in · x + b_in) + b_out`` (``mlp="gelu_erf"``: exact GELU, GPT-NeoX);
    SwiGLU: ``W_out · (silu(W_gate · x) ⊙ W_in · x)`` (``mlp="geglu"``: a tanh-GELU gate, Gemma).

    Hooks ``[batch, pos, d_mlp]``: ``hook_pre`` (the activation function's input: GPT-2's
    ``W_in·x``, the gated MLPs' gate), ``hook_pre_linear`` (the gated MLPs' up projection ``W_in·x``) and
    ``hook_post`` (the input of ``W_out``: ROME's key).
    """

    def __init__(self, cfg: GPT2Config) -> None:
        super().__init__()
        self.kind = cfg.mlp
        self.gated = cfg.mlp in ("swiglu", "geglu")
        if self.gated:
            self.W_gate = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
            self.hook_pre_linear = HookPoint()
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.b_in = _bias(cfg, cfg.d_mlp)
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_out = _bias(cfg, cfg.d_model)
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gated:
            pre = self.hook_pre(x @ self.W_gate)
            act = F.silu(pre) if self.kind == "swiglu" else F.gelu(pre, approximate="tanh")
            post = self.hook_post(act * self.hook_pre_linear(_linear(x, self.W_in, self.b_in)))
        else:
            pre = self.hook_pre(_linear(x, self.W_in, self.b_in))
            post = self.hook_post(F.gelu(pre, approximate="tanh" if self.kind == "gelu" else "none"))
        return _linear(post, self.W_out, self.b_out)


def head_copies(x: torch.Tensor, n: int) -> torch.Tensor:
    """``n`` copies of ``x: [batch, pos, d_model]``, one per head: ``[batch, pos, n, d_model]`` in memory
    of its own (so a hook may write one head's copy in place)."""
    return repeat(x, "b p d -> b p h d", h=n).contiguous()


class Block(nn.Module):
    """A pre-norm transformer block: ``x + attn(ln1(x))``, then ``+ mlp(ln2(·))``; by the config's
    ``norm_position``, ``"sandwich"`` (Gemma) also normalises each output (``ln1_post``, ``ln2_post``) and
    ``"post"`` (OLMo 2) normalises only the outputs (no ``ln1``/``ln2``); ``parallel`` (GPT-NeoX, GPT-J)
    adds attention and MLP of the same residual, ``x + attn(ln1(x)) + mlp(ln2(x))``, with one shared
    norm ``ln1`` for ``"one_norm"`` (GPT-J; no ``ln2``).

    The receiver-input hooks fire only when the model's switch is on (TransformerLens's, see
    :class:`~.config.ModelConfig`): ``hook_q_input`` ``[batch, pos, head, d_model]``, ``hook_k_input``
    and ``hook_v_input`` ``[batch, pos, kv_head, d_model]`` (``use_split_qkv_input``), ``hook_attn_in``
    ``[batch, pos, head, d_model]`` (``use_attn_in``), each a copy of the residual stream *before*
    ``ln1``, normalised per copy; ``hook_mlp_in`` ``[batch, pos, d_model]`` (``use_hook_mlp_in``), a
    copy of the residual before ``ln2``. Off, the block computes exactly as without them.
    """

    # set in __init__ by name
    hook_resid_pre: HookPoint
    hook_attn_in: HookPoint
    hook_q_input: HookPoint
    hook_k_input: HookPoint
    hook_v_input: HookPoint
    hook_attn_out: HookPoint
    hook_resid_mid: HookPoint
    hook_mlp_in: HookPoint
    hook_mlp_out: HookPoint
    hook_resid_post: HookPoint

    def __init__(self, cfg: GPT2Config, layer: int) -> None:
        super().__init__()
        self.cfg = cfg  # the model's view: its switches (use_split_qkv_input, …) are read in forward
        pre, post = cfg.norm_position != "post", cfg.norm_position != "pre"
        self.ln1: nn.Module = norm(cfg) if pre else nn.Identity()
        if post:
            self.ln1_post = norm(cfg)
        self.attn = Attention(cfg, layer)
        self.ln2: nn.Module = norm(cfg) if pre and cfg.parallel != "one_norm" else nn.Identity()
        if post:
            self.ln2_post = norm(cfg)
        self.mlp = MLP(cfg)
        names = ("resid_pre", "attn_in", "q_input", "k_input", "v_input", "attn_out", "resid_mid", "mlp_in")
        for name in (*names, "mlp_out", "resid_post"):
            setattr(self, f"hook_{name}", HookPoint())

    def attention_input(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What the attention reads from the residual ``x: [batch, pos, d_model]``: ``ln1(x)``, or with a
        split-input switch on, the per-head copies (hooked, then normalised one by one, as in
        TransformerLens: ``ln1``'s hooks fire per copy)."""
        c = self.cfg
        if c.use_split_qkv_input:
            q = self.hook_q_input(head_copies(x, c.n_head))
            k = self.hook_k_input(head_copies(x, c.n_kv))
            v = self.hook_v_input(head_copies(x, c.n_kv))
            return self.ln1(q), self.ln1(k), self.ln1(v)
        if c.use_attn_in:
            shared = self.ln1(self.hook_attn_in(head_copies(x, c.n_head)))
            return shared, shared, shared
        return self.ln1(x)

    def forward(
        self,
        x: torch.Tensor,
        mask: torch.Tensor | None,
        kv: KVCache | None = None,
        rope: tuple[torch.Tensor, ...] | None = None,
    ) -> torch.Tensor:
        c = self.cfg
        x = self.hook_resid_pre(x)
        attn_in = self.attention_input(x)
        attn_out = self.attn(attn_in, mask, kv, rope)
        if c.norm_position != "pre":
            attn_out = self.ln1_post(attn_out)
        attn_out = self.hook_attn_out(attn_out)
        if c.parallel != "none":  # both read the block's input; GPT-J's MLP reads ln1's output
            mlp_in = self.hook_mlp_in(x.clone()) if c.use_hook_mlp_in else x
            if c.parallel == "one_norm":
                h = attn_in if isinstance(attn_in, torch.Tensor) and not c.use_hook_mlp_in else self.ln1(mlp_in)
            else:
                h = self.ln2(mlp_in)
            return self.hook_resid_post(x + attn_out + self.hook_mlp_out(self.mlp(h)))
        x = self.hook_resid_mid(x + attn_out)
        mlp_in = self.hook_mlp_in(x.clone()) if c.use_hook_mlp_in else x
        mlp_out = self.mlp(self.ln2(mlp_in))
        if c.norm_position != "pre":
            mlp_out = self.ln2_post(mlp_out)
        return self.hook_resid_post(x + self.hook_mlp_out(mlp_out))
