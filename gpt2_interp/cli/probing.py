"""``probe``, ``tuned-lens``: reading the model beyond the logit lens."""

from __future__ import annotations

import argparse

from . import add_model_args, add_output_args, count, emit, load_model, number


def register(sub: argparse._SubParsersAction) -> None:
    from ..facts.probing import TASKS

    p = sub.add_parser("probe", help="linear probes by layer for an attribute of the fact base's subjects")
    add_model_args(p)
    p.add_argument(
        "--task",
        default="continent",
        choices=list(TASKS),
        help="what to decode: " + "; ".join(f"{k}: {t.description}" for k, t in TASKS.items()),
    )
    p.add_argument(
        "--hook",
        default="resid_post",
        help="hook family ('resid_post', 'resid', 'mlp_out', 'z', …) or a full hook name (default resid_post)",
    )
    p.add_argument("--position", default="last-subject", choices=["last-subject", "last", "mean-subject"])
    p.add_argument("--control", default="random-labels", choices=["random-labels", "by-type", "none"])
    p.add_argument(
        "--templates",
        default="all",
        choices=["all", "own", "others"],
        help="prompt templates: all of the subject type's relations, only the probed relation's, or the others",
    )
    p.add_argument("--per-subject", type=count(1), default=8, help="templates per subject (default 8)")
    p.add_argument("--folds", type=count(2), default=5, help="cross-validation folds, split by subject (default 5)")
    p.add_argument(
        "-C", type=number(0.0, open_min=True), default=1.0, help="inverse L2 strength of the probe (default 1)"
    )
    p.add_argument("--seed", type=int, default=0)
    add_output_args(p)
    p.set_defaults(func=probe)

    p = sub.add_parser(
        "tuned-lens",
        help="train a tuned lens (an affine translator per layer) and save it",
        description="Train a tuned lens: least-squares start, then Adam on KL(final ‖ lens). Under "
        "torchrun --nproc-per-node N -m gpt2_interp tuned-lens … the ranks share every batch "
        "(DistributedDataParallel) and rank 0 writes the single-process lens.",
    )
    add_model_args(p)
    p.add_argument("--save", required=True, metavar="PATH", help="where to write the lens (.safetensors)")
    p.add_argument("--corpus", default="generated", help="'generated' (the model's own samples) or a text file/folder")
    p.add_argument("--texts", type=count(1), default=256, help="generated texts to train on (--corpus generated)")
    p.add_argument(
        "--steps", type=count(0), default=None, help="KL steps after the start (default: train_tuned_lens's)"
    )
    p.add_argument("--batch-tokens", type=count(1), default=None, help="token positions per step")
    p.add_argument("--lr", type=number(0.0, open_min=True), default=None, help="Adam learning rate (linear decay to 0)")
    p.add_argument(
        "--init",
        choices=["least-squares", "identity"],
        default="least-squares",
        help="start from the least-squares translators (default) or from the logit lens",
    )
    p.add_argument("--seq-len", type=count(2), default=None, help="tokens per row (default: min(context, 128))")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=tuned_lens)


def probe(args: argparse.Namespace) -> int:
    from ..analysis.probes import probe as run_probe
    from ..facts.probing import probing_set

    model = load_model(args)
    ds = probing_set(args.task, per_subject=args.per_subject, which=args.templates, seed=args.seed)
    r = run_probe(
        model,
        ds,
        hook=args.hook,
        position=args.position,
        control=None if args.control == "none" else args.control,
        n_folds=args.folds,
        C=args.C,
        seed=args.seed,
    )
    return emit(args, r)


def tuned_lens(args: argparse.Namespace) -> int:
    from ..analysis.tuned_lens import train_tuned_lens
    from ..core import distributed

    model = load_model(args)
    given = {
        k: v for k, v in (("steps", args.steps), ("batch_tokens", args.batch_tokens), ("lr", args.lr)) if v is not None
    }
    lens = train_tuned_lens(
        model, corpus=args.corpus, n_texts=args.texts, init=args.init, seq_len=args.seq_len, seed=args.seed, **given
    )
    if not distributed.is_main():
        return 0  # every rank holds the same lens; rank 0 writes it
    path = lens.save(args.save)
    kl = ", ".join(f"{lab} {v:.3f}" for lab, v in zip(lens.labels, lens.meta["final_kl_nats"]))
    print(
        f"tuned lens for {model.cfg.name} saved to {path} ({lens.meta['seconds']} s)"
        + (
            f"; training KL over the last steps (nats): {kl}"
            if lens.meta["steps"]
            else "; least-squares start only (--steps 0)"
        )
    )
    return 0
