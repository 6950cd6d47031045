"""Shared fixtures: a randomly initialised full-size GPT-2 in transformers, and ours loaded from it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

import gpt2_interp as gi
from gpt2_interp.model import GPT2Config, HookedGPT2

torch.set_num_threads(2)

TINY = GPT2Config(n_layer=2, d_model=64, n_head=4, d_mlp=256, n_ctx=64, name="tiny")
ROOT = Path(__file__).resolve().parents[1]


def script(name: str, folder: str = "analyses") -> ModuleType:
    """``{folder}/{name}.py`` of the repository, imported as a module (its ``main(argv)`` is what tests run);
    the folder is on ``sys.path`` while it loads, since the analyses import each other as siblings."""
    sys.path.insert(0, str(ROOT / folder))
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / folder / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.pop(0)
    return mod


@pytest.fixture(scope="session")
def hf_gpt2():
    """transformers' GPT2LMHeadModel with the real gpt2 config and random weights (built offline)."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config()  # n_layer 12, n_embd 768, vocab 50257: the gpt2 shape
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # HF initialises LayerNorms to (1, 0) and biases to 0: make them non-trivial
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(torch.randn_like(p) * 0.05)
    return model


@pytest.fixture(scope="session")
def tl_from_hf():
    """A function building TransformerLens 3.9's HookedTransformer (the independent reference) with
    the weights of a transformers GPT2LMHeadModel, unfolded and uncentred, so hooks compare 1:1."""
    tl = pytest.importorskip("transformer_lens")
    from transformer_lens.loading_from_pretrained import convert_gpt2_weights

    def build(hf_model):
        c = hf_model.config
        cfg = tl.HookedTransformerConfig(
            n_layers=c.n_layer,
            d_model=c.n_embd,
            n_heads=c.n_head,
            d_head=c.n_embd // c.n_head,
            d_mlp=c.n_inner or 4 * c.n_embd,
            n_ctx=c.n_positions,
            d_vocab=c.vocab_size,
            act_fn="gelu_new",
            normalization_type="LN",
            positional_embedding_type="standard",
        )
        ref = tl.HookedTransformer(cfg)
        ref.load_state_dict(convert_gpt2_weights(hf_model, cfg), strict=False)
        return ref.eval()

    return build


@pytest.fixture(scope="session")
def gpt2_dir(hf_gpt2, tmp_path_factory):
    """The random gpt2 saved by transformers as an HF directory (safetensors)."""
    path = tmp_path_factory.mktemp("hf_gpt2")
    hf_gpt2.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def gpt2(gpt2_dir):
    """Our model, loaded from the directory transformers wrote."""
    return gi.load(gpt2_dir)


@pytest.fixture
def tiny():
    return HookedGPT2(TINY, seed=0).eval()


@pytest.fixture(scope="session")
def facts_model():
    """The shipped embedded fact model."""
    return gi.load("gpt2-facts")


@pytest.fixture(autouse=True)
def _grad_mode_is_restored():
    """No library call may leave autograd switched off behind it (it breaks every later edit)."""
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled(), "autograd was off before the test"
    yield
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled(), "the test left autograd switched off"
