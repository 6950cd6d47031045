"""A matrix kept as a product ``A @ B`` (``[..., m, k] @ [..., k, n]``), as TransformerLens's
``FactoredMatrix``: ``model.OV`` and ``model.QK`` are ``[layer, head, d_model, d_model]`` of rank ``d_head``."""

from __future__ import annotations

from typing import Any

import torch

from ..core.boundary import boundary


@boundary
class FactoredMatrix:
    """``A @ B`` without forming it: ``.AB`` forms it, ``.svd()``/``.eigenvalues``/``.norm()`` use the
    small ``k × k`` core, ``@`` multiplies on either side, indexing selects leading (layer, head) dims.

    ``A`` ``[..., m, k]`` and ``B`` ``[..., k, n]`` (leading dimensions broadcast); inner dimensions
    that differ raise ValueError."""

    def __init__(self, A: torch.Tensor, B: torch.Tensor) -> None:
        if A.shape[-1] != B.shape[-2]:
            raise ValueError(f"inner dimensions differ: A {tuple(A.shape)}, B {tuple(B.shape)}")
        self.A, self.B = A, B

    @property
    def AB(self) -> torch.Tensor:
        """The product ``A @ B`` ``[..., m, n]``, formed."""
        return self.A @ self.B

    @property
    def BA(self) -> torch.Tensor:
        """The product ``B @ A`` ``[..., k, k]`` (needs ``m == n``)."""
        return self.B @ self.A

    @property
    def shape(self) -> torch.Size:
        """The shape of ``A @ B``: broadcast leading dimensions, then ``m, n``."""
        return torch.Size(
            (*torch.broadcast_shapes(self.A.shape[:-2], self.B.shape[:-2]), self.A.shape[-2], self.B.shape[-1])
        )

    @property
    def ndim(self) -> int:
        """The number of dimensions of ``A @ B``."""
        return len(self.shape)

    @property
    def T(self) -> FactoredMatrix:
        """The transpose, ``Bᵀ @ Aᵀ``, still factored."""
        return FactoredMatrix(self.B.transpose(-2, -1), self.A.transpose(-2, -1))

    def __matmul__(self, other: Any) -> Any:
        if isinstance(other, FactoredMatrix):
            return FactoredMatrix(self.A @ (self.B @ other.A), other.B)
        if other.ndim == 1:
            return self.A @ (self.B @ other)
        return FactoredMatrix(self.A, self.B @ other)

    def __rmatmul__(self, other: torch.Tensor) -> Any:
        if other.ndim == 1:
            return (other @ self.A) @ self.B
        return FactoredMatrix(other @ self.A, self.B)

    def __getitem__(self, idx: Any) -> FactoredMatrix:
        if not isinstance(idx, tuple):
            idx = (idx,)
        return FactoredMatrix(self.A[idx], self.B[idx])

    def svd(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``U, S, Vh`` of ``A @ B`` (thin, rank ``k``) from the SVDs of the factors."""
        Ua, Sa, Vha = torch.linalg.svd(self.A, full_matrices=False)
        Ub, Sb, Vhb = torch.linalg.svd(self.B, full_matrices=False)
        core = (Sa[..., :, None] * Vha) @ (Ub * Sb[..., None, :])
        Uc, S, Vhc = torch.linalg.svd(core)
        return Ua @ Uc, S, Vhc @ Vhb

    @property
    def S(self) -> torch.Tensor:
        """The singular values of ``A @ B`` ``[..., k]`` (descending; see :meth:`svd`)."""
        return self.svd()[1]

    @property
    def eigenvalues(self) -> torch.Tensor:
        """The non-zero eigenvalues of ``A @ B`` (those of ``B @ A``, ``k × k``)."""
        return torch.linalg.eigvals(self.BA)

    def norm(self) -> torch.Tensor:
        """Frobenius norm of ``A @ B``."""
        return self.S.pow(2).sum(-1).sqrt()

    def __repr__(self) -> str:
        return f"FactoredMatrix(shape={tuple(self.shape)}, inner={self.A.shape[-1]})"
