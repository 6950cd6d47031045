"""Progress where the output is not a terminal: plain lines on stderr at a steady interval (also while a
loop is stalled), with the count, the elapsed time and the ETA; none inside ``enabled(False)``."""

from __future__ import annotations

import re
import time

import pytest

from gpt2_interp.core import progress


@pytest.fixture(autouse=True)
def _not_a_terminal(monkeypatch):
    monkeypatch.setattr(progress, "_live", lambda: False)


def test_a_default_bar_prints_plain_lines_at_its_interval_and_a_last_line(capsys):
    bar = progress.progress_bar(total=20, enabled=None, interval=0.05, desc="demo", unit="step")
    for i in range(20):
        time.sleep(0.02)
        bar.update(1)
        if i == 5:
            bar.set_postfix(fvu="0.153")
    time.sleep(0.15)  # a stall inside the loop is still reported
    bar.close()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 4
    assert all("\r" not in line for line in lines)
    assert re.fullmatch(r"demo: \d+/20 steps, \d+s elapsed, ETA \d+s", lines[0]), lines[0]
    assert any(line.endswith("(fvu=0.153)") for line in lines)
    assert lines[-1] == "demo: 20/20 steps, done in 1s (fvu=0.153)" or lines[-1].startswith("demo: 20/20 steps, done")


def test_short_work_prints_nothing_and_disabled_bars_stay_silent(capsys, monkeypatch):
    for _ in progress.progress_bar(range(5), enabled=None, desc="quick"):
        pass
    assert capsys.readouterr().err == ""
    monkeypatch.setenv(progress.INTERVAL_ENV, "0.02")
    for _ in progress.progress_bar(range(3), enabled=False, desc="off"):
        time.sleep(0.03)
    with progress.enabled(False):
        for _ in progress.progress_bar(range(3), enabled=True, desc="quiet run"):
            time.sleep(0.03)
    assert capsys.readouterr().err == ""
    for _ in progress.progress_bar(range(3), enabled=None, desc="env"):  # the interval from the environment
        time.sleep(0.03)
    assert "env: " in capsys.readouterr().err


def test_a_bar_asked_for_announces_its_start_and_end(capsys):
    for _ in progress.progress_bar(range(2), enabled=True, desc="asked", unit="request"):
        pass
    assert capsys.readouterr().err.splitlines() == ["asked: 0/2 requests, started", "asked: 2/2 requests, done in 0s"]


def test_a_bad_interval_is_refused(monkeypatch):
    monkeypatch.setenv(progress.INTERVAL_ENV, "-1")
    with pytest.raises(ValueError, match="GPT2_INTERP_PROGRESS_SECONDS"):
        progress.log_interval()
    assert progress.duration(130) == "2m10s" and progress.duration(3700) == "1h01m"
