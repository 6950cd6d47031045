"""Bad input on the SAE, steering and view surfaces: each refused before any long work with an error naming
the argument, field or file, or answered with a warning that says why (a zero steering direction, activations
that overflow a low-precision dtype)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gpt2_interp.analysis.features import steering as st
from gpt2_interp.analysis.features.activations import PrecisionWarning
from gpt2_interp.analysis.features.latent_probes import latent_probe
from gpt2_interp.analysis.features.sae import SAE, SAEConfig
from gpt2_interp.analysis.features.sae_eval import evaluate_sae
from gpt2_interp.analysis.features.sae_train import ActivationBuffer, SAETrainConfig, token_windows, train_sae
from gpt2_interp.analysis.features.sae_views import feature_view, logit_effect, top_tokens
from gpt2_interp.model import HookedGPT2
from gpt2_interp.model.steer import Steer, ZeroDirectionWarning
from tests.conftest import TINY

HOOK = "blocks.1.hook_resid_post"


@pytest.fixture
def sae():
    return SAE(SAEConfig(d_in=64, d_sae=96, hook_name=HOOK, k=6), seed=2)


@pytest.fixture
def windows(tiny):
    return token_windows(tiny, [" ".join(f"w{i}" for i in range(60))], 12)


# ---------------------------------------------------------------------- configs, refused when built
@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"d_sae": 0}, ValueError, "d_sae must be ≥ 1"),
        ({"d_sae": -5}, ValueError, "d_sae must be ≥ 1"),
        ({"architecture": "batchtopk", "d_sae": 16, "k": 32}, ValueError, "k=32 exceeds d_sae=16"),
        ({"architecture": "relu", "k": 8}, ValueError, "k=8 applies to the top-k architectures"),
        ({"aux_k": 0}, ValueError, "aux_k must be ≥ 1"),
        ({"context_size": 1}, ValueError, "context_size must be ≥ 2"),
        ({"hook_name": " "}, ValueError, "hook_name is empty"),
        ({"k": True}, TypeError, "k must be an int"),
    ],
)
def test_train_config_refuses_what_cannot_run(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        SAETrainConfig(**{"hook_name": HOOK, **kwargs})


def test_train_config_k_defaults_by_architecture():
    assert SAETrainConfig(hook_name=HOOK).k == 32
    assert SAETrainConfig(hook_name=HOOK, architecture="relu").k is None


def test_sae_config_refuses_a_bool_k():
    with pytest.raises(TypeError, match="k must be an int, got bool"):
        SAEConfig(d_in=64, d_sae=8, hook_name=HOOK, k=True)


def test_training_refuses_windows_that_are_not_token_windows(tiny, windows):
    cfg = SAETrainConfig(hook_name=HOOK, tokens=64, batch_size=32)
    with pytest.raises(TypeError, match="windows must be an integer tensor"):
        train_sae(tiny, cfg, windows=windows.float(), progress=False)


# ---------------------------------------------------------------------- evaluation and latent views
def test_evaluation_refuses_bad_sizes_and_windows(tiny, sae, windows):
    with pytest.raises(ValueError, match="batch must be ≥ 1"):
        evaluate_sae(tiny, sae, windows, batch=0)
    with pytest.raises(ValueError, match="dense_above must be a finite number"):
        evaluate_sae(tiny, sae, windows, dense_above=float("nan"))
    with pytest.raises(ValueError, match="windows is empty"):
        evaluate_sae(tiny, sae, windows[:0])


def test_feature_view_refuses_bad_sizes_and_one_dimensional_windows(tiny, sae, windows):
    with pytest.raises(ValueError, match="batch must be ≥ 1"):
        feature_view(tiny, sae, 0, windows, batch=0)
    with pytest.raises(ValueError, match="bins must be ≥ 1"):
        feature_view(tiny, sae, 0, windows, bins=0)
    with pytest.raises(ValueError, match=r"windows must be token windows \[n, pos\], got shape \(12,\)"):
        feature_view(tiny, sae, 0, windows[0])


def test_latent_lists_refuse_empty_lists_and_boolean_masks(tiny, sae):
    with pytest.raises(ValueError, match="latents is empty"):
        logit_effect(tiny, sae, [])
    with pytest.raises(ValueError, match="latents is empty"):
        top_tokens(tiny, sae, [])
    with pytest.raises(TypeError, match="latents must be a list of latent indices, got a boolean mask"):
        logit_effect(tiny, sae, torch.ones(96, dtype=torch.bool))
    with pytest.raises(TypeError, match="got booleans"):
        top_tokens(tiny, sae, [True, False])
    with pytest.raises(IndexError, match="latent -97 is out of range"):
        logit_effect(tiny, sae, [-97])


def test_activations_overflowing_float16_warn_naming_the_hook_and_dtype(windows):
    model = HookedGPT2(TINY, seed=0).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.mlp.b_out.add_(4e4)  # finite in float16; their sum on the residual stream is not
    model = model.to(torch.float16)
    buffer = ActivationBuffer(model, HOOK, windows, batch_size=16, buffer_tokens=64)
    with pytest.warns(PrecisionWarning, match=f"activations at {HOOK} in float16 hold"):
        next(iter(buffer))


# ---------------------------------------------------------------------- latent probes
def _probe_inputs():
    return torch.rand(12, 8), ["a", "b"] * 6, np.arange(12)


def test_latent_probe_refuses_overlapping_folds():
    z, labels, idx = _probe_inputs()
    with pytest.raises(ValueError, match=r"folds\[0\]: train and test share 4 prompt"):
        latent_probe(z, labels, [(idx[:8], idx[4:])])


def test_latent_probe_refuses_one_class_naming_labels():
    z, _, idx = _probe_inputs()
    with pytest.raises(ValueError, match="labels hold 1 class"):
        latent_probe(z, ["a"] * 12, [(idx[:8], idx[8:])])


@pytest.mark.parametrize(
    ("folds", "exc", "match"),
    [
        ([(np.arange(8), np.array([8, 20]))], IndexError, r"prompt 20 is out of range.*folds\[0\] test"),
        ([(np.arange(12) < 8, np.arange(12) >= 8)], TypeError, r"folds\[0\] train must be a list of prompt indices"),
        ([(np.arange(12), np.arange(0))], ValueError, r"folds\[0\] test is empty"),
        ([], ValueError, "folds is empty"),
    ],
)
def test_latent_probe_refuses_malformed_folds(folds, exc, match):
    z, labels, _ = _probe_inputs()
    with pytest.raises(exc, match=match):
        latent_probe(z, labels, folds)


def test_latent_probe_refuses_latents_of_the_wrong_shape_or_not_finite():
    z, labels, idx = _probe_inputs()
    with pytest.raises(ValueError, match=r"latents must be \[n_prompts, d_sae\]"):
        latent_probe(z[:, 0], labels, [(idx[:8], idx[8:])])
    with pytest.raises(ValueError, match="latents holds 96 NaN"):
        latent_probe(z * float("nan"), labels, [(idx[:8], idx[8:])])


# ---------------------------------------------------------------------- steering
def test_a_zero_direction_warns_where_it_is_made_and_used_and_the_curve_refuses_it(tiny):
    with pytest.warns(ZeroDirectionWarning, match=f"steering at {HOOK} with a zero direction"):
        Steer(torch.zeros(64), HOOK)
    with pytest.warns(ZeroDirectionWarning, match="the difference of means is the zero vector"):
        st.mean_difference(tiny, ["a b"], ["a b"], HOOK)
    with pytest.warns(ZeroDirectionWarning, match="decoder row 0 is the zero vector"):
        st.decoder_direction(torch.zeros(4, 64), 0)
    with pytest.raises(ValueError, match="direction is the zero vector"):
        st.steering_curve(tiny, torch.zeros(64), HOOK, [0, 1], ["a b"], [" a"], ["the cat sat"])


def test_a_boolean_position_is_refused(tiny):
    with pytest.raises(TypeError, match="position must be an int, got bool"):
        st.activations_at(tiny, ["a b"], HOOK, position=True)


# ---------------------------------------------------------------------- views
def test_a_result_dict_with_a_missing_or_malformed_field_names_it():
    from gpt2_interp.views import view

    steering = {"scales": [0, 1], "target_prob": [0.1], "loss_change": [0, 0], "kl": [0, 0], "baseline_prob": 0.1}
    with pytest.raises(ValueError, match="this steering curve result lacks the field 'target_sem'"):
        view(steering)
    feature = {"latent": 0, "contexts": "x", "promoted": [], "suppressed": [], "histogram": {}, "density": 0.1}
    with pytest.raises(ValueError, match="this feature result has a field of the wrong type"):
        view(feature)
    with pytest.raises(ValueError, match="no view for a result with fields"):
        view({"a": 1})


def test_the_view_command_answers_a_malformed_result_file_in_one_line(tmp_path, capsys):
    from gpt2_interp.cli import main

    path = tmp_path / "curve.json"
    path.write_text(
        json.dumps({"scales": [0], "target_prob": [0.1], "loss_change": [0], "kl": [0], "baseline_prob": 0})
    )
    assert main(["view", str(path), "-o", str(tmp_path / "v.html")]) == 2
    assert "lacks the field 'target_sem'" in capsys.readouterr().err
