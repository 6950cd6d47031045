"""ROME on the embedded fact model, CounterFact-style.

1. Layer choice: the average MLP causal trace over known facts (last subject token) — the
   justification of ``DEFAULT_LAYERS["gpt2-facts"]``.
2. ``--n`` counterfactual requests edited one at a time (each undone bit-exactly): efficacy,
   paraphrase, neighbourhood scores and magnitudes, fluency, KL drift, edit time.
3. ``--sequential-n`` requests edited sequentially (edits accumulate): how the scores decay.

Writes ``rome_counterfact.json`` + ``.png`` + ``.md`` (the tables) and ``rome_sequential.*`` to ``--out-dir``
(default ``analyses/results/``). ``--quick`` runs a tiny version (< 60 s) for the test suite.

    python analyses/rome_counterfact.py --n 200
    python analyses/rome_counterfact.py --model smollm2-135m --known-only --layer trace --n 200 \
        --tune-n 40 --sequential-n 0 --n-samples 50000

A real model (``--known-only``): requests are drawn from the facts the model knows
(``known_facts.known_facts``) and split in two disjoint sets, the first ``--tune-n`` for tuning
hyperparameters (``--split tune`` evaluates those) and the next ``--n`` for the reported evaluation
(``--split eval``, the default). ``--layer trace`` takes the layer where the averaged MLP indirect
effect at the last subject token peaks in ``causal_trace_<model>.json`` (run causal_trace.py first).
``--hparam k=v`` overrides a ROME hyperparameter (repeatable). Key statistics: ``--corpus``
(default: the model's own generations) over ``--n-samples`` tokens, cached on disk. A model other
than gpt2-facts writes ``rome_counterfact_<model>[_<tag>].*``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

import gpt2_interp as gi
from gpt2_interp.core.result import to_jsonable
from gpt2_interp.editing.evaluate import counterfact_requests, evaluate_edits
from gpt2_interp.analysis.tracing import average_trace
from gpt2_interp.editing.rome import DEFAULT_LAYERS, default_layer
from gpt2_interp.editing.stats import key_second_moment

RESULTS = Path(__file__).resolve().parent / "results"


def layer_choice(model, n_facts: int, seed: int = 0) -> dict:
    """Average MLP indirect effect at the last subject token, per layer, over known facts."""
    from gpt2_interp.facts.base import FactBase

    fb = FactBase.load()
    facts = random.Random(seed).sample(fb.facts(), n_facts)
    avg = average_trace(model, fb.cases(facts), kind="mlp", samples=5, progress=False)  # default_window
    effect = avg.indirect_effect[avg.kinds.index("mlp"), avg.buckets.index("last subject token")]  # [n_layer]
    return {"n_facts": n_facts, "n_known": avg.n_known, "window": avg.window,
            "mlp_indirect_effect_last_subject_token": effect.tolist(), "argmax": int(effect.argmax())}


def known_cases(model, n: int, tune_n: int, split: str, seed: int, offset: int = 0) -> list:
    """CounterFact cases about facts the model knows: the first ``tune_n`` (split "tune") or the next
    ones (split "eval") of a seeded shuffle spread over relations, ``n`` of them from ``offset`` within the
    split; case ids count from ``offset`` (so shards merged with ``--merge`` keep distinct ids)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from known_facts import known_facts_saved

    from gpt2_interp.facts.base import FactBase

    fb = FactBase.load()
    known = {(f.relation, f.subject) for f in known_facts_saved(model, fb)}
    cases = [c for c in counterfact_requests(fb, n=len(fb), seed=seed) if (c.relation, c.request.subject) in known]
    pool = cases[:tune_n] if split == "tune" else cases[tune_n:]
    picked = pool[offset : offset + n]
    if len(picked) < n:
        print(f"note: only {len(picked)} known facts in the {split} split from offset {offset} (asked for {n})")
    for i, c in enumerate(picked, start=offset):
        c.case_id = i
    return picked


def merge(paths: list[Path], out_stem: Path) -> dict:
    """Merge shard reports (same model, layer, hyperparameters and statistics) into one: rows pooled,
    summaries recomputed; writes ``out_stem``.json/.md/.png."""
    from gpt2_interp.editing.evaluate import CaseRow, EditEvaluation, summarize

    reps = [json.loads(Path(p).read_text()) for p in paths]
    keys = ("model", "layer", "stats")
    for r in reps[1:]:
        for k in keys:
            if (r[k] if k != "stats" else r[k]["corpus"]) != (reps[0][k] if k != "stats" else reps[0][k]["corpus"]):
                raise SystemExit(f"shards differ in {k}: cannot merge")
        if r["one_at_a_time"]["hparams"] != reps[0]["one_at_a_time"]["hparams"]:
            raise SystemExit("shards differ in hyperparameters: cannot merge")
    rows = sorted((CaseRow.from_dict(row) for r in reps for row in r["rows"]), key=lambda row: row.case_id)
    ids = [row.case_id for row in rows]
    if len(set(ids)) != len(ids):
        raise SystemExit("shards overlap (repeated case ids)")
    known = [row for row in rows if row.known]
    ev = EditEvaluation("rome", False, reps[0]["layer"], rows, {"all": summarize(rows), "known": summarize(known)},
                        None, reps[0]["one_at_a_time"]["hparams"], sum(r["one_at_a_time"]["seconds"] for r in reps),
                        all(r["one_at_a_time"]["restored_exactly"] for r in reps))
    report = {k: reps[0][k] for k in reps[0] if k not in ("rows", "one_at_a_time", "command")}
    report |= {"shards": [{"command": r["command"], "n": len(r["rows"]), "seconds": r["one_at_a_time"]["seconds"]}
                          for r in reps],
               "one_at_a_time": {"summary": ev.summary, "seconds": ev.seconds, "restored_exactly": ev.restored_exactly,
                                 "hparams": ev.hparams}}
    out_stem.with_suffix(".json").write_text(json.dumps(to_jsonable(report | {"rows": rows}), indent=1) + "\n")
    ev.save_plot(out_stem.with_suffix(".png"))
    st = reps[0]["stats"]
    md = [f"# ROME on {reps[0]['model']}: CounterFact-style evaluation", "",
          f"{len(reps)} shards merged (`python analyses/rome_counterfact.py --merge …`), each:", ""]
    md += [f"- `{r['command']}` ({len(r['rows'])} requests, {r['one_at_a_time']['seconds']:.0f} s)" for r in reps]
    md += ["", f"Key statistics: {st['count']} tokens of corpus `{st['corpus']}`.", "", "```", ev.table(), "```", ""]
    out_stem.with_suffix(".md").write_text("\n".join(md))
    print(ev.table())
    return report


def trace_layer(model_name: str, out_dir: Path) -> int:
    """The layer of peak average MLP indirect effect at the last subject token in the model's causal trace."""
    path = out_dir / f"causal_trace_{model_name}.json"
    if not path.exists():
        raise SystemExit(f"--layer trace needs {path}: run analyses/causal_trace.py --model {model_name} --known-only first")
    return int(json.loads(path.read_text())["peaks"]["mlp"]["by_bucket"]["last subject token"]["layer"])


def parse_hparams(items: list[str]) -> dict:
    """``["v_lr=1", "kl_factor=0.5"]`` → ``{"v_lr": 1.0, ...}`` (numbers, booleans, null, lists as JSON)."""
    out = {}
    for it in items:
        k, _, v = it.partition("=")
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
        if isinstance(out[k], list):
            out[k] = tuple(out[k])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2-facts")
    p.add_argument("--n", type=int, default=200, help="requests edited one at a time")
    p.add_argument("--sequential-n", type=int, default=50, help="requests edited sequentially (0: skip)")
    p.add_argument("--layer", default=None, help="edit layer: an int, 'trace' (see module doc) or default")
    p.add_argument("--known-only", action="store_true", help="requests about facts the model knows (real models)")
    p.add_argument("--tune-n", type=int, default=0, help="known-fact requests held out for tuning (--known-only)")
    p.add_argument("--split", choices=["eval", "tune"], default="eval")
    p.add_argument("--offset", type=int, default=0, help="first request within the split (shards; see --merge)")
    p.add_argument("--merge", nargs="+", type=Path, default=None,
                   help="merge shard JSONs into rome_counterfact_<model>[_<tag>].* instead of editing")
    p.add_argument("--hparam", action="append", default=[], help="ROME hyperparameter override k=v (repeatable)")
    p.add_argument("--corpus", default=None, help="key statistics corpus (default: the model's)")
    p.add_argument("--tag", default="", help="suffix of the output files")
    p.add_argument("--trace-facts", type=int, default=64, help="facts in the layer-choice trace (0: skip)")
    p.add_argument("--n-samples", type=int, default=100_000, help="tokens for the key statistics")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--quick", action="store_true", help="a tiny run for tests (< 60 s)")
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.sequential_n, args.trace_facts, args.n_samples = 3, 3, 0, 4000
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        merge(args.merge, out / f"rome_counterfact_{args.model}{'_' + args.tag if args.tag else ''}")
        return 0
    torch.manual_seed(args.seed)
    model = gi.load(args.model)
    layer = (default_layer(model) if args.layer is None else trace_layer(args.model, out) if args.layer == "trace"
             else int(args.layer))
    hparams = parse_hparams(args.hparam) | ({"v_steps": 5} if args.quick else {})
    report: dict = {"model": model.cfg.name, "layer": layer, "default_layers": DEFAULT_LAYERS, "quick": args.quick,
                    "command": "python analyses/rome_counterfact.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    if args.trace_facts:
        t = time.perf_counter()
        report["layer_choice"] = layer_choice(model, args.trace_facts, args.seed)
        report["layer_choice"]["seconds"] = time.perf_counter() - t
        print(f"MLP indirect effect at the last subject token by layer: "
              f"{[round(x, 3) for x in report['layer_choice']['mlp_indirect_effect_last_subject_token']]}")
    t = time.perf_counter()
    stats = key_second_moment(model, layer, corpus=args.corpus, n_samples=args.n_samples,
                              cache_dir=(out / "stats-cache") if args.quick else None)
    report["stats"] = {"corpus": stats.key["corpus"], "count": stats.count, "seconds": time.perf_counter() - t}
    if args.known_only:
        cases = known_cases(model, args.n, args.tune_n, args.split, args.seed, args.offset)
        report |= {"known_only": True, "split": args.split, "tune_n": args.tune_n, "offset": args.offset}
    else:
        cases = counterfact_requests(n=args.n, seed=args.seed)
    ev = evaluate_edits(model, cases, layer=layer, stats=stats, seed=args.seed, **hparams)
    print(ev.table())
    report["one_at_a_time"] = {"summary": ev.summary, "seconds": ev.seconds, "restored_exactly": ev.restored_exactly,
                               "hparams": ev.hparams}
    tail = "" if args.model == "gpt2-facts" else f"_{args.model}"
    tail += f"_{args.tag}" if args.tag else ""
    (out / f"rome_counterfact{tail}.json").write_text(json.dumps(to_jsonable(report | {"rows": ev.rows}), indent=1) + "\n")
    ev.save_plot(out / f"rome_counterfact{tail}.png")
    md = [f"# ROME on {model.cfg.name}: CounterFact-style evaluation", "", f"`{report['command']}`", "",
          f"Key statistics: {stats.count} tokens of corpus `{stats.key['corpus']}` "
          f"({report['stats']['seconds']:.0f} s, or read from the cache).", "", "```", ev.table(), "```", ""]
    if args.sequential_n:
        seq = evaluate_edits(model, cases[: args.sequential_n], layer=layer, stats=stats, sequential=True,
                             seed=args.seed, **hparams)
        print(seq.table())
        seq.to_json(out / f"rome_sequential{tail}.json")
        seq.save_plot(out / f"rome_sequential{tail}.png")
        md += ["Sequential (edits accumulate):", "", "```", seq.table(), "```", ""]
    (out / f"rome_counterfact{tail}.md").write_text("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
