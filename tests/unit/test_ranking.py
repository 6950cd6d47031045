"""totals_by_size: values summed per key and ranked by |total|, against sums written out by hand."""

from __future__ import annotations

import pytest

from gpt2_interp.core.ranking import totals_by_size


def test_sums_per_key_ranked_by_absolute_total():
    keys, totals = totals_by_size(["a", "b", "a", "c", "b"], [1.0, -3.0, 1.5, 0.5, 0.25])
    # a: 1 + 1.5 = 2.5; b: -3 + 0.25 = -2.75; c: 0.5
    assert keys == ["b", "a", "c"]
    assert totals == pytest.approx([-2.75, 2.5, 0.5])


def test_ties_keep_first_appearance_and_lengths_must_match():
    assert totals_by_size(["x", "y"], [1.0, -1.0]) == (["x", "y"], [1.0, -1.0])
    with pytest.raises(ValueError):
        totals_by_size(["x", "y"], [1.0])
