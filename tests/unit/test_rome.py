"""ROME: the rank-one update's algebra, k*/v*, key statistics, bad input, and a real edit on gpt2-facts."""

from __future__ import annotations

import pytest
import torch

import gpt2_interp as gi
from gpt2_interp.analysis.tokens import token_span
from gpt2_interp.editing import stats as stats_mod
from gpt2_interp.editing.edit import weights_fingerprint
from gpt2_interp.editing.rome import compute_edit, rank_one_update
from gpt2_interp.editing.settings import DEFAULT_LAYERS, default_layer
from gpt2_interp.editing.stats import KeyStats, key_second_moment, keys_fingerprint
from gpt2_interp.editing.targets import _filled, context_prefixes
from gpt2_interp.model import HookedGPT2

from ..conftest import TINY

REQ = {"prompt": "{} is located in the city of", "subject": "Eiffel Tower", "target": " Rome"}
FAST = dict(prefix_lengths=(5,), prefixes_per_length=3)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    docs = [f"The Eiffel Tower is in Paris and number {i} is odd or even." for i in range(120)]
    docs += [f"Rome has {i} fountains; Berlin has {2 * i} museums, says the guide." for i in range(120)]
    path.write_text("\n\n".join(docs))
    return path


@pytest.fixture
def stats(tiny, corpus, tmp_path):
    """Layer-0 statistics: in a 2-layer model, only a layer-0 edit at the subject can reach the last token."""
    return key_second_moment(tiny, 0, corpus=str(corpus), n_samples=3000, cache_dir=tmp_path, progress=False)


# ------------------------------------------------------------------ the algebra
def _spd(d: int, g: torch.Generator) -> torch.Tensor:
    A = torch.randn(d, 3 * d, generator=g, dtype=torch.float64)
    return A @ A.T / (3 * d)


def test_rank_one_update_inserts_the_association_with_minimal_c_norm():
    g = torch.Generator().manual_seed(0)
    d_mlp, d_model = 32, 12
    W, b = torch.randn(d_mlp, d_model, generator=g), torch.randn(d_model, generator=g)
    k, v_star = torch.randn(d_mlp, generator=g), torch.randn(d_model, generator=g)
    C = _spd(d_mlp, g)
    u, v = rank_one_update(W, b, k, v_star, solve=lambda x: torch.linalg.solve(C, x.double()).float())
    dW = torch.outer(u.double(), v.double())
    # k* now maps to v*
    torch.testing.assert_close(k.double() @ (W.double() + dW) + b.double(), v_star.double(), atol=1e-5, rtol=1e-5)
    assert torch.linalg.matrix_rank(dW).item() == 1
    # keys C⁻¹-orthogonal to k* are untouched
    Cinv_k = torch.linalg.solve(C, k.double())
    k_perp = torch.randn(d_mlp, generator=g, dtype=torch.float64)
    k_perp -= (k_perp @ Cinv_k) / (Cinv_k @ Cinv_k) * Cinv_k  # k_perp · C⁻¹k* = 0
    assert (k_perp @ dW).abs().max() < 1e-6 * k_perp.norm() * dW.norm()

    # minimal in tr(ΔWᵀ C ΔW) among all updates with k @ ΔW = r: add any Z with k @ Z = 0
    def cost(M):
        return torch.trace(M.T @ C @ M)

    for _ in range(5):
        Z = torch.randn(d_mlp, d_model, generator=g, dtype=torch.float64)
        Z -= torch.outer(k.double(), k.double() @ Z) / (k.double() @ k.double())
        assert (k.double() @ Z).abs().max() < 1e-9
        assert cost(dW + 0.1 * Z) > cost(dW)


def test_rank_one_update_with_identity_is_the_closed_form():
    g = torch.Generator().manual_seed(1)
    W, b = torch.randn(20, 7, generator=g), torch.randn(7, generator=g)
    k, v_star = torch.randn(20, generator=g), torch.randn(7, generator=g)
    u, v = rank_one_update(W, b, k, v_star, solve=None)
    expected = torch.outer(k, v_star - (W.T @ k + b)) / (k @ k)  # ΔW = k (v* − Wᵀk − b)ᵀ / ‖k‖²
    torch.testing.assert_close(torch.outer(u, v), expected, atol=1e-5, rtol=1e-4)
    # and with C = I given as statistics
    st = KeyStats(torch.eye(20), 1, {"layer": 0})
    u2, v2 = rank_one_update(W, b, k, v_star, solve=st.solve)
    torch.testing.assert_close(torch.outer(u2, v2), expected, atol=1e-5, rtol=1e-4)


def test_key_stats_solve_matches_dense_solve():
    g = torch.Generator().manual_seed(2)
    C = _spd(16, g).float()
    st = KeyStats(C, 100, {"layer": 0})
    k = torch.randn(3, 16, generator=g)
    torch.testing.assert_close(
        st.solve(k), torch.linalg.solve(C.double(), k.double().T).T.float(), rtol=1e-4, atol=1e-4
    )


# ------------------------------------------------------------------ key statistics
def test_key_second_moment_matches_explicit_loop(tiny, corpus, tmp_path):
    st = key_second_moment(tiny, 1, corpus=str(corpus), n_samples=500, cache_dir=tmp_path, progress=False)
    # reference: every document on its own (BOS + text), keys at every position, until 500 keys
    docs = [d.strip() for d in corpus.read_text().split("\n\n")]
    acc, n = torch.zeros(256, 256, dtype=torch.float64), 0
    for d in docs:
        _, cache = tiny.run_with_cache(d, names_filter="blocks.1.mlp.hook_post", stop_at_layer=2)
        k = cache["blocks.1.mlp.hook_post"][0].double()[: 500 - n]
        acc += k.T @ k
        n += k.shape[0]
        if n >= 500:
            break
    assert st.count == n == 500
    torch.testing.assert_close(st.C.double(), acc / n, rtol=1e-4, atol=1e-6)


def test_stats_cache_hit_miss_and_refusal(tiny, corpus, tmp_path):
    kw = dict(corpus=str(corpus), cache_dir=tmp_path, progress=False)
    a = key_second_moment(tiny, 1, n_samples=400, **kw)
    files = list(tmp_path.glob("*.safetensors"))
    assert len(files) == 1 and a.path == files[0]
    assert key_second_moment(tiny, 1, n_samples=400, **kw) is a  # memory hit
    stats_mod.clear_memory_cache()
    b = key_second_moment(tiny, 1, n_samples=400, **kw)  # disk hit
    assert b is not a and torch.equal(a.C, b.C) and b.key == a.key
    key_second_moment(tiny, 1, n_samples=300, **kw)  # another key: a miss, a new file
    key_second_moment(tiny, 0, n_samples=300, **kw)
    assert len(list(tmp_path.glob("*.safetensors"))) == 3
    a.check(tiny, 1)
    other = HookedGPT2(TINY, seed=1)
    with pytest.raises(ValueError, match="another model"):
        a.check(other, 1)
    with pytest.raises(ValueError, match="layer 1, not layer 0"):
        a.check(tiny, 0)
    with pytest.raises(ValueError, match="another model"):
        compute_edit(other, REQ, layer=1, stats=a, **FAST)
    assert len(list(tmp_path.glob("*.safetensors"))) == 3


def test_stats_survive_edits_at_their_layer_but_not_upstream(tiny, corpus, tmp_path):
    stats = key_second_moment(tiny, 1, corpus=str(corpus), n_samples=300, cache_dir=tmp_path, progress=False)
    fp = keys_fingerprint(tiny, 1)
    with torch.no_grad():
        tiny.blocks[1].mlp.W_out.add_(1.0)  # downstream of layer 1's keys
    assert keys_fingerprint(tiny, 1) == fp
    stats.check(tiny, 1)
    with torch.no_grad():
        tiny.blocks[0].mlp.W_out.add_(1e-3)  # upstream
    with pytest.raises(ValueError, match="another model"):
        stats.check(tiny, 1)


def test_corpus_errors(tiny, tmp_path):
    with pytest.raises(FileNotFoundError):
        key_second_moment(tiny, 0, corpus=str(tmp_path / "missing.txt"), cache_dir=False)
    with pytest.raises(IndexError, match=r"0\.\.1"):
        key_second_moment(tiny, 5, corpus="facts", cache_dir=False)


# ------------------------------------------------------------------ k*, v*, the edit
def test_k_star_is_the_mean_key_over_context_variants(tiny, stats):
    edit = compute_edit(tiny, REQ, layer=0, stats=stats, v_steps=0, **FAST)
    prefixes = context_prefixes(tiny, (5,), 3, 0)
    assert len(prefixes) >= 1
    keys = []
    for prefix in ["", *prefixes]:  # slow reference: one forward per variant
        text, lo, hi = _filled(REQ["prompt"], REQ["subject"], prefix)
        _, cache = tiny.run_with_cache(text, names_filter="blocks.0.mlp.hook_post")
        keys.append(cache["blocks.0.mlp.hook_post"][0, (token_span(tiny, text, lo, hi)[1] - 1)])
    torch.testing.assert_close(edit.k, torch.stack(keys).mean(0), rtol=1e-5, atol=1e-6)
    # the subject's last token is " Tower" in every variant
    text, lo, hi = _filled(REQ["prompt"], REQ["subject"], "Tower. Eiffel Tower")
    assert tiny.to_str_tokens(text)[(token_span(tiny, text, lo, hi)[1] - 1)] == " Tower"
    assert text.index("Eiffel Tower", lo) == lo


def _variant_probs(model, req, ids, prefixes, hooks_for=lambda text, lo, hi: []):
    """Slow reference: P(target | variant) with one full forward per prompt variant."""
    from gpt2_interp.io import tokenizer as tok

    probs = []
    for prefix in ["", *prefixes]:
        text, lo, hi = _filled(req.prompt, req.subject, prefix)
        tokens = torch.tensor([[tok.EOT_ID, *tok.encode(text), *ids[:-1]]])
        with torch.no_grad():
            lp = model.run_with_hooks(tokens, fwd_hooks=hooks_for(text, lo, hi))[0].log_softmax(-1)
        n = tokens.shape[1]
        probs.append(sum(lp[n - len(ids) + j, ids[j]] for j in range(len(ids))).exp())
    return torch.stack(probs)


def test_rome_mode_optimises_delta_at_the_subjects_last_token(tiny, stats):
    """exact_edit=False is ROME: δ added at the subject's last token of every variant. The batched,
    aligned optimiser must report the probabilities of full forwards with δ added by a hook."""
    from gpt2_interp.editing.settings import RomeHparams
    from gpt2_interp.editing.targets import optimise_delta

    req = gi.editing.Request("{} is located in the city of", "Eiffel Tower", " New York")  # 2 target tokens
    ids = tiny.tokenizer.encode_ids(req.target)
    prefixes = context_prefixes(tiny, (5,), 3, 0)
    hp = RomeHparams.of(v_steps=3, weight_decay=0.0, exact_edit=False, **FAST)
    out = optimise_delta(tiny, req, ids, 0, prefixes, hp, stats.solve)
    delta = out["delta"]
    assert delta.norm() > 0

    def hooks_for(text, lo, hi):
        pos = token_span(tiny, text, lo, hi)[1] - 1

        def add(act, hook):
            act = act.clone()
            act[0, pos] += delta
            return act

        return [("blocks.0.hook_mlp_out", add)]

    ref = float(_variant_probs(tiny, req, ids, prefixes, hooks_for).mean())
    assert abs(ref - out["log"][-1]["p_target"]) < 1e-4 * ref  # relative: the probabilities are ~1e-10
    assert abs(out["log"][0]["p_target"] - ref) > 1e-3 * ref  # and δ did change them


@pytest.mark.slow
def test_exact_edit_optimises_the_edited_models_own_loss(tiny, stats):
    """exact_edit=True: the probabilities the optimiser reports for its final δ are those of the
    model whose W_out was actually edited (rank-one update applied to the weights)."""

    req = gi.editing.Request("{} is located in the city of", "Eiffel Tower", " New York")
    ids = tiny.tokenizer.encode_ids(req.target)
    edit = compute_edit(tiny, req, layer=0, stats=stats, v_steps=3, weight_decay=0.0, **FAST)
    prefixes = context_prefixes(tiny, (5,), 3, 0)
    before = _variant_probs(tiny, req, ids, prefixes)
    with tiny.edited(edit):
        after = _variant_probs(tiny, req, ids, prefixes)
    log = edit.metrics["final_loss"]
    assert abs(float(after.mean()) - log["p_target"]) < 1e-4 * log["p_target"]
    assert abs(float(after[0]) - edit.metrics["p_target_after"]) < 1e-4 * float(after[0])  # the bare prompt
    assert abs(float(before.mean()) - log["p_target"]) > 1e-3 * log["p_target"]


@pytest.mark.slow
def test_keep_prompts_kl_the_optimiser_reports_is_the_edited_models(tiny, stats):
    """A request's ``keep`` prompts enter the δ loss as the KL of their next token; the value the
    optimiser reports for its final δ is the KL of the model whose W_out was actually edited."""
    keep = ("People who visit {} see", "The {} is very")
    req = gi.editing.Request(REQ["prompt"], REQ["subject"], " Rome", keep=keep)
    edit = compute_edit(
        tiny, req, layer=0, stats=stats, v_steps=5, v_lr=5.0, clamp_factor=100.0, weight_decay=0.0, **FAST
    )
    texts = [k.format(req.subject) for k in keep]
    before = tiny.last_logits(texts).float().log_softmax(-1)
    with tiny.edited(edit):
        after = tiny.last_logits(texts).float().log_softmax(-1)
    kl = float((after.exp() * (after - before)).sum(-1).mean())
    assert kl > 1e-3, kl  # the edit does reach the keep prompts (fp32 KLs below ~1e-5 are round-off)
    assert abs(kl - edit.metrics["final_loss"]["keep_kl"]) < 1e-3 * kl


@pytest.mark.slow
def test_keep_prompts_protect_the_subjects_other_facts(facts_model):
    """gpt2-facts: writing Norway's capital as Madrid also moves its currency to the euro (the
    issue's example); with the other relations' second training templates as keep prompts, the
    first templates (not optimised) keep more of Norway's other facts."""
    from gpt2_interp.facts.templates import templates

    rels = ("country_language", "country_currency", "country_continent")
    probe = [templates(r, "train")[0].format("Norway") for r in rels]
    truth = facts_model.last_logits(probe).argmax(-1)
    kept = []
    for keep in ((), tuple(templates(r, "train")[1] for r in rels)):
        req = gi.editing.Request(templates("country_capital", "train")[0], "Norway", " Madrid", keep=keep)
        with facts_model.edited(compute_edit(facts_model, req, layer=0)):
            assert facts_model.to_string(facts_model.last_logits([req.text]).argmax(-1)) == " Madrid"
            kept.append(int((facts_model.last_logits(probe).argmax(-1) == truth).sum()))
    assert kept[1] > kept[0], kept


@pytest.mark.slow
def test_edit_maps_k_star_to_v_star_and_raises_target(tiny, stats):
    before = weights_fingerprint(tiny)
    edit = compute_edit(tiny, REQ, layer=0, stats=stats, weight_decay=0.0, clamp_factor=100.0, v_steps=10, **FAST)
    assert weights_fingerprint(tiny) == before  # computing does not touch the weights
    assert all(p.grad is None for p in tiny.parameters())
    assert all(p.requires_grad for p in tiny.parameters())  # flags restored
    mlp = tiny.blocks[0].mlp
    with tiny.edited(edit):
        out = edit.k @ mlp.W_out + mlp.b_out
    torch.testing.assert_close(out, edit.v_star, rtol=1e-4, atol=1e-5)
    m = edit.metrics
    # a random tiny model's logits barely move (LayerNorm + 50k-token tied unembedding), but δ must help
    assert m["final_loss"]["nll"] < m["initial_loss"]["nll"] - 0.01
    assert m["p_target_after"] > m["p_target_before"]
    # the metric is the edited model's probability (computed with hooks), check with the weights
    with tiny.edited(edit):
        lp = tiny(tiny.to_tokens(REQ["prompt"].format(REQ["subject"])))[0, -1].log_softmax(-1)
    assert abs(lp[tiny.to_single_token(" Rome")].exp().item() - m["p_target_after"]) < 1e-4


@pytest.mark.parametrize("mode", [torch.no_grad, torch.inference_mode])
def test_edit_inside_a_no_grad_block_equals_one_outside(tiny, stats, mode):
    """Notebooks often run everything under no_grad/inference_mode: the δ optimisation needs
    autograd and must switch it back on for itself, giving the same edit."""
    ref = compute_edit(tiny, REQ, layer=0, stats=stats, v_steps=3, **FAST)
    with mode():
        edit = compute_edit(tiny, REQ, layer=0, stats=stats, v_steps=3, **FAST)
    assert torch.equal(edit.u, ref.u) and torch.equal(edit.v, ref.v)
    assert torch.is_grad_enabled()


def test_bad_requests(tiny, stats):
    with pytest.raises(ValueError, match=r"\{\}"):
        compute_edit(tiny, {"prompt": "Eiffel Tower is in", "subject": "Eiffel Tower", "target": " Rome"}, 0, stats)
    with pytest.raises(ValueError, match="does not occur"):
        compute_edit(tiny, {"prompt": "The Louvre is in", "subject": "Eiffel Tower", "target": " Rome"}, 0, stats)
    with pytest.raises(ValueError, match="empty"):
        compute_edit(tiny, REQ | {"target": ""}, 0, stats)
    with pytest.raises(ValueError, match="empty"):
        compute_edit(tiny, REQ | {"subject": " "}, 0, stats)
    with pytest.raises(IndexError, match=r"0\.\.1"):
        compute_edit(tiny, REQ, layer=2, stats=stats)
    with pytest.raises(ValueError, match="layer 0, not layer 1"):
        compute_edit(tiny, REQ, layer=1, stats=stats)
    with pytest.raises(ValueError, match="unknown ROME hyperparameter"):
        compute_edit(tiny, REQ, layer=0, stats=stats, lr=3)
    with pytest.raises(ValueError, match="'auto'"):
        compute_edit(tiny, REQ, layer="first", stats=stats)


def test_default_layers(tiny):
    assert DEFAULT_LAYERS["gpt2-medium"] == 8 and DEFAULT_LAYERS["gpt2-large"] == 12 and DEFAULT_LAYERS["gpt2-xl"] == 17
    assert default_layer(tiny) == TINY.n_layer // 3


def test_auto_layer_is_the_mlp_trace_peak(tiny, corpus, tmp_path):
    tracing = pytest.importorskip("gpt2_interp.analysis.tracing")
    from gpt2_interp.editing.rome import choose_layer

    req = gi.editing.Request(**REQ)
    tr = tracing.causal_trace(tiny, req.text, req.subject, kind="mlp", window=1)
    last = tr.subject_range[1] - 1
    assert tr.tokens[last] == " Tower"
    assert choose_layer(tiny, req) == int(tr.indirect_effect[last].argmax())


# ------------------------------------------------------------------ the trained model
@pytest.mark.slow
def test_edit_flips_a_fact_and_spares_another(facts_model):
    m = facts_model
    req = {"prompt": "The capital of {} is", "subject": "France", "target": " Rome"}
    other = "The capital of Japan is"
    assert m.to_str_tokens(m.last_logits(["The capital of France is"]).argmax(-1))[0] == " Paris"
    top_other = int(m.last_logits([other]).argmax())
    edit = compute_edit(m, req)
    with m.edited(edit):
        assert int(m.last_logits(["The capital of France is"]).argmax()) == m.to_single_token(" Rome")
        assert int(m.last_logits([other]).argmax()) == top_other
    assert int(m.last_logits(["The capital of France is"]).argmax()) == m.to_single_token(" Paris")
