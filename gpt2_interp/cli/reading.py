"""``lens``, ``dla``, ``neurons``, ``subupdates``: reading the model in vocabulary space."""

from __future__ import annotations

import argparse

from . import add_model_args, add_output_args, count, emit, int_list, load_model


def _positions(text: str) -> int | list[int] | str:
    """``--positions``: ``all``, an int, or comma-separated ints."""
    if text == "all":
        return "all"
    try:
        vals = int_list(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"'all' or {e}") from None
    return vals[0] if len(vals) == 1 else vals


def _flat(lists: list[list[int]] | None) -> list[int] | None:
    """A flag given as ``--layers 3 4`` or ``--layers 3,4`` (``nargs="+"`` of :func:`int_list`) as one list."""
    return None if lists is None else [v for vs in lists for v in vs]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lens", help="logit lens: decode the residual stream after every layer")
    add_model_args(p)
    p.add_argument("prompt", nargs="+", help="one or more prompts (batched)")
    p.add_argument("--target", default=None, help="a single-token target, e.g. ' Paris' (mind the leading space)")
    p.add_argument(
        "--positions",
        type=_positions,
        default="all",
        help="'all', an int or a list like 0,-1 (default all: the heatmap has a column per token; -1 is the last)",
    )
    p.add_argument("-k", "--top", type=count(1), default=5, help="top tokens per layer (default 5)")
    p.add_argument("--mid", action="store_true", help="also decode the mid-block residuals")
    p.add_argument(
        "--tuned",
        default=None,
        metavar="PATH",
        help="decode with a tuned lens trained for this model (a file saved by TunedLens.save)",
    )
    add_output_args(p)
    p.set_defaults(func=lens)

    p = sub.add_parser("dla", help="direct logit attribution of a target's logit (or a logit difference)")
    add_model_args(p)
    p.add_argument("prompt")
    p.add_argument("--target", required=True, help="single-token target, e.g. ' Paris'")
    p.add_argument("--baseline", default=None, help="attribute logit(target) − logit(baseline)")
    p.add_argument("--position", type=int, default=-1)
    p.add_argument("--no-heads", action="store_true", help="skip the per-head split")
    add_output_args(p)
    p.set_defaults(func=dla)

    p = sub.add_parser("neurons", help="MLP value vectors in vocabulary space (by layer, or neurons promoting a token)")
    add_model_args(p)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--layer", type=int, help="show neurons of this layer")
    g.add_argument("--promotes", nargs="+", help="find the neurons whose value vectors promote these tokens")
    p.add_argument("--neurons", type=count(0), nargs="+", default=None, help="with --layer: these neurons")
    p.add_argument(
        "--top",
        type=count(1),
        default=20,
        help="how many neurons (default 20); with --layer, those with the largest top score",
    )
    p.add_argument("-k", type=count(1), default=10, help="tokens per neuron (default 10)")
    p.add_argument(
        "--layers",
        type=int_list,
        nargs="+",
        default=None,
        help="with --promotes: search these layers only (3 4 or 3,4)",
    )
    p.add_argument("--raw", action="store_true", help="project with raw W_U (no ln_final gain)")
    p.add_argument(
        "--relative", action="store_true", help="with --promotes: subtract each neuron's vocabulary-mean score"
    )
    add_output_args(p)
    p.set_defaults(func=neurons)

    p = sub.add_parser("subupdates", help="largest MLP sub-updates m_i·v_i on a prompt (LM-Debugger style)")
    add_model_args(p)
    p.add_argument("prompt")
    p.add_argument("--target", default=None, help="also report each sub-update's direct effect on this token's logit")
    p.add_argument("--layer", type=int, default=None, help="one layer only (default: all)")
    p.add_argument("--position", type=int, default=-1)
    p.add_argument("--top", type=count(1), default=20)
    add_output_args(p)
    p.set_defaults(func=subupdates)


def lens(args: argparse.Namespace) -> int:
    from ..analysis.lens import logit_lens

    model = load_model(args)
    tuned = None
    if args.tuned:
        from ..analysis.tuned_lens import TunedLens

        tuned = TunedLens.load(args.tuned, model)
    r = logit_lens(
        model, args.prompt, targets=args.target, positions=args.positions, k=args.top, include_mid=args.mid, lens=tuned
    )
    return emit(args, r, lambda: r.table(k=args.top))


def dla(args: argparse.Namespace) -> int:
    from ..analysis.lens import logit_attribution

    model = load_model(args)
    r = logit_attribution(model, args.prompt, args.target, args.baseline, args.position, per_head=not args.no_heads)
    return emit(args, r)


def neurons(args: argparse.Namespace) -> int:
    from ..analysis.vocab import find_neurons, neuron_vocab

    model = load_model(args)
    if args.promotes:
        r = find_neurons(
            model,
            args.promotes,
            k=args.top,
            layers=_flat(args.layers),
            apply_ln=not args.raw,
            relative=args.relative,
            n_tokens=args.k,
        )
        return emit(args, r, lambda: r.table(k=args.k))
    proj = neuron_vocab(model, args.layer, args.neurons, k=args.k, apply_ln=not args.raw)
    if args.neurons is None:
        proj = proj.strongest(args.top)
    return emit(args, proj)


def subupdates(args: argparse.Namespace) -> int:
    from ..analysis.vocab import top_subupdates

    model = load_model(args)
    r = top_subupdates(model, args.prompt, position=args.position, layer=args.layer, k=args.top, target=args.target)
    return emit(args, r)
