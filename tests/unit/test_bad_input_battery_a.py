"""Bad input on circuits, the experiments runner and cost estimates: each case is refused before the work with
an error naming the argument, field or file (a circuit met by another model names both models), or, when the
result is computed but degenerate, warned about with the reason."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from gpt2_interp.analysis.circuits import (
    Circuit,
    CircuitWarning,
    circuit,
    edge_scores,
    evaluate,
    fact_recall,
    faithfulness_curve,
    graph_of,
    pairs_of,
    run_with_edges,
)
from gpt2_interp.analysis.metrics import logit_diff
from gpt2_interp.analysis.patching import sweep_work
from gpt2_interp.cli import main
from gpt2_interp.core.boundary import ArgumentError
from gpt2_interp.core.checks import check_writable
from gpt2_interp.core.memory import free_memory
from gpt2_interp.experiments import run_experiment
from gpt2_interp.io.files import FileFormatError, write_json
from gpt2_interp.model import GPT2Config, HookedGPT2

V = 64


def _model(name: str, n_layer: int = 2, seed: int = 0) -> HookedGPT2:
    cfg = GPT2Config(n_layer=n_layer, d_model=32, n_head=4, d_mlp=64, n_ctx=16, d_vocab=V, name=name)
    m = HookedGPT2(cfg, seed=seed).eval()
    with torch.no_grad():  # larger weights than GPT-2's init, so that edges have visible effects
        for p in m.parameters():
            p.mul_(4.0)
    return m


@pytest.fixture(scope="module")
def setup():
    model = _model("tiny-a")
    g = torch.Generator().manual_seed(1)
    clean = torch.randint(0, V, (3, 6), generator=g)
    corrupted = clean.clone()
    corrupted[:, 2] = (clean[:, 2] + 1 + torch.randint(0, V - 1, (3,), generator=g)) % V
    metric = logit_diff(torch.tensor([1, 2, 3]), torch.tensor([4, 5, 6]))
    scores = edge_scores(model, clean, corrupted, metric, "eap")
    return model, clean, corrupted, metric, scores


# ------------------------------------------------------------------------------------------- circuits
@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"top": 0}, "none was asked for"),
        ({"fraction": 0.0}, "none was asked for"),
        ({"threshold": 1e9}, "no edge.s .score. reaches the threshold"),
    ],
)
def test_a_circuit_of_no_edges_warns_with_the_reason(setup, kwargs, why):
    *_, scores = setup
    with pytest.warns(CircuitWarning, match=f"has no edges: {why}"):
        c = circuit(scores, **kwargs)
    assert c.edges == []


def test_a_circuit_with_edges_does_not_warn(setup):
    *_, scores = setup
    with warnings.catch_warnings():
        warnings.simplefilter("error", CircuitWarning)
        assert circuit(scores, top=10).edges


def test_faithfulness_curve_sizes_are_checked_before_the_run(setup):
    model, clean, corrupted, metric, scores = setup
    with pytest.raises(ValueError, match="sizes is empty"):
        faithfulness_curve(model, scores, clean, corrupted, metric, sizes=[])
    with pytest.raises(ValueError, match=r"sizes\[1\] must be ≥ 0, got -1"):
        faithfulness_curve(model, scores, clean, corrupted, metric, sizes=[3, -1])
    with pytest.raises(ArgumentError, match="sizes"):
        faithfulness_curve(model, scores, clean, corrupted, metric, sizes="abc")
    with pytest.raises(ValueError, match="scores is empty"):
        faithfulness_curve(model, [], clean, corrupted, metric, sizes=[3])


def test_edge_indices_refuse_masks_floats_empty_lists_and_indices_out_of_range(setup):
    model, clean, corrupted, metric, _ = setup
    n = graph_of(model).n_edges
    with pytest.raises(TypeError, match=r"edge must be an int, got bool True \(in edges="):
        edge_scores(model, clean, corrupted, metric, "exact", edges=[True, False, True])
    with pytest.raises(TypeError, match="edges must be edge indices, got a boolean mask"):
        edge_scores(model, clean, corrupted, metric, "exact", edges=torch.ones(n, dtype=torch.bool))
    with pytest.raises(TypeError, match="edges must be integer edge indices"):
        edge_scores(model, clean, corrupted, metric, "exact", edges=torch.tensor([1.0]))
    with pytest.raises(ValueError, match="edges is empty"):
        edge_scores(model, clean, corrupted, metric, "exact", edges=[])
    with pytest.raises(IndexError, match=f"edge {n} is out of range.*in edges"):
        edge_scores(model, clean, corrupted, metric, "exact", edges=[0, n])
    with pytest.raises(IndexError, match="in edges"):
        edge_scores(model, clean, corrupted, metric, "exact", edges=torch.tensor([n + 5]))
    with pytest.raises(ValueError, match="edges picks the edges of method='exact'"):
        edge_scores(model, clean, corrupted, metric, "eap", edges=[0])
    s = edge_scores(model, clean, corrupted, metric, "exact", edges=[-1])  # negatives count from the end
    assert s.scores[-1].isfinite() and s.scores[:-1].isnan().all()


def test_eap_ig_warns_when_the_metric_is_not_finite_on_the_integration_path(setup):
    model, clean, corrupted, metric, _ = setup

    def nan_on_the_path(logits: torch.Tensor) -> torch.Tensor:  # finite at both ends (no gradient there)
        v = metric(logits)
        return v * float("nan") if logits.requires_grad else v

    with pytest.warns(CircuitWarning, match="integration path"):
        s = edge_scores(model, clean, corrupted, nan_on_the_path, "eap-ig", ig_steps=2)
    assert s.scores.isnan().all()


def test_fact_recall_warns_when_it_has_fewer_pairs_than_asked_for(facts_model):
    with pytest.warns(CircuitWarning, match=r"prompt pairs, not the 100000 asked for \(n\)"):
        task = fact_recall(facts_model, n=100000)
    assert 0 < len(task.clean) < 100000


# ------------------------------------------------------------------------------- the model it was made for
def test_scores_and_circuits_record_the_model_and_carry_it_through_save_and_load(setup, tmp_path):
    from gpt2_interp.model.fingerprint import weights_fingerprint

    model, *_, scores = setup
    fp = weights_fingerprint(model)
    assert (scores.model_name, scores.weights) == ("tiny-a", fp)
    c = circuit(scores, top=10)
    assert (c.model_name, c.weights) == ("tiny-a", fp)
    back = Circuit.load(c.save(tmp_path / "c.json"))
    assert (back.model_name, back.weights) == ("tiny-a", fp)
    assert (back.collapsed().model_name, back.graph.model) == ("tiny-a", "tiny-a")


def test_a_circuit_file_without_its_model_still_loads_and_is_measured(setup, tmp_path):
    model, clean, corrupted, metric, scores = setup
    data = circuit(scores, top=10).to_dict()
    del data["model_name"], data["weights"]
    write_json(tmp_path / "old.json", data)
    old = Circuit.load(tmp_path / "old.json")
    assert old.model_name is None and old.weights is None
    assert evaluate(model, old, clean, corrupted, metric).faithfulness is not None


@pytest.mark.parametrize("other", ["sizes", "weights"])
def test_another_model_is_refused_naming_both_models(setup, other):
    model, clean, corrupted, metric, scores = setup
    b = _model("tiny-b", n_layer=3) if other == "sizes" else _model("tiny-b", seed=7)
    c = circuit(scores, top=10)
    cases = [
        ("this circuit", lambda: evaluate(b, c, clean, corrupted, metric)),
        ("these edge scores", lambda: faithfulness_curve(b, scores, clean, corrupted, metric, sizes=[3])),
        ("this circuit", lambda: c.check_model(b)),
    ]
    if other == "weights":  # prompt pairs measured on one model, patched on another of the same sizes
        pairs = pairs_of(model, clean, corrupted, metric)
        cases.append(("these prompt pairs", lambda: run_with_edges(b, graph_of(b), pairs, torch.zeros(1, 110))))
    for what, call in cases:
        with pytest.raises(ValueError) as e:
            call()
        msg = str(e.value)
        assert msg.startswith(what) and "tiny-a" in msg and "tiny-b" in msg, msg
        assert ("weights" if other == "weights" else "layers") in msg, msg


def test_a_graph_of_other_sizes_names_both_models(setup):
    model, clean, corrupted, metric, _ = setup
    b = _model("tiny-b", n_layer=3)
    pairs = pairs_of(model, clean, corrupted, metric)
    with pytest.raises(ValueError, match=r"this graph was made for tiny-b .*the model is tiny-a .*graph_of\(model\)"):
        run_with_edges(model, graph_of(b), pairs, torch.zeros(1, graph_of(b).n_edges))


# ------------------------------------------------------------------------------------------- circuit files
@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("scores", "abc", "field scores must be"),
        ("n_layer", -1, "field n_layer must be ≥ 1, got -1"),
        ("n_layer", "2", "field n_layer must be an int"),
        ("n_kv", 3, "n_kv 3 must divide n_head 4"),
        ("faithfulness", "high", "field faithfulness must be"),
        ("model_name", 7, "field model_name must be"),
        ("edges", ["bogus"], "field edges/positions: no edge 'bogus'"),
        ("scores", [1.0, 2.0], "field scores holds 2 scores for"),
    ],
)
def test_a_circuit_file_with_a_field_of_the_wrong_type_is_refused_naming_the_file_and_field(
    setup, tmp_path, field, value, match
):
    *_, scores = setup
    data = circuit(scores, top=10).to_dict()
    if field == "edges":
        value = value + data["edges"][1:]
    data[field] = value
    path = write_json(tmp_path / "bad.json", data)
    with pytest.raises(FileFormatError) as e:
        Circuit.load(path)
    assert str(path) in str(e.value) and match in str(e.value), str(e.value)


def test_a_circuit_file_with_positions_past_its_end_is_refused_naming_the_file(setup, tmp_path):
    *_, scores = setup
    data = circuit(scores, top=10).to_dict()
    data.update(positions=[99] * len(data["edges"]), n_pos=6, total_edges=data["total_edges"] * 6)
    path = write_json(tmp_path / "pos.json", data)
    with pytest.raises(FileFormatError, match=r"pos\.json: field edges/positions: .* at position 99: outside"):
        Circuit.load(path)


# ------------------------------------------------------------------------------------ runner and outputs
def test_check_writable_refuses_naming_the_argument_and_creates_nothing(tmp_path):
    with pytest.raises(ValueError, match=r"--out /proc/x/y cannot be written: cannot create files in /proc"):
        check_writable("/proc/x/y", "--out", "dir")
    (tmp_path / "f").write_text("")
    with pytest.raises(ValueError, match=r"--save .* is a directory; give a file path"):
        check_writable(tmp_path, "--save")
    with pytest.raises(ValueError, match=r"out .* is a file; give a folder"):
        check_writable(tmp_path / "f", "out", "dir")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        check_writable(tmp_path / "f" / "g.json", "--save")
    assert check_writable(tmp_path / "a" / "b", "out", "dir") == tmp_path / "a" / "b"
    assert sorted(os.listdir(tmp_path)) == ["f"]


def test_the_runner_refuses_an_unwritable_out_before_the_model_loads(tmp_path):
    # the model name does not exist: the refusal must come before anything tries to load it
    with pytest.raises(ValueError, match=r"^out /proc/x/logit_lens/no-such-model/quick cannot be written"):
        run_experiment("logit_lens", "no-such-model", quick=True, out="/proc/x")
    with pytest.raises(ValueError, match=r"tag '\.\./\.\./evil' cannot name a folder"):
        run_experiment("logit_lens", "no-such-model", out=tmp_path, tag="../../evil")
    with pytest.raises(ValueError, match="no setting 'bogus'"):
        run_experiment("logit_lens", "no-such-model", out=tmp_path, settings={"bogus": 1})
    assert not list(tmp_path.iterdir())


def test_the_runner_leaves_no_folder_when_the_model_fails_to_load(tmp_path):
    with pytest.raises((ValueError, FileNotFoundError, OSError)):
        run_experiment("logit_lens", "no-such-model", quick=True, out=tmp_path)
    assert not list(tmp_path.iterdir())


def test_run_list_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--list"]) == 0
    assert main(["run", "--list", "--out", "sub/dir"]) == 0
    assert "logit_lens" in capsys.readouterr().out
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------------------------------- cost estimates
def test_cost_estimates_refuse_sizes_below_one(setup):
    model, *_ = setup
    with pytest.raises(ValueError, match="n_pairs must be ≥ 1, got 0"):
        sweep_work(model, 6, n_pairs=0)
    with pytest.raises(ValueError, match="n_pos must be ≥ 1, got 0"):
        sweep_work(model, 0)
    with pytest.raises(ArgumentError, match="batch_size must be an integer ≥ 1"):
        sweep_work(model, 6, batch_size=0)
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        free_memory("gpu")
