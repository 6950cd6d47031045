"""``gpt2-interp sae train|eval|features`` on the embedded model: a trained SAE is saved where asked,
reloads, and each command prints its table (or JSON) with the numbers the library computes."""

from __future__ import annotations

import json

import pytest

from gpt2_interp.analysis.features.sae import SAE
from gpt2_interp.cli import main


@pytest.mark.slow
def test_sae_train_eval_and_features_commands(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"The city number {i} lies in country {i % 7}." for i in range(120)))
    folder = tmp_path / "sae"
    args = ["--texts", str(text), "--context", "32"]
    assert (
        main(
            [
                "sae",
                "train",
                "--hook",
                "blocks.2.hook_resid_post",
                "--save",
                str(folder),
                *args,
                "--expansion",
                "1",
                "--k",
                "4",
                "--tokens",
                "1024",
                "--batch-size",
                "256",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "topk SAE (256 latents) at blocks.2.hook_resid_post of gpt2-facts saved to" in out
    sae = SAE.load(folder)
    assert sae.cfg.k == 4 and sae.cfg.d_sae == 256

    assert main(["sae", "eval", str(folder), "--windows", "4", "--json"]) == 0  # the held-out windows
    ev = json.loads(capsys.readouterr().out)
    assert ev["text"].startswith("held out")
    assert ev["l0"] == 4 and 0 < ev["variance_explained"] <= 1 and ev["hook_name"] == "blocks.2.hook_resid_post"

    assert main(["sae", "features", str(folder), "--token", " Paris", "--top", "3"]) == 0
    assert "latents by logit effect for ' Paris'" in capsys.readouterr().out
    assert main(["sae", "features", str(folder), "--latent", "0", "--windows", "4", "--top", "2"]) == 0
    assert "latent 0 at blocks.2.hook_resid_post" in capsys.readouterr().out
