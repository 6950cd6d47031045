"""Loading GPT-2 checkpoints in every common form, and the errors when something is off."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

import gpt2_interp as gi
from gpt2_interp.io import checkpoints
from tests.conftest import TINY


@pytest.fixture
def tiny_hf(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    path = tmp_path / "hf"
    model.save_pretrained(path)
    return model, path


TOKENS = torch.randint(0, 50257, (2, 9), generator=torch.Generator().manual_seed(0))


def close(a, b):
    return (a - b).abs().max().item() <= 1e-4


@pytest.mark.slow
def test_hf_directory_safetensors_and_bin(tiny_hf, tmp_path):
    hf, path = tiny_hf
    ref = hf(TOKENS).logits
    assert close(gi.load(path)(TOKENS), ref)
    # pytorch_model.bin (old checkpoints, keys without "transformer.", with attn.bias buffers)
    sd = {k.removeprefix("transformer."): v for k, v in hf.state_dict().items()}
    sd["h.0.attn.bias"] = torch.tril(torch.ones(1, 1, 64, 64))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    torch.save(sd, bin_dir / "pytorch_model.bin")
    shutil.copy(path / "config.json", bin_dir / "config.json")
    assert close(gi.load(bin_dir)(TOKENS), ref)


def test_bare_safetensors_with_sibling_or_explicit_config(tiny_hf, tmp_path):
    hf, path = tiny_hf
    ref = hf(TOKENS).logits
    assert close(gi.load(path / "model.safetensors")(TOKENS), ref)
    lone = tmp_path / "lone.safetensors"
    shutil.copy(path / "model.safetensors", lone)
    assert close(gi.load(lone, config=TINY.replace(name="x"))(TOKENS), ref)


def test_hf_cache_lookup(tiny_hf, tmp_path, monkeypatch):
    _, path = tiny_hf
    snap = tmp_path / "hub" / "models--openai-community--gpt2" / "snapshots" / "abc123"
    shutil.copytree(path, snap)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    model = gi.load("gpt2")  # the "gpt2" name resolves to the cached snapshot (here a tiny stand-in)
    assert model.cfg.n_layer == 2 and model.cfg.name == "gpt2"


def test_missing_name_explains_offline_route(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match=r"config\.json and model\.safetensors"):
        gi.load("gpt2-medium")


def test_native_and_tl_state_dicts(tiny):
    sd = tiny.state_dict()
    assert checkpoints.detect_format(sd) == "native"
    assert close(gi.from_state_dict(sd, tiny.cfg)(TOKENS), tiny(TOKENS))


def test_errors_name_the_fix(tiny_hf, tmp_path):
    _, path = tiny_hf
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        gi.load(empty)
    shutil.copy(path / "config.json", empty / "config.json")
    with pytest.raises(FileNotFoundError, match="no weights"):
        gi.load(empty)
    with pytest.raises(FileNotFoundError, match="neither a file"):
        gi.load("no-such-model")
    # a checkpoint whose shapes do not match its config
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["n_inner"] = 128
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"mlp.W_in has shape \(64, 256\) but the config.*needs \(64, 128\)"):
        gi.load(bad)
    cfg["activation_function"] = "relu"
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="not plain GPT-2"):
        gi.load(bad)


def test_dtype_and_device_on_load(tiny_hf):
    _, path = tiny_hf
    m = gi.load(path, dtype="bf16")
    assert m.dtype == torch.bfloat16 and not any(p.requires_grad for p in m.parameters())


def test_save_writes_hf_names(tiny, tmp_path):
    tiny.save(tmp_path / "out")
    keys = set(load_file(str(tmp_path / "out" / "model.safetensors")))
    assert "transformer.h.1.mlp.c_proj.weight" in keys and "lm_head.weight" not in keys
    assert close(gi.load(tmp_path / "out")(TOKENS), tiny(TOKENS))
