"""Cost as the work grows: wall time and peak memory from the embedded model to GPT-2 XL shapes (and a
Llama-family ladder with grouped-query attention up to ~1B), beside transformers, TransformerLens and
nnsight doing the same work.

    python benchmarks/bench_scaling.py --quick          # gpt2-facts + gpt2 shapes, seconds to minutes
    python benchmarks/bench_scaling.py                  # the full ladder (an idle machine, an hour or more)
    python benchmarks/bench_scaling.py --sizes gpt2-medium --jobs forward,cache_resid   # a part of it
    python benchmarks/bench_scaling.py --device cuda    # the same ladder on a GPU (benchmarks/gpu_check.py --scaling)

Every measurement runs in its own subprocess (a fresh process, one library's model in it), so peak
memory is that job's alone: on the CPU the peak resident set (``VmHWM``, reset through
``/proc/self/clear_refs`` after the model is built and warmed up, so it is the job's peak with the
model loaded), on CUDA ``torch.cuda.max_memory_allocated``. Time is the median of repeated runs after a
warm-up. Models have random weights of the real configurations (fp32). Results accumulate in
``RESULTS_scaling.json`` keyed by (size, shape, job, library): a rerun skips what is there (``--fresh``
remeasures), so a long ladder can be resumed size by size; each entry records where it came from
(host, device, load average, library versions, commit).

Jobs (``--jobs``): ``forward`` (logits); ``cache_all`` (``run_with_cache`` of every hook, TL alike);
``cache_resid`` (one hook family: ``hook_resid_post`` of every block; transformers'
``output_hidden_states``; nnsight saving each block's output); ``patch`` (a resid_pre patching sweep,
every layer × position of one prompt pair: ours ``patch``, TL ``get_act_patch_resid_pre``, nnsight one
trace per cell — the peers timed on a sample of cells and scaled to all, stated); ``trace`` (ROME
causal trace, hidden states, 10 samples; ours only); ``atp`` (attribution patching of resid_pre: ours
``attribute``; TL by hand, two runs with a cache and one backward).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LIBS = ("ours", "transformers", "transformer_lens", "nnsight")
JOBS = ("forward", "cache_all", "cache_resid", "patch", "trace", "atp")
#: which libraries can do each job (the others are "n/a")
CAN = {
    "forward": LIBS,
    "cache_all": ("ours", "transformer_lens"),
    "cache_resid": LIBS,
    "patch": ("ours", "transformer_lens", "nnsight"),
    "trace": ("ours",),
    "atp": ("ours", "transformer_lens"),
}
#: (n_layer, d_model, n_head, n_kv_heads, d_mlp, d_vocab) of the ladder; None n_kv: GPT-2
SIZES: dict[str, dict] = {
    "gpt2-facts": {"family": "gpt2"},  # the embedded model's config, read from the package
    "gpt2": dict(family="gpt2", n_layer=12, d_model=768, n_head=12, d_mlp=3072, d_vocab=50257),
    "gpt2-medium": dict(family="gpt2", n_layer=24, d_model=1024, n_head=16, d_mlp=4096, d_vocab=50257),
    "gpt2-large": dict(family="gpt2", n_layer=36, d_model=1280, n_head=20, d_mlp=5120, d_vocab=50257),
    "gpt2-xl": dict(family="gpt2", n_layer=48, d_model=1600, n_head=25, d_mlp=6400, d_vocab=50257),
    "smollm2-135m": dict(family="llama", n_layer=30, d_model=576, n_head=9, n_kv=3, d_mlp=1536, d_vocab=49152),
    "smollm2-360m": dict(family="llama", n_layer=32, d_model=960, n_head=15, n_kv=5, d_mlp=2560, d_vocab=49152),
    "llama-3.2-1b": dict(family="llama", n_layer=16, d_model=2048, n_head=32, n_kv=8, d_mlp=8192, d_vocab=128256),
}
QUICK = dict(sizes=["gpt2-facts", "gpt2"], shapes=["1x16", "4x64"])
FULL = dict(sizes=list(SIZES), shapes=["1x16", "1x128", "8x128"])
PEER_CELLS = 12  # cells a peer's patching sweep is timed on (scaled to all cells)


# ----------------------------------------------------------------------------- one measurement
def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    else:
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


def _peak(dev: torch.device) -> int:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        return int(torch.cuda.max_memory_allocated(dev))
    return _hwm()


def _hf_config(spec: dict):
    import transformers

    if spec["family"] == "gpt2":
        return transformers.GPT2Config(
            n_layer=spec["n_layer"],
            n_embd=spec["d_model"],
            n_head=spec["n_head"],
            n_inner=spec["d_mlp"],
            vocab_size=spec["d_vocab"],
            n_positions=spec.get("n_ctx", 1024),
        )
    return transformers.LlamaConfig(
        num_hidden_layers=spec["n_layer"],
        hidden_size=spec["d_model"],
        num_attention_heads=spec["n_head"],
        num_key_value_heads=spec["n_kv"],
        intermediate_size=spec["d_mlp"],
        vocab_size=spec["d_vocab"],
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )


def _spec(size: str) -> dict:
    spec = dict(SIZES[size])
    if size == "gpt2-facts":
        import gpt2_interp as gi

        c = gi.load("gpt2-facts").cfg
        spec.update(
            n_layer=c.n_layer, d_model=c.d_model, n_head=c.n_head, d_mlp=c.d_mlp, d_vocab=c.d_vocab, n_ctx=c.n_ctx
        )
    return spec


def _build(lib: str, spec: dict, dev: torch.device):
    """The model of ``lib`` with random weights of ``spec`` (fp32) on ``dev``."""
    import transformers

    torch.manual_seed(0)
    if lib == "ours":
        from gpt2_interp.model import GPT2Config, HookedGPT2
        from gpt2_interp.model.config import llama_config

        kw = dict(n_layer=spec["n_layer"], d_model=spec["d_model"], n_head=spec["n_head"], d_mlp=spec["d_mlp"])
        if spec["family"] == "gpt2":
            cfg = GPT2Config(**kw, d_vocab=spec["d_vocab"], n_ctx=spec.get("n_ctx", 1024), name="bench")
        else:
            cfg = llama_config(**kw, n_kv_heads=spec["n_kv"], d_vocab=spec["d_vocab"], n_ctx=2048, name="bench")
        return HookedGPT2(cfg, seed=0).eval().to(dev)
    hf_cls = transformers.GPT2LMHeadModel if spec["family"] == "gpt2" else transformers.LlamaForCausalLM
    hf = hf_cls(_hf_config(spec)).eval().to(dev)
    if lib == "transformers":
        return hf
    if lib == "nnsight":
        from nnsight import NNsight

        return NNsight(hf)
    import transformer_lens as tl

    c = spec
    cfg = tl.HookedTransformerConfig(
        n_layers=c["n_layer"],
        d_model=c["d_model"],
        n_heads=c["n_head"],
        d_head=c["d_model"] // c["n_head"],
        d_mlp=c["d_mlp"],
        n_ctx=c.get("n_ctx", 1024) if c["family"] == "gpt2" else 2048,
        d_vocab=c["d_vocab"],
        act_fn="gelu_new" if c["family"] == "gpt2" else "silu",
        normalization_type="LN" if c["family"] == "gpt2" else "RMS",
        positional_embedding_type="standard" if c["family"] == "gpt2" else "rotary",
        gated_mlp=c["family"] != "gpt2",
        n_key_value_heads=c.get("n_kv"),
        rotary_dim=None if c["family"] == "gpt2" else c["d_model"] // c["n_head"],
        final_rms=c["family"] != "gpt2",
        device=str(dev),
        default_prepend_bos=False,
    )
    del hf
    return tl.HookedTransformer(cfg).eval()


def _blocks(model):
    """nnsight's envoys of the wrapped model's blocks (GPT-2's ``transformer.h``, Llama's ``model.layers``)."""
    return model.transformer.h if hasattr(model._module, "transformer") else model.model.layers


def _corrupted(tokens: torch.Tensor, spec: dict) -> torch.Tensor:
    """The patching jobs' corrupted prompt: the middle token replaced by the next id."""
    corrupt = tokens.clone()
    P = tokens.shape[1]
    corrupt[:, P // 2] = (corrupt[:, P // 2] + 1) % spec["d_vocab"]
    return corrupt


def _job(lib: str, job: str, model, tokens: torch.Tensor, spec: dict):
    """``(fn, cells, note)``: a function doing ``job`` once with ``lib``'s ``model``; ``cells`` the
    patching cells it covers (to scale a peer's sample up), a note on what it does."""
    n, P = spec["n_layer"], tokens.shape[1]
    corrupt = _corrupted(tokens, spec)
    ans, wrong = 1, 2
    if job == "forward":
        if lib == "ours":
            return (lambda: model(tokens)), None, ""
        if lib == "transformers":
            return (lambda: model(tokens).logits), None, ""
        if lib == "transformer_lens":
            return (lambda: model(tokens)), None, ""
        if lib == "nnsight":

            def nn_forward():
                with model.trace(tokens):
                    out = model.lm_head.output.save()
                return out

            return nn_forward, None, "a trace saving the logits"
    if job == "cache_all":
        return (lambda: model.run_with_cache(tokens)), None, "every hook point"
    if job == "cache_resid":
        if lib in ("ours", "transformer_lens"):
            return (
                (lambda: model.run_with_cache(tokens, names_filter=lambda s: s.endswith("hook_resid_post"))),
                None,
                "",
            )
        if lib == "transformers":
            return (lambda: model(tokens, output_hidden_states=True)), None, "output_hidden_states"
        blocks = _blocks(model)

        def nn_cache():
            saved = []
            with model.trace(tokens):
                for i in range(n):
                    saved.append(blocks[i].output.save())
                out = model.lm_head.output.save()
            return out, saved

        return nn_cache, None, "each block's output saved"
    cells = n * P
    if job == "patch":
        if lib == "ours":
            from gpt2_interp.analysis.patching import logit_diff, patch

            return (lambda: patch(model, tokens[:1], corrupt[:1], logit_diff(ans, wrong), progress=False)), cells, ""
        sample = [(l, p) for l in range(n) for p in range(P)]
        sample = sample[:: max(1, len(sample) // PEER_CELLS)][:PEER_CELLS]
        if lib == "transformer_lens":
            from transformer_lens import patching as tlp

            _, cache = model.run_with_cache(tokens[:1], names_filter=lambda s: s.endswith("resid_pre"))

            def metric(logits):
                return logits[0, -1, ans] - logits[0, -1, wrong]

            def tl_patch():
                # TL's own per-cell loop body (get_act_patch_resid_pre runs it for every cell)
                for l, p in sample:
                    name = f"blocks.{l}.hook_resid_pre"

                    def hook(act, hook, p=p, name=name):
                        act[:, p] = cache[name][:, p]
                        return act

                    metric(model.run_with_hooks(corrupt[:1], fwd_hooks=[(name, hook)]))
                return tlp

            return tl_patch, len(sample), f"one forward per cell, timed on {len(sample)} of {cells} cells"
        blocks = _blocks(model)

        def clean_inputs():
            saved = []
            with model.trace(tokens[:1]):
                for i in range(n):
                    saved.append(blocks[i].input.save())
            return saved

        clean = clean_inputs()

        def nn_patch():
            out = []
            for l, p in sample:
                with model.trace(corrupt[:1]):
                    h = blocks[l].input
                    h[:, p] = clean[l][:, p]
                    out.append(model.lm_head.output[:, -1].save())
            return out

        return nn_patch, len(sample), f"one trace per cell, timed on {len(sample)} of {cells} cells"
    if job == "trace":
        from gpt2_interp.analysis.tracing import causal_trace

        text = " ".join(["the"] * (P - 4)) + " Eiffel Tower is in"
        return (lambda: causal_trace(model, text, "Eiffel Tower", progress=False)), None, "hidden, 10 samples"
    if job == "atp":
        if lib == "ours":
            from gpt2_interp.analysis.attribution import attribute
            from gpt2_interp.analysis.patching import logit_diff

            return (
                (lambda: attribute(model, tokens[:1], corrupt[:1], logit_diff(ans, wrong), progress=False)),
                cells,
                "",
            )

        def tl_atp():
            names = lambda s: s.endswith("hook_resid_pre")  # noqa: E731
            _, clean_cache = model.run_with_cache(tokens[:1], names_filter=names)
            grads, acts = {}, {}

            def keep(act, hook):
                acts[hook.name] = act.detach()

            def keep_grad(g, hook):
                grads[hook.name] = g.detach()

            with torch.enable_grad():
                model.reset_hooks()
                model.add_hook(names, keep, "fwd")
                model.add_hook(names, keep_grad, "bwd")
                logits = model(corrupt[:1])
                (logits[0, -1, ans] - logits[0, -1, wrong]).backward()
                model.reset_hooks()
            return {k: ((clean_cache[k] - acts[k]) * grads[k]).sum(-1) for k in grads}

        return tl_atp, cells, "by hand: clean cache, corrupted forward + backward"
    raise ValueError(f"{lib} cannot do {job}")


def measure_one(size: str, shape: str, job: str, lib: str, device: str, min_seconds: float) -> dict:
    """Run one measurement in this process; returns its record."""
    dev = torch.device(device)
    torch.set_grad_enabled(False)
    spec = _spec(size)
    B, P = (int(x) for x in shape.split("x"))
    tokens = torch.randint(0, min(spec["d_vocab"], 50000), (B, P), generator=torch.Generator().manual_seed(0)).to(dev)
    rss0 = _rss_now()
    t0 = time.perf_counter()
    model = _build(lib, spec, dev)
    build_s = time.perf_counter() - t0
    params = sum(p.numel() for p in (model._module if lib == "nnsight" else model).parameters())
    weights = sum(p.numel() * p.element_size() for p in (model._module if lib == "nnsight" else model).parameters())
    fn, cells, note = _job(lib, job, model, tokens, spec)
    planned = None
    if lib == "ours" and job == "patch":  # the plan patch() makes before it runs, to set beside what it used
        from gpt2_interp.analysis.patching import estimate

        w = estimate(model, tokens[:1], _corrupted(tokens, spec)[:1])
        planned = dict(seconds=w.seconds, memory=w.memory, split=w.split, line=w.line())
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    out = fn()  # warm-up
    kept = _kept_bytes(out)
    del out
    rss_loaded = _rss_now()
    _reset_peak(dev)
    times = []
    while True:
        sync()
        t = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t)
        if not times[1:]:
            peak = _peak(dev)
        del out
        if len(times) >= 5 or (sum(times) >= min_seconds and len(times) >= 2) or sum(times) > 4 * min_seconds:
            break
    seconds = statistics.median(times)
    all_cells = spec["n_layer"] * P
    if cells is not None and cells < all_cells and job == "patch":
        seconds *= all_cells / cells  # a peer's per-cell loop, scaled to the whole sweep
    return dict(
        size=size,
        shape=shape,
        job=job,
        lib=lib,
        device=str(dev),
        params=params,
        weight_bytes=weights,
        tokens=B * P,
        cells=all_cells if job in ("patch", "atp") else None,
        seconds=seconds,
        repeats=len(times),
        build_seconds=build_s,
        peak_bytes=peak,
        rss_before_build=rss0 if dev.type == "cpu" else None,
        rss_loaded=rss_loaded if dev.type == "cpu" else None,
        kept_bytes=kept,
        note=note,
        estimate=planned,
    )


def _kept_bytes(out) -> int:
    """Bytes of the tensors a job returns (its logits, its cache), each storage once."""
    seen: dict[int, int] = {}

    def walk(x):
        if isinstance(x, torch.Tensor):
            s = x.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
        elif isinstance(x, dict) or hasattr(x, "items"):
            for v in x.values() if hasattr(x, "values") else []:
                walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)
        elif hasattr(x, "logits"):
            walk(x.logits)
            walk(getattr(x, "hidden_states", None))

    walk(out)
    return sum(seen.values())


# ----------------------------------------------------------------------------- the ladder
def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for dist in ("transformers", "transformer-lens", "nnsight"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    return out


def _commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def key(size: str, shape: str, job: str, lib: str, device: str) -> str:
    return f"{size}|{shape}|{job}|{lib}|{device}"


def run_ladder(a: argparse.Namespace) -> dict:
    store = json.loads(a.json.read_text()) if a.json.exists() and not a.fresh else {"runs": {}}
    runs = store["runs"]
    store.setdefault("commands", []).append(
        {
            "command": "python benchmarks/bench_scaling.py " + " ".join(sys.argv[1:]),
            "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
    )
    versions, commit = _versions(), _commit()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    todo = [
        (size, shape, job, lib)
        for size in a.sizes
        for shape in a.shapes
        for job in a.jobs
        for lib in a.libs
        if lib in CAN[job] and not (job in ("patch", "trace", "atp") and shape != a.shapes[0] and not a.every_shape)
    ]
    for i, (size, shape, job, lib) in enumerate(todo):
        k = key(size, shape, job, lib, a.device)
        if k in runs and runs[k].get("status") == "ok":
            continue
        cmd = [sys.executable, __file__, "--one", json.dumps([size, shape, job, lib, a.device, a.min_seconds])]
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, env=env)
            if p.returncode == 0:
                rec = json.loads(p.stdout.strip().splitlines()[-1])
                rec["status"] = "ok"
            else:
                err = (p.stderr.strip().splitlines() or ["?"])[-1]
                rec = dict(status="failed", error=err[-300:], returncode=p.returncode)
        except subprocess.TimeoutExpired:
            rec = dict(status="timeout", error=f"over {a.timeout} s")
        rec.update(
            load_before=load,
            load_after=os.getloadavg()[0],
            wall=time.perf_counter() - t0,
            host=platform.node(),
            cpus=os.cpu_count(),
            versions=versions,
            commit=commit,
            measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            size=size,
            shape=shape,
            job=job,
            lib=lib,
            device=a.device,
        )
        runs[k] = rec
        a.json.write_text(json.dumps(store, indent=1, sort_keys=True))  # after every measurement: resumable
        s = rec.get("seconds")
        print(
            f"[{i + 1}/{len(todo)}] {k}: {rec['status']}"
            + (f" {s:.3f} s, peak {rec['peak_bytes'] / 2**30:.2f} GB" if s is not None else f" {rec.get('error')}"),
            flush=True,
        )
    return store


# ----------------------------------------------------------------------------- report
def slope(xs: list[float], ys: list[float]) -> float | None:
    """The log-log least-squares slope of ``ys`` against ``xs`` (None with fewer than two points)."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
    return sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)


def _size_params(runs: dict) -> dict[str, int]:
    """Each size's parameter count (tied embeddings once; TransformerLens's model keeps an untied
    unembedding copy, so its own count is larger: sizes are placed by this one)."""
    out: dict[str, int] = {}
    for r in runs.values():
        out[r["size"]] = min(out.get(r["size"], r["params"]), r["params"])
    return out


def _mem(r: dict) -> int:
    """A record's peak memory: on the CPU above the process before its model was built (Python, torch and
    the libraries imported), so that sizes compare; on CUDA the allocator's peak."""
    base = r.get("rss_before_build")
    return r["peak_bytes"] - base if base is not None else r["peak_bytes"]


def _gb(b: float | None) -> str:
    return "—" if b is None else f"{b / 2**30:.2f}"


def report(store: dict, device: str, out: Path, figure: Path | None) -> str:
    runs = {k: v for k, v in store["runs"].items() if v.get("status") == "ok" and v["device"] == device}
    failed = {k: v for k, v in store["runs"].items() if v.get("status") != "ok" and v["device"] == device}
    sizes = [s for s in SIZES if any(r["size"] == s for r in runs.values())]
    shapes = sorted({r["shape"] for r in runs.values()}, key=lambda s: [int(x) for x in s.split("x")])
    lines = [
        "# Scaling: time and peak memory vs model size, ours beside transformers, TransformerLens, nnsight",
        "",
        "Written by `python benchmarks/bench_scaling.py` (each number from its own subprocess; raw records with",
        "their load average, versions and commit in `RESULTS_scaling.json`). Random weights of the real",
        f"configurations, fp32, device `{device}`. Time: median seconds; peak: "
        + (
            "`torch.cuda.max_memory_allocated` (GB)."
            if device.startswith("cuda")
            else "the process's peak resident set (`VmHWM`) during the job with the model loaded, less the"
            " resident set before the model was built (Python, torch and the library imported), GB."
        ),
        "Peers' patching sweeps run one forward per cell and are timed on a sample of cells, scaled to all.",
        "",
    ]
    commands = [c["command"] for c in store.get("commands", [])]
    if commands:
        lines += ["Measured by: " + "; ".join(f"`{c}`" for c in dict.fromkeys(commands)) + ".", ""]
    vs = next(iter(runs.values()), {}).get("versions", {})
    loads = [r["load_before"] for r in runs.values()]
    if loads:
        lines += [
            f"Versions: {', '.join(f'{k} {v}' for k, v in vs.items())}. Load average before the measurements: "
            f"{min(loads):.1f}–{max(loads):.1f} on {next(iter(runs.values()))['cpus']} CPUs "
            "(above the CPU count the machine was shared and times are inflated).",
            "",
        ]
    for shape in shapes:
        lines += [f"## batch × seq = {shape}", ""]
        header = "| size | params | job | " + " | ".join(f"{lib} s / GB" for lib in LIBS) + " | ours ÷ best peer |"
        lines += [header, "|" + "---|" * (4 + len(LIBS))]
        for size in sizes:
            for job in JOBS:
                row = {lib: runs.get(key(size, shape, job, lib, device)) for lib in LIBS}
                if not any(row.values()):
                    continue
                params = _size_params(runs)[size]
                cells = []
                for lib in LIBS:
                    r = row[lib]
                    if r:
                        cells.append(f"{r['seconds']:.3g} / {_gb(_mem(r))}")
                    elif key(size, shape, job, lib, device) in failed:
                        cells.append(failed[key(size, shape, job, lib, device)]["status"])
                    else:
                        cells.append("n/a" if lib not in CAN[job] else "—")
                peers = [row[lib]["seconds"] for lib in LIBS[1:] if row[lib]]
                ratio = f"{row['ours']['seconds'] / min(peers):.2f}×" if row["ours"] and peers else "—"
                lines.append(f"| {size} | {params / 1e6:.0f}M | {job} | " + " | ".join(cells) + f" | {ratio} |")
        lines.append("")
    lines += _goals(runs, device)
    lines += _growth(runs, device, sizes, shapes)
    if failed:
        lines += ["## Not measured", ""]
        lines += [f"- `{k}`: {v['status']} ({v.get('error', '')})" for k, v in sorted(failed.items())]
        lines.append("")
    if figure is not None and _figure(runs, device, shapes, figure):
        lines += [f"![time and memory vs parameters]({os.path.relpath(figure, out.parent)})", ""]
    text = "\n".join(lines)
    out.write_text(text)
    return text


def _goals(runs: dict, device: str) -> list[str]:
    lines = ["## Goals", ""]
    for size in ("gpt2-xl", "gpt2-large", "gpt2-medium", "gpt2"):
        shapes = sorted({r["shape"] for r in runs.values() if r["size"] == size})
        for shape in shapes:

            def g(job: str, lib: str, size: str = size, shape: str = shape) -> dict | None:
                return runs.get(key(size, shape, job, lib, device))

            ours, hf, cache = g("forward", "ours"), g("forward", "transformers"), g("cache_resid", "ours")
            if ours and hf:
                lines.append(
                    f"- {size} {shape}: forward ours ÷ transformers = {ours['seconds'] / hf['seconds']:.2f}×"
                    " (goal ≤ 1.05)"
                )
            if ours and cache:
                lines.append(
                    f"- {size} {shape}: run_with_cache(resid_post) ÷ forward = "
                    f"{cache['seconds'] / ours['seconds']:.2f}× (goal ≤ 1.1)"
                )
                if cache.get("rss_before_build") is not None:
                    need = cache["weight_bytes"] + cache["kept_bytes"]
                    used = cache["peak_bytes"] - cache["rss_before_build"]
                    lines.append(
                        f"- {size} {shape}: run_with_cache(resid_post) peak over the empty process "
                        f"{_gb(used)} GB vs weights + kept activations and logits {_gb(need)} GB = "
                        f"{used / need:.2f}× (goal ≤ 1.10)"
                    )
                for lib in ("transformer_lens", "nnsight"):
                    r = g("cache_resid", lib)
                    if r:
                        lines.append(
                            f"- {size} {shape}: the same cache's peak: ours {_gb(_mem(cache))} GB, "
                            f"{lib} {_gb(_mem(r))} GB"
                        )
    lines += _patch_goals(runs, device)
    if len(lines) == 2:
        lines.append("- no GPT-2 shape measured beside transformers yet")
    return [*lines, ""]


def _patch_goals(runs: dict, device: str) -> list[str]:
    """Per size: the patching sweep against each peer, and the plan ``patch`` made beside what it used."""
    lines = []
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for size in SIZES:
        for shape in sorted({r["shape"] for r in runs.values() if r["size"] == size and r["job"] == "patch"}):
            ours = runs.get(key(size, shape, "patch", "ours", device))
            if not ours:
                continue
            peers = [
                f"{lib} {r['seconds']:.3g} s ({r['seconds'] / ours['seconds']:.1f}× ours)"
                for lib in ("transformer_lens", "nnsight")
                if (r := runs.get(key(size, shape, "patch", lib, device)))
            ]
            lines.append(
                f"- {size} {shape}: patching sweep ({ours['cells']} cells) ours {ours['seconds']:.3g} s"
                + (f"; {', '.join(peers)}" if peers else "")
            )
            plan = ours.get("estimate")
            if plan and plan.get("memory") is not None:
                fits = "fits" if plan["memory"] <= total else "does not fit"
                lines.append(
                    f"- {size} {shape}: patch's plan before the run: peak ≈ {_gb(plan['memory'])} GB ({fits} in "
                    f"the machine's {_gb(total)} GB{', ' + plan['split'] if plan.get('split') else ''}); "
                    f"measured peak over the empty process {_gb(_mem(ours))} GB; the run finished"
                )
    return lines


def _growth(runs: dict, device: str, sizes: list[str], shapes: list[str]) -> list[str]:
    lines = [
        "## Fitted growth (log-log slopes)",
        "",
        "Time and peak memory against parameters (GPT-2 ladder, one shape), against tokens (batch × seq, one",
        "size), and patching time against cells (layers × positions). A slope of 1 is linear growth.",
        "",
        "| job | library | time vs params | memory vs params | time vs tokens | time vs cells |",
        "|---|---|---|---|---|---|",
    ]
    gpt2 = [s for s in sizes if SIZES[s]["family"] == "gpt2"]
    size_params = _size_params(runs)

    def fmt(x: float | None) -> str:
        return "—" if x is None else f"{x:.2f}"

    for job in JOBS:
        for lib in LIBS:
            rs = [r for r in runs.values() if r["job"] == job and r["lib"] == lib]
            if not rs:
                continue
            s0 = shapes[0]
            by_size = [r for r in rs if r["shape"] == s0 and r["size"] in gpt2]
            big = max((r["size"] for r in rs), key=lambda s: sizes.index(s))
            by_tok = [r for r in rs if r["size"] == big]
            cells = [r for r in rs if r.get("cells") and r["shape"] == s0 and r["size"] in gpt2]
            lines.append(
                f"| {job} | {lib} | "
                f"{fmt(slope([size_params[r['size']] for r in by_size], [r['seconds'] for r in by_size]))} | "
                f"{fmt(slope([size_params[r['size']] for r in by_size], [_mem(r) for r in by_size]))} | "
                f"{fmt(slope([r['tokens'] for r in by_tok], [r['seconds'] for r in by_tok]))} | "
                f"{fmt(slope([r['cells'] for r in cells], [r['seconds'] for r in cells]))} |"
            )
    return [*lines, ""]


def _figure(runs: dict, device: str, shapes: list[str], path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shape = shapes[0] if shapes else None
    size_params = _size_params(runs)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    drawn = False
    # one line per family (GPT-2: circles, Llama-family with grouped-query attention: triangles)
    for family, marker in (("gpt2", "o"), ("llama", "^")):
        for job, style in (("forward", "-"), ("cache_resid", "--"), ("patch", ":")):
            for lib, colour in zip(LIBS, ("C0", "C1", "C2", "C3")):
                rs = sorted(
                    (
                        r
                        for r in runs.values()
                        if r["job"] == job
                        and r["lib"] == lib
                        and r["shape"] == shape
                        and SIZES[r["size"]]["family"] == family
                    ),
                    key=lambda r: size_params[r["size"]],
                )
                if len(rs) < 1:
                    continue
                drawn = True
                xs = [size_params[r["size"]] / 1e6 for r in rs]
                label = f"{lib} {job}" + (" (Llama)" if family == "llama" else "")
                axes[0].plot(xs, [r["seconds"] for r in rs], style, color=colour, marker=marker, label=label)
                axes[1].plot(xs, [_mem(r) / 2**30 for r in rs], style, color=colour, marker=marker)
    if not drawn:
        plt.close(fig)
        return False
    for ax, what in zip(axes, ("seconds (median)", "peak memory (GB)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("parameters (M)")
        ax.set_ylabel(what)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle(f"cost vs model size, batch × seq {shape}, {device}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="gpt2-facts and gpt2 shapes, two batch × seq shapes")
    ap.add_argument("--sizes", default=None, help=f"comma-separated, of: {', '.join(SIZES)}")
    ap.add_argument("--shapes", default=None, help="comma-separated batch x seq, e.g. 1x16,8x128")
    ap.add_argument("--jobs", default=",".join(JOBS), help=f"comma-separated, of: {', '.join(JOBS)}")
    ap.add_argument("--libs", default=",".join(LIBS), help=f"comma-separated, of: {', '.join(LIBS)}")
    ap.add_argument(
        "--every-shape", action="store_true", help="sweeps (patch, trace, atp) at every shape, not the first"
    )
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--timeout", type=float, default=900, help="seconds one measurement may take (then 'timeout')")
    ap.add_argument("--min-seconds", type=float, default=2.0, help="time each job repeats for (2–5 runs)")
    ap.add_argument("--json", type=Path, default=HERE / "RESULTS_scaling.json")
    ap.add_argument("--out", type=Path, default=HERE / "RESULTS_scaling.md")
    ap.add_argument(
        "--figure", type=Path, default=ROOT / "docs" / "figures" / "scaling.png", help="the scaling figure (PNG)"
    )
    ap.add_argument("--fresh", action="store_true", help="remeasure everything (default: resume)")
    ap.add_argument("--report-only", action="store_true", help="rewrite the report from the JSON")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one is not None:
        size, shape, job, lib, device, min_s = json.loads(a.one)
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
        print(json.dumps(measure_one(size, shape, job, lib, device, min_s)))
        return {}
    plan = QUICK if a.quick else FULL
    a.sizes = a.sizes.split(",") if a.sizes else plan["sizes"]
    a.shapes = a.shapes.split(",") if a.shapes else plan["shapes"]
    a.jobs, a.libs = a.jobs.split(","), a.libs.split(",")
    for what, given, known in (("size", a.sizes, SIZES), ("job", a.jobs, JOBS), ("library", a.libs, LIBS)):
        bad = [g for g in given if g not in known]
        if bad:
            ap.error(f"unknown {what} {bad[0]!r}; known: {', '.join(known)}")
    store = run_ladder(a) if not a.report_only else json.loads(a.json.read_text())
    text = report(store, a.device, a.out, a.figure)
    print(text)
    if not a.report_only:  # the provenance of the measuring run (a rewritten report keeps it)
        from gpt2_interp.experiments.provenance import standalone, write_beside

        write_beside(a.out, standalone(sys.argv))
    return store


if __name__ == "__main__":
    main()
