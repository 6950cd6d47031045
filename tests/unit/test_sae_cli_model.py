"""``gpt2-interp sae eval|features SAE_DIR`` without ``--model`` run the model the SAE was trained on (the
``model_name`` its ``cfg.json`` records), and a ``--model`` that cannot host the SAE is refused naming that model."""

from __future__ import annotations

import pytest

from gpt2_interp.analysis.features.sae import SAE, SAEConfig
from gpt2_interp.cli import main

HOOK = "blocks.1.hook_resid_post"


@pytest.fixture
def recorded(tmp_path, tiny, monkeypatch):
    """An SAE of the tiny model saved with the model name 'tiny-recorded'; loading a model by name returns the
    tiny model for that name (and records every name asked for)."""
    folder = SAE(SAEConfig(d_in=64, d_sae=32, hook_name=HOOK, k=4, model_name="tiny-recorded"), seed=0).save(
        tmp_path / "sae"
    )
    import gpt2_interp

    real, asked = gpt2_interp.load, []

    def load(name, device=None, dtype=None):
        asked.append(name)
        return tiny if name == "tiny-recorded" else real(name, device=device, dtype=dtype)

    monkeypatch.setattr("gpt2_interp.load", load)
    return folder, asked


@pytest.mark.parametrize("command", [["--token", " Paris"], ["--prompt", "The capital of France is"]])
def test_sae_features_without_model_runs_the_recorded_model(recorded, command, capsys):
    folder, asked = recorded
    assert main(["sae", "features", str(folder), *command, "--top", "2"]) == 0
    assert asked == ["tiny-recorded"] and "latents by" in capsys.readouterr().out


def test_sae_eval_without_model_runs_the_recorded_model(recorded, tmp_path, capsys):
    folder, asked = recorded
    text = tmp_path / "t.txt"
    text.write_text(" ".join(f"word{i}" for i in range(200)))
    assert main(["sae", "eval", str(folder), "--texts", str(text), "--context", "16", "--windows", "3", "--json"]) == 0
    assert asked == ["tiny-recorded"] and '"l0"' in capsys.readouterr().out


def test_another_model_is_refused_naming_the_recorded_one(recorded, capsys):
    folder, asked = recorded
    assert main(["sae", "features", str(folder), "--model", "gpt2-facts", "--token", " Paris"]) == 2
    err = capsys.readouterr().err
    assert asked == ["gpt2-facts"] and "--model tiny-recorded" in err and len(err.strip().splitlines()) == 1
