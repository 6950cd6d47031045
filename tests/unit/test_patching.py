"""Batched activation patching equals TransformerLens's one-forward-per-patch loops, and slow loops of our own."""

from __future__ import annotations

import json

import pytest
import torch

import gpt2_interp as gi
from gpt2_interp.analysis.patching import kl_to, logit_diff, patch, prob

CLEAN = "The capital of France is the city of"
CORRUPT = "The capital of Italy is the city of"


@pytest.fixture(scope="module")
def small_hf():
    """A random 4-layer, d_model 128 transformers GPT-2 with non-trivial biases and LayerNorms."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=4, n_embd=128, n_head=4, n_positions=64)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(torch.randn_like(p) * 0.05)
            if "c_proj.weight" in name or "c_attn.weight" in name:
                p.mul_(4)  # heads that move information between positions
        hf.transformer.wte.weight.mul_(4)  # sharper next-token distributions: patch effects well above fp error
    return hf


@pytest.fixture(scope="module")
def small(small_hf):
    return gi.from_transformers(small_hf).eval().requires_grad_(False)


@pytest.fixture(scope="module")
def tl_small(small_hf, tl_from_hf):
    return tl_from_hf(small_hf)


@pytest.fixture(scope="module")
def pairs(small):
    """Two prompt pairs of equal length as tokens [2, pos] (no padding), and answer/wrong ids."""
    clean = small.to_tokens(["The capital of France is", "The capital of Spain is"])  # 6 tokens with BOS
    corrupt = small.to_tokens(["The capital of Italy is", "The capital of Japan is"])
    assert clean.shape == corrupt.shape
    return clean, corrupt, small.to_single_token(" Paris"), small.to_single_token(" Rome")


@pytest.mark.parametrize(
    "family, tl_fn",
    [
        ("resid_pre", "get_act_patch_resid_pre"),
        ("attn_out", "get_act_patch_attn_out"),
        ("mlp_out", "get_act_patch_mlp_out"),
        ("z", "get_act_patch_attn_head_out_all_pos"),
    ],
)
@pytest.mark.slow
def test_equals_transformer_lens(small, tl_small, pairs, family, tl_fn):
    import transformer_lens.patching as tlp

    clean, corrupt, a, w = pairs
    _, clean_cache = tl_small.run_with_cache(clean)

    def tl_metric(logits):  # TL hands the metric full logits [batch, pos, d_vocab]
        return (logits[:, -1, a] - logits[:, -1, w]).mean()

    expected = getattr(tlp, tl_fn)(tl_small, corrupt, clean_cache, tl_metric)
    got = patch(small, clean, corrupt, logit_diff(a, w), hook=family)
    assert got.values.shape == expected.shape
    assert expected.abs().max() > 0.05  # the sweep is not trivially flat
    assert (got.values - expected).abs().max().item() <= 1e-4


@pytest.mark.slow
def test_per_head_by_position_equals_transformer_lens(small, tl_small, pairs):
    import transformer_lens.patching as tlp

    clean, corrupt, a, w = pairs
    _, clean_cache = tl_small.run_with_cache(clean)
    expected = tlp.get_act_patch_attn_head_out_by_pos(
        tl_small, corrupt, clean_cache, lambda logits: (logits[:, -1, a] - logits[:, -1, w]).mean()
    )
    got = patch(small, clean, corrupt, logit_diff(a, w), hook="z", positions=list(range(clean.shape[1])))
    assert got.index_names == ("layer", "pos", "head")
    assert (got.values - expected).abs().max().item() <= 1e-4


def _slow_patch(model, clean, corrupt, metric, name, setter):
    """One forward per patch: run corrupted with ``setter(act, clean_act)`` at ``name``."""
    _, cache = model.run_with_cache(clean, names_filter=name)

    def hook(act, h):
        act = act.clone()
        setter(act, cache[name])
        return act

    logits = model.run_with_hooks(corrupt, fwd_hooks=[(name, hook)])
    return metric(logits[:, -1]).mean().item()


@pytest.mark.parametrize(
    "hook, name, index",
    [
        ("resid_post", "blocks.1.hook_resid_post", 4),
        ("resid_post", "blocks.3.hook_resid_post", -1),  # last layer: the row starts at the final residual
        ("resid_mid", "blocks.2.hook_resid_mid", 4),
        ("blocks.1.mlp.hook_post", "blocks.1.mlp.hook_post", 4),
        ("hook_embed", "hook_embed", 4),
        ("ln_final.hook_scale", "ln_final.hook_scale", -1),
    ],
)
def test_other_hooks_equal_a_slow_loop(small, pairs, hook, name, index):
    clean, corrupt, a, w = pairs
    m = logit_diff(a, w)

    def setter(act, src):
        act[:, index] = src[:, index]

    layer = int(name.split(".")[1]) if name.startswith("blocks.") else None
    got = patch(
        small,
        clean,
        corrupt,
        m,
        hook=hook,
        layers=[layer] if hook in ("resid_post", "resid_mid") else None,
        positions=[index],
    )
    expected = _slow_patch(small, clean, corrupt, m, name, setter)
    assert got.values.numel() == 1
    assert abs(got.values.item() - expected) <= 1e-4
    assert abs(expected - got.corrupted_metric) > 1e-3  # the patch matters


def test_q_and_pattern_heads_equal_a_slow_loop(small, pairs):
    clean, corrupt, a, w = pairs
    m = logit_diff(a, w)

    def head_setter(act, src):
        act[:, :, 2] = src[:, :, 2]

    def pattern_setter(act, src):
        act[:, 1] = src[:, 1]

    got = patch(small, clean, corrupt, m, hook="q", layers=[2], heads=[2])
    assert abs(got.values.item() - _slow_patch(small, clean, corrupt, m, "blocks.2.attn.hook_q", head_setter)) <= 1e-4
    got = patch(small, clean, corrupt, m, hook="pattern", layers=[1], heads=[1])
    assert (
        abs(got.values.item() - _slow_patch(small, clean, corrupt, m, "blocks.1.attn.hook_pattern", pattern_setter))
        <= 1e-4
    )


@pytest.mark.slow
def test_everything_restores_clean_and_nothing_keeps_corrupted(small, pairs):
    clean, corrupt, a, w = pairs
    m = logit_diff(a, w)
    full = patch(small, clean, corrupt, m, hook="resid_pre", positions="all")  # every position at once
    assert full.values.shape == (4, 1)
    assert abs(full.clean_metric - full.corrupted_metric) > 0.1
    assert (full.values - full.clean_metric).abs().max() <= 1e-4
    # the corrupted metric via the noise direction: patching all corrupted positions into clean
    noised = patch(small, clean, corrupt, m, hook="resid_post", positions="all", direction="noise")
    assert (noised.values - noised.corrupted_metric).abs().max() <= 1e-4
    # position 0 (BOS) is the same token in both prompts, and causal attention keeps it identical
    bos = patch(small, clean, corrupt, m, hook="resid_pre", positions=[0], normalize=True)
    assert bos.values.abs().max() <= 1e-5
    norm = patch(small, clean, corrupt, m, hook="resid_pre", positions="all", normalize=True)
    assert (norm.values - 1).abs().max() <= 1e-4
    # all heads of z together at every position = the whole attention output of that layer
    heads = patch(small, clean, corrupt, m, hook="z", heads="all")
    attn = patch(small, clean, corrupt, m, hook="attn_out", positions="all")
    assert (heads.values - attn.values).abs().max() <= 1e-4


@pytest.mark.slow
def test_kl_metric_is_zero_when_everything_is_patched(small, pairs):
    clean, corrupt, *_ = pairs
    r = patch(small, clean, corrupt, kl_to(), hook="resid_pre", positions="all")
    assert r.clean_metric == pytest.approx(0, abs=1e-5) and r.corrupted_metric > 1e-3
    assert r.values.abs().max() <= 1e-4
    per_pos = patch(small, clean, corrupt, kl_to(), hook="resid_pre", normalize=True)
    assert per_pos.values[:, 0].abs().max() <= 1e-4  # BOS: nothing changes, KL stays at the corrupted value


def test_metrics_by_hand():
    logits = torch.tensor([[[1.0, 2.0, 3.0]], [[0.0, 0.0, 0.0]]])  # [k=2, n_pairs=1, d_vocab=3]
    assert logit_diff(2, 0)(logits).tolist() == [[2.0], [0.0]]
    p = prob(1)(logits)
    assert p[0, 0].item() == pytest.approx(torch.e**2 / (torch.e + torch.e**2 + torch.e**3))
    assert p[1, 0].item() == pytest.approx(1 / 3)
    ref = torch.tensor([[0.0, 0.0, 0.0]])
    kl = kl_to(ref)(logits)
    q = torch.softmax(logits[0, 0], -1)
    assert kl[0, 0].item() == pytest.approx(
        float((torch.full((3,), 1 / 3) * (torch.log(torch.tensor(1 / 3)) - q.log())).sum())
    )
    assert kl[1, 0].item() == pytest.approx(0, abs=1e-7)
    per_pair = logit_diff([0, 1], [1, 0])(torch.tensor([[[1.0, 3.0], [1.0, 3.0]]]))  # different answers per pair
    assert per_pair.tolist() == [[-2.0, 2.0]]


@pytest.mark.slow
def test_padded_prompt_pairs_equal_separate_runs(small):
    """A batch of prompt pairs of different lengths (left-padded) gives each pair's own sweep, aligned at the end."""
    c = [CLEAN, "Paris is the capital of"]
    k = [CORRUPT, "London is the capital of"]
    m = prob(" France")
    both = patch(small, c, k, m, hook="mlp_out", positions=[-1, -2, -3])
    for i in range(2):
        alone = patch(small, c[i], k[i], m, hook="mlp_out", positions=[-1, -2, -3])
        assert (both.pair_values[i] - alone.pair_values[0]).abs().max() <= 1e-6
        assert both.clean_pair_metric[i] == pytest.approx(float(alone.clean_pair_metric[0]), abs=1e-7)
    assert (both.values - both.pair_values.mean(0)).abs().max() <= 1e-7


def test_chunking_and_layer_order_do_not_change_results(small, pairs):
    clean, corrupt, a, w = pairs
    m = logit_diff(a, w)
    whole = patch(small, clean, corrupt, m, hook="attn_out")
    chunked = patch(small, clean, corrupt, m, hook="attn_out", batch_size=6, layers=[3, 0, 2, 1])
    assert chunked.layers == [3, 0, 2, 1] and chunked.layer_labels[0] == "L3"
    assert (chunked.values - whole.values[[3, 0, 2, 1]]).abs().max() <= 1e-5
    two_layers = 2 * clean.shape[1] * clean.shape[0]  # chunks holding exactly two layers' rows each
    assert (
        patch(small, clean, corrupt, m, hook="attn_out", batch_size=two_layers).values - whole.values
    ).abs().max() <= 1e-5


def test_bf16(small, pairs):
    clean, corrupt, a, w = pairs
    m = logit_diff(a, w)
    ref = patch(small, clean, corrupt, m, hook="resid_pre", normalize=True)
    low = gi.from_transformers(small.to_transformers()).to(torch.bfloat16).eval()
    got = patch(low, clean, corrupt, m, hook="resid_pre", normalize=True)
    assert got.values.dtype == torch.float32
    assert (got.values - ref.values).abs().max() <= 0.1  # bf16 keeps ~3 significant digits


@pytest.mark.slow
def test_result_labels_json_and_plot(small, tmp_path):
    r = patch(small, CLEAN, CORRUPT, logit_diff(" Paris", " Rome"), hook="resid_pre")
    assert r.index_names == ("layer", "pos") and r.values.shape == (4, 9)
    assert r.position_labels[4] == " France/ Italy" and r.position_labels[1] == "The"
    d = json.loads(r.to_json())
    assert d["layer_labels"] == ["L0", "L1", "L2", "L3"] and len(d["values"]) == 4
    assert r.save_plot(tmp_path / "p.png").stat().st_size > 1000
    heads = patch(small, CLEAN, CORRUPT, logit_diff(" Paris", " Rome"), hook="z", positions=[-1, 4], layers=[0, 1])
    assert heads.values.shape == (2, 2, 4) and heads.save_plot(tmp_path / "h.png").exists()


def test_bad_input(small):
    m = logit_diff(" Paris", " Rome")
    with pytest.raises(ValueError, match=r"same number of tokens(.|\n)*'The', ' capital'(.|\n)*' Kingdom'"):
        patch(small, CLEAN, "The capital of the United Kingdom is the city of", m)
    with pytest.raises(KeyError, match="Did you mean 'resid_pre'"):
        patch(small, CLEAN, CORRUPT, m, hook="resid_pr")
    with pytest.raises(KeyError, match="unknown hook name"):
        patch(small, CLEAN, CORRUPT, m, hook="blocks.0.hook_resid_prex")
    with pytest.raises(IndexError, match=r"position 9 is out of range.*9 tokens"):
        patch(small, CLEAN, CORRUPT, m, positions=[9])
    with pytest.raises(IndexError, match=r"layer 4 is out of range.*4 layers"):
        patch(small, CLEAN, CORRUPT, m, layers=[4])
    with pytest.raises(IndexError, match="head 7"):
        patch(small, CLEAN, CORRUPT, m, hook="z", heads=[7])
    with pytest.raises(ValueError, match="no head axis"):
        patch(small, CLEAN, CORRUPT, m, hook="mlp_out", heads=[0])
    with pytest.raises(ValueError, match="direction"):
        patch(small, CLEAN, CORRUPT, m, direction="sideways")
    with pytest.raises(ValueError, match=r"' Parisian'.*2 tokens|2 tokens.*Paris"):
        logit_diff(" Parisian", " Rome", model=small)  # resolved by the model's tokenizer now…
    with pytest.raises(ValueError, match=r"' Parisian'.*2 tokens|2 tokens.*Paris"):
        patch(small, CLEAN, CORRUPT, logit_diff(" Parisian", " Rome"))  # …or when patch binds it
    with pytest.raises(ValueError, match="no model has resolved"):
        logit_diff(" Paris", " Rome")(torch.zeros(1, 50257))
    with pytest.raises(ValueError, match="one value per run"):
        patch(small, CLEAN, CORRUPT, lambda logits: logits[..., 0].mean())
    with pytest.raises(ValueError, match="1 clean prompts but 2"):
        patch(small, CLEAN, [CORRUPT, CORRUPT], m)


@pytest.mark.slow
def test_cli_patch(small, tmp_path, capsys):
    from gpt2_interp.cli import main

    small.save(tmp_path / "m")
    out = tmp_path / "fig.png"
    rc = main(
        [
            "patch",
            "--model",
            str(tmp_path / "m"),
            "--clean",
            CLEAN,
            "--corrupted",
            CORRUPT,
            "--answer",
            " Paris",
            "--wrong",
            " Rome",
            "--hook",
            "mlp_out",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert rc == 0 and out.exists()
    d = json.loads(capsys.readouterr().out)
    assert d["hook"] == "mlp_out" and len(d["values"]) == 4
    rc = main(
        [
            "patch",
            "--model",
            str(tmp_path / "m"),
            "--clean",
            CLEAN,
            "--corrupted",
            "A different length prompt",
            "--answer",
            " Paris",
        ]
    )
    assert rc == 2 and "same number of tokens" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_patch_over_a_dataset_is_patch_over_its_pairs(tmp_path, capsys):
    """``patch --dataset FILE`` and ``--dataset facts:N`` give :func:`patch` over the same pairs (per-pair answers)."""
    from gpt2_interp.cli import main
    from gpt2_interp.facts.base import FactBase
    from gpt2_interp.facts.pairs import subject_swaps

    model = gi.load("gpt2-facts")
    rows = [
        ("The capital of France is", "The capital of Italy is", " Paris", " Rome"),
        ("The capital of Spain is", "The capital of Japan is", " Madrid", " Tokyo"),
    ]
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(dict(zip(("clean", "corrupted", "answer"), r[:3]))) + "\n" for r in rows))
    want = patch(model, [r[0] for r in rows], [r[1] for r in rows], prob([r[2] for r in rows]), normalize=True)
    assert main(["patch", "--dataset", str(data), "--normalize", "--json"]) == 0  # no "wrong": probability
    got = json.loads(capsys.readouterr().out)
    assert got["metric"] == "prob"
    torch.testing.assert_close(torch.tensor(got["values"]), want.values.float(), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(torch.tensor(got["pair_values"]), want.pair_values.float(), atol=1e-5, rtol=1e-4)
    pairs = subject_swaps(FactBase.load(), model.tokenizer, n=3, seed=1)
    want = patch(model, pairs.clean, pairs.corrupted, logit_diff(pairs.answers, pairs.wrongs), hook="mlp_out")
    out = tmp_path / "fig.png"
    assert main(["patch", "--dataset", "facts:3", "--seed", "1", "--hook", "mlp_out", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("3 prompt pairs from facts:3") and out.stat().st_size > 10000
    assert f"clean {want.clean_metric:.4g}" in text
