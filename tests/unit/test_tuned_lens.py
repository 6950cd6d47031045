"""Tuned lens: identity translators are the logit lens exactly; training lowers KL(final ‖ lens) and leaves
the last boundary the identity; save/load round-trips and is integrity-checked; another model is refused."""

from __future__ import annotations

import json

import pytest
import torch

from gpt2_interp.analysis.lens import logit_lens
from gpt2_interp.analysis.tuned_lens import TunedLens, lens_divergence, token_rows, train_tuned_lens
from gpt2_interp.cli import main
from gpt2_interp.model import HookedGPT2

from ..conftest import TINY

TEXTS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "Germany is a country in Europe, and Kenya is a country in Africa.",
    "Iron has the chemical symbol Fe; gold has the symbol Au.",
    "People in Brazil mostly speak Portuguese, people in Peru Spanish.",
] * 3
PROMPTS = ["The capital of France is", "Iron has the chemical symbol"]


@pytest.fixture(scope="module")
def trained():
    model = HookedGPT2(TINY, seed=0).eval()
    return model, train_tuned_lens(model, TEXTS, steps=12, batch_tokens=64, lr=1e-2, seq_len=16, progress=False)


@pytest.fixture
def random_lens(tiny):
    """A lens with non-trivial translators (as if trained), made without training."""
    lens = TunedLens.identity(tiny)
    g = torch.Generator().manual_seed(0)
    lens.weight = torch.randn(lens.weight.shape, generator=g) * 0.01
    lens.bias = torch.randn(lens.bias.shape, generator=g) * 0.01
    lens.meta = {"steps": 12}
    return tiny, lens


def test_identity_tuned_lens_equals_the_logit_lens_exactly(tiny):
    plain = logit_lens(tiny, PROMPTS, positions="all", return_logits=True)
    tuned = logit_lens(tiny, PROMPTS, positions="all", return_logits=True, lens=TunedLens.identity(tiny))
    assert torch.equal(plain.logits, tuned.logits)
    assert tuned.lens == "tuned lens" and tuned.table().startswith("tuned lens")


@pytest.mark.slow
def test_training_lowers_kl_and_keeps_the_last_boundary_the_identity(trained):
    model, lens = trained
    assert lens.labels == ["embed", "L0", "L1"]
    assert torch.equal(lens.weight[-1], torch.zeros_like(lens.weight[-1])) and not lens.bias[-1].any()
    assert lens.weight[0].abs().max() > 1e-3  # the early translators did move
    before = lens_divergence(model, TEXTS[:4], None)
    after = lens_divergence(model, TEXTS[:4], lens)
    assert before["kl_bits"][-1] < 1e-4 and after["kl_bits"][-1] < 1e-4  # the last boundary is the output
    for b, a in zip(before["kl_bits"][:-1], after["kl_bits"][:-1]):
        assert a < 0.9 * b
    # the tuned lens's last row is the model's own output distribution
    r = logit_lens(model, PROMPTS, positions="all", return_logits=True, lens=lens)
    tokens, mask = model.tokenize(PROMPTS)
    want = model(tokens, attention_mask=mask).float()
    valid = mask.bool() if mask is not None else torch.ones_like(tokens, dtype=torch.bool)
    torch.testing.assert_close(r.logits[-1][valid], want[valid], atol=1e-4, rtol=1e-4)


def test_save_load_round_trip_and_a_corrupted_file_is_refused(random_lens, tmp_path):
    model, lens = random_lens
    path = lens.save(tmp_path / "lens.safetensors")
    back = TunedLens.load(path, model)
    assert torch.equal(back.weight, lens.weight) and torch.equal(back.bias, lens.bias)
    assert back.labels == lens.labels and back.base_fingerprint == lens.base_fingerprint
    assert back.meta["steps"] == 12
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safetensors safe_open handles have keys() but are not iterable)
    tensors["bias"] = tensors["bias"] + 1e-3
    save_file(tensors, str(tmp_path / "bad.safetensors"), metadata=meta)
    with pytest.raises(ValueError, match="integrity check"):
        TunedLens.load(tmp_path / "bad.safetensors")
    header = json.loads(meta["lens"])
    header["base_fingerprint"] = "0" * 64
    save_file(
        dict(tensors),
        str(tmp_path / "bad2.safetensors"),
        metadata=meta | {"lens": json.dumps(header)},
    )
    with pytest.raises(ValueError, match="integrity check"):
        TunedLens.load(tmp_path / "bad2.safetensors")
    with pytest.raises(FileNotFoundError, match="no tuned lens file"):
        TunedLens.load(tmp_path / "missing.safetensors")


def test_a_lens_from_another_model_is_refused(random_lens, tmp_path):
    model, lens = random_lens
    other = HookedGPT2(TINY, seed=1).eval()
    path = lens.save(tmp_path / "lens.safetensors")
    with pytest.raises(ValueError, match="train one for this model with train_tuned_lens"):
        TunedLens.load(path, other)
    with pytest.raises(ValueError, match="train_tuned_lens"):
        logit_lens(other, PROMPTS, lens=lens)
    with pytest.raises(ValueError, match="include_mid=False"):
        logit_lens(model, PROMPTS, lens=lens, include_mid=True)
    bigger = HookedGPT2(TINY.replace(n_layer=3), seed=0).eval()
    with pytest.raises(ValueError, match="3 layers"):
        lens.check(bigger)


def test_token_rows_pack_texts_into_rows_that_start_with_bos(tiny):
    tokens, mask = token_rows(tiny, TEXTS[:2], seq_len=8)
    ids = [tiny.to_tokens(t)[0].tolist() for t in TEXTS[:2]]  # each [BOS, ...]
    assert (tokens[:, 0] == ids[0][0]).all() and mask[:-1].all()  # only the last row is padded
    body = [i for row, m in zip(tokens.tolist(), mask.tolist()) for i, k in zip(row[1:], m[1:]) if k]
    assert body == ids[0][1:] + ids[1]  # the second text keeps its BOS as a separator


@pytest.mark.slow
def test_cli_lens_with_tuned_reads_through_the_saved_lens(facts_model, tmp_path, capsys):
    path = TunedLens.identity(facts_model).save(tmp_path / "id.safetensors")
    assert main(["lens", "The capital of France is", "--target", " Paris", "--tuned", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tuned lens · prompt 'The capital of France is'") and "Paris" in out
    other = TunedLens.identity(HookedGPT2(TINY, seed=0)).save(tmp_path / "tiny.safetensors")
    assert main(["lens", "The capital of France is", "--tuned", str(other)]) == 2
    assert "train one for it" in capsys.readouterr().err


def test_least_squares_start_is_the_ridge_least_squares_fit_of_the_final_residual(tiny):
    """The start equals numpy's lstsq of h_final − h_ℓ on [h_ℓ, 1] over the real non-BOS positions (with the
    ridge rows appended: this tiny corpus repeats its tokens, so hᵀh alone is singular), lowers the KL below
    the logit lens's, and ``steps=0`` returns exactly that start."""
    import numpy as np

    from gpt2_interp.analysis.tuned_lens import boundary_names, least_squares_translators

    tokens, mask = token_rows(tiny, TEXTS, seq_len=16)
    ridge = 1e-3
    weight, bias, n = least_squares_translators(tiny, tokens, mask, ridge=ridge)
    names, _ = boundary_names(tiny)
    _, cache = tiny.run_with_cache(tokens, names_filter=names)
    keep = mask.clone()
    keep[:, 0] = False
    assert n == int(keep.sum())
    y = cache[names[-1]][keep].double().numpy()
    d = y.shape[1]
    for i in (0, 1):
        h = cache[names[i]][keep].double().numpy()
        lam = ridge * (h * h).sum(0).mean()
        x = np.concatenate([np.concatenate([h, np.ones((len(h), 1))], 1), np.sqrt(lam) * np.eye(d, d + 1)])
        beta = np.linalg.lstsq(x, np.concatenate([y - h, np.zeros((d, d))]), rcond=None)[0]
        np.testing.assert_allclose(weight[i].numpy(), beta[:-1], atol=1e-4, rtol=1e-3)
        np.testing.assert_allclose(bias[i].numpy(), beta[-1], atol=1e-4, rtol=1e-3)
    assert not weight[-1].any() and not bias[-1].any()
    lens = train_tuned_lens(tiny, TEXTS, steps=0, seq_len=16, progress=False)
    start, _, _ = least_squares_translators(tiny, tokens, mask)
    assert torch.equal(lens.weight, start) and lens.meta["steps"] == 0
    before, after = lens_divergence(tiny, TEXTS, None, seq_len=16), lens_divergence(tiny, TEXTS, lens, seq_len=16)
    assert all(a < b for a, b in zip(after["kl_bits"][:-1], before["kl_bits"][:-1]))
