"""What the runner says about a run: the cached parts it resumes from (or that it computes everything), the
earlier result it overwrites, and a study's refusal, which leaves no result folder and exits non-zero."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
import torch

from gpt2_interp.cli import main
from gpt2_interp.experiments import ExperimentConfig, Refused, register, run_experiment
from gpt2_interp.experiments.base import REGISTRY


@dataclass
class MsgConfig(ExperimentConfig):
    n: int = field(default=3, metadata={"help": "how many"})
    refuse: bool = field(default=False, metadata={"help": "decline the run"})

    QUICK: ClassVar[dict[str, Any]] = {"n": 2}


@pytest.fixture
def studies():
    """Two registered studies: one caching a part, one that refuses when asked to."""

    def cached_run(model, cfg: MsgConfig, ctx):
        return {"x": ctx.cached("base", lambda: torch.arange(cfg.n).float()).tolist()}

    def refusing_run(model, cfg: MsgConfig, ctx):
        if cfg.refuse:
            raise Refused("msg_refusing: the model does not perform this task")
        return {"x": [0.0] * cfg.n}

    register("msg_cached", MsgConfig, tables=lambda d: {"t": str(d["x"])})(cached_run)
    register("msg_refusing", MsgConfig, tables=lambda d: {"t": str(d["x"])})(refusing_run)
    yield
    REGISTRY.pop("msg_cached")
    REGISTRY.pop("msg_refusing")


def test_a_run_says_what_it_resumes_from_and_what_it_overwrites(studies, tiny, tmp_path, capsys):
    d = tmp_path / "msg_cached" / "tiny"
    run_experiment("msg_cached", tiny, out=tmp_path, progress=False)
    err = capsys.readouterr().err
    assert "no cached parts: computing everything" in err and "overwriting" not in err
    run_experiment("msg_cached", tiny, out=tmp_path, progress=False)
    err = capsys.readouterr().err
    assert f"resuming: 1 cached part found in {d / '.cache'}" in err
    assert f"overwriting {d / 'result.json'} (previous run from 20" in err and "commit" in err


def test_a_study_that_caches_nothing_says_a_rerun_recomputes_everything(studies, tiny, tmp_path, capsys, monkeypatch):
    import gpt2_interp.experiments.runner as runner

    monkeypatch.setattr(runner, "caches_parts", lambda exp: False)
    run_experiment("msg_refusing", tiny, out=tmp_path, progress=False)
    assert "caches no parts: a rerun computes everything again" in capsys.readouterr().err


def test_a_refused_run_writes_nothing(studies, tiny, tmp_path):
    with pytest.raises(Refused, match="does not perform"):
        run_experiment("msg_refusing", tiny, settings={"refuse": True}, out=tmp_path, progress=False)
    assert not (tmp_path / "msg_refusing").exists()  # the folder the run made is gone
    # an earlier result in the folder is left as it was
    run_experiment("msg_refusing", tiny, out=tmp_path, progress=False)
    before = (tmp_path / "msg_refusing" / "tiny" / "result.json").read_text()
    with pytest.raises(Refused):
        run_experiment("msg_refusing", tiny, settings={"refuse": True}, out=tmp_path, progress=False)
    assert (tmp_path / "msg_refusing" / "tiny" / "result.json").read_text() == before


@pytest.mark.slow  # loads gpt2-facts and reads its IOI performance on 8 pairs
def test_the_cli_exits_non_zero_when_a_study_refuses(tmp_path, capsys):
    # gpt2-facts does not do IOI: circuit_discovery refuses, with status 2 and no result folder
    argv = ["run", "circuit_discovery", "--quick", "--set", "task=ioi", "--out", str(tmp_path), "--quiet"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 2 and "no cached parts" in err.splitlines()[0]
    assert "does not perform ioi" in err and "force=true" in err
    assert not (tmp_path / "circuit_discovery").exists()
