"""``gpt2-interp circuit``: the circuit it prints and saves is the API's for the same task pairs, method and
size; bad input is one line."""

from __future__ import annotations

import json

import pytest

from gpt2_interp.analysis.circuits import Circuit, circuit, edge_scores, evaluate, make_task
from gpt2_interp.analysis.metrics import logit_diff
from gpt2_interp.cli import main


@pytest.mark.slow  # edge scores, the faithfulness run, then both again through the API
def test_circuit_command_saves_the_apis_circuit_with_its_faithfulness(facts_model, tmp_path, capsys):
    path = tmp_path / "circuit.json"
    argv = ["circuit", "--task", "fact_recall", "-n", "4", "--method", "eap", "--top", "30", "--quiet"]
    assert main([*argv, "--save", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("fact_recall on gpt2-facts (4 pairs): logit_diff(answer, other answer) clean")
    assert out[1].startswith("circuit (eap): ") and out[2].split() == ["edge", "score"]
    saved = Circuit.load(path)
    task = make_task("fact_recall", facts_model, n=4, seed=0)
    scores = edge_scores(facts_model, task.clean, task.corrupted, task.metric, method="eap", progress=False)
    ref = evaluate(facts_model, circuit(scores, top=30), task.clean, task.corrupted, task.metric)
    assert saved.edges == ref.edges and 0 < len(saved.edges) <= 30
    assert abs(saved.faithfulness - ref.faithfulness) < 1e-5
    assert main([*argv, "--json", "--no-faithfulness"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["edges"] == ref.edges and data["faithfulness"] is None
    assert main([*argv, "--selection", "greedy", "--json", "--no-faithfulness"]) == 0
    greedy = circuit(scores, top=30, selection="greedy")
    assert json.loads(capsys.readouterr().out)["edges"] == greedy.edges


def test_circuit_command_without_pairs_is_one_line_error(capsys):
    assert main(["circuit", "--method", "eap"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "give --task NAME, or --clean, --corrupted, --answer and --wrong" in err
    assert main(["circuit", "--task", "iol"]) == 2
    assert "unknown task 'iol'; tasks: ioi, greater_than, fact_recall" in capsys.readouterr().err
    assert main(["circuit", "--task", "ioi", "--clean", "A B"]) == 2
    assert "give --task or --clean/--corrupted/--answer/--wrong, not both" in capsys.readouterr().err


def test_circuit_command_per_position_keeps_the_apis_position_edge_items(facts_model, capsys):
    clean, corrupted = "The capital of France is", "The capital of Italy is"
    argv = ["circuit", "--clean", clean, "--corrupted", corrupted, "--answer", " Paris", "--wrong", " Rome"]
    argv += ["--method", "eap", "--top", "25", "--per-position", "--quiet", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    metric = logit_diff(" Paris", " Rome", model=facts_model)
    ref = circuit(edge_scores(facts_model, [clean], [corrupted], metric, method="eap", per_position=True), top=25)
    assert ref.per_position and data["edges"] == ref.edges and data["positions"] == ref.positions
    assert abs(data["faithfulness"] - evaluate(facts_model, ref, [clean], [corrupted], metric).faithfulness) < 1e-5
    assert main([*argv, "--selection", "greedy"]) == 2
    assert "greedy" in capsys.readouterr().err
