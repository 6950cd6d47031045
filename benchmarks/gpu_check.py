"""GPU check: fp32 parity with the CPU, bf16/fp16 throughput, written to one results file.

    python benchmarks/gpu_check.py                      # on a CUDA machine: ~6 min,
                                                        # writes benchmarks/RESULTS_gpu.{md,json}
    python benchmarks/gpu_check.py --budget 300         # a tighter time budget (seconds)
    python benchmarks/gpu_check.py --device cpu --quick # seconds, tiny sizes: the test suite runs this
    python benchmarks/gpu_check.py --scaling            # instead: the scaling ladder of bench_scaling.py on
                                                        # this GPU, RESULTS_scaling_gpu.{md,json,png}
    python benchmarks/gpu_check.py --scaling "--quick"  # ... with bench_scaling.py's own options

Needs only torch, this package and (for the peer ratios) transformers.

1. **Parity (fp32, CUDA vs CPU)** on the embedded gpt2-facts: logits, ``run_with_cache`` (every hook),
   a resid_pre patching sweep, a causal trace (hidden) and a ROME edit (same key statistics on both
   sides; its u, v and the edited model's logits), plus logits of full-size gpt2 (random weights).
   Each reports max |Δ| and max |Δ| ÷ max |reference|. TF32 is switched off for this section.
   It also counts the host syncs CUDA reports (``torch.cuda.set_sync_debug_mode``) during one
   patching sweep and one causal trace, by source line: the hot paths should have none per batch.
2. **Throughput (bf16 and fp16)** on full-size gpt2 (``HookedGPT2("gpt2", seed=0)``, random weights)
   and on gpt2-facts: ``forward``, ``run_with_cache`` (every hook), a full resid_pre patching sweep
   (every layer × position, many prompt pairs) and a causal trace (hidden, many noise samples). The
   batch is doubled until throughput stops growing, memory runs out or a call takes too long (the
   "fills the device" point), and every size tried is recorded. transformers' ``GPT2LMHeadModel``
   forward on the same weights, dtype and batch gives the peer ratio. Sweeps and traces report
   patched runs/s and forward-equivalent tokens/s (runs × prompt tokens ÷ s: each patched run
   stands for one full forward of the prompt in the one-forward-per-patch method).
3. **Results**: ``RESULTS_gpu.md`` and ``RESULTS_gpu.json`` with the device, versions and every number.

The script keeps to ``--budget`` seconds: each measurement checks the time left and is skipped,
with a note, when it would not fit; each section runs in ``try/except`` and records its error.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import copy
import json
import platform
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT))

import gpt2_interp as gi  # noqa: E402 (imported once the checkout is on sys.path)
from gpt2_interp.analysis.patching import logit_diff, patch  # noqa: E402 (imported once the checkout is on sys.path)
from gpt2_interp.analysis.tracing import causal_trace  # noqa: E402 (imported once the checkout is on sys.path)
from gpt2_interp.model import GPT2Config, HookedGPT2  # noqa: E402 (imported once the checkout is on sys.path)

PATCH_PAIR = ("The capital of France is", "The capital of Italy is", " Paris", " Rome")
TRACE_CASE = ("The capital of France is", "France")
PROMPTS = [
    "The capital of France is",
    "Paris is the capital of",
    "The Eiffel Tower is located in",
    "Water is made of hydrogen and",
]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


# ---------------------------------------------------------------- time and safety
class Budget:
    """Wall-clock budget: ``left()`` seconds remain; ``fits(s)`` whether ``s`` more seconds fit."""

    def __init__(self, seconds: float) -> None:
        self.t0, self.seconds = time.perf_counter(), seconds

    def left(self) -> float:
        return self.seconds - (time.perf_counter() - self.t0)

    def fits(self, s: float) -> bool:
        return self.left() > s


class Skipped(Exception):
    """Raised to skip an item that would not fit in the time budget."""


def section(results: dict, name: str, fn: Callable[[], Any]) -> None:
    """Run ``fn``; store its value, or the error and traceback, under ``results[name]``."""
    t0 = time.perf_counter()
    try:
        results[name] = fn()
    except Exception as e:
        results[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=6)}
        print(f"[{name}] ERROR {type(e).__name__}: {e}", flush=True)
    if isinstance(results[name], dict):
        results[name].setdefault("seconds", round(time.perf_counter() - t0, 2))


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def free_memory(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


# ---------------------------------------------------------------- environment
def environment(dev: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "device": str(dev),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gpt2_interp": gi.__version__,
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except Exception as e:
        env["transformers"] = f"unavailable ({type(e).__name__})"
    try:
        env["git_commit"] = (
            subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5
            ).stdout.strip()
            or None
        )
    except Exception:
        env["git_commit"] = None
    if dev.type == "cuda":
        p = torch.cuda.get_device_properties(dev)
        env.update(
            {
                "device_name": p.name,
                "capability": f"{p.major}.{p.minor}",
                "multiprocessors": p.multi_processor_count,
                "memory_gib": round(p.total_memory / 2**30, 1),
                "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version(),
                "sdpa_flash": torch.backends.cuda.flash_sdp_enabled(),
            }
        )
    else:
        env["device_name"] = f"CPU ({env['cpu']})"
    return env


# ---------------------------------------------------------------- models
def facts_model(dev: torch.device, dtype: torch.dtype = torch.float32) -> HookedGPT2:
    return gi.load("gpt2-facts", device=dev, dtype=dtype).eval()


def gpt2_model(quick: bool) -> HookedGPT2:
    """Full-size gpt2 with random weights (GPT-2's init), or a tiny gpt2-shaped model in quick mode."""
    if quick:
        return HookedGPT2(
            GPT2Config(n_layer=2, d_model=64, n_head=4, d_mlp=256, n_ctx=64, name="gpt2-tiny"), seed=0
        ).eval()
    return HookedGPT2("gpt2", seed=0).eval()


def diff(ref: torch.Tensor, got: torch.Tensor) -> dict[str, float]:
    """``max |Δ|`` and ``max |Δ| ÷ max |ref|`` (fp64)."""
    ref, got = ref.detach().double().cpu(), got.detach().double().cpu()
    d = float((ref - got).abs().max()) if ref.numel() else 0.0
    scale = float(ref.abs().max()) if ref.numel() else 0.0
    return {"max_abs_diff": d, "max_rel_diff": d / scale if scale else d, "ref_max_abs": scale}


@contextlib.contextmanager
def count_syncs(dev: torch.device):
    """Count the host syncs CUDA reports inside the block, by (file:line) of our code."""
    counts: collections.Counter = collections.Counter()
    if dev.type != "cuda":
        yield counts
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield counts
        finally:
            torch.cuda.set_sync_debug_mode("default")
    for w in caught:
        if "synchroniz" in str(w.message).lower():
            f = str(w.filename)
            f = f[f.find("gpt2_interp") :] if "gpt2_interp" in f else Path(f).name
            counts[f"{f}:{w.lineno}"] += 1


# ---------------------------------------------------------------- 1. parity
def parity(dev: torch.device, quick: bool, budget: Budget) -> dict[str, Any]:
    from gpt2_interp.editing.rome import compute_edit
    from gpt2_interp.editing.settings import default_layer
    from gpt2_interp.editing.stats import key_second_moment

    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    out: dict[str, Any] = {
        "tf32": False,
        "tolerance_note": "fp32 on both sides; reductions run in a different "
        "order on the GPU, so differences of ~1e-6 relative per op are expected",
    }
    try:
        cpu = facts_model(torch.device("cpu"))
        gpu = facts_model(dev)
        with torch.inference_mode():
            out["logits"] = diff(cpu(PROMPTS), gpu(PROMPTS))
            _, c_ref = cpu.run_with_cache(PROMPTS)
            _, c_got = gpu.run_with_cache(PROMPTS)
            worst = max(((n, diff(c_ref[n], c_got[n])) for n in c_ref), key=lambda t: t[1]["max_rel_diff"])
            out["run_with_cache"] = worst[1] | {"worst_hook": worst[0], "n_hooks": len(list(c_ref.keys()))}
        clean, corrupt, ans, wrong = PATCH_PAIR
        args = dict(metric=logit_diff(ans, wrong), hook="resid_pre")
        p_ref = patch(cpu, clean, corrupt, **args)
        with count_syncs(dev) as syncs_patch:
            p_got = patch(gpu, clean, corrupt, **args)
        out["patch_resid_pre"] = diff(p_ref.values, p_got.values) | {"shape": list(p_ref.values.shape)}
        prompt, subject = TRACE_CASE
        S = 2 if quick else 10
        t_ref = causal_trace(cpu, prompt, subject, samples=S)
        with count_syncs(dev) as syncs_trace:
            t_got = causal_trace(gpu, prompt, subject, samples=S)
        out["causal_trace_hidden"] = diff(t_ref.scores, t_got.scores) | {"shape": list(t_ref.scores.shape)}
        out["host_syncs"] = {
            "note": "CUDA sync warnings (set_sync_debug_mode) during one call, by source line; "
            "0 lines reported on CPU (CUDA only)",
            "patch": dict(syncs_patch),
            "patch_total": sum(syncs_patch.values()),
            "causal_trace": dict(syncs_trace),
            "causal_trace_total": sum(syncs_trace.values()),
        }
        if not budget.fits(10 if quick else 60):
            out["rome"] = {"skipped": "time budget"}
        else:
            layer = default_layer(cpu)
            stats = key_second_moment(cpu, layer, n_samples=500 if quick else 20_000, cache_dir=False, progress=False)
            req = {"prompt": "The capital of {} is", "subject": "France", "target": " Rome"}
            hp = {"v_steps": 2, "prefix_lengths": (2,), "prefixes_per_length": 1} if quick else {}
            e_ref = compute_edit(cpu, req, layer=layer, stats=stats, **hp)
            e_got = compute_edit(gpu, req, layer=layer, stats=stats, **hp)
            with torch.inference_mode():
                with cpu.edited(e_ref):
                    l_ref = cpu(PROMPTS)
                with gpu.edited(e_got):
                    l_got = gpu(PROMPTS)
            out["rome"] = {
                "u": diff(e_ref.u, e_got.u),
                "v": diff(e_ref.v, e_got.v),
                "edited_logits": diff(l_ref, l_got),
                "steps_cpu": e_ref.metrics["steps"],
                "steps_device": e_got.metrics["steps"],
                "p_target_after_cpu": e_ref.metrics["p_target_after"],
                "p_target_after_device": e_got.metrics["p_target_after"],
            }
        try:
            g_cpu = gpt2_model(quick)
            g_gpu = gpt2_model(quick).to(dev)
            toks = torch.randint(0, g_cpu.cfg.d_vocab, (4, 32), generator=torch.Generator().manual_seed(0))
            with torch.inference_mode():
                out["gpt2_random_logits"] = diff(g_cpu(toks), g_gpu(toks))
        finally:
            free_memory(dev)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return out


# ---------------------------------------------------------------- 2. throughput
def seconds_per_call(fn: Callable[[], Any], dev: torch.device, min_time: float, max_calls: int) -> float:
    """Seconds per call: one warm-up, then calls until ``min_time`` has passed (at least one)."""
    fn()
    sync(dev)
    calls, t0 = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        sync(dev)
        el = time.perf_counter() - t0
        if el >= min_time or calls >= max_calls:
            return el / calls


def fill(
    make: Callable[[int], tuple[Callable[[], Any], float]],
    sizes: list[int],
    dev: torch.device,
    budget: Budget,
    quick: bool,
    max_call_s: float = 3.0,
) -> dict[str, Any]:
    """Throughput at growing batch sizes. ``make(b)`` → ``(fn, work units per call)``. Stops when units/s
    grows < 5% twice in a row, memory runs out, a call takes over ``max_call_s`` or the budget runs low."""
    tried: list[dict[str, Any]] = []
    note, flat = None, 0
    for b in sizes:
        last_call = tried[-1]["s_per_call"] * 2.2 if tried else 1.0
        if not budget.fits(3 * last_call + 2):
            note = f"stopped before size {b}: time budget"
            break
        try:
            fn, units = make(b)
            s = seconds_per_call(fn, dev, min_time=0.0 if quick else 0.5, max_calls=1 if quick else 20)
        except Exception as e:
            if not is_oom(e):
                raise
            note = f"size {b}: out of memory"
            fn = None
            free_memory(dev)
            break
        finally:
            fn = None
        tried.append({"size": b, "s_per_call": s, "units_per_s": units / s})
        best_before = max((t["units_per_s"] for t in tried[:-1]), default=0.0)
        flat = flat + 1 if tried[-1]["units_per_s"] < 1.05 * best_before else 0
        if flat >= 2:
            note = f"throughput flat from size {tried[-3]['size']}"
            break
        if s > max_call_s:
            note = f"size {b}: {s:.1f} s per call"
            break
    free_memory(dev)
    if not tried:
        raise Skipped(note or "nothing measured")
    best = max(tried, key=lambda t: t["units_per_s"])
    return {"best": best, "tried": tried, "stop": note}


def batch_sizes(quick: bool, first: int, last: int) -> list[int]:
    if quick:
        return [first]
    out, b = [], first
    while b <= last:
        out.append(b)
        b *= 2
    return out


def throughput(
    name: str, master: HookedGPT2, dtype_name: str, dev: torch.device, quick: bool, budget: Budget, share: float
) -> dict[str, Any]:
    """All throughput items for one model (an fp32 CPU master, copied) and dtype, within ``share`` seconds."""
    model = copy.deepcopy(master).to(dev, DTYPES[dtype_name])
    res = measure(name, model, dtype_name, dev, quick, budget, share)
    del model  # the measurements' closures are gone with measure's frame: this frees the copy
    free_memory(dev)
    return res


def measure(
    name: str, model: HookedGPT2, dtype_name: str, dev: torch.device, quick: bool, budget: Budget, share: float
) -> dict[str, Any]:
    """The throughput items of :func:`throughput` on ``model`` (already on ``dev`` in that dtype)."""
    dtype = DTYPES[dtype_name]
    mine = Budget(min(share, budget.left()))
    res: dict[str, Any] = {
        "model": name,
        "dtype": dtype_name,
        "n_layer": model.cfg.n_layer,
        "d_model": model.cfg.d_model,
        "n_params": model.n_params(),
    }
    T = 16 if quick else min(128, model.cfg.n_ctx)
    res["seq_len"] = T
    gen = torch.Generator().manual_seed(0)

    def tokens(b: int) -> torch.Tensor:
        return torch.randint(0, model.cfg.d_vocab, (b, T), generator=gen).to(dev)

    n_items = 5
    done = [0]

    def item(key: str, fn: Callable[[Budget], Any]) -> None:
        """Run one measurement with an equal share of the time this job has left."""
        left = n_items - done[0]
        done[0] += 1
        if not mine.fits(8):
            res[key] = {"skipped": "time budget"}
            return
        try:
            res[key] = fn(Budget(mine.left() / left))
        except Skipped as e:
            res[key] = {"skipped": str(e)}
        except Exception as e:
            res[key] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc(limit=6)}
            print(f"[{name} {dtype_name} {key}] ERROR {type(e).__name__}: {e}", flush=True)
        free_memory(dev)
        print(f"[{name} {dtype_name}] {key}: {summary(res[key])}", flush=True)

    inf = torch.inference_mode

    def fwd(b: int):
        x = tokens(b)
        return (lambda: inf()(model)(x)), b * T

    def cache(b: int):
        x = tokens(b)
        return (lambda: inf()(model.run_with_cache)(x)), b * T

    item("forward", lambda b: fill(fwd, batch_sizes(quick, 8, 4096), dev, b, quick) | {"unit": "tokens"})
    item("run_with_cache", lambda b: fill(cache, batch_sizes(quick, 8, 2048), dev, b, quick) | {"unit": "tokens"})

    def peer(_: Budget) -> dict[str, Any]:
        import transformers  # noqa: F401  (to_transformers needs it)

        best = res["forward"]["best"]["size"] if "best" in res.get("forward", {}) else 8
        hf = model.to_transformers().to(dev, dtype).eval()
        x = tokens(best)
        with inf():
            t_ours = seconds_per_call(lambda: model(x), dev, 0.0 if quick else 0.5, 1 if quick else 20)
            t_hf = seconds_per_call(lambda m=hf: m(x).logits, dev, 0.0 if quick else 0.5, 1 if quick else 20)
            t_ours2 = seconds_per_call(lambda: model(x), dev, 0.0 if quick else 0.5, 1 if quick else 20)
        t_ours = min(t_ours, t_ours2)
        impl = getattr(hf.config, "_attn_implementation", None)
        del hf
        return {
            "batch": best,
            "seq_len": T,
            "ours_s": t_ours,
            "transformers_s": t_hf,
            "ours_over_transformers": t_ours / t_hf,
            "ours_tokens_per_s": best * T / t_ours,
            "transformers_tokens_per_s": best * T / t_hf,
            "transformers_attn_implementation": impl,
        }

    item("forward_vs_transformers", peer)

    clean, corrupt, ans, wrong = PATCH_PAIR
    metric = logit_diff(ans, wrong)
    P = model.to_tokens(clean).shape[1]

    def sweep(pairs: int):  # token tensors: tokenizing thousands of equal prompts is not what is measured
        c, k = model.to_tokens(clean).repeat(pairs, 1), model.to_tokens(corrupt).repeat(pairs, 1)
        runs = model.cfg.n_layer * P * pairs
        return (lambda: patch(model, c, k, metric, hook="resid_pre", progress=False)), runs

    def trace(samples: int):
        prompt, subject = TRACE_CASE
        start = model.to_str_tokens(prompt).index(" France")
        runs = (P - start) * model.cfg.n_layer * samples
        return (lambda: causal_trace(model, prompt, subject, samples=samples, progress=False)), runs

    def runs_result(r: dict[str, Any]) -> dict[str, Any]:
        for t in r["tried"]:
            t["tokens_per_s"] = t["units_per_s"] * P
        return r | {"unit": "patched runs", "prompt_tokens": P, "note": "tokens/s = patched runs/s × prompt tokens"}

    item("patch_sweep_resid_pre", lambda b: runs_result(fill(sweep, batch_sizes(quick, 16, 65536), dev, b, quick)))
    item("causal_trace_hidden", lambda b: runs_result(fill(trace, batch_sizes(quick, 32, 262144), dev, b, quick)))
    return res


def summary(r: Any) -> str:
    if not isinstance(r, dict):
        return str(r)
    if "error" in r:
        return "ERROR " + r["error"]
    if "skipped" in r:
        return "skipped: " + r["skipped"]
    if "best" in r:
        b = r["best"]
        tok = b.get("tokens_per_s", b["units_per_s"] if r.get("unit") == "tokens" else None)
        return f"best size {b['size']}: {b['units_per_s']:,.0f} {r.get('unit', '')}/s" + (
            f" ({tok:,.0f} tok/s)" if tok is not None and r.get("unit") != "tokens" else ""
        )
    if "ours_over_transformers" in r:
        return f"ours ÷ transformers time {r['ours_over_transformers']:.2f}× at batch {r['batch']}"
    return ""


# ---------------------------------------------------------------- 3. report
def fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.3g}" if abs(x) < 1e4 else f"{x:,.0f}"
    return str(x)


def markdown(results: dict[str, Any], argv: list[str]) -> str:
    env = results.get("environment", {})
    lines = ["# GPU check", "", f"`python benchmarks/gpu_check.py {' '.join(argv)}`".replace(" `", "`"), ""]
    lines += ["## Environment", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in env.items() if k not in ("error", "traceback")]
    lines += [
        "",
        f"Total time {results.get('total_seconds', 0):.0f} s of a {results.get('budget_seconds', 0):.0f} s budget.",
        "",
    ]

    lines += ["## 1. fp32 parity, device vs CPU", ""]
    par = results.get("parity", {})
    if "error" in par:
        lines += [f"**error**: `{par['error']}`", "", "```", par.get("traceback", ""), "```"]
    rows = []
    for key in ("logits", "run_with_cache", "patch_resid_pre", "causal_trace_hidden", "gpt2_random_logits"):
        if key in par:
            d = par[key]
            extra = f"worst hook {d['worst_hook']} of {d['n_hooks']}" if "worst_hook" in d else ""
            rows.append(f"| {key} | {d['max_abs_diff']:.3g} | {d['max_rel_diff']:.3g} | {extra} |")
    rome = par.get("rome", {})
    if "u" in rome:
        for k in ("u", "v", "edited_logits"):
            rows.append(
                f"| ROME edit: {k} | {rome[k]['max_abs_diff']:.3g} | {rome[k]['max_rel_diff']:.3g} | "
                + (
                    f"Adam steps cpu {rome['steps_cpu']} / device {rome['steps_device']}; P(target) after "
                    f"{rome['p_target_after_cpu']:.4f} / {rome['p_target_after_device']:.4f}"
                    if k == "u"
                    else ""
                )
                + " |"
            )
    elif rome:
        rows.append(f"| ROME edit | – | – | {rome.get('skipped') or rome.get('error')} |")
    if rows:
        lines += [
            "| what (gpt2-facts unless named) | max \\|Δ\\| | max \\|Δ\\| ÷ max \\|ref\\| | notes |",
            "|---|---|---|---|",
            *rows,
        ]
    hs = par.get("host_syncs")
    if hs:
        lines += [
            "",
            f"Host syncs reported by CUDA during one patching sweep: {hs['patch_total']} "
            f"{hs['patch'] or ''}; during one causal trace: {hs['causal_trace_total']} {hs['causal_trace'] or ''}"
            + (" (CUDA only: not counted on this device)" if env.get("device", "").startswith("cpu") else "")
            + ".",
        ]

    lines += ["", "## 2. Throughput", ""]
    lines += [
        "Best over the batch sizes tried (doubling until throughput is flat, memory runs out or a call takes > 3 s). "
        "Sweep and trace sizes are prompt pairs and noise samples; their tokens/s are forward-equivalent "
        "(patched runs × prompt tokens ÷ s).",
        "",
    ]
    lines += [
        "| model | dtype | measurement | best size | throughput | tokens/s | stop |",
        "|---|---|---|---|---|---|---|",
    ]
    peers = []
    for key, r in results.items():
        if not key.startswith("throughput"):
            continue
        if "error" in r:
            lines.append(f"| {key} | | error | | | | `{r['error']}` |")
            continue
        if "skipped" in r:
            lines.append(f"| {key} | | skipped | | | | {r['skipped']} |")
            continue
        for item in ("forward", "run_with_cache", "patch_sweep_resid_pre", "causal_trace_hidden"):
            m = r.get(item)
            if m is None:
                continue
            if "best" not in m:
                lines.append(f"| {r['model']} | {r['dtype']} | {item} | | | | {m.get('skipped') or m.get('error')} |")
                continue
            b = m["best"]
            tok = b["units_per_s"] if m["unit"] == "tokens" else b["tokens_per_s"]
            thr = f"{b['units_per_s']:,.0f} {m['unit']}/s"
            lines.append(
                f"| {r['model']} | {r['dtype']} | {item} | {b['size']} | {thr} | {tok:,.0f} | {m.get('stop') or ''} |"
            )
        pr = r.get("forward_vs_transformers")
        if pr:
            peers.append((r, pr))
    if peers:
        lines += [
            "",
            "### Forward vs transformers GPT2LMHeadModel (same weights, dtype and batch)",
            "",
            "| model | dtype | batch × seq | ours tokens/s | transformers tokens/s | time ours ÷ transformers |",
            "|---|---|---|---|---|---|",
        ]
        for r, pr in peers:
            if "ours_s" in pr:
                lines.append(
                    f"| {r['model']} | {r['dtype']} | {pr['batch']} × {pr['seq_len']} | "
                    f"{pr['ours_tokens_per_s']:,.0f} | "
                    f"{pr['transformers_tokens_per_s']:,.0f} | {pr['ours_over_transformers']:.2f}× |"
                )
            else:
                lines.append(f"| {r['model']} | {r['dtype']} | | | | {pr.get('skipped') or pr.get('error')} |")
    lines += ["", "### Every batch size tried", ""]
    for key, r in results.items():
        if key.startswith("throughput") and "model" in r:
            for item in ("forward", "run_with_cache", "patch_sweep_resid_pre", "causal_trace_hidden"):
                m = r.get(item, {})
                if "tried" in m:
                    pts = ", ".join(f"{t['size']}: {t['units_per_s']:,.0f}" for t in m["tried"])
                    lines.append(f"- {r['model']} {r['dtype']} {item} ({m['unit']}/s by size): {pts}")
    errors = [(k, v) for k, v in results.items() if isinstance(v, dict) and "error" in v]
    errors += [
        (f"{k}.{i}", v[i])
        for k, v in results.items()
        if isinstance(v, dict)
        for i in v
        if isinstance(v[i], dict) and "error" in v[i]
    ]
    if errors:
        lines += ["", "## Errors", ""]
        for k, v in errors:
            lines += [f"**{k}**: `{v['error']}`", "", "```", v.get("traceback", "").strip(), "```", ""]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- main
def scaling(device: str, options: list[str]) -> dict[str, Any]:
    """The scaling ladder (``benchmarks/bench_scaling.py``) on ``device``, written beside the CPU's
    results as ``RESULTS_scaling_gpu.{md,json,png}`` (``options``: bench_scaling's own, e.g. ``--quick``)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_scaling
    finally:
        sys.path.pop(0)
    out = ROOT / "benchmarks" / "RESULTS_scaling_gpu"
    return bench_scaling.main(
        ["--device", device, "--out", f"{out}.md", "--json", f"{out}.json", "--figure", f"{out}.png", *options]
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--budget", type=float, default=None, help="seconds (default 360; 60 with --quick)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one call each: a smoke test in seconds")
    ap.add_argument("--note", default=None, help="a line for the environment table (e.g. which code ran)")
    ap.add_argument("--dtypes", default="bf16,fp16", help="comma-separated: bf16, fp16, fp32")
    ap.add_argument(
        "--out",
        type=Path,
        default=ROOT / "benchmarks" / "RESULTS_gpu.md",
        help="markdown results; the JSON goes beside it (.json)",
    )
    ap.add_argument(
        "--scaling",
        nargs="?",
        const="",
        default=None,
        help="run benchmarks/bench_scaling.py's ladder on the device instead (its options as one quoted string)",
    )
    a = ap.parse_args(argv)
    argv_shown = list(argv if argv is not None else sys.argv[1:])
    if a.scaling is not None:
        return scaling(a.device or ("cuda" if torch.cuda.is_available() else "cpu"), a.scaling.split())
    dev = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    budget = Budget(a.budget if a.budget is not None else (60.0 if a.quick else 360.0))
    dtypes = [d.strip() for d in a.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in DTYPES]
    if bad:
        ap.error(f"--dtypes {bad}: choose from {list(DTYPES)}")
    results: dict[str, Any] = {"budget_seconds": budget.seconds, "quick": a.quick}
    section(results, "environment", lambda: environment(dev) | ({"note": a.note} if a.note else {}))
    print(f"device: {results['environment'].get('device_name', dev)}", flush=True)

    def write() -> None:
        results["total_seconds"] = round(time.perf_counter() - budget.t0, 1)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str) + "\n")
        a.out.write_text(markdown(results, argv_shown))

    section(results, "parity", lambda: parity(dev, a.quick, budget))
    print(f"[parity] done at {time.perf_counter() - budget.t0:.0f} s", flush=True)
    write()
    models = [("gpt2 (random)", lambda: gpt2_model(a.quick)), ("gpt2-facts", lambda: facts_model(torch.device("cpu")))]
    jobs = [(mname, make, d) for mname, make in models for d in dtypes]
    built: dict[str, HookedGPT2] = {}
    for i, (mname, make, d) in enumerate(jobs):
        key = f"throughput {mname} {d}"
        share = budget.left() / (len(jobs) - i) - 2  # the time left, shared by the jobs left
        if not budget.fits(15):
            results[key] = {"skipped": "time budget", "model": mname, "dtype": d}
            continue

        def run(mname=mname, make=make, d=d, share=share) -> dict[str, Any]:
            if mname not in built:
                built.clear()
                built[mname] = make()
            return throughput(mname, built[mname], d, dev, a.quick, budget, share)

        section(results, key, run)
        write()
    write()
    print(f"wrote {a.out} and {a.out.with_suffix('.json')} in {results['total_seconds']:.0f} s", flush=True)
    return results


if __name__ == "__main__":
    main()
