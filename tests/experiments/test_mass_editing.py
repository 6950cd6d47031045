"""The mass_editing experiment: its settings, and the quick run through the runner
(parts, merging with ``only=``, rows run with other settings marked)."""

from __future__ import annotations

import json

import pytest
import torch

from analyses.mass_editing import PARTS, Config, tables
from gpt2_interp.editing.stats import key_second_moment
from gpt2_interp.experiments import run_experiment
from gpt2_interp.io.files import read_json, write_json
from gpt2_interp.model.fingerprint import weights_fingerprint


def test_bad_settings_name_the_setting():
    with pytest.raises(ValueError, match=r"only.*rome_seq"):
        Config(only=["rome_seq"])
    with pytest.raises(ValueError, match=r"null_rules.*absolute"):
        Config(null_rules=["absolute"])


def test_table_names_where_each_part_ran():
    # a report first run on a GPU whose parts were all re-run on the CPU and merged names the CPU only
    cpu = "cpu, 1 thread(s)"
    report = {
        "model": "m",
        "device": "cuda:0",
        "n_known_cases": 2,
        "layers": [0],
        "chosen": {"mom2_weight": 10.0, "nullspace_threshold": 0.01},
        "part_seconds": {"stats": 1.0, "memit_sequential": 2.0},
        "part_devices": {"stats": cpu, "memit_sequential": cpu},
    }
    text = tables(report)["mass_editing"]
    assert text.startswith("# Mass editing on m (cpu)\n") and "cuda" not in text
    assert f"stats on {cpu}; memit_sequential on {cpu}." in text
    # one part not re-run: both places, and the table says which part ran where
    report["part_seconds"]["tuning"] = 3.0
    text = tables(report)["mass_editing"]
    assert text.startswith("# Mass editing on m (cpu; cuda:0)\n")
    assert "the others (tuning) on cuda:0." in text


def test_generation_table_sets_each_generated_score_beside_its_teacher_forced_one():
    gen = dict(es=0.5, ps=0.25, ns=0.75, hop=0.125, hop_true=0.625, hop_tf=0.375)
    summary = {
        "n": 4,
        "pre": {"es": 0.0, "ps": 0.0, "ns": 1.0},
        "post": {"es": 1.0, "ps": 0.875, "ns": 0.9},
        "gen_pre": {**gen, "es": 0.0, "ns": 1.0, "hop": 0.0},
        "gen_post": gen,
        "n_hop": 3,
    }
    plain = {**summary, "gen_pre": None, "gen_post": None}
    report = {
        "model": "m",
        "device": "cpu",
        "n_known_cases": 4,
        "layers": [0],
        "chosen": {"mom2_weight": 10.0, "nullspace_threshold": 0.01},
        "evaluations": {
            "memit_batch": {"summary": {"all": summary}, "seconds": 1.0},
            "rome_sequential": {"summary": {"all": plain}, "seconds": 1.0},
        },
    }
    text = tables(report)["mass_editing"]
    row = next(line for line in text.splitlines() if line.startswith("| memit_batch | 50.0"))
    cells = "50.0 (100.0) | 25.0 (87.5) | 75.0 [100.0] (90.0) | 3 | 12.5 [0.0] | 37.5 [37.5] | 62.5 [62.5]"
    assert row == f"| memit_batch | {cells} |"
    assert not any(line.startswith("| rome_sequential | –") for line in text.splitlines())


def _rewrite(folder, **changes):
    """Change the data of the result in ``folder`` (what the next ``only=`` run merges into)."""
    body = read_json(folder / "result.json", "experiment result")
    for k, v in changes.items():
        body["data"][k] = v
    write_json(folder / "result.json", body)  # as a run writes it: with its digest


@pytest.mark.slow
@pytest.mark.full  # every part of the mass-editing study on gpt2-facts (~3 min); MEMIT, AlphaEdit and the
# scores each part runs are tested on their own in tests/unit/test_memit.py and test_evaluate.py
def test_quick_run_parts_merge_and_marks(facts_model, tmp_path):
    before = weights_fingerprint(facts_model)

    def run(**s):
        return run_experiment("mass_editing", facts_model, quick=True, settings=s, out=tmp_path, progress=False)

    d = tmp_path / "mass_editing" / "gpt2-facts" / "quick"
    report = run().data
    # independent checks: the weights are those before the run, and the statistics' spectrum recomputed here
    assert weights_fingerprint(facts_model) == before and report["weights_restored_at_end"]
    ev = torch.linalg.eigvalsh(key_second_moment(facts_model, 0, n_samples=3000).C.double())
    assert report["stats"]["count"] == 3000
    for t, frac in report["stats"]["eig_fraction_below"].items():
        assert frac == pytest.approx(float((ev <= float(t) * ev[-1]).double().mean()), abs=1e-5)
    assert report["batch_memit_edit"]["undo_bit_exact"] and report["batch_memit_edit"]["reload_reproduces"]
    assert set(report["evaluations"]) == set(PARTS[3:]) and not report["errors"]
    assert (d / "mass_editing_decay.png").stat().st_size > 0
    assert "| memit_batch |" in (d / "mass_editing.md").read_text()  # one run: no row marked as older
    assert report["part_settings"]["memit_batch"] == report["settings"] and report["settings"]["layers"] == [0]
    # only= chooses the parts, not what a part holds: a part already computed is taken from the cache
    memit_again = run(only="memit_batch").data
    assert memit_again["part_seconds"]["memit_batch"] == report["part_seconds"]["memit_batch"]
    assert memit_again["evaluations"] == report["evaluations"]
    # only= reruns one part and merges it: here ROME with a time limit already passed (one edit made)
    merged = run(only="rome_sequential", rome_seconds="0").data
    assert {k: v for k, v in merged["evaluations"].items() if k != "rome_sequential"} == {
        k: v for k, v in report["evaluations"].items() if k != "rome_sequential"
    }
    assert merged["evaluations"]["rome_sequential"]["summary"]["all"]["n"] == 1
    assert "stopped at its time limit" in (d / "mass_editing.md").read_text()
    assert "merged_with" in json.loads((d / "provenance.json").read_text())
    # each merged part records where it was computed; taken from the cache, it keeps that record
    threads = torch.get_num_threads()
    where = merged["part_devices"]["rome_sequential"]
    assert where == f"cpu, {threads} thread(s)"
    try:
        cached = run_experiment(
            "mass_editing",
            facts_model,
            quick=True,
            settings={"only": "rome_sequential", "rome_seconds": "0"},
            out=tmp_path,
            progress=False,
            threads=threads + 1,
        ).data
    finally:
        torch.set_num_threads(threads)
    assert cached["part_devices"]["rome_sequential"] == where
    assert cached["evaluations"]["rome_sequential"] == merged["evaluations"]["rome_sequential"]
    # a row whose recorded settings differ from the report's is marked, in the table
    marked = {
        **merged,
        "part_settings": {**merged["part_settings"], "memit_sequential": {**merged["settings"], "layers": [0, 1]}},
    }
    assert "| memit_sequential † |" in tables(marked)["mass_editing"]
    # only= without the tuning part runs with the TUNING's choice and records it per part; MEMIT rows do not
    # depend on AlphaEdit's α, so only the AlphaEdit row not rerun is marked
    tuning = {**merged["tuning"], "chosen": {**merged["tuning"]["chosen"], "alpha": 7 * merged["chosen"]["alpha"]}}
    _rewrite(d, tuning=tuning)
    again = run(only="alphaedit_batch").data
    assert again["part_settings"]["alphaedit_batch"]["alpha"] == again["chosen"]["alpha"] == tuning["chosen"]["alpha"]
    table = (d / "mass_editing.md").read_text()
    assert "| alphaedit_sequential † |" in table and "| alphaedit_batch |" in table
    assert "| memit_batch |" in table and "| memit_sequential |" in table
    # retuning AlphaEdit with the energy rule adds its rows to the earlier (relative) ones
    rows = run(only="tuning", null_rules="energy").data["tuning"]["nullspace_threshold"]
    assert sorted(r.get("nullspace_rule", "relative") for r in rows) == ["energy", "relative"]
    energy = next(r for r in rows if r["nullspace_rule"] == "energy")
    assert all(v <= energy["nullspace_threshold"] for v in energy["leak"].values())
    assert "(energy)" in (d / "mass_editing.md").read_text()
    _rewrite(d, n=999)  # a result for other requests is not merged into
    with pytest.raises(ValueError, match=r"setting only: the earlier result in this folder has n=999; this run has n="):
        run(only="rome_sequential")
    with pytest.raises(ValueError, match="no earlier result"):
        run_experiment(
            "mass_editing", facts_model, quick=True, settings={"only": "stats"}, out=tmp_path, tag="new", progress=False
        )
