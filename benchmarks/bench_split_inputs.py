"""What TransformerLens's receiver-input switches cost, as ratios measured in one run.

    python benchmarks/bench_split_inputs.py [--baseline /path/to/other/checkout] [--repeats 15] [--out RESULTS.md]

Two models, fp32, inference mode, the blocks of the forward pass (``stop_at_layer=n_layer``: the
unembedding, which the switches do not touch, is left out) on one batch of 4 × 32 random tokens:
the embedded ``gpt2-facts`` (6 layers, d_model 256, 8 heads) and a random model of SmolLM2-135M's
shape (30 layers, d_model 576, 9 heads over 3 key/value heads, SwiGLU 1536, vocabulary 49152).

1. Switches off: this checkout's forward against ``--baseline``'s (another checkout of the package,
   e.g. the main branch, imported in the same process on the same weights) — goal 1.00× (the
   switches must be free when off).
2. Switches on against off, this checkout: ``use_split_qkv_input``, ``use_attn_in`` (not under
   grouped-query attention: refused there, as in TransformerLens), ``use_hook_mlp_in``. The
   expected cost of the split inputs is ``n_head + 2·n_kv`` layer norms of the residual per block
   and the ``[batch, pos, head, d_model]`` copies; the per-head projections do the fused
   projection's arithmetic.

Forwards of all variants are interleaved (one of each per round) and each variant's median over
the rounds (and of the best rounds) is reported, so a shared machine's load affects them alike. Prints a
markdown table; ``--out`` also writes it, with its provenance beside it.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parents[1]
SMOLLM2 = dict(
    n_layer=30, d_model=576, n_head=9, n_kv_heads=3, d_mlp=1536, n_ctx=2048, d_vocab=49152, tied_embeddings=True
)


def import_package(root: Path) -> Any:
    """``gpt2_interp`` from checkout ``root``, replacing any copy imported before (its models keep working)."""
    for name in [m for m in sys.modules if m == "gpt2_interp" or m.startswith("gpt2_interp.")]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        return importlib.import_module("gpt2_interp")
    finally:
        sys.path.remove(str(root))


def build(gi: Any, which: str, state: dict | None) -> Any:
    if which == "gpt2-facts":
        return gi.load("gpt2-facts").eval()
    model = gi.HookedGPT2(gi.model.llama_config(name="smollm2-shape", **SMOLLM2), seed=0).eval()
    if state is not None:
        model.load_state_dict(state)
    return model


def switched(model: Any, **on: bool) -> Any:
    """A forward function of ``model`` with the switches ``on`` set while it runs."""

    def run(tokens: torch.Tensor) -> torch.Tensor:
        for k, v in on.items():
            setattr(model.cfg, k, v)
        try:
            return model(tokens, stop_at_layer=model.cfg.n_layer)
        finally:
            for k in on:
                setattr(model.cfg, k, False)

    return run


def measure(variants: dict[str, Any], tokens: torch.Tensor, repeats: int) -> dict[str, tuple[float, float]]:
    """Each variant's ``(median, best)`` seconds per forward over ``repeats`` interleaved rounds."""
    times: dict[str, list[float]] = {k: [] for k in variants}
    with torch.inference_mode():
        for fn in variants.values():  # warm-up, and the outputs must agree
            fn(tokens)
        for _ in range(repeats):
            for name, fn in variants.items():
                t0 = time.perf_counter()
                fn(tokens)
                times[name].append(time.perf_counter() - t0)
    return {k: (statistics.median(v), min(v)) for k, v in times.items()}


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--baseline", type=Path, default=None, help="another checkout to compare with, switches off")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out", type=Path, default=None, help="write the table here (and <out>.provenance.json)")
    a = p.parse_args(argv)
    torch.manual_seed(0)
    rows = []
    base_models = {}
    if a.baseline is not None:
        base = import_package(a.baseline.resolve())
        base_models = {w: build(base, w, None) for w in ("gpt2-facts", "smollm2-shape")}
    gi = import_package(HERE)
    for which in ("gpt2-facts", "smollm2-shape"):
        old = base_models.get(which)
        model = build(gi, which, None if old is None else old.state_dict())
        tokens = torch.randint(0, model.cfg.d_vocab, (4, 32))
        variants = {"off": switched(model)}
        if old is not None:
            variants["baseline"] = lambda t, old=old: old(t, stop_at_layer=old.cfg.n_layer)
        variants["use_split_qkv_input"] = switched(model, use_split_qkv_input=True)
        if model.cfg.n_kv == model.cfg.n_head:
            variants["use_attn_in"] = switched(model, use_attn_in=True)
        variants["use_hook_mlp_in"] = switched(model, use_hook_mlp_in=True)
        with torch.inference_mode():
            ref = variants["off"](tokens)
            for name, fn in variants.items():
                diff = (fn(tokens) - ref).abs().max().item()
                assert diff <= 1e-4, f"{which} {name}: the final residuals differ by {diff:.2e}"
        med = measure(variants, tokens, a.repeats)
        (off, off_best) = med["off"]
        for name, (t, best) in med.items():
            if name == "off":
                continue
            if name.startswith("baseline"):  # this checkout (switches off) measured against the baseline
                what, ref_t, got_t, ref_b, got_b = f"off here vs {name}", t, off, best, off_best
            else:
                what, ref_t, got_t, ref_b, got_b = f"{name} on vs off", off, t, off_best, best
            times = f"{ref_t * 1e3:.1f} | {got_t * 1e3:.1f}"
            rows.append(f"| {which} | {what} | {times} | {got_t / ref_t:.2f}× | {got_b / ref_b:.2f}× |")
    load = Path("/proc/loadavg").read_text().split()[:3] if os.path.exists("/proc/loadavg") else ["?"]
    table = "\n".join(
        [
            f"The blocks' forward (``stop_at_layer=n_layer``: no unembedding) of 4 × 32 tokens, fp32, "
            f"median of {a.repeats} interleaved rounds; "
            f"{torch.get_num_threads()} thread(s); load {' '.join(load)}.",
            "",
            "| model | comparison | reference (ms, median) | measured (ms, median) | ratio of medians | of bests |",
            "|---|---|---|---|---|---|",
            *rows,
        ]
    )
    print(table)
    if a.out is not None:
        from gpt2_interp.experiments.provenance import standalone, write_beside

        title = "# Receiver-input switches: cost off and on\n\n"
        a.out.write_text(title + f"`{' '.join(['python', *sys.argv])}`\n\n" + table + "\n")
        write_beside(a.out, standalone(sys.argv))
    return table


if __name__ == "__main__":
    main()
