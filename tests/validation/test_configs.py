"""A config is checked for meaning when it is built, whichever way it arrives (the constructor, a
config.json, GGUF metadata): values no model can have are refused naming the field (and the key and
file they came from); valid configs are unchanged."""

from __future__ import annotations

import json
import math

import pytest
import torch

import gpt2_interp as gi
from gpt2_interp.io.gguf import GGUFError
from gpt2_interp.model import GPT2Config, HookedGPT2
from gpt2_interp.model.config import llama_config

from ..integration.test_gguf import gguf_hf_gpt2, write_gpt2_gguf  # noqa: F401  (gguf_hf_gpt2 is the hf_gpt2 fixture here: a 2-layer transformers GPT-2)

LLAMA = dict(n_layer=1, d_model=32, n_head=4, n_kv_heads=2, d_mlp=64, n_ctx=16, d_vocab=50)


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("rope_theta", 0, r"rope_theta must be a finite number > 0, got 0"),
        ("rope_theta", -10000.0, r"rope_theta must be a finite number > 0"),
        ("rope_theta", math.inf, r"rope_theta must be a finite number > 0, got inf"),
        ("rope_theta", math.nan, r"rope_theta must be a finite number > 0, got nan"),
        ("rope_theta", "1e4", r"rope_theta must be a number, got str"),
        ("layer_norm_eps", 0.0, r"layer_norm_eps must be a finite number > 0"),
        ("layer_norm_eps", -1e-5, r"layer_norm_eps must be a finite number > 0"),
        ("n_head", 0, r"n_head must be ≥ 1, got 0"),
        ("n_head", 5, r"n_head=5 must divide d_model=32"),
        ("n_kv_heads", 3, r"n_kv_heads=3 must be positive and divide n_head=4"),
        ("n_kv_heads", 0, r"n_kv_heads must be ≥ 1, got 0"),
        ("d_mlp", -1, r"d_mlp must be ≥ 1, got -1"),
        ("n_layer", 1.5, r"n_layer must be an int, got float"),
        ("d_vocab", True, r"d_vocab must be an int, got bool"),
        ("bias", "no", r"bias must be True or False"),
    ],
)
def test_constructor_refuses_values_no_model_can_have(field, value, match):
    with pytest.raises((ValueError, TypeError), match=match):
        llama_config(**{**LLAMA, field: value})


def test_valid_configs_are_unchanged():
    cfg = llama_config(**LLAMA, rope_theta=500000)
    assert cfg.rope_theta == 500000.0 and isinstance(cfg.rope_theta, float) and cfg.n_kv == 2
    assert GPT2Config() == GPT2Config(n_layer=12, d_model=768, n_head=12, d_mlp=3072, layer_norm_eps=1e-5)
    model = HookedGPT2(llama_config(**LLAMA), seed=0)
    assert torch.isfinite(model(torch.arange(5)[None])).all()


def _write_llama_dir(path, **changes):
    cfg = llama_config(**LLAMA)
    hf = {**cfg.to_hf_dict(), **changes}
    gi.model.loading.save_hf(HookedGPT2(cfg, seed=0), path)
    (path / "config.json").write_text(json.dumps(hf))
    return path


@pytest.mark.parametrize(
    "key,value,match",
    [
        ("rope_theta", 0, r"rope_theta must be a finite number > 0, got 0.*config.json key 'rope_theta'"),
        ("rms_norm_eps", -1.0, r"layer_norm_eps must be a finite number > 0.*config.json key 'rms_norm_eps'"),
        ("num_attention_heads", 0, r"n_head must be ≥ 1, got 0.*config.json key 'num_attention_heads'"),
        ("num_key_value_heads", 3, r"n_kv_heads=3 must be positive and divide n_head=4.*'num_key_value_heads'"),
    ],
)
def test_config_json_values_are_checked_naming_the_key_and_file(tmp_path, key, value, match):
    path = _write_llama_dir(tmp_path, **{key: value, "rope_parameters": {"rope_type": "default"}})
    with pytest.raises(ValueError, match=rf"config\.json: {match}"):
        gi.load(path)


def test_config_json_valid_llama_directory_loads(tmp_path):
    model = gi.load(_write_llama_dir(tmp_path))
    assert model.cfg.rope_theta == 10000.0 and model.cfg.n_kv == 2


@pytest.mark.parametrize(
    "meta,match",
    [
        ({"attention.head_count": 0}, r"n_head must be ≥ 1, got 0"),
        ({"attention.head_count": 3}, r"n_head=3 must divide d_model=64.*gpt2\.attention\.head_count"),
        (
            {"attention.layer_norm_epsilon": 0.0},
            r"layer_norm_eps must be a finite number > 0.*gpt2\.attention\.layer_norm_epsilon",
        ),
        ({"block_count": 0}, r"n_layer must be ≥ 1, got 0.*gpt2\.block_count"),
    ],
)
def test_gguf_metadata_values_are_checked_naming_the_key_and_file(hf_gpt2, tmp_path, meta, match):
    path = write_gpt2_gguf(tmp_path / "bad.gguf", hf_gpt2, meta=meta)
    with pytest.raises(GGUFError, match=rf"bad\.gguf: {match}"):
        gi.load(path)
