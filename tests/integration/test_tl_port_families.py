"""TransformerLens code ports by changing the import on the later families, from the local Hugging Face cache:
a fake cache (``HF_HUB_CACHE`` pointed at a temporary folder) holds tiny random Pythia and Qwen 2.5 models saved
by transformers under their hub ids; ``HookedTransformer.from_pretrained`` finds them by TransformerLens's short
name and by the hub id (logits equal transformers'), a name not in the cache says where it looked, and a
tutorial's lines run unchanged on ours and on TransformerLens 3.9 built from the same weights with equal results.

Run: ``pytest -p no:cacheprovider -q tests/integration/test_tl_port_families.py``."""

from __future__ import annotations

import warnings

import pytest
import torch

import gpt2_interp as gi
from tests.families_cases import hf_model

transformers = pytest.importorskip("transformers")

# our CASES family → the hub id its snapshot is saved under
SAVED = {"gpt_neox": "EleutherAI/pythia-70m", "qwen2": "Qwen/Qwen2.5-0.5B"}
TEXT = "The cat sat on the mat"


def _byte_tokenizer():
    """A byte-level BPE tokenizer of 256 tokens (no merges; id 0 is BOS, EOS and padding), as transformers saves it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    chars = {b: chr(c) for b, c in zip(bs, cs)}
    tk = Tokenizer(models.BPE({chars[b]: b for b in range(256)}, []))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    special = chars[0]
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=special, eos_token=special, pad_token=special)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The fake HF cache folder and, per family, the transformers model saved in it."""
    root = tmp_path_factory.mktemp("hub")
    models = {}
    for family, repo in SAVED.items():
        hf = hf_model(family)
        snapshot = root / f"models--{repo.replace('/', '--')}" / "snapshots" / "abc"
        hf.save_pretrained(snapshot)
        _byte_tokenizer().save_pretrained(snapshot)
        models[family] = hf
    return root, models


@pytest.fixture
def cache_env(hub, monkeypatch):
    root, models = hub
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HOME", str(root / "no-home"))
    return models


@torch.no_grad()
@pytest.mark.parametrize(
    ("family", "names"),
    [("gpt_neox", ["pythia-70m", "EleutherAI/pythia-70m", "eleutherai/Pythia-70M"]), ("qwen2", ["qwen2.5-0.5b"])],
)
def test_from_pretrained_finds_the_hub_id_and_tl_name_in_the_hf_cache(cache_env, family, names):
    from gpt2_interp import HookedTransformer

    tokens = torch.randint(1, 256, (2, 9), generator=torch.Generator().manual_seed(0))
    want = cache_env[family](tokens).logits
    for name in names:
        model = HookedTransformer.from_pretrained_no_processing(name)
        assert (model(tokens) - want).abs().max().item() < 1e-4, name
    assert (gi.load(SAVED[family])(tokens) - want).abs().max().item() < 1e-4


def test_a_family_name_missing_from_the_cache_says_where_it_looked_and_how(cache_env, hub):
    root, _ = hub
    with pytest.raises(FileNotFoundError) as err:
        gi.load("google/gemma-2-2b")
    message = str(err.value)
    assert "\n" not in message
    assert "models--google--gemma-2-2b/snapshots" in message and str(root) in message
    assert "huggingface-cli download google/gemma-2-2b" in message


def tutorial(HookedTransformer, name):
    """A TransformerLens tutorial's first lines, verbatim but for the model name."""
    model = HookedTransformer.from_pretrained_no_processing(name)
    tokens = model.to_tokens(TEXT)
    logits, cache = model.run_with_cache(tokens)
    resid = cache["blocks.0.hook_resid_post"]
    pattern = cache["pattern", 1]
    generated = model.generate(TEXT, max_new_tokens=6, do_sample=False, verbose=False)
    return tokens, logits, resid, pattern, generated


@torch.no_grad()
@pytest.mark.parametrize("family", sorted(SAVED))
def test_a_tutorial_runs_unchanged_on_ours_and_on_transformer_lens(cache_env, family, tmp_path):
    """TL cannot load from the fake cache offline, so its ``from_pretrained_no_processing`` is given TL's own
    model built from the same transformers model (tests/integration/test_family_tl_cache.py); ours reads the cache."""
    from gpt2_interp import HookedTransformer as Ours
    from tests.integration.test_family_tl_cache import _tl_model

    hf = cache_env[family]
    tl = _tl_model(family, hf, tmp_path)
    snapshot = gi.model.loading.resolve_family_name(SAVED[family])
    tl.set_tokenizer(transformers.AutoTokenizer.from_pretrained(snapshot), default_padding_side="right")

    class TL:  # TransformerLens's class, its loader answered by the model built above
        @staticmethod
        def from_pretrained_no_processing(name):
            return tl

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        theirs = tutorial(TL, SAVED[family])
    ours = tutorial(Ours, SAVED[family])
    for what, a, b in zip(("tokens", "logits", "resid", "pattern", "generated"), ours, theirs):
        if isinstance(a, str) or a.dtype == torch.long:
            assert a == b if isinstance(a, str) else a.tolist() == b.tolist(), (family, what)
        else:
            assert (a - b).abs().max().item() < 1e-4, (family, what)
