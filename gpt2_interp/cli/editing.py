"""``edit``, ``verify``, ``evaluate-edits`` and ``stats``: ROME fact editing from the command line."""

from __future__ import annotations

import argparse
import json
from typing import Any

from . import add_model_args, add_output_args, count, emit, load_model


def _layer(x: str) -> int | str:
    if x == "auto":
        return x
    try:
        return int(x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--layer takes an int or 'auto', not {x!r}") from None


def _hparams(items: list[str] | None) -> dict[str, Any]:
    """``--hparam NAME=VALUE`` items as a dict (VALUE parsed as JSON, else kept as text), checked
    against ROME's hyperparameters before any model is loaded."""
    from ..editing.rome import RomeHparams

    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--hparam takes NAME=VALUE (e.g. kl_factor=0.1), got {item!r}")
        k, v = item.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    RomeHparams.of(**out)  # raises a ValueError naming a bad or unknown hyperparameter
    return out


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--layer", type=_layer, default=None, help="edit layer: an int, or 'auto' (causal trace); "
                   "default: the model's DEFAULT_LAYERS entry")
    p.add_argument("--corpus", default=None, help="key-statistics corpus: 'facts', 'generated', a text file/folder "
                   "or a Hugging Face dataset name (default: facts for gpt2-facts, generated otherwise)")
    p.add_argument("--n-samples", type=count(1), default=100_000, help="tokens for the key statistics")
    p.add_argument("--hparam", action="append", metavar="NAME=VALUE",
                   help="override a ROME hyperparameter (v_steps, v_lr, kl_factor, weight_decay, clamp_factor, …)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("edit", help="rewrite a fact with ROME; show before/after; optionally save the edit")
    add_model_args(p)
    p.add_argument("--subject", required=True, help="the entity, e.g. 'Eiffel Tower'")
    p.add_argument("--prompt", required=True, help="the prompt with {} for the subject, e.g. '{} is located in'")
    p.add_argument("--target", required=True, help="the new continuation, e.g. ' Rome' (mind the leading space)")
    p.add_argument("--paraphrase", action="append", default=[], help="another prompt to show (repeatable; "
                   "{} is filled with the subject)")
    p.add_argument("--save", default=None, metavar="PATH", help="write the edit (safetensors + JSON)")
    p.add_argument("--top-k", type=count(1), default=5)
    add_output_args(p)
    _common(p)
    p.set_defaults(func=edit_cmd)

    p = sub.add_parser("verify", help="load a saved edit and show before/after on prompts")
    add_model_args(p)
    p.add_argument("edit_file", help="an edit written by `gpt2-interp edit --save`")
    p.add_argument("--prompt", action="append", default=[], help="a prompt to check (repeatable; default: the "
                   "edit's rewrite prompt)")
    p.add_argument("--top-k", type=count(1), default=5)
    add_output_args(p)
    p.set_defaults(func=verify_cmd)

    p = sub.add_parser("evaluate-edits", help="CounterFact-style evaluation of ROME on the embedded fact base")
    add_model_args(p)
    p.add_argument("--n", type=count(1), default=200, help="number of counterfactual requests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sequential", action="store_true", help="let the edits accumulate (score decay curve)")
    add_output_args(p)
    _common(p)
    p.set_defaults(func=evaluate_cmd)

    p = sub.add_parser("stats", help="compute (or find cached) MLP key statistics C = E[k kᵀ] for a layer")
    add_model_args(p)
    p.add_argument("--layer", type=int, required=True)
    p.add_argument("--corpus", default=None, help="'facts', 'generated', a text file/folder or a dataset name")
    p.add_argument("--n-samples", type=count(1), default=100_000)
    p.add_argument("--batch-size", type=count(1), default=64)
    p.add_argument("--cache-dir", default=None)
    add_output_args(p, figure=False)
    p.set_defaults(func=stats_cmd)


def edit_cmd(args: argparse.Namespace) -> int:
    from ..editing.compare import compare_topk
    from ..editing.rome import compute_edit

    hp = _hparams(args.hparam) | {"corpus": args.corpus, "n_samples": args.n_samples}
    model = load_model(args)
    request = {"prompt": args.prompt, "subject": args.subject, "target": args.target}
    edit = compute_edit(model, request, layer=args.layer, **hp)
    cmp = compare_topk(model, edit, [edit.request.text] + args.paraphrase, k=args.top_k)
    if args.save:
        edit.save(args.save)
    m = edit.metrics
    text = (f"ROME edit at layer {edit.layer} in {m['seconds']:.2f} s: P({edit.request.target!r} | "
            f"{edit.request.text!r}) {m['p_target_before']:.4f} → {m['p_target_after']:.4f}\n"
            f"top-k before | after:\n{cmp.table()}" + (f"\nsaved to {args.save}" if args.save else ""))
    data = {"edit": {"layer": edit.layer, "metrics": edit.metrics, "saved": args.save}, "comparison": cmp.to_dict()}
    return emit(args, cmp, text, data)


def verify_cmd(args: argparse.Namespace) -> int:
    from ..editing.edit import Edit
    from ..editing.compare import compare_topk

    model = load_model(args)
    edit = Edit.load(args.edit_file, model)
    cmp = compare_topk(model, edit, args.prompt or [edit.request.text], k=args.top_k)
    return emit(args, cmp, lambda: f"{edit!r}\n{cmp.table()}")


def evaluate_cmd(args: argparse.Namespace) -> int:
    from ..editing.evaluate import evaluate_edits

    hp = _hparams(args.hparam) | {"corpus": args.corpus, "n_samples": args.n_samples}
    model = load_model(args)
    ev = evaluate_edits(model, args.n, sequential=args.sequential, layer=args.layer, seed=args.seed, **hp)
    return emit(args, ev)


def stats_cmd(args: argparse.Namespace) -> int:
    import torch

    from ..editing.stats import key_second_moment

    model = load_model(args)
    st = key_second_moment(model, args.layer, corpus=args.corpus, n_samples=args.n_samples,
                           batch_size=args.batch_size, cache_dir=args.cache_dir)
    ev = torch.linalg.eigvalsh(st.C.double())
    info = {"key": st.key, "count": st.count, "path": str(st.path) if st.path else None,
            "trace": float(ev.sum()), "eig_max": float(ev[-1]), "eig_min": float(ev[0]),
            "effective_rank": float(ev.sum() ** 2 / (ev ** 2).sum())}
    return emit(args, st, f"{st!r}\ncached at {info['path']}\ntrace {info['trace']:.4g}, eigenvalues "
                f"{info['eig_min']:.3g} … {info['eig_max']:.3g}, effective rank {info['effective_rank']:.1f}", info)
