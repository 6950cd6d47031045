"""Sparse autoencoders: the encoder's maths by hand, splicing that leaves the model exact with the error
term and uses the reconstruction without it, latents reachable by every hook tool, files that reload
bit-exactly and refuse damage or the wrong model, training that learns and resumes, and the metrics
on an SAE whose reconstruction is exact by construction."""

from __future__ import annotations

import json

import pytest
import torch

from gpt2_interp.analysis.features.sae import SAE, SAEConfig
from gpt2_interp.analysis.features.sae_eval import evaluate_sae
from gpt2_interp.analysis.features.sae_train import (
    ActivationBuffer,
    SAETrainConfig,
    geometric_median,
    hook_width,
    norm_outliers,
    run_to_hook,
    text_source,
    token_windows,
    train_sae,
)
from gpt2_interp.io.integrity import IntegrityError
from gpt2_interp.model import HookedGPT2
from gpt2_interp.model.config import GPT2Config

HOOK = "blocks.0.hook_resid_post"
TEXTS = [
    "The quick brown fox jumps over the lazy dog. " * 24,
    "Paris is the capital of France and Rome is the capital of Italy. " * 20,
    "One two three four five six seven eight nine ten eleven twelve. " * 20,
]  # ~52 windows of 16 tokens: ~780 activations after the BOS positions


def exact_sae(d_in: int, hook: str = HOOK) -> SAE:
    """A ReLU SAE with latents ``[relu(x), relu(−x)]``: its reconstruction ``relu(x) − relu(−x)`` is ``x``."""
    sae = SAE(SAEConfig(d_in=d_in, d_sae=2 * d_in, hook_name=hook, architecture="relu"))
    eye = torch.eye(d_in)
    with torch.no_grad():
        sae.W_enc.copy_(torch.cat([eye, -eye], 1))
        sae.W_dec.copy_(torch.cat([eye, -eye], 0))
    return sae


def test_topk_latents_are_the_k_largest_relued_preactivations_computed_by_hand():
    sae = SAE(SAEConfig(d_in=3, d_sae=4, hook_name=HOOK, k=2), seed=1)
    with torch.no_grad():
        sae.b_dec.copy_(torch.tensor([1.0, 0.0, -1.0]))
        sae.b_enc.copy_(torch.tensor([0.0, 0.5, 0.0, -0.5]))
    x = torch.tensor([[2.0, 1.0, 0.0]])
    pre = (x - sae.b_dec) @ sae.W_enc + sae.b_enc
    want = torch.zeros(4)
    top = pre[0].argsort(descending=True)[:2]
    want[top] = pre[0, top].clamp_min(0)
    assert torch.equal(sae.encode(x)[0], want)
    assert torch.allclose(sae(x), want @ sae.W_dec + sae.b_dec)


def test_batchtopk_keeps_k_per_row_on_average_over_the_batch_and_uses_its_threshold_in_use():
    sae = SAE(SAEConfig(d_in=8, d_sae=32, hook_name=HOOK, architecture="batchtopk", k=3), seed=0)
    pre = torch.randn(5, 32)
    z = sae.activate(pre, batch=True)
    assert int((z > 0).sum()) <= 15 and torch.equal(z[z > 0], pre[z > 0])
    assert int((z != 0).sum()) == 15 or int((pre > 0).sum()) < 15
    assert sae.threshold is not None
    sae.threshold.fill_(0.5)
    assert torch.equal(sae.activate(pre), pre * (pre > 0.5))


def test_splice_with_error_term_leaves_logits_unchanged_and_exposes_saelens_hook_names(tiny):
    sae = SAE(SAEConfig(d_in=64, d_sae=128, hook_name=HOOK, k=4), seed=0)
    tokens = tiny.to_tokens("The capital of France is Paris")
    clean = tiny(tokens)
    with tiny.splice(sae, use_error_term=True):
        logits, cache = tiny.run_with_cache(tokens, names_filter=lambda n: "hook_sae" in n)
    assert (logits - clean).abs().max() <= 1e-5
    names = [f"{HOOK}.hook_sae_{n}" for n in ("input", "acts_pre", "acts_post", "recons", "error", "output")]
    assert list(cache.keys()) == names
    assert torch.equal(cache[f"{HOOK}.hook_sae_acts_post"], sae.encode(cache[f"{HOOK}.hook_sae_input"]))
    assert not any("hook_sae" in n for n in tiny.hook_names()), "the splice's hook points leave with it"


def test_splice_without_error_term_runs_the_reconstruction_and_latent_patches_act_downstream(tiny):
    sae = SAE(SAEConfig(d_in=64, d_sae=128, hook_name=HOOK, k=4), seed=0)
    tokens = tiny.to_tokens("The capital of France is Paris")

    def by_hand(latent_edit=None):
        def replace(x, hook):
            z = sae.encode(x)
            if latent_edit is not None:
                z = latent_edit(z)
            return sae.decode(z)

        return tiny.run_with_hooks(tokens, fwd_hooks=[(HOOK, replace)])

    with torch.no_grad():
        want = by_hand()
        zero0 = by_hand(lambda z: z * (torch.arange(128) != 7))
        with tiny.splice(sae):
            assert torch.allclose(tiny(tokens), want, atol=1e-5)

            def ablate(z, hook):
                z = z.clone()
                z[..., 7] = 0
                return z

            patched = tiny.run_with_hooks(tokens, fwd_hooks=[(f"{HOOK}.hook_sae_acts_post", ablate)])
    assert torch.allclose(patched, zero0, atol=1e-5)
    assert not torch.allclose(patched, want), "latent 7 is active somewhere, so ablating it changes the logits"


def test_gradients_reach_the_latents_through_the_splice(tiny):
    sae = SAE(SAEConfig(d_in=64, d_sae=128, hook_name=HOOK, k=4), seed=0)
    with tiny.splice(sae, use_error_term=True), tiny.hooks():
        _, cache = tiny.run_with_cache(
            "Hello world", names_filter=f"{HOOK}.hook_sae_acts_post", incl_bwd=True, return_type="loss"
        )
    g = cache[f"{HOOK}.hook_sae_acts_post_grad"]
    assert g.shape == (1, 3, 128) and g.abs().sum() > 0


def test_a_second_splice_at_the_same_site_is_refused(tiny):
    sae = SAE(SAEConfig(d_in=64, d_sae=128, hook_name=HOOK, k=4), seed=0)
    with tiny.splice(sae), pytest.raises(ValueError, match="already spliced"):
        tiny.splice(sae)


def test_saved_sae_reloads_bit_exactly_and_refuses_damage_and_other_weights(tiny, tmp_path):
    sae = SAE(SAEConfig(d_in=64, d_sae=96, hook_name=HOOK, k=5), seed=3)
    with torch.no_grad():
        sae.b_dec.normal_()
        sae.b_enc.normal_()
    folder = sae.save(tmp_path / "sae")
    back = SAE.load(folder, tiny)
    for (n, a), (_, b) in zip(sae.saelens_state_dict().items(), back.saelens_state_dict().items()):
        assert torch.equal(a, b), n
    assert back.cfg == sae.cfg
    cfg = json.loads((folder / "cfg.json").read_text())
    cfg["metadata"]["gpt2_interp"]["k"] = 6
    (folder / "cfg.json").write_text(json.dumps(cfg))
    with pytest.raises(IntegrityError, match="differs"):
        SAE.load(folder)
    sae.cfg.base_fingerprint = "0" * 64
    sae.save(tmp_path / "other")
    with pytest.raises(ValueError, match="was trained on"):
        SAE.load(tmp_path / "other", tiny)
    with pytest.raises(FileNotFoundError, match=r"cfg\.json"):
        SAE.load(tmp_path / "nowhere")


def test_wrong_width_and_bad_settings_are_refused_clearly(tiny):
    sae = SAE(SAEConfig(d_in=32, d_sae=64, hook_name=HOOK, k=4))
    with pytest.raises(ValueError, match="d_in=32"):
        sae.encode(torch.zeros(2, 64))
    with pytest.raises(ValueError, match="k must be in"):
        SAEConfig(d_in=8, d_sae=4, hook_name=HOOK, k=5)
    with pytest.raises(ValueError, match="architecture"):
        SAETrainConfig(hook_name=HOOK, architecture="gated")  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="unknown hook name"):
        hook_width(tiny, "blocks.0.hook_resid_psot")


def test_geometric_median_of_points_with_an_outlier_is_the_middle_point():
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [1.0, 1.0], [1.0, -1.0], [100.0, 0.0]])
    # the median of a cross with an extra point far to the right moves toward it, but stays near (1, 0)
    m = geometric_median(x)
    assert m[1].abs() < 1e-4 and 1.0 < m[0] < 1.5
    sym = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]]) + torch.tensor([3.0, -2.0])
    assert torch.allclose(geometric_median(sym), torch.tensor([3.0, -2.0]), atol=1e-5)


def test_the_facts_text_source_is_the_fact_models_training_corpus(tiny):
    from gpt2_interp.facts.base import FactBase
    from gpt2_interp.facts.corpus import training_texts

    docs = text_source(tiny, "facts")
    assert docs == training_texts(FactBase.load()) and len(docs) > 1000
    with pytest.raises(ValueError, match="'facts'"):
        text_source(tiny, "no-such-source")


def test_the_buffer_hands_out_every_activation_once_bos_left_out(tiny):
    windows = token_windows(tiny, [" ".join(str(i) for i in range(200))], 16)  # no two windows alike
    assert (windows[:, 0] == tiny.tokenizer.bos_id).all()
    acts = run_to_hook(tiny, windows, HOOK)[:, 1:].reshape(-1, 64)
    got = torch.cat(list(ActivationBuffer(tiny, HOOK, windows, batch_size=15, buffer_tokens=60, forward_batch=2)))
    assert len(got) == len(acts) // 15 * 15
    # every handed-out row is one of the activations, and none is handed out twice
    dist = torch.cdist(got, acts)
    assert dist.min(1).values.max() < 1e-3  # batch-size rounding; distinct activations are ~0.3 apart
    assert len(set(dist.argmin(1).tolist())) == len(got)


def test_several_epochs_hand_out_every_activation_once_per_pass_and_the_cache_runs_the_model_once(tiny):
    windows = token_windows(tiny, [" ".join(str(i) for i in range(200))], 16)
    acts = run_to_hook(tiny, windows, HOOK)[:, 1:].reshape(-1, 64)
    calls: list[int] = []
    for cache in (False, True):
        buf = ActivationBuffer(
            tiny, HOOK, windows, batch_size=5, buffer_tokens=60, forward_batch=3, epochs=3, cache=cache
        )
        calls.clear()
        with tiny.hooks([(HOOK, lambda x, hook: calls.append(len(x)))]):
            got = torch.cat(list(buf))
        # three passes: 3 × the activations, each handed out three times (batch size 5 divides 3 × 15 × n)
        assert len(got) == 3 * len(acts) and buf.windows_read == 3 * len(windows)
        counts = torch.bincount(torch.cdist(got, acts).argmin(1), minlength=len(acts))
        assert (counts == 3).all()
        assert sum(calls) == (1 if cache else 3) * len(windows)  # the cache runs the model over each window once


def test_training_lowers_the_reconstruction_error_keeps_decoder_rows_unit_norm_and_resumes(tiny, tmp_path):
    windows = token_windows(tiny, TEXTS, 16)
    cfg = SAETrainConfig(
        hook_name=HOOK, expansion=2, k=8, tokens=600, batch_size=50, buffer_tokens=200, lr=3e-3, checkpoint_every=1
    )
    sae, log = train_sae(tiny, cfg, windows=windows, progress=False)
    assert log.steps == 12 and log.fvu[-1] < 0.85 * log.fvu[0]
    assert torch.allclose(sae.W_dec.norm(dim=-1), torch.ones(128), atol=1e-5)
    assert sae.cfg.d_sae == 128 and sae.cfg.base_fingerprint
    # a run cut short (its text runs out) resumes from its checkpoint on the rest of the text
    ckpt = tmp_path / "ckpt"
    _, first = train_sae(tiny, cfg, windows=windows[:4], checkpoint=ckpt, progress=False)
    assert first.steps < 12
    _, second = train_sae(tiny, cfg, windows=windows, checkpoint=ckpt, progress=False)
    assert second.resumed_from == first.steps and second.steps == 12
    other = SAETrainConfig(**{**cfg.__dict__, "k": 4})
    with pytest.raises(ValueError, match="other settings"):
        train_sae(tiny, other, windows=windows, checkpoint=ckpt, progress=False)


def test_relu_and_batchtopk_train_and_batchtopk_learns_a_threshold(tiny):
    windows = token_windows(tiny, TEXTS, 16)
    for arch in ("relu", "batchtopk"):
        k = None if arch == "relu" else 8  # a relu SAE has no k
        cfg = SAETrainConfig(hook_name=HOOK, expansion=2, k=k, tokens=300, batch_size=50, lr=3e-3, architecture=arch)
        sae, log = train_sae(tiny, cfg, windows=windows, progress=False)
        assert log.fvu[-1] < log.fvu[0], arch
    assert sae.threshold is not None and float(sae.threshold.min()) > 0


def test_metrics_of_an_exact_sae_recover_all_loss_and_variance(tiny):
    windows = token_windows(tiny, TEXTS, 16)
    sae = exact_sae(64)
    ev = evaluate_sae(tiny, sae, windows, batch=4)
    assert ev.variance_explained == pytest.approx(1.0, abs=1e-5)
    assert ev.ce_spliced == pytest.approx(ev.ce_clean, abs=1e-5)
    assert ev.ce_recovered == pytest.approx(1.0, abs=1e-4)
    acts = run_to_hook(tiny, windows, HOOK)[:, 1:].reshape(-1, 64)
    assert ev.tokens == len(acts) and ev.l0 == pytest.approx(64.0)  # one of relu(x), relu(−x) fires per dim
    assert ev.dead_fraction == 0.0 and ev.dense_fraction == 1.0
    ablated = tiny.run_with_hooks(
        windows,
        fwd_hooks=[(HOOK, lambda x, hook: torch.cat([x[:, :1], torch.zeros_like(x[:, 1:])], 1))],
        return_type="loss",
        loss_per_token=True,
    )
    assert ev.ce_zero == pytest.approx(float(ablated[:, 1:].mean().detach()), rel=1e-5)
    assert "ce_recovered" in ev.table()


def test_norm_outliers_are_left_out_of_training_data_and_metrics_and_kept_clean_in_the_ablations(tiny):
    assert norm_outliers(torch.tensor([[1.0, 0], [0, 1.1], [0.9, 0], [30.0, 0]]), 10).tolist() == [0, 0, 0, 1]
    windows = token_windows(tiny, TEXTS, 16)

    def massive(x, hook):  # a massive activation at the first position after BOS, as Llama-family models make
        x = x.clone()
        x[:, 1] *= 1000
        return x

    with tiny.hooks([("blocks.0.hook_resid_pre", massive)]):
        acts = run_to_hook(tiny, windows, HOOK)[:, 2:].reshape(-1, 64)
        buf = ActivationBuffer(tiny, HOOK, windows, batch_size=14, buffer_tokens=56, forward_batch=4, outlier_ratio=10)
        got = torch.cat(list(buf))
        assert buf.outliers == len(windows) and len(got) == len(acts)  # 14 per window: every position 2..15
        assert torch.cdist(got, acts).min(1).values.max() < 1e-3
        ev = evaluate_sae(tiny, exact_sae(64), windows, batch=4, outlier_ratio=10)
        assert ev.outliers == len(windows) and ev.tokens == len(acts)
        assert ev.ce_recovered == pytest.approx(1.0, abs=1e-4)
        # the zero ablation keeps positions 0 and 1 clean
        ablated = tiny.run_with_hooks(
            windows,
            fwd_hooks=[(HOOK, lambda x, hook: torch.cat([x[:, :2], torch.zeros_like(x[:, 2:])], 1))],
            return_type="loss",
            loss_per_token=True,
        )
    assert ev.ce_zero == pytest.approx(float(ablated[:, 1:].mean().detach()), rel=1e-5)


def test_an_sae_whose_hook_the_model_lacks_is_refused(tiny):
    other = HookedGPT2(GPT2Config(n_layer=1, d_model=64, n_head=4, d_mlp=256, n_ctx=64), seed=0)
    sae = SAE(SAEConfig(d_in=64, d_sae=64, hook_name="blocks.1.hook_resid_post", k=4))
    with pytest.raises(ValueError, match="no hook point"):
        sae.check_model(other)


def test_attribution_and_patching_run_on_the_latents_and_atp_equals_its_hand_computation(facts_model):
    """AtP over the spliced latents: per position, the sum over latents of (clean − corrupted activation) ×
    ∂metric/∂activation at the corrupted run, computed here by hand with a gradient hook; exact patching of
    the latent hook point finds the same position (the subject's) carrying the difference."""
    from gpt2_interp.analysis.attribution import attribute
    from gpt2_interp.analysis.patching import logit_diff, patch

    m = facts_model
    hook = "blocks.3.hook_resid_pre"
    name = f"{hook}.hook_sae_acts_post"
    sae = SAE(SAEConfig(d_in=m.cfg.d_model, d_sae=512, hook_name=hook, k=16), seed=0)
    clean, corr = "The capital of France is", "The capital of Italy is"
    ans, wrong = m.to_single_token(" Paris"), m.to_single_token(" Rome")
    metric = logit_diff(ans, wrong)
    with m.splice(sae, use_error_term=True):
        atp = attribute(m, [clean], [corr], metric, hook=name, progress=False)
        exact = patch(m, [clean], [corr], metric, hook=name, progress=False)
        with torch.no_grad():
            _, cache = m.run_with_cache(m.to_tokens(clean), names_filter=name)
        kept: dict[str, torch.Tensor] = {}

        def keep(a: torch.Tensor, hook) -> torch.Tensor:
            a.retain_grad()
            kept["a"] = a
            return a

        with torch.enable_grad(), m.hooks([(name, keep)]):
            logits = m(m.to_tokens(corr))
            (logits[0, -1, ans] - logits[0, -1, wrong]).backward()
        m.zero_grad()
    by_hand = ((cache[name][0] - kept["a"][0].detach()) * kept["a"].grad[0]).sum(-1)
    # attribute() reports the estimated metric of the patched run: the corrupted metric plus the estimate
    torch.testing.assert_close(atp.values[0] - atp.corrupted_metric, by_hand, rtol=1e-4, atol=1e-4)
    # the subject position carries the difference: patching it alone moves the metric most
    assert int(exact.values[0].argmax()) == int(by_hand.argmax()) == 4
    assert exact.values[0, 4] > exact.corrupted_metric + 1.0  # (the error term stays the corrupted run's)
