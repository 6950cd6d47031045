"""The circuit_discovery experiment through the runner, in its quick mode, on gpt2-facts."""

from __future__ import annotations

import pytest
import torch

from analyses.circuit_discovery import _positions, _role
from gpt2_interp.analysis.circuits import Circuit, evaluate, graph_of, make_task
from gpt2_interp.experiments import Refused, run_experiment


def test_name_positions_are_found_in_each_row():
    tokens = torch.tensor([[0, 7, 5, 9, 7, 3], [0, 0, 5, 7, 5, 7]])
    ids = torch.tensor([7, 5])
    assert _positions(tokens, ids, last=False).tolist() == [1, 2]
    assert _positions(tokens, ids, last=True).tolist() == [4, 4]
    with pytest.raises(ValueError, match="missing"):
        _positions(tokens, torch.tensor([8, 5]), last=False)


def test_roles_follow_the_score_sign_and_the_attention():
    assert _role(-0.5, 0.4, 0.1) == "name mover"  # patching it lowers logit[IO] - logit[S]
    assert _role(+0.5, 0.4, 0.1) == "negative name mover"
    assert _role(-0.5, 0.05, 0.3) == "writes to logits, attends to S"
    assert _role(-0.5, 0.02, 0.01) == "writes to logits, attends elsewhere"
    assert _role(None, 0.9, 0.0) == "feeds later queries"


@pytest.mark.slow  # two edge scorings, a 6-point faithfulness curve and two evaluations (~10 s of CPU)
def test_quick_fact_recall_circuit_is_saved_and_as_faithful_as_recorded(facts_model, tmp_path):
    res = run_experiment(
        "circuit_discovery", facts_model, quick=True, settings={"task": "fact_recall"}, out=tmp_path, progress=False
    )
    d = tmp_path / "circuit_discovery" / "gpt2-facts" / "quick"
    data = res.data
    assert data["performance"]["verdict"] == "performs it" and "refused" not in data
    assert {p.name for p in d.glob("*.png")} >= {"faithfulness.png", "circuit_eap.png", "circuit_eap-ig.png"}
    cv = data["curve"]
    # the whole graph is the clean run: faithfulness 1 at the largest size, for both methods
    assert cv["sizes"][-1] == data["total_edges"]
    assert all(abs(f[-1] - 1.0) < 1e-4 for f in cv["faithfulness"])
    task = make_task("fact_recall", facts_model, n=8, seed=0).subset(range(4))
    for i, m in enumerate(("eap", "eap-ig")):
        rec = data["smallest"][m]
        j = cv["sizes"].index(rec["size"])
        assert cv["faithfulness"][i][j] >= 0.8 > max([-1.0, *[cv["faithfulness"][i][k] for k in range(j)]])
        assert rec["share"] == pytest.approx(cv["kept"][i][j] / data["total_edges"])
        # the saved circuit loads back and, re-measured on the same pairs, has the faithfulness recorded
        c = Circuit.load(d / data["circuits"][m]["file"])
        assert len(c.edges) == rec["edges"]
        again = evaluate(facts_model, c, task.clean, task.corrupted, task.metric, completeness=False)
        assert again.faithfulness == pytest.approx(data["circuits"][m]["faithfulness"], abs=1e-4)


def test_a_task_the_model_does_not_do_is_refused(facts_model, tmp_path):
    # gpt2-facts does not do IOI (its own logit difference is ~0): no circuit is looked for, no result written
    with pytest.raises(Refused, match=r"does not perform ioi \(.*does not perform it reliably\).*force=true"):
        run_experiment(
            "circuit_discovery", facts_model, quick=True, settings={"task": "ioi"}, out=tmp_path, progress=False
        )
    assert not (tmp_path / "circuit_discovery").exists()


@pytest.mark.slow  # per-position scores, curve and circuits on IOI (forced: gpt2-facts does not do it)
def test_a_per_position_run_keeps_position_edge_items_and_refuses_unaligned_prompts(facts_model, tmp_path):
    settings = {"task": "ioi", "per_position": True, "force": True}
    res = run_experiment("circuit_discovery", facts_model, quick=True, settings=settings, out=tmp_path, progress=False)
    data = res.data
    task = make_task("ioi", facts_model, n=8, seed=0, templates=[0]).subset(range(4))
    n_pos, n_edges = task.clean_tokens.shape[1], graph_of(facts_model).n_edges
    assert data["per_position"] and data["total_edges"] == n_pos * n_edges
    cv = data["curve"]
    assert cv["methods"] == ["eap-per-position", "eap-ig-per-position"]
    assert all(abs(f[-1] - 1.0) < 1e-4 for f in cv["faithfulness"])  # every item kept: the clean run
    assert set(data["circuits"]) == {"eap", "eap-ig"}
    for rec in data["circuits"].values():
        c = Circuit.load(tmp_path / "circuit_discovery" / "gpt2-facts" / "quick" / rec["file"])
        assert c.per_position and c.n_pos == n_pos and rec["whole_edges"] == len(set(c.edges))
        again = evaluate(facts_model, c, task.clean, task.corrupted, task.metric, completeness=False)
        assert again.faithfulness == pytest.approx(rec["faithfulness"], abs=1e-4)
    assert "(position, edge) items" in res.tables()["circuit_discovery"]
    # fact recall mixes relations whose prompts differ in length: refused, saying why
    with pytest.raises(Refused, match="one token length"):
        run_experiment(
            "circuit_discovery",
            facts_model,
            quick=True,
            settings={"task": "fact_recall", "per_position": True},
            out=None,
            progress=False,
        )
