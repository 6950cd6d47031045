"""The circuit_tasks experiment through the runner: its accuracies counted again from the model's own
next-token logits on each prompt, and a task that does not fit a tokenizer reported as such."""

from __future__ import annotations

import pytest
import torch

from gpt2_interp.analysis.circuits.tasks import make_task
from gpt2_interp.experiments import run_experiment
from gpt2_interp.model import HookedGPT2
from tests.conftest import TINY
from tests.unit.test_circuit_tasks import DigitSplitting


@pytest.mark.slow  # two tasks through the runner on gpt2-facts, then every prompt again alone
def test_quick_run_reports_each_tasks_accuracy_as_counted_prompt_by_prompt(facts_model, tmp_path):
    res = run_experiment(
        "circuit_tasks", facts_model, quick=True, settings={"tasks": "ioi,fact_recall"}, out=tmp_path, progress=False
    )
    d = tmp_path / "circuit_tasks" / "gpt2-facts" / "quick"
    assert "| fact_recall | 8 |" in (d / "circuit_tasks.md").read_text() and (d / "provenance.json").exists()
    for name in ("ioi", "fact_recall"):
        r = res.data["tasks"][name]
        task = make_task(name, facts_model, n=8, seed=0)  # the quick run's pairs (seed 0)
        with torch.no_grad():
            last = [facts_model(p)[0, -1] for p in task.clean]
        hits = [float(x[a] - x[w]) > 0 for x, a, w in zip(last, task.answers, task.wrongs)]
        assert r["fits"] and r["pairs"] == 8 and r["accuracy"] == sum(hits) / 8, name
        assert r["example"]["clean"] == task.clean[0]
    assert res.data["tasks"]["fact_recall"]["accuracy"] == 1.0  # the fact model knows its facts


def test_a_task_the_tokenizer_cannot_write_is_reported_with_its_reason(tmp_path):
    model = HookedGPT2(TINY, seed=0, tokenizer=DigitSplitting()).eval()
    res = run_experiment(
        "circuit_tasks", model, settings={"tasks": "greater_than", "n": 2}, out=tmp_path, progress=False
    )
    r = res.data["tasks"]["greater_than"]
    assert not r["fits"] and "does not fit this tokenizer" in r["reason"]
    assert "does not fit the tokenizer" in (tmp_path / "circuit_tasks" / "tiny" / "circuit_tasks.md").read_text()
