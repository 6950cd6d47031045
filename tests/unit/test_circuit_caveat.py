"""A circuit below the faithfulness a claim needs (FAITHFUL_ENOUGH) is flagged wherever it is printed."""

from __future__ import annotations

import pytest

from gpt2_interp.analysis.circuits import FAITHFUL_ENOUGH, Circuit, faithfulness_text
from gpt2_interp.cli import main


def toy(faithfulness: float | None) -> Circuit:
    return Circuit(
        ["input->m0", "m0->logits"], [1.0, -0.5], "eap", "logit_diff", 2, 2, 2, 100, faithfulness=faithfulness
    )


def test_an_unfaithful_circuit_is_flagged_in_its_table_repr_and_plot_title():
    assert FAITHFUL_ENOUGH == 0.8
    low = toy(0.443)
    table = low.table()
    assert "faithfulness 0.443 (below 0.8: not faithful)" in table.splitlines()[0]
    assert low.caveat is not None and table.splitlines()[-1] == low.caveat
    assert "no evidence of the mechanism" in low.caveat
    assert "below 0.8: not faithful" in repr(low)
    title = " ".join(low.plot().axes[0].get_title().split())  # wrapped to the width
    assert "faithfulness 0.44 (below 0.8: not faithful)" in title


@pytest.mark.parametrize("f", [0.8, 0.905, None])
def test_a_faithful_or_unmeasured_circuit_is_printed_without_a_caveat(f):
    c = toy(f)
    assert c.caveat is None and "not faithful" not in c.table() and "not faithful" not in repr(c)
    assert faithfulness_text(f) == ("" if f is None else f", faithfulness {f:.3f}")


@pytest.mark.slow  # loads gpt2-facts and reads its IOI performance on 4 pairs
def test_the_circuit_command_refuses_a_task_the_model_does_not_perform(capsys):
    assert main(["circuit", "--task", "ioi", "-n", "4", "--method", "eap", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "ioi on gpt2-facts (4 pairs)" in err and "does not perform it reliably" in err and "--force" in err
