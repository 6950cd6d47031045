"""Batched causal tracing equals ROME's one-forward-per-cell procedure; properties on the trained fact model."""

from __future__ import annotations

import json

import pytest
import torch

from gpt2_interp.analysis.tokens import subject_span, target_ids
from gpt2_interp.analysis.tracing import (
    BUCKETS,
    average_trace,
    bucket_cells,
    causal_trace,
    causal_trace_all,
    default_window,
    embedding_std,
    plot_traces,
    resolve_noise,
)
from gpt2_interp.model import GPT2Config, HookedGPT2

PROMPT, SUBJECT = "The Eiffel Tower is located in", "Eiffel Tower"


@pytest.fixture(scope="module")
def sharp():
    """A random 3-layer model whose heads move enough information that noising the subject matters."""
    m = HookedGPT2(GPT2Config(n_layer=3, d_model=64, n_head=4, d_mlp=256, n_ctx=64, name="sharp"), seed=0).eval()
    with torch.no_grad():
        m.W_E.mul_(4)
        for b in m.blocks:
            b.attn.W_QKV.mul_(4)
            b.attn.W_O.mul_(4)
            b.mlp.W_out.mul_(4)
    return m.requires_grad_(False)


def slow_cell(model, prompt, subject, token, layer, kind, std, samples, seed, window, target):
    """ROME's procedure for one cell, written out: one forward of ``samples`` noised copies with the
    clean state restored at ``token`` in ``layer`` (hidden) or in the window around it (mlp/attn).
    ``token`` counts from the first prompt token (the BOS is position 0 of the model input)."""
    n = model.cfg.n_layer
    s, e = subject_span(model, prompt, subject)
    t = token + 1
    noise = torch.randn(samples, e - s, model.cfg.d_model, generator=torch.Generator().manual_seed(seed)) * std
    if kind == "hidden":
        names = [f"blocks.{layer}.hook_resid_post"]
    else:
        lo, hi = max(0, layer - window // 2), min(n, layer - (-window // 2))
        names = [f"blocks.{l}.hook_{kind}_out" for l in range(lo, hi)]
    _, clean = model.run_with_cache(prompt, names_filter=names)

    def add_noise(act, hook):
        act = act.clone()
        act[:, s:e] += noise
        return act

    def restore(act, hook):
        act = act.clone()
        act[:, t] = clean[hook.name][0, t]
        return act

    tokens = model.to_tokens(prompt).repeat(samples, 1)
    logits = model.run_with_hooks(tokens, fwd_hooks=[("hook_embed", add_noise)] + [(nm, restore) for nm in names])
    return torch.softmax(logits[:, -1].float(), -1)[:, target].mean().item()


@pytest.mark.parametrize("kind, window", [("hidden", 10), ("mlp", 2), ("attn", 3)])
def test_batched_trace_equals_per_cell_loop(sharp, kind, window):
    r = causal_trace(sharp, PROMPT, SUBJECT, kind=kind, samples=4, window=window, seed=3)
    assert r.tokens == ["The", " E", "iff", "el", " Tower", " is", " located", " in"]
    assert r.subject_range == (1, 5) and r.scores.shape == (8, 3)
    std = 3 * sharp.W_E[sharp.to_tokens(PROMPT)[0, 2:6]].float().std().item()  # ROME's rule, by hand
    assert r.noise_std == pytest.approx(std, rel=1e-6)
    cells = [(1, 0), (3, 1), (4, 0), (4, 2), (6, 1), (7, 0), (7, 2)]
    for t, l in cells:
        expected = slow_cell(sharp, PROMPT, SUBJECT, t, l, kind, std, 4, 3, window, r.target_id)
        assert r.scores[t, l].item() == pytest.approx(expected, rel=1e-4, abs=1e-9), (t, l)
    # before the subject nothing is corrupted: restoring there changes nothing
    assert slow_cell(sharp, PROMPT, SUBJECT, 0, 1, kind, std, 4, 3, window, r.target_id) == pytest.approx(
        r.corrupted_score, rel=1e-4
    )
    assert (r.scores[0] == r.corrupted_score).all()
    # the cells differ from one another far beyond the tolerance: the comparison can fail
    assert (r.scores.max() - r.scores.min()) / r.scores.max() > 0.05
    assert r.clean_score > 1.2 * r.corrupted_score
    assert torch.allclose(r.indirect_effect, r.scores - r.corrupted_score)


def test_noise_zero_is_flat_at_the_clean_score(sharp):
    for kind in ("hidden", "mlp"):
        r = causal_trace(sharp, PROMPT, SUBJECT, kind=kind, samples=3, noise=0)
        assert r.corrupted_score == pytest.approx(r.clean_score, rel=1e-5)
        assert (r.scores - r.clean_score).abs().max() <= 1e-5 * r.clean_score


def test_default_window_is_romes_fraction_of_the_depth(sharp):
    # ROME: 10 of gpt2-xl's 48 layers; the same fraction, rounded, at least 1
    assert [default_window(n) for n in (48, 36, 24, 12, 6, 2)] == [10, 8, 5, 2, 1, 1]
    r = causal_trace(sharp, PROMPT, SUBJECT, kind="mlp", samples=2)
    assert r.window == default_window(sharp.cfg.n_layer)
    explicit = causal_trace(sharp, PROMPT, SUBJECT, kind="mlp", samples=2, window=r.window)
    assert torch.equal(r.scores, explicit.scores)


def test_deterministic_for_a_seed_and_noise_scales(sharp):
    a = causal_trace(sharp, PROMPT, SUBJECT, samples=3, seed=1)
    b = causal_trace(sharp, PROMPT, SUBJECT, samples=3, seed=1, batch_size=7)  # chunked differently
    c = causal_trace(sharp, PROMPT, SUBJECT, samples=3, seed=2)
    assert torch.allclose(a.scores, b.scores, rtol=1e-5, atol=0) and a.corrupted_score == b.corrupted_score
    assert not torch.allclose(a.scores, c.scores)
    ids = sharp.to_tokens(PROMPT)[0, 2:6].tolist()  # " E", "iff", "el", " Tower" (BOS at 0)
    sigma = sharp.W_E[ids].float().std().item()
    assert resolve_noise(sharp, None, ids) == pytest.approx(3 * sigma) == pytest.approx(a.noise_std)
    assert resolve_noise(sharp, 0.25, ids) == 0.25
    assert causal_trace(sharp, PROMPT, SUBJECT, samples=2, noise=0.5).noise_std == 0.5


def test_explicit_target_and_result_surface(sharp, tmp_path):
    r = causal_trace(sharp, PROMPT, SUBJECT, target=" Paris", samples=2, kind="mlp", window=2)
    assert r.target == " Paris" and r.target_id == sharp.to_single_token(" Paris")
    d = json.loads(r.to_json())
    assert d["kind"] == "mlp" and len(d["scores"]) == 8 and d["layer_labels"] == ["L0", "L1", "L2"]
    assert r.save_plot(tmp_path / "t.png").stat().st_size > 1000
    three = causal_trace_all(sharp, PROMPT, SUBJECT, samples=2, window=2)
    assert [t.kind for t in three.traces] == ["hidden", "mlp", "attn"] and three["attn"].kind == "attn"
    fig = plot_traces(three.traces)
    heatmaps = [ax for ax in fig.axes if ax.get_title().startswith("Impact")]
    assert len(heatmaps) == 3 and heatmaps[0].get_yticklabels()[1].get_text() == " E*"
    assert three.save_plot(tmp_path / "three.png").exists()


def test_bad_input(sharp):
    with pytest.raises(ValueError, match=r"does not occur in the prompt.*tokenizes as"):
        causal_trace(sharp, PROMPT, "Colosseum")
    with pytest.raises(ValueError, match="kind must be one of"):
        causal_trace(sharp, PROMPT, SUBJECT, kind="mlp_out")
    with pytest.raises(ValueError, match="not one"):
        causal_trace(sharp, PROMPT, SUBJECT, target=" Parisian")
    with pytest.raises(ValueError, match="noise"):
        causal_trace(sharp, PROMPT, SUBJECT, noise="lots")
    with pytest.raises(ValueError, match="samples"):
        causal_trace(sharp, PROMPT, SUBJECT, samples=0)


def test_buckets_follow_rome():
    # 8 tokens, subject 1..4: first 1, middle 2-3, last 4, first after 5, further 6, last 7
    assert bucket_cells(8, (1, 5)) == [[1], [2, 3], [4], [5], [6], [7]]
    # one-token subject right before the last token: first = last subject; first after = last token
    assert bucket_cells(5, (3, 4)) == [[3], [], [3], [4], [], [4]]
    assert len(BUCKETS) == 6


def test_cli_trace(sharp, tmp_path, capsys):
    from gpt2_interp.cli import main

    sharp.save(tmp_path / "m")
    out = tmp_path / "trace.png"
    rc = main(
        [
            "trace",
            PROMPT,
            "--subject",
            SUBJECT,
            "--model",
            str(tmp_path / "m"),
            "--kind",
            "all",
            "--samples",
            "2",
            "--window",
            "2",
            "--out",
            str(out),
        ]
    )
    assert rc == 0 and out.exists()
    text = capsys.readouterr().out
    assert "clean p" in text and "mlp" in text and "attn" in text
    assert main(["trace", PROMPT, "--subject", "Louvre", "--model", str(tmp_path / "m")]) == 2
    assert "does not occur" in capsys.readouterr().err


# ------------------------------------------------------------------ the trained fact model
def _known_facts(model, n=10):
    """Up to ``n`` facts the model knows (clean top-1 = the target's first token), spread over relations."""
    from itertools import chain, zip_longest

    from gpt2_interp.analysis.tokens import target_ids
    from gpt2_interp.facts.base import FactBase
    from gpt2_interp.facts.templates import templates

    fb = FactBase.load()
    per_relation = []
    for rel in fb.relations:
        facts = fb.facts(rel)[::5][:6]
        prompts = [templates(rel, "train")[0].format(f.subject) for f in facts]
        top = model.last_logits(prompts).argmax(-1).tolist()
        per_relation.append(
            [(p, f.subject, f.target) for p, f, t in zip(prompts, facts, top) if t == target_ids(model, f.target)[0]]
        )
    return [x for x in chain.from_iterable(zip_longest(*per_relation)) if x is not None][:n]


def _subject_noise(model):
    """ROME's noise: 3 × the std of the fact base's subject embeddings."""
    from gpt2_interp.facts.base import FactBase

    return 3 * embedding_std(model, FactBase.load().subject_texts())


@pytest.mark.slow
def test_fact_model_recalls_at_the_last_subject_token(facts_model):
    """ROME's finding, as a property of the trained model: restoring the last subject token's hidden
    state in the middle layers brings back most of the target probability."""
    facts = _known_facts(facts_model, 10)
    assert len(facts) >= 8
    n = facts_model.cfg.n_layer
    middle = slice(1, n - 1)
    std = _subject_noise(facts_model)
    recovered, clean, corrupted = [], [], []
    for prompt, subject, target in facts:
        r = causal_trace(facts_model, prompt, subject, target=target_ids(facts_model, target)[0], samples=4, noise=std)
        last_subject = r.subject_range[1] - 1
        recovered.append(r.scores[last_subject, middle].max().item())
        clean.append(r.clean_score)
        corrupted.append(r.corrupted_score)

    def mean(xs):
        return sum(xs) / len(xs)

    assert mean(corrupted) <= 0.5 * mean(clean)  # the noise really removes the facts...
    assert mean([r / c for r, c in zip(recovered, clean)]) >= 0.5  # ...and the last subject token brings them back


@pytest.mark.slow
def test_fact_model_batched_equals_loop(facts_model):
    prompt, subject, _ = _known_facts(facts_model, 1)[0]
    std = _subject_noise(facts_model)
    r = causal_trace(facts_model, prompt, subject, kind="mlp", samples=3, window=3, noise=std)
    last = r.subject_range[1] - 1
    assert r.clean_score - r.corrupted_score > 0.3
    for t, l in [(last, 1), (last, 3), (len(r.tokens) - 1, 4), (len(r.tokens) - 1, 5)]:
        expected = slow_cell(facts_model, prompt, subject, t, l, "mlp", std, 3, 0, 3, r.target_id)
        assert r.scores[t, l].item() == pytest.approx(expected, rel=1e-4, abs=1e-6)


@pytest.mark.slow
def test_average_trace_on_fact_model(facts_model, tmp_path):
    facts = [(p, s, t) for p, s, t in _known_facts(facts_model, 4)] + [("The capital of France is", "France", " Moon")]
    avg = average_trace(
        facts_model, facts, kind=("hidden", "mlp"), samples=3, window=3, noise=_subject_noise(facts_model)
    )
    assert avg.n_facts == 5 and avg.n_known == 4  # the made-up fact is not known
    assert avg.scores.shape == (2, 6, facts_model.cfg.n_layer)
    assert avg.counts[0] == avg.counts[2] == avg.counts[5] == 4
    layer, effect = avg.peak("hidden", "last subject token")
    assert effect > 0 and 0 <= layer < facts_model.cfg.n_layer
    # the last token's state right before the output carries the answer: restoring it recovers the clean score
    assert avg.scores[0, 5, -1].item() == pytest.approx(avg.clean_score, rel=1e-3)
    assert avg.save_plot(tmp_path / "avg.png").exists()


@pytest.mark.slow
def test_cli_trace_over_a_dataset_prints_the_average_trace_and_draws_it(facts_model, tmp_path, capsys):
    """``trace --dataset FILE`` is :func:`average_trace` over the file's cases (same numbers), with its figure."""
    cases = _known_facts(facts_model, 4)
    data = tmp_path / "cases.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "subject": s, "target": t}) + "\n" for p, s, t in cases))
    from gpt2_interp.cli import main

    want = average_trace(facts_model, cases, kind=["hidden", "mlp"], samples=2, seed=3).to_dict()
    assert main(["trace", "--dataset", str(data), "--kind", "mlp", "--samples", "2", "--seed", "3", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["n_known"] == len(cases) and got["kinds"] == ["mlp"]
    torch.testing.assert_close(torch.tensor(got["scores"]), torch.tensor(want["scores"][1:]), atol=1e-6, rtol=1e-5)
    assert got["corrupted_score"] == pytest.approx(want["corrupted_score"][1:], abs=1e-6)
    out = tmp_path / "avg.png"
    assert main(["trace", "--dataset", str(data), "--samples", "2", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"average causal trace over {len(cases)} known of {len(cases)} facts")
    assert "last subject token" in text and out.stat().st_size > 10000
