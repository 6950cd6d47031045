"""Which edit layers for MEMIT: the layer window × λ × context variants, on the tuning set.

The mass_editing experiment edits gpt2-facts at layer 0 alone (the causal trace puts its facts in
layer 0's MLP), and with 1,000 requests one 1,024-dim key space cannot fit them. MEMIT spreads the
write over several layers. This experiment measures, on the same tuning requests as mass_editing
(``known_cases(model, tune_n, seed + 1)``, none sharing a subject and relation with its ``n``
evaluation requests), one MEMIT batch for every window ``[lo … top]`` and λ:

1. one δ optimisation per (top layer, context variants) — the target residuals at the top layer do
   not depend on λ or on the lower layers (``compute_edits(targets=)``);
2. every window ending at that top layer and every λ re-solves the update from those targets and is
   scored (ES/PS/NS, fit error ‖KΔW − R‖/‖R‖ per layer, ‖ΔW‖);
3. ``sub=B``: the same λ on sub-batches of ``B`` requests (averaged), to see how the best λ moves
   with the batch size (λC is weighed against KᵀK, which grows with the batch).

Context variants (``ctx``): ``memit`` = the bare prompt + 5 generated prefixes of 10 tokens (MEMIT's,
6 rows per request); ``rome`` = + 5 of 5 tokens as well (ROME's, 11 rows).

Rows merge across runs in the same folder (``ctx.previous``): a run with other top layers or context
variants adds its rows and replaces those it recomputes; runs whose request sets, statistics or δ
settings differ (``settings`` in the data) are refused, so the table never mixes them.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch

from gpt2_interp.editing.edit import TargetResiduals
from gpt2_interp.editing.evaluate import known_cases
from gpt2_interp.editing.hparams import defaults_digest
from gpt2_interp.editing.memit import compute_edits
from gpt2_interp.editing.stats import key_second_moment
from gpt2_interp.experiments.base import ExperimentConfig, register
from gpt2_interp.experiments.runner import RunContext

from .mass_editing import mean_scores

if TYPE_CHECKING:
    from gpt2_interp.model import HookedGPT2

CTX: dict[str, dict[str, Any]] = {
    "memit": {"prefix_lengths": (10,), "prefixes_per_length": 5},
    "rome": {"prefix_lengths": (5, 10), "prefixes_per_length": 5},
}


@dataclass
class Config(ExperimentConfig):
    tops: list[int] = field(
        default_factory=lambda: [0, 1, 2], metadata={"help": "top edit layers (one δ optimisation each)"}
    )
    ctx: Literal["memit", "rome"] = field(default="memit", metadata={"help": "context variants of the δ optimisation"})
    lambdas: list[float] = field(
        default_factory=lambda: [100.0, 300.0, 1000.0, 3000.0, 10000.0], metadata={"help": "MEMIT λ values"}
    )
    los: list[int] | None = field(default=None, metadata={"help": "lowest layers of the windows (none: 0 … top)"})
    n: int = field(default=1000, metadata={"help": "evaluation requests of mass_editing (excluded from tuning)"})
    tune_n: int = field(default=200, metadata={"help": "tuning requests in the batch"})
    sub: int = field(default=0, metadata={"help": "also score sub-batches of this many requests (0: no)"})
    delta_norm: Literal["resid", "mlp_out"] = field(default="resid", metadata={"help": "δ's clamp scale"})
    n_samples: int = field(default=100_000, metadata={"help": "tokens for the key statistics"})
    v_steps: int | None = field(default=None, metadata={"help": "δ optimisation steps (none: the model's)"})

    QUICK: ClassVar[dict[str, Any]] = {"n": 8, "tune_n": 4, "lambdas": [100.0], "n_samples": 3000, "v_steps": 3}

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.tops or min(self.tops) < 0:
            raise ValueError(f"mass_editing_window setting tops must be layer indices >= 0, got {self.tops}")
        if not self.lambdas:
            raise ValueError("mass_editing_window setting lambdas: give at least one λ")
        if self.sub < 0 or self.tune_n < 1 or self.n < 0:
            raise ValueError(
                f"mass_editing_window: need sub >= 0, tune_n >= 1, n >= 0; got sub={self.sub}, "
                f"tune_n={self.tune_n}, n={self.n}"
            )


def run_settings(model: HookedGPT2, cfg: Config) -> dict[str, Any]:
    """What every row of a folder must share to be merged: the model, the request sets, the statistics, δ."""
    return {
        "model": model.cfg.name,
        "n": cfg.n,
        "tune_n": cfg.tune_n,
        "seed": cfg.seed,
        "n_samples": cfg.n_samples,
        "delta_norm": cfg.delta_norm,
        "v_steps": cfg.v_steps,
    }


def earlier_report(ctx: RunContext, settings: dict) -> dict:
    """The earlier result's data to merge into (a new one when there is none); refused when its settings differ."""
    previous = ctx.previous_matching(None, {"settings": settings})
    if previous is None:
        return {"model": settings["model"], "rows": [], "targets": [], "settings": settings}
    return previous


def score(
    model: HookedGPT2,
    tune: list,
    window: list[int],
    lam: float,
    z: TargetResiduals,
    stats: dict,
    hp: dict,
    idx: list[int] | None = None,
) -> dict:
    """One MEMIT batch on ``window`` with λ re-solved from the top layer's targets ``z``: ES/PS/NS, the
    fit error (mean and per layer) and ‖ΔW‖; ``idx``: a sub-batch of the tuning requests."""
    cs = tune if idx is None else [tune[i] for i in idx]
    zz = z if idx is None else z[idx]
    e = compute_edits(
        model, [c.request for c in cs], layers=window, stats=stats, hparams={**hp, "mom2_weight": lam}, targets=zz
    )
    with model.edited(e):
        got = mean_scores(model, cs, 64)
    fit = e.metrics["fit"]
    return {
        **got,
        "fit_error": sum(f["fit_error"] for f in fit.values()) / len(fit),
        "fit_per_layer": {str(l): f["fit_error"] for l, f in fit.items()},
        "dW_norm": sum(f["dW_norm"] ** 2 for f in fit.values()) ** 0.5,
    }


def top_targets(model: HookedGPT2, tune: list, top: int, stats: dict, hp: dict) -> dict[str, Any]:
    """One δ optimisation of the tuning batch at ``top``: its targets ``z`` and what it took."""
    t = time.perf_counter()
    e = compute_edits(model, [c.request for c in tune], layers=[top], stats=stats, hparams=hp)
    m = e.metrics
    return {
        "z": e.targets,
        "record": {
            "seconds": time.perf_counter() - t,
            "delta_seconds": m["delta_seconds"],
            "steps_mean": m["steps_mean"],
            "p_target_optimised_mean": m["p_target_optimised_mean"],
            "delta_norm_mean": m["delta_norm_mean"],
            "n": len(tune),
        },
    }


def put(report: dict, row: dict) -> None:
    """Add ``row``, replacing an earlier one of the same window, context, λ and sub-batch size."""

    def key(r):
        return (list(r["window"]), r["ctx"], r["lambda"], r.get("sub"))

    report["rows"] = [r for r in report["rows"] if key(r) != key(row)] + [row]


def window_rows(
    model: HookedGPT2, cfg: Config, tune: list, window: list[int], z: TargetResiduals, stats: dict, hp: dict
) -> list[dict]:
    """Every λ on the whole batch, and (``sub``) on sub-batches averaged."""
    rows = [
        {"window": window, "ctx": cfg.ctx, "lambda": lam, "sub": None, **score(model, tune, window, lam, z, stats, hp)}
        for lam in cfg.lambdas
    ]
    if cfg.sub:
        for lam in cfg.lambdas:
            parts = [
                score(model, tune, window, lam, z, stats, hp, list(range(s, min(s + cfg.sub, len(tune)))))
                for s in range(0, len(tune), cfg.sub)
            ]
            rows.append(
                {
                    "window": window,
                    "ctx": cfg.ctx,
                    "lambda": lam,
                    "sub": cfg.sub,
                    **{k: sum(r[k] for r in parts) / len(parts) for k in ("es", "ps", "ns", "fit_error")},
                }
            )
    return rows


def tables(report: dict) -> dict[str, str]:
    """``mass_editing_window``: the δ optimisations, the windows × λ, the sub-batches."""

    def pc(x):
        return f"{100 * x:.1f}"

    n_ctx = {k: 1 + v["prefixes_per_length"] * len(v["prefix_lengths"]) for k, v in CTX.items()}
    lines = [
        f"# MEMIT edit-layer window on {report['model']}",
        "",
        f"{report['n_tune']} tuning requests in one batch (NS unedited {pc(report['ns_unedited'])}); δ scaled by "
        f"{report['delta_norm']!r}; {report['threads']} torch thread(s). Goal (1,000 requests): ES ≥ 95, "
        "PS ≥ 85, NS within 5 points of unedited.",
        "",
        "δ optimisations (one per top layer and context variants; each row below re-solves from them):",
        "",
        "| top layer | context variants | seconds | steps (mean) | p(target) after | ‖δ‖ |",
        "|---|---|---|---|---|---|",
    ]
    for t in sorted(report["targets"], key=lambda r: (r["ctx"], r["top"])):
        lines.append(
            f"| {t['top']} | {n_ctx[t['ctx']]} ({t['ctx']}) | {t['delta_seconds']:.0f} | "
            f"{t['steps_mean']:.1f} | {t['p_target_optimised_mean']:.2f} | {t['delta_norm_mean']:.0f} |"
        )
    lines += [
        "",
        "| window | context | λ | ES | PS | NS | fit (per layer) | ‖ΔW‖ |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = sorted([r for r in report["rows"] if not r.get("sub")], key=lambda r: (r["ctx"], r["window"], r["lambda"]))
    for r in rows:
        per = ", ".join(f"{float(v):.2f}" for v in r["fit_per_layer"].values())
        lines.append(
            f"| {r['window']} | {n_ctx[r['ctx']]} | {r['lambda']:g} | {pc(r['es'])} | {pc(r['ps'])} | "
            f"{pc(r['ns'])} | {r['fit_error']:.2f} ({per}) | {r['dW_norm']:.0f} |"
        )
    subs = [r for r in report["rows"] if r.get("sub")]
    if subs:
        lines += [
            "",
            "Sub-batches (λ vs batch size: the same λ on batches of `sub` requests, averaged):",
            "",
            "| window | context | sub-batch | λ | ES | PS | NS | fit |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in sorted(subs, key=lambda r: (r["ctx"], r["window"], r["sub"], r["lambda"])):
            lines.append(
                f"| {r['window']} | {n_ctx[r['ctx']]} | {r['sub']} | {r['lambda']:g} | {pc(r['es'])} | "
                f"{pc(r['ps'])} | {pc(r['ns'])} | {r['fit_error']:.2f} |"
            )
    return {"mass_editing_window": "\n".join(lines)}


@register("mass_editing_window", Config, tables=tables, cache_depends=defaults_digest)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    """One δ optimisation per top layer, every window × λ re-solved from it, merged into the earlier rows."""
    if max(cfg.tops) >= model.cfg.n_layer:
        raise ValueError(
            f"mass_editing_window setting tops: {model.cfg.name} has layers 0 … {model.cfg.n_layer - 1}, got {cfg.tops}"
        )
    settings = run_settings(model, cfg)
    report = earlier_report(ctx, settings)
    with torch.no_grad():
        cases = known_cases(model, cfg.n, cfg.seed)
        tune = known_cases(model, cfg.tune_n, cfg.seed + 1, {(c.relation, c.request.subject) for c in cases})
        ns_pre = mean_scores(model, tune, 64)["ns"]
        stats = key_second_moment(model, list(range(max(cfg.tops) + 1)), n_samples=cfg.n_samples, progress=False)
        # δ scaled by the residual after the top layer (MEMIT's compute_z): ROME's v₀ scale (the MLP output)
        # clamps δ to a few units above layer 0 on this model (memit.MemitHparams.delta_norm)
        hp = {**CTX[cfg.ctx], "delta_norm": cfg.delta_norm, **({"v_steps": cfg.v_steps} if cfg.v_steps else {})}
        ctx.record("delta", hp)
        report.update(n_tune=len(tune), ns_unedited=ns_pre, threads=torch.get_num_threads(), delta_norm=cfg.delta_norm)
        for top in cfg.tops:
            got = ctx.cached(f"targets-{cfg.ctx}-top{top}", functools.partial(top_targets, model, tune, top, stats, hp))
            report["targets"] = [r for r in report["targets"] if (r["top"], r["ctx"]) != (top, cfg.ctx)] + [
                {"top": top, "ctx": cfg.ctx, **got["record"]}
            ]
            for lo in [l for l in (cfg.los if cfg.los is not None else range(top + 1)) if l <= top]:
                for row in window_rows(model, cfg, tune, list(range(lo, top + 1)), got["z"], stats, hp):
                    put(report, row)
    return report
