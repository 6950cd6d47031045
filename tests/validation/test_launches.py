"""Launches and command lines are checked before any work: a torchrun environment wrong on its face
(a bad timeout, RANK ≥ WORLD_SIZE, a missing MASTER_ADDR …) is one line per rank and exit code 2,
before any process group is made; list-of-int flags name the flag and the bad element; an output
path that cannot be written is refused before the command trains or loads anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpt2_interp.cli import main
from gpt2_interp.core import distributed

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "29511"}
LAUNCH_KEYS = (*LAUNCH, "LOCAL_RANK", "LOCAL_WORLD_SIZE", distributed.ENV_TIMEOUT)


def _cli(args: list[str], **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in LAUNCH_KEYS}
    full = dict(clean, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), **env)
    return subprocess.run(
        [sys.executable, "-m", "gpt2_interp", *args], env=full, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "env,match",
    [
        ({distributed.ENV_TIMEOUT: "soon"}, "GPT2_INTERP_DIST_TIMEOUT='soon' must be a finite number of seconds > 0"),
        ({**LAUNCH, "RANK": "3"}, r"\(rank 3\): error: RANK=3 must be below WORLD_SIZE=2"),
    ],
)
def test_bad_launch_environment_is_one_line_and_exit_2(env, match):
    out = _cli(["info"], **env)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and out.stdout == "", out.stderr
    import re

    assert re.search(match, lines[0]), lines[0]


@pytest.fixture
def no_launch(monkeypatch):
    for k in LAUNCH_KEYS:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


@pytest.mark.parametrize(
    "env,match",
    [
        ({distributed.ENV_TIMEOUT: "-5"}, r"GPT2_INTERP_DIST_TIMEOUT='-5' must be a finite number"),
        ({distributed.ENV_TIMEOUT: "inf"}, r"GPT2_INTERP_DIST_TIMEOUT='inf' must be a finite number"),
        ({"RANK": "0", "WORLD_SIZE": "2"}, r"sets RANK and WORLD_SIZE but not MASTER_ADDR, MASTER_PORT"),
        ({**LAUNCH, "WORLD_SIZE": "two"}, r"WORLD_SIZE='two' must be an integer ≥ 1"),
        ({**LAUNCH, "RANK": "-1"}, r"RANK=-1 must be ≥ 0"),
        ({**LAUNCH, "LOCAL_RANK": "2"}, r"LOCAL_RANK=2 must be below LOCAL_WORLD_SIZE=2"),
        ({**LAUNCH, "MASTER_PORT": "70000"}, r"MASTER_PORT=70000 must be a port number 1\.\.65535"),
        ({**LAUNCH, "MASTER_ADDR": "my host"}, r"MASTER_ADDR='my host' must be a host name"),
    ],
)
def test_launch_environment_values_are_named(no_launch, env, match):
    with pytest.raises(ValueError, match=match):
        distributed.check_launch_env(env)


def test_sane_launch_environments_pass(no_launch):
    distributed.check_launch_env({})
    distributed.check_launch_env({**LAUNCH, "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", distributed.ENV_TIMEOUT: "60"})
    no_launch.setenv(distributed.ENV_TIMEOUT, "90")
    assert distributed.timeout().total_seconds() == 90


def test_in_process_cli_reports_the_launch_error_before_any_process_group(no_launch, capsys):
    for k, v in {**LAUNCH, "RANK": "2"}.items():
        no_launch.setenv(k, v)
    assert main(["info"]) == 2
    err = capsys.readouterr().err
    assert "RANK=2 must be below WORLD_SIZE=2" in err and len(err.strip().splitlines()) == 1
    assert not distributed.is_distributed()


@pytest.mark.parametrize(
    "argv,match",
    [
        (["lens", "x", "--positions", "0,a"], r"argument --positions: .*'a' is not an integer"),
        (["neurons", "--promotes", "x", "--layers", "0,a"], r"argument --layers: .*'a' is not an integer"),
        (["probe", "--folds", "1"], r"argument --folds: expected an integer >= 2, got 1"),
        (["probe", "-C", "0"], r"argument -C: the value must be > 0, got 0"),
    ],
)
def test_cli_number_flags_name_the_flag(no_launch, capsys, argv, match):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    import re

    assert re.search(match, capsys.readouterr().err)


def test_output_paths_are_checked_before_the_work(no_launch, tmp_path, capsys, monkeypatch):
    import gpt2_interp.analysis.tuned_lens as tl

    def never(*a, **k):
        raise AssertionError("the work started before the output path was checked")

    monkeypatch.setattr(tl, "train_tuned_lens", never)
    (tmp_path / "file").write_text("x")
    cases = [
        (["tuned-lens", "--save", str(tmp_path / "file" / "lens.safetensors")], r"--save .* is a file, not a folder"),
        (
            ["tuned-lens", "--save", "/proc/none/lens.safetensors"],
            r"--save .* cannot be written: cannot create files in /proc",
        ),
        (["tuned-lens", "--save", str(tmp_path)], r"--save .* is a directory; give a file path"),
        (["lens", "x", "--out", str(tmp_path / "nowhere" / "f.png")], r"--out .*: the folder .*nowhere does not exist"),
        (["lens", "x", "--out", str(tmp_path / "f.docx")], r"--out .*: a figure is saved as .png"),
        (["demo", "--out", str(tmp_path / "file")], r"--out .* is a file; give a folder"),
    ]
    import re

    for argv, match in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert re.search(match, err), (argv, err)


def test_writable_output_paths_pass(tmp_path):
    from gpt2_interp.cli import check_output_path

    check_output_path(str(tmp_path / "new" / "deeper" / "lens.safetensors"), "--save")
    check_output_path(str(tmp_path / "f.png"), "--out", "figure")
    check_output_path(str(tmp_path / "report"), "--out", "dir")
    assert not list(tmp_path.iterdir())  # the checks leave nothing behind
