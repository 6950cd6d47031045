"""`gpt2-interp demo` tells the whole story on the shipped model, and its results say so."""

from __future__ import annotations

import json

import pytest

from gpt2_interp.cli import main

pytestmark = pytest.mark.slow  # runs notebooks / the whole demo: minutes


@pytest.fixture(scope="module")
def report(tmp_path_factory, facts_model):
    out = tmp_path_factory.mktemp("demo") / "report"
    assert main(["demo", "--out", str(out), "--samples", "4"]) == 0
    return out, json.loads((out / "results.json").read_text())


def test_writes_the_report_folder(report):
    out, _ = report
    assert {"report.md", "results.json", "logit_lens.png", "causal_trace.png"} <= {p.name for p in out.iterdir()}
    text = (out / "report.md").read_text()
    assert "Logit lens" in text and "Causal trace" in text and "ROME edit" in text


def test_edit_flips_the_fact_moves_paraphrases_and_keeps_neighbours(report):
    _, r = report
    checks = r["edit"]["checks"]
    true, new = r["edit"]["true_target"], r["edit"]["request"]["target"]
    rewrite = [c for c in checks if c["role"] == "rewrite"][0]
    assert rewrite["top1_before"] == true.split()[0] or true.startswith(rewrite["top1_before"])
    assert new.startswith(rewrite["top1_after"])
    paraphrases = [c for c in checks if c["role"] == "paraphrase"]
    assert len(paraphrases) == 2 and sum(new.startswith(c["top1_after"]) for c in paraphrases) >= 1
    neighbours = [c for c in checks if c["role"] == "neighbour"]
    assert len(neighbours) == 2 and all(c["top1_after"] == c["top1_before"] for c in neighbours)
    assert r["edit"]["weights_restored_bit_exact"] is True


def test_lens_and_trace_are_consistent(report):
    _, r = report
    assert r["logit_lens"]["target_rank"][-1] == 1  # the answer is the model's top token at the end
    trace = r["causal_trace"]
    assert trace["hidden"]["clean"] > trace["hidden"]["corrupted"]


def test_refuses_to_overwrite_without_force(report, capsys):
    out, _ = report
    assert main(["demo", "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
