"""The δ optimisation of fact editing on one CPU thread: this checkout against another, and against its floor.

    OMP_NUM_THREADS=1 python benchmarks/bench_delta.py --baseline DIR [--repeats 3] [--rome-cases 3]
        [--memit-n 8] [--out benchmarks/RESULTS_delta.md]

``DIR`` is another checkout of the package (``git archive <commit> | tar -x -C DIR``). Each code runs in a
subprocess of its own (``OMP_NUM_THREADS=1``, one torch thread) that loads SmolLM2-135M and the key
statistics of its edit layer once (read from the cache; computed first if absent, before any clock
starts); the parent sends them the same tasks in turn, interleaved (repeat 1: baseline then this checkout,
every task; repeat 2: …), and reports medians:

1. **ROME**, one edit (:func:`~gpt2_interp.editing.rome.compute_edit` with the cached statistics) of each of
   ``--rome-cases`` known CounterFact cases, in the paper preset and with the defaults: the edit's time and
   its δ optimisation's;
2. **MEMIT's δ**, :func:`~gpt2_interp.editing.targets.optimise_deltas` called as MEMIT calls it (δ on the
   residual after the top edit layer, packed rows, its norm reference and key weights) on ``--memit-n``
   known cases in one batch, paper preset and defaults: seconds per request.

Both codes' δ are compared (largest ‖δ − δ_base‖ / ‖δ_base‖).

**The floor** is the work the algorithm cannot skip: every evaluation is a forward of the blocks above
the edit layer over the tokens that depend on δ (every real token when δ is added by the rank-one
update's exact effect at every position, the defaults' ``exact_edit``; from the subject's last token on
when δ is added at that token only, the paper's), plus the vocabulary projection at the positions the
loss reads; every Adam update adds a backward to δ (input gradients only: the weights are frozen). So
``(steps + 1)`` forwards and ``steps`` backwards; their FLOPs (``2·params`` per token and layer, ``4·d_model``
per query-key pair, ``2·d_model·d_vocab`` per read position; a backward the matrix products again and
twice the attention) and their time: one forward and one forward+backward of that step's batch measured
alone (median of 5) on this machine, times the counts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TASKS = ("rome-paper", "rome-default", "memit-paper", "memit-default")


# ---------------------------------------------------------------- the worker (one per code)
class Worker:
    """SmolLM2-135M, its edit layer's statistics and known cases, loaded once in this process."""

    def __init__(self, n_cases: int) -> None:
        import torch

        import gpt2_interp as gi
        from gpt2_interp.editing import rome, targets
        from gpt2_interp.editing.evaluation import known_cases
        from gpt2_interp.editing.stats import key_second_moment

        torch.set_num_threads(1)
        self.torch, self.gi, self.rome, self.targets = torch, gi, rome, targets
        self.model = gi.load("smollm2-135m")
        self.layer = rome.default_layer(self.model)
        self.stats = key_second_moment(self.model, self.layer, progress=False)
        self.cases = known_cases(self.model, n_cases)
        self.delta_s = 0.0
        inner = targets.optimise_deltas

        def timed(*a: Any, **k: Any) -> Any:  # the δ optimisation's share of an edit
            t = time.perf_counter()
            out = inner(*a, **k)
            self.delta_s = time.perf_counter() - t
            return out

        targets.optimise_deltas = timed
        self.inner = inner

    def rome_edit(self, preset: str, case: int) -> dict[str, Any]:
        kw = {"preset": "paper"} if preset == "paper" else {}
        t = time.perf_counter()
        e = self.rome.compute_edit(
            self.model, self.cases[case].request, layer=self.layer, stats=self.stats, progress=False, **kw
        )
        s = time.perf_counter() - t
        return {"s": s, "delta_s": self.delta_s, "steps": e.metrics["steps"], "delta": _delta_of(e)}

    def memit_deltas(self, preset: str, n: int, floor: bool) -> dict[str, Any]:
        from gpt2_interp.editing.memit import MemitHparams

        hp = MemitHparams.of(self.model, **({"preset": "paper"} if preset == "paper" else {}))
        r = hp.rome
        groups = self.targets.context_prefix_groups(
            self.model, r.prefix_lengths, r.prefixes_per_length, r.prefix_seed, r.prefix_style
        )
        prefixes = [p for g in groups for p in g]
        items = [(c.request, self.model.tokenizer.encode_ids(c.request.target)) for c in self.cases[:n]]
        t = time.perf_counter()
        out = self.inner(
            self.model,
            items,
            self.layer,  # SmolLM2's MEMIT window ends at ROME's layer
            prefixes,
            r,
            self.stats.solve,
            chunk=hp.chunk,
            progress=False,
            norm_reference=hp.delta_norm,
            key_weights=self.targets.variant_weights(r, groups),
            delta_site="resid_post",
            packed=True,
        )
        s = time.perf_counter() - t
        steps = [len(o["log"]) - 1 for o in out]
        res = {"s": s / n, "steps": steps, "deltas": [o["delta"].tolist() for o in out]}
        return res | ({"floor": self.floor(r, items, prefixes, steps)} if floor else {})

    def floor(self, hp: Any, items: list[Any], prefixes: list[str], steps: list[int]) -> dict[str, float]:
        """FLOPs of the passes the algorithm needs and their time measured on each request's step batch."""
        m, layer = self.model, self.layer
        cfg = m.cfg
        kl_last = hp.kl_positions == "subject_last"
        flops = secs = 0.0
        for item, n_steps in zip(items, steps):
            b = self.targets._build_batch(m, *item, prefixes, hp.kl_prompt, kl_last, hp.prepend_bos)
            mask = b.mask
            first = 0 if hp.exact_edit else b.c  # the first column that depends on δ
            real = mask.bool()
            pos = mask.long().cumsum(-1)  # keys each query sees (itself included)
            dep = real[:, first:]
            tokens = int(dep.sum())
            pairs = int((pos[:, first:] * dep).sum())
            reads = b.n_rewrite * len(item[1]) + len(b.kl_pos) + len(b.keep_cols)
            above = cfg.n_layer - layer - 1
            mm = 2 * _block_params(cfg) * tokens * above
            att = 4 * cfg.n_head * cfg.d_head * pairs * above
            vocab = 2 * cfg.d_model * cfg.d_vocab * reads
            flops += (n_steps + 1) * (mm + att + vocab) + n_steps * (mm + 2 * att + vocab)
            t_f, t_fb = self.pass_time(mask[:, first:], reads)
            secs += (n_steps + 1) * t_f + n_steps * (t_fb - t_f)
        return {"flops": flops, "s": secs}

    def pass_time(self, mask: Any, reads: int, repeats: int = 5) -> tuple[float, float]:
        """(one forward, one forward + backward to the input) of the blocks above the edit layer on a batch
        shaped like ``mask`` ``[rows, cols]`` and the vocabulary projection at ``reads`` positions."""
        torch, m = self.torch, self.model
        rows, cols = mask.shape
        att = torch.ones(cols, cols, dtype=torch.bool).tril()[None, None]
        rope = m.rotary(torch.arange(cols)[None])

        def run(grad: bool) -> float:
            x = torch.randn(rows, cols, m.cfg.d_model, requires_grad=grad)
            t = time.perf_counter()
            with torch.set_grad_enabled(grad):
                h = x
                for block in m.blocks[self.layer + 1 :]:
                    h = block(h, att, None, rope)
                at = h.reshape(-1, h.shape[-1])[: min(reads, rows * cols)]
                loss = m.unembed(m.ln_final(at)).float().log_softmax(-1)[:, 0].sum()
                if grad:
                    torch.autograd.grad(loss, x)
            return time.perf_counter() - t

        for p in m.parameters():
            p.requires_grad_(False)
        run(True)
        f = statistics.median(run(False) for _ in range(repeats))
        fb = statistics.median(run(True) for _ in range(repeats))
        return f, fb


def _block_params(cfg: Any) -> int:
    """Matrix-product parameters of one block (attention projections and the MLP)."""
    qkv = cfg.d_model * (cfg.n_head + 2 * cfg.n_kv) * cfg.d_head
    mlp = (3 if cfg.mlp in ("swiglu", "geglu") else 2) * cfg.d_model * cfg.d_mlp
    return qkv + cfg.n_head * cfg.d_head * cfg.d_model + mlp


def _delta_of(e: Any) -> list[float]:
    """v* of a rank-one edit: equal v* from equal keys means equal δ."""
    return e.v_star.float().tolist()


def worker_main(code: str, n_cases: int) -> int:
    sys.path.insert(0, code)
    w = Worker(n_cases)
    print(json.dumps({"ready": w.gi.__file__}), flush=True)
    for line in sys.stdin:
        task = json.loads(line)
        if task["kind"] == "rome":
            res = w.rome_edit(task["preset"], task["case"])
            if task.get("floor"):
                hp = w.rome.hparams_for(w.model, **({"preset": "paper"} if task["preset"] == "paper" else {}))
                groups = w.targets.context_prefix_groups(
                    w.model, hp.prefix_lengths, hp.prefixes_per_length, hp.prefix_seed, hp.prefix_style
                )
                req = w.cases[task["case"]].request
                item = (req, w.model.tokenizer.encode_ids(req.target))
                res["floor"] = w.floor(hp, [item], [p for g in groups for p in g], [res["steps"]])
        else:
            res = w.memit_deltas(task["preset"], task["n"], task.get("floor", False))
        print(json.dumps(res), flush=True)
    return 0


# ---------------------------------------------------------------- the parent
def start(code: Path, n_cases: int) -> subprocess.Popen[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    p = subprocess.Popen(
        [sys.executable, "-u", __file__, "--worker", str(code), "--n-cases", str(n_cases)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd="/",
    )
    assert p.stdout is not None
    ready = json.loads(p.stdout.readline())
    print(f"{code}: {ready['ready']}", flush=True)
    return p


def ask(p: subprocess.Popen[str], task: dict[str, Any]) -> dict[str, Any]:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(json.dumps(task) + "\n")
    p.stdin.flush()
    out = p.stdout.readline()
    if not out:
        raise RuntimeError(f"worker died on {task}")
    return json.loads(out)


def rel(a: list[float], b: list[float]) -> float:
    num = sum((x - y) ** 2 for x, y in zip(a, b)) ** 0.5
    return num / (sum(y * y for y in b) ** 0.5 or 1.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, required=False, help="another checkout of the package (before)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rome-cases", type=int, default=3)
    p.add_argument("--memit-n", type=int, default=8)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS_delta.md")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--n-cases", type=int, default=8, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker is not None:
        return worker_main(a.worker, a.n_cases)
    if a.baseline is None:
        p.error("--baseline DIR is required")
    n_cases = max(a.rome_cases, a.memit_n)
    load0 = os.getloadavg()
    codes = {"baseline": a.baseline.resolve(), "this": ROOT}
    procs = {name: start(path, n_cases) for name, path in codes.items()}
    res: dict[tuple[str, str], list[dict[str, Any]]] = {(c, t): [] for c in codes for t in TASKS}
    t0 = time.perf_counter()
    for rep in range(a.repeats):
        for task in TASKS:
            kind, preset = task.split("-")
            for case in range(a.rome_cases if kind == "rome" else 1):
                for code in codes if rep % 2 == 0 else list(codes)[::-1]:
                    msg: dict[str, Any] = {"kind": kind, "preset": preset, "case": case, "n": a.memit_n}
                    msg["floor"] = code == "this" and rep == 0
                    r = ask(procs[code], msg)
                    res[(code, task)].append(r | {"case": case})
                    print(f"rep {rep} {task} case {case} {code}: {r['s']:.2f} s, steps {r['steps']}", flush=True)
    for pr in procs.values():
        pr.stdin.close()  # type: ignore[union-attr]
        pr.wait()
    wall = time.perf_counter() - t0
    load1 = os.getloadavg()
    lines = report(a, argv, res, load0, load1, wall)
    a.out.write_text("\n".join(lines) + "\n")
    sys.path.insert(0, str(ROOT))
    from gpt2_interp.experiments.provenance import standalone, write_beside

    write_beside(a.out, standalone(sys.argv))
    print("\n".join(lines))
    return 0


def _speed_rows(
    res: dict[tuple[str, str], list[dict[str, Any]]],
    kind: str,
    cells: Callable[[list[dict[str, Any]], list[dict[str, Any]]], list[str]],
) -> list[str]:
    """A table's rows, one per preset and code: ``| preset | code | cells |``, ``cells(x, b)`` the cells of that
    code's results ``x`` of task ``{kind}-{preset}`` (``b``: the baseline's)."""
    lines = []
    for preset in ("paper", "default"):
        b, t = res[("baseline", f"{kind}-{preset}")], res[("this", f"{kind}-{preset}")]
        for name, x in (("baseline", b), ("this", t)):
            lines.append("| " + " | ".join([preset, name, *cells(x, b)]) + " |")
    return lines


def _span(values: Iterable[int]) -> str:
    """``lowest–highest`` of ``values``."""
    v = sorted(values)
    return f"{v[0]}–{v[-1]}"


def _max_rel(
    res: dict[tuple[str, str], list[dict[str, Any]]],
    kind: str,
    vectors: Callable[[dict[str, Any]], list[list[float]]],
) -> dict[str, float]:
    """Per preset, the largest ``rel`` between this checkout's and the baseline's ``vectors`` of one result, the
    results of task ``{kind}-{preset}`` paired in order."""
    return {
        p: max(
            rel(d, e)
            for x, y in zip(res[("this", f"{kind}-{p}")], res[("baseline", f"{kind}-{p}")])
            for d, e in zip(vectors(x), vectors(y))
        )
        for p in ("paper", "default")
    }


def report(
    a: argparse.Namespace,
    argv: list[str] | None,
    res: dict[tuple[str, str], list[dict[str, Any]]],
    load0: tuple[float, ...],
    load1: tuple[float, ...],
    wall: float,
) -> list[str]:
    import torch

    med = statistics.median
    cmd = " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        "# The δ optimisation on one CPU thread (SmolLM2-135M)",
        "",
        f"`OMP_NUM_THREADS=1 python benchmarks/bench_delta.py {cmd}` — {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}, one torch thread per code. **Shared machine**: 2 CPU cores used by other jobs "
        f"at the same time (load average {load0[0]:.1f} before, {load1[0]:.1f} after, {wall / 60:.0f} min), so "
        f"both codes ran the same tasks in turn, interleaved ({a.repeats} repeats, the order alternating), "
        "and the tables give medians; absolute seconds move with the load, the ratios less.",
        "",
        f"## ROME, one edit (cached key statistics), {a.rome_cases} known CounterFact cases × {a.repeats} repeats",
        "",
        "| preset | code | median s per edit | median δ s | steps | speed-up (edit) | speed-up (δ) |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += _speed_rows(
        res,
        "rome",
        lambda x, b: [
            f"{med(r['s'] for r in x):.2f}",
            f"{med(r['delta_s'] for r in x):.2f}",
            _span(r["steps"] for r in x),
            f"{med(r['s'] for r in b) / med(r['s'] for r in x):.2f}×",
            f"{med(r['delta_s'] for r in b) / med(r['delta_s'] for r in x):.2f}×",
        ],
    )
    vdiff = _max_rel(res, "rome", lambda r: [r["delta"]])
    lines += [
        "",
        f"Same edits, both codes: max ‖v* − v*_base‖/‖v*_base‖ paper {vdiff['paper']:.1e}, "
        f"default {vdiff['default']:.1e}.",
    ]
    lines += [
        "",
        f"## MEMIT's δ optimisation, {a.memit_n} known cases in one batch × {a.repeats} repeats",
        "",
        "| preset | code | median s per request | mean steps | speed-up |",
        "|---|---|---|---|---|",
    ]
    lines += _speed_rows(
        res,
        "memit",
        lambda x, b: [
            f"{med(r['s'] for r in x):.2f}",
            f"{statistics.mean(s for r in x for s in r['steps']):.1f}",
            f"{med(r['s'] for r in b) / med(r['s'] for r in x):.2f}×",
        ],
    )
    diffs = _max_rel(res, "memit", lambda r: r["deltas"])
    lines += [
        "",
        f"Same requests, both codes: max ‖δ − δ_base‖/‖δ_base‖ paper {diffs['paper']:.1e}, "
        f"default {diffs['default']:.1e}.",
    ]
    lines += [
        "",
        "## Against the floor (this checkout, first repeat)",
        "",
        "Floor: `(steps + 1)` forwards and `steps` backwards of the blocks above the edit layer over the tokens "
        "that depend on δ, with the vocabulary projection at the positions the loss reads (see the script's doc); "
        "its time is one such forward and one forward+backward measured alone on this machine, times the counts.",
        "",
        "| task | preset | floor GFLOP | floor s (measured passes) | δ s | δ ÷ floor |",
        "|---|---|---|---|---|---|",
    ]
    for task in TASKS:
        kind, preset = task.split("-")
        firsts = [r for r in res[("this", task)] if "floor" in r]
        if not firsts:
            continue
        if kind == "rome":
            fl = med(r["floor"]["flops"] for r in firsts)
            fs = med(r["floor"]["s"] for r in firsts)
            ds = med(r["delta_s"] for r in firsts)
            lines.append(f"| ROME edit | {preset} | {fl / 1e9:.0f} | {fs:.2f} | {ds:.2f} | {ds / fs:.2f}× |")
        else:
            r = firsts[0]
            fl, fs, ds = r["floor"]["flops"] / a.memit_n, r["floor"]["s"] / a.memit_n, r["s"]
            lines.append(f"| MEMIT δ per request | {preset} | {fl / 1e9:.0f} | {fs:.2f} | {ds:.2f} | {ds / fs:.2f}× |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
