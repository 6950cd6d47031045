"""Which edit layers for MEMIT on gpt2-facts: the layer window × λ × context variants, on the tuning set.

``analyses/mass_editing.py`` edits gpt2-facts at layer 0 alone (the causal trace puts its facts in
layer 0's MLP), and with 1,000 requests one 1,024-dim key space cannot fit them. MEMIT spreads the
write over several layers. This script measures, on the same 200 tuning requests as
``mass_editing.py`` (``known_cases(model, 200, seed + 1)``, none sharing a subject and relation with
its 1,000 evaluation requests), one MEMIT batch for every window ``[lo … top]`` and λ:

1. one δ optimisation per (top layer, context variants) — the target residuals at the top layer do
   not depend on λ or on the lower layers (``compute_edits(targets=)``);
2. every window ending at that top layer and every λ re-solves the update from those targets and is
   scored (ES/PS/NS, fit error ‖KΔW − R‖/‖R‖ per layer, ‖ΔW‖);
3. ``--sub B``: the same λ on sub-batches of ``B`` requests (averaged), to see how the best λ moves
   with the batch size (λC is weighed against KᵀK, which grows with the batch).

Context variants: ``memit`` = the bare prompt + 5 generated prefixes of 10 tokens (MEMIT's, 6 rows
per request); ``rome`` = + 5 of 5 tokens as well (ROME's, 11 rows).

    OMP_NUM_THREADS=1 python analyses/mass_editing_window.py --tops 0,1,2 --ctx memit
    OMP_NUM_THREADS=1 python analyses/mass_editing_window.py --tops 1 --ctx rome

Each run merges its rows into ``mass_editing_window.json`` and rewrites ``mass_editing_window.md``
in ``--out-dir`` (default ``analyses/results/``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import gpt2_interp as gi
from gpt2_interp.core.result import to_jsonable
from gpt2_interp.editing.evaluate import known_cases
from gpt2_interp.editing.memit import compute_edits
from gpt2_interp.editing.stats import key_second_moment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mass_editing import _scores  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
CTX = {"memit": {"prefix_lengths": (10,), "prefixes_per_length": 5},
       "rome": {"prefix_lengths": (5, 10), "prefixes_per_length": 5}}


@torch.no_grad()
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2-facts")
    p.add_argument("--tops", default="0,1,2", help="top edit layers (one δ optimisation each)")
    p.add_argument("--ctx", default="memit", choices=sorted(CTX), help="context variants of the δ optimisation")
    p.add_argument("--lambdas", default="100,300,1000,3000,10000")
    p.add_argument("--los", default=None, help="lowest layers of the windows (default: 0 … top)")
    p.add_argument("--n", type=int, default=1000, help="evaluation requests of mass_editing.py (excluded)")
    p.add_argument("--tune-n", type=int, default=200)
    p.add_argument("--sub", type=int, default=0, help="also score sub-batches of this many requests")
    p.add_argument("--delta-norm", default="resid", choices=("resid", "mlp_out"), help="δ's clamp scale")
    p.add_argument("--n-samples", type=int, default=100_000, help="tokens for the key statistics")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--quick", action="store_true", help="a tiny run for tests")
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.tune_n, args.lambdas, args.n_samples = 8, 4, "100", 3000
    model = gi.load(args.model)
    cases = known_cases(model, args.n, args.seed)
    tune = known_cases(model, args.tune_n, args.seed + 1, {(c.relation, c.request.subject) for c in cases})
    reqs = [c.request for c in tune]
    ns_pre = _scores(model, tune, 64)["ns"]
    tops = [int(x) for x in args.tops.split(",")]
    stats = key_second_moment(model, list(range(max(tops) + 1)), n_samples=args.n_samples, progress=False)
    lambdas = [float(x) for x in args.lambdas.split(",") if x.strip()]
    # δ scaled by the residual after the top layer (MEMIT's compute_z): ROME's v₀ scale (the MLP output)
    # clamps δ to a few units above layer 0 on this model (memit.MemitHparams.delta_norm)
    hp = {**CTX[args.ctx], "delta_norm": args.delta_norm, **(dict(v_steps=3) if args.quick else {})}
    out = args.out_dir / "mass_editing_window.json"
    report = json.loads(out.read_text()) if out.exists() and not args.quick else {"model": args.model, "rows": [],
                                                                                   "targets": []}
    report.update(n_tune=len(tune), ns_unedited=ns_pre, threads=torch.get_num_threads(),
                  delta_norm=args.delta_norm)

    def score(window: list[int], lam: float, z: torch.Tensor, idx: list[int] | None = None) -> dict:
        rq, cs, zz = (reqs, tune, z) if idx is None else ([reqs[i] for i in idx], [tune[i] for i in idx], z[idx])
        e = compute_edits(model, rq, layers=window, stats=stats, hparams={**hp, "mom2_weight": lam}, targets=zz)
        with model.edited(e):
            got = _scores(model, cs, 64)
        fit = e.metrics["fit"]
        return {**got, "fit_error": sum(f["fit_error"] for f in fit.values()) / len(fit),
                "fit_per_layer": {str(l): f["fit_error"] for l, f in fit.items()},
                "dW_norm": sum(f["dW_norm"] ** 2 for f in fit.values()) ** 0.5}

    for top in tops:
        t = time.perf_counter()
        e = compute_edits(model, reqs, layers=[top], stats=stats, hparams=hp)
        m = e.metrics
        report["targets"] = [r for r in report["targets"] if (r["top"], r["ctx"]) != (top, args.ctx)] + [{
            "top": top, "ctx": args.ctx, "seconds": time.perf_counter() - t, "delta_seconds": m["delta_seconds"],
            "steps_mean": m["steps_mean"], "p_target_optimised_mean": m["p_target_optimised_mean"],
            "delta_norm_mean": m["delta_norm_mean"], "n": len(reqs)}]
        print(report["targets"][-1], file=sys.stderr, flush=True)
        z = e.v_star
        los = [int(x) for x in args.los.split(",")] if args.los else list(range(top + 1))
        for lo in [l for l in los if l <= top]:
            window = list(range(lo, top + 1))
            for lam in lambdas:
                row = {"window": window, "ctx": args.ctx, "lambda": lam, "sub": None, **score(window, lam, z)}
                _put(report, row)
                print(row, file=sys.stderr, flush=True)
            if args.sub:
                for lam in lambdas:
                    parts = [score(window, lam, z, list(range(s, min(s + args.sub, len(reqs)))))
                             for s in range(0, len(reqs), args.sub)]
                    row = {"window": window, "ctx": args.ctx, "lambda": lam, "sub": args.sub,
                           **{k: sum(r[k] for r in parts) / len(parts) for k in ("es", "ps", "ns", "fit_error")}}
                    _put(report, row)
            args.out_dir.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(to_jsonable(report), indent=1) + "\n")
            (args.out_dir / "mass_editing_window.md").write_text(_markdown(report))
    return 0


def _put(report: dict, row: dict) -> None:
    key = lambda r: (r["window"], r["ctx"], r["lambda"], r.get("sub"))  # noqa: E731
    report["rows"] = [r for r in report["rows"] if key(r) != key(row)] + [row]


def _markdown(report: dict) -> str:
    pc = lambda x: f"{100 * x:.1f}"  # noqa: E731
    n_ctx = {k: 1 + v["prefixes_per_length"] * len(v["prefix_lengths"]) for k, v in CTX.items()}
    lines = [f"# MEMIT edit-layer window on {report['model']}", "",
             f"{report['n_tune']} tuning requests in one batch (NS unedited {pc(report['ns_unedited'])}); δ scaled by "
             f"{report['delta_norm']!r}; {report['threads']} torch thread(s). Goal (1,000 requests): ES ≥ 95, "
             "PS ≥ 85, NS within 5 points of unedited.", "",
             "δ optimisations (one per top layer and context variants; each row below re-solves from them):", "",
             "| top layer | context variants | seconds | steps (mean) | p(target) after | ‖δ‖ |", "|---|---|---|---|---|---|"]
    for t in sorted(report["targets"], key=lambda r: (r["ctx"], r["top"])):
        lines.append(f"| {t['top']} | {n_ctx[t['ctx']]} ({t['ctx']}) | {t['delta_seconds']:.0f} | "
                     f"{t['steps_mean']:.1f} | {t['p_target_optimised_mean']:.2f} | {t['delta_norm_mean']:.0f} |")
    lines += ["", "| window | context | λ | ES | PS | NS | fit (per layer) | ‖ΔW‖ |", "|---|---|---|---|---|---|---|---|"]
    rows = sorted([r for r in report["rows"] if not r.get("sub")], key=lambda r: (r["ctx"], r["window"], r["lambda"]))
    for r in rows:
        per = ", ".join(f"{float(v):.2f}" for v in r["fit_per_layer"].values())
        lines.append(f"| {r['window']} | {n_ctx[r['ctx']]} | {r['lambda']:g} | {pc(r['es'])} | {pc(r['ps'])} | "
                     f"{pc(r['ns'])} | {r['fit_error']:.2f} ({per}) | {r['dW_norm']:.0f} |")
    subs = [r for r in report["rows"] if r.get("sub")]
    if subs:
        lines += ["", "Sub-batches (λ vs batch size: the same λ on batches of `sub` requests, averaged):", "",
                  "| window | context | sub-batch | λ | ES | PS | NS | fit |", "|---|---|---|---|---|---|---|---|"]
        for r in sorted(subs, key=lambda r: (r["ctx"], r["window"], r["sub"], r["lambda"])):
            lines.append(f"| {r['window']} | {n_ctx[r['ctx']]} | {r['sub']} | {r['lambda']:g} | {pc(r['es'])} | "
                         f"{pc(r['ps'])} | {pc(r['ns'])} | {r['fit_error']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
