"""The experiment runner: settings parsed by type, the result layout, provenance, resuming, merging, the CLI."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pkgutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

import gpt2_interp.experiments as ex
from gpt2_interp.experiments import ExperimentConfig, ExperimentResult, parse_value, register, run_experiment
from gpt2_interp.experiments.base import REGISTRY

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ToyConfig(ExperimentConfig):
    n: int = field(default=3, metadata={"help": "how many"})
    scale: float = 1.0
    layers: tuple[int, ...] = (0, 1)
    name: str | None = None

    QUICK: ClassVar[dict[str, Any]] = {"n": 2}


CALLS: list[int] = []


def toy_tables(data: dict) -> dict[str, str]:
    return {"toy": "| i | x |\n|---|---|\n" + "\n".join(f"| {i} | {x:.3f} |" for i, x in enumerate(data["x"]))}


@pytest.fixture
def toy():
    """A registered experiment that draws ``n`` numbers, caches a partial result and merges with an earlier run."""

    def run(model, cfg: ToyConfig, ctx):
        ctx.record("toy_setting", {"scale": cfg.scale})
        base = ctx.cached("base", lambda: (CALLS.append(1), torch.randn(cfg.n))[1])
        earlier = ctx.previous
        return {"x": (base * cfg.scale).tolist(), "runs": (earlier or {}).get("runs", 0) + 1}

    register("toy", ToyConfig, tables=toy_tables)(run)
    yield REGISTRY["toy"]
    REGISTRY.pop("toy")


@pytest.mark.parametrize(
    "text, tp, expected",
    [
        ("3", int, 3),
        ("2.5", float, 2.5),
        ("true", bool, True),
        ("off", bool, False),
        ("a,b", list[str], ["a", "b"]),
        ("1,2,3", tuple[int, ...], (1, 2, 3)),
        ("", list[int], []),
        ("none", int | None, None),
        ("7", int | None, 7),
    ],
)
def test_settings_are_parsed_by_the_field_type(text, tp, expected):
    assert parse_value(text, tp, "x") == expected


@pytest.mark.parametrize(
    "text, tp, match",
    [("a", int, "integer"), ("nan", float, "finite"), ("maybe", bool, "true or false"), ("0,a", list[int], "integer")],
)
def test_bad_settings_name_the_field(text, tp, match):
    with pytest.raises(ValueError, match=f"Toy.k.*{match}|{match}.*"):
        parse_value(text, tp, "Toy.k")


def test_unknown_setting_names_the_closest():
    with pytest.raises(ValueError, match="no setting 'scal'; did you mean 'scale'"):
        ToyConfig.from_settings({"scal": "2"})


def test_a_run_writes_the_layout_with_provenance(toy, tiny, tmp_path):
    CALLS.clear()
    res = run_experiment("toy", tiny, settings={"scale": "2"}, out=tmp_path, progress=False)
    d = tmp_path / "toy" / "tiny"
    assert sorted(p.name for p in d.iterdir() if not p.name.startswith(".")) == [
        "provenance.json",
        "result.json",
        "toy.md",
    ]
    prov = json.loads((d / "provenance.json").read_text())
    # the fingerprint is the sha256 over the model's tensors, recomputed here without the library
    h = hashlib.sha256()
    for name, p in sorted(tiny.named_parameters()):
        t = hashlib.sha256(f"{p.dtype}|{tuple(p.shape)}|".encode())
        t.update(p.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        h.update(f"{name}={t.hexdigest()};".encode())
    assert prov["model"]["weights_fingerprint"] == h.hexdigest()
    assert prov["config"] == {"seed": 0, "n": 3, "scale": 2.0, "layers": [0, 1], "name": None}
    assert prov["differs_from_defaults"] == {"scale": {"used": 2.0, "default": 1.0}}
    assert prov["settings"] == {"toy_setting": {"scale": 2.0}}
    assert prov["command"] == f"gpt2-interp run toy --model tiny --set scale=2 --out {tmp_path}"
    assert prov["code"]["version"] and prov["software"]["torch"] == torch.__version__
    assert len(prov["machine"]["load_at_start"]) == 3 and prov["time"]["wall_seconds"] >= 0
    # seeded: the toy's numbers are torch.randn(3) after manual_seed(0), times the scale
    torch.manual_seed(0)
    assert res.data["x"] == pytest.approx((torch.randn(3) * 2).tolist(), rel=1e-5)
    loaded = ExperimentResult.load(d)
    assert loaded.data == res.data and loaded.tables() == res.tables()


def test_a_rerun_resumes_from_cache_and_records_the_merge(toy, tiny, tmp_path):
    CALLS.clear()
    run_experiment("toy", tiny, out=tmp_path, progress=False)
    second = run_experiment("toy", tiny, out=tmp_path, progress=False)
    assert len(CALLS) == 1  # the partial result was computed once
    assert second.data["runs"] == 2 and second.provenance["merged_with"]["experiment"] == "toy"
    run_experiment("toy", tiny, settings={"n": 4}, out=tmp_path, progress=False)
    assert len(CALLS) == 2  # another config: not the cached value


def test_quick_runs_go_to_their_own_folder(toy, tiny, tmp_path):
    res = run_experiment("toy", tiny, quick=True, out=tmp_path, progress=False)
    assert len(res.data["x"]) == 2 and (tmp_path / "toy" / "tiny" / "quick" / "result.json").exists()


def test_the_package_holds_the_runner_and_every_study_module_is_registered():
    assert {m.name for m in pkgutil.iter_modules(ex.__path__)} == {"base", "provenance", "runner"}
    studies = {p.stem for p in (ROOT / "analyses").glob("*.py") if not p.name.startswith("_")}
    registered = {Path(sys.modules[e.run.__module__].__file__).stem for e in ex.load_all().values()}
    assert studies <= registered


def test_every_experiment_has_a_quick_mode_and_documented_settings():
    for name, exp in ex.load_all().items():
        assert exp.summary, name
        fields = {f.name for f in dataclasses.fields(exp.config)}
        assert set(exp.config.QUICK) <= fields, name
        exp.config.quick()  # the quick settings are valid


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpt2_interp", *args], capture_output=True, text=True, cwd=ROOT)


def test_cli_lists_experiments_and_refuses_bad_settings_in_one_line():
    listed = _cli("run", "--list")
    assert listed.returncode == 0 and "logit_lens" in listed.stdout
    bad = _cli("run", "logit_lens", "--set", "per_relaton=3")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "did you mean 'per_relation'" in bad.stderr
    unknown = _cli("run", "logit_lense")
    assert unknown.returncode == 2 and "did you mean 'logit_lens'" in unknown.stderr


def test_cli_renders_a_saved_result_into_an_existing_folder(toy, tiny, tmp_path, capsys):
    from gpt2_interp import cli

    run_experiment("toy", tiny, out=tmp_path, progress=False)
    (tmp_path / "toy" / "tiny" / "toy.md").unlink()
    assert cli.main(["run", "toy", "--model", "tiny", "--out", str(tmp_path), "--render"]) == 0
    assert (tmp_path / "toy" / "tiny" / "toy.md").read_text().startswith("| i | x |")


def test_a_partial_result_with_named_dependencies_survives_other_settings(tiny, tmp_path):
    calls = []

    def run(model, cfg: ToyConfig, ctx):
        value = ctx.cached("sweep", lambda: (calls.append(1), torch.ones(cfg.n))[1], depends={"n": cfg.n})
        return {"x": (value * cfg.scale).tolist()}

    register("toy_dep", ToyConfig)(run)
    try:
        run_experiment("toy_dep", tiny, out=tmp_path, progress=False)
        again = run_experiment("toy_dep", tiny, settings={"scale": "3"}, out=tmp_path, progress=False)
        assert len(calls) == 1 and again.data["x"] == [3.0, 3.0, 3.0]  # scale is not a dependency: reused
        run_experiment("toy_dep", tiny, settings={"n": "2"}, out=tmp_path, progress=False)
        assert len(calls) == 2  # n is
    finally:
        REGISTRY.pop("toy_dep")


def test_code_state_names_a_commit_only_for_the_checkout_the_package_is_in(tmp_path, monkeypatch):
    """An installed copy of the package inside some other git repository (e.g. a venv in a checkout) has no
    commit of its own; the checkout the package belongs to reports its HEAD."""
    import subprocess

    from gpt2_interp.experiments import provenance

    head = subprocess.run(
        ["git", "-C", str(provenance.SOURCE_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    if head:
        assert provenance.code_state()["commit"] == head
    repo = tmp_path / "repo"
    installed = repo / ".venv" / "lib" / "site-packages"
    (installed / "gpt2_interp").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    monkeypatch.setattr(provenance, "SOURCE_ROOT", installed)
    assert provenance.code_state()["commit"] is None
