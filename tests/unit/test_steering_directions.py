"""Steering directions and the steering curve, against values computed one prompt at a time by hand."""

from __future__ import annotations

import pytest
import torch

from gpt2_interp.analysis.features import (
    as_direction,
    decoder_direction,
    mean_difference,
    steering_curve,
    target_token_ids,
)

AT = "blocks.1.hook_resid_pre"
POS = ["The cat sat on the mat", "Paris is lovely", "A"]
NEG = ["The dog lay on the rug today", "Rome", "B c d"]


@torch.no_grad()
def one_by_one(model, prompts, where):
    """Each prompt alone (no padding), its activation at AT: the last token or the mean without BOS."""
    rows = []
    for p in prompts:
        _, cache = model.run_with_cache(p, names_filter=AT)
        act = cache[AT][0]
        rows.append(act[-1] if where == "last" else act[1:].mean(0))
    return torch.stack(rows)


@pytest.mark.parametrize("where", ["last", "mean"])
def test_mean_difference_is_the_difference_of_per_prompt_means(tiny, where):
    want = one_by_one(tiny, POS, where).mean(0) - one_by_one(tiny, NEG, where).mean(0)
    got = mean_difference(tiny, POS, NEG, AT, position=where, batch_size=2)  # padded batches
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    unit = mean_difference(tiny, POS, NEG, AT, position=where, normalize=True)
    torch.testing.assert_close(unit, want / want.norm(), rtol=0, atol=1e-6)


def test_an_integer_position_reads_that_token(tiny):
    want = torch.stack([tiny.run_with_cache(p, names_filter=AT)[1][AT][0, 1] for p in POS]).mean(0)
    got = mean_difference(tiny, POS, POS[:1] * 0 + ["x"], AT, position=1)
    x = tiny.run_with_cache("x", names_filter=AT)[1][AT][0, 1]
    torch.testing.assert_close(got, want - x, rtol=0, atol=1e-5)
    with pytest.raises(IndexError, match="outside prompt"):
        mean_difference(tiny, POS, NEG, AT, position=4)


def test_decoder_and_plain_directions():
    w_dec = torch.randn(10, 64)

    class SAE:
        W_dec = w_dec

    assert torch.equal(decoder_direction(SAE(), 3), w_dec[3])
    torch.testing.assert_close(decoder_direction(w_dec, -1, normalize=True).norm(), torch.tensor(1.0))
    with pytest.raises(IndexError, match="the SAE has 10 latents"):
        decoder_direction(w_dec, 10)
    with pytest.raises(ValueError, match="zero vector"):
        as_direction([0.0, 0.0], normalize=True)
    with pytest.raises(ValueError, match="non-empty vector"):
        as_direction(3.0)


def test_target_tokens_must_be_single_tokens(tiny):
    assert target_token_ids(tiny, [" the", 13]) == sorted({tiny.tokenizer.encode_ids(" the")[0], 13})
    with pytest.raises(ValueError, match="is 2 tokens"):
        target_token_ids(tiny, [" the cat"])


@torch.no_grad()
def test_steering_curve_matches_a_hand_measurement(tiny):
    d = torch.randn(tiny.cfg.d_model, generator=torch.Generator().manual_seed(0))
    prompts, texts = ["The capital of France is", "Hello"], ["It was a dark and stormy night", "Yes"]
    targets = [" the", " a", " Paris"]
    ids = target_token_ids(tiny, targets)
    r = steering_curve(tiny, d, AT, [0.0, 3.0], prompts, targets, texts, batch_size=1, method="random")
    # by hand, one text at a time, at scale 3
    with tiny.steer(d, at=AT, scale=3.0):
        p = [tiny(x)[0, -1].softmax(-1)[ids].sum() for x in prompts]
        steered = [tiny(x)[0].log_softmax(-1) for x in texts]
    plain = [tiny(x)[0].log_softmax(-1) for x in texts]
    tokens = [tiny.to_tokens(x)[0] for x in texts]
    nll = sum(-s[:-1].gather(-1, t[1:, None]).sum() for s, t in zip(steered, tokens))
    kl = sum((b[:-1].exp() * (b[:-1] - s[:-1])).sum() for b, s in zip(plain, steered))
    n = sum(len(t) - 1 for t in tokens)
    base_nll = sum(-b[:-1].gather(-1, t[1:, None]).sum() for b, t in zip(plain, tokens))
    assert r.n_tokens == n
    torch.testing.assert_close(r.target_prob[1], torch.stack(p).mean(), rtol=1e-5, atol=1e-7)
    base_p = [tiny(x)[0, -1].softmax(-1)[ids].sum() for x in prompts]
    shift = torch.stack(p) - torch.stack(base_p)
    torch.testing.assert_close(r.shift_sem[1], shift.std() / 2**0.5, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(r.loss[1], nll / n, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(r.kl[1], kl / n, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(r.loss[0], base_nll / n, rtol=1e-5, atol=1e-6)
    assert float(r.kl[0]) == 0.0 and r.prob_shift[0] == 0
    # a padded batch gives the same numbers
    batched = steering_curve(tiny, d, AT, [0.0, 3.0], prompts, targets, texts, batch_size=2)
    for name in ("target_prob", "loss", "kl"):
        torch.testing.assert_close(getattr(batched, name), getattr(r, name), rtol=1e-4, atol=1e-6)
    assert "loss change" in r.table() and r.to_dict()["scales"] == [0.0, 3.0]
    assert all(not hp.has_hooks for hp in tiny.hook_dict.values())


@torch.no_grad()
def test_generation_nll_scores_the_steered_continuation_with_the_plain_model(tiny):
    d = torch.randn(tiny.cfg.d_model, generator=torch.Generator().manual_seed(2))
    prompts = ["The capital of France is", "Once upon a"]
    r = steering_curve(tiny, d, AT, [0.0, 4.0], prompts, [" the"], ["Some text here"], generate_tokens=3)
    nll = []
    for p in prompts:
        tokens = tiny.to_tokens(p)
        with tiny.steer(d, at=AT, scale=4.0):
            new = tiny.generate(tokens, max_new_tokens=3, do_sample=False, suppress_eos=True)[0, tokens.shape[1] :]
        seq = tokens[0].tolist()
        for t in new.tolist():  # the plain model's log-probability of each written token, token by token
            nll.append(-float(tiny(torch.tensor([seq]))[0, -1].log_softmax(-1)[t]))
            seq.append(t)
    assert r.generation_nll is not None
    assert float(r.generation_nll[1]) == pytest.approx(sum(nll) / len(nll), rel=1e-4)
