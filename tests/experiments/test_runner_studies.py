"""Studies live outside the package: the runner finds them in study folders (``--studies DIR``,
``$GPT2_INTERP_STUDIES``, ``./analyses``, the checkout's ``analyses/``); a study of one's own is one small file."""

from __future__ import annotations

import hashlib
import json
import sys
import textwrap
from pathlib import Path

import pytest

from gpt2_interp import cli
from gpt2_interp.experiments import ExperimentResult, load_all, run_experiment, study_folders
from gpt2_interp.experiments.base import REGISTRY

ROOT = Path(__file__).resolve().parents[2]

STUDY = '''
"""First token: the model's greedy next token after a prompt."""

from dataclasses import dataclass

from gpt2_interp.experiments import ExperimentConfig, register


@dataclass
class Config(ExperimentConfig):
    prompt: str = "The Eiffel Tower is in"


def tables(data):
    return {"first_token": f"next after {data['prompt']!r}: {data['next']!r}"}


@register("NAME", Config, tables=tables)
def run(model, cfg, ctx):
    logits = model.last_logits([cfg.prompt])
    return {"prompt": cfg.prompt, "next": model.tokenizer.token_str(int(logits[0].argmax()))}
'''


def write_study(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(STUDY).replace("NAME", name))
    return path


@pytest.fixture
def forget():
    """Names to drop from the registry (and their modules from ``sys.modules``) after the test."""
    names: list[str] = []
    yield names
    for name in names:
        exp = REGISTRY.pop(name, None)
        if exp is not None:
            sys.modules.pop(exp.run.__module__, None)


def test_a_study_of_ones_own_runs_from_its_folder_with_result_and_provenance(tiny, tmp_path, forget):
    forget.append("first_token_a")
    write_study(tmp_path / "mine", "first_token_a")
    res = run_experiment(
        "first_token_a", tiny, studies=[tmp_path / "mine"], settings={"prompt": "Hello"}, out=tmp_path / "out"
    )
    assert res.data["prompt"] == "Hello" and isinstance(res.data["next"], str)
    d = tmp_path / "out" / "first_token_a" / "tiny"
    saved = ExperimentResult.load(d)
    assert saved.data == res.data and saved.config["prompt"] == "Hello"
    prov = json.loads((d / "provenance.json").read_text())
    assert prov["experiment"] == "first_token_a" and prov["differs_from_defaults"]["prompt"]["used"] == "Hello"
    assert prov["command"].startswith(f"gpt2-interp run --studies {tmp_path / 'mine'} first_token_a --model tiny")
    assert prov["code"]["commit"] and prov["model"]["weights_fingerprint"]
    study = tmp_path / "mine" / "first_token_a.py"
    assert prov["study"]["file"] == str(study)
    assert prov["study"]["sha256"] == hashlib.sha256(study.read_bytes()).hexdigest()
    assert (d / "first_token.md").read_text().startswith("next after 'Hello':")


def test_the_cli_lists_and_runs_a_study_given_with_studies(tmp_path, capsys, forget, monkeypatch):
    forget.append("first_token_b")
    write_study(tmp_path / "mine", "first_token_b")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "--studies", "mine", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "first_token_b" in listed and "logit_lens" in listed  # the checkout's studies too
    out = tmp_path / "out"
    argv = ["run", "--studies", "mine", "first_token_b", "--model", "gpt2-facts", "--out", str(out), "--quiet"]
    assert cli.main(argv) == 0
    d = out / "first_token_b" / "gpt2-facts"
    assert json.loads((d / "result.json").read_text())["data"]["prompt"] == "The Eiffel Tower is in"
    assert json.loads((d / "provenance.json").read_text())["experiment"] == "first_token_b"
    (d / "first_token.md").unlink()
    assert (
        cli.main(["run", "--studies", "mine", "first_token_b", "--model", "gpt2-facts", "--out", str(out), "--render"])
        == 0
    )
    assert (d / "first_token.md").exists()


def test_the_environment_names_study_folders(tmp_path, monkeypatch, forget):
    forget.append("first_token_c")
    write_study(tmp_path / "env", "first_token_c")
    monkeypatch.setenv("GPT2_INTERP_STUDIES", f"{tmp_path / 'nowhere'}{__import__('os').pathsep}{tmp_path / 'env'}")
    assert (tmp_path / "env").resolve() in study_folders()
    assert "first_token_c" in load_all()


def test_the_checkout_studies_are_the_package_analyses():
    assert ROOT / "analyses" in study_folders()
    import analyses.logit_lens

    assert load_all()["logit_lens"].run is analyses.logit_lens.run


def test_one_name_from_two_folders_is_refused_naming_both_files(tmp_path, forget):
    forget.append("first_token_d")
    one, two = write_study(tmp_path / "one", "first_token_d"), write_study(tmp_path / "two", "first_token_d")
    with pytest.raises(ValueError, match="registered twice") as e:
        load_all([tmp_path / "one", tmp_path / "two"])
    assert str(one) in str(e.value) and str(two) in str(e.value)


def test_the_studies_of_one_folder_share_a_helper_by_relative_import(tmp_path, tiny, forget):
    forget.append("first_token_e")
    folder = tmp_path / "shared"
    path = write_study(folder, "first_token_e")
    (folder / "_common.py").write_text('PROMPT = "The capital of France is"\n')
    text = path.read_text().replace('"The Eiffel Tower is in"', "PROMPT")
    path.write_text(
        text.replace(
            "from dataclasses import dataclass\n", "from dataclasses import dataclass\n\nfrom ._common import PROMPT\n"
        )
    )
    assert "_common" not in str(load_all([folder]).keys())  # a helper is not a study
    assert run_experiment("first_token_e", tiny, studies=[folder]).data["prompt"] == "The capital of France is"


def test_a_study_declares_what_else_its_cached_parts_depend_on(tiny, tmp_path):
    from dataclasses import dataclass

    from gpt2_interp.experiments import ExperimentConfig, register

    @dataclass
    class Config(ExperimentConfig):
        pass

    calls: list[int] = []
    depends = {"value": "a"}

    def run(model, cfg, ctx):
        return {"x": ctx.cached("part", lambda: (calls.append(1), [1.0])[1]), "key": ctx.cache_key}

    register("depends_toy", Config, cache_depends=lambda: depends["value"])(run)
    try:
        first = run_experiment("depends_toy", tiny, out=tmp_path, progress=False)
        assert run_experiment("depends_toy", tiny, out=tmp_path, progress=False).data["key"] == first.data["key"]
        depends["value"] = "b"  # e.g. the editors' default files changed
        assert run_experiment("depends_toy", tiny, out=tmp_path, progress=False).data["key"] != first.data["key"]
        assert len(calls) == 2
    finally:
        REGISTRY.pop("depends_toy")


def test_only_the_editing_studies_fold_the_editing_defaults_into_their_cache_key():
    from gpt2_interp.editing.hparams import defaults_digest

    declared = {name for name, exp in load_all().items() if exp.cache_depends is defaults_digest}
    assert {"mass_editing", "rome_counterfact", "paper_departures"} <= declared
    assert not declared & {"logit_lens", "causal_trace", "attribution", "steering"}
