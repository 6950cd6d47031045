"""Tuned lenses and probes carry the weights fingerprint of the model they were made on and refuse to
be loaded or applied on another (naming both models); degenerate arguments (missing labels, a
one-token row, counts below their minimum, non-string prompts) are refused naming the argument."""

from __future__ import annotations

import pytest
import torch

from gpt2_interp.analysis.lens import logit_lens
from gpt2_interp.analysis.probes import collect_activations, probe
from gpt2_interp.analysis.tuned_lens import TunedLens, lens_divergence, token_rows, train_tuned_lens
from gpt2_interp.io.integrity import save_checked
from gpt2_interp.model import GPT2Config, HookedGPT2

CFG = GPT2Config(n_layer=2, d_model=32, n_head=4, d_mlp=64, n_ctx=32, name="alpha")
TEXTS = ["The cat sat on the mat.", "A dog ran in the park.", "Birds fly south in winter.", "Paris is in France."] * 2
PROMPTS = [f"{w} is a word" for w in ("cat", "dog", "car", "bus", "cow", "van", "pig", "jet")]
LABELS = ["animal", "animal", "vehicle", "vehicle", "animal", "vehicle", "animal", "vehicle"]


@pytest.fixture(scope="module")
def models():
    return HookedGPT2(CFG, seed=0), HookedGPT2(CFG.replace(name="beta"), seed=1)


@pytest.fixture(scope="module")
def lens(models):
    return train_tuned_lens(models[0], TEXTS, steps=0, seq_len=16, progress=False)


def test_tuned_lens_refuses_another_model_naming_both(models, lens, tmp_path):
    alpha, beta = models
    path = lens.save(tmp_path / "lens.safetensors")
    with pytest.raises(ValueError, match=r"trained on 'alpha' with weights .*\('beta'\)"):
        TunedLens.load(path, beta)
    with pytest.raises(ValueError, match=r"'alpha'.*'beta'"):
        lens.decode(beta, torch.zeros(1, CFG.d_model), 0)
    with pytest.raises(ValueError, match=r"'alpha'.*'beta'"):
        logit_lens(beta, "The cat", lens=lens)
    assert torch.equal(
        TunedLens.load(path, alpha).decode(alpha, torch.ones(1, CFG.d_model), "L0"),
        lens.decode(alpha, torch.ones(1, CFG.d_model), "L0"),
    )


def test_tuned_lens_check_sees_weights_changed_in_place(models, lens):
    alpha = HookedGPT2(CFG, seed=0)
    lens.check(alpha)
    with torch.no_grad():
        alpha.blocks[0].mlp.W_in.mul_(2)
    with pytest.raises(ValueError, match="trained on 'alpha'"):
        lens.check(alpha)


def test_tuned_lens_file_whose_shapes_do_not_fit_its_labels_is_refused(lens, tmp_path):
    import json

    from gpt2_interp.analysis.tuned_lens import FORMAT

    header = {"labels": ["embed", "L0"], "base_fingerprint": lens.base_fingerprint, "model_name": "alpha", "meta": {}}
    path = save_checked(
        tmp_path / "odd.safetensors",
        {"weight": lens.weight, "bias": lens.bias},
        {"format": FORMAT, "lens": json.dumps(header)},
    )
    with pytest.raises(ValueError, match=r"odd\.safetensors: weight \(3, 32, 32\).*do not fit 2 boundaries"):
        TunedLens.load(path)


def test_one_token_rows_and_bad_counts_are_refused_naming_the_argument(models):
    alpha = models[0]
    with pytest.raises(ValueError, match=r"seq_len must be ≥ 2, got 1"):
        train_tuned_lens(alpha, TEXTS, steps=0, seq_len=1, progress=False)
    with pytest.raises(ValueError, match=r"seq_len must be ≥ 2, got 1"):
        token_rows(alpha, TEXTS, 1)
    with pytest.raises(ValueError, match=r"batch_tokens must be ≥ 1, got 0"):
        train_tuned_lens(alpha, TEXTS, steps=1, batch_tokens=0, seq_len=16, progress=False)
    with pytest.raises(ValueError, match=r"lr must be a finite number > 0, got nan"):
        train_tuned_lens(alpha, TEXTS, steps=1, lr=float("nan"), seq_len=16, progress=False)
    with pytest.raises(ValueError, match=r"batch_rows must be ≥ 1, got 0"):
        lens_divergence(alpha, TEXTS, batch_rows=0, seq_len=16)
    with pytest.raises(TypeError, match=r"corpus\[1\] must be a string, got int"):
        train_tuned_lens(alpha, ["a text", 7], steps=0, seq_len=16, progress=False)


def test_probes_refuse_another_model_and_missing_labels(models):
    alpha, beta = models
    result = probe(alpha, PROMPTS, LABELS, hook="resid_post", layers=[1], n_folds=2, control=None)
    assert result.model_name == "alpha" and len(result.fingerprint) == 64
    feats = collect_activations(alpha, PROMPTS[:3], result.hooks, position="last")[result.hooks[0]]
    assert result.predict(alpha, PROMPTS[:3], 1) == list(result.estimators[0].predict(feats.double().numpy()))
    with pytest.raises(ValueError, match=r"fitted on activations of 'alpha'.*this model is 'beta'"):
        result.predict(beta, PROMPTS[:2], 1)
    with pytest.raises(ValueError, match=r"'alpha'.*'beta'"):
        result.direction(1, model=beta)
    assert result.direction(1, model=alpha).shape == (CFG.d_model,)
    with pytest.raises(ValueError, match=r"labels\[2\] is missing \(None\)"):
        probe(alpha, PROMPTS, [*LABELS[:2], None, *LABELS[3:]], layers=[1], n_folds=2)
    with pytest.raises(ValueError, match=r"labels\[0\] is missing \(nan\)"):
        probe(alpha, PROMPTS, [float("nan")] + [1.0] * 7, layers=[1], n_folds=2)
    with pytest.raises(ValueError, match=r"n_folds must be ≥ 2, got 1"):
        probe(alpha, PROMPTS, LABELS, layers=[1], n_folds=1)
    with pytest.raises(TypeError, match=r"prompts\[3\] must be a string, got int"):
        probe(alpha, [*PROMPTS[:3], 4, *PROMPTS[4:]], LABELS, layers=[1], n_folds=2)
