"""TransformerLens's model-level names as thin read-only aliases over the per-block weights.

Stacked weights have TransformerLens's shapes: ``W_Q/W_K/W_V`` ``[layer, head, d_model, d_head]``,
``W_O`` ``[layer, head, d_head, d_model]``, ``b_Q/b_K/b_V`` ``[layer, head, d_head]``, ``b_O``
``[layer, d_model]``, ``W_in`` ``[layer, d_model, d_mlp]``, ``W_out`` ``[layer, d_mlp, d_model]``.
They are copies (``torch.stack``): edit weights through ``model.blocks[i]``. As in TransformerLens,
a config without biases gives zero biases, and grouped-query key/value weights are repeated per query head.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any

import torch

from ..core.devices import resolve_device, resolve_dtype
from .factored import FactoredMatrix
from .hooks import warn_port


def _stack(model: Any, get: Any) -> torch.Tensor:
    return torch.stack([get(b) for b in model.blocks])


def _kv_heads(model: Any, t: torch.Tensor) -> torch.Tensor:
    """Key/value heads repeated to one per query head (grouped-query attention), as TransformerLens."""
    groups = model.cfg.n_head // model.cfg.n_kv
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def _bias(model: Any, get: Any, shape: tuple[int, ...]) -> torch.Tensor:
    """A stacked bias; zeros of TransformerLens's shape ``[layer, *shape]`` when the config has none there
    (biases may be on some projections only: Qwen 2's on query/key/value, GPT-J's on the MLP)."""
    if get(model.blocks[0]) is not None:
        return _stack(model, get)
    W_E = model.W_E
    return W_E.new_zeros((model.cfg.n_layer, *shape))


_TL_ENTRY = re.compile(r"blocks\.(\d+)\.(attn\._?[Wb]_[QKV]|attn\.b_O|mlp\.b_in|mlp\.b_out)|unembed\.(W_U|b_U)")


class StateDict(OrderedDict):
    """A state dict with our names (``blocks.{l}.attn.W_QKV`` fused) in which TransformerLens's names
    are found too: ``sd["blocks.0.attn.W_Q"]`` ``[head, d_model, d_head]`` (a view sharing the fused
    tensor's memory, as TL's entries share their parameters'), ``b_Q``/``b_K``/``b_V``, ``unembed.W_U``
    (``W_Eᵀ`` when tied), and zeros for the biases a config lacks (``unembed.b_U``, Llama's ``b_O``…).
    Iterating lists our names only; pickled (``torch.save``) it is a plain ``OrderedDict``."""

    cfg: Any = None
    _metadata: Any  # torch's per-module version info, carried over from the state dict it views

    def __missing__(self, key: str) -> torch.Tensor:
        m = _TL_ENTRY.fullmatch(key) if isinstance(key, str) and self.cfg is not None else None
        if m is None:
            raise KeyError(key)
        c = self.cfg
        if m.group(3) == "W_U":
            return self["embed.W_E"].T
        if m.group(3) == "b_U":
            return self["embed.W_E"].new_zeros(c.d_vocab)
        block, what = f"blocks.{m.group(1)}.", m.group(2).replace("._", ".")
        heads = {"Q": c.n_head, "K": c.n_kv, "V": c.n_kv}
        if what[-3:-1] in ("W_", "b_") and what[-1] in heads:
            sizes = [heads[x] * c.d_head for x in "QKV"]
            which = "QKV".index(what[-1])
            if what.startswith("attn.W_"):
                w = self[block + "attn.W_QKV"].split(sizes, dim=-1)[which]
                return w.view(c.d_model, -1, c.d_head).permute(1, 0, 2)
            if block + "attn.b_QKV" in self:
                return self[block + "attn.b_QKV"].split(sizes)[which].view(-1, c.d_head)
            return self["embed.W_E"].new_zeros(heads[what[-1]], c.d_head)
        if block + what in self:
            return self[block + what]
        return self["embed.W_E"].new_zeros(c.d_mlp if what == "mlp.b_in" else c.d_model)

    def __reduce__(self) -> tuple[Any, ...]:
        state = {k: v for k, v in vars(self).items() if k != "cfg"}  # e.g. torch's _metadata
        return (OrderedDict, (), state or None, None, iter(self.items()))


def is_tl_state_dict(sd: Any) -> bool:
    """Whether a state dict names its attention weights as TransformerLens does (unfused ``attn.W_Q``)."""
    return any(isinstance(k, str) and k.endswith(("attn.W_Q", "attn._W_K")) for k in sd)


_PROCESSING = (
    "fold_ln",
    "center_writing_weights",
    "center_unembed",
    "fold_value_biases",
    "refactor_factored_attn_matrices",
)


class TransformerLensAliases:
    """Mixed into the model: ``model.W_Q``, ``model.OV``, ``b_U``, ``get_token_position``,
    ``set_use_attn_result``, ``from_pretrained``, …"""

    blocks: Any
    cfg: Any

    @classmethod
    def from_pretrained(
        cls,
        model_name: str,
        fold_ln: bool = True,
        center_writing_weights: bool = True,
        center_unembed: bool = True,
        refactor_factored_attn_matrices: bool = False,
        fold_value_biases: bool = True,
        device: Any = None,
        dtype: Any = None,
        hf_model: Any = None,
        **kwargs: Any,
    ) -> Any:
        """TransformerLens's loader, over :func:`gpt2_interp.load` (``hf_model``: over
        ``from_transformers``). Weights are never folded or centred: with TransformerLens's default
        processing flags a :class:`PortingWarning` says so (logits are equal either way; weights and
        residual-stream activations equal TL's ``from_pretrained_no_processing``). Pass the flags as
        False, or call :meth:`from_pretrained_no_processing` / ``gpt2_interp.load``, to silence it.
        Other TransformerLens keywords are accepted at values that change nothing, else refused.

        ``model_name``: a name or path :func:`gpt2_interp.load` accepts; ``fold_ln``,
        ``center_writing_weights``, ``center_unembed``, ``fold_value_biases`` (default True) and
        ``refactor_factored_attn_matrices`` (default False) are TransformerLens's processing flags,
        never applied; ``device``/``dtype`` as for ``load``; ``default_padding_side`` sets the
        tokenizer's padding side. An unknown keyword raises TypeError; a known one at a value that
        would change the model (``n_devices=2``, ``first_n_layers=4``, …) raises ValueError."""
        from .loading import from_transformers, load

        asked = dict(
            fold_ln=fold_ln,
            center_writing_weights=center_writing_weights,
            center_unembed=center_unembed,
            refactor_factored_attn_matrices=refactor_factored_attn_matrices,
            fold_value_biases=fold_value_biases,
        )
        on = [k for k in _PROCESSING if asked[k]]
        if on:
            warn_port(
                f"from_pretrained: gpt2-interp never folds or centres weights ({', '.join(on)} ignored); "
                "logits equal TransformerLens's, but weights and residual-stream activations equal its "
                "from_pretrained_no_processing. Use from_pretrained_no_processing or gpt2_interp.load to "
                "silence this."
            )
        harmless = {
            "n_devices": 1,
            "move_to_device": True,
            "default_prepend_bos": True,
            "first_n_layers": None,
            "checkpoint_index": None,
            "checkpoint_value": None,
            "checkpoint_label": None,
            "n_ctx": None,
            "tokenizer": None,
        }
        padding_side = kwargs.pop("default_padding_side", None)
        for k, v in kwargs.items():
            if k not in harmless:
                raise TypeError(f"from_pretrained() got an unexpected keyword {k!r}")
            if v is not None and v != harmless[k]:
                raise ValueError(f"from_pretrained({k}={v!r}) is not supported by gpt2-interp (see docs/porting.md)")
        if hf_model is not None:
            model = from_transformers(hf_model).to(device=resolve_device(device), dtype=resolve_dtype(dtype)).eval()
        else:
            model = load(model_name, device=device, dtype=dtype)
        if padding_side is not None:  # TL's default_padding_side: the tokenizer's (to_tokens honours it)
            model.tokenizer.padding_side = padding_side
        return model

    @classmethod
    def from_pretrained_no_processing(cls, model_name: str, **kwargs: Any) -> Any:
        """:meth:`from_pretrained` without weight processing (what gpt2-interp always does; no warning)."""
        for k in _PROCESSING:
            kwargs.setdefault(k, False)
        return cls.from_pretrained(model_name, **kwargs)

    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """Compute and hook each head's result ``blocks.{l}.attn.hook_result`` ``[batch, pos, head, d_model]``
        in every forward pass (off by default: it costs a ``[batch, pos, head, d_model]`` tensor per
        layer; :meth:`ActivationCache.stack_head_results` needs only ``hook_z``)."""
        self.cfg.use_attn_result = use_attn_result

    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """Give each head its own copies of the residual stream entering ``ln1`` (TransformerLens's switch,
        off by default): ``blocks.{l}.hook_q_input`` ``[batch, pos, head, d_model]``, ``hook_k_input`` and
        ``hook_v_input`` ``[batch, pos, kv_head, d_model]`` (the key/value heads under grouped-query
        attention). ``ln1`` normalises each copy, so replacing head ``h``'s query input changes only head
        ``h``'s queries. Costs ``n_head + 2·n_kv`` norms of the residual per block and ``[batch, pos, head,
        d_model]`` copies; the projections do the same arithmetic as the fused one. Refused (ValueError)
        while ``use_attn_in`` is on."""
        self.cfg.use_split_qkv_input = use_split_qkv_input

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """Give each head one copy of the residual stream entering ``ln1``, shared by its query, key and
        value: ``blocks.{l}.hook_attn_in`` ``[batch, pos, head, d_model]`` (TransformerLens's switch, off by
        default). Refused (ValueError) under grouped-query attention, as in TL (use
        :meth:`set_use_split_qkv_input`), and while ``use_split_qkv_input`` is on."""
        self.cfg.use_attn_in = use_attn_in

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """Hook a copy of the residual stream entering ``ln2``: ``blocks.{l}.hook_mlp_in`` ``[batch, pos,
        d_model]`` (TransformerLens's switch, off by default); replacing it changes the MLP's input only,
        not ``hook_resid_mid`` or the residual stream the MLP's output is added to."""
        self.cfg.use_hook_mlp_in = use_hook_mlp_in

    @property
    def W_Q(self) -> torch.Tensor:
        """``[layer, head, d_model, d_head]``: the query weights of every block, stacked (a copy)."""
        return _stack(self, lambda b: b.attn.W_Q)

    @property
    def W_K(self) -> torch.Tensor:
        """``[layer, head, d_model, d_head]``; with grouped-query attention each key head repeated for
        the query heads that read it, as in TransformerLens (``blocks[l].attn.W_K`` has ``n_kv`` heads)."""
        return _kv_heads(self, _stack(self, lambda b: b.attn.W_K))

    @property
    def W_V(self) -> torch.Tensor:
        """``[layer, head, d_model, d_head]`` (value heads repeated per query head, as :attr:`W_K`)."""
        return _kv_heads(self, _stack(self, lambda b: b.attn.W_V))

    @property
    def W_O(self) -> torch.Tensor:
        """``[layer, head, d_head, d_model]``: the attention output weights, stacked (a copy)."""
        return _stack(self, lambda b: b.attn.W_O)

    @property
    def b_Q(self) -> torch.Tensor:
        """``[layer, head, d_head]`` (zeros without biases, as TransformerLens)."""
        return _bias(self, lambda b: b.attn.b_Q, (self.cfg.n_head, self.cfg.d_head))

    @property
    def b_K(self) -> torch.Tensor:
        """``[layer, head, d_head]`` (key biases repeated per query head as :attr:`W_K`; zeros without biases)."""
        return _kv_heads(self, _bias(self, lambda b: b.attn.b_K, (self.cfg.n_kv, self.cfg.d_head)))

    @property
    def b_V(self) -> torch.Tensor:
        """``[layer, head, d_head]`` (value biases repeated per query head as :attr:`W_K`; zeros without biases)."""
        return _kv_heads(self, _bias(self, lambda b: b.attn.b_V, (self.cfg.n_kv, self.cfg.d_head)))

    @property
    def b_O(self) -> torch.Tensor:
        """``[layer, d_model]``: the attention output biases (zeros without biases)."""
        return _bias(self, lambda b: b.attn.b_O, (self.cfg.d_model,))

    @property
    def W_in(self) -> torch.Tensor:
        """``[layer, d_model, d_mlp]``: the MLP input weights, stacked (a copy)."""
        return _stack(self, lambda b: b.mlp.W_in)

    @property
    def W_out(self) -> torch.Tensor:
        """``[layer, d_mlp, d_model]``: the MLP output weights, stacked (a copy)."""
        return _stack(self, lambda b: b.mlp.W_out)

    @property
    def b_in(self) -> torch.Tensor:
        """``[layer, d_mlp]``: the MLP input biases (zeros without biases)."""
        return _bias(self, lambda b: b.mlp.b_in, (self.cfg.d_mlp,))

    @property
    def b_out(self) -> torch.Tensor:
        """``[layer, d_model]``: the MLP output biases (zeros without biases)."""
        return _bias(self, lambda b: b.mlp.b_out, (self.cfg.d_model,))

    @property
    def b_U(self) -> torch.Tensor:
        """The unembedding bias ``[d_vocab]``: GPT-J's, zeros for the others (GPT-2's has none)."""
        return self.unembed.b_U  # type: ignore[attr-defined]  # mixin: HookedGPT2 provides it

    @property
    def OV(self) -> FactoredMatrix:
        """``W_V @ W_O`` per layer and head, ``[layer, head, d_model, d_model]``, kept factored."""
        return FactoredMatrix(self.W_V, self.W_O)

    @property
    def QK(self) -> FactoredMatrix:
        """``W_Q @ W_Kᵀ`` per layer and head, ``[layer, head, d_model, d_model]``, kept factored."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    def tokens_to_residual_directions(self, tokens: str | int | torch.Tensor) -> torch.Tensor:
        """The unembedding direction(s) ``W_U[:, token]``: ``[d_model]`` for one token, ``[*shape, d_model]``
        for a tensor of ids."""
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)  # type: ignore[attr-defined]  # mixin: HookedGPT2 provides it
        ids = torch.as_tensor(tokens, device=self.W_U.device)  # type: ignore[attr-defined]  # mixin: HookedGPT2 provides it
        return self.W_U[:, ids].movedim(0, -1)  # type: ignore[attr-defined]  # mixin: HookedGPT2 provides it

    def get_token_position(
        self,
        single_token: str | int,
        input: str | torch.Tensor,
        mode: str = "first",
        prepend_bos: bool = True,
    ) -> int:
        """Index of the first (``mode="first"``) or last (``"last"``) occurrence of ``single_token`` (a
        one-token string or an id) in ``input`` (text, which gets BOS when ``prepend_bos``, or tokens
        ``[pos]``/``[1, pos]``). Another mode, a batch of more than one row, a string that is not one
        token, or a token that does not occur raise ValueError."""
        if mode not in ("first", "last"):
            raise ValueError(f"mode must be 'first' or 'last', got {mode!r}")
        tok = self.to_single_token(single_token)  # type: ignore[attr-defined]  # mixin: HookedGPT2 provides it
        tokens = self.to_tokens(input, prepend_bos=prepend_bos) if isinstance(input, str) else torch.as_tensor(input)  # type: ignore[attr-defined]  # mixin: HookedGPT2 provides it
        if tokens.ndim == 2:
            if tokens.shape[0] != 1:
                raise ValueError(f"get_token_position takes one sequence; got a batch of {tokens.shape[0]}")
            tokens = tokens[0]
        where = (tokens == tok).nonzero().flatten()
        if where.numel() == 0:
            raise ValueError(f"token {single_token!r} does not occur in the input")
        return int(where[0] if mode == "first" else where[-1])
