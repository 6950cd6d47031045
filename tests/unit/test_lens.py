"""Logit lens and direct logit attribution: exact against the model, hand-computed values,
explicit recomputation, and a known property of the trained fact model."""

from __future__ import annotations

import json
import math

import pytest
import torch

import gpt2_interp.cli as cli
from gpt2_interp.analysis.lens import logit_attribution, logit_lens
from gpt2_interp.model import GPT2Config, HookedGPT2

PROMPTS = ["The capital of France is", "Hi", "One two three four five six"]


# ------------------------------------------------------------------ logit lens == model
def test_final_lens_equals_model_logits_tiny_batched(tiny):
    r = logit_lens(tiny, PROMPTS, targets=" Paris", positions="all", k=5, include_mid=True, return_logits=True)
    with torch.no_grad():
        ref = tiny(PROMPTS)  # [batch, width, d_vocab], left-padded like the lens
    assert r.logits.shape == (1 + 2 * tiny.cfg.n_layer, 3, ref.shape[1], tiny.cfg.d_vocab)
    assert r.layers == ["embed", "L0_mid", "L0", "L1_mid", "L1"]
    v = r.valid
    assert v.sum().item() == sum(len(tiny.to_tokens(p)[0]) for p in PROMPTS)
    assert (r.logits[-1][v] - ref[v]).abs().max().item() <= 1e-5
    # top-k and target statistics of the final entry are those of the model's distribution
    logp = ref.log_softmax(-1)
    top = logp.topk(5, dim=-1)
    assert torch.equal(r.top_ids[-1][v], top.indices[v])
    assert torch.allclose(r.top_probs[-1][v], top.values[v].exp(), atol=1e-6)
    t = tiny.to_single_token(" Paris")
    assert torch.allclose(r.target_prob[-1][v], logp[..., t].exp()[v], atol=1e-7)
    assert torch.equal(r.target_rank[-1][v], (ref > ref[..., t : t + 1]).sum(-1)[v] + 1)
    assert torch.isnan(r.top_probs[:, ~v]).all() and (r.target_rank[:, ~v] == -1).all()


@pytest.mark.slow
def test_final_lens_equals_model_logits_gpt2(gpt2):
    prompts = PROMPTS[:2]
    r = logit_lens(gpt2, prompts, positions=[-1, 1], k=3, return_logits=True)
    with torch.no_grad():
        ref = gpt2(prompts)
    width = ref.shape[1]
    lens_final = r.logits[-1]  # [batch, 2, d_vocab]
    assert (lens_final[:, 0] - ref[:, -1]).abs().max().item() <= 1e-5
    pad = [width - len(gpt2.to_tokens(p)[0]) for p in prompts]
    for b in range(2):  # position 1 is each prompt's first real token after BOS
        assert (lens_final[b, 1] - ref[b, pad[b] + 1]).abs().max().item() <= 1e-5
    assert r.positions.tolist() == [[5, 1], [1, 1]]


def test_batched_lens_equals_one_prompt_at_a_time(tiny):
    r = logit_lens(tiny, PROMPTS, targets=[" Paris", " Rome", " seven"], k=4, batch_size=2)
    for b, (p, t) in enumerate(zip(PROMPTS, [" Paris", " Rome", " seven"])):
        one = logit_lens(tiny, p, targets=t, k=4)
        assert torch.equal(one.top_ids[:, 0], r.top_ids[:, b])
        assert torch.equal(one.target_rank[:, 0], r.target_rank[:, b])
        assert torch.allclose(one.target_logit[:, 0], r.target_logit[:, b], atol=1e-5)
        assert one.str_tokens[0] == r.str_tokens[b]


def test_every_boundary_is_ln_final_then_unembed_of_the_cached_residual(tiny):
    r = logit_lens(tiny, PROMPTS[0], positions="all", include_mid=True, return_logits=True)
    _, cache = tiny.run_with_cache(PROMPTS[0])
    resid, labels = cache.accumulated_resid(incl_mid=True, return_labels=True)  # [n, 1, pos, d]
    assert len(labels) == len(r.layers) and labels[0] == "0_pre" and labels[-1] == "final_post"
    ref = tiny.unembed(tiny.ln_final(resid))[:, 0]
    assert (r.logits[:, 0] - ref).abs().max().item() <= 1e-5


def hand_model() -> HookedGPT2:
    """1 layer, d_model 4, vocab 6; attention and MLP write only their biases."""
    cfg = GPT2Config(n_layer=1, d_model=4, n_head=1, d_mlp=4, n_ctx=8, d_vocab=6, name="hand")
    m = HookedGPT2(cfg, seed=0).eval()
    with torch.no_grad():
        m.W_E.copy_(
            torch.tensor(
                [
                    [1.0, 0.0, 0.0, 0.0],
                    [0.0, 2.0, 0.0, 0.0],
                    [0.0, 0.0, 1.0, -1.0],
                    [1.0, 1.0, 1.0, 1.0],
                    [0.5, -0.5, 0.0, 2.0],
                    [-1.0, 0.0, 3.0, 0.0],
                ]
            )
        )
        m.W_pos.zero_()
        m.W_pos[1] = torch.tensor([0.0, 1.0, 0.0, 0.0])
        blk = m.blocks[0]
        blk.attn.W_O.zero_()
        blk.attn.b_O.copy_(torch.tensor([0.5, 0.0, 0.0, 0.0]))
        blk.mlp.W_out.zero_()
        blk.mlp.b_out.copy_(torch.tensor([0.0, 0.0, -1.0, 0.5]))
        m.ln_final.w.copy_(torch.tensor([1.0, 2.0, 0.5, 1.0]))
        m.ln_final.b.copy_(torch.tensor([0.0, 0.1, 0.0, -0.2]))
    return m


def hand_lens(x: list[float], W_E: list[list[float]], w: list[float], b: list[float], eps: float) -> list[float]:
    mu = sum(x) / 4
    var = sum((v - mu) ** 2 for v in x) / 4
    y = [(v - mu) / math.sqrt(var + eps) * wi + bi for v, wi, bi in zip(x, w, b)]
    return [sum(yi * ei for yi, ei in zip(y, row)) for row in W_E]


def test_lens_on_a_hand_built_model_matches_hand_computation():
    m = hand_model()
    W_E = m.W_E.tolist()
    w, b, eps = m.ln_final.w.tolist(), m.ln_final.b.tolist(), m.ln_final.eps
    tokens = torch.tensor([[2, 4]])  # position 0: token 2; position 1: token 4 + W_pos[1]
    r = logit_lens(m, tokens, targets=3, positions="all", k=6)
    resid_embed = [W_E[2], [a + p for a, p in zip(W_E[4], [0.0, 1.0, 0.0, 0.0])]]
    for j, x0 in enumerate(resid_embed):
        x1 = [a + o + f for a, o, f in zip(x0, [0.5, 0.0, 0.0, 0.0], [0.0, 0.0, -1.0, 0.5])]
        for layer, x in enumerate((x0, x1)):
            logits = hand_lens(x, W_E, w, b, eps)
            z = sum(math.exp(v) for v in logits)
            probs = [math.exp(v) / z for v in logits]
            order = sorted(range(6), key=lambda i: -logits[i])
            assert r.top_ids[layer, 0, j].tolist() == order
            assert r.top_probs[layer, 0, j].tolist() == pytest.approx([probs[i] for i in order], abs=1e-6)
            assert float(r.target_logit[layer, 0, j]) == pytest.approx(logits[3], abs=1e-5)
            assert float(r.target_prob[layer, 0, j]) == pytest.approx(probs[3], abs=1e-6)
            assert int(r.target_rank[layer, 0, j]) == order.index(3) + 1


def test_lens_result_table_json_and_plot(tiny, tmp_path):
    r = logit_lens(tiny, PROMPTS[:2], targets=" Paris", positions=[-2, -1], k=3)
    text = r.table(k=2)
    assert "' Paris'" in text and "rank(target)" in text and text.count("L1 ") == 4
    d = json.loads(r.to_json())
    assert d["layers"] == ["embed", "L0", "L1"] and "logits" not in d
    assert len(d["top_tokens"]) == 3 and len(d["top_tokens"][0][0][0]) == 3
    assert r.save_plot(tmp_path / "lens.png").stat().st_size > 5000
    assert logit_lens(tiny, PROMPTS[0], positions="all").save_plot(tmp_path / "lens2.png").exists()


# ------------------------------------------------------------------ direct logit attribution
def _check_dla_sums(model, prompt, target, baseline=None, position=-1):
    a = logit_attribution(model, prompt, target, baseline, position=position)
    with torch.no_grad():
        logits = model(prompt)[0, position]
    t = model.to_single_token(target)
    true = logits[t] - (logits[model.to_single_token(baseline)] if baseline else 0.0)
    assert a.total == pytest.approx(float(true), abs=1e-4)
    assert a.logit == pytest.approx(float(true), abs=1e-5)
    attn = a.parts[[i for i, l in enumerate(a.labels) if l.endswith(".attn")]]
    assert torch.allclose(a.head_parts.sum(-1) + a.b_O_parts, attn, atol=1e-5)
    return a


def test_dla_parts_sum_to_logit_and_difference_tiny(tiny):
    with torch.no_grad():
        tiny.ln_final.b.normal_(0, 0.5)  # make the LN bias term non-zero
        tiny.ln_final.w.uniform_(0.5, 1.5)
    a = _check_dla_sums(tiny, PROMPTS[0], " Paris")
    assert abs(a.ln_bias) > 1e-3
    assert a.labels[:4] == ["embed", "pos_embed", "L0.attn", "L0.mlp"] and len(a.labels) == 2 + 2 * tiny.cfg.n_layer
    _check_dla_sums(tiny, PROMPTS[0], " Paris", " Rome")
    _check_dla_sums(tiny, PROMPTS[2], " seven", " Paris", position=3)


@pytest.mark.slow
def test_dla_parts_sum_to_logit_gpt2(gpt2):
    _check_dla_sums(gpt2, PROMPTS[0], " Paris")
    _check_dla_sums(gpt2, PROMPTS[0], " Paris", " London")


def test_dla_embed_part_by_hand(tiny):
    """The token-embedding part recomputed from weights, with the LN scale computed from the
    final residual (not read from the hook)."""
    prompt, t = PROMPTS[0], tiny.to_single_token(" Paris")
    a = logit_attribution(tiny, prompt, " Paris", per_head=False)
    assert a.head_parts is None
    _, cache = tiny.run_with_cache(prompt, names_filter=f"blocks.{tiny.cfg.n_layer - 1}.hook_resid_post")
    x = cache["resid_post", tiny.cfg.n_layer - 1][0, -1]
    scale = ((x - x.mean()).pow(2).mean() + tiny.ln_final.eps).sqrt()
    with torch.no_grad():
        e = tiny.W_E[tiny.to_tokens(prompt)[0, -1]]
        ref = ((e - e.mean()) / scale) @ (tiny.ln_final.w * tiny.W_U[:, t])
    assert float(a.parts[0]) == pytest.approx(float(ref), abs=1e-6)
    assert a.scale == pytest.approx(float(scale), rel=1e-5)


def test_dla_table_and_plot(tiny, tmp_path):
    a = logit_attribution(tiny, PROMPTS[0], " Paris", " Rome")
    text = a.table()
    assert "L1.mlp" in text and "ln_final.b" in text and "largest heads" in text
    assert json.loads(a.to_json())["labels"] == a.labels
    assert a.save_plot(tmp_path / "dla.png").stat().st_size > 5000


# ------------------------------------------------------------------ bad input
def test_bad_inputs_say_what_to_do(tiny):
    with pytest.raises(ValueError, match=r"5 tokens \[' Ou', 'ag', 'ad', 'oug', 'ou'\]"):
        logit_lens(tiny, PROMPTS[0], targets=" Ouagadougou")
    with pytest.raises(ValueError, match=r"4 tokens \[' Nay'"):
        logit_attribution(tiny, PROMPTS[0], " Paris", baseline=" Naypyidaw")
    with pytest.raises(ValueError, match="no prompts"):
        logit_lens(tiny, [])
    with pytest.raises(IndexError, match=r"shortest prompt has 2 tokens.*-2 to 1"):
        logit_lens(tiny, PROMPTS[:2], positions=[0, 3])
    with pytest.raises(ValueError, match="one per prompt"):
        logit_lens(tiny, PROMPTS[:2], targets=[" a", " b", " c"])
    with pytest.raises(IndexError, match="out of range"):
        logit_attribution(tiny, "Hi", " Paris", position=5)


# ------------------------------------------------------------------ the trained fact model
def test_fact_rank_improves_with_depth(facts_model):
    """Known facts (rank 1 at the output) are resolved with depth. The fact model already ranks
    most of them first at the middle boundary (after 3 of 6 blocks), so "better" compares
    (rank, -probability): a lower rank, or the same rank with a higher target probability."""
    from gpt2_interp.facts.base import FactBase

    fb = FactBase.load()
    facts = [f for r in fb.relations for f in fb.facts(r)[::12][:10]]
    prompts = [fb.prompts(f)[0] for f in facts]
    targets = [facts_model.to_tokens(f.target, prepend_bos=False)[0, 0].item() for f in facts]
    r = logit_lens(facts_model, prompts, targets=targets, k=1)
    ranks = r.target_rank[:, :, 0].double()  # [n_layers, n_facts]
    probs = r.target_prob[:, :, 0].double()
    known = ranks[-1] == 1
    assert known.float().mean() > 0.5, "the fact model should know most of its training facts"
    mrr = (1 / ranks).mean(-1)
    assert mrr[-1] > mrr[0]
    mid = len(r.layers) // 2
    rl, rm, pl, pm = ranks[-1, known], ranks[mid, known], probs[-1, known], probs[mid, known]
    better = ((rl < rm) | ((rl == rm) & (pl > pm))).double().mean().item()
    assert better >= 0.5, f"only {better:.2f} of known facts improve from {r.layers[mid]} to the last layer"


@pytest.mark.slow
def test_cli_lens_and_dla_smoke(facts_model, tmp_path, capsys):
    fig = tmp_path / "lens.png"
    assert cli.main(["lens", "The capital of France is", "--target", " Paris", "--out", str(fig)]) == 0
    out = capsys.readouterr().out
    assert "' Paris'" in out and "rank(target)" in out and fig.stat().st_size > 5000
    assert cli.main(["lens", "The capital of France is", "--positions", "all", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["layers"][0] == "embed"
    assert cli.main(["dla", "The capital of France is", "--target", " Paris", "--baseline", " Rome"]) == 0
    assert "  sum  " in capsys.readouterr().out
    assert cli.main(["dla", "The capital of France is", "--target", " Ouagadougou"]) == 2
    assert "' Ou', 'ag'" in capsys.readouterr().err
