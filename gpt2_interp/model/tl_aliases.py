"""TransformerLens's model-level names as thin read-only aliases over the per-block weights.

Stacked weights have TransformerLens's shapes: ``W_Q/W_K/W_V`` ``[layer, head, d_model, d_head]``,
``W_O`` ``[layer, head, d_head, d_model]``, ``b_Q/b_K/b_V`` ``[layer, head, d_head]``, ``b_O``
``[layer, d_model]``, ``W_in`` ``[layer, d_model, d_mlp]``, ``W_out`` ``[layer, d_mlp, d_model]``.
They are copies (``torch.stack``): edit weights through ``model.blocks[i]``.
"""

from __future__ import annotations

from typing import Any

import torch

from .factored import FactoredMatrix


def _stack(model: Any, get: Any) -> torch.Tensor:
    return torch.stack([get(b) for b in model.blocks])


class TransformerLensAliases:
    """Mixed into the model: ``model.W_Q``, ``model.OV``, ``b_U``, ``get_token_position``, …"""

    blocks: Any

    @property
    def W_Q(self) -> torch.Tensor:
        return _stack(self, lambda b: b.attn.W_Q)

    @property
    def W_K(self) -> torch.Tensor:
        return _stack(self, lambda b: b.attn.W_K)

    @property
    def W_V(self) -> torch.Tensor:
        return _stack(self, lambda b: b.attn.W_V)

    @property
    def W_O(self) -> torch.Tensor:
        return _stack(self, lambda b: b.attn.W_O)

    @property
    def b_Q(self) -> torch.Tensor:
        return _stack(self, lambda b: b.attn.b_Q)

    @property
    def b_K(self) -> torch.Tensor:
        return _stack(self, lambda b: b.attn.b_K)

    @property
    def b_V(self) -> torch.Tensor:
        return _stack(self, lambda b: b.attn.b_V)

    @property
    def b_O(self) -> torch.Tensor:
        return _stack(self, lambda b: b.attn.b_O)

    @property
    def W_in(self) -> torch.Tensor:
        return _stack(self, lambda b: b.mlp.W_in)

    @property
    def W_out(self) -> torch.Tensor:
        return _stack(self, lambda b: b.mlp.W_out)

    @property
    def b_in(self) -> torch.Tensor:
        return _stack(self, lambda b: b.mlp.b_in)

    @property
    def b_out(self) -> torch.Tensor:
        return _stack(self, lambda b: b.mlp.b_out)

    @property
    def b_U(self) -> torch.Tensor:
        """``[d_vocab]`` zeros: GPT-2's unembedding has no bias."""
        W_U = self.W_U  # type: ignore[attr-defined]
        return W_U.new_zeros(W_U.shape[-1])

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
            tokens = self.to_single_token(tokens)  # type: ignore[attr-defined]
        ids = torch.as_tensor(tokens, device=self.W_U.device)  # type: ignore[attr-defined]
        return self.W_U[:, ids].movedim(0, -1)  # type: ignore[attr-defined]

    def get_token_position(
        self, single_token: str | int, input: str | torch.Tensor, mode: str = "first", prepend_bos: bool = True,
    ) -> int:
        """Index of the first (``mode="first"``) or last (``"last"``) occurrence of a token in ``input``
        (text, which gets BOS when ``prepend_bos``, or tokens ``[pos]``/``[1, pos]``)."""
        if mode not in ("first", "last"):
            raise ValueError(f"mode must be 'first' or 'last', got {mode!r}")
        tok = self.to_single_token(single_token)  # type: ignore[attr-defined]
        tokens = self.to_tokens(input, prepend_bos=prepend_bos) if isinstance(input, str) else torch.as_tensor(input)  # type: ignore[attr-defined]
        if tokens.ndim == 2:
            if tokens.shape[0] != 1:
                raise ValueError(f"get_token_position takes one sequence; got a batch of {tokens.shape[0]}")
            tokens = tokens[0]
        where = (tokens == tok).nonzero().flatten()
        if where.numel() == 0:
            raise ValueError(f"token {single_token!r} does not occur in the input")
        return int(where[0] if mode == "first" else where[-1])
