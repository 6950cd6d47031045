"""Feature views: a latent's top contexts and density agree with encoding every activation by hand, its
logit effect is the decoder row through the final norm's gain and the unembedding, and latent search
finds the latents that promote a token or fire on a prompt."""

from __future__ import annotations

import pytest
import torch

from gpt2_interp.analysis.features.sae import SAE, SAEConfig
from gpt2_interp.analysis.features.sae_train import run_to_hook, token_windows
from gpt2_interp.analysis.features.sae_views import feature_view, latents_firing, latents_promoting, logit_effect

HOOK = "blocks.1.hook_resid_post"


@pytest.fixture
def sae():
    s = SAE(SAEConfig(d_in=64, d_sae=96, hook_name=HOOK, k=6), seed=2)
    with torch.no_grad():
        s.b_enc.normal_(0, 0.05)
    return s


def test_top_contexts_and_density_match_encoding_every_activation(tiny, sae):
    windows = token_windows(tiny, [" ".join(f"w{i}" for i in range(150))], 12)
    acts = sae.encode(run_to_hook(tiny, windows, HOOK))[:, 1:, :].detach()  # BOS positions left out
    latent = int((acts > 0).sum((0, 1)).argmax())
    a = acts[..., latent]
    view = feature_view(tiny, sae, latent, windows, top=5, context=3, batch=3)
    assert view.density == pytest.approx(float((a > 0).float().mean()))
    assert [c["max_act"] for c in view.contexts] == pytest.approx(a.flatten().sort(descending=True).values[:5].tolist())
    c = view.contexts[0]
    w, p = c["window"], c["position"]
    assert c["acts"][p] == pytest.approx(c["max_act"]) and len(c["tokens"]) == len(c["acts"]) <= 4
    assert c["tokens"][p] == tiny.tokenizer.decode([int(windows[w, 1:][a[w].argmax()])])
    assert sum(view.histogram["counts"]) == int((a > 0).sum())
    assert f"latent {latent}" in view.table()
    view.plot()


def test_logit_effect_is_the_decoder_row_through_the_final_gain_and_unembedding(tiny, sae):
    with torch.no_grad():
        tiny.ln_final.w.uniform_(0.5, 2.0)
    got = logit_effect(tiny, sae)
    want = torch.einsum("sd,d,dv->sv", sae.W_dec.detach(), tiny.ln_final.w.detach(), tiny.W_U.detach())
    assert torch.allclose(got, want, atol=1e-5)
    view = feature_view(tiny, sae, 3, token_windows(tiny, ["a b c d e f g h i j k l m n o p"], 8), n_tokens=3)
    best = want[3].topk(3)
    assert [t for t, _ in view.promoted] == [tiny.tokenizer.decode([i]) for i in best.indices.tolist()]
    assert view.promoted[0][1] == pytest.approx(float(best.values[0]), abs=1e-5)


def test_latent_search_by_promoted_token_and_by_prompt(tiny, sae):
    paris = tiny.tokenizer.encode_ids(" Paris")[0]
    found = latents_promoting(tiny, sae, " Paris", top=4)
    assert found.latents == logit_effect(tiny, sae)[:, paris].topk(4).indices.tolist()
    z = sae.encode(run_to_hook(tiny, tiny.to_tokens("The capital of France is"), HOOK))[0].detach()
    last = latents_firing(tiny, sae, "The capital of France is", top=3)
    assert last.latents == z[-1].topk(3).indices.tolist()
    anywhere = latents_firing(tiny, sae, "The capital of France is", top=3, position=None)
    assert anywhere.scores == pytest.approx(z[1:].max(0).values.topk(3).values.tolist())
    assert "latent" in anywhere.table()
    with pytest.raises(ValueError, match="give one token"):
        latents_promoting(tiny, sae, " Parisians of France")
    with pytest.raises(IndexError, match="latent 96"):
        feature_view(tiny, sae, 96, token_windows(tiny, ["a b c d e f g h"], 8))


def test_each_latent_a_search_returns_comes_with_the_tokens_it_promotes(tiny, sae):
    """``sae features --prompt`` lists latent ids: each with the tokens its decoder row promotes most (the row of
    :func:`logit_effect`), so the list says what each latent writes."""
    for found in (latents_firing(tiny, sae, "The capital of France is", top=3), latents_promoting(tiny, sae, " Paris")):
        effect = logit_effect(tiny, sae)[found.latents]
        expected = [[tiny.tokenizer.decode([i]) for i in row] for row in effect.topk(5, dim=-1).indices.tolist()]
        assert found.promotes == expected and len(found.promotes) == len(found.latents)
        table = found.table()
        assert "promotes" in table.splitlines()[1] and len(table.splitlines()) == 2 + len(found.latents)
        assert all(repr(toks[0]) in line for toks, line in zip(found.promotes, table.splitlines()[2:]))
    torch.testing.assert_close(logit_effect(tiny, sae, [4, 1]), logit_effect(tiny, sae)[[4, 1]])
