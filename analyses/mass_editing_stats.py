"""How many statistics tokens a MEMIT batch needs: scores vs the size of the key statistics.

MEMIT's update ``ΔW = (λC + KᵀK)⁻¹KᵀR`` depends on the key second moment ``C = E[k kᵀ]`` estimated
from a corpus; MEMIT used 44M tokens per layer (100k Wikipedia records). This experiment takes ONE
batch of ``n`` known requests (the first ``n`` of the mass_editing experiment's evaluation set),
computes its keys ``K`` and targets ``R`` once (a full MEMIT edit, δ optimisation with
``target_stats``-token statistics), then for each of ``sizes`` statistics tokens recomputes ``C`` from
scratch (timed, wall and CPU), re-solves ``ΔW`` with λ fixed (``lam``, default: the model's), applies
it and records ES/PS/NS, and how far ``C`` and ``ΔW`` are from those of the largest size. One edit
layer only (gpt2-facts: layer 0): the keys there do not depend on ``C``; our δ optimisation uses ``C``
(the rank-one update's exact effect) where original MEMIT's ``compute_z`` does not, so fixing the
targets isolates what the statistics are for, the update.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from gpt2_interp.editing.evaluate import known_cases
from gpt2_interp.editing.hparams import defaults_digest
from gpt2_interp.editing.memit import MemitHparams, compute_edits, default_layers, least_squares_update
from gpt2_interp.editing.stats import key_second_moment
from gpt2_interp.experiments.base import register
from gpt2_interp.experiments.provenance import load_average
from gpt2_interp.experiments.runner import RunContext
from gpt2_interp.plots.editing import plot_decay

from .mass_editing import QUICK_DELTA, DeltaConfig, mean_scores

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from gpt2_interp.model import HookedGPT2


@dataclass
class Config(DeltaConfig):
    n: int = field(default=200, metadata={"help": "requests in the batch"})
    sizes: list[int] = field(
        default_factory=lambda: [1000, 3000, 10000, 30000, 100000, 300000],
        metadata={"help": "statistics tokens of each row"},
    )
    lam: float | None = field(default=None, metadata={"help": "MEMIT's λ (none: the model's)"})
    target_stats: int = field(
        default=100_000,
        metadata={"help": "statistics tokens for the one δ optimisation that gives the batch's targets"},
    )

    QUICK: ClassVar[dict[str, Any]] = {"n": 3, "sizes": [500, 2000], **QUICK_DELTA}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n < 1 or self.target_stats < 1 or not self.sizes or min(self.sizes) < 1:
            raise ValueError(
                f"mass_editing_stats: n, target_stats and every size must be >= 1 (sizes non-empty), "
                f"got n={self.n}, target_stats={self.target_stats}, sizes={self.sizes}"
            )


def _load_text() -> str:
    """``load average: 1.64, 2.08, 3.47`` (the machine may be shared), or "" where unavailable."""
    la = load_average()
    return f"load average: {', '.join(map(str, la))}" if la else ""


def batch_keys_and_targets(model: HookedGPT2, cases: list, layer: int, lam: float, cfg: Config) -> dict[str, Any]:
    """One full MEMIT edit of the batch (δ optimisation under ``target_stats`` tokens): its keys ``K``
    ``[n, d_mlp]``, the residuals ``R = z − h`` ``[n, d_model]`` it writes, and its timing."""
    t, c = time.perf_counter(), time.process_time()
    st = key_second_moment(model, [layer], n_samples=cfg.target_stats, progress=False)
    base = compute_edits(
        model, [x.request for x in cases], stats=st, hparams={"mom2_weight": lam, **cfg.delta_overrides()}
    )
    _, V = base.factors[layer]
    if V is None:  # a dense ΔW does not keep the targets
        raise ValueError(
            f"mass_editing_stats setting n={cfg.n}: use n below d_model ({model.cfg.d_model}) so that the "
            "edit keeps its targets R"
        )
    return {
        "K": base.keys[layer].double(),
        "R": V.double(),
        "targets": {
            "stats_tokens": st[layer].count,
            "edit_seconds": time.perf_counter() - t,
            "edit_cpu_seconds": time.process_time() - c,
            "delta_seconds": base.metrics["delta_seconds"],
        },
    }


def score_size(
    model: HookedGPT2, cases: list, layer: int, lam: float, K: torch.Tensor, R: torch.Tensor, n_tok: int
) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Statistics of ``n_tok`` tokens from scratch (timed), ``ΔW`` re-solved from them, applied and scored:
    the row, ``C`` and ``ΔW``."""
    t, c = time.perf_counter(), time.process_time()
    st = key_second_moment(model, [layer], n_samples=n_tok, cache_dir=False, recompute=True, progress=False)
    t_stats, c_stats = time.perf_counter() - t, time.process_time() - c
    dW = least_squares_update(K, R, st[layer].C, lam) @ R  # [d_mlp, d_model]
    W = model.blocks[layer].mlp.W_out
    W0 = W.detach().clone()
    with torch.no_grad():
        W.add_(dW.to(W.dtype))
    try:
        scores = mean_scores(model, cases, 64)
    finally:
        with torch.no_grad():
            W.copy_(W0)
    row = {
        "n_samples": n_tok,
        "count": st[layer].count,
        "stats_seconds": t_stats,
        "stats_cpu_seconds": c_stats,
        **scores,
        "fit_error": float((K @ dW - R).norm(dim=-1).mean() / R.norm(dim=-1).mean()),
    }
    return row, st[layer].C.double(), dW


def tables(report: dict) -> dict[str, str]:
    """``mass_editing_stats``: one row per statistics size."""

    def pc(x):
        return f"{100 * x:.1f}" if x is not None else "–"

    runs, tg, u = report["runs"], report["targets"], report["unedited"]
    lines = [
        f"# Key statistics size vs MEMIT scores ({report['model']}, layers {report['layers']}, "
        f"λ = {report['lambda']:g})",
        "",
        f"One MEMIT batch of {report['n']} known requests, key statistics from the model's statistics corpus; "
        f"unedited ES/PS/NS {pc(u['es'])}/{pc(u['ps'])}/{pc(u['ns'])}. The batch's keys and targets (δ "
        f"optimisation) come from one MEMIT edit with {tg['stats_tokens']:,}-token statistics "
        f"({tg['edit_seconds']:.0f} s wall, {tg['edit_cpu_seconds']:.0f} s CPU); each row re-solves the update "
        "with that row's C (exact for one edit layer: the keys do not depend on C, and original MEMIT's targets "
        f"do not either). CPU, {report['torch_threads']} torch thread(s); load: `{report['load_before']}` "
        f"(before) / `{report['load_after']}` (after).",
        "",
        "| tokens asked | tokens used | ES | PS | NS | ‖C − C_max‖/‖C_max‖ | ‖ΔW − ΔW(C_max)‖/‖ΔW(C_max)‖ | "
        "statistics wall (CPU) s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['n_samples']:,} | {r['count']:,} | {pc(r['es'])} | {pc(r['ps'])} | {pc(r['ns'])} | "
            f"{r['C_rel_distance']:.3f} | {r['update_rel_distance']:.3f} | {r['stats_seconds']:.1f} "
            f"({r['stats_cpu_seconds']:.1f}) |"
        )
    return {"mass_editing_stats": "\n".join(lines)}


def figures(report: dict) -> dict[str, Figure]:
    """``mass_editing_stats``: ES/PS/NS against the statistics tokens (log axis)."""
    runs = report["runs"]
    xs = [r["count"] for r in runs]
    fig = plot_decay(
        {"MEMIT": xs},
        {m: {"MEMIT": [r[k] for r in runs]} for m, k in (("ES", "es"), ("PS", "ps"), ("NS", "ns"))},
        reference={"NS": report["unedited"]["ns"]},
        xlabel="statistics tokens",
        log_x=True,
        title=f"{report['model']}: one MEMIT batch of {report['n']} vs key statistics size",
    )
    return {"mass_editing_stats": fig}


@register("mass_editing_stats", Config, tables=tables, figures=figures, cache_depends=defaults_digest)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    """Keys and targets once, then one re-solved update per statistics size."""
    layers = default_layers(model)
    if len(layers) != 1:
        raise ValueError(f"mass_editing_stats re-solves one layer's update; {model.cfg.name} edits layers {layers}")
    lay = layers[0]
    lam = cfg.lam if cfg.lam is not None else MemitHparams.of(model).mom2_weight
    ctx.record("mom2_weight", lam)
    cases = known_cases(model, cfg.n, cfg.seed)
    report: dict[str, Any] = {
        "model": model.cfg.name,
        "layers": layers,
        "lambda": lam,
        "n": len(cases),
        "torch_threads": torch.get_num_threads(),
        "load_before": _load_text(),
        "unedited": mean_scores(model, cases, 64),
        "runs": [],
    }
    # the keys K and targets R of the batch: one full MEMIT edit (kept on disk: an interrupted run resumes)
    base = ctx.cached("targets", lambda: batch_keys_and_targets(model, cases, lay, lam, cfg))
    report["targets"] = base["targets"]
    K, R = base["K"], base["R"]
    updates = {}
    for n_tok in sorted(cfg.sizes):
        row, C, dW = score_size(model, cases, lay, lam, K, R, n_tok)
        updates[n_tok] = (C, dW)
        report["runs"].append(row)
    Cref, ref = updates[max(cfg.sizes)]
    for row in report["runs"]:
        C, dW = updates[row["n_samples"]]
        row["C_rel_distance"] = float((C - Cref).norm() / Cref.norm())
        row["update_rel_distance"] = float((dW - ref).norm() / ref.norm())
    report["load_after"] = _load_text()
    return report
