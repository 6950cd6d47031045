"""``gpt2-interp steer``: pairs from a file, generation with the direction, one-line errors."""

from __future__ import annotations

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
    v = mean_difference(model, [a for a, _ in pairs], [b for _, b in pairs], at, "mean")
    want = model.generate("Rome is in", max_new_tokens=4, do_sample=False, steer=Steer(v, at, 2.0))
    assert f"norm {float(v.norm()):.3g}" in out and f"steered:   {want!r}" in out


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
