"""SAE training side by side with SAELens, on the same activations, interleaved step by step.

    python benchmarks/bench_sae.py [--tokens 200000] [--out benchmarks/RESULTS_sae.md]

gpt2-facts, residual stream entering the middle block (``blocks.3.hook_resid_pre``), Brown corpus
windows of 64 tokens (the documents' last 10% held out), 8 × d_model latents, TopK with k = 32.
The activation batches are made once by our shuffling buffer and fed, batch for batch, to

- ours: :class:`gpt2_interp.analysis.features.sae_train.SAETrainer` (Gao et al.'s recipe: unit-norm
  decoder, geometric-median ``b_dec``, AuxK, lr ``2e-4 / sqrt(d_sae / 16384)`` with warm-up and decay),
- SAELens: its ``TopKTrainingSAE`` stepped as its ``SAETrainer._train_step`` does (its defaults: Adam at
  lr 3e-4, constant schedule, gradient-norm clipping at 1, decoder-norm-rescaled TopK, its AuxK with a
  dead window of 1000 steps),

one step of each in turn (same load on the machine). SAELens's own runner cannot be used here: it loads
models through TransformerLens by name and text through Hugging Face ``datasets``, neither of which
reaches gpt2-facts or the Brown corpus offline, so its training *step* is driven on our activations.
Both SAEs are then measured by :func:`gpt2_interp.analysis.features.sae_eval.evaluate_sae` on the same
held-out windows (SAELens's SAE saved with its ``save_model`` and read back by ``SAE.load``; that the
read-back encodes to SAELens's own latents is checked). Reported: L0, variance explained, CE loss
recovered, dead fraction and seconds spent in training steps.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

import gpt2_interp as gi
from gpt2_interp.analysis.features.sae import SAE
from gpt2_interp.analysis.features.sae_eval import evaluate_sae
from gpt2_interp.analysis.features.sae_train import (
    ActivationBuffer,
    SAETrainConfig,
    SAETrainer,
    new_sae,
    text_source,
    token_windows,
)
from gpt2_interp.experiments.provenance import load_average, standalone, write_beside
from gpt2_interp.facts.base import FactBase
from gpt2_interp.facts.corpus import training_texts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=200_000)
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--eval-windows", type=int, default=128)
    p.add_argument("--out", default="benchmarks/RESULTS_sae.md")
    a = p.parse_args()
    from sae_lens import TopKTrainingSAE, TopKTrainingSAEConfig
    from sae_lens.saes.sae import TrainStepInput

    torch.manual_seed(0)
    model = gi.load("gpt2-facts")
    hook = f"blocks.{model.cfg.n_layer // 2}.hook_resid_pre"
    docs = text_source(model, "brown")
    n_held = len(docs) // 10
    train_w = token_windows(model, docs[:-n_held], 64)
    held = token_windows(model, docs[-n_held:], 64)[: a.eval_windows]
    facts = token_windows(model, training_texts(FactBase.load()), 64)
    facts = facts[torch.randperm(len(facts), generator=torch.Generator().manual_seed(0))[: a.eval_windows]]
    cfg = SAETrainConfig(hook_name=hook, expansion=8, k=32, tokens=a.tokens, batch_size=a.batch_size)
    steps = a.tokens // a.batch_size
    batches = []
    for x in ActivationBuffer(model, hook, train_w, a.batch_size, 65_536, seed=0):
        batches.append(x)
        if len(batches) == steps:
            break
    ours = new_sae(model, cfg)
    trainer = SAETrainer(ours, cfg, len(batches))
    trainer.init_b_dec(batches[0])
    theirs = TopKTrainingSAE(TopKTrainingSAEConfig(d_in=ours.cfg.d_in, d_sae=ours.cfg.d_sae, k=32))
    opt = torch.optim.Adam(theirs.parameters(), lr=3e-4, betas=(0.9, 0.999))
    since_fired = torch.zeros(ours.cfg.d_sae)
    seconds = {"ours": 0.0, "SAELens": 0.0}
    for i, x in enumerate(batches):
        t = time.perf_counter()
        trainer.step(x)
        seconds["ours"] += time.perf_counter() - t
        t = time.perf_counter()
        theirs.train()
        out = theirs.training_forward_pass(
            TrainStepInput(
                sae_in=x,
                coefficients=theirs.get_coefficients() if hasattr(theirs, "get_coefficients") else {},
                dead_neuron_mask=since_fired > 1000,
                n_training_steps=i,
                is_logging_step=False,
            )
        )
        with torch.no_grad():
            since_fired += 1
            since_fired[out.feature_acts.bool().any(0)] = 0
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(theirs.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        seconds["SAELens"] += time.perf_counter() - t
    ours.eval()
    theirs.eval()
    with tempfile.TemporaryDirectory() as tmp:
        theirs.cfg.metadata.hook_name = hook
        theirs.save_model(Path(tmp) / "theirs")
        theirs_ours = SAE.load(Path(tmp) / "theirs")
    with torch.no_grad():
        probe = batches[-1][:256]
        same = (theirs_ours.encode(probe) - theirs.encode(probe)).abs().max().item()
    rows = {name: evaluate_sae(model, sae, held) for name, sae in (("ours", ours), ("SAELens", theirs_ours))}
    own = {name: evaluate_sae(model, sae, facts) for name, sae in (("ours", ours), ("SAELens", theirs_ours))}
    lines = [
        "# SAE training: ours vs SAELens's training step, same activations",
        "",
        f"gpt2-facts `{hook}`, {ours.cfg.d_sae} latents (8 × d_model), TopK k=32, {len(batches)} steps × "
        f"{a.batch_size} activations = {len(batches) * a.batch_size} tokens (Brown corpus, shuffled by our buffer), "
        f"evaluated on {rows['ours'].tokens} held-out tokens. SAELens {__import__('sae_lens').__version__}; its SAE "
        f"read back by `SAE.load` encodes to its own latents to {same:.1e}.",
        "",
        "Brown held-out text (variance explained, L0, dead) and gpt2-facts's own training text, which the SAEs never "
        "saw (CE loss recovered: on Brown this model's clean loss is above its zero-ablated loss, so the ratio "
        "means nothing there).",
        "",
        "| trainer | L0 | variance explained (Brown) | variance explained (facts) | CE loss recovered (facts) | dead "
        "(Brown) | training-step seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, ev in rows.items():
        lines.append(
            f"| {name} | {ev.l0:.1f} | {ev.variance_explained:.3f} | {own[name].variance_explained:.3f} | "
            f"{own[name].ce_recovered:.3f} | {ev.dead_fraction:.3f} | {seconds[name]:.1f} |"
        )
    lines += [
        "",
        f"CE on the facts text (nats/token): clean {own['ours'].ce_clean:.3f}, zero-ablated {own['ours'].ce_zero:.3f}; "
        f"spliced: ours {own['ours'].ce_spliced:.3f}, SAELens {own['SAELens'].ce_spliced:.3f}. Load average at the "
        f"end: {load_average()}.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    Path(a.out).write_text(text)
    write_beside(a.out, standalone(sys.argv, [model]))


if __name__ == "__main__":
    main()
