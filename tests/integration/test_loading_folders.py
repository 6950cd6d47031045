"""Local transformers folders, single-file and sharded (``save_pretrained(..., max_shard_size=...)``):
fp32 logits equal to transformers' on the same prompts for several families, a bf16 folder loaded in
bf16 holding bit for bit transformers' own bf16 parameters, and one-line errors naming the file for a
damaged index, an index naming a missing shard and a shard lacking a tensor the index names.

Run: ``pytest -p no:cacheprovider -q tests/integration/test_loading_folders.py``."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import gpt2_interp as gi
from tests.families_cases import PROMPTS, VOCAB, hf_model

transformers = pytest.importorskip("transformers")

INDEX = "model.safetensors.index.json"
FAMILIES = ["llama3-rope", "qwen2", "phi3", "gpt_neox", "gptj", "gemma2", "olmo2"]


def _gpt2_model():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=128)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _model(family: str):
    return _gpt2_model() if family == "gpt2" else hf_model(family)


def _save_sharded(hf, folder, dtype=torch.float32):
    """``hf`` saved by transformers in ``dtype`` with shards small enough that there are at least three."""
    hf.to(dtype).save_pretrained(folder, max_shard_size="40KB")
    shards = set(json.loads((folder / INDEX).read_text())["weight_map"].values())
    assert len(shards) >= 3 and all((folder / s).is_file() for s in shards)
    return shards


@pytest.mark.parametrize("family", ["gpt2", *FAMILIES])
@torch.no_grad()
def test_sharded_folder_logits_match_transformers(family, tmp_path):
    hf = _model(family)
    _save_sharded(hf, tmp_path)
    ours = gi.load(tmp_path)
    assert ours.dtype == torch.float32 and not (tmp_path / "model.safetensors").exists()
    for p in PROMPTS:
        delta = (ours(p[None]) - hf(p[None]).logits).abs().max().item()
        assert delta <= 1e-5, f"{family}: max |Δlogit| {delta:.2e}"
    assert all(p.is_contiguous() for p in ours.parameters())


@pytest.mark.parametrize("family", ["gpt2", "qwen2", "phi3", "gpt_neox"])
@torch.no_grad()
def test_bf16_folder_loads_in_bf16_bit_for_bit(family, tmp_path):
    hf = _model(family).to(torch.bfloat16)
    _save_sharded(hf, tmp_path, torch.bfloat16)
    ours = gi.load(tmp_path, dtype="bf16")
    assert {p.dtype for p in ours.parameters()} == {torch.bfloat16}
    theirs, back = hf.state_dict(), gi.to_transformers(ours).state_dict()
    assert sorted(theirs) == sorted(back)
    for k in theirs:
        assert back[k].dtype == torch.bfloat16 and torch.equal(back[k], theirs[k]), k
    # the float32 default holds the same values, widened
    wide = gi.load(tmp_path)
    for (k, a), b in zip(wide.state_dict().items(), ours.state_dict().values()):
        assert a.dtype == torch.float32 and torch.equal(a, b.float()), k


@torch.no_grad()
def test_single_file_folder_still_loads(tmp_path):
    hf = _model("qwen2")
    hf.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and not (tmp_path / INDEX).exists()
    ours = gi.load(tmp_path, dtype=torch.float16)
    assert ours.dtype == torch.float16
    tokens = PROMPTS[0][None]
    assert (ours(tokens).float() - hf(tokens).logits).abs().max().item() < 0.05


def _shard_of(folder, tensor):
    return json.loads((folder / INDEX).read_text())["weight_map"][tensor]


def test_damaged_index_is_named(tmp_path):
    _save_sharded(_model("qwen2"), tmp_path)
    (tmp_path / INDEX).write_text('{"weight_map": {"model.norm.weight": ')
    with pytest.raises(ValueError, match=rf"{INDEX} is not valid JSON"):
        gi.load(tmp_path)


def test_index_naming_a_missing_shard_is_named(tmp_path):
    _save_sharded(_model("qwen2"), tmp_path)
    shard = _shard_of(tmp_path, "model.norm.weight")
    (tmp_path / shard).unlink()
    with pytest.raises(FileNotFoundError, match=rf"{INDEX} names the shard {shard}, which is not in"):
        gi.load(tmp_path)


def test_shard_lacking_a_tensor_is_named(tmp_path):
    _save_sharded(_model("qwen2"), tmp_path)
    name = "model.layers.1.mlp.up_proj.weight"
    shard = tmp_path / _shard_of(tmp_path, name)
    tensors = load_file(str(shard))
    tensors.pop(name)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"{shard.name} lacks the tensor {name} that {INDEX} puts in it"):
        gi.load(tmp_path)


def test_non_finite_weight_in_a_shard_is_named(tmp_path):
    _save_sharded(_model("qwen2"), tmp_path)
    name = "model.layers.0.mlp.down_proj.weight"
    shard = tmp_path / _shard_of(tmp_path, name)
    tensors = load_file(str(shard))
    tensors[name][3, 5] = float("nan")
    save_file(tensors, str(shard), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"{shard.name}: tensor '{name}' holds non-finite values \(1 NaN"):
        gi.load(tmp_path)
