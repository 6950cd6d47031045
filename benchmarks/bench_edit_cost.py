"""ROME's and MEMIT's cost against their FLOP floor, and the same edits' scores before and after a change.

    python benchmarks/bench_edit_cost.py [--baseline /path/to/other/checkout] [--rome-edits 8]
        [--compare-n 100] [--memit-n 1000] [--pack-sizes 64,128,256 --pack-n 32] [--out benchmarks/RESULTS_edit_cost.md]

1. **ROME on SmolLM2-135M** (the model's default layer, key statistics read from the cache — computed
   and cached before the clock starts): ``--rome-edits`` CounterFact cases the model knows, each edit
   timed alone after a warm-up edit, scored (ES/PS/NS) on the edited model and undone.
2. **MEMIT on gpt2-facts**, ``--compare-n`` known cases in one batch, timed and scored.
3. **MEMIT on gpt2-facts**, ``--memit-n`` known cases in one batch (this checkout only), timed and scored.
4. With ``--pack-sizes``, MEMIT's δ optimisation on ``--pack-n`` requests for each pack length of its
   packed steps (``PACK_TOKENS``), interleaved, this checkout only.

With ``--baseline`` (another checkout of the package, e.g. ``git archive main | tar -x -C DIR``),
parts 1 and 2 run with both codes in this process on the same requests and statistics: the
baseline's time and scores beside this checkout's, and the relative difference of their updates
``‖ΔW − ΔW_base‖ / ‖ΔW_base‖``.

**The FLOP floor** of an edit is the arithmetic its algorithm cannot avoid, counted on the real tokens
of its prompt batch (no padding): each δ evaluation is a forward of the blocks above the edit layer
(δ enters after the edit layer's MLP, so that layer and those below do not change between steps; their
matrix products, ``2 · params`` per token, and the attention's ``4 · d_model`` per query-key
pair within a prompt) plus the vocabulary projection at the positions the loss reads (``2 · d_model ·
d_vocab`` each); each Adam update adds the backward to δ, which with frozen weights is the same
matrix products again (the input gradients). ``evaluations = updates + 1``. The keys (one forward of
the blocks up to the edit layer), the solve and the before/after scoring are counted as one forward of
the bare prompts through the whole model and ``d_mlp²`` per key solve. MEMIT's floor uses its mean
step count for every request. The floor in seconds divides by this machine's measured fp32 matrix
product rate (the shape of one MLP product of a ROME step, median of 20); the ratio is time ÷ floor.

Run it on an idle machine (the header records the load average before and after).
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_split_inputs import import_package  # one checkout's gpt2_interp, replacing any imported before

ROOT = Path(__file__).resolve().parent.parent


def gemm_rate(m: int, k: int, n: int, repeats: int = 20) -> float:
    """FLOP/s of an fp32 ``[m, k] @ [k, n]`` product on this machine (median of ``repeats``)."""
    a, b = torch.randn(m, k), torch.randn(k, n)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return 2 * m * k * n / statistics.median(times)


def block_params(cfg: Any) -> int:
    """Matrix-product parameters of one block (attention projections and the MLP)."""
    qkv = cfg.d_model * (cfg.n_head + 2 * cfg.n_kv) * cfg.d_head
    mlp = (3 if cfg.mlp == "swiglu" else 2) * cfg.d_model * cfg.d_mlp
    return qkv + cfg.n_head * cfg.d_head * cfg.d_model + mlp


def row_lengths(model: Any, req: Any, prefixes: list[str], hp: Any) -> tuple[list[int], int]:
    """Token counts of the δ optimisation's rows for ``req`` (rewrite variants with the target's first
    tokens, the KL prompt, keep prompts) and the number of positions its loss reads."""
    ids = model.tokenizer.encode_ids(req.target)
    filled = req.prompt.replace("{}", req.subject)
    rows = [
        len(model.to_tokens(f"{p}. {filled}" if p else filled, prepend_bos=hp.prepend_bos)[0]) + len(ids) - 1
        for p in ["", *prefixes]
    ]
    kl = len(model.to_tokens(hp.kl_prompt.replace("{}", req.subject), prepend_bos=hp.prepend_bos)[0])
    head = len(model.to_tokens(hp.kl_prompt.split("{}")[0] + req.subject, prepend_bos=hp.prepend_bos)[0])
    kl_read = 1 if hp.kl_positions == "subject_last" else max(kl - head + 1, 1)
    keep = [len(model.to_tokens(k.replace("{}", req.subject), prepend_bos=hp.prepend_bos)[0]) for k in req.keep]
    reads = len(rows) * len(ids) + kl_read + len(keep)
    return [*rows, kl, *keep], reads


def step_flops(cfg: Any, layer: int, lengths: list[int], reads: int) -> tuple[float, float]:
    """(forward FLOPs of one δ evaluation, FLOPs of one backward to δ) for rows of ``lengths`` tokens."""
    layers = cfg.n_layer - layer - 1  # the blocks above the edit layer
    tokens = sum(lengths)
    pairs = sum(n * (n + 1) // 2 for n in lengths)
    mm = 2 * block_params(cfg) * tokens * layers
    att = 4 * cfg.n_head * cfg.d_head * pairs * layers
    vocab = 2 * cfg.d_model * cfg.d_vocab * reads
    return mm + att + vocab, mm + 2 * att + vocab


def other_flops(cfg: Any, bare_tokens: int, keys: int) -> float:
    """Keys, solve and before/after scoring: two forwards of the bare prompt through the whole model and
    one up to the edit layer (bounded by a whole forward), plus a ``d_mlp²`` solve per key."""
    return 3 * 2 * block_params(cfg) * bare_tokens * cfg.n_layer + 2 * cfg.d_mlp**2 * keys


def scores(rows: list[Any]) -> dict[str, float]:
    """Mean ES/PS/NS (percent) over case scores (cases without a score left out)."""
    out = {}
    for k in ("es", "ps", "ns"):
        vals = [getattr(r, k) for r in rows if getattr(r, k) is not None]
        out[k] = 100 * sum(vals) / len(vals) if vals else float("nan")
    return out


def dw_diff(a: Any, b: Any) -> float:
    """‖ΔW_a − ΔW_b‖ / ‖ΔW_b‖ summed over the edit's layers (dense ΔW from the edits' factors)."""
    num = den = 0.0
    for layer in b.layers:
        la, lb = a.delta(layer, dtype=torch.float64), b.delta(layer, dtype=torch.float64)
        num += float((la - lb).norm() ** 2)
        den += float(lb.norm() ** 2)
    return (num / den) ** 0.5


def rome_part(gi: Any, n_edits: int) -> dict[str, Any]:
    ed = importlib.import_module(gi.__name__ + ".editing.rome")
    ev = importlib.import_module(gi.__name__ + ".editing.evaluation")
    st = importlib.import_module(gi.__name__ + ".editing.stats")
    model = gi.load("smollm2-135m")
    layer = ed.default_layer(model)
    stats = st.key_second_moment(model, layer, progress=False)
    cases = ev.known_cases(model, n_edits + 1)
    hp = ed.hparams_for(model)
    groups = ed.context_prefix_groups(model, hp.prefix_lengths, hp.prefixes_per_length, hp.prefix_seed, hp.prefix_style)
    prefixes = [p for g in groups for p in g]
    ed.compute_edit(model, cases[0].request, layer=layer, stats=stats, progress=False)  # warm-up
    out: dict[str, Any] = {"times": [], "steps": [], "floor": [], "edits": [], "rows": []}
    for c in cases[1:]:
        t = time.perf_counter()
        e = ed.compute_edit(model, c.request, layer=layer, stats=stats, progress=False)
        out["times"].append(time.perf_counter() - t)
        with model.edited(e):
            out["rows"] += ev.case_scores(model, [c])
        steps = e.metrics["steps"]
        lengths, reads = row_lengths(model, c.request, prefixes, hp)
        fwd, bwd = step_flops(model.cfg, layer, lengths, reads)
        bare = lengths[0]
        out["floor"].append((steps + 1) * fwd + steps * bwd + other_flops(model.cfg, bare, len(lengths)))
        out["steps"].append(steps)
        out["edits"].append(e)
    out["cfg"], out["layer"], out["stats"] = model.cfg, layer, stats
    return out


def memit_part(gi: Any, n: int, progress: bool = False) -> dict[str, Any]:
    mm = importlib.import_module(gi.__name__ + ".editing.memit")
    ed = importlib.import_module(gi.__name__ + ".editing.rome")
    ev = importlib.import_module(gi.__name__ + ".editing.evaluation")
    st = importlib.import_module(gi.__name__ + ".editing.stats")
    model = gi.load("gpt2-facts")
    layers = mm.default_layers(model)
    hp = mm.MemitHparams.of(model)
    stats = st.key_second_moment(model, layers, n_samples=hp.rome.n_samples, progress=False)
    cases = ev.known_cases(model, n)
    reqs = [c.request for c in cases]
    t = time.perf_counter()
    e = mm.compute_edits(model, reqs, stats=stats, hparams=hp, progress=progress)
    total = time.perf_counter() - t
    with model.edited(e):
        rows = ev.case_scores(model, cases)
    groups = ed.context_prefix_groups(
        model, hp.rome.prefix_lengths, hp.rome.prefixes_per_length, hp.rome.prefix_seed, hp.rome.prefix_style
    )
    prefixes = [p for g in groups for p in g]
    steps = e.metrics["steps_mean"]
    floor_delta = floor_other = 0.0
    for r in reqs:
        lengths, reads = row_lengths(model, r, prefixes, hp.rome)
        fwd, bwd = step_flops(model.cfg, layers[-1], lengths, reads)
        floor_delta += (steps + 1) * fwd + steps * bwd
        floor_other += len(layers) * other_flops(model.cfg, lengths[0], len(lengths))
    return {
        "n": len(reqs),
        "time": total,
        "delta_time": e.metrics["delta_seconds"],
        "steps": steps,
        "floor_delta": floor_delta,
        "floor_other": floor_other,
        "scores": scores(rows),
        "edit": e,
        "layers": layers,
    }


def pack_part(gi: Any, n: int, sizes: list[int], repeats: int = 2) -> dict[int, list[float]]:
    """MEMIT's δ optimisation time on ``n`` gpt2-facts requests for each pack length, interleaved."""
    if not sizes:
        return {}
    mm = importlib.import_module(gi.__name__ + ".editing.memit")
    ed = importlib.import_module(gi.__name__ + ".editing.rome")
    ev = importlib.import_module(gi.__name__ + ".editing.evaluation")
    st = importlib.import_module(gi.__name__ + ".editing.stats")
    model = gi.load("gpt2-facts")
    hp = mm.MemitHparams.of(model)
    stats = st.key_second_moment(model, mm.default_layers(model), n_samples=hp.rome.n_samples, progress=False)
    reqs = [c.request for c in ev.known_cases(model, n)]
    out: dict[int, list[float]] = {k: [] for k in sizes}
    default = ed.PACK_TOKENS
    try:
        for _ in range(repeats):
            for k in sizes:
                ed.PACK_TOKENS = k
                e = mm.compute_edits(model, reqs, stats=stats, hparams=hp, progress=False)
                out[k].append(e.metrics["delta_seconds"])
                print(f"  PACK_TOKENS {k}: δ {out[k][-1]:.1f} s", flush=True)
    finally:
        ed.PACK_TOKENS = default
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", type=Path, default=None, help="another checkout to compare with (before)")
    p.add_argument("--rome-edits", type=int, default=8)
    p.add_argument("--compare-n", type=int, default=100, help="MEMIT batch run by both codes")
    p.add_argument("--memit-n", type=int, default=1000, help="MEMIT batch run by this checkout (0: skip)")
    p.add_argument(
        "--pack-sizes",
        default="",
        help="e.g. 64,128,256: MEMIT's δ time on --pack-n requests for each PACK_TOKENS, interleaved (this checkout)",
    )
    p.add_argument("--pack-n", type=int, default=32)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "RESULTS_edit_cost.md")
    a = p.parse_args(argv)
    load0 = os.getloadavg()[0]
    rate = gemm_rate(160, 576, 1536)
    codes = {"this": ROOT} | ({"baseline": a.baseline.resolve()} if a.baseline is not None else {})
    rome: dict[str, Any] = {}
    mem: dict[str, Any] = {}
    order = [n for n in ("this", "baseline") if n in codes]
    for name in order if a.rome_edits else []:
        gi = import_package(codes[name])
        print(f"{name}: ROME on smollm2-135m …", flush=True)
        rome[name] = rome_part(gi, a.rome_edits)
        x = rome[name]
        print(
            f"  times {[round(t, 2) for t in x['times']]} steps {x['steps']} "
            f"floor s {[round(f / rate, 2) for f in x['floor']]} scores {scores(x['rows'])}",
            flush=True,
        )
    for name in order if a.compare_n else []:
        gi = import_package(codes[name])
        print(f"{name}: MEMIT on gpt2-facts, {a.compare_n} requests …", flush=True)
        mem[name] = memit_part(gi, a.compare_n)
        x = mem[name]
        print(
            f"  {x['time']:.1f} s, δ {x['delta_time']:.1f} s, floor {x['floor_delta'] / rate:.1f} s, {x['scores']}",
            flush=True,
        )
    big = None
    if a.memit_n:
        gi = import_package(ROOT)
        print(f"this: MEMIT on gpt2-facts, {a.memit_n} requests …", flush=True)
        big = memit_part(gi, a.memit_n)
        print(
            f"  {big['time']:.1f} s, δ {big['delta_time']:.1f} s, floor {big['floor_delta'] / rate:.1f} s, "
            f"{big['scores']}",
            flush=True,
        )
    packs = pack_part(import_package(ROOT), a.pack_n, [int(x) for x in a.pack_sizes.split(",") if x])
    load1 = os.getloadavg()[0]

    lines = [
        "# Editing cost against the FLOP floor",
        "",
        f"`python benchmarks/bench_edit_cost.py {' '.join(argv if argv is not None else sys.argv[1:])}` — "
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}; "
        f"load average {load0:.2f} before, {load1:.2f} after. fp32 matrix-product rate of this machine "
        f"(160×576 @ 576×1536): {rate / 1e9:.0f} GFLOP/s.",
    ]
    if rome:
        lines += rome_lines(rome, rate)
    if mem:
        lines += memit_lines(mem, rate)
    if big is not None:
        lines += big_lines(big, rate)
    if packs:
        base = statistics.median(packs[min(packs)])
        lines += [
            "",
            f"## Pack length of the δ steps (`PACK_TOKENS`), MEMIT on {a.pack_n} gpt2-facts requests",
            "",
            "Each length run twice, interleaved; δ optimisation time (median) and its ratio to the shortest length's.",
            "",
            "| PACK_TOKENS | δ s | ÷ shortest |",
            "|---|---|---|",
        ]
        lines += [f"| {k} | {statistics.median(v):.1f} | {statistics.median(v) / base:.2f} |" for k, v in packs.items()]
    lines.append("")
    a.out.write_text("\n".join(lines))
    gi = import_package(ROOT)
    from gpt2_interp.experiments.provenance import standalone, write_beside

    write_beside(a.out, standalone(sys.argv))
    print("\n".join(lines))
    return 0


def fmt_scores(s: dict[str, float]) -> str:
    return f"{s['es']:.1f} / {s['ps']:.1f} / {s['ns']:.1f}"


def rome_lines(rome: dict[str, Any], rate: float) -> list[str]:
    """The ROME section: each code's median time per edit against its floor, and the two codes' updates."""
    r = rome["this"]
    med = statistics.median(r["times"])
    lines = [
        "",
        f"## ROME, SmolLM2-135M, layer {r['layer']}, cached key statistics ({r['stats'].count} tokens)",
        "",
        f"{len(r['times'])} known CounterFact cases, each edit timed alone (δ steps "
        f"{min(r['steps'])}–{max(r['steps'])}); ES/PS/NS (%) scored on each edited model.",
        "",
        "| code | median s per edit | slowest s | FLOP floor (median) | floor s | time ÷ floor | ES / PS / NS |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in ("baseline", "this"):
        if name in rome:
            x = rome[name]
            m, f = statistics.median(x["times"]), statistics.median(x["floor"])
            lines.append(
                f"| {name} | {m:.2f} | {max(x['times']):.2f} | {f / 1e9:.0f} GFLOP | {f / rate:.2f} "
                f"| {m / (f / rate):.1f}× | {fmt_scores(scores(x['rows']))} |"
            )
    if "baseline" in rome:
        diffs = [dw_diff(x, y) for x, y in zip(r["edits"], rome["baseline"]["edits"])]
        same = sum(x == y for x, y in zip(r["steps"], rome["baseline"]["steps"]))
        lines += [
            "",
            f"Same requests, both codes: ‖ΔW − ΔW_base‖/‖ΔW_base‖ max {max(diffs):.1e}; δ steps equal in "
            f"{same}/{len(diffs)} edits; median speed-up {statistics.median(rome['baseline']['times']) / med:.2f}×.",
        ]
    return lines


def memit_lines(mem: dict[str, Any], rate: float) -> list[str]:
    """The MEMIT comparison section: each code's time, δ time and floor, and the two codes' updates."""
    lines = [
        "",
        f"## MEMIT, gpt2-facts, one batch of {mem['this']['n']} known cases, cached key statistics",
        "",
        "| code | s | δ optimisation s | mean δ steps | δ floor s | δ time ÷ floor | ES / PS / NS |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in ("baseline", "this"):
        if name in mem:
            x = mem[name]
            lines.append(
                f"| {name} | {x['time']:.1f} | {x['delta_time']:.1f} | {x['steps']:.1f} "
                f"| {x['floor_delta'] / rate:.1f} | {x['delta_time'] / (x['floor_delta'] / rate):.1f}× "
                f"| {fmt_scores(x['scores'])} |"
            )
    if "baseline" in mem:
        lines += [
            "",
            "Same requests, both codes: ‖ΔW − ΔW_base‖/‖ΔW_base‖ "
            f"{dw_diff(mem['this']['edit'], mem['baseline']['edit']):.1e}; "
            f"speed-up {mem['baseline']['time'] / mem['this']['time']:.2f}×.",
        ]
    return lines


def big_lines(big: dict[str, Any], rate: float) -> list[str]:
    """The large MEMIT batch's section, with the 10-minute goal for 1,000 requests."""
    goal = "met" if big["n"] >= 1000 and big["time"] <= 600 else "**not met**"
    return [
        "",
        f"## MEMIT, gpt2-facts, {big['n']} known cases in one batch (this checkout)",
        "",
        "| measurement | value |",
        "|---|---|",
        f"| total | {big['time']:.0f} s ({big['time'] / 60:.1f} min); goal ≤ 10 min for 1,000: {goal} |",
        f"| δ optimisation | {big['delta_time']:.0f} s, mean {big['steps']:.1f} steps |",
        f"| δ FLOP floor | {big['floor_delta'] / 1e12:.2f} TFLOP = {big['floor_delta'] / rate:.0f} s "
        f"(time ÷ floor {big['delta_time'] / (big['floor_delta'] / rate):.1f}×) |",
        f"| keys, solve, scoring: time / floor | {big['time'] - big['delta_time']:.1f} s / "
        f"{big['floor_other'] / rate:.1f} s |",
        f"| ES / PS / NS | {fmt_scores(big['scores'])} |",
    ]


if __name__ == "__main__":
    sys.exit(main())
