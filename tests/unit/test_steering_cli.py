"""``gpt2-interp steer``: pairs from a file, generation with the direction, one-line errors."""

from __future__ import annotations

import json

import pytest
import torch

import gpt2_interp as gi
from gpt2_interp.analysis.features import mean_difference
from gpt2_interp.cli import main
from gpt2_interp.model import Steer


@pytest.mark.slow  # loads gpt2-facts twice and generates with and without the direction
def test_steer_prints_the_continuations_with_the_files_direction(capsys, tmp_path):
    pairs = [("Paris is in France", "Berlin is in Germany"), ("Le chat", "The cat")]
    f = tmp_path / "pairs.tsv"
    f.write_text("".join(f"{a}\t{b}\n" for a, b in pairs) + "\n")
    argv = [
        "steer",
        "--pairs",
        str(f),
        "--layer",
        "1",
        "--prompt",
        "Rome is in",
        "--scale",
        "2",
        "--max-new-tokens",
        "4",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    model = gi.load("gpt2-facts")
    at = "blocks.1.hook_resid_post"
    v = mean_difference(model, [a for a, _ in pairs], [b for _, b in pairs], at, "last")  # the default, as the study
    want = model.generate("Rome is in", max_new_tokens=4, do_sample=False, steer=Steer(v, at, 2.0))
    assert f"norm {float(v.norm()):.3g}" in out and f"steered:   {want!r}" in out


@pytest.mark.slow  # loads gpt2-facts and measures the curve at two scales on three prompts
def test_steer_curve_names_the_best_scale_or_says_none_helps(capsys, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("I think the movie was\nThe food was\nMy week has been\n")
    argv = ["steer", "--concept", "sentiment", "--scales", "0,0.5", "--eval-prompts", str(prompts), "--unrelated", "2"]
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "difference of means (last)" in out  # the study's default position
    last = out.strip().splitlines()[-1]
    # the verb follows the sign of the measured shift at 0.5
    shift, within = data["prob_shift"][1], data["loss_change"][1] < 0.05
    if shift > 0 and within:
        assert data["best"]["scale"] == 0.5 and last.startswith(
            "Best scale within the 5% loss budget: 0.5, which raises"
        )
    else:
        assert data["best"] is None and "raises" not in last and last.endswith("no best scale.")


@pytest.mark.parametrize(
    ("lines", "needle"),
    [("only one column\n", "expected 'positive<TAB>negative'"), ("\n\n", "holds no contrast pairs")],
)
def test_bad_pair_files_are_one_line_errors(capsys, tmp_path, lines, needle):
    f = tmp_path / "pairs.tsv"
    f.write_text(lines)
    assert main(["steer", "--pairs", str(f), "--prompt", "Hi"]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_steer_needs_a_prompt_or_scales(capsys):
    assert main(["steer", "--concept", "french"]) == 2
    assert "give --prompt" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["steer", "--concept", "french", "--scales", "0,x"])
    assert e.value.code == 2
    assert "'x' is not a number" in capsys.readouterr().err
    assert torch.is_grad_enabled()
