"""``HookedGPT2``: GPT-2 — and, by configuration, its Llama-style descendants — with a named hook
point on every activation worth reading.

One class serves both families (as litgpt keeps one ``Config`` for many): the config picks the
norm, positions, MLP and attention grouping (see :mod:`.config`), the blocks read it, and every
tool downstream sees the same parameter names (``blocks[i].attn.W_O``, ``mlp.W_in``/``W_out``)
and TransformerLens's hook names. TransformerLens's name for it, ``HookedTransformer``, lives in :mod:`.tl_names`.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from ..core.boundary import boundary
from ..core.checks import check_index, check_prompts
from ..io import tokenizer as tok
from .config import KNOWN_CONFIGS, GPT2Config, ModelConfig
from .hooks import HookPoint, note_input, warn_if_nonfinite, warn_port, watch_replacements
from .modules import Block, Embed, KVCache, PosEmbed, Unembed, norm, rope_inv_freq, rotary_cos_sin
from .root import HookedRootModule
from .tl_aliases import StateDict, TransformerLensAliases, is_tl_state_dict

Input = str | Sequence[str] | torch.Tensor


def _weight(module: nn.Module | None, name: str) -> torch.Tensor:
    """The parameter ``name`` set on a plain ``nn.Module`` (``embed.W_E``, ``pos_embed.W_pos``, ``unembed.W_U``)."""
    w = getattr(module, name)
    assert isinstance(w, torch.Tensor), f"{name} must be a parameter"
    return w


_BLOCK_HOOK_ORDER = (
    "hook_resid_pre",
    "hook_attn_in",
    "hook_q_input",
    "hook_k_input",
    "hook_v_input",
    "ln1.hook_scale",
    "ln1.hook_normalized",
    "attn.hook_q",
    "attn.hook_k",
    "attn.hook_v",
    "attn.q_norm.hook_scale",
    "attn.q_norm.hook_normalized",
    "attn.k_norm.hook_scale",
    "attn.k_norm.hook_normalized",
    "attn.hook_rot_q",
    "attn.hook_rot_k",
    "attn.hook_attn_scores",
    "attn.hook_pattern",
    "attn.hook_z",
    "attn.hook_result",
    "ln1_post.hook_scale",
    "ln1_post.hook_normalized",
    "hook_attn_out",
    "hook_resid_mid",
    "hook_mlp_in",
    "ln2.hook_scale",
    "ln2.hook_normalized",
    "mlp.hook_pre",
    "mlp.hook_pre_linear",
    "mlp.hook_post",
    "ln2_post.hook_scale",
    "ln2_post.hook_normalized",
    "hook_mlp_out",
    "hook_resid_post",
)  # the forward order; hooks a config lacks (rot_q/rot_k, pre_linear, pos_embed) are skipped


@boundary
class HookedGPT2(HookedRootModule, TransformerLensAliases):
    """Exactly GPT-2 (pre-LN, fused QKV, GELU-new, learned positions, tied unembedding) by default;
    with a Llama-style config (:func:`.config.llama_config`) RMSNorm, rotary positions, SwiGLU,
    grouped-query attention, no biases and an optionally untied ``unembed.W_U``; the later families (Qwen,
    Mistral, OLMo 2, GPT-NeoX, GPT-J, Gemma, Phi-3) by their config values (:mod:`.families`).
    TransformerLens hook names.

    ``cfg``: a :class:`GPT2Config` or the name of one in :data:`KNOWN_CONFIGS` (default ``"gpt2"``; an
    unknown name raises KeyError). The weights are freshly initialised (:meth:`init_weights`, seeded
    by ``seed`` when given); :func:`gpt2_interp.load` builds a model with trained weights.
    ``tokenizer``: the model's own :class:`~gpt2_interp.io.Tokenizer` (default: a new GPT-2 BPE).

    >>> model = HookedGPT2(GPT2Config(n_layer=2, d_model=64, n_head=4, d_mlp=256, n_ctx=32))
    >>> logits, cache = model.run_with_cache("Hello world", names_filter="blocks.0.hook_resid_post")
    """

    def __init__(
        self, cfg: GPT2Config | str = "gpt2", seed: int | None = None, tokenizer: tok.Tokenizer | None = None
    ) -> None:
        super().__init__()
        # Hugging Face's interface too (model.tokenizer(texts, padding=True), .decode, …); its own per model
        self.tokenizer: tok.Tokenizer = tokenizer if tokenizer is not None else tok.GPT2Tokenizer()
        if isinstance(cfg, str):
            if cfg not in KNOWN_CONFIGS:
                raise KeyError(f"unknown config {cfg!r}; known: {', '.join(KNOWN_CONFIGS)}")
            cfg = KNOWN_CONFIGS[cfg]
        self.embed = Embed(cfg)
        # the model's own view of the shared config: TL's cfg.device / cfg.use_attn_result (config.ModelConfig)
        self.cfg = cfg = ModelConfig.of(cfg, self.embed)
        self.hook_tokens = HookPoint()  # [batch, pos] token ids; hooked only after set_use_hook_tokens(True)
        self.hook_embed = HookPoint()
        if cfg.positional == "learned":
            self.pos_embed = PosEmbed(cfg)
            self.hook_pos_embed = HookPoint()
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.ln_final = norm(cfg)
        self.unembed = Unembed(cfg, self.embed)  # state-dict key "unembed.W_U" when untied, as in TransformerLens
        self.setup()  # names every HookPoint (HookedRootModule); then put them in forward order
        found = self.hook_dict
        order = ["hook_tokens", "hook_embed", "hook_pos_embed"]
        for i in range(cfg.n_layer):
            order += [f"blocks.{i}.{n}" for n in _BLOCK_HOOK_ORDER]
        order += ["ln_final.hook_scale", "ln_final.hook_normalized", "unembed.hook_in", "unembed.hook_out"]
        order = [n for n in order if n in found]
        assert sorted(order) == sorted(found), "every hook point must have a place in the forward order"
        self.hook_dict: dict[str, HookPoint] = {n: found[n] for n in order if n != "hook_tokens"}
        self.init_weights(seed)

    def set_use_hook_tokens(self, use_hook_tokens: bool) -> None:
        """Run the hook point ``hook_tokens`` on the token ids ``[batch, pos]`` of every forward pass
        (a hook may read or replace them), and list it in ``hook_dict``: TransformerLens's
        ``cfg.use_hook_tokens``, off by default (as there, the name is unknown while off)."""
        if use_hook_tokens and "hook_tokens" not in self.hook_dict:
            self.hook_dict = {"hook_tokens": self.hook_tokens, **self.hook_dict}
        elif not use_hook_tokens:
            self.hook_tokens.remove_hooks("both", including_permanent=True)
            self.hook_dict.pop("hook_tokens", None)

    # ------------------------------------------------------------------ weights
    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """GPT-2's initialisation: N(0, 0.02), output projections scaled by 1/sqrt(2·n_layer); norm gains 1."""
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        std, proj_std = 0.02, 0.02 / math.sqrt(2 * self.cfg.n_layer)
        for name, p in self.named_parameters():
            if name.endswith((".w",)):
                p.fill_(0.0 if self.cfg.norm_offset and self.cfg.norm == "rmsnorm" else 1.0)
            elif name.endswith((".b", "b_QKV", "b_O", "b_in", "b_out", "b_U")):
                p.zero_()
            else:
                s = proj_std if name.endswith(("W_O", "W_out")) else std
                p.copy_(torch.randn(p.shape, generator=g) * s)

    @property
    def W_E(self) -> torch.Tensor:  # [d_vocab, d_model]
        """The token embedding ``[d_vocab, d_model]`` (the parameter itself, not a copy)."""
        return self.embed.W_E

    @property
    def W_pos(self) -> torch.Tensor | None:  # [n_ctx, d_model]; None with rotary positions
        """The learned position embedding ``[n_ctx, d_model]``; None with rotary positions."""
        return self.pos_embed.W_pos if self.cfg.positional == "learned" else None

    @property
    def W_U(self) -> torch.Tensor:  # [d_model, d_vocab]: W_Eᵀ when tied
        """The unembedding ``[d_model, d_vocab]``: ``W_E.T`` (a view) when the embeddings are tied."""
        return self.unembed.W_U

    @property
    def device(self) -> torch.device:
        """The device of the model's parameters (that of ``W_E``)."""
        return self.embed.W_E.device

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model's parameters (that of ``W_E``)."""
        return self.embed.W_E.dtype

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        """The parameters by name (ours: ``blocks.{l}.attn.W_QKV`` fused), in which TransformerLens's
        names (``blocks.{l}.attn.W_Q``, ``unembed.W_U``, …) are found too (:class:`.tl_aliases.StateDict`)."""
        sd = super().state_dict(*args, **kwargs)
        if args or kwargs.get("destination") is not None or kwargs.get("prefix"):
            return sd
        view = StateDict(sd)
        view._metadata = getattr(sd, "_metadata", None)
        view.cfg = self.cfg.config
        return view

    def named_parameters(self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True) -> Any:
        """``nn.Module.named_parameters``. Called from user code, once per model a :class:`PortingWarning`
        says that the attention's query/key/value weights are one fused ``attn.W_QKV``/``b_QKV`` per
        block, not TransformerLens's ``W_Q``/``W_K``/``W_V`` parameters (calls from torch, e.g. an
        optimizer's ``parameters()``, and from gpt2-interp itself stay quiet). ``prefix``, ``recurse`` and
        ``remove_duplicate`` are torch's."""
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if not self.__dict__.get("_noted_fused_names") and not caller.startswith(("torch", "gpt2_interp")):
            self.__dict__["_noted_fused_names"] = True
            warn_port(
                "named_parameters(): each block's query/key/value weights are one fused parameter "
                "blocks.{l}.attn.W_QKV (and b_QKV), not TransformerLens's W_Q/W_K/W_V/b_Q/b_K/b_V; read those by "
                "TL's names from model.state_dict() (views, e.g. state_dict()['blocks.0.attn.W_Q']) or as "
                "model.blocks[l].attn.W_Q (writable views of W_QKV)"
            )
        return super().named_parameters(prefix, recurse, remove_duplicate)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """``nn.Module.load_state_dict``; a TransformerLens state dict (unfused ``attn.W_Q``…, not
        folded) is converted first, its buffers skipped and its zero biases checked, as TL loads its own.
        ``state_dict``: ours or TransformerLens's; ``strict`` and ``assign`` are torch's."""
        if is_tl_state_dict(state_dict):
            from .loading import tl_to_native

            state_dict = tl_to_native(state_dict, self.cfg.config)
        return super().load_state_dict(state_dict, strict=strict, assign=assign)

    def n_params(self) -> int:
        """Number of distinct parameters (a tied W_U is W_E, counted once): 124,439,808 for gpt2."""
        return sum(p.numel() for p in self.parameters())

    # ------------------------------------------------------------------ tokens
    def to_tokens(
        self,
        text: str | Sequence[str],
        prepend_bos: bool = True,
        padding_side: str | None = None,
        move_to_device: bool = True,
        truncate: bool = True,
    ) -> torch.Tensor:
        """Token ids ``[batch, pos]`` of ``text`` (a string gives batch 1), BOS first when ``prepend_bos``
        (default True) and the tokenizer has one; a list is padded with the pad token (``<|endoftext|>``
        for GPT-2) on the LEFT unless ``padding_side="right"`` (TransformerLens pads right; see
        docs/porting.md): every row's last token is then in the last column. A
        ``model.tokenizer.padding_side`` that was set is honoured, as in TransformerLens; padding a
        list with neither given emits a ``PortingWarning``. The tokens are on the model's device
        (``move_to_device`` and ``truncate`` are TransformerLens's keywords and are ignored: input
        longer than the context raises when it is run). Empty text with no BOS, an empty list or a
        non-string raise ValueError/TypeError."""
        padding_side = padding_side or self.tokenizer.chosen_padding_side
        tokens, mask = self.tokenize(text, prepend_bos, padding_side or "left")
        if padding_side is None and mask is not None:
            warn_port(
                "to_tokens(list) pads on the LEFT (TransformerLens pads right): `tokens[:, -1]` and "
                "`logits[:, -1]` are every row's last token. Pass padding_side='left' (or set "
                "model.tokenizer.padding_side) to silence this, or padding_side='right' for "
                "TransformerLens's layout."
            )
        return tokens

    def tokenize(
        self, text: str | Sequence[str], prepend_bos: bool = True, padding_side: str = "left", what: str = "text"
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(tokens [batch, pos], attention_mask [batch, pos] or None)`` of ``text`` (a string or a list
        of strings), BOS first when ``prepend_bos``, padded on ``padding_side`` (default ``"left"``);
        the mask marks real tokens and is None when no row needed padding. ``what`` names ``text`` in
        errors (e.g. ``"input"``). A row with no tokens raises ValueError."""
        texts = check_prompts(text, what)
        bos = [self.tokenizer.bos_id] if prepend_bos and self.tokenizer.bos_id is not None else []
        rows = [bos + self.tokenizer.encode_ids(t) for t in texts]
        if not all(rows):
            raise ValueError("empty input: the text has no tokens and no BOS is prepended")
        return self.pad(rows, padding_side)

    def pad(
        self, rows: Sequence[Sequence[int]], padding_side: str = "left"
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Token rows of different lengths as ``(tokens [batch, pos], attention_mask [batch, pos] or None)``
        on the model's device, padded with the tokenizer's pad id; the mask (1 = real token) is None
        when no row needed padding. Left padding keeps every row's last token in the last column."""
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
        width = max(map(len, rows))
        tokens = torch.full((len(rows), width), self.tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            sl = slice(width - len(r), width) if padding_side == "left" else slice(0, len(r))
            tokens[i, sl] = torch.as_tensor(list(r), dtype=torch.long)
            mask[i, sl] = 1
        padded = any(len(r) != width for r in rows)
        return tokens.to(self.device, non_blocking=True), (mask.to(self.device, non_blocking=True) if padded else None)

    def to_string(self, tokens: torch.Tensor | Sequence[int]) -> str | list[str]:
        """Decode ``[pos]`` to a string or ``[batch, pos]`` to a list of strings."""
        t = torch.as_tensor(tokens)
        if t.ndim == 0:  # one id
            t = t[None]
        if t.ndim == 2:
            return [self.tokenizer.decode_ids(r.tolist()) for r in t]
        return self.tokenizer.decode_ids(t.tolist())

    def to_str_tokens(self, text_or_tokens: str | torch.Tensor | Sequence[int], prepend_bos: bool = True) -> list[str]:
        """The string of each token (BOS included when ``prepend_bos`` and given text)."""
        if isinstance(text_or_tokens, str):
            ids = self.to_tokens(text_or_tokens, prepend_bos=prepend_bos)[0].tolist()
        else:
            t = torch.as_tensor(text_or_tokens)
            if t.ndim == 2:
                if t.shape[0] != 1:
                    raise ValueError("to_str_tokens takes one sequence; index the batch first")
                t = t[0]
            ids = t.tolist()
        return [self.tokenizer.token_str(i) for i in ids]

    def to_single_token(self, text: str | int) -> int:
        """The id of ``text`` if it is exactly one token (an int id is range-checked and returned);
        otherwise a ValueError showing how it tokenizes. The one single-token rule of the package."""
        if isinstance(text, bool) or (not isinstance(text, (str, int)) and not hasattr(text, "__index__")):
            raise TypeError(
                f"a single token is given as a string (e.g. ' Paris') or an int id, got {type(text).__name__}"
            )
        if not isinstance(text, str):
            i = int(text.__index__())
            if not 0 <= i < self.cfg.d_vocab:
                raise ValueError(f"token id {i} is outside the vocabulary [0, {self.cfg.d_vocab})")
            return i
        ids = self.tokenizer.encode_ids(text)
        if len(ids) != 1:
            pieces = [self.tokenizer.token_str(i) for i in ids]
            hint = ""
            if text[:1] != " " and len(self.tokenizer.encode_ids(" " + text)) == 1:
                hint = f"; words inside a sentence usually start with a space: {' ' + text!r} is one token"
            raise ValueError(f"{text!r} is {len(ids)} tokens {pieces}, not one{hint}")
        return ids[0]

    # ------------------------------------------------------------------ forward
    def as_tokens(
        self, input: Input, attention_mask: torch.Tensor | None, prepend_bos: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Any model input (text, texts, token ids ``[pos]`` or ``[batch, pos]``) as
        ``(tokens [batch, pos] on the model's device, attention_mask or None)``, range-checked.

        Text is tokenized with BOS when ``prepend_bos`` and gets its mask from the padding (giving an
        ``attention_mask`` with text raises ValueError); a given ``attention_mask`` for tokens is
        moved to the model's device. Non-integer tokens raise TypeError; empty tokens or an id
        outside the vocabulary raise ValueError."""
        if isinstance(input, torch.Tensor):
            tokens = input if input.ndim == 2 else input[None]
            if tokens.dtype not in (torch.long, torch.int, torch.int32, torch.int64):
                raise TypeError(f"tokens must be integer ids, got {tokens.dtype}")
            if tokens.numel() == 0:
                raise ValueError("empty input: no tokens to run")
            # range-checked where the ids are (free on the CPU; one read-back for ids already on a GPU)
            lo, hi = torch.stack(torch.aminmax(tokens)).tolist()
            if lo < 0 or hi >= self.cfg.d_vocab:
                raise ValueError(
                    f"token id {hi if hi >= self.cfg.d_vocab else lo} is outside the vocabulary [0, {self.cfg.d_vocab})"
                )
            tokens = tokens.to(self.device, torch.long, non_blocking=True)
        else:
            if attention_mask is not None:
                raise ValueError("attention_mask is computed for text input; pass tokens to give your own")
            tokens, attention_mask = self.tokenize(
                input, prepend_bos, what="input"
            )  # ids from the tokenizer are in range
        if attention_mask is not None:
            attention_mask = attention_mask.to(self.device)
        return tokens, attention_mask

    def check_layer(self, layer: Any, what: str = "layer", allow_end: bool = False) -> int:
        """``layer`` (integer-like, negative from the end) as a block index, else a clear error naming
        ``what`` (default ``"layer"``): TypeError for a non-integer, IndexError out of range.
        ``allow_end`` also accepts ``n_layer`` (an exclusive bound). The one layer check of the package."""
        n = self.cfg.n_layer
        return check_index(layer, n, what, f"the model has {n} layers", allow_end)

    def check_length(self, n: int) -> None:
        """Raise a ValueError naming the context size when ``n`` tokens do not fit."""
        if n > self.cfg.n_ctx:
            raise ValueError(
                f"input is {n} tokens long but {self.cfg.name} has a context of {self.cfg.n_ctx}; "
                "shorten the prompt (or generate fewer tokens)"
            )

    def _attention_mask(self, q_len: int, past: int, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """Bool ``[batch|1, 1, q, k]`` (True = may attend), or None for plain causal attention."""
        # a given mask is used as it is: testing it for "no padding" would read it back from the device
        # on every call (a host sync); tokenize() gives None when nothing is padded
        if attention_mask is None:
            return None if past == 0 or q_len == 1 else self._causal(q_len, past)[None, None]
        keys = attention_mask[:, None, None, : past + q_len].bool()
        causal = self._causal(q_len, past)
        own = torch.zeros_like(causal)
        own[:, past:] = torch.eye(q_len, dtype=torch.bool, device=causal.device)
        # a pad query sees nothing real: let it see itself so softmax stays finite (its output is unused)
        return (causal & keys) | own

    def _causal(self, q_len: int, past: int) -> torch.Tensor:
        return torch.ones(q_len, past + q_len, dtype=torch.bool, device=self.device).tril(past)

    def positions(self, q_len: int, past: int, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Position of each of ``q_len`` queries ``[batch|1, q_len]`` after ``past`` cached tokens:
        counted over real tokens only when an ``attention_mask`` ``[batch, past + q_len]`` is given (a
        left-padded row starts at position 0, as it would alone)."""
        if attention_mask is None:
            return torch.arange(past, past + q_len, device=self.device)[None]
        return (attention_mask.to(self.device).cumsum(-1) - 1).clamp(min=0)[:, past : past + q_len]

    def rotary(self, pos: torch.Tensor) -> tuple[torch.Tensor, ...] | None:
        """RoPE ``(cos, sin)`` ``[batch|1, pos, 1, rotary_dim]`` for positions ``pos`` (rescaled as the config's
        ``rope_scaling`` says), followed by the local layers' pair when they have their own base
        (``rope_local_theta``, Gemma 3); None without rotary positions."""
        c = self.cfg
        if c.positional != "rotary":
            return None
        d = c.rotary_width
        inv = rope_inv_freq(d, c.rope_theta, pos.device, c)
        scale = c.rope_attention_factor if c.rope_scaling == "yarn" else 1.0
        rope: tuple[torch.Tensor, ...] = rotary_cos_sin(
            pos, d, c.rope_theta, self.dtype, inv, c.rotary_interleaved, scale
        )
        if c.rope_local_theta is not None and c.sliding_window is not None:
            local = rope_inv_freq(d, c.rope_local_theta, pos.device)
            rope += rotary_cos_sin(pos, d, c.rope_local_theta, self.dtype, local, c.rotary_interleaved)
        return rope

    def forward(
        self,
        input: Input,
        return_type: Literal["logits", "loss", "both"] | None = "logits",
        attention_mask: torch.Tensor | None = None,
        start_at_layer: int | None = None,
        stop_at_layer: int | None = None,
        past_kv: KVCache | None = None,
        prepend_bos: bool = True,
        loss_per_token: bool = False,
    ) -> Any:
        """Run the model.

        ``input``: text, a list of texts (left-padded, masked automatically), or tokens
        ``[batch, pos]``; with ``start_at_layer`` it is the residual stream
        ``[batch, pos, d_model]`` entering that block. ``stop_at_layer`` returns the
        residual stream entering that block instead of logits. ``return_type``:
        ``"logits"`` ``[batch, pos, d_vocab]`` (the default), ``"loss"`` (mean next-token
        cross-entropy over real tokens; ``[batch, pos - 1]`` with ``loss_per_token``), ``"both"``
        (``(logits, loss)``) or None (no unembedding; ``ln_final``'s hooks still fire, as in
        TransformerLens). ``prepend_bos`` (default True) applies to text input.

        ``attention_mask`` ``[batch, pos]`` (1 = real token) goes with token input; text input makes
        its own (giving one with text raises ValueError). ``past_kv``: a :class:`KVCache` holding the
        keys and values of earlier positions; the input continues after them and is appended.

        Refused: a layer out of range (IndexError), input longer than the context, token ids
        outside the vocabulary, a residual of the wrong shape with ``start_at_layer``, and a loss
        with ``start_at_layer`` (ValueError).
        """
        with watch_replacements() as replaced:
            out = self._forward(
                input, return_type, attention_mask, start_at_layer, stop_at_layer, past_kv, prepend_bos, loss_per_token
            )
            if replaced:  # hooks replaced activations: one finiteness check of the output (see hooks.py)
                warn_if_nonfinite(
                    replaced,
                    out[0] if isinstance(out, tuple) else out,
                    "residual stream" if stop_at_layer is not None else "model's output",
                )
        return out

    def _forward(
        self,
        input: Input,
        return_type: Literal["logits", "loss", "both"] | None,
        attention_mask: torch.Tensor | None,
        start_at_layer: int | None,
        stop_at_layer: int | None,
        past_kv: KVCache | None,
        prepend_bos: bool = True,
        loss_per_token: bool = False,
    ) -> Any:
        n = self.cfg.n_layer
        start = 0 if start_at_layer is None else self.check_layer(start_at_layer, "start_at_layer")
        stop = n if stop_at_layer is None else self.check_layer(stop_at_layer, "stop_at_layer", allow_end=True)
        past = past_kv.length if past_kv is not None else 0
        if start_at_layer is None:
            tokens, attention_mask = self.as_tokens(input, attention_mask, prepend_bos)
            if "hook_tokens" in self.hook_dict:
                tokens = self.hook_tokens(tokens)
            q_len = tokens.shape[1]
            self.check_length(past + q_len)
            pos = self.positions(q_len, past, attention_mask)
            x = self.W_E[tokens]
            if self.cfg.embed_scale:  # Gemma: embeddings times sqrt(d_model), rounded to the model's dtype
                x = x * torch.tensor(self.cfg.d_model**0.5, dtype=x.dtype)
            x = self.hook_embed(x)
            if self.cfg.positional == "learned":
                x = x + self.hook_pos_embed(_weight(self.pos_embed, "W_pos")[pos].expand(tokens.shape[0], -1, -1))
        else:
            if not isinstance(input, torch.Tensor) or input.ndim != 3 or input.shape[-1] != self.cfg.d_model:
                got = tuple(input.shape) if isinstance(input, torch.Tensor) else type(input).__name__
                raise ValueError(
                    f"with start_at_layer, input is the residual [batch, pos, {self.cfg.d_model}]; got {got}"
                )
            if return_type in ("loss", "both"):
                raise ValueError("loss needs tokens; with start_at_layer use return_type='logits'")
            x, tokens, q_len = input, None, input.shape[1]
            note_input(f"blocks.{start}.hook_resid_pre", "the residual stream given as input with start_at_layer", x)
            pos = self.positions(q_len, past, attention_mask)
        mask = self._attention_mask(q_len, past, attention_mask)
        rope = self.rotary(pos)
        for block in self.blocks[start:stop]:
            x = block(x, mask, past_kv, rope)
        if past_kv is not None:
            past_kv.length += q_len
        if stop_at_layer is not None:
            return x
        if return_type is None:
            if self.ln_final.hook_scale.has_hooks or self.ln_final.hook_normalized.has_hooks:
                self.ln_final(x)
            return None
        logits = self.unembed(self.ln_final(x))
        if return_type == "logits":
            return logits
        assert tokens is not None, "a loss is computed only from tokens (start_at_layer refuses return_type='loss')"
        loss = self.loss(logits, tokens, attention_mask, per_token=loss_per_token)
        return loss if return_type == "loss" else (logits, loss)

    def last_logits(self, input: Input, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor:
        """Logits at the last position only, ``[batch, d_vocab]``: the prediction after each prompt
        (prompts are left-padded, so the last column is every row's last real token). Skips the
        full ``[batch, pos, d_vocab]`` unembedding."""
        resid = self(input, attention_mask=attention_mask, stop_at_layer=self.cfg.n_layer, **kwargs)
        return self.unembed(self.ln_final(resid[:, -1]))

    @staticmethod
    def loss(
        logits: torch.Tensor, tokens: torch.Tensor, attention_mask: torch.Tensor | None = None, per_token: bool = False
    ) -> torch.Tensor:
        """Mean next-token cross-entropy (fp32) of ``logits`` ``[batch, pos, d_vocab]`` predicting
        ``tokens`` ``[batch, pos]`` (position ``i`` predicts token ``i + 1``), over the predictions whose
        position and target are both real tokens in ``attention_mask`` ``[batch, pos]`` (None: all are;
        so left and right padding alike give each row's own loss);
        ``per_token``: ``[batch, pos - 1]`` unreduced (0 where either is padding)."""
        lp = F.cross_entropy(logits[:, :-1].float().flatten(0, 1), tokens[:, 1:].flatten(), reduction="none")
        lp = lp.view(tokens.shape[0], -1)
        if attention_mask is None:
            return lp if per_token else lp.mean()
        keep = (attention_mask[:, 1:].bool() & attention_mask[:, :-1].bool()).to(lp.dtype)
        return lp * keep if per_token else (lp * keep).sum() / keep.sum()

    @contextmanager
    def edited(self, *edits: Any) -> Iterator[HookedGPT2]:
        """Apply weight edits (values with ``apply(model)``/``undo(model)``, e.g. ROME's ``Edit``), in
        order, for the ``with`` block; undone last-in first-out on exit, also when the body raises.
        The model knows nothing of edits beyond that protocol: their bookkeeping lives in ``editing``."""
        done: list[Any] = []
        try:
            for e in edits:
                e.apply(self)
                done.append(e)
            yield self
        finally:
            for e in reversed(done):
                e.undo(self)

    def splice(self, module: Any, use_error_term: bool = False) -> Any:
        """Splice ``module`` (e.g. an SAE) in at its hook point until the returned handle is removed
        (it is also a context manager); its hook points join the model's. See :mod:`.splice`.
        ``use_error_term`` adds the module's error term, so the model's output is unchanged."""
        from .splice import splice

        return splice(self, module, use_error_term)

    def steer(
        self, direction: torch.Tensor, at: str, scale: float = 1.0, positions: Sequence[int] | None = None
    ) -> Any:
        """Context manager: add ``scale · direction`` to the activation at hook point ``at`` (e.g.
        ``blocks.6.hook_resid_post``; ``direction`` ``[d_model]`` there) for the ``with`` block, at every
        position or at ``positions`` (negatives from the end), removed on exit (:mod:`.steer`)."""
        from .steer import Steer, steering

        return steering(self, Steer(direction, at, scale, None if positions is None else tuple(positions)))

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(
        self,
        input: Input,
        max_new_tokens: int = 10,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        stop_at_eos: bool = True,
        seed: int | None = None,
        use_kv_cache: bool = True,
        prepend_bos: bool = True,
        suppress_eos: bool = False,
        do_sample: bool = True,
        use_past_kv_cache: bool | None = None,
        verbose: bool = False,
        return_type: Literal["input", "str", "tokens"] = "input",
        steer: Any = None,
    ) -> Any:
        """Continue ``input`` (text, a list of texts, or tokens ``[pos]``/``[batch, pos]``).
        TransformerLens's defaults: samples at ``temperature`` 1.0 for ``max_new_tokens`` 10 tokens
        (``top_k``/``top_p`` optional; ``seed`` makes it reproducible on any device). **Greedy** with
        ``do_sample=False`` or ``temperature=0``. TransformerLens's keywords: ``do_sample``,
        ``use_past_kv_cache`` (= ``use_kv_cache``, default True), ``verbose`` (ignored: no progress bar),
        ``return_type`` "str"/"tokens". ``prepend_bos`` (default True) applies to text input.
        ``stop_at_eos`` (default True) stops once every row produced the end-of-text token (and cuts
        the returned text there); ``suppress_eos`` forbids that token (the text always runs
        ``max_new_tokens``). ``steer``: a :class:`.steer.Steer` or a list of them, active while generating
        (positions are the prompt's; without positions every token is steered).

        Text in gives text out (a list for a list, left-padded and batched, BOS removed); tokens in
        gives tokens ``[batch, pos + new]`` out. Rows that reached ``<|endoftext|>`` are padded with it.

        Refused (ValueError): prompt plus ``max_new_tokens`` longer than the context, a negative
        ``max_new_tokens``, ``temperature`` < 0 or not finite, ``top_p`` outside (0, 1], ``top_k`` < 1
        and an unknown ``return_type``.
        """
        from .generate import generate

        if not do_sample:
            temperature = 0.0
        if use_past_kv_cache is not None:
            use_kv_cache = use_past_kv_cache
        if return_type not in ("input", "str", "tokens"):
            raise ValueError(f"return_type must be 'input', 'str' or 'tokens', got {return_type!r}")
        if return_type == "tokens" and not isinstance(input, torch.Tensor):
            input = self.to_tokens(input, prepend_bos=prepend_bos, padding_side="left")
        out = generate(
            self,
            input,
            max_new_tokens,
            temperature,
            top_k,
            top_p,
            stop_at_eos,
            seed,
            use_kv_cache,
            prepend_bos,
            suppress_eos,
            steer,
        )
        if return_type == "str" and isinstance(out, torch.Tensor):
            out = self.to_string(out[0] if out.shape[0] == 1 else out)
        return out

    # ------------------------------------------------------------------ conversion
    def save(self, path: str | Path) -> Path:
        """Write a Hugging Face directory (config.json + model.safetensors) that transformers loads."""
        from .loading import save_hf

        return save_hf(self, path)

    def to_transformers(self) -> Any:
        """An equivalent ``transformers.GPT2LMHeadModel`` or ``LlamaForCausalLM`` (needs ``transformers``)."""
        from .loading import to_transformers

        return to_transformers(self)

    def extra_repr(self) -> str:
        c = self.cfg
        s = f"{c.name}: n_layer={c.n_layer}, d_model={c.d_model}, n_head={c.n_head}, d_mlp={c.d_mlp}, n_ctx={c.n_ctx}"
        if c.family != "gpt2":
            s += f", n_kv_heads={c.n_kv}, {c.norm}, {c.positional}, {c.mlp}, bias={c.bias}, tied={c.tied_embeddings}"
        if c.family not in ("gpt2", "llama", "mixed"):
            s += f", family={c.family}"
        return s
