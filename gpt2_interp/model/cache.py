"""The activation cache: activations by hook name, and TransformerLens's analysis methods on them.

Decompositions here are exact because the model's weights are never folded: every
``apply_ln`` applies the model's *real* LayerNorm to each component, linearised at the
recorded scale,

    LN(Σ cᵢ) = Σ w ⊙ (cᵢ − mean cᵢ) / scale  +  b,

so ``(apply_ln_to_stack(stack) @ W_U).sum(0) + b_final @ W_U`` equals the model's logits
(``ln_bias_logits()`` is the last term). TransformerLens divides by the scale but leaves
out ``w`` (its weights are usually folded into ``W_U``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from einops import einsum

from ..core.boundary import boundary
from .hooks import hook_name, suggest, switch_of


@boundary
class ActivationCache(Mapping[str, torch.Tensor]):
    """Activations by hook name, as recorded by ``run_with_cache``.

    Index by full name (``cache["blocks.3.hook_resid_pre"]``) or TransformerLens style
    (``cache["resid_pre", 3]``, ``cache["resid_post", -1]``, ``cache["scale", 3, "ln2"]``,
    ``cache["pattern", 3, "attn"]``, ``cache["embed"]``, ``cache["k6"]``). A name not in the cache
    raises KeyError (with the closest cached names); a layer out of range IndexError.

    ``store``: ``{hook name: activation}``; ``model``: the model it was recorded from (the per-layer
    and decomposition methods read its config and weights); ``has_batch_dim``: whether each
    activation starts with a batch dimension.
    """

    def __init__(self, store: dict[str, torch.Tensor], model: Any = None, has_batch_dim: bool = True) -> None:
        self._store = store
        self.model = model
        self.has_batch_dim = has_batch_dim

    # ------------------------------------------------------------------ mapping
    @property
    def n_layers(self) -> int:
        """The model's number of blocks (a cache without a model raises ValueError)."""
        if self.model is None or not hasattr(self.model, "cfg"):
            raise ValueError("this cache has no model with a config; per-layer methods need one")
        return self.model.cfg.n_layer

    def _layer(self, layer: int) -> int:
        n = self.n_layers
        if not -n <= layer < n:
            raise IndexError(f"layer {layer} is out of range for a model with {n} layers (use 0..{n - 1} or -{n}..-1)")
        return layer % n

    def _key(self, key: str | tuple) -> str:
        if isinstance(key, tuple):
            family, rest = key[0], list(key[1:])
            if rest and isinstance(rest[0], int) and rest[0] < 0:
                rest[0] = self._layer(rest[0])
            return hook_name(family, *rest)
        if key not in self._store:
            try:
                return hook_name(key)  # "embed", "k6", ...
            except KeyError:
                return key
        return key

    def __getitem__(self, key: str | tuple) -> torch.Tensor:
        name = self._key(key)
        try:
            return self._store[name]
        except KeyError:
            hint = suggest(name, list(self._store))
            switch = switch_of(name)
            if switch is not None:
                hint += f" It fires only while the model's {switch} is on: model.set_{switch}(True)."
            raise KeyError(
                f"{name!r} is not in this cache ({len(self._store)} names cached).{hint} "
                "If it is a valid hook name, include it in run_with_cache's names_filter."
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._store)

    def __len__(self) -> int:
        return len(self._store)

    def __repr__(self) -> str:
        first = ", ".join(list(self._store)[:4])
        return f"ActivationCache({len(self._store)} names: {first}{', ...' if len(self) > 4 else ''})"

    @property
    def cache_dict(self) -> dict[str, torch.Tensor]:
        """The underlying ``{hook name: activation}`` dict."""
        return self._store

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> ActivationCache:
        """A new cache with every activation moved to ``device`` and/or its floating activations
        converted to ``dtype`` (None: unchanged)."""
        store = {k: v.to(device=device, dtype=dtype if v.is_floating_point() else None) for k, v in self._store.items()}
        return ActivationCache(store, self.model, self.has_batch_dim)

    def nbytes(self) -> int:
        """Bytes the cached activations hold (each distinct storage counted once)."""
        return storage_bytes(self._store.values())

    def remove_batch_dim(self) -> ActivationCache:
        """The cache of a batch of one without its batch dimension (a larger batch raises ValueError)."""
        if not self.has_batch_dim:
            return self
        sizes = {v.shape[0] for v in self._store.values()}
        if sizes - {1}:
            raise ValueError(f"remove_batch_dim needs a batch of one; the cache holds batch sizes {sorted(sizes)}")
        return ActivationCache({k: v[0] for k, v in self._store.items()}, self.model, has_batch_dim=False)

    def apply_slice_to_batch_dim(self, batch_slice: Any) -> ActivationCache:
        """A cache of the batch rows ``batch_slice`` selects (an int, ``(start, stop[, step])``, a
        slice, a list/tensor of rows, ``utils.Slice`` or None): as TransformerLens, an int drops the batch
        dimension, and entries whose first dimension is not the batch size are kept whole."""
        rows = _as_index(batch_slice)
        if not self.has_batch_dim and rows != slice(None):
            raise ValueError("this cache has no batch dimension (remove_batch_dim was applied) to slice")
        sizes = Counter(v.shape[0] for v in self._store.values() if v.ndim > 0)
        batch = sizes.most_common(1)[0][0] if sizes else 1
        store = {k: v[rows] if v.ndim > 0 and v.shape[0] == batch else v for k, v in self._store.items()}
        return ActivationCache(store, self.model, has_batch_dim=self.has_batch_dim and not isinstance(rows, int))

    def toggle_autodiff(self, mode: bool = False) -> None:
        """``torch.set_grad_enabled(mode)`` for the whole process, as TransformerLens's (global state:
        prefer ``with torch.inference_mode():``)."""
        logging.warning("Changed the global state, set autodiff to %s", mode)
        torch.set_grad_enabled(mode)

    def compute_head_results(self) -> None:
        """Add each head's result ``z @ W_O`` (no ``b_O``) as ``blocks.{l}.attn.hook_result``
        ``[batch, pos, head, d_model]`` to the cache, as TransformerLens (nothing when they are
        cached already). :meth:`stack_head_results` needs no such entries."""
        if "blocks.0.attn.hook_result" in self._store:
            return
        for i in range(self.n_layers):
            z = self["z", i]  # [..., head, d_head]
            W_O = self.model.blocks[i].attn.W_O  # [head, d_head, d_model]
            self._store[f"blocks.{i}.attn.hook_result"] = einsum(z, W_O.to(z.dtype), "... h dh, h dh d -> ... h d")

    def get_neuron_results(
        self,
        layer: int,
        neuron_slice: Any = None,
        pos_slice: Any = None,
        project_output_onto: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Each neuron's write ``post[n] · W_out[n]`` in block ``layer``: ``[batch, pos, neuron, d_model]``
        (an int ``pos_slice``/``neuron_slice`` drops that dimension, as TransformerLens);
        ``project_output_onto`` ``[d_model]`` or ``[d_model, k]`` projects each write (last dim dropped or ``k``)."""
        post = self["post", layer]  # [..., pos, d_mlp]
        W_out = self.model.blocks[self._layer(layer)].mlp.W_out.to(post.dtype)  # [d_mlp, d_model]
        if pos_slice is not None:
            index: list[Any] = [slice(None)] * post.ndim
            index[-2] = _as_index(pos_slice)
            post = post[tuple(index)]
        neurons = _as_index(neuron_slice)
        post, W_out = post[..., neurons], W_out[neurons]
        if project_output_onto is None:
            return post[..., None] * W_out
        projected = W_out @ project_output_onto.to(W_out.dtype)
        return post * projected if projected.ndim == 1 else post[..., None] * projected

    def stack(self, family: str) -> torch.Tensor:
        """Stack a per-layer family over layers: ``[n_layer, *shape]``."""
        return torch.stack([self[family, i] for i in range(self.n_layers)])

    def stack_activation(self, activation_name: str, layer: int = -1, sublayer_type: str | None = None) -> torch.Tensor:
        """``[layers, ...]``: the activations of family ``activation_name`` (e.g. ``"resid_pre"``,
        ``"pattern"``) for the layers before ``layer`` (-1, the default: all); ``sublayer_type`` names
        the sublayer where the family needs one (``"ln1"``/``"ln2"`` for ``"scale"``)."""
        end = self.n_layers if layer == -1 else layer
        return torch.stack(
            [self[(activation_name, i) + ((sublayer_type,) if sublayer_type else ())] for i in range(end)]
        )

    # ------------------------------------------------------------------ helpers
    def _end(self, layer: int | None) -> int:
        """Blocks strictly before ``layer`` are included (None / -1 / n_layers: all of them)."""
        n = self.n_layers
        if layer is None or layer == -1 or layer == n:
            return n
        if not 0 <= layer < n:
            raise IndexError(f"layer {layer} is out of range: use 0..{n}, -1 or None (the final layer)")
        return layer

    def _pos(self, t: torch.Tensor, pos_slice: Any, name: str = "") -> torch.Tensor:
        """Apply ``pos_slice`` to the position dimension of a ``[..., batch, pos, d]`` stack
        (``[..., batch, pos, head, d_head]`` for ``hook_z``); an int drops the dimension."""
        if pos_slice is None:
            return t
        pos = getattr(pos_slice, "slice", pos_slice)
        if isinstance(pos, list):
            pos = torch.as_tensor(pos)
        elif isinstance(pos, tuple):
            pos = slice(*pos)
        index: list[Any] = [slice(None)] * t.ndim
        index[-3 if name == "hook_z" else -2] = pos
        return t[tuple(index)]

    def _norm(self, layer: int | None, mlp_input: bool) -> tuple[Any, str]:
        """The norm module read at ``layer`` (ln1, or ln2 with ``mlp_input``; ln_final for None/n)."""
        end = self._end(layer)
        if end == self.n_layers:
            return self.model.ln_final, "ln_final.hook_scale"
        sub = "ln2" if mlp_input else "ln1"
        return getattr(self.model.blocks[end], sub), f"blocks.{end}.{sub}.hook_scale"

    # ------------------------------------------------------------------ residual stream
    def accumulated_resid(
        self,
        layer: int | None = None,
        incl_mid: bool = False,
        apply_ln: bool = False,
        pos_slice: Any = None,
        mlp_input: bool = False,
        return_labels: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, list[str]]:
        """The residual stream entering each block up to ``layer`` (and the final one when ``layer``
        is None): ``[n, batch, pos, d_model]``; labels ``0_pre``, ``0_mid``, …, ``final_post``.

        ``incl_mid`` adds each block's ``resid_mid``; ``mlp_input`` ends at the input of ``layer``'s
        MLP (its ``resid_mid``) instead of its attention; ``apply_ln`` puts the stack through
        :meth:`apply_ln_to_stack` at ``layer``; ``pos_slice`` (an int drops the position dimension, or
        a slice/list) selects positions; ``return_labels`` returns ``(stack, labels)``. A layer out
        of range raises IndexError."""
        end = self._end(layer)
        resids, labels = [], []
        for i in range(end):
            resids.append(self["resid_pre", i])
            labels.append(f"{i}_pre")
            if incl_mid:
                resids.append(self["resid_mid", i])
                labels.append(f"{i}_mid")
        if end < self.n_layers and mlp_input:
            resids.append(self["resid_mid", end])
            labels.append(f"{end}_mid")
        if end == self.n_layers:
            resids.append(self["resid_post", end - 1])
            labels.append("final_post")
        elif not mlp_input:
            resids.append(self["resid_pre", end])
            labels.append(f"{end}_pre")
        stack = self._pos(torch.stack(resids), pos_slice)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input, pos_slice=pos_slice, centre_each=True)
        return (stack, labels) if return_labels else stack

    def decompose_resid(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        mode: str = "all",
        apply_ln: bool = False,
        pos_slice: Any = None,
        incl_embeds: bool = True,
        return_labels: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, list[str]]:
        """The residual stream at ``layer`` (None: the final one) as the sum of its parts,
        ``[n, batch, pos, d_model]``: ``embed``, ``pos_embed`` and each block's ``attn_out`` and
        ``mlp_out`` (``mode`` "attn"/"mlp" keeps one kind; any other mode raises ValueError).

        ``mlp_input`` decomposes the input of ``layer``'s MLP (adding that block's ``attn_out``);
        ``incl_embeds`` (default True) includes the embeddings; ``apply_ln``, ``pos_slice`` and
        ``return_labels`` as in :meth:`accumulated_resid`."""
        if mode not in ("all", "attn", "mlp"):
            raise ValueError(f"mode must be 'all', 'attn' or 'mlp', got {mode!r}")
        end = self._end(layer)
        parts, labels = [], []
        if incl_embeds:
            for name in ("embed", "pos_embed"):
                if hook_name(name) in self._store:
                    parts.append(self[name])
                    labels.append(name)
        for i in range(end):
            if mode != "mlp":
                parts.append(self["attn_out", i])
                labels.append(f"{i}_attn_out")
            if mode != "attn":
                parts.append(self["mlp_out", i])
                labels.append(f"{i}_mlp_out")
        if mlp_input and end < self.n_layers and mode != "mlp":
            parts.append(self["attn_out", end])
            labels.append(f"{end}_attn_out")
        stack = self._pos(torch.stack(parts), pos_slice)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input, pos_slice=pos_slice)
        return (stack, labels) if return_labels else stack

    def stack_head_results(
        self,
        layer: int = -1,
        return_labels: bool = False,
        incl_remainder: bool = False,
        pos_slice: Any = None,
        apply_ln: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, list[str]]:
        """Each head's write to the residual stream, ``z @ W_O`` per head (no ``b_O``), for the blocks
        before ``layer``: ``[layers·heads, batch, pos, d_model]``, labels ``L{l}H{h}``. Computed from
        ``hook_z`` and ``W_O``; nothing is materialised during the forward pass.
        ``incl_remainder`` appends the residual minus all heads (``remainder``); ``pos_slice``,
        ``apply_ln`` and ``return_labels`` as in :meth:`accumulated_resid`."""
        end = self._end(layer)
        parts, labels = [], []
        for i in range(end):
            z = self._pos(self["z", i][None], pos_slice, "hook_z")[0]  # [batch, pos, head, d_head]
            W_O = self.model.blocks[i].attn.W_O  # [head, d_head, d_model]
            parts.append(einsum(z, W_O.to(z.dtype), "... h dh, h dh d -> h ... d"))
            labels += [f"L{i}H{h}" for h in range(W_O.shape[0])]
        d = self.model.cfg.d_model
        ref = self._resid_at(end, False, pos_slice)
        stack = torch.cat(parts) if parts else ref.new_zeros((0, *ref.shape[:-1], d))
        if incl_remainder:
            stack = torch.cat([stack, (ref - stack.sum(0))[None]])
            labels.append("remainder")
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice=pos_slice)
        return (stack, labels) if return_labels else stack

    def stack_neuron_results(
        self,
        layer: int,
        pos_slice: Any = None,
        neuron_slice: Any = None,
        return_labels: bool = False,
        incl_remainder: bool = False,
        apply_ln: bool = False,
        project_output_onto: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, list[str]]:
        """Each MLP neuron's write ``post[n] · W_out[n]`` for the blocks before ``layer``:
        ``[layers·neurons, batch, pos, d_model]``, labels ``L{l}N{n}`` (``project_output_onto``
        ``[d_model, k]`` projects each write instead of returning it whole). ``neuron_slice`` (a
        slice or list) keeps those neurons of each layer; ``incl_remainder`` appends the residual
        minus all neurons (``remainder``); ``pos_slice``, ``apply_ln`` and ``return_labels`` as in
        :meth:`accumulated_resid`."""
        end = self._end(layer)
        parts, labels = [], []
        ns = getattr(neuron_slice, "slice", neuron_slice)
        for i in range(end):
            post = self._pos(self["post", i][None], pos_slice)[0]  # [batch, pos, d_mlp]
            W_out = self.model.blocks[i].mlp.W_out.to(post.dtype)  # [d_mlp, d_model]
            idx = torch.arange(W_out.shape[0], device=W_out.device)
            if ns is not None:
                idx = idx[torch.as_tensor(ns) if isinstance(ns, list) else ns]
                idx = idx.reshape(-1)
            post, W_out = post[..., idx], W_out[idx]
            if project_output_onto is not None:
                W_out = W_out @ project_output_onto.to(W_out.dtype)
            parts.append(einsum(post, W_out, "... n, n d -> n ... d"))
            labels += [f"L{i}N{int(n)}" for n in idx]
        stack = torch.cat(parts)
        if incl_remainder:
            ref = self._resid_at(end, False, pos_slice)
            stack = torch.cat([stack, (ref - stack.sum(0))[None]])
            labels.append("remainder")
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, pos_slice=pos_slice)
        return (stack, labels) if return_labels else stack

    def _resid_at(self, end: int, mlp_input: bool, pos_slice: Any) -> torch.Tensor:
        if end == self.n_layers:
            r = self["resid_post", end - 1]
        else:
            r = self["resid_mid" if mlp_input else "resid_pre", end]
        return self._pos(r[None], pos_slice)[0]

    def get_full_resid_decomposition(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        expand_neurons: bool = True,
        apply_ln: bool = False,
        pos_slice: Any = None,
        return_labels: bool = False,
        project_output_onto: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, list[str]]:
        """Every head, every neuron (or each ``mlp_out`` without ``expand_neurons``), the embeddings
        and one ``bias`` term (the sum of ``b_O`` and ``b_out``): components ``[n, batch, pos, d_model]``
        that sum to the residual stream at ``layer`` (None: the final one) exactly.

        ``mlp_input`` decomposes the input of ``layer``'s MLP (adding that block's heads);
        ``project_output_onto`` ``[d_model, k]`` projects the components; ``apply_ln``, ``pos_slice``
        and ``return_labels`` as in :meth:`accumulated_resid`."""
        end = self._end(layer)
        heads, labels = self.stack_head_results(end if end < self.n_layers else -1, True, pos_slice=pos_slice)
        parts = [heads]
        if mlp_input and end < self.n_layers:
            z = self._pos(self["z", end][None], pos_slice, "hook_z")[0]
            W_O = self.model.blocks[end].attn.W_O
            parts.append(einsum(z, W_O.to(z.dtype), "... h dh, h dh d -> h ... d"))
            labels += [f"L{end}H{h}" for h in range(W_O.shape[0])]
        if expand_neurons:
            if end > 0:
                neurons, nl = self.stack_neuron_results(
                    end if end < self.n_layers else -1, pos_slice, return_labels=True
                )
                parts.append(neurons)
                labels += nl
        else:
            for i in range(end):
                parts.append(
                    self._pos(self["mlp_out", i][None], pos_slice)[0][None]
                    - self.model.blocks[i].mlp.b_out.to(heads.dtype)
                )
                labels.append(f"{i}_mlp_out")
        for name in ("embed", "pos_embed"):
            if hook_name(name) in self._store:
                parts.append(self._pos(self[name][None], pos_slice)[0][None])
                labels.append(name)
        bias = sum((self._block_bias(i, "attn") for i in range(end)), torch.zeros(self.model.cfg.d_model))
        bias = bias + sum((self._block_bias(i, "mlp") for i in range(end)), torch.zeros_like(bias))
        if mlp_input and end < self.n_layers:
            bias = bias + self._block_bias(end, "attn")
        ref = parts[-1]
        parts.append(bias.to(ref.device, ref.dtype).expand_as(ref[0])[None])
        labels.append("bias")
        stack = torch.cat(parts)
        if project_output_onto is not None and not expand_neurons:
            stack = stack @ project_output_onto.to(stack.dtype)
        if apply_ln:
            stack = self.apply_ln_to_stack(stack, layer, mlp_input, pos_slice=pos_slice)
        return (stack, labels) if return_labels else stack

    def _block_bias(self, i: int, which: str) -> torch.Tensor:
        block = self.model.blocks[i]
        b = block.attn.b_O if which == "attn" else block.mlp.b_out
        return b.detach().cpu().float() if b is not None else torch.zeros(self.model.cfg.d_model)

    # ------------------------------------------------------------------ LayerNorm and logits
    def apply_ln_to_stack(
        self,
        residual_stack: torch.Tensor,
        layer: int | None = None,
        mlp_input: bool = False,
        pos_slice: Any = None,
        batch_slice: Any = None,
        has_batch_dim: bool = True,
        recompute_ln: bool = False,
        centre_each: bool = True,
    ) -> torch.Tensor:
        """The model's real norm at ``layer`` (ln_final for None), linearised at the recorded scale,
        applied to each component: ``w ⊙ (c − mean c) / scale`` (no bias ``b``: it is added once, not
        per component; see :meth:`ln_bias_logits`). ``residual_stack: [n, batch, pos, d_model]`` (or
        ``[n, batch, d_model]`` after an int ``pos_slice``). ``recompute_ln`` uses each component's
        own scale instead (a per-component LayerNorm, not a decomposition).

        ``mlp_input``: the norm before ``layer``'s MLP (``ln2``) instead of before its attention;
        ``pos_slice``/``batch_slice`` select the recorded scale's positions/rows to match a stack that
        was sliced; ``centre_each`` and ``has_batch_dim`` are TransformerLens's keywords (each
        component is always centred when the norm centres). Without the norm's ``hook_scale`` in the
        cache (and no ``recompute_ln``) it raises KeyError."""
        norm, scale_name = self._norm(layer, mlp_input)
        x = residual_stack
        if getattr(norm, "centred", True):
            x = x - x.mean(-1, keepdim=True)
        if recompute_ln:
            eps = getattr(norm, "eps", 1e-5)
            scale = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
        else:
            if scale_name not in self._store:
                raise KeyError(f"apply_ln needs {scale_name!r} in the cache; run_with_cache with it in names_filter")
            scale = self._store[scale_name]
            scale = self._pos(scale[None], pos_slice)[0]
            if batch_slice is not None:
                scale = scale[getattr(batch_slice, "slice", batch_slice)]
        w = norm.w.to(x.dtype)
        return x / scale.to(x.dtype) * w

    def ln_bias_logits(self) -> torch.Tensor:
        """``b_final @ W_U`` ``[d_vocab]``: the one term of the logits no residual component owns."""
        b = getattr(self.model.ln_final, "b", None)
        W_U = self.model.W_U
        return b @ W_U if b is not None else W_U.new_zeros(W_U.shape[-1])

    def logit_attrs(
        self,
        residual_stack: torch.Tensor,
        tokens: Any,
        incorrect_tokens: Any = None,
        pos_slice: Any = None,
        batch_slice: Any = None,
        has_batch_dim: bool = True,
    ) -> torch.Tensor:
        """Each component's contribution to the logit of ``tokens`` (minus that of
        ``incorrect_tokens``): ``apply_ln_to_stack(residual_stack) @ W_U[:, tokens]``, ``[n, *tokens
        shape]``. ``residual_stack``: components of the final residual stream ``[n, batch, pos,
        d_model]`` (or ``[n, batch, d_model]`` with an int ``pos_slice``), not yet normalised: as in
        TransformerLens they go through :meth:`apply_ln_to_stack` with ``ln_final`` here (``pos_slice``
        and ``batch_slice`` select the matching recorded scales) — ours includes the norm's gain, so
        the attributions plus ``ln_bias_logits()`` sum to the logit (difference) exactly.
        ``tokens``: a string (one token, else ValueError), an id, ``[batch]`` or ``[batch, pos]``.
        ``has_batch_dim`` is TransformerLens's keyword, unused here."""

        def ids(t: Any) -> torch.Tensor:
            if isinstance(t, str):
                t = self.model.to_single_token(t)
            return torch.as_tensor(t, device=residual_stack.device)

        residual_stack = self.apply_ln_to_stack(residual_stack, None, pos_slice=pos_slice, batch_slice=batch_slice)
        W_U = self.model.W_U.to(residual_stack.dtype)
        dirs = W_U[:, ids(tokens)].movedim(0, -1)  # [*tok, d_model]
        if incorrect_tokens is not None:
            dirs = dirs - W_U[:, ids(incorrect_tokens)].movedim(0, -1)
        return (residual_stack * dirs).sum(-1)


def own_storage(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a compact copy of it when it is a view into a larger storage (a slice of positions,
    one of the fused query/key/value projection's parts): keeping the view would keep the whole
    storage alive. A broadcast view (stride 0, storage smaller than the tensor) is kept as it is."""
    if t.untyped_storage().nbytes() > t.numel() * t.element_size():
        return t.clone(memory_format=torch.contiguous_format)
    return t


def storage_bytes(tensors: Iterator[torch.Tensor] | Any) -> int:
    """Bytes of the distinct storages behind ``tensors`` (an iterable of tensors): what keeping them
    alive costs, views of one storage counted once."""
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr()] = max(seen.get(s.data_ptr(), 0), s.nbytes())
    return sum(seen.values())


def _as_index(selection: Any) -> Any:
    """TransformerLens's ``Slice`` input as an index for one dimension: an int, ``(start, stop[, step])``,
    a slice, a list/array/tensor of indices, a ``utils.Slice`` or None (everything)."""
    selection = getattr(selection, "slice", selection)
    if selection is None:
        return slice(None)
    if isinstance(selection, tuple):
        return slice(*selection)
    if isinstance(selection, (int, slice)):
        return selection
    return torch.as_tensor(np.asarray(selection) if not isinstance(selection, torch.Tensor) else selection)
