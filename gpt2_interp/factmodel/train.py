"""Train the embedded fact model ``gpt2-facts``: ``python -m gpt2_interp.factmodel.train``.

The model is a normal ``HookedGPT2`` (full 50,257-token vocabulary, tied
embeddings), trained from scratch on every fact of the fact base rendered with
every training template, as ``<|endoftext|>prompt object.<|endoftext|>``.

Training-time shortcut (the shipped model does not depend on it): training runs
a GPT-2 whose vocabulary is the ~3k token ids the corpus uses (ids remapped), so
the softmax and the optimiser touch 3k embedding rows instead of 50,257. The
saved model is a normal full-vocabulary GPT-2: the trained rows are scattered
into a full ``W_E`` whose other rows keep GPT-2's N(0, 0.02) initialisation
(tokens the corpus never uses), and it is evaluated with the full softmax.
Loss is on all tokens, with object tokens weighted ``--object-weight`` (×5 by
default; it memorises fastest while still training the whole sentence).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..core.boundary import boundary
from ..facts.base import FactBase
from ..io.checkpoints import embedded_path
from ..io.tokenizer import EOT_ID, encode
from ..model import GPT2Config, HookedGPT2
from ..model.loading import save_hf
from .quality import first_token_accuracy

DEFAULT_CONFIG = GPT2Config(n_layer=6, d_model=256, n_head=8, d_mlp=1024, n_ctx=64, name="gpt2-facts")


@dataclass
class Example:
    tokens: list[int]  # [EOT] + prompt + object + "." + [EOT]
    object_span: tuple[int, int]  # positions (as targets) of the object tokens


@boundary
def build_examples(fb: FactBase, split: str = "train") -> list[Example]:
    """Every fact × every template of ``split`` as a tokenized training sequence."""
    period = encode(".")
    out = []
    for fact in fb.facts():
        target = encode(fact.target)
        for prompt in fb.prompts(fact, split=split):
            p = [EOT_ID, *encode(prompt)]
            out.append(Example(p + target + period + [EOT_ID], (len(p), len(p) + len(target))))
    return out


@boundary
def corpus_hash(examples: list[Example]) -> str:
    """A short digest (16 hex digits, sha256) of the token sequences of ``examples``, in order: names
    the training corpus in ``training.json``."""
    h = hashlib.sha256()
    for ex in examples:
        h.update(json.dumps(ex.tokens).encode())
    return h.hexdigest()[:16]


def full_vocab(compact: HookedGPT2, used: list[int], cfg: GPT2Config, seed: int) -> HookedGPT2:
    """The full-vocabulary GPT-2 of a model trained on the ``used`` token ids: trained rows
    scattered into a freshly initialised ``W_E`` (the same seed, so unused rows are reproducible)."""
    full = HookedGPT2(cfg, seed=seed)
    sd = {k: v.detach().cpu() for k, v in compact.state_dict().items()}
    w_e = full.W_E.detach().clone()
    w_e[torch.tensor(used)] = sd.pop("embed.W_E")
    sd["embed.W_E"] = w_e
    full.load_state_dict(sd)
    return full.to(compact.device)


def batches(examples: list[Example], batch_size: int, rng: random.Random, pad_id: int = EOT_ID):
    """Length-bucketed batches (right-padded): ``tokens, targets, weights`` with targets -100 on padding."""
    order = sorted(range(len(examples)), key=lambda i: (len(examples[i].tokens), rng.random()))
    chunks = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    rng.shuffle(chunks)
    for chunk in chunks:
        width = max(len(examples[i].tokens) for i in chunk) - 1
        tokens = torch.full((len(chunk), width), pad_id)
        targets = torch.full((len(chunk), width), -100)
        weights = torch.zeros((len(chunk), width))
        for row, i in enumerate(chunk):
            t = examples[i].tokens
            tokens[row, : len(t) - 1] = torch.tensor(t[:-1])
            targets[row, : len(t) - 1] = torch.tensor(t[1:])
            weights[row, : len(t) - 1] = 1.0
            a, b = examples[i].object_span
            weights[row, a - 1 : b - 1] = OBJECT_WEIGHT
        yield tokens, targets, weights


OBJECT_WEIGHT = 5.0


def train(
    out: Path,
    epochs: float = 10.0,
    batch_size: int = 64,
    lr: float = 2e-3,
    weight_decay: float = 0.1,
    seed: int = 0,
    cfg: GPT2Config = DEFAULT_CONFIG,
    device: str | None = None,
    eval_every: int = 1000,
) -> dict:
    torch.manual_seed(seed)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    fb = FactBase.load()
    examples = build_examples(fb)
    used = sorted({t for ex in examples for t in ex.tokens})
    compact_id = {t: i for i, t in enumerate(used)}
    compact = [Example([compact_id[t] for t in ex.tokens], ex.object_span) for ex in examples]
    model = HookedGPT2(cfg.replace(d_vocab=len(used)), seed=seed).to(device).train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "W_pos" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "W_pos" not in n)]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.98),
    )
    steps_per_epoch = math.ceil(len(examples) / batch_size)
    total = int(epochs * steps_per_epoch)
    warmup = min(300, total // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
    )
    rng = random.Random(seed)
    print(
        f"{len(fb.facts())} facts, {len(examples)} sequences, {len(used)} token ids used; "
        f"{sum(p.numel() for p in full_vocab(model, used, cfg, seed).parameters()):,} parameters; {total} steps on "
        f"{device}"
    )
    history, step, n_tokens, t0 = [], 0, 0, time.time()
    bar = tqdm(total=total, desc="train", mininterval=10)
    while step < total:
        for tokens, targets, weights in batches(compact, batch_size, rng, pad_id=compact_id[EOT_ID]):
            tokens, targets, weights = tokens.to(device), targets.to(device), weights.to(device)
            logits = model(tokens)
            lp = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none", ignore_index=-100)
            loss = (lp * weights.flatten()).sum() / weights.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            n_tokens += int((targets >= 0).sum())
            bar.update(1)
            if step % 50 == 0:
                bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{n_tokens / (time.time() - t0):.0f}")
            if step % eval_every == 0 or step == total:
                full = full_vocab(model, used, cfg, seed).eval()
                acc = first_token_accuracy(full, fb, "train", limit=100)["mean"]
                held = first_token_accuracy(full, fb, "heldout", limit=100)["mean"]
                history.append(
                    {
                        "step": step,
                        "loss": round(loss.item(), 4),
                        "train_acc@100": acc,
                        "heldout_acc@100": held,
                        "minutes": round((time.time() - t0) / 60, 2),
                    }
                )
                tqdm.write(json.dumps(history[-1]))
                if step < total:  # a usable checkpoint while training goes on
                    save_hf(full.cpu(), out, dtype=torch.float16)
            if step >= total:
                break
    bar.close()
    minutes = (time.time() - t0) / 60
    model = full_vocab(model, used, cfg, seed).eval()
    train_acc = first_token_accuracy(model, fb, "train")
    held_acc = first_token_accuracy(model, fb, "heldout")
    meta = {
        "config": cfg.to_dict(),
        "seed": seed,
        "epochs": epochs,
        "batch_size": batch_size,
        "lr": lr,
        "weight_decay": weight_decay,
        "object_weight": OBJECT_WEIGHT,
        "steps": total,
        "device": device,
        "torch": torch.__version__,
        "machine": platform.machine(),
        "minutes": round(minutes, 1),
        "tokens_per_s": round(n_tokens / (minutes * 60)),
        "n_facts": len(fb.facts()),
        "n_sequences": len(examples),
        "corpus_sha256_16": corpus_hash(examples),
        "n_token_ids_used": len(used),
        "train_template_acc": train_acc,
        "heldout_template_acc": held_acc,
        "history": history,
    }
    save_hf(model.cpu(), out, dtype=torch.float16)
    (out / "training.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"saved to {out}: train acc {train_acc['mean']:.3f}, held-out acc {held_acc['mean']:.3f}, {minutes:.1f} min")
    return meta


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=embedded_path("gpt2-facts"))
    ap.add_argument("--epochs", type=float, default=10.0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default=None)
    ap.add_argument("--eval-every", type=int, default=1000)
    ap.add_argument("--n-layer", type=int, default=DEFAULT_CONFIG.n_layer)
    ap.add_argument("--d-model", type=int, default=DEFAULT_CONFIG.d_model)
    a = ap.parse_args()
    cfg = DEFAULT_CONFIG.replace(n_layer=a.n_layer, d_model=a.d_model, d_mlp=4 * a.d_model)
    train(a.out, a.epochs, a.batch_size, a.lr, seed=a.seed, cfg=cfg, device=a.device, eval_every=a.eval_every)


if __name__ == "__main__":
    main()
