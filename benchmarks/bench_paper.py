"""gpt2-interp's paper mode against the authors' ROME and MEMIT code: the same edits, and how much faster.

    git -C <rome mirror> archive 0874014cd9837e4365f3e6f3c71400ef11509e04 | tar -x -C /tmp/rome_src
    git -C <memit mirror> archive 80426fd9316cf9a50c5ba15e0912f2c2c5bfe84b | tar -x -C /tmp/memit_src
    python benchmarks/bench_paper.py --rome /tmp/rome_src --memit /tmp/memit_src --out benchmarks/RESULTS_paper.md

On gpt2-facts, with the fixed inputs of tests/data/paper_golden (README.md there: the Hugging Face copy of the
model, the statistics, the context prefixes, the authors' gpt2-xl hyperparameters and the shims their code needs
on a CPU), for requests the golden data do not hold (``known_cases(model, n, seed=1)``: facts the model knows,
each asked for CounterFact's new target):

1. ROME at layer 0, each request alone (the first ``--rome-n``): the authors' ``compute_u`` + ``compute_v`` against
   ``rome.compute_edit(…, preset="paper")``; ΔW = outer(u, v) compared per request — goal ≤ 1e-3 relative.
2. One MEMIT batch of all the requests at layers 0 and 4: the authors' ``execute_memit`` against
   ``memit.compute_edits(…, hparams={"preset": "paper"})``; ΔW per layer and z compared — goal ≤ 1e-3 relative.
3. The time of each (the statistics and the model's loading excluded from both) — goal ≥ 3× faster.

Each side runs in its own process (the authors' ROME and MEMIT trees share module names), one after the other,
on one thread; the ratio is of times measured in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import types
import warnings
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "paper_golden" / "make_golden.py"
ROME_LAYER = 0
MEMIT_LAYERS = [0, 4]
N_SAMPLES = 20_000


def _make_golden() -> types.ModuleType:
    """tests/data/paper_golden/make_golden.py: the shims and hyperparameters of the golden runs."""
    spec = importlib.util.spec_from_file_location("make_golden", GOLDEN)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _inputs(n_samples: int):
    import gpt2_interp
    from gpt2_interp.editing.stats import key_second_moment

    model = gpt2_interp.load("gpt2-facts")
    stats = key_second_moment(model, sorted({ROME_LAYER, *MEMIT_LAYERS}), n_samples=n_samples, progress=False)
    return model, stats


def worker_authors_rome(src: Path, requests: list[dict], n_samples: int) -> dict:
    """The authors' compute_u and compute_v per request (rome/compute_u.py, compute_v.py)."""
    from gpt2_interp.editing.targets import context_prefix_groups

    mg = _make_golden()
    model, stats = _inputs(n_samples)
    prefixes = [p for g in context_prefix_groups(model, (5, 10), 10, seed=0, style="rome") for p in g]
    templates = ["{}"] + [p + ". {}" for p in prefixes]
    hf, tok = mg._setup(src, model)
    import rome.compute_u as cu
    import rome.compute_v as cv

    C_inv = torch.inverse(stats[ROME_LAYER].C.double()).float()
    cu.get_inv_cov = lambda *a, **k: C_inv
    cv.torch = mg._CpuTorch("torch")
    hp = mg.rome_hparams(model, ROME_LAYER)
    out: dict = {"seconds": [], "u": [], "v": []}
    for req in requests:
        with contextlib.redirect_stdout(io.StringIO()):
            t = time.perf_counter()
            u = cu.compute_u(hf, tok, req, hp, ROME_LAYER, templates)
            v = cv.compute_v(hf, tok, req, hp, ROME_LAYER, u, templates)
            out["seconds"].append(time.perf_counter() - t)
        out["u"].append(u.detach())
        out["v"].append(v.detach())
    return out


def worker_authors_memit(src: Path, requests: list[dict], n_samples: int) -> dict:
    """The authors' execute_memit on the batch (memit/memit_main.py)."""
    from gpt2_interp.editing.targets import context_prefix_groups

    mg = _make_golden()
    model, stats = _inputs(n_samples)
    (prefixes,) = context_prefix_groups(model, (10,), 5, seed=0, style="memit")
    templates = [["{}"], [p + ". {}" for p in prefixes]]
    hf, tok = mg._setup(src, model)
    import memit.compute_z as cz
    import memit.memit_main as mm
    from util import nethook

    cz.torch = mg._CpuTorch("torch")
    cz.nethook = types.SimpleNamespace(
        TraceDict=mg._block_output_as_tuple(nethook),
        set_requires_grad=nethook.set_requires_grad,
        get_parameter=nethook.get_parameter,
        get_module=nethook.get_module,
    )
    mm.get_context_templates = lambda *a, **k: templates
    C = {f"transformer.h.{l}.mlp.c_proj": stats[l].C.float() for l in MEMIT_LAYERS}
    mm.get_cov = lambda model, tok, layer_name, *a, **k: C[layer_name]
    zs: list[torch.Tensor] = []
    compute_z = mm.compute_z

    def record_z(*a, **k):
        zs.append(compute_z(*a, **k).detach().clone())
        return zs[-1]

    mm.compute_z = record_z
    hp = mg.memit_hparams(model, MEMIT_LAYERS)
    with contextlib.redirect_stdout(io.StringIO()):
        t = time.perf_counter()
        deltas = mm.execute_memit(hf, tok, requests, hp)
        seconds = time.perf_counter() - t
    out: dict = {"seconds": seconds, "z": torch.stack(zs)}
    for l in MEMIT_LAYERS:
        adj_k, resid = deltas[f"transformer.h.{l}.mlp.c_proj.weight"]
        out[f"delta.{l}"] = adj_k.double() @ resid.double().T  # [d_mlp, d_model], as apply_memit_to_model
    return out


def worker_ours(requests: list[dict], n_samples: int, rome_n: int | None = None) -> dict:
    """gpt2-interp's paper mode: ROME per request (the first ``rome_n``) and one MEMIT batch of all."""
    from gpt2_interp.editing import memit, rome

    model, stats = _inputs(n_samples)
    reqs = [{"prompt": r["prompt"], "subject": r["subject"], "target": r["target_new"]["str"]} for r in requests]
    out: dict = {"rome_seconds": [], "u": [], "v": []}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for r in reqs[:rome_n]:
            t = time.perf_counter()
            e = rome.compute_edit(model, r, layer=ROME_LAYER, stats=stats[ROME_LAYER], progress=False, preset="paper")
            out["rome_seconds"].append(time.perf_counter() - t)
            out["u"].append(e.u)
            out["v"].append(e.v)
        t = time.perf_counter()
        e = memit.compute_edits(
            model,
            reqs,
            layers=MEMIT_LAYERS,
            stats={l: stats[l] for l in MEMIT_LAYERS},
            hparams={"preset": "paper"},
            progress=False,
        )
        out["memit_seconds"] = time.perf_counter() - t
    out["label"] = e.label
    out["z"] = e.v_star
    for l in MEMIT_LAYERS:
        out[f"delta.{l}"] = e.delta(l).double()
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _run_worker(
    kind: str, src: Path | None, requests: Path, n_samples: int, out: Path, rome_n: int | None = None
) -> dict:
    cmd = [sys.executable, __file__, "--worker", kind, "--requests", str(requests), "--n-samples", str(n_samples)]
    cmd += ["--rome-n", str(rome_n)] if rome_n is not None else []
    cmd += ["--src", str(src)] if src is not None else []
    subprocess.run([*cmd, "--worker-out", str(out)], check=True, env=os.environ | {"PYTHONPATH": str(ROOT)})
    return torch.load(out, weights_only=False)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rome", type=Path, help="a checkout of github.com/kmeng01/rome at the golden commit")
    ap.add_argument("--memit", type=Path, help="a checkout of github.com/kmeng01/memit at the golden commit")
    ap.add_argument("--n", type=int, default=20, help="requests: one MEMIT batch")
    ap.add_argument("--rome-n", type=int, default=None, help="of those, the requests ROME edits, each alone (all)")
    ap.add_argument("--n-samples", type=int, default=N_SAMPLES, help="tokens for the key statistics")
    ap.add_argument("--out", type=Path, default=None, help="write the table here (and provenance beside it)")
    ap.add_argument("--worker", choices=["authors-rome", "authors-memit", "ours"], help=argparse.SUPPRESS)
    ap.add_argument("--src", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--requests", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    if a.worker:
        reqs = json.loads(a.requests.read_text(encoding="utf-8"))
        if a.worker == "authors-rome":
            got = worker_authors_rome(a.src, reqs, a.n_samples)
        elif a.worker == "authors-memit":
            got = worker_authors_memit(a.src, reqs, a.n_samples)
        else:
            got = worker_ours(reqs, a.n_samples, a.rome_n)
        torch.save(got, a.worker_out)
        return {}
    if a.rome is None or a.memit is None:
        ap.error("--rome and --memit (checkouts of the authors' code) are required")

    import gpt2_interp
    from gpt2_interp.editing.evaluate import known_cases
    from gpt2_interp.experiments.provenance import standalone, write_beside

    model = gpt2_interp.load("gpt2-facts")
    cases = known_cases(model, a.n, seed=1)
    requests = [
        {
            "case_id": i,
            "prompt": c.request.prompt,
            "subject": c.request.subject,
            "target_new": {"str": c.request.target},
        }
        for i, c in enumerate(cases)
    ]
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as d:
        rq = Path(d) / "requests.json"
        rq.write_text(json.dumps(requests), encoding="utf-8")
        rq_rome = Path(d) / "rome_requests.json"
        rq_rome.write_text(json.dumps(requests[: a.rome_n or len(requests)]), encoding="utf-8")
        theirs_r = _run_worker("authors-rome", a.rome, rq_rome, a.n_samples, Path(d) / "ar.pt")
        theirs_m = _run_worker("authors-memit", a.memit, rq, a.n_samples, Path(d) / "am.pt")
        ours = _run_worker("ours", None, rq, a.n_samples, Path(d) / "o.pt", a.rome_n)

    rome_rel = [
        _rel(torch.outer(u, v), torch.outer(tu, tv))
        for u, v, tu, tv in zip(ours["u"], ours["v"], theirs_r["u"], theirs_r["v"])
    ]
    n_rome = len(rome_rel)
    memit_rel = {l: _rel(ours[f"delta.{l}"], theirs_m[f"delta.{l}"]) for l in MEMIT_LAYERS}
    t_rome_theirs, t_rome_ours = sum(theirs_r["seconds"]), sum(ours["rome_seconds"])
    rows = [
        (
            f"ROME, {n_rome} requests each alone: ΔW = outer(u, v), largest relative difference",
            f"{max(rome_rel):.2g} (median {sorted(rome_rel)[len(rome_rel) // 2]:.2g})",
            "≤ 1e-3",
        ),
        (
            f"MEMIT, one batch of {len(requests)} at layers {MEMIT_LAYERS}: ΔW per layer, relative difference",
            ", ".join(f"L{l}: {x:.2g}" for l, x in memit_rel.items()) + f"; z: {_rel(ours['z'], theirs_m['z']):.2g}",
            "≤ 1e-3",
        ),
        (
            f"ROME time ({n_rome} requests): the authors' ÷ ours",
            f"{t_rome_theirs / t_rome_ours:.2f}× ({t_rome_theirs:.1f} s vs {t_rome_ours:.1f} s)",
            "≥ 3×",
        ),
        (
            "MEMIT batch time: the authors' ÷ ours",
            f"{theirs_m['seconds'] / ours['memit_seconds']:.2f}× ({theirs_m['seconds']:.1f} s vs "
            f"{ours['memit_seconds']:.1f} s)",
            "≥ 3×",
        ),
    ]
    env = (
        f"torch {torch.__version__}, 1 thread, {os.cpu_count()} cores, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} "
        f"UTC, load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; gpt2-facts, "
        f"{a.n_samples} statistics tokens; ours: `{ours['label']}`"
    )
    text = "\n".join(["| measurement | value | goal |", "|---|---|---|", *(f"| {m} | {v} | {g} |" for m, v, g in rows)])
    text += f"\n\n({env})\n"
    print(text)
    if a.out:
        a.out.write_text(
            "# The paper mode against the authors' code\n\n`python benchmarks/bench_paper.py`\n\n"
            + (__doc__.split("\n\n", 2)[2].strip() + "\n\n")
            + text,
            encoding="utf-8",
        )
        write_beside(a.out, standalone(sys.argv, [model]))
    return {"rome_rel": rome_rel, "memit_rel": memit_rel}


if __name__ == "__main__":
    main()
