"""How many statistics tokens does a MEMIT batch need? Scores vs the size of the key statistics.

MEMIT's update ``ΔW = (λC + KᵀK)⁻¹KᵀR`` depends on the key second moment ``C = E[k kᵀ]``
estimated from a corpus; MEMIT used 44M tokens per layer (100k Wikipedia records). This script
takes ONE batch of ``--n`` known requests (the first ``--n`` of ``analyses/mass_editing.py``'s
evaluation set), computes its keys ``K`` and targets ``R`` once (a full MEMIT edit, δ optimisation
with ``--target-stats``-token statistics), then for each of ``--sizes`` statistics tokens recomputes
``C`` from scratch (timed, wall and CPU), re-solves ``ΔW`` with λ fixed (``--lam``, default: the
model's ``MODEL_HPARAMS``), applies it and records ES/PS/NS, and how far ``C`` and ``ΔW`` are from
those of the largest size. One edit layer (gpt2-facts: layer 0) only: the keys there do not depend
on ``C``; our δ optimisation uses ``C`` (the rank-one update's exact effect) where original MEMIT's
``compute_z`` does not, so fixing the targets isolates what the statistics are for, the update.

    OMP_NUM_THREADS=1 python analyses/mass_editing_stats.py [--n 200] [--sizes 1000,3000,...]

Writes ``mass_editing_stats.json``, ``.md`` and ``.png`` to ``--out-dir`` (default
``analyses/results/``). ``--quick``: a tiny run for tests.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

import gpt2_interp as gi
from gpt2_interp.core.result import to_jsonable
from gpt2_interp.editing.memit import MemitHparams, compute_edits, default_layers, least_squares_update
from gpt2_interp.editing.stats import key_second_moment
from gpt2_interp.plots.editing import plot_decay

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mass_editing import _scores, known_cases  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def load_average() -> str:
    """``uptime``'s load averages (the machine may be shared), or "" where unavailable."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2-facts")
    p.add_argument("--n", type=int, default=200, help="requests in the batch")
    p.add_argument("--sizes", default="1000,3000,10000,30000,100000,300000", help="statistics tokens")
    p.add_argument("--lam", type=float, default=None, help="MEMIT's λ (default: the model's)")
    p.add_argument("--target-stats", type=int, default=100_000,
                   help="statistics tokens for the one δ optimisation that gives the batch's targets")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the machine is shared)")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--quick", action="store_true", help="a tiny run for tests")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    quick_hp = {}
    if a.quick:
        a.n, a.sizes = 3, "500,2000"
        quick_hp = dict(v_steps=3, prefixes_per_length=1, prefix_lengths=(3,))
    sizes = sorted(int(float(x)) for x in a.sizes.split(","))
    model = gi.load(a.model)
    layers = default_layers(model)
    lam = a.lam if a.lam is not None else MemitHparams.of(model).mom2_weight
    cases = known_cases(model, a.n, 0)
    reqs = [c.request for c in cases]
    report = {"model": a.model, "layers": layers, "lambda": lam, "n": len(cases), "torch_threads": torch.get_num_threads(),
              "load_before": load_average(), "unedited": _scores(model, cases, 64), "runs": []}
    # the keys K and targets R of the batch: one full MEMIT edit (δ optimisation under --target-stats tokens)
    t, c = time.perf_counter(), time.process_time()
    st_t = key_second_moment(model, layers, n_samples=a.target_stats, progress=False)
    base = compute_edits(model, reqs, stats=st_t, hparams={"mom2_weight": lam, **quick_hp})
    report["targets"] = {"stats_tokens": st_t[layers[0]].count, "edit_seconds": time.perf_counter() - t,
                         "edit_cpu_seconds": time.process_time() - c, "delta_seconds": base.metrics["delta_seconds"]}
    if len(layers) != 1:
        raise SystemExit("this script re-solves one layer's update; the model has several edit layers")
    lay = layers[0]
    K = base.keys[lay].double()
    _, V = base.factors[lay]
    if V is None:  # a dense ΔW does not keep the targets
        raise SystemExit(f"use --n below d_model ({model.cfg.d_model}) so that the edit keeps its targets R")
    R = V.double()  # [n, d_model]: z − h, the residuals the update must write (one layer: the δs)
    W = model.blocks[lay].mlp.W_out
    W0 = W.detach().clone()
    updates = {}
    for n_tok in sizes:
        t, c = time.perf_counter(), time.process_time()
        st = key_second_moment(model, layers, n_samples=n_tok, cache_dir=False, recompute=True, progress=False)
        t_stats, c_stats = time.perf_counter() - t, time.process_time() - c
        dW = least_squares_update(K, R, st[lay].C, lam) @ R  # [d_mlp, d_model]
        updates[n_tok] = (st[lay].C.double(), dW)
        with torch.no_grad():
            W.add_(dW.to(W.dtype))
        try:
            scores = _scores(model, cases, 64)
        finally:
            with torch.no_grad():
                W.copy_(W0)
        row = {"n_samples": n_tok, "count": st[lay].count, "stats_seconds": t_stats, "stats_cpu_seconds": c_stats,
               **scores, "fit_error": float((K @ dW - R).norm(dim=-1).mean() / R.norm(dim=-1).mean())}
        report["runs"].append(row)
        print(row, file=sys.stderr, flush=True)
    Cref, ref = updates[sizes[-1]]
    for row in report["runs"]:
        C, dW = updates[row["n_samples"]]
        row["C_rel_distance"] = float((C - Cref).norm() / Cref.norm())
        row["update_rel_distance"] = float((dW - ref).norm() / ref.norm())
    report["load_after"] = load_average()
    a.out_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(to_jsonable(report), indent=1) + "\n"
    (a.out_dir / "mass_editing_stats.json").write_text(text)
    render(json.loads(text), a.out_dir)
    print((a.out_dir / "mass_editing_stats.md").read_text())
    return 0


def render(report: dict, out: Path) -> None:
    """``mass_editing_stats.md`` (table) and ``.png`` (ES/PS/NS vs statistics tokens)."""
    pc = lambda x: f"{100 * x:.1f}" if x is not None else "–"  # noqa: E731
    runs, tg = report["runs"], report["targets"]
    lines = [f"# Key statistics size vs MEMIT scores ({report['model']}, layers {report['layers']}, "
             f"λ = {report['lambda']:g})", "",
             f"One MEMIT batch of {report['n']} known requests, key statistics from the model's statistics corpus; "
             f"unedited ES/PS/NS {pc(report['unedited']['es'])}/{pc(report['unedited']['ps'])}/"
             f"{pc(report['unedited']['ns'])}. The batch's keys and targets (δ optimisation) come from one MEMIT "
             f"edit with {tg['stats_tokens']:,}-token statistics ({tg['edit_seconds']:.0f} s wall, "
             f"{tg['edit_cpu_seconds']:.0f} s CPU); each row re-solves the update with that row's C "
             "(exact for one edit layer: the keys do not depend on C, and original MEMIT's targets do not either). "
             f"CPU, {report['torch_threads']} torch thread(s); load: `{report['load_before']}` (before) / "
             f"`{report['load_after']}` (after).", "",
             "| tokens asked | tokens used | ES | PS | NS | ‖C − C_max‖/‖C_max‖ | ‖ΔW − ΔW(C_max)‖/‖ΔW(C_max)‖ | statistics wall (CPU) s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['n_samples']:,} | {r['count']:,} | {pc(r['es'])} | {pc(r['ps'])} | {pc(r['ns'])} | "
                     f"{r['C_rel_distance']:.3f} | {r['update_rel_distance']:.3f} | {r['stats_seconds']:.1f} "
                     f"({r['stats_cpu_seconds']:.1f}) |")
    (out / "mass_editing_stats.md").write_text("\n".join(lines) + "\n")
    xs = [r["count"] for r in runs]
    fig = plot_decay({"MEMIT": xs}, {m: {"MEMIT": [r[k] for r in runs]} for m, k in (("ES", "es"), ("PS", "ps"), ("NS", "ns"))},
                     reference={"NS": report["unedited"]["ns"]}, xlabel="statistics tokens", log_x=True,
                     title=f"{report['model']}: one MEMIT batch of {report['n']} vs key statistics size")
    fig.savefig(out / "mass_editing_stats.png", dpi=110)


if __name__ == "__main__":
    raise SystemExit(main())
