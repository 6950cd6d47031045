"""The cost of a cache: peak CPU memory of ``run_with_cache`` with one hook family, against the weights plus
the kept tensors, and against a plain forward; TransformerLens 3.9 on the same shape as the peer.

    python benchmarks/bench_cache_memory.py [--size qwen2.5-0.5b] [--shape 4x128] [--hook hook_resid_post]
                                            [--out benchmarks/RESULTS_cache_memory.md]

Each measurement runs in a fresh Python process: it builds the model (``KNOWN_CONFIGS[size]``, random weights,
fp32, gradients off; TransformerLens: ``HookedTransformer`` of TL's own config converter for that shape, every
weight written with random values), reads
its resident memory (``/proc/self/statm``), resets the high-water mark (``/proc/self/clear_refs``, so the
model's initialisation does not hide the call's peak), runs the operation once under ``torch.no_grad()`` and
reads the high-water mark (``VmHWM``, the resettable ``ru_maxrss``). Reported: the peak over the process before
the model (imports only), and what the operation adds over the memory before it. "kept" is the cache's bytes
(``cache.nbytes()``) plus the logits the call returns.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

MODES = ["ours_forward", "ours_cache", "tl_forward", "tl_cache"]


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _maxrss() -> int:
    """The process's peak resident memory: ``VmHWM``, which :func:`_reset_peak` can lower (Linux), and never
    above ``ru_maxrss`` (the peak of the whole process, building included)."""
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return min(hwm, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB


def _reset_peak() -> None:
    """Lower the peak to the present resident memory (``clear_refs`` 5), so that building the model (its random
    initialisation's temporaries) does not hide the call's peak."""
    import gc

    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def measure(mode: str, size: str, batch: int, pos: int, hook: str) -> dict[str, float]:
    """One measurement in this (fresh) process; byte counts."""
    import torch

    from gpt2_interp.model import KNOWN_CONFIGS, HookedGPT2

    torch.set_grad_enabled(False)
    empty = _rss()
    cfg = KNOWN_CONFIGS[size]
    if mode.startswith("ours"):
        model = HookedGPT2(cfg, seed=0).eval().requires_grad_(False)
    else:
        import logging

        import transformer_lens.loading_from_pretrained as lp
        from transformer_lens import HookedTransformer

        logging.disable(logging.WARNING)
        hf = dict(cfg.to_hf_dict(), architectures=[_hf_class(cfg.to_hf_dict()["model_type"])])
        folder = Path(tempfile.mkdtemp()) / "shape"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(hf))
        tl_cfg = lp.get_pretrained_model_config(str(folder), device="cpu")
        tl_cfg.tokenizer_name = None
        model = HookedTransformer(tl_cfg).eval().requires_grad_(False)
        for p in model.parameters():  # the config says init_weights=False: write every weight so it is resident
            p.normal_(0.0, 0.02)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    tokens = torch.randint(1, cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(0))
    built_peak = _maxrss()
    _reset_peak()
    before = _rss()
    kept = 0
    if mode.endswith("forward"):
        logits = model(tokens)
    else:
        logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith(hook))
        kept = sum(v.numel() * v.element_size() for v in cache.values())
    peak = _maxrss()
    return dict(
        empty=empty,
        weights=weights,
        before=before,
        built_peak=built_peak,
        peak=peak,
        kept=kept,
        logits=logits.numel() * logits.element_size(),
    )


def _hf_class(model_type: str) -> str:
    from gpt2_interp.model.families import HF_CLASSES

    return HF_CLASSES[model_type][1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="qwen2.5-0.5b")
    ap.add_argument("--shape", default="4x128")
    ap.add_argument("--hook", default="hook_resid_post")
    ap.add_argument("--out", default=None)
    ap.add_argument("--mode", default=None, help=argparse.SUPPRESS)  # one measurement (the child process)
    a = ap.parse_args()
    batch, pos = (int(x) for x in a.shape.split("x"))
    if a.mode:
        print(json.dumps(measure(a.mode, a.size, batch, pos, a.hook)))
        return
    results = {}
    for mode in MODES:
        out = subprocess.run(
            [sys.executable, __file__, "--mode", mode, "--size", a.size, "--shape", a.shape, "--hook", a.hook],
            capture_output=True,
            text=True,
            check=False,
            env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1")),
        )
        if out.returncode:
            sys.exit(f"{mode} failed:\n{out.stderr[-3000:]}")
        results[mode] = json.loads(out.stdout.strip().splitlines()[-1])
        print(mode, results[mode], flush=True)
    mb = 1e6
    rows = []
    for mode in MODES:
        r = results[mode]
        need = r["weights"] + r["kept"] + r["logits"]
        over_empty = r["peak"] - r["empty"]
        adds = r["peak"] - r["before"]
        rows.append(
            f"| {mode.replace('_', ' ')} | {r['weights'] / mb:.0f} | {r['kept'] / mb:.1f} | {r['logits'] / mb:.1f} "
            f"| {over_empty / mb:.0f} | {over_empty / need:.2f}× | {adds / mb:.0f} | {r['built_peak'] / mb:.0f} |"
        )

    def added(mode: str) -> float:
        return results[mode]["peak"] - results[mode]["before"]

    cache_adds = (added("ours_cache") - added("ours_forward")) / mb
    tl_adds = (added("tl_cache") - added("tl_forward")) / mb
    text = "\n".join(
        [
            f"# The cost of a cache: {a.size}, batch × positions {a.shape}, names_filter ending in {a.hook!r}",
            "",
            f"Command: `OMP_NUM_THREADS=1 python benchmarks/bench_cache_memory.py --size {a.size} --shape {a.shape} "
            f"--hook {a.hook}`",
            "",
            f"Machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; CPU, fp32, "
            "random weights, `torch.no_grad()`; one fresh process per row (see the module docstring).",
            "",
            "| run | weights MB | cache MB | logits MB | peak over the empty process MB | ÷ (weights + cache + logits) "
            "| peak added by the call MB | peak while building MB |",
            "|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"What the cache adds to the peak a plain forward adds: ours {cache_adds:.0f} MB, "
            f"TransformerLens {tl_adds:.0f} MB, for {results['ours_cache']['kept'] / mb:.1f} MB kept.",
            "",
        ]
    )
    print(text)
    if a.out:
        Path(a.out).write_text(text)
        from gpt2_interp.experiments.provenance import standalone, write_beside

        write_beside(a.out, standalone(sys.argv))


if __name__ == "__main__":
    main()
