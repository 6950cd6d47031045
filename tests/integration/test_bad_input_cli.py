"""Bad input on the command line: every error is ONE line on stderr, a non-zero exit, no traceback,
and the line names the argument or file at fault (``--debug`` shows the traceback)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from gpt2_interp.cli import main
from gpt2_interp.model import HookedGPT2

from ..conftest import TINY


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse usage errors exit through SystemExit
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *needles):
    assert code not in (0, None), "bad input must give a non-zero exit"
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got: {err!r}"
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["info", "--device", "gpu"], ["--device", "unknown device 'gpu'", "cpu"]),
        (["info", "--device", "cuda:99"], ["--device", "cuda:99"]),
        (["info", "--dtype", "fp64"], ["--dtype", "fp64", "fp32"]),
        (["lens", "The capital of France is", "--top", "-1"], ["--top", ">= 1", "-1"]),
        (["generate", "Hello", "-n", "0"], ["--max-new-tokens", ">= 1"]),
        (["generate", "Hello", "--top-p", "1.5"], ["--top-p", "1.5"]),
        (["neurons", "--layer", "0", "--top", "0"], ["--top", ">= 1"]),
        (["trace", "Munich is a city in", "--subject", "Munich", "--samples", "0"], ["--samples"]),
        (["evaluate-edits", "--n", "-3"], ["--n", ">= 1"]),
        (["evaluate-edits", "--n", "2", "--generation-tokens", "-1"], ["--generation-tokens", ">= 0"]),
        (["lens", "x", "--positions", "a,b"], ["positions"]),
        (["nonsense-command"], ["invalid choice"]),
        (
            [
                "edit",
                "--subject",
                "Munich",
                "--prompt",
                "{} is a city in",
                "--target",
                " Italy",
                "--keep",
                "Munich is big",
            ],
            ["keep", "{}"],
        ),
        (["edit", "--requests", "r.jsonl", "--keep", "{} is big"], ["--keep", "'keep' list"]),
    ],
)
def test_argument_errors_are_one_line(capsys, argv, needles):
    if argv[:3] == ["info", "--device", "cuda:99"] and torch.cuda.device_count() > 99:  # pragma: no cover
        pytest.skip("a machine with 100 GPUs")
    code, _, err = run(capsys, *argv)
    assert_one_line_error(code, err, *needles)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_one_line(capsys):
    code, _, err = run(capsys, "info", "--device", "cuda")
    assert_one_line_error(code, err, "'cuda' is not available", "cpu")


def test_malformed_hparams_are_named(capsys):
    base = ["edit", "--subject", "Munich", "--prompt", "{} is a city in", "--target", " Italy"]
    for hp, needle in (
        ("v_steps", "NAME=VALUE"),
        ("v_steps=abc", "v_steps must be an integer"),
        ("no_such=1", "unknown ROME hyperparameter"),
        ("v_lr=true", "v_lr must be a number"),
    ):
        code, _, err = run(capsys, *base, "--hparam", hp)
        assert_one_line_error(code, err, needle)


@pytest.mark.slow
def test_bad_api_values_are_one_line(capsys):
    code, _, err = run(capsys, "lens", "The capital of France is", "--target", " Paris Paris")
    assert_one_line_error(code, err, "' Paris Paris'")
    code, _, err = run(capsys, "trace", "Munich is a city in", "--subject", "Berlin", "--samples", "1")
    assert_one_line_error(code, err, "Berlin")
    code, _, err = run(capsys, "neurons", "--layer", "99")
    assert_one_line_error(code, err, "99")


@pytest.mark.slow
def test_missing_and_damaged_files_are_one_line(capsys, tmp_path):
    code, _, err = run(capsys, "info", "--model", str(tmp_path / "nowhere.safetensors"))
    assert_one_line_error(code, err, "nowhere.safetensors")
    code, _, err = run(capsys, "verify", str(tmp_path / "missing.edit"))
    assert_one_line_error(code, err, "missing.edit")
    junk = tmp_path / "junk.edit"
    junk.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}...")
    code, _, err = run(capsys, "verify", str(junk))
    assert_one_line_error(code, err, "junk.edit")

    model = HookedGPT2(TINY, seed=0)
    model.save(tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    code, _, err = run(capsys, "info", "--model", str(tmp_path / "m"))
    assert_one_line_error(code, err, "model.safetensors", "damaged")
    weights.write_bytes(good)
    sd = load_file(str(weights))
    sd["transformer.h.0.attn.c_attn.bias"][0] = float("nan")
    save_file(sd, str(weights), metadata={"format": "pt"})
    code, _, err = run(capsys, "info", "--model", str(tmp_path / "m"))
    assert_one_line_error(code, err, "transformer.h.0.attn.c_attn.bias", "NaN")
    (tmp_path / "m" / "config.json").write_text("{oops")
    code, _, err = run(capsys, "info", "--model", str(tmp_path / "m"))
    assert_one_line_error(code, err, "config.json", "not valid JSON")


def test_debug_shows_the_traceback():
    with pytest.raises(FileNotFoundError, match=r"x\.edit"):
        main(["verify", "/nonexistent/x.edit", "--debug"])
    with pytest.raises(ValueError, match="unknown ROME hyperparameter"):
        main(
            ["--debug", "edit", "--subject", "Munich", "--prompt", "{} is in", "--target", " Italy", "--hparam", "no=1"]
        )


@pytest.mark.slow
def test_a_real_process_prints_one_line_and_exits_non_zero(tmp_path):
    """The installed entry point, as a user runs it (no pytest in between)."""
    proc = subprocess.run(
        [sys.executable, "-m", "gpt2_interp.cli", "verify", str(tmp_path / "x.edit")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "x.edit" in proc.stderr


def test_info_json_lists_hooks_and_is_line_oriented(capsys):
    code, out, _ = run(capsys, "info", "--json")
    assert code == 0
    data = json.loads(out)
    # 23 per block: the 17 that fire in every forward pass and the 6 opt-in ones (attn.hook_result,
    # hook_q_input, hook_k_input, hook_v_input, hook_attn_in, hook_mlp_in), as TransformerLens lists them
    assert (
        "blocks.0.hook_resid_pre" in data["hooks"] and len(data["hooks"]) == 6 * 23 + 6
    )  # + embed, pos_embed, ln_final x2, unembed.hook_in/hook_out
    assert len(out.strip().splitlines()) == len(data)  # one line per top-level field


@pytest.mark.slow
def test_neurons_figure_draws_every_requested_neuron(capsys, tmp_path, facts_model):
    from gpt2_interp.analysis.vocab import neuron_vocab

    code, _, _ = run(capsys, "neurons", "--layer", "2", "--top", "20", "-k", "3", "--out", str(tmp_path / "n.png"))
    assert code == 0 and (tmp_path / "n.png").exists()
    fig = neuron_vocab(facts_model, 2, k=3).strongest(20).plot()
    assert len(fig.axes) == 2 * 20  # top and bottom bars for each of the 20 neurons


@pytest.mark.parametrize(
    "command, content, needles",
    [
        ("trace", None, ["--dataset", "no such file"]),
        ("trace", '{"prompt": "The capital of France is", "subject": "France"}\n', ["line 1", "'target'"]),
        (
            "trace",
            '{"prompt": "The capital of France is", "subject": "Spain", "target": " Paris"}\n',
            ["'Spain'", "not in its prompt"],
        ),
        ("trace", "not json\n", ["line 1", "not JSON"]),
        ("trace", "[1, 2]\n", ["line 1", "list"]),
        ("trace", "\n# only a comment\n", ["holds no objects"]),
        ("patch", '{"clean": "a b", "corrupted": "c d", "answer": 7}\n', ["line 1", "'answer'", "non-empty strings"]),
        (
            "patch",
            '{"clean": "The capital of France is", "corrupted": "The capital of Italy is", "answer": " Paris", '
            '"wrong": " Rome"}\n'
            '{"clean": "The capital of Spain is", "corrupted": "The capital of Japan is", "answer": " Madrid"}\n',
            ["1 of 2 pairs", '"wrong"', "every line"],
        ),
        (
            "patch",
            '{"clean": "The capital of France is", "corrupted": "The capital of the United Kingdom is", "answer": " '
            'Paris"}\n',
            ["same number of tokens"],
        ),
    ],
)
def test_bad_dataset_files_are_one_line(capsys, tmp_path, command, content, needles):
    path = tmp_path / "data.jsonl"
    if content is not None:
        path.write_text(content)
    code, out, err = run(capsys, command, "--dataset", str(path))
    assert_one_line_error(code, err, *needles)
    assert out == ""


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["trace", "--dataset", "facts:0"], ["facts:N", "positive integer"]),
        (["trace", "--dataset", "facts:2", "--subject", "Munich"], ["--dataset", "drop --subject"]),
        (["trace", "Munich is a city in"], ["--subject", "--dataset"]),
        (["patch", "--dataset", "facts:2", "--answer", " Paris"], ["drop --answer"]),
        (["patch", "--clean", "The capital of France is"], ["--corrupted", "--dataset"]),
    ],
)
def test_dataset_argument_mistakes_are_one_line(capsys, argv, needles):
    code, _, err = run(capsys, *argv)
    assert_one_line_error(code, err, *needles)
