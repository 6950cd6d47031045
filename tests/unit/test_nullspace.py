"""AlphaEdit's null space: the share of keys' energy inside it, against hand-computed projections."""

from __future__ import annotations

import math

import pytest
import torch

from gpt2_interp.editing.memit import NullSpace


def null_space(P: dict[int, torch.Tensor]) -> NullSpace:
    return NullSpace(P, 0.1, {}, {l: int(torch.linalg.matrix_rank(p)) for l, p in P.items()}, dict.fromkeys(P, 0.0))


def test_key_energy_is_the_projected_share_of_the_keys_squared_norm():
    # layer 3: P keeps the first axis; K = [[3, 4], [0, 2]] → ‖KP‖² = 9, ‖K‖² = 9 + 16 + 4 = 29
    # layer 5: P onto (1, 1)/√2; K = [[1, 0]] → KP = [½, ½], ‖KP‖² = ½, ‖K‖² = 1
    u = torch.tensor([[1.0], [1.0]]) / math.sqrt(2)
    ns = null_space({3: torch.diag(torch.tensor([1.0, 0.0])), 5: u @ u.T})
    got = ns.key_energy({3: torch.tensor([[3.0, 4.0], [0.0, 2.0]]), 5: torch.tensor([[1.0, 0.0]])})
    assert got == {3: pytest.approx(9 / 29), 5: pytest.approx(0.5)}
    assert ns.key_energy({3: torch.tensor([[0.0, 7.0]])}) == {3: 0.0}  # orthogonal to the null space
    assert ns.key_energy({3: torch.tensor([[-2.0, 0.0]])}) == {3: pytest.approx(1.0)}  # inside it


def test_key_energy_refuses_unknown_layers_and_zero_keys():
    ns = null_space({0: torch.eye(2)})
    with pytest.raises(ValueError, match="layer 1"):
        ns.key_energy({1: torch.ones(1, 2)})
    with pytest.raises(ValueError, match="all zero"):
        ns.key_energy({0: torch.zeros(3, 2)})
