"""``circuit``: score every edge of the model for a task's prompt pairs (EAP, EAP-IG or exact edge
patching), keep the top edges as a circuit, measure its faithfulness exactly, save it as JSON and draw it."""

from __future__ import annotations

import argparse

from . import add_model_args, add_output_args, count, emit, load_model, number


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "circuit",
        help="find a circuit: score every edge (EAP, EAP-IG, exact), keep the top ones, check faithfulness",
        description="Score every edge (sender → q/k/v/MLP/logits input) for the prompt pairs of a task (ioi, "
        "greater_than, fact_recall) or your own --clean/--corrupted pairs, keep the edges with the largest |score| "
        "(dangling ones pruned) and measure the circuit's faithfulness exactly (every other edge patched to the "
        "corrupted run: 1 = the clean metric, 0 = the corrupted one). The model's own performance on the task is "
        "printed first: a circuit of a task the model cannot do means nothing, so such a task is refused (exit 2) "
        "unless --force. A circuit whose faithfulness is below 0.8 (FAITHFUL_ENOUGH) is flagged: it does not "
        "reproduce the behaviour.",
    )
    add_model_args(p)
    p.add_argument("--task", default=None, help="ioi, greater_than or fact_recall (or give --clean/--corrupted)")
    p.add_argument("-n", "--pairs", type=count(1), default=20, help="--task: prompt pairs drawn (default 20)")
    p.add_argument("--seed", type=int, default=0, help="--task: which pairs are drawn")
    p.add_argument("--clean", nargs="+", default=None, help="clean prompt(s) instead of --task")
    p.add_argument("--corrupted", nargs="+", default=None, help="corrupted prompt(s), same token count as each clean")
    p.add_argument("--answer", default=None, help="with --clean: the clean answer token, e.g. ' Paris'")
    p.add_argument("--wrong", default=None, help="with --clean: the corrupted answer token, e.g. ' Rome'")
    p.add_argument(
        "--method", choices=["eap", "eap-ig", "exact"], default="eap-ig", help="edge scores (default eap-ig)"
    )
    p.add_argument("--ig-steps", type=count(1), default=5, help="--method eap-ig: points on the path (default 5)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--top", type=count(1), default=None, help="keep this many edges (default 100)")
    size.add_argument("--fraction", type=number(0, 1, open_min=True), default=None, help="keep this share of edges")
    p.add_argument(
        "--selection",
        choices=("top", "greedy"),
        default="top",
        help="top: the edges with the largest |score|; greedy: grown from the logits up (default top)",
    )
    p.add_argument(
        "--per-position",
        action="store_true",
        help="score and keep (position, edge) items: an edge at some positions and not others (prompts of one "
        "token length; --top/--fraction count items)",
    )
    p.add_argument("--no-faithfulness", action="store_true", help="skip the exact faithfulness run")
    p.add_argument(
        "--force",
        action="store_true",
        help="--task: find a circuit even when the model does not perform the task (flagged in the output)",
    )
    p.add_argument("--edges", type=count(1), default=20, help="edges listed in the table (default 20)")
    p.add_argument("--save", default=None, help="write the circuit as JSON here (Circuit.load reads it back)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_output_args(p)
    p.set_defaults(func=circuit_cmd)


def _check_pairs(args: argparse.Namespace) -> None:
    """Refuse, before the model is loaded, a command that names no prompt pairs, or two kinds of them."""
    from ..analysis.circuits import TASKS

    own = (args.clean, args.corrupted, args.answer, args.wrong)
    if args.task is not None:
        if args.task not in TASKS:
            raise ValueError(f"unknown task {args.task!r}; tasks: {', '.join(TASKS)}")
        if any(own):
            raise ValueError("give --task or --clean/--corrupted/--answer/--wrong, not both")
    elif not all(own):
        raise ValueError("give --task NAME, or --clean, --corrupted, --answer and --wrong (a logit difference)")


def _pairs(args: argparse.Namespace, model):
    """``(clean, corrupted, metric, performance line or None)`` from ``--task`` or ``--clean``/``--corrupted``;
    a task the model does not perform (:meth:`~gpt2_interp.analysis.circuits.TaskPerformance.performs`) is
    refused unless ``--force``, and then flagged in the performance line."""
    from ..analysis.circuits import make_task, performance
    from ..analysis.metrics import logit_diff

    if args.task is not None:
        task = make_task(args.task, model, n=args.pairs, seed=args.seed)
        perf = performance(model, task)
        said = "performs it" if perf.performs() else "does not perform it reliably"
        line = f"{perf.summary()}: {said}"
        if said != "performs it":
            if not args.force:
                raise ValueError(
                    f"{line}; a circuit of a task the model does not do means nothing, so none is looked for "
                    "(--force finds one anyway)"
                )
            line += " (--force: the circuit below explains a behaviour the model does not have)"
        return task.clean, task.corrupted, task.metric, line
    return args.clean, args.corrupted, logit_diff(args.answer, args.wrong, model=model), None


def circuit_cmd(args: argparse.Namespace) -> int:
    from ..analysis.circuits import circuit, edge_scores, evaluate

    _check_pairs(args)
    model = load_model(args)
    clean, corrupted, metric, perf = _pairs(args, model)
    scores = edge_scores(
        model,
        clean,
        corrupted,
        metric,
        method=args.method,
        ig_steps=args.ig_steps,
        per_position=args.per_position,
        progress=False if args.quiet else None,
    )
    if args.fraction is not None:
        circ = circuit(scores, fraction=args.fraction, selection=args.selection)
    else:
        circ = circuit(scores, top=args.top or 100, selection=args.selection)
    if not args.no_faithfulness:
        circ = evaluate(model, circ, clean, corrupted, metric)
    if args.save:
        circ.save(args.save)
    lines = [] if perf is None else [perf]
    lines.append(circ.table(args.edges))
    if args.save:
        lines.append(f"circuit saved to {args.save}")
    return emit(args, circ, "\n".join(lines), data={**circ.to_dict(), "caveat": circ.caveat})
