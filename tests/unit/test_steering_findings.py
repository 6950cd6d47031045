"""Steering findings are derived from the numbers: the verb from the sign of the shift, no best scale when none
raises the target within the loss budget, the paired standard error beside each shift, the plot from zero."""

from __future__ import annotations

import pytest
import torch

from analyses.steering import figures, finding, tables
from gpt2_interp.analysis.features.steering import SteeringCurve


def curve(target_prob: list[float], loss: list[float], shift_sem: list[float] | None = None) -> SteeringCurve:
    """A synthetic curve at scales 0, 0.5, 1 (unsteered P = target_prob[0], loss = loss[0])."""
    n = len(target_prob)
    return SteeringCurve(
        model_name="toy",
        at="blocks.1.hook_resid_post",
        method="difference of means (last)",
        scales=torch.tensor([0.0, 0.5, 1.0][:n]),
        target=[" good"],
        target_prob=torch.tensor(target_prob),
        target_sem=torch.full((n,), 0.01),
        shift_sem=torch.tensor(shift_sem or [0.0] + [0.0005] * (n - 1)),
        loss=torch.tensor(loss),
        kl=torch.tensor([0.0] + [0.01] * (n - 1)),
        baseline_prob=target_prob[0],
        baseline_loss=loss[0],
        direction_norm=1.0,
        n_prompts=3,
        n_unrelated=2,
        n_tokens=20,
    )


def study_data(c: SteeringCurve, budget: float = 0.05) -> dict:
    return {
        "model": "toy",
        "concept": "sentiment",
        "layer": 1,
        "position": "last",
        "n_pairs": 4,
        "max_loss_change": budget,
        "curve": c.to_dict(),
        "best": c.best(budget),
        "seconds": 1.0,
        "load_average": None,
    }


def test_steering_that_lowers_the_target_is_said_to_lower_it_and_names_no_best_scale():
    # the quick run's numbers on gpt2-facts: 0.5 × the direction lowers P(target) 0.0465 → 0.0439
    c = curve([0.0465, 0.0439], [4.0, 4.01], [0.0, 0.0025])
    assert c.best(0.05) is None
    text = c.finding(0.05)
    assert "raises" not in text and "lowers it from 0.0465 to 0.0439" in text
    assert "-0.0026 ± 0.0025 paired s.e. over 3 prompts" in text and text.endswith("no best scale.")
    data = study_data(c)
    assert data["best"] is None and finding(data) == c.finding(
        0.05, "P(sentiment target words) after held-out prompts", "unrelated Brown text"
    )
    md = tables(data)["steering"]
    assert "raises" not in md and "No steered scale within the 5% loss budget lifts P(sentiment" in md


def test_the_best_scale_raises_the_target_within_the_budget():
    c = curve([0.03, 0.04, 0.06], [4.0, 4.1, 4.4], [0.0, 0.002, 0.004])  # scale 1 costs 10%: over the budget
    b = c.best(0.05)
    assert b is not None and b["scale"] == 0.5 and b["prob_shift"] == pytest.approx(0.01)
    text = c.finding(0.05)
    assert text.startswith("Best scale within the 5% loss budget: 0.5, which raises P(target) from 0.03 to 0.04")
    assert "+0.01 ± 0.002 paired s.e." in text and "loss on unrelated text rises 2.5%" in text
    assert "within two paired standard errors" not in text
    assert c.best(0.2)["scale"] == 1.0  # a larger budget admits the larger scale
    # a rise within two paired standard errors is said to be one; a falling loss is said to fall
    weak = curve([0.03, 0.031], [4.0, 3.9], [0.0, 0.001])
    assert "within two paired standard errors of no change" in weak.finding() and "falls 2.5%" in weak.finding()


def test_no_scale_within_the_budget_is_said_so():
    c = curve([0.03, 0.05, 0.07], [4.0, 4.4, 4.8])
    assert c.best(0.05) is None
    text = c.finding(0.05)
    assert text.startswith("No steered scale keeps the loss") and "rises 10.0%" in text
    assert text.endswith("no best scale.") and "raises" not in text


def test_the_plot_shows_the_shift_from_zero_with_its_paired_standard_error():
    c = curve([0.0465, 0.0439], [4.0, 4.01], [0.0, 0.0025])
    fig = figures(study_data(c))["steering"]
    ax = fig.axes[0]
    low, high = ax.get_ylim()
    assert low < -0.0026 < 0 < high  # the shift, below zero, and zero itself are on the axis
    y = ax.get_lines()[0].get_ydata()
    assert list(y) == pytest.approx([0.0, 0.0439 - 0.0465], abs=1e-7)
    band = ax.collections[0].get_paths()[0].vertices[:, 1]  # the ± paired s.e. band
    assert band.min() == pytest.approx(0.0439 - 0.0465 - 0.0025, abs=1e-6)
    assert "paired" in " ".join(t.get_text() for t in ax.get_legend().get_texts())
