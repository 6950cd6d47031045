"""``patch`` (activation patching sweep), ``attribute`` (its gradient estimate: AtP, AtP*, IG) and
``trace`` (ROME causal tracing)."""

from __future__ import annotations

import argparse

from . import add_model_args, add_output_args, count, emit, int_list, load_model, number


def _ints(text: str | None, option: str) -> list[int] | None:
    """``--layers 0,3,-1`` parsed by :func:`int_list` (the CLI's one list-of-int parser), else an error naming
    ``option``."""
    if text is None:
        return None
    try:
        return int_list(text)
    except argparse.ArgumentTypeError as e:
        raise ValueError(f"{option}: {e}") from None


DATASET_HELP = (
    "a JSON Lines file (one object per line{fields}) or facts / facts:N (the fact base: all, or N drawn "
    "with --seed); under torchrun the ranks share the work and rank 0 prints the single-process result"
)


def _add_patch_args(p: argparse.ArgumentParser, dataset: bool = False) -> None:
    """The arguments ``patch`` and ``attribute`` share: prompts, metric, hook, cells, direction
    (``dataset``: the prompts may come from ``--dataset`` instead)."""
    p.add_argument("--clean", required=not dataset, nargs="+", help="clean prompt(s)")
    p.add_argument(
        "--corrupted", required=not dataset, nargs="+", help="corrupted prompt(s), same token count as each clean one"
    )
    p.add_argument("--answer", required=not dataset, help="the clean answer token, e.g. ' Paris'")
    p.add_argument("--wrong", default=None, help="the corrupted answer token, e.g. ' Rome' (metric: logit difference)")
    if dataset:
        p.add_argument(
            "--dataset",
            default=None,
            metavar="FILE|facts[:N]",
            help="prompt pairs instead of --clean/--corrupted: "
            + DATASET_HELP.format(
                fields=': {"clean": …, "corrupted": …, "answer": …, "wrong": …}, '
                "wrong optional but on every line or none; "
                "facts: subject swaps"
            ),
        )
        p.add_argument("--seed", type=int, default=0, help="which facts facts:N draws")
    p.add_argument(
        "--metric",
        choices=["auto", "logit_diff", "prob", "kl"],
        default="auto",
        help="auto: logit_diff with --wrong, else prob",
    )
    p.add_argument(
        "--hook", default="resid_pre", help="family (resid_pre, attn_out, mlp_out, z, pattern, …) or full hook name"
    )
    p.add_argument("--layers", default=None, help="comma-separated layers (default all)")
    p.add_argument("--positions", default=None, help="comma-separated positions (default all, one by one)")
    p.add_argument("--direction", choices=["denoise", "noise"], default="denoise")
    p.add_argument("--normalize", action="store_true", help="0 = corrupted metric, 1 = clean metric")
    _add_quiet(p)


def _add_quiet(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress bars, and no line (on stderr) with the run's size and expected time before it starts",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "patch",
        help="activation patching sweep: which (layer, position/head) restores the answer",
        description="Patch clean activations into the corrupted run (denoise) or the reverse (noise), "
        "one component at a time, batched; with --dataset, averaged over many prompt pairs "
        "(torchrun --nproc-per-node N -m gpt2_interp patch --dataset … shards the pairs).",
    )
    add_model_args(p)
    _add_patch_args(p, dataset=True)
    p.add_argument("--batch-size", type=count(1), default=None, help="patched runs per forward (default: by memory)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the sweep's expected runs, time, peak memory and chunks, and stop before patching",
    )
    add_output_args(p)
    p.set_defaults(func=patch_cmd)

    p = sub.add_parser(
        "attribute",
        help="estimate a patching sweep from gradients (AtP, AtP*, integrated gradients)",
        description="Estimate every cell of a patching sweep from a few forward and backward passes "
        "(attribution patching), optionally verifying the top cells by exact patching.",
    )
    add_model_args(p)
    _add_patch_args(p)
    p.add_argument(
        "--method",
        choices=["atp", "atp*", "ig"],
        default="atp*",
        help="atp: one gradient; atp*: QK fix for q/k and GradDrop ranking; ig: integrated gradients",
    )
    p.add_argument("--ig-steps", type=count(1), default=5, help="points on the interpolation path for --method ig")
    p.add_argument(
        "--ig-path",
        choices=["input", "activations"],
        default="input",
        help="--method ig: interpolate the input embeddings (EAP-IG) or each layer's own activations "
        "(closer to patching one layer's cells; ~ig-steps × layers passes)",
    )
    p.add_argument(
        "--no-graddrop",
        action="store_true",
        help="--method atp*: rank by |estimate| instead of GradDrop's score (saves one backward pass per layer)",
    )
    p.add_argument("--heads", default=None, help="comma-separated heads for per-head hooks (default all)")
    p.add_argument(
        "--verify",
        type=count(0),
        default=0,
        metavar="K",
        help="patch the estimate's top 2K cells and K random controls exactly; print the verified top K "
        "(the full exact sweep runs instead when it costs no more)",
    )
    p.add_argument("--batch-size", type=count(1), default=None, help="prompt pairs per pass (default all)")
    add_output_args(p)
    p.set_defaults(func=attribute_cmd)

    p = sub.add_parser(
        "trace",
        help="ROME causal trace: where a fact is recalled (tokens × layers)",
        description="Noise the subject's embeddings, restore one clean state per (token, layer), "
        "score the target's probability. With --dataset: the trace averaged over many facts "
        "in ROME's six position buckets (torchrun --nproc-per-node N -m gpt2_interp trace "
        "--dataset … shards the facts).",
    )
    add_model_args(p)
    p.add_argument("prompt", nargs="?", default=None, help="the prompt (or give --dataset)")
    p.add_argument("--subject", default=None, help="the subject as it appears in the prompt (required with a prompt)")
    p.add_argument("--target", default=None, help="target token (default: the clean top-1)")
    p.add_argument(
        "--dataset",
        default=None,
        metavar="FILE|facts[:N]",
        help="average over many facts: "
        + DATASET_HELP.format(
            fields=': {"prompt": …, "subject": …, "target": …}; only facts the model knows (clean top-1 = the '
            "target's first token) are averaged; facts: each fact's first training template"
        ),
    )
    p.add_argument("--facts-per-batch", type=count(1), default=16, help="facts traced together with --dataset")
    p.add_argument(
        "--kind",
        choices=["hidden", "mlp", "attn", "all"],
        default="hidden",
        help="restore hidden states, MLP or attention outputs; all = ROME's three panels",
    )
    p.add_argument(
        "--noise",
        type=number(0.0, open_min=True),
        default=None,
        help="absolute std of the subject-embedding noise "
        "(default: ROME's rule, 3 × the std of the subject tokens' embeddings)",
    )
    p.add_argument("--samples", type=count(1), default=10)
    p.add_argument(
        "--window",
        type=count(1),
        default=None,
        help="layers restored together for mlp/attn (default: ROME's 10 of 48 layers, scaled to the depth)",
    )
    p.add_argument("--seed", type=int, default=0, help="noise draws (and which facts facts:N draws)")
    _add_quiet(p)
    add_output_args(p)
    p.set_defaults(func=trace_cmd)


def _metric(args: argparse.Namespace):
    from ..analysis import patching as pt

    kind = args.metric if args.metric != "auto" else ("logit_diff" if args.wrong else "prob")
    metric: pt.Metric
    if kind == "logit_diff":
        if not args.wrong:
            raise ValueError("--metric logit_diff needs --wrong (the corrupted answer)")
        metric = pt.logit_diff(args.answer, args.wrong)
    elif kind == "prob":
        metric = pt.prob(args.answer)
    else:
        metric = pt.kl_to()
    return metric


def _prompts(args: argparse.Namespace) -> tuple:
    return (
        args.clean[0] if len(args.clean) == 1 else args.clean,
        args.corrupted[0] if len(args.corrupted) == 1 else args.corrupted,
    )


def _dataset_kind(args: argparse.Namespace, wrongs: list | None) -> str:
    return args.metric if args.metric != "auto" else ("logit_diff" if wrongs is not None else "prob")


def _dataset_metric(args: argparse.Namespace, answers: list, wrongs: list | None):
    from ..analysis import patching as pt

    kind = _dataset_kind(args, wrongs)
    if kind == "logit_diff":
        if wrongs is None:
            raise ValueError(f'--metric logit_diff needs a "wrong" answer on every line of {args.dataset}')
        return pt.logit_diff(answers, wrongs)
    return pt.prob(answers) if kind == "prob" else pt.kl_to()


def patch_cmd(args: argparse.Namespace) -> int:
    from ..analysis import patching as pt
    from ..core import distributed

    if args.dataset is not None:
        given = [f"--{a}" for a in ("clean", "corrupted", "answer", "wrong") if getattr(args, a) is not None]
        if given:
            raise ValueError(f"--dataset gives the prompt pairs and answers; drop {', '.join(given)}")
    elif args.clean is None or args.corrupted is None or args.answer is None:
        raise ValueError("give --clean, --corrupted and --answer, or --dataset FILE|facts[:N]")
    model = load_model(args)
    if args.dataset is not None:
        from .datasets import check_degenerate, degenerate_pairs, patch_pairs

        pairs = patch_pairs(args.dataset, model.tokenizer, seed=args.seed)
        clean, corrupted, metric = pairs.clean, pairs.corrupted, _dataset_metric(args, pairs.answer, pairs.wrong)
        known = degenerate_pairs(pairs, _dataset_kind(args, pairs.wrong) == "logit_diff")
        check_degenerate(pairs, args.dataset, known)  # refused when every pair is, else a warning
    else:
        (clean, corrupted), metric = _prompts(args), _metric(args)
    if args.dry_run:
        work = pt.estimate(
            model,
            clean,
            corrupted,
            hook=args.hook,
            layers=_ints(args.layers, "--layers"),
            positions=_ints(args.positions, "--positions"),
            batch_size=args.batch_size,
        )
        print(work.line())
        return 0
    r = pt.patch(
        model,
        clean,
        corrupted,
        metric,
        hook=args.hook,
        layers=_ints(args.layers, "--layers"),
        positions=_ints(args.positions, "--positions"),
        direction=args.direction,
        normalize=args.normalize,
        batch_size=args.batch_size,
        progress=distributed.is_main() and not args.quiet,
    )
    if args.dataset is not None:
        same = (r.clean_pair_metric == r.corrupted_pair_metric).nonzero().flatten().tolist()
        measured = {i: "the clean and corrupted runs give the same metric" for i in same if i not in known}
        check_degenerate(pairs, args.dataset, {**known, **measured} if len(same) == len(pairs) else measured)
    if args.dataset is not None and not args.json:
        return emit(args, r, lambda: f"{len(clean)} prompt pairs from {args.dataset}\n" + r.table())
    return emit(args, r)


def attribute_cmd(args: argparse.Namespace) -> int:
    from ..analysis import attribution as at

    if args.no_graddrop and args.method != "atp*":
        raise ValueError("--no-graddrop is for --method atp*")
    model = load_model(args)
    clean, corrupted = _prompts(args)
    r = at.attribute(
        model,
        clean,
        corrupted,
        _metric(args),
        hook=args.hook,
        method=args.method,
        ig_steps=args.ig_steps,
        ig_path=args.ig_path if args.method == "ig" else "input",
        layers=_ints(args.layers, "--layers"),
        positions=_ints(args.positions, "--positions"),
        heads=_ints(args.heads, "--heads"),
        direction=args.direction,
        normalize=args.normalize,
        batch_size=args.batch_size,
        graddrop=False if args.no_graddrop else None,
        progress=not args.quiet,
    )
    if not args.verify:
        return emit(args, r)
    v = r.verify(k=args.verify, progress=not args.quiet)
    # with --out the figure is the verification (estimate vs exact); --json gives both
    return emit(
        args,
        v,
        r.table() + "\n\n" + v.table(),
        data={**r.to_dict(), "verification": v.to_dict()} if args.json else None,
    )


def trace_cmd(args: argparse.Namespace) -> int:
    from ..analysis import tracing as tr
    from ..core import distributed

    kinds = tr.KINDS if args.kind == "all" else (args.kind,)
    if args.dataset is not None:
        given = [
            g
            for g, v in (("a prompt", args.prompt), ("--subject", args.subject), ("--target", args.target))
            if v is not None
        ]
        if given:
            raise ValueError(f"--dataset gives the prompts, subjects and targets; drop {', '.join(given)}")
        from .datasets import trace_cases

        cases = trace_cases(args.dataset, seed=args.seed)  # checked before the model loads
        model = load_model(args)
        avg = tr.average_trace(
            model,
            cases,
            kind=list(kinds),
            noise=args.noise,
            samples=args.samples,
            window=args.window,
            seed=args.seed,
            facts_per_batch=args.facts_per_batch,
            progress=distributed.is_main() and not args.quiet,
        )
        return emit(args, avg)
    if args.prompt is None or args.subject is None:
        raise ValueError("give a prompt and --subject, or --dataset FILE|facts[:N]")
    model = load_model(args)
    traces = tr.causal_trace_all(
        model,
        args.prompt,
        args.subject,
        args.target,
        kinds=kinds,
        noise=args.noise,
        samples=args.samples,
        window=args.window,
        seed=args.seed,
        progress=not args.quiet,
    )
    return emit(args, traces if len(kinds) > 1 else traces.traces[0])
