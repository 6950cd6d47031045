"""AlphaEdit's null space, layer by layer: a threshold relative to the largest eigenvalue vs an energy share.

AlphaEdit projects an update on the null space of the preserved keys' second moment ``C₀`` (the key
statistics of a text corpus), ``P = Σ u_i u_iᵀ`` over eigen-directions with small eigenvalues. Which
directions count as "small" is a threshold ``τ``:

- ``relative`` (our default): ``λ_i ≤ τ·λ_max`` of that layer;
- ``energy``: the smallest directions whose eigenvalues sum to ``≤ τ·tr C₀`` — every layer leaks the
  same share ``τ`` of its preserved keys' energy (:meth:`NullSpace.from_stats`, ``rule=``).

For each rule × ``τ`` and each edit layer this reports the null-space dimension, the leak (the
preserved keys' energy inside it, ``tr(P C₀)/tr C₀``) and how much of the EDIT keys' energy lies inside
it (``‖K P‖²/‖K‖²`` for the ``--n`` requests the model knows, keys averaged over MEMIT's context
variants on the unedited model). An update confined to ``P`` can only move keys through their part
inside it: a layer whose edit keys have ~0 energy there cannot take a share of the edit. Cheap: one
forward pass for the keys and one eigen-decomposition a layer; no edit is made.

    python analyses/nullspace_rules.py --model smollm2-135m --n 120
    python analyses/nullspace_rules.py --model gpt2-facts --n 1000

Writes ``nullspace_rules_<model>.json``/``.md``/``.png`` to ``--out-dir`` (default ``analyses/results/``).
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
from gpt2_interp.editing.memit import NULLSPACE_RULES, MemitHparams, NullSpace, default_layers
from gpt2_interp.editing.rome import context_prefixes, subject_states
from gpt2_interp.editing.stats import key_second_moment

RESULTS = Path(__file__).resolve().parent / "results"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--n", type=int, default=120, help="requests the model knows (their keys)")
    p.add_argument("--thresholds", default="1e-4,1e-3,1e-2,1e-1")
    p.add_argument("--rules", default=",".join(NULLSPACE_RULES))
    p.add_argument("--n-samples", type=int, default=100_000, help="tokens for the key statistics")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    rules = [r.strip() for r in a.rules.split(",") if r.strip()]
    if set(rules) - set(NULLSPACE_RULES) or not rules:
        p.error(f"--rules: choose from {', '.join(NULLSPACE_RULES)}")
    taus = [float(x) for x in a.thresholds.split(",") if x.strip()]
    if not taus or any(not 0 < t < 1 for t in taus):
        p.error("--thresholds: values in (0, 1)")
    t0 = time.perf_counter()
    model = gi.load(a.model)
    hp = MemitHparams.of(model)
    layers = list(hp.layers) if hp.layers is not None else default_layers(model)
    stats = key_second_moment(model, layers, n_samples=a.n_samples)
    cases = known_cases(model, a.n, a.seed)
    prefixes = context_prefixes(model, hp.rome.prefix_lengths, hp.rome.prefixes_per_length, hp.rome.prefix_seed)
    keys, _ = subject_states(model, [c.request for c in cases], layers, prefixes)
    rows = []
    for rule in rules:
        for tau in taus:
            ns = NullSpace.from_stats({l: stats[l] for l in layers}, tau, rule)
            for l in layers:
                K = keys[l].double().cpu()  # [n, d_mlp]
                rows.append({"rule": rule, "tau": tau, "layer": l, "d_mlp": K.shape[1], "null_dim": ns.null_dim[l],
                             "leak": ns.leak[l],
                             "edit_key_energy": float(((K @ ns.P[l]) ** 2).sum() / (K ** 2).sum())})
    report = {"model": a.model, "layers": layers, "n_keys": len(cases), "stats_tokens": stats[layers[0]].count,
              "corpus": stats[layers[0]].key.get("corpus"), "context_variants": 1 + len(prefixes), "rows": rows,
              "seconds": time.perf_counter() - t0}
    out = a.out_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / f"nullspace_rules_{a.model}.json").write_text(json.dumps(to_jsonable(report), indent=1) + "\n")
    render(report, out)
    print((out / f"nullspace_rules_{a.model}.md").read_text())
    return 0


def render(report: dict, out: Path) -> None:
    """The table (one row per rule × τ, the layers side by side) and the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers, rows = report["layers"], report["rows"]
    by = {(r["rule"], r["tau"], r["layer"]): r for r in rows}
    settings = sorted({(r["rule"], r["tau"]) for r in rows}, key=lambda x: (x[0] != "relative", x[1]))
    pc = lambda x: f"{100 * x:.0f}%" if x >= 0.1 else f"{100 * x:.2g}%"  # noqa: E731
    cell = lambda r: f"{r['null_dim']} / {pc(r['leak'])} / {pc(r['edit_key_energy'])}"  # noqa: E731
    lines = [f"# AlphaEdit's null space per layer on {report['model']}", "",
             f"Preserved keys: {report['stats_tokens']} tokens of {report['corpus']}; edit keys: {report['n_keys']} "
             f"requests the model knows, averaged over {report['context_variants']} context variants, unedited model. "
             "Each cell: null-space dimension / preserved keys' energy inside it (leak) / edit keys' energy inside it.",
             "", "| rule | τ | " + " | ".join(f"layer {l} (d = {by[(*settings[0], l)]['d_mlp']})" for l in layers) + " |",
             "|---|---|" + "---|" * len(layers)]
    for rule, tau in settings:
        lines.append(f"| {rule} | {tau:g} | " + " | ".join(cell(by[(rule, tau, l)]) for l in layers) + " |")
    (out / f"nullspace_rules_{report['model']}.md").write_text("\n".join(lines) + "\n")
    rules = sorted({r for r, _ in settings}, key=lambda r: r != "relative")
    fig, axes = plt.subplots(1, len(rules), figsize=(4.2 * len(rules), 3.4), sharey=True, squeeze=False)
    for ax, rule in zip(axes[0], rules):
        taus = sorted({t for r, t in settings if r == rule})
        for l in layers:
            ax.plot(taus, [100 * by[(rule, t, l)]["edit_key_energy"] for t in taus], "o-", label=f"layer {l}")
        ax.set_xscale("log")
        ax.set_xlabel("τ")
        ax.set_title(f"{rule} rule")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("edit keys' energy in the null space (%)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{report['model']}: where AlphaEdit's update can act")
    fig.tight_layout()
    fig.savefig(out / f"nullspace_rules_{report['model']}.png", dpi=120)


if __name__ == "__main__":
    sys.exit(main())
