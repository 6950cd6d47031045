"""``run_with_cache`` against TransformerLens 3.9 on the families it has: the same tiny random transformers
model built as TL's ``HookedTransformer`` (no folding or centring, as ``from_pretrained_no_processing``)
and as ours gives the same cache keys and the same values on every key (within 1e-4), and the same logits.

TL is built offline: a family TL configures from the Hugging Face config is given a local directory holding
the tiny model's ``config.json`` (TL reads local paths); Gemma 2/3 and OLMo 2, which TL configures by their
hub name, take TL's config of ``google/gemma-2-2b``, ``google/gemma-3-1b-pt`` or ``allenai/OLMo-2-0425-1B``
(the config fetch replaced by the tiny config) with the shape fields set to the tiny model's. TL's own weight
converter reads the transformers model (``get_pretrained_state_dict(..., hf_model=)``).

Left out: Llama with linear rope scaling and Qwen 2 with YaRN (TL 3.9 ignores those ``rope_parameters``,
so its logits differ from transformers'). OLMo 2 is built without grouped-query attention (TL's OLMo 2
converter has none; the released OLMo 2 models have none). The documented naming differences (docs/porting.md,
"Hook names per family") are checked as such: OLMo 2's output norms are ``ln1_post``/``ln2_post`` here,
``ln1``/``ln2`` in TL; GPT-J's one norm is ``ln1`` (TL runs it a second time as ``ln2``); the q/k norms'
hooks keep ``[batch, pos, head, d_head]`` where TL flattens them to ``[batch·pos·head, d_head]``.

Run: ``pytest -p no:cacheprovider -q tests/integration/test_family_tl_cache.py``."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from unittest import mock

import pytest
import torch

import gpt2_interp as gi
from tests.families_cases import CASES, PROMPTS, hf_model

lp = pytest.importorskip("transformer_lens.loading_from_pretrained")
from transformer_lens import HookedTransformer, HookedTransformerConfig  # noqa: E402

# the families TL configures by hub name, not from the HF config
BY_NAME = {"gemma2": "google/gemma-2-2b", "gemma3": "google/gemma-3-1b-pt", "olmo2": "allenai/OLMo-2-0425-1B"}
FAMILIES = sorted(set(CASES) - {"llama-linear-rope", "qwen2-yarn"})
# our hook name part → TL's, per family (docs/porting.md)
RENAMED = {"olmo2": {".ln1_post.": ".ln1.", ".ln2_post.": ".ln2."}}
# TL's hooks of a module we do not have: GPT-J's MLP norm is ln1, run once
TL_ONLY = {"gptj": (".ln2.hook_normalized", ".ln2.hook_scale")}


def _tiny_hf(family: str):
    if family != "olmo2":
        return hf_model(family)
    config_class, model_class, kw = CASES[family]
    with mock.patch.dict(CASES, {family: (config_class, model_class, dict(kw, num_key_value_heads=4))}):
        return hf_model(family)


def _tl_config_by_name(family: str, hf) -> HookedTransformerConfig:
    """TL's config of the family's released model, with the tiny model's shape."""
    c = hf.config
    with mock.patch.object(lp.AutoConfig, "from_pretrained", lambda *a, **k: c):
        d = lp.convert_hf_model_config(BY_NAME[family])
    d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    d.update(
        d_model=c.hidden_size,
        d_head=d_head,
        n_heads=c.num_attention_heads,
        d_mlp=c.intermediate_size,
        n_layers=c.num_hidden_layers,
        d_vocab=c.vocab_size,
        eps=c.rms_norm_eps,
        n_ctx=c.max_position_embeddings,
        rotary_dim=d_head,
        device="cpu",
        attn_scale=math.sqrt(getattr(c, "query_pre_attn_scalar", None) or d_head),
        n_key_value_heads=c.num_key_value_heads if c.num_key_value_heads != c.num_attention_heads else None,
    )
    types = getattr(c, "layer_types", None) or ["full_attention"] * c.num_hidden_layers
    d["attn_types"] = ["local" if t == "sliding_attention" else "global" for t in types]
    rope = c.rope_parameters
    if family == "gemma3":
        d.update(
            window_size=c.sliding_window,
            rotary_base=rope["full_attention"]["rope_theta"],
            rotary_base_local=rope["sliding_attention"]["rope_theta"],
            rotary_scaling_factor=rope["full_attention"]["factor"],
        )
    else:
        d["rotary_base"] = rope["rope_theta"]
    if family == "gemma2":
        d.update(
            window_size=c.sliding_window,
            attn_scores_soft_cap=c.attn_logit_softcapping,
            output_logits_soft_cap=c.final_logit_softcapping,
        )
    return HookedTransformerConfig(**d)


def _tl_model(family: str, hf, tmp: Path) -> HookedTransformer:
    hf.config.architectures = [type(hf).__name__]
    if family in BY_NAME:
        name, cfg = BY_NAME[family], _tl_config_by_name(family, hf)
    else:
        name = str(tmp / "tiny")  # a local directory TL reads the config.json of (no family name in the path)
        hf.config.save_pretrained(name)
        cfg = lp.get_pretrained_model_config(name, device="cpu")
    sd = lp.get_pretrained_state_dict(name, cfg, hf_model=hf)
    cfg.tokenizer_name = None  # no tokenizer offline; the test feeds tokens
    tl = HookedTransformer(cfg)
    tl.load_and_process_state_dict(
        sd, fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False
    )
    return tl.eval()


@pytest.fixture(scope="module", params=FAMILIES)
def trio(request, tmp_path_factory):
    logging.disable(logging.WARNING)  # TL logs its config choices
    try:
        hf = _tiny_hf(request.param)
        tl = _tl_model(request.param, hf, tmp_path_factory.mktemp("tl"))
    finally:
        logging.disable(logging.NOTSET)
    return request.param, hf, tl, gi.from_transformers(hf).eval()


def _tl_name(family: str, ours: str) -> str:
    for a, b in RENAMED.get(family, {}).items():
        ours = ours.replace(a, b)
    return ours


@torch.no_grad()
def test_run_with_cache_keys_values_and_logits_equal_transformer_lens(trio):
    family, hf, tl, ours = trio
    tokens = PROMPTS[0][None]
    tl_logits, tl_cache = tl.run_with_cache(tokens)
    our_logits, our_cache = ours.run_with_cache(tokens)
    reference = hf(tokens).logits
    assert (tl_logits - reference).abs().max().item() < 1e-4, f"{family}: TL's model is not transformers'"
    assert (our_logits - tl_logits).abs().max().item() < 1e-4, family

    mine = {_tl_name(family, k): v for k, v in our_cache.items()}
    theirs = {k: v for k, v in tl_cache.items() if not k.endswith(TL_ONLY.get(family, ()))}
    assert set(mine) == set(theirs), (family, sorted(set(mine) ^ set(theirs)))
    assert len(theirs) < len(tl_cache) if family in TL_ONLY else len(theirs) == len(tl_cache)
    for name, want in theirs.items():
        got = mine[name]
        if ".q_norm." in name or ".k_norm." in name:  # TL: [batch·pos·head, d_head]
            got = got.reshape(want.shape)
        assert got.shape == want.shape, (family, name, tuple(got.shape), tuple(want.shape))
        masked = torch.isneginf(want)  # the attention scores TL and we mask with -inf
        assert torch.equal(torch.isneginf(got), masked), (family, name)
        delta = (got[~masked] - want[~masked]).abs().max().item()
        assert delta < 1e-4, f"{family} {name}: max |Δ| {delta:.2e}"


@torch.no_grad()
def test_names_filter_keeps_only_the_named_hooks_like_transformer_lens(trio):
    family, _hf, tl, ours = trio
    tokens = PROMPTS[1][None]
    _, tl_cache = tl.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_resid_post"))
    _, our_cache = ours.run_with_cache(tokens, names_filter="blocks.1.hook_resid_post")
    assert set(our_cache.keys()) == {"blocks.1.hook_resid_post"}
    assert sorted(tl_cache.keys()) == [f"blocks.{i}.hook_resid_post" for i in range(ours.cfg.n_layer)], family
    assert (our_cache["blocks.1.hook_resid_post"] - tl_cache["blocks.1.hook_resid_post"]).abs().max().item() < 1e-4
