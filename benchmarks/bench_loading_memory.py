"""Peak memory of loading a local bf16 transformers folder, ours against transformers, as a multiple of the
folder's weight bytes.

    python benchmarks/bench_loading_memory.py [--models qwen2.5-0.5b,pythia-160m] [--shard 200MB]
        [--workdir DIR] [--out benchmarks/RESULTS_loading_memory.md]

For each model, its real shape (``KNOWN_CONFIGS``) with random weights is built by transformers, cast to
bf16 and written with ``save_pretrained(folder, max_shard_size=--shard)`` (sharded when the weights are
larger than one shard). Each measurement runs in a fresh Python process (one thread): it imports its
library, loads a tiny folder of the same family once (so that imports and one-time set-up are not counted),
reads its resident memory (``/proc/self/statm``), loads the folder, reads one value in every 256 of each
parameter (every memory page: weights that stay memory-mapped to the files count only once read), and
reports ``getrusage(RUSAGE_SELF).ru_maxrss`` minus that resident memory: the peak the load added. Contenders:
``gpt2_interp.load(folder, dtype="bf16")``, ``transformers.AutoModelForCausalLM.from_pretrained(folder,
dtype=torch.bfloat16)``, and ``gpt2_interp.load(folder)`` (float32, twice the bytes, for reference).
Goal: ours in bf16 ≤ 1.2× the folder's weight bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

MODELS = ["qwen2.5-0.5b", "pythia-160m"]

# one measurement, run as ``python bench_loading_memory.py --child LIB DTYPE FOLDER WARMUP``
CONTENDERS = {
    "ours bf16": ("ours", "bf16"),
    "transformers bf16": ("transformers", "bf16"),
    "ours fp32 (default)": ("ours", "fp32"),
}


def write_folder(name: str, folder: Path, shard: str, layers: int | None = None) -> None:
    """``name``'s real shape (``layers`` of them when given) with transformers' random weights, in bf16,
    saved by transformers with ``max_shard_size=shard``."""
    import dataclasses

    import torch
    import transformers

    from gpt2_interp.model import KNOWN_CONFIGS
    from gpt2_interp.model.families import HF_CLASSES

    cfg = KNOWN_CONFIGS[name]
    if layers is not None:
        cfg = dataclasses.replace(cfg, n_layer=layers, d_model=64, n_head=4, n_kv_heads=None, d_mlp=128, d_vocab=256)
    config_class, model_class = (getattr(transformers, n) for n in HF_CLASSES[cfg.family])
    torch.manual_seed(0)
    hf = model_class(config_class(**cfg.to_hf_dict()))
    hf.to(torch.bfloat16).save_pretrained(folder, max_shard_size=shard)


def weight_bytes(folder: Path) -> tuple[int, int]:
    """``(bytes of the tensors the folder's safetensors files hold, number of files)``: each file's size
    less its 8-byte header length and JSON header."""
    total, files = 0, sorted(folder.glob("*.safetensors"))
    for f in files:
        with f.open("rb") as fh:
            header = int.from_bytes(fh.read(8), "little")
        total += f.stat().st_size - 8 - header
    return total, len(files)


def child(lib: str, dtype: str, folder: str, warmup: str) -> None:
    """Load ``folder`` with ``lib`` in ``dtype`` after a warm-up load of ``warmup``; print the peak it added."""
    import resource
    import time

    import torch

    if lib == "ours":
        import gpt2_interp

        def run(path: str) -> object:
            return gpt2_interp.load(path, dtype=dtype)
    else:
        import transformers

        def run(path: str) -> object:
            return transformers.AutoModelForCausalLM.from_pretrained(
                path, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32
            )

    del_me = run(warmup)
    del del_me
    with open("/proc/self/statm") as f:
        before = int(f.read().split()[1]) * resource.getpagesize()
    t0 = time.perf_counter()
    model = run(folder)
    seconds = time.perf_counter() - t0
    with torch.no_grad():  # read every page of every weight once: memory-mapped weights count only when read
        for p in model.parameters():  # type: ignore[attr-defined]
            float(p.reshape(-1)[::256].float().sum())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    params = {p.dtype for p in model.parameters()}  # type: ignore[attr-defined]
    print(json.dumps({"added": peak - before, "seconds": seconds, "dtypes": sorted(map(str, params))}))


def spawn(*args: str) -> str:
    """Run this script with ``args`` in a fresh process (one thread) and return its output. This process
    never imports torch nor holds weights: Linux carries a process's peak resident memory across
    ``fork``/``exec`` into ``ru_maxrss``, so a large parent would set a floor under every measurement."""
    out = subprocess.run(
        [sys.executable, __file__, *args],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return out.stdout


def measure(lib: str, dtype: str, folder: Path, warmup: Path) -> dict:
    return json.loads(spawn("--child", lib, dtype, str(folder), str(warmup)).strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated KNOWN_CONFIGS names")
    ap.add_argument("--shard", default="200MB", help="transformers' max_shard_size for the written folders")
    ap.add_argument("--workdir", type=Path, default=None, help="where the folders are written (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=None, help="write a markdown table here (and its provenance beside)")
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = a.workdir or Path(tmp)
        for name in a.models.split(","):
            folder, warm = work / name, work / f"{name}-tiny"
            for path, layers in ((folder, "-"), (warm, "2")):  # in a process of their own (see spawn)
                spawn("--write", name, str(path), a.shard, layers)
            size, shards = weight_bytes(folder)
            for label, (lib, dtype) in CONTENDERS.items():
                r = measure(lib, dtype, folder, warm)
                rows.append({"model": name, "who": label, "bytes": size, "shards": shards, **r})
                print(
                    f"{name:14s} {label:20s} weights {size / 2**20:7.1f} MiB in {shards} file(s)  "
                    f"peak added {r['added'] / 2**20:7.1f} MiB = {r['added'] / size:.2f}×  "
                    f"{r['seconds']:.1f} s  {r['dtypes']}",
                    flush=True,
                )
    if a.out:
        from gpt2_interp.experiments.provenance import standalone, write_beside

        head = "| model | loader | weight files | weights (MiB) | peak added (MiB) | peak ÷ weights | seconds |\n"
        head += "|---|---|---|---|---|---|---|\n"
        body = "".join(
            f"| {r['model']} | {r['who']} | {r['shards']} | {r['bytes'] / 2**20:.1f} | {r['added'] / 2**20:.1f} | "
            f"{r['added'] / r['bytes']:.2f} | {r['seconds']:.1f} |\n"
            for r in rows
        )
        ours = [r for r in rows if r["who"] == "ours bf16"]
        met = sum(r["added"] <= 1.2 * r["bytes"] for r in ours)
        command = " ".join(["python benchmarks/bench_loading_memory.py", *(sys.argv[1:] if argv is None else argv)])
        a.out.write_text(
            f"# Peak memory of loading a bf16 folder\n\n`{command}` on {platform.processor() or platform.machine()}: "
            f"each model's real shape with random bf16 weights, written by transformers with "
            f"`max_shard_size={a.shard!r}`; each load in a fresh process after a warm-up load of a tiny folder of "
            "the same family; peak added = `ru_maxrss` after the load and a read of every weight page minus the "
            "resident memory before the load. "
            "The float32 row holds twice the folder's bytes by design.\n\n"
            f"{head}{body}\n{met} of {len(ours)} models at ≤ 1.2× the folder's weight bytes with "
            '`gpt2_interp.load(folder, dtype="bf16")`.\n'
        )
        write_beside(a.out, standalone(sys.argv))
    return rows


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:6])
    elif len(sys.argv) > 1 and sys.argv[1] == "--write":
        write_folder(sys.argv[2], Path(sys.argv[3]), sys.argv[4], None if sys.argv[5] == "-" else int(sys.argv[5]))
    else:
        main()
