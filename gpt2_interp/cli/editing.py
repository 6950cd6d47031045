"""``edit``, ``verify``, ``evaluate-edits`` and ``stats``: fact editing (ROME, MEMIT, AlphaEdit) from the
command line."""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from typing import Any

from ..core.result import Result
from . import add_model_args, add_output_args, count, emit, load_model

#: ``edit``'s exit status when an edit did not take (:data:`gpt2_interp.editing.edit.EDIT_TOOK_RULE`)
#: and ``--allow-failed`` was not given.
EXIT_EDIT_FAILED = 3


def _corpus_help() -> str:
    from ..editing.stats import DEFAULT_CORPUS_RULE

    return (
        "key-statistics corpus: 'facts', 'brown', 'generated', a text file/folder or a Hugging Face dataset "
        f"name; default: {DEFAULT_CORPUS_RULE}"
    )


def _quiet_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quiet", action="store_true", help="no progress bars or progress notes (warnings still show)")


def _took_rule() -> str:
    from ..editing.edit import EDIT_TOOK_RULE

    return EDIT_TOOK_RULE


def _weak_note() -> str:
    """What a weak edit is (:func:`gpt2_interp.editing.edit.is_weak`), for the tables."""
    from ..editing.edit import WEAK_EDIT_GAIN, WEAK_EDIT_P_AFTER

    return f"P(target) after < {WEAK_EDIT_P_AFTER:g} and up by < {WEAK_EDIT_GAIN:g}"


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
    from ..editing.settings import RomeHparams

    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--hparam takes NAME=VALUE (e.g. kl_factor=0.1), got {item!r}")
        k, v = item.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    if "layer" in out:
        raise ValueError("the edit layer is not a --hparam: give it with --layer")
    RomeHparams.of(**out)  # raises a ValueError naming a bad or unknown hyperparameter
    return out


def _layers(x: str) -> int | str | list[int]:
    if "," in x:
        try:
            return [int(v) for v in x.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"--layer takes an int, a list like 3,4,5 or 'auto', not {x!r}") from None
    return _layer(x)


def _method_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--method",
        choices=("rome", "memit", "alphaedit"),
        default=None,
        help="editor: rome (one request per edit), memit (a batch per edit), alphaedit (memit projected "
        "on the null space of the key statistics); default rome for one request, memit for --requests",
    )
    p.add_argument(
        "--sequential", action="store_true", help="edits accumulate (batches of --batch-size for memit/alphaedit)"
    )
    p.add_argument(
        "--batch-size", type=count(1), default=None, help="requests per memit/alphaedit edit (default: all in one)"
    )


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--layer",
        type=_layers,
        default=None,
        help="edit layer(s): an int, a list 3,4,5 (memit) or "
        "'auto' (causal trace); default: the model's settings file (gpt2_interp/editing/hparams/)",
    )
    p.add_argument("--corpus", default=None, help=_corpus_help())
    p.add_argument("--n-samples", type=count(1), default=100_000, help="tokens for the key statistics")
    p.add_argument(
        "--hparam",
        action="append",
        metavar="NAME=VALUE",
        help="override a ROME hyperparameter (v_steps, v_lr, kl_factor, weight_decay, clamp_factor, …)",
    )
    _quiet_arg(p)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("edit", help="rewrite facts (ROME, MEMIT, AlphaEdit); show before/after; optionally save")
    add_model_args(p)
    p.add_argument("--subject", help="the entity, e.g. 'Eiffel Tower'")
    p.add_argument("--prompt", help="the prompt with {} for the subject, e.g. '{} is located in'")
    p.add_argument("--target", help="the new continuation, e.g. ' Rome' (mind the leading space)")
    p.add_argument(
        "--requests",
        metavar="FILE.jsonl",
        help="many requests, one JSON object a line with prompt, "
        "subject, target (or ROME's target_new) and optionally keep (a list of prompts); instead of "
        "--subject/--prompt/--target",
    )
    p.add_argument(
        "--keep",
        action="append",
        default=[],
        metavar="PROMPT",
        help="a prompt about the same subject ({} where it goes) whose next token the edit must keep, "
        "e.g. 'The official language of {} is' (repeatable; see Request.keep)",
    )
    _method_args(p)
    p.add_argument(
        "--paraphrase",
        action="append",
        default=[],
        help="another prompt to show (repeatable; {} is filled with the subject)",
    )
    p.add_argument("--save", default=None, metavar="PATH", help="write the edit (safetensors + JSON)")
    p.add_argument("--top-k", type=count(1), default=5)
    p.add_argument(
        "--allow-failed",
        action="store_true",
        help=f"exit 0 even when an edit did not take (default: exit {EXIT_EDIT_FAILED}); an edit took when "
        + _took_rule(),
    )
    add_output_args(p)
    _common(p)
    p.set_defaults(func=edit_cmd)

    p = sub.add_parser("verify", help="load a saved edit and show before/after on prompts")
    add_model_args(p)
    p.add_argument("edit_file", help="an edit written by `gpt2-interp edit --save`")
    p.add_argument("--request", type=int, default=0, help="which of a MEMIT edit's requests to show (default 0)")
    p.add_argument(
        "--prompt",
        action="append",
        default=[],
        help="a prompt to check (repeatable; default: the edit's rewrite prompt)",
    )
    p.add_argument("--top-k", type=count(1), default=5)
    add_output_args(p)
    p.set_defaults(func=verify_cmd)

    p = sub.add_parser(
        "evaluate-edits",
        help="CounterFact-style evaluation of edits (ROME, MEMIT, AlphaEdit) on the embedded fact base",
    )
    add_model_args(p)
    p.add_argument("--n", type=count(1), default=200, help="number of counterfactual requests")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--keep-related",
        action="store_true",
        help="each request keeps the subject's other facts "
        "(their second training prompt; subject specificity is scored on the first)",
    )
    p.add_argument(
        "--generation-tokens",
        type=count(0),
        default=0,
        help="also score by greedy generation, this many tokens per prompt, with two-hop questions through "
        "the edits (0: not; 10 suits one-entity answers)",
    )
    _method_args(p)
    add_output_args(p)
    _common(p)
    p.set_defaults(func=evaluate_cmd)

    p = sub.add_parser("stats", help="compute (or find cached) MLP key statistics C = E[k kᵀ] for a layer")
    add_model_args(p)
    p.add_argument("--layer", type=int, required=True)
    p.add_argument("--corpus", default=None, help=_corpus_help())
    p.add_argument("--n-samples", type=count(1), default=100_000)
    p.add_argument("--batch-size", type=count(1), default=64)
    p.add_argument("--cache-dir", default=None)
    _quiet_arg(p)
    add_output_args(p, figure=False)
    p.set_defaults(func=stats_cmd)


def _read_requests(path: str) -> list[dict[str, Any]]:
    """The request objects of a JSONL file, one a line; a line that is not a JSON object, or a file
    without any, raises naming the file (and the line)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path} line {n} is not JSON ({e}); give one request object per line") from None
                if not isinstance(obj, dict):
                    raise ValueError(
                        f"{path} line {n} is a JSON {type(obj).__name__}, not a request object "
                        '{"prompt": …, "subject": …, "target": …}'
                    )
                out.append(obj)
    if not out:
        raise ValueError(
            f"{path} has no requests (it is empty or holds only blank lines); give one JSON object a "
            "line with prompt, subject and target"
        )
    return out


def edit_cmd(args: argparse.Namespace) -> int:
    from ..editing.compare import compare_topk

    single = (args.subject, args.prompt, args.target)
    if args.requests and args.keep:
        raise ValueError(
            "--keep goes with --subject/--prompt/--target; in a --requests file give each line a 'keep' list"
        )
    if args.requests and any(x is not None for x in single):
        raise ValueError("give either --requests FILE or --subject/--prompt/--target, not both")
    if not args.requests and any(x is None for x in single):
        raise ValueError("give --subject, --prompt and --target (or --requests FILE.jsonl for many)")
    if args.batch_size is not None and not args.sequential:
        raise ValueError("--batch-size splits the requests into sequential edits: add --sequential")
    hp = _hparams(args.hparam) | {"corpus": args.corpus, "n_samples": args.n_samples}
    requests = _read_requests(args.requests) if args.requests else None
    model = load_model(args)
    if requests is not None:
        return _edit_many(args, model, requests, hp)
    method = args.method or "rome"
    request = {"prompt": args.prompt, "subject": args.subject, "target": args.target, "keep": args.keep}
    if method != "rome":
        return _edit_many(args, model, [request], hp)
    from ..editing.rome import compute_edit

    edit = compute_edit(model, request, layer=args.layer, progress=not args.quiet, **hp)
    cmp = compare_topk(model, edit, [edit.request.text, *args.paraphrase], k=args.top_k)
    if args.save:
        edit.save(args.save)
    m, r = edit.metrics, edit.request
    weak = f" (weak: {_weak_note()})" if m.get("weak") else ""
    verdict = (
        f"the edit took: the edited model continues {r.text!r} with {r.target!r}"
        if edit.succeeded
        else f"THE EDIT DID NOT TAKE: the edited model continues {r.text!r} with {m['top1_after']!r}, not "
        f"{r.target!r} (an edit took when {_took_rule()})"
    )
    text = (
        f"{edit.label} edit at layer {edit.layer} in {m['seconds']:.2f} s: P({r.target!r} | "
        f"{r.text!r}) {m['p_target_before']:.4f} → {m['p_target_after']:.4f}{weak}\n{verdict}\n"
        f"top-k before | after:\n{cmp.table()}" + (f"\nsaved to {args.save}" if args.save else "")
    )
    data = {
        "edit": {"label": edit.label, "layer": edit.layer, "metrics": edit.metrics, "saved": args.save},
        "comparison": cmp.to_dict(),
    }
    emit(args, cmp, text, data)
    return _exit_status(args, [] if edit.succeeded else [0], 1)


def _exit_status(args: argparse.Namespace, failed: list[int], n: int) -> int:
    """0, or :data:`EXIT_EDIT_FAILED` (with a line on stderr) when an edit did not take and
    ``--allow-failed`` was not given."""
    if not failed or args.allow_failed:
        return 0
    print(
        f"gpt2-interp edit: {len(failed)} of {n} edit(s) did not take; exit status {EXIT_EDIT_FAILED} "
        "(--allow-failed exits 0)",
        file=sys.stderr,
    )
    return EXIT_EDIT_FAILED


def _edit_many(args: argparse.Namespace, model: Any, requests: list[dict[str, Any]], hp: dict[str, Any]) -> int:
    """Several requests: ROME one after another, or MEMIT/AlphaEdit in one batch or sequential batches.
    Each request is checked first (a target unlikely as written warns before any work); whether each
    edit took is measured on the model with every edit applied."""
    import time
    import warnings
    from pathlib import Path

    from ..editing.edit import TargetSpacingWarning, is_weak, undo_all
    from ..editing.memit import validate_requests
    from ..editing.targets import target_outcomes, validate_request

    method = args.method or "memit"
    progress = not args.quiet
    if method == "rome":
        checked = [validate_request(model, r, i) for i, r in enumerate(requests)]
        reqs, ids = [r for r, _ in checked], [t for _, t in checked]
    else:
        reqs, ids = validate_requests(model, requests)
    t0 = time.perf_counter()
    texts = [r.text for r in reqs]
    before = target_outcomes(model, texts, ids)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TargetSpacingWarning)  # shown above, once
        edits = _apply_many(args, model, method, reqs, hp, progress)
    after = target_outcomes(model, texts, ids)
    seconds = time.perf_counter() - t0
    saved = []
    if args.save:
        path = Path(args.save)
        for i, e in enumerate(edits):
            p = path if len(edits) == 1 else path.with_name(f"{path.stem}.{i:03d}{path.suffix or '.edit'}")
            saved.append(str(e.save(p)))
    undo_all(model)
    rows = []
    for r, b, a in zip(reqs, before, after):
        pb, pa = math.exp(b.logprob), math.exp(a.logprob)
        rows.append(
            {
                "prompt": r.text,
                "target": r.target,
                "p_before": pb,
                "p_after": pa,
                "took": a.took,
                "top1_after": a.top1,
                "weak": is_weak(pb, pa),
            }
        )
    label = edits[0].label if edits else method
    res = _EditRun(method, label, len(reqs), len(edits), edits[0].layers if edits else [], seconds, rows, saved)
    emit(args, res)
    return _exit_status(args, [i for i, row in enumerate(rows) if not row["took"]], len(rows))


def _apply_many(
    args: argparse.Namespace, model: Any, method: str, reqs: list[Any], hp: dict[str, Any], progress: bool
) -> list[Any]:
    """Apply the edits of ``reqs`` to ``model`` (``edit``'s --method/--sequential/--batch-size/--layer)."""
    from ..editing.memit import MemitHparams, NullSpace, apply_memit, choose_layers, default_layers
    from ..editing.rome import apply_rome
    from ..editing.stats import key_second_moment

    if method == "rome":
        return apply_rome(model, reqs, layer=args.layer, progress=progress, **hp)
    corpus, n_samples = hp.pop("corpus"), hp.pop("n_samples")
    mhp = MemitHparams.of(model, **hp, corpus=corpus, n_samples=n_samples)
    layers = args.layer if args.layer is not None else (list(mhp.layers) if mhp.layers else default_layers(model))
    layers = [layers] if isinstance(layers, int) else layers
    if layers == "auto" and method == "alphaedit":  # the null space is built for the layers: choose them first
        layers = choose_layers(model, reqs, progress=progress)
    stats = (
        None
        if layers == "auto"
        else key_second_moment(model, layers, corpus=corpus, n_samples=n_samples, progress=progress)
    )
    ns = (
        NullSpace.from_stats(stats, mhp.nullspace_threshold, mhp.nullspace_rule)
        if method == "alphaedit" and stats
        else None
    )
    return apply_memit(
        model,
        reqs,
        batch_size=args.batch_size if args.sequential else None,
        layers=layers,
        stats=stats,
        hparams=mhp,
        preserve=ns,
        progress=progress,
    )


@dataclass
class _EditRun(Result):
    """What ``edit --requests`` did: per request, P(target) before and after, whether the edit took
    (:data:`~gpt2_interp.editing.edit.EDIT_TOOK_RULE`, on the model with every edit applied) and what the
    model says instead; the files written. ``label`` names the method and its mode (``"memit (paper)"`` with
    ``--hparam preset=paper``)."""

    method: str
    label: str  # the method and its mode: "memit", "memit (paper)"
    n_requests: int
    n_edits: int
    layers: list[int]
    seconds: float
    rows: list[dict[str, Any]]
    saved: list[str]

    def table(self) -> str:
        failed = [r for r in self.rows if not r["took"]]
        weak = sum(bool(r.get("weak")) for r in self.rows)
        lines = [
            f"{self.label}: {self.n_requests} requests in {self.n_edits} edit(s) at layers {self.layers}, "
            f"{self.seconds:.1f} s; the edit took for {self.n_requests - len(failed)}/{self.n_requests}"
            + (f"; {weak} weak ({_weak_note()})" if weak else ""),
            f"(an edit took when {_took_rule()})",
        ]
        if failed:
            lines.append(f"{len(failed)} EDIT(S) DID NOT TAKE (listed first)")
        for r in (failed + [r for r in self.rows if r["took"]])[:20]:
            flag = "" if r["took"] else f"  [did not take: top-1 {r['top1_after']!r}]"
            flag += "  [weak]" if r.get("weak") else ""
            lines.append(f"  {r['prompt']!r} → {r['target']!r}: {r['p_before']:.3g} → {r['p_after']:.3g}{flag}")
        if len(self.rows) > 20:
            lines.append(f"  … {len(self.rows) - 20} more (--json for all)")
        if self.saved:
            lines.append(
                "saved to "
                + (
                    ", ".join(self.saved)
                    if len(self.saved) <= 3
                    else f"{self.saved[0]} … {self.saved[-1]} ({len(self.saved)} files; apply in order)"
                )
            )
        return "\n".join(lines)


def verify_cmd(args: argparse.Namespace) -> int:
    from ..editing.compare import compare_topk
    from ..editing.edit import Edit

    model = load_model(args)
    edit = Edit.load(args.edit_file, model)
    if not 0 <= args.request < len(edit.requests):
        raise ValueError(f"--request {args.request} is out of range: the edit holds {len(edit.requests)} requests")
    req = edit.requests[args.request]
    cmp = compare_topk(model, edit, args.prompt or [req.text], k=args.top_k, request=req)
    return emit(args, cmp, lambda: f"{edit!r}\n{cmp.table()}")


def evaluate_cmd(args: argparse.Namespace) -> int:
    from ..editing.evaluate import counterfact_requests, evaluate_edits, keep_other_relations

    hp = _hparams(args.hparam) | {"corpus": args.corpus, "n_samples": args.n_samples}
    model = load_model(args)
    cases = counterfact_requests(n=args.n, seed=args.seed)
    if args.keep_related:
        cases = keep_other_relations(cases)
    ev = evaluate_edits(
        model,
        cases,
        method=args.method or "rome",
        sequential=args.sequential,
        batch_size=args.batch_size,
        layer=args.layer,
        seed=args.seed,
        progress=not args.quiet,
        generation_tokens=args.generation_tokens,
        **hp,
    )
    return emit(args, ev)


def stats_cmd(args: argparse.Namespace) -> int:
    import torch

    from ..editing.stats import key_second_moment

    model = load_model(args)
    st = key_second_moment(
        model,
        args.layer,
        corpus=args.corpus,
        n_samples=args.n_samples,
        batch_size=args.batch_size,
        cache_dir=args.cache_dir,
        progress=not args.quiet,
    )
    ev = torch.linalg.eigvalsh(st.C.double())
    info = {
        "key": st.key,
        "count": st.count,
        "path": str(st.path) if st.path else None,
        "trace": float(ev.sum()),
        "eig_max": float(ev[-1]),
        "eig_min": float(ev[0]),
        "effective_rank": float(ev.sum() ** 2 / (ev**2).sum()),
    }
    return emit(
        args,
        st,
        f"{st!r}\ncached at {info['path']}\ntrace {info['trace']:.4g}, eigenvalues "
        f"{info['eig_min']:.3g} … {info['eig_max']:.3g}, effective rank {info['effective_rank']:.1f}",
        info,
    )
