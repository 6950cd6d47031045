"""SAELens's on-disk format both ways, checked with the real ``sae-lens`` package: it loads our saved
SAEs and encodes activations to the same latents, and we load its saved SAEs to the same latents and
reconstructions (TopK, also one rescaled by its decoder norms, ReLU/"standard", BatchTopK as JumpReLU)."""

from __future__ import annotations

import pytest
import torch

from gpt2_interp.analysis.features.sae import SAE, SAEConfig

sae_lens = pytest.importorskip("sae_lens")

HOOK = "blocks.2.hook_resid_post"


def _ours(architecture: str) -> SAE:
    sae = SAE(SAEConfig(d_in=48, d_sae=192, hook_name=HOOK, architecture=architecture, k=7), seed=0)
    with torch.no_grad():
        sae.b_enc.normal_(0, 0.1)
        sae.b_dec.normal_(0, 0.5)
        if sae.threshold is not None:
            sae.threshold.uniform_(0.0, 0.3)
    return sae


@pytest.mark.parametrize("architecture", ["topk", "relu", "batchtopk"])
def test_saelens_loads_our_sae_to_the_same_latents(tmp_path, architecture):
    ours = _ours(architecture)
    folder = ours.save(tmp_path / architecture)
    theirs = sae_lens.SAE.load_from_disk(folder)
    assert theirs.cfg.metadata.hook_name == HOOK
    x = torch.randn(64, 48) * 3
    with torch.no_grad():
        z_ours, z_theirs = ours.encode(x), theirs.encode(x)
        assert (z_ours - z_theirs).abs().max() <= 1e-6
        assert (ours(x) - theirs.decode(z_theirs)).abs().max() <= 1e-5
    assert int((z_ours > 0).sum()) > 0


def _theirs(kind: str):
    if kind == "topk":
        cfg = sae_lens.TopKSAEConfig(d_in=32, d_sae=128, k=5)
        return sae_lens.TopKSAE(cfg)
    if kind == "topk_training":  # trained TopK SAEs select latents by h·‖W_dec row‖
        return sae_lens.TopKTrainingSAE(sae_lens.TopKTrainingSAEConfig(d_in=32, d_sae=128, k=5))
    if kind == "standard":
        return sae_lens.StandardSAE(sae_lens.StandardSAEConfig(d_in=32, d_sae=128))
    return sae_lens.JumpReLUSAE(sae_lens.JumpReLUSAEConfig(d_in=32, d_sae=128))


@pytest.mark.parametrize("kind", ["topk", "topk_training", "standard", "jumprelu"])
def test_we_load_saelens_saves_to_the_same_latents(tmp_path, kind):
    theirs = _theirs(kind)
    theirs.cfg.metadata.hook_name = HOOK
    with torch.no_grad():
        for p in theirs.parameters():
            p.normal_(0, 0.3)
    theirs.save_model(tmp_path / kind)
    ours = SAE.load(tmp_path / kind)
    assert ours.cfg.hook_name == HOOK and ours.cfg.d_sae == 128
    x = torch.randn(64, 32)
    with torch.no_grad():
        z_theirs = theirs.encode(x)
        # folding the decoder norms into the encoder rounds once: 1e-6 relative to the largest latent
        tol = 1e-6 * (float(z_theirs.abs().max()) if kind == "topk_training" else 1.0)
        assert (ours.encode(x) - z_theirs).abs().max() <= tol
        assert (ours(x) - theirs.decode(z_theirs)).abs().max() <= 1e-5
    assert int((z_theirs > 0).sum()) > 0
