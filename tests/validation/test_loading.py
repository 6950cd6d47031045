"""Loading trusts a file only when all of it is accounted for: every tensor it holds is used and every
tensor the config needs is there, and the refusal names the tensor and the file. Valid files load
unchanged."""

from __future__ import annotations

import pytest
import torch

import gpt2_interp as gi
from gpt2_interp.io import checkpoints as ckpt
from gpt2_interp.io.gguf import GGUFError
from gpt2_interp.model import GPT2Config, HookedGPT2
from gpt2_interp.model.config import llama_config

from ..integration.test_gguf import gguf_hf_gpt2, write_gpt2_gguf  # noqa: F401  (gguf_hf_gpt2 is the hf_gpt2 fixture here: a 2-layer transformers GPT-2)

TINY = GPT2Config(n_layer=2, d_model=32, n_head=4, d_mlp=64, n_ctx=16, d_vocab=50, name="tiny")


def test_gguf_with_fewer_blocks_in_its_metadata_than_in_the_file_is_refused(hf_gpt2, tmp_path):
    path = write_gpt2_gguf(tmp_path / "short.gguf", hf_gpt2, meta={"block_count": 1})
    with pytest.raises(GGUFError, match=r"short\.gguf.*does not use: blk\.1\..*block_count"):
        gi.load(path)


def test_gguf_missing_a_tensor_names_the_tensor_and_the_file(hf_gpt2, tmp_path):
    path = write_gpt2_gguf(tmp_path / "long.gguf", hf_gpt2, meta={"block_count": 3})
    with pytest.raises(GGUFError, match=r"long\.gguf.*lacks the tensors blk\.2\.attn_norm\.weight"):
        gi.load(path)


def test_valid_gguf_still_loads_to_transformers_logits(hf_gpt2, tmp_path):
    tokens = torch.arange(12).reshape(2, 6)
    model = gi.load(write_gpt2_gguf(tmp_path / "ok.gguf", hf_gpt2))
    with torch.no_grad():
        assert (model(tokens) - hf_gpt2(tokens).logits).abs().max() <= 1e-5


def _tl_state_dict(model: HookedGPT2) -> dict[str, torch.Tensor]:
    """The model's weights under TransformerLens' names (W_Q/W_K/W_V per head, zero b_U, masks)."""
    c, sd = model.cfg, model.state_dict()
    out = {k: v for k, v in sd.items() if ".attn.W_QKV" not in k and ".attn.b_QKV" not in k}
    for i in range(c.n_layer):
        b = f"blocks.{i}.attn."
        for x, w in zip("QKV", sd[b + "W_QKV"].split(c.d_model, dim=1)):
            out[b + f"W_{x}"] = w.reshape(c.d_model, c.n_head, c.d_head).permute(1, 0, 2)
        for x, w in zip("QKV", sd[b + "b_QKV"].split(c.d_model)):
            out[b + f"b_{x}"] = w.reshape(c.n_head, c.d_head)
        out[b + "IGNORE"] = torch.tensor(-torch.inf)
        out[b + "mask"] = torch.ones(c.n_ctx, c.n_ctx, dtype=torch.bool).tril()
    out["unembed.W_U"], out["unembed.b_U"] = sd["embed.W_E"].T, torch.zeros(c.d_vocab)
    return out


def test_transformer_lens_state_dict_round_trips():
    model = HookedGPT2(TINY, seed=1)
    back = gi.from_transformer_lens(_tl_state_dict(model), TINY)
    tokens = torch.arange(8)[None]
    assert torch.equal(back(tokens), model(tokens))


def test_transformer_lens_state_dict_with_an_extra_block_is_refused():
    big = _tl_state_dict(HookedGPT2(TINY.replace(n_layer=3), seed=1))
    with pytest.raises(ValueError, match=r"unexpected tensors \['blocks\.2\."):
        gi.from_transformer_lens(big, TINY)


def test_transformer_lens_nonzero_bias_the_config_has_no_room_for_is_refused():
    sd = _tl_state_dict(HookedGPT2(TINY, seed=1))
    sd["unembed.b_U"] = torch.ones(TINY.d_vocab)
    with pytest.raises(ValueError, match=r"unembed\.b_U"):
        gi.from_transformer_lens(sd, TINY)


def test_state_dict_file_missing_a_tensor_names_tensor_and_file(tmp_path):
    model = HookedGPT2(TINY, seed=1)
    sd = gi.model.loading.native_to_hf(model)
    sd.pop("transformer.h.1.mlp.c_fc.bias")
    path = tmp_path / "cut.safetensors"
    from safetensors.torch import save_file

    save_file(sd, str(path))
    with pytest.raises(ValueError, match=r"cut\.safetensors lacks the tensor 'h\.1\.mlp\.c_fc\.bias'"):
        gi.load(path, config=TINY)


def test_state_dict_file_with_more_layers_than_its_config_is_refused(tmp_path):
    sd = gi.model.loading.native_to_hf(HookedGPT2(TINY.replace(n_layer=3), seed=1))
    path = tmp_path / "deep.safetensors"
    from safetensors.torch import save_file

    save_file(sd, str(path))
    with pytest.raises(ValueError, match=r"deep\.safetensors.*unexpected tensors.*h\.2\."):
        gi.load(path, config=TINY)


def test_llama_hf_directory_with_an_extra_layer_is_refused(tmp_path):
    cfg = llama_config(n_layer=1, d_model=32, n_head=4, n_kv_heads=2, d_mlp=64, n_ctx=16, d_vocab=50)
    sd = gi.model.loading.native_to_hf(HookedGPT2(cfg.replace(n_layer=2), seed=0))
    ckpt.write_hf_dir(tmp_path, cfg.to_hf_dict(), sd)
    with pytest.raises(ValueError, match=rf"{tmp_path.name}.*unexpected tensors.*layers\.1\."):
        gi.load(tmp_path)


# ---------------------------------------------------------------- tokenizer files and other loaders' arguments
def _llama_dir(path, d_vocab: int = 50):
    cfg = llama_config(n_layer=1, d_model=32, n_head=4, n_kv_heads=2, d_mlp=64, n_ctx=16, d_vocab=d_vocab)
    gi.model.loading.save_hf(HookedGPT2(cfg, seed=0), path)
    return path


def _tokenizer_json(n_tokens: int) -> str:
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(n_tokens - 1)} | {"</s>": n_tokens - 1}
    return Tokenizer(models.WordLevel(vocab, unk_token="</s>")).to_str()


def test_truncated_tokenizer_json_names_the_file(tmp_path):
    path = _llama_dir(tmp_path)
    (path / "tokenizer.json").write_text(_tokenizer_json(50)[:200])
    (path / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    with pytest.raises(ValueError, match=r"tokenizer\.json is not a tokenizer file the tokenizers library can read"):
        gi.load(path)


def test_tokenizer_config_that_is_not_json_names_the_file(tmp_path):
    path = _llama_dir(tmp_path)
    (path / "tokenizer.json").write_text(_tokenizer_json(50))
    (path / "tokenizer_config.json").write_text('{"eos_token": ')
    with pytest.raises(ValueError, match=r"tokenizer_config\.json \(the tokenizer's config\) is not valid JSON"):
        gi.load(path)


def test_tokenizer_with_more_tokens_than_the_vocabulary_is_refused(tmp_path):
    path = _llama_dir(tmp_path)
    (path / "tokenizer.json").write_text(_tokenizer_json(60))
    (path / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    with pytest.raises(
        ValueError, match=r"tokenizer\.json: the tokenizer has 60 tokens but the model's vocabulary \(d_vocab\) is 50"
    ):
        gi.load(path)
    (path / "tokenizer.json").write_text(_tokenizer_json(50))
    assert gi.load(path).tokenizer.vocab_size == 50


def test_from_pretrained_with_a_name_as_hf_model_says_what_hf_model_must_be():
    with pytest.raises(TypeError, match=r"hf_model must be a transformers model object .* got str 'gpt2'"):
        HookedGPT2.from_pretrained("gpt2", hf_model="gpt2")


# ---------------------------------------------------------------- prompts at the public boundary
@pytest.mark.parametrize("call", ["forward", "generate", "run_with_cache", "logit_lens", "to_tokens"])
def test_non_string_prompts_name_the_argument_and_the_element(call):
    from gpt2_interp.analysis.lens import logit_lens

    model = HookedGPT2(GPT2Config(n_layer=1, d_model=32, n_head=4, d_mlp=64, n_ctx=16), seed=0)
    run = {
        "forward": lambda x: model(x),
        "generate": lambda x: model.generate(x, max_new_tokens=1),
        "run_with_cache": lambda x: model.run_with_cache(x),
        "logit_lens": lambda x: logit_lens(model, x),
        "to_tokens": lambda x: model.to_tokens(x),
    }[call]
    what = {"logit_lens": "prompts", "to_tokens": "text"}.get(call, "input")
    with pytest.raises(TypeError, match=rf"{what}\[1\] must be a string, got int 5"):
        run(["a cat", 5])
    with pytest.raises(TypeError, match=rf"{what} must be a string or a list of strings, got int 7"):
        run(7)
    with pytest.raises(ValueError, match=rf"no {what}: {what} is empty"):
        run([])
    run(["a cat", "a dog sat"])  # valid prompts still run
