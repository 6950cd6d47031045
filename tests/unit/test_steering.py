"""model.steer / generate(steer=…): the added vector, where it goes, and that nothing stays behind."""

from __future__ import annotations

import pytest
import torch

from gpt2_interp.model import Steer

AT = "blocks.0.hook_resid_post"
PROMPTS = ["The capital of France is", "Hi"]


def direction(model, seed=1):
    return torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(seed))


def no_hooks(model):
    return all(not hp.has_hooks for hp in model.hook_dict.values())


@torch.no_grad()
def test_steer_equals_resuming_the_forward_from_the_shifted_residual(tiny):
    """Independent path: block 1 onwards run on the residual + scale·d (forward(start_at_layer=1))."""
    d = direction(tiny)
    tokens, _ = tiny.tokenize(PROMPTS[0])
    resid = tiny(tokens, stop_at_layer=1)
    expected = tiny(resid + 2.5 * d, start_at_layer=1)
    with tiny.steer(d, at=AT, scale=2.5):
        got = tiny(tokens)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert no_hooks(tiny)
    torch.testing.assert_close(tiny(tokens), tiny(resid, start_at_layer=1), rtol=0, atol=0)


@torch.no_grad()
def test_positions_steer_only_those_columns_and_minus_one_is_every_rows_last_token(tiny):
    d = direction(tiny)
    tokens, mask = tiny.tokenize(PROMPTS)  # left-padded: row 1 is mostly padding
    _, plain = tiny.run_with_cache(tokens, attention_mask=mask, names_filter=AT)
    with tiny.steer(d, at=AT, scale=3.0, positions=[-1, 1]):
        _, steered = tiny.run_with_cache(tokens, attention_mask=mask, names_filter=AT)
    delta = steered[AT] - plain[AT]  # [batch, pos, d]
    width = tokens.shape[1]
    for col in range(width):
        want = 3.0 * d if col in (1, width - 1) else torch.zeros_like(d)
        for row in range(2):
            torch.testing.assert_close(delta[row, col], want, rtol=0, atol=1e-5)


@torch.no_grad()
def test_steering_is_removed_when_the_body_raises(tiny):
    d = direction(tiny)
    before = tiny("Hello there")
    with pytest.raises(RuntimeError, match="boom"), tiny.steer(d, at=AT, scale=5.0):
        raise RuntimeError("boom")
    assert no_hooks(tiny)
    torch.testing.assert_close(tiny("Hello there"), before, rtol=0, atol=0)


def test_bad_direction_hook_or_position_is_refused_with_a_clear_error(tiny):
    d = direction(tiny)
    with pytest.raises(ValueError, match=r"direction has shape \(7,\).*\(64,\)"), tiny.steer(torch.ones(7), at=AT):
        pass
    with pytest.raises(KeyError, match="Did you mean"), tiny.steer(d, at="blocks.0.hook_resid_pots"):
        pass
    with pytest.raises(ValueError, match="not a vector per position"), tiny.steer(d, at="blocks.0.attn.hook_pattern"):
        pass
    with pytest.raises(ValueError, match="NaN or inf"):
        Steer(torch.full((64,), float("nan")), AT)
    with pytest.raises(ValueError, match="finite"):
        Steer(d, AT, scale=float("inf"))
    z = torch.ones(tiny.cfg.n_head, tiny.cfg.d_head + 1)  # checked when the activation is seen
    with (
        pytest.raises(ValueError, match=r"blocks.0.attn.hook_z: direction has shape"),
        tiny.steer(z, at="blocks.0.attn.hook_z"),
    ):
        tiny("Hello")
    with pytest.raises(IndexError, match="outside the input of 2 tokens"), tiny.steer(d, at=AT, positions=[5]):
        tiny("Hi")  # BOS + one token
    for name in ("blocks.0.hook_mlp_in", "blocks.0.hook_q_input"):  # opt-in hook points, switched off: would never fire
        with pytest.raises(ValueError, match=r"fires only with model.cfg.use_"), tiny.steer(d, at=name):
            pass
    assert no_hooks(tiny)


@torch.no_grad()
def test_steering_per_head_outputs_takes_a_head_by_d_head_direction(tiny):
    z = torch.zeros(tiny.cfg.n_head, tiny.cfg.d_head)
    z[2] = 1.0
    _, plain = tiny.run_with_cache("Hello world", names_filter="blocks.1.attn.hook_z")
    with tiny.steer(z, at="blocks.1.attn.hook_z", scale=2.0):
        _, steered = tiny.run_with_cache("Hello world", names_filter="blocks.1.attn.hook_z")
    delta = steered["blocks.1.attn.hook_z"] - plain["blocks.1.attn.hook_z"]
    torch.testing.assert_close(delta, (2.0 * z).expand_as(delta), rtol=0, atol=1e-6)


def test_generate_with_steer_equals_generating_inside_the_context(tiny):
    d = direction(tiny)
    steer = Steer(d, AT, scale=4.0)
    plain = tiny.generate(PROMPTS, max_new_tokens=6, do_sample=False)
    got = tiny.generate(PROMPTS, max_new_tokens=6, do_sample=False, steer=steer)
    with tiny.steer(d, at=AT, scale=4.0):
        ref = tiny.generate(PROMPTS, max_new_tokens=6, do_sample=False, use_kv_cache=False)
    assert got == ref and got != plain
    assert no_hooks(tiny)


def test_generate_steers_prompt_positions_the_same_with_and_without_the_kv_cache(tiny):
    d = direction(tiny)
    steer = Steer(d, AT, scale=6.0, positions=(-1,))
    tokens, _ = tiny.tokenize("The capital of France is")
    cached = tiny.generate(tokens, max_new_tokens=6, do_sample=False, steer=steer)
    uncached = tiny.generate(tokens, max_new_tokens=6, do_sample=False, use_kv_cache=False, steer=steer)
    assert torch.equal(cached, uncached)
    # the first new token is the steered prompt's prediction
    with tiny.steer(d, at=AT, scale=6.0, positions=[-1]), torch.no_grad():
        first = tiny(tokens)[0, -1].argmax()
    assert cached[0, tokens.shape[1]] == first
    with pytest.raises(IndexError, match="outside the prompt"):
        tiny.generate(tokens, max_new_tokens=2, steer=Steer(d, AT, positions=(40,)))
    with pytest.raises(TypeError, match="Steer"):
        tiny.generate(tokens, max_new_tokens=2, steer=d)
