"""GGUF files of the model families, written the way llama.cpp's converter (``convert_hf_to_gguf.py``) writes
them: tensor names from the ``gguf`` package's own HF → GGUF name map, the converter's metadata keys (through
``gguf.GGUFWriter``'s ``add_*`` methods) and its per-architecture changes (the ``llama`` architecture's Q/K row
permutation, Llama 3's ``rope_freqs`` factors, Gemma's RMSNorm gains + 1, GPT-NeoX's Q|K|V regrouping).

Each tiny random model of ``tests.families_cases.CASES`` round-trips to the transformers model's logits; where
transformers' own GGUF loader reads the architecture, its model of the same file gives the same logits too (an
independent reader of the layout). Metadata the config cannot represent is refused before the weights are read.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

import gpt2_interp as gi
from gpt2_interp.io import gguf as gg
from gpt2_interp.io.gguf import GGUFError
from gpt2_interp.model.loading import model_config
from tests.families_cases import CASES, PROMPTS, VOCAB

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

# family case → (GGUF architecture, what the case changes so that a GGUF file can hold it)
# llama.cpp stores no query_pre_attn_scalar (it scales by 1/sqrt(head_dim)), no local rope base for Gemma 3 (10000)
# and puts a global layer every 6th layer of Gemma 3 and every 2nd of Gemma 2: the cases use those values.
GGUF_CASES = {
    "llama3-rope": ("llama", {}),
    "llama-linear-rope": ("llama", {}),
    "mistral": ("llama", {}),  # its window written as the gguf package's llama.attention.sliding_window
    "qwen2": ("qwen2", {}),
    "qwen2-yarn": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "olmo2": ("olmo2", {}),
    "phi3": ("phi3", {}),
    "gemma2": ("gemma2", {"query_pre_attn_scalar": 24}),
    "gemma3": (
        "gemma3",
        {
            "query_pre_attn_scalar": 24,
            "num_hidden_layers": 6,
            "sliding_window_pattern": 6,
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "rope_theta": 100000.0, "factor": 2.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        },
    ),
    "gpt_neox": ("gptneox", {}),
    "gpt_neox-sequential": ("gptneox", {}),
}
ARCH = {name: arch for arch, name in gguf.MODEL_ARCH_NAMES.items()}
# the architectures transformers' GGUF loader reads
TRANSFORMERS_READS = ("llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3")


def hf_model(case: str):
    config_class, model_class, kw = CASES[case]
    torch.manual_seed(0)
    cfg = getattr(transformers, config_class)(**{**kw, **GGUF_CASES[case][1]})
    cfg._attn_implementation = "eager"
    model = getattr(transformers, model_class)(cfg).eval()
    with torch.no_grad():  # non-trivial norm gains and biases, as test_families does
        for p in model.parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.ndim == 1 else 0.05))
    return model


def _rope(c) -> dict:
    rp = dict(c.rope_parameters or {})
    return rp.get("full_attention", rp)


def _llama3_factors(c, dim: int) -> torch.Tensor:
    """convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors: one divisor per rotary frequency."""
    rp = _rope(c)
    freqs = 1.0 / (rp["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, low, high = rp["factor"], rp.get("low_freq_factor", 1.0), rp.get("high_freq_factor", 4.0)
    old = rp.get("original_max_position_embeddings", 8192)
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32)


def _permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """convert_hf_to_gguf.py's LlamaModel.permute (Q/K rows from half-split to interleaved rotary pairs)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _metadata(w, arch: str, c) -> None:
    """The metadata convert_hf_to_gguf.py writes for ``arch`` (the keys it sets from config.json)."""
    neox = arch == "gptneox"
    d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    if neox:
        rp = _rope(c)
        w.add_rope_dimension_count(int(rp.get("partial_rotary_factor", getattr(c, "rotary_pct", 1.0)) * d_head))
        w.add_parallel_residual(c.use_parallel_residual)
        w.add_layer_norm_eps(c.layer_norm_eps)
        return
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(_rope(c)["rope_theta"])
    if "head_dim" in c.to_dict() and c.head_dim is not None:
        w.add_key_length(c.head_dim)
        w.add_value_length(c.head_dim)
    if arch in ("llama", "phi3"):
        w.add_rope_dimension_count(d_head)
    rp = _rope(c)
    if rp.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rp["factor"])
    elif rp.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rp["factor"])
        w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
    if arch == "gemma2":
        w.add_attn_logit_softcapping(c.attn_logit_softcapping)
        w.add_final_logit_softcapping(c.final_logit_softcapping)
    if arch in ("gemma2", "gemma3", "phi3") or (arch == "llama" and getattr(c, "sliding_window", None)):
        w.add_sliding_window(c.sliding_window)


def _tokenizer(w) -> None:
    """A byte-level BPE vocabulary of the 256 byte characters (no merges), end-of-text the last."""
    w.add_tokenizer_model("gpt2")
    w.add_token_list([gg.bytes_to_unicode()[b] for b in range(VOCAB)])
    w.add_token_types([1] * VOCAB)
    w.add_eos_token_id(VOCAB - 1)


def write_gguf(
    path: Path, hf, arch: str, extra: dict | None = None, drop: tuple[str, ...] = (), label: str | None = None
) -> Path:
    """``hf`` as llama.cpp's converter writes it (F32 tensors); ``extra`` adds metadata (key → value) and
    tensors (name → array), ``drop`` leaves out tensors, ``label`` replaces general.architecture."""
    c = hf.config
    names = gguf.get_tensor_name_map(ARCH[arch], c.num_hidden_layers)
    w = gguf.GGUFWriter(str(path), label or arch)
    _metadata(w, arch, c)
    _tokenizer(w)
    tensors = {}
    sd = hf.state_dict()
    if c.tie_word_embeddings:
        sd.pop("lm_head.weight")
    d_head = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    if arch == "llama" and _rope(c).get("rope_type") == "llama3":
        tensors["rope_freqs.weight"] = _llama3_factors(c, d_head)
    for name, t in sd.items():
        if name.endswith("rotary_emb.inv_freq"):
            continue
        t = t.detach().clone()
        if arch == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            t = _permute(t, c.num_attention_heads if "q_proj" in name else c.num_key_value_heads)
        if arch in ("gemma2", "gemma3") and name.endswith("norm.weight"):
            t = t + 1
        if arch == "gptneox" and "query_key_value" in name:  # per head [q k v] → [q; k; v]
            t = t.reshape(c.num_attention_heads, 3, -1, *t.shape[1:]).swapaxes(0, 1).reshape(t.shape)
        new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new is not None, name
        tensors[new] = t
    for key, v in (extra or {}).items():
        if isinstance(v, np.ndarray):
            tensors[key] = torch.from_numpy(v)
        elif isinstance(v, str):
            w.add_string(key, v)
        else:
            (w.add_float32 if isinstance(v, float) else w.add_uint32)(key, v)
    for name, t in tensors.items():
        if name not in drop:
            w.add_tensor(name, t.to(torch.float32).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("case", sorted(GGUF_CASES))
@torch.no_grad()
def test_gguf_of_each_family_gives_the_transformers_logits(case, tmp_path):
    arch = GGUF_CASES[case][0]
    hf = hf_model(case)
    path = write_gguf(tmp_path / f"{case}.gguf", hf, arch)
    ours = gi.load(path)
    tokens = PROMPTS[0][None]  # 13 tokens: longer than every sliding window
    want = hf(tokens).logits
    assert (ours(tokens) - want).abs().max().item() <= 1e-5, case
    assert ours.cfg.family == hf.config.model_type
    if case == "mistral":  # transformers reads a llama file as Llama: the same model within the window (5)
        theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name).eval()
        assert (theirs(tokens[:, :5]).logits - want[:, :5]).abs().max().item() <= 1e-5
    elif arch in TRANSFORMERS_READS:  # transformers' GGUF reader (its tensor map, un-permutation, norm offset) with
        # the model's config (its GGUF config reader skips soft-caps, windows and rope scaling)
        theirs = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, config=hf.config)
        assert (theirs.eval()(tokens).logits - want).abs().max().item() <= 1e-5, case


def test_llama3_rope_parameters_are_rebuilt_from_the_frequency_factors(tmp_path):
    """llama.cpp keeps Llama 3's scaling only as rope_freqs.weight. With Llama 3.2's shape (d_head 64, base 5e5,
    factor 32) several frequencies fall in the blend, which pins the parameters: 8192 / 1 / 4 come back."""
    rp = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
    }
    rp["original_max_position_embeddings"] = 8192
    kw = {**CASES["llama3-rope"][2], "rope_parameters": rp, "head_dim": 64, "max_position_embeddings": 16384}
    c = transformers.LlamaConfig(**kw)
    c._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(c).eval()
    factors = _llama3_factors(c, 64)
    assert int(((factors > 1) & (factors < 32)).sum()) >= 2  # the blend holds several frequencies
    path = write_gguf(tmp_path / "l32.gguf", hf, "llama")
    cfg = model_config(path)
    assert cfg is not None and (cfg.rope_scaling, cfg.rope_factor, cfg.rope_original_ctx) == ("llama3", 32.0, 8192)
    assert (cfg.rope_low_freq_factor, cfg.rope_high_freq_factor) == pytest.approx((1.0, 4.0), rel=1e-5)
    tokens = PROMPTS[0][None]
    with torch.no_grad():
        assert (gi.load(path)(tokens) - hf(tokens).logits).abs().max().item() <= 1e-5


def _never_read(monkeypatch):
    def boom(self, name):
        raise AssertionError(f"tensor {name} was read before the file was refused")

    monkeypatch.setattr(gg.GGUFFile, "tensor", boom)


def test_what_a_config_cannot_hold_is_refused_before_the_weights(tmp_path, monkeypatch):
    qwen, phi3, neox, mistral = (hf_model(c) for c in ("qwen2", "phi3", "gpt_neox", "mistral"))
    quadratic = (np.linspace(1.0, 3.0, 12) ** 2).astype(np.float32)  # no Llama 3 blend gives these factors
    bad_rope = write_gguf(tmp_path / "r.gguf", mistral, "llama", extra={"rope_freqs.weight": quadratic})
    with pytest.raises(GGUFError, match=r"rope_freqs.weight holds rope factors .* no Llama 3 scaling"):
        gi.load(bad_rope)
    refused = {
        r"a 'gptj' model; gpt2-interp loads GGUF architectures llama, gpt2, qwen2": write_gguf(
            tmp_path / "gptj.gguf", qwen, "qwen2", label="gptj"
        ),
        r"rope_factors_long.weight \(LongRoPE\)": write_gguf(
            tmp_path / "lr.gguf", phi3, "phi3", extra={"rope_factors_long.weight": np.ones(8, np.float32)}
        ),
        r"qwen2.rope.scaling.yarn_log_multiplier=0.1.*YaRN": write_gguf(
            tmp_path / "y.gguf", hf_model("qwen2-yarn"), "qwen2", extra={"qwen2.rope.scaling.yarn_log_multiplier": 0.1}
        ),
        r"rotates 8 of 16 head dimensions \(qwen2.rope.dimension_count\)": write_gguf(
            tmp_path / "p.gguf", qwen, "qwen2", extra={"qwen2.rope.dimension_count": 8}
        ),
        r"gptneox.attention.sliding_window=4; gpt2-interp reads sliding windows": write_gguf(
            tmp_path / "w.gguf", neox, "gptneox", extra={"gptneox.attention.sliding_window": 4}
        ),
        r"uses rope scaling 'longrope' \(qwen2.rope.scaling.type\)": write_gguf(
            tmp_path / "t.gguf", qwen, "qwen2", extra={"qwen2.rope.scaling.type": "longrope"}
        ),
        r"lacks the tensor blk.1.attn_k.bias that its metadata": write_gguf(
            tmp_path / "m.gguf", qwen, "qwen2", drop=("blk.1.attn_k.bias",)
        ),
    }
    _never_read(monkeypatch)
    for message, path in refused.items():
        with pytest.raises(GGUFError, match=message):
            gi.load(path)
