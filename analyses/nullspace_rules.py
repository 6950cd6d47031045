"""AlphaEdit's null space, layer by layer: a threshold relative to the largest eigenvalue vs an energy share.

AlphaEdit projects an update on the null space of the preserved keys' second moment ``C₀`` (the key
statistics of a text corpus), ``P = Σ u_i u_iᵀ`` over eigen-directions with small eigenvalues. Which
directions count as "small" is a threshold ``τ``:

- ``relative`` (our default): ``λ_i ≤ τ·λ_max`` of that layer;
- ``energy``: the smallest directions whose eigenvalues sum to ``≤ τ·tr C₀`` — every layer leaks the
  same share ``τ`` of its preserved keys' energy (:meth:`NullSpace.from_stats`, ``rule=``).

For each rule × ``τ`` and each edit layer this reports the null-space dimension, the leak (the
preserved keys' energy inside it, ``tr(P C₀)/tr C₀``) and how much of the EDIT keys' energy lies inside
it (:meth:`NullSpace.key_energy`, ``‖K P‖²/‖K‖²`` for the ``n`` requests the model knows, keys
averaged over MEMIT's context variants on the unedited model). An update confined to ``P`` can only
move keys through their part inside it: a layer whose edit keys have ~0 energy there cannot take a
share of the edit. Cheap: one forward pass for the keys and one eigen-decomposition a layer; no edit
is made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from gpt2_interp.editing.evaluate import known_cases
from gpt2_interp.editing.hparams import defaults_digest
from gpt2_interp.editing.memit import NULLSPACE_RULES, MemitHparams, NullSpace, default_layers
from gpt2_interp.editing.stats import key_second_moment
from gpt2_interp.editing.targets import context_prefixes, subject_states
from gpt2_interp.experiments.base import ExperimentConfig, register
from gpt2_interp.experiments.runner import RunContext

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from gpt2_interp.model import HookedGPT2


@dataclass
class Config(ExperimentConfig):
    n: int = field(default=120, metadata={"help": "requests the model knows (their keys)"})
    thresholds: list[float] = field(
        default_factory=lambda: [1e-4, 1e-3, 1e-2, 1e-1], metadata={"help": "thresholds τ, each in (0, 1)"}
    )
    rules: list[str] = field(
        default_factory=lambda: list(NULLSPACE_RULES),
        metadata={"help": f"null-space rules: {', '.join(NULLSPACE_RULES)}"},
    )
    n_samples: int = field(default=100_000, metadata={"help": "tokens for the key statistics"})

    QUICK: ClassVar[dict[str, Any]] = {"n": 12, "n_samples": 3000, "thresholds": [1e-3, 1e-1]}

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.rules or set(self.rules) - set(NULLSPACE_RULES):
            raise ValueError(
                f"nullspace_rules setting rules: choose from {', '.join(NULLSPACE_RULES)}, got {self.rules}"
            )
        if not self.thresholds or any(not 0 < t < 1 for t in self.thresholds):
            raise ValueError(f"nullspace_rules setting thresholds: values in (0, 1), got {self.thresholds}")
        if self.n < 1 or self.n_samples < 1:
            raise ValueError(f"nullspace_rules: n and n_samples must be >= 1, got {self.n}, {self.n_samples}")


def tables(report: dict) -> dict[str, str]:
    """``nullspace_rules``: one row per rule × τ, the layers side by side."""
    layers, rows = report["layers"], report["rows"]
    by = {(r["rule"], r["tau"], r["layer"]): r for r in rows}
    settings = sorted({(r["rule"], r["tau"]) for r in rows}, key=lambda x: (x[0] != "relative", x[1]))

    def pc(x):
        return f"{100 * x:.0f}%" if x >= 0.1 else f"{100 * x:.2g}%"

    def cell(r):
        return f"{r['null_dim']} / {pc(r['leak'])} / {pc(r['edit_key_energy'])}"

    lines = [
        f"# AlphaEdit's null space per layer on {report['model']}",
        "",
        f"Preserved keys: {report['stats_tokens']} tokens of {report['corpus']}; edit keys: {report['n_keys']} "
        f"requests the model knows, averaged over {report['context_variants']} context variants, unedited model. "
        "Each cell: null-space dimension / preserved keys' energy inside it (leak) / edit keys' energy inside it.",
        "",
        "| rule | τ | "
        + " | ".join(f"layer {l} (d = {by[(settings[0][0], settings[0][1], l)]['d_mlp']})" for l in layers)
        + " |",
        "|---|---|" + "---|" * len(layers),
    ]
    for rule, tau in settings:
        lines.append(f"| {rule} | {tau:g} | " + " | ".join(cell(by[(rule, tau, l)]) for l in layers) + " |")
    return {"nullspace_rules": "\n".join(lines)}


def figures(report: dict) -> dict[str, Figure]:
    """``nullspace_rules``: the edit keys' energy in the null space against τ, one panel per rule."""
    from matplotlib.figure import Figure

    from gpt2_interp.plots.layout import finish_layout

    layers, rows = report["layers"], report["rows"]
    by = {(r["rule"], r["tau"], r["layer"]): r for r in rows}
    rules = sorted({r["rule"] for r in rows}, key=lambda r: r != "relative")
    fig = Figure(figsize=(4.2 * len(rules), 3.4))
    axes = fig.subplots(1, len(rules), sharey=True, squeeze=False)
    for ax, rule in zip(axes[0], rules):
        taus = sorted({r["tau"] for r in rows if r["rule"] == rule})
        for l in layers:
            ax.plot(taus, [100 * by[(rule, t, l)]["edit_key_energy"] for t in taus], "o-", label=f"layer {l}")
        ax.set_xscale("log")
        ax.set_xlabel("τ")
        ax.set_title(f"{rule} rule")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("edit keys' energy in the null space (%)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"{report['model']}: where AlphaEdit's update can act")
    finish_layout(fig)
    return {"nullspace_rules": fig}


@register("nullspace_rules", Config, tables=tables, figures=figures, cache_depends=defaults_digest)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    """Edit keys of the known requests, then each rule × τ: dimension, leak and key energy per layer."""
    hp = MemitHparams.of(model)
    layers = list(hp.layers) if hp.layers is not None else default_layers(model)
    stats = key_second_moment(model, layers, n_samples=cfg.n_samples, progress=ctx.progress)
    cases = known_cases(model, cfg.n, cfg.seed)
    prefixes = context_prefixes(model, hp.rome.prefix_lengths, hp.rome.prefixes_per_length, hp.rome.prefix_seed)
    ctx.record(
        "context_prefixes",
        {"lengths": hp.rome.prefix_lengths, "per_length": hp.rome.prefixes_per_length, "seed": hp.rome.prefix_seed},
    )
    keys, _ = subject_states(model, [c.request for c in cases], layers, prefixes)
    rows: list[dict[str, Any]] = []
    for rule in cfg.rules:
        for tau in cfg.thresholds:
            ns = NullSpace.from_stats({l: stats[l] for l in layers}, tau, rule)
            energy = ns.key_energy({l: keys[l] for l in layers})
            rows += [
                {
                    "rule": rule,
                    "tau": tau,
                    "layer": l,
                    "d_mlp": keys[l].shape[1],
                    "null_dim": ns.null_dim[l],
                    "leak": ns.leak[l],
                    "edit_key_energy": energy[l],
                }
                for l in layers
            ]
    return {
        "model": model.cfg.name,
        "layers": layers,
        "n_keys": len(cases),
        "stats_tokens": stats[layers[0]].count,
        "corpus": stats[layers[0]].key.get("corpus"),
        "context_variants": 1 + len(prefixes),
        "rows": rows,
    }
