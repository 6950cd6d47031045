"""SAE evaluation reads text held out from training, by the split training records; training's FVU and
evaluation's variance explained are one definition over the same positions (checked against a hand
computation); the cheap CLI checks answer before the model loads."""

from __future__ import annotations

import json

import pytest
import torch

from gpt2_interp.analysis.features.sae import SAE, SAEConfig
from gpt2_interp.analysis.features.sae_eval import evaluate_sae
from gpt2_interp.analysis.features.sae_train import (
    ActivationBuffer,
    SAETrainConfig,
    SAETrainer,
    heldout_windows,
    kept_positions,
    run_to_hook,
    split_windows,
    token_windows,
    train_sae,
    trained_overlap,
)
from gpt2_interp.cli import main
from gpt2_interp.model.loading import model_config

HOOK = "blocks.0.hook_resid_post"
TEXTS = [
    "The quick brown fox jumps over the lazy dog. " * 24,
    "Paris is the capital of France and Rome is the capital of Italy. " * 20,
    "One two three four five six seven eight nine ten eleven twelve. " * 20,
]


def _massive(x, hook):  # massive activations, as Llama-family models make: after BOS, and one further on
    x = x.clone()
    x[:, 1] *= 1000
    x[:, 7] *= 40
    x[:, 11] *= 3  # large, not an outlier
    return x


def test_training_fvu_and_evaluation_variance_explained_agree_with_a_hand_computation(tiny):
    windows = token_windows(tiny, TEXTS, 16)[:12]
    ratio = 10.0
    with tiny.hooks([("blocks.0.hook_resid_pre", _massive)]):
        acts = run_to_hook(tiny, windows, HOOK)  # [n, 16, 64]
        # the oracle: BOS dropped, then per window the positions above ratio × the median norm of the others
        rows = []
        n_out = 0
        for w in acts:
            body = w[1:]
            norms = body.norm(dim=-1)
            out = norms > ratio * norms.median()
            n_out += int(out.sum())
            rows.append(body[~out])
        x = torch.cat(rows)
        assert len(windows) < n_out < 3 * len(windows)
        assert int((~kept_positions(acts, True, ratio)).sum()) == n_out + len(windows)

        cfg = SAETrainConfig(
            hook_name=HOOK, expansion=2, k=8, batch_size=len(x), buffer_tokens=len(x), outlier_ratio=ratio
        )
        sae = SAE(SAEConfig(d_in=64, d_sae=128, hook_name=HOOK, k=8), seed=3)
        with torch.no_grad():
            sae.b_enc.normal_(0, 0.1, generator=torch.Generator().manual_seed(0))
            sae.b_dec.copy_(x.mean(0) * 0.5)
            hand = float((x - sae(x)).pow(2).sum() / (x - x.mean(0)).pow(2).sum())

        ev = evaluate_sae(tiny, sae, windows, batch=5, outlier_ratio=ratio)  # batches unlike training's
        assert ev.tokens == len(x) and ev.outliers == n_out and ev.bos == len(windows)
        assert 1 - ev.variance_explained == pytest.approx(hand, rel=1e-5)

        buf = ActivationBuffer(
            tiny, HOOK, windows, batch_size=len(x), buffer_tokens=len(x), forward_batch=4, outlier_ratio=ratio
        )
        (batch,) = list(buf)  # every kept row, once, shuffled
        assert buf.outliers == n_out and buf.bos == len(windows)
        fvu, _, _ = SAETrainer(sae, cfg, total_steps=1).step(batch)  # the batch's FVU before the step
        assert float(fvu) == pytest.approx(hand, rel=1e-5)


def test_split_is_recorded_and_heldout_windows_are_those_after_the_training_windows(tiny, tmp_path):
    src = tmp_path / "text.txt"
    src.write_text(" ".join(TEXTS))
    train, record = split_windows(tiny, str(src), 16, heldout=0.25)
    every = token_windows(tiny, [src.read_text()], 16)
    n_train = record["train_windows"]
    assert n_train == len(train) and torch.equal(train, every[:n_train])
    assert record["heldout_windows"] == len(every) - n_train > 0
    assert torch.equal(heldout_windows(tiny, record), every[n_train:])

    cfg = SAETrainConfig(hook_name=HOOK, expansion=1, k=4, tokens=512, batch_size=128, buffer_tokens=256)
    sae, log = train_sae(tiny, cfg, windows=train, record=record, progress=False)
    rec = sae.cfg.training
    assert rec is not None and rec["texts"] == str(src.resolve()) and rec["outlier_ratio"] is None
    assert 0 < rec["windows_read"] <= n_train and log.bos == rec["windows_read"]
    assert SAE.load(sae.save(tmp_path / "sae")).cfg.training == rec  # travels with the SAE's files

    read = rec["windows_read"]
    assert trained_overlap(tiny, rec, str(src), 16, 0, 4) == min(4, read)
    assert trained_overlap(tiny, rec, str(src), 16, read, 4) == 0
    assert trained_overlap(tiny, rec, "brown", 16, 0, 4) == 0  # another source
    # the same text cut at another context: the overlap is counted in tokens
    assert trained_overlap(tiny, rec, str(src), 31, 0, 100) == -(-read * 15 // 30)


def _train_cli(folder, text, extra=()):
    args = ["sae", "train", "--hook", "blocks.2.hook_resid_post", "--save", str(folder), "--texts", str(text)]
    args += ["--context", "32", "--expansion", "1", "--k", "4", "--tokens", "2048", "--batch-size", "256"]
    return main([*args, "--buffer-tokens", "1024", "--quiet", *extra])


@pytest.mark.slow
def test_cli_eval_reads_the_heldout_windows_and_refuses_training_text(tmp_path, capsys, facts_model):
    text = tmp_path / "text.txt"
    text.write_text(" ".join(f"The city number {i} lies in country {i % 7}." for i in range(300)))
    folder = tmp_path / "sae"
    assert _train_cli(folder, text, ["--heldout", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "held out for `sae eval`" in out and "BOS positions" in out
    sae = SAE.load(folder)
    rec = sae.cfg.training
    assert rec is not None and rec["train_windows"] + rec["heldout_windows"] == len(
        token_windows(facts_model, [text.read_text()], 32)
    )

    assert main(["sae", "eval", str(folder), "--windows", "8", "--json", "--quiet"]) == 0
    got = json.loads(capsys.readouterr().out)
    held = token_windows(facts_model, [text.read_text()], 32)[rec["train_windows"] :][:8]
    want = evaluate_sae(facts_model, sae, held)
    assert got["text"].startswith("held out") and got["tokens"] == want.tokens
    assert got["variance_explained"] == pytest.approx(want.variance_explained, abs=1e-6)

    assert main(["sae", "eval", str(folder), "--texts", str(text), "--windows", "4"]) == 2
    assert "hold text the SAE was trained on" in capsys.readouterr().err
    assert main(["sae", "eval", str(folder), "--texts", str(text), "--windows", "4", "--allow-training-text"]) == 0
    captured = capsys.readouterr()
    assert "warning" in captured.err and "not a held-out measure" in captured.err and "TRAINED ON" in captured.out
    start = rec["train_windows"]
    assert main(["sae", "eval", str(folder), "--texts", str(text), "--start", str(start), "--windows", "4"]) == 0
    assert "none trained on" in capsys.readouterr().out


def test_cheap_cli_checks_answer_before_the_model_loads(tmp_path, capsys, monkeypatch):
    from gpt2_interp.cli import circuits, features

    def no_load(args):
        raise AssertionError("the model was loaded before the check")

    monkeypatch.setattr(features, "load_model", no_load)
    monkeypatch.setattr(circuits, "load_model", no_load)
    bad = ["sae", "train", "--hook", "blocks.2.hook_resid_psot", "--save", str(tmp_path / "s")]
    assert main(bad) == 2
    err = capsys.readouterr().err
    assert "unknown hook name 'blocks.2.hook_resid_psot'" in err and "blocks.2.hook_resid_post" in err
    assert (
        main(["sae", "train", "--hook", "blocks.2.hook_resid_post", "--save", str(tmp_path / "s"), "--context", "9999"])
        == 2
    )
    assert "exceeds" in capsys.readouterr().err

    d_model = model_config("gpt2-facts").d_model
    folder = SAE(SAEConfig(d_in=d_model, d_sae=2 * d_model, hook_name="blocks.2.hook_resid_post", k=4)).save(
        tmp_path / "sae"
    )
    assert main(["sae", "features", str(folder), "--latent", str(2 * d_model)]) == 2
    assert f"this SAE has {2 * d_model} latents" in capsys.readouterr().err
    other = SAE(SAEConfig(d_in=d_model, d_sae=8, hook_name="blocks.99.hook_resid_post", k=4)).save(tmp_path / "o")
    assert main(["sae", "eval", str(other)]) == 2
    assert "unknown hook name 'blocks.99.hook_resid_post'" in capsys.readouterr().err
    assert main(["circuit", "--task", "io"]) == 2
    assert "unknown task 'io'" in capsys.readouterr().err
