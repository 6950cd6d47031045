"""ROME on the embedded fact model, CounterFact-style.

1. Layer choice: the average MLP causal trace over known facts (last subject token) — the
   justification of ``DEFAULT_LAYERS["gpt2-facts"]``.
2. ``--n`` counterfactual requests edited one at a time (each undone bit-exactly): efficacy,
   paraphrase, neighbourhood scores and magnitudes, fluency, KL drift, edit time.
3. ``--sequential-n`` requests edited sequentially (edits accumulate): how the scores decay.

Writes ``rome_counterfact.json`` + ``.png`` + ``.md`` (the tables) and ``rome_sequential.*`` to ``--out-dir``
(default ``analyses/results/``). ``--quick`` runs a tiny version (< 60 s) for the test suite.

    python analyses/rome_counterfact.py --n 200
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2-facts")
    p.add_argument("--n", type=int, default=200, help="requests edited one at a time")
    p.add_argument("--sequential-n", type=int, default=50, help="requests edited sequentially (0: skip)")
    p.add_argument("--layer", type=int, default=None)
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
    torch.manual_seed(args.seed)
    model = gi.load(args.model)
    layer = default_layer(model) if args.layer is None else args.layer
    report: dict = {"model": model.cfg.name, "layer": layer, "default_layers": DEFAULT_LAYERS, "quick": args.quick}
    if args.trace_facts:
        t = time.perf_counter()
        report["layer_choice"] = layer_choice(model, args.trace_facts, args.seed)
        report["layer_choice"]["seconds"] = time.perf_counter() - t
        print(f"MLP indirect effect at the last subject token by layer: "
              f"{[round(x, 3) for x in report['layer_choice']['mlp_indirect_effect_last_subject_token']]}")
    t = time.perf_counter()
    stats = key_second_moment(model, layer, n_samples=args.n_samples,
                              cache_dir=(out / "stats-cache") if args.quick else None)
    report["stats"] = {"corpus": stats.key["corpus"], "count": stats.count, "seconds": time.perf_counter() - t}
    cases = counterfact_requests(n=args.n, seed=args.seed)
    ev = evaluate_edits(model, cases, layer=layer, stats=stats, seed=args.seed,
                        **({"v_steps": 5} if args.quick else {}))
    print(ev.table())
    report["one_at_a_time"] = {"summary": ev.summary, "seconds": ev.seconds, "restored_exactly": ev.restored_exactly,
                               "hparams": ev.hparams}
    (out / "rome_counterfact.json").write_text(json.dumps(to_jsonable(report | {"rows": ev.rows}), indent=1) + "\n")
    ev.save_plot(out / "rome_counterfact.png")
    md = [f"# ROME on {model.cfg.name}: CounterFact-style evaluation", "", f"`python analyses/rome_counterfact.py --n {args.n}`"
          f"{' --quick' if args.quick else ''}", "", "```", ev.table(), "```", ""]
    if args.sequential_n:
        seq = evaluate_edits(model, cases[: args.sequential_n], layer=layer, stats=stats, sequential=True,
                             seed=args.seed, **({"v_steps": 5} if args.quick else {}))
        print(seq.table())
        seq.to_json(out / "rome_sequential.json")
        seq.save_plot(out / "rome_sequential.png")
        md += ["Sequential (edits accumulate):", "", "```", seq.table(), "```", ""]
    (out / "rome_counterfact.md").write_text("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
