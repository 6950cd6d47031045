"""Subject specificity: does an edit keep the edited subject's OTHER facts? ROME and MEMIT, with and without
keep prompts.

CounterFact's neighbourhood score checks other subjects; it never checks the edited subject's other
relations, and locate-and-edit methods write to the subject's representation, which every relation
reads. For ``n`` requests the model knows (:func:`gpt2_interp.editing.evaluate.known_cases`), each method
in ``methods`` edits:

- ROME: one request at a time, each edit on the unedited model, scored and undone;
- MEMIT: all requests in one batch;

once as published (``published``) and once per ``keep_factors`` value with :attr:`Request.keep` = the
subject's other relations' training prompts ``keep_templates`` (default: the SECOND, index 1;
:func:`~gpt2_interp.editing.evaluate.keep_other_relations`); subject specificity (SS) is scored on their
FIRST training prompt (index 0), which is never optimised. ``append`` adds the runs to the earlier
result in the same folder (same model, requests and seed). Reported: ES/PS/NS, SS, shared-token
neighbours (STN), fluency, edit time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch

from gpt2_interp.core.result import to_jsonable
from gpt2_interp.editing.evaluate import CounterfactCase, evaluate_edits, keep_other_relations, known_cases
from gpt2_interp.editing.hparams import defaults_digest
from gpt2_interp.experiments.base import ExperimentConfig, register
from gpt2_interp.experiments.runner import RunContext

from .rome_counterfact import parse_hparams

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from gpt2_interp.model import HookedGPT2


@dataclass
class Config(ExperimentConfig):
    n: int = field(default=100, metadata={"help": "requests (facts the unedited model knows)"})
    methods: list[Literal["rome", "memit"]] = field(
        default_factory=lambda: ["rome", "memit"], metadata={"help": "editors, from rome, memit"}
    )
    keep_factors: list[float] = field(
        default_factory=lambda: [1.0], metadata={"help": "keep_factor values to run with keep prompts"}
    )
    keep_templates: list[int] = field(
        default_factory=lambda: [1],
        metadata={"help": "training-prompt indices of the other relations kept (0 is scored: not allowed)"},
    )
    published: bool = field(default=True, metadata={"help": "also run each method as published (without keep)"})
    append: bool = field(
        default=False,
        metadata={"help": "add the runs to the earlier result in this run's folder (same model, n, seed)"},
    )
    mom2_weight: float | None = field(default=None, metadata={"help": "MEMIT's λ (none: the model's)"})
    fluency_tokens: int = field(default=40, metadata={"help": "generated tokens for the fluency score"})
    hparams: list[str] = field(
        default_factory=list,
        metadata={"help": "editor hyperparameter overrides k=v for both methods (JSON values, e.g. v_steps=3)"},
    )

    QUICK: ClassVar[dict[str, Any]] = {
        "n": 3,
        "fluency_tokens": 6,
        "hparams": ["v_steps=3", "prefixes_per_length=1", "prefix_lengths=[3]"],
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n < 1:
            raise ValueError(f"subject_specificity setting n must be >= 1, got {self.n}")
        if not self.methods:
            raise ValueError("subject_specificity setting methods: name at least one of rome, memit")
        if not self.keep_templates or min(self.keep_templates) < 1:
            raise ValueError(
                "subject_specificity setting keep_templates: give indices >= 1 (subject specificity is scored on "
                f"training prompt 0), got {self.keep_templates}"
            )
        parse_hparams(self.hparams)


def one_run(
    model: HookedGPT2, cases: list[CounterfactCase], method: str, factor: float | None, cfg: Config, progress: bool
) -> dict:
    """One method on the requests, as published (``factor`` None) or with keep prompts weighted ``factor``."""
    extra: dict[str, Any] = parse_hparams(cfg.hparams)
    if method == "memit" and cfg.mom2_weight is not None:
        extra["mom2_weight"] = cfg.mom2_weight
    if factor is not None:
        extra["keep_factor"] = factor
    t = time.perf_counter()
    ev = evaluate_edits(model, cases, method=method, progress=progress, fluency_tokens=cfg.fluency_tokens, **extra)
    keep = None if factor is None else sum(len(c.request.keep) for c in cases) / max(len(cases), 1)
    return {
        "method": method,
        "keep_factor": factor,
        "layer": ev.layer,
        "keep_templates": None if factor is None else list(cfg.keep_templates),
        "keep_prompts_mean": keep,
        "torch_threads": torch.get_num_threads(),
        "hparams": to_jsonable(ev.hparams),
        "summary": to_jsonable(ev.summary["all"]),
        "seconds": time.perf_counter() - t,
    }


def earlier_report(ctx: RunContext, cfg: Config, model_name: str, n: int) -> dict | None:
    """With ``append``: the earlier result of this folder, checked to be about the same requests."""
    if not cfg.append:
        return None
    old = ctx.previous_matching("append", {"model": model_name, "n": n, "seed": cfg.seed}, unrecorded={"seed": 0})
    if old is None:
        raise ValueError(
            "subject_specificity setting append: there is no earlier result in this run's folder to add to"
        )
    return old


def _pc(x: float | None) -> str:
    return f"{100 * x:.1f}" if x is not None else "–"


def tables(data: dict) -> dict[str, str]:
    lines = [
        f"Subject specificity on {data['model']}: {data['n']} requests the model knows; keep = the subject's "
        "other relations' training prompts of the listed indices (1 = the second; the count is per request, on "
        "average); SS is scored on their first (index 0), never optimised.",
        "",
        "| method | keep factor | keep prompts | ES | PS | NS (unedited) | SS (facts) | STN (facts) | fluency pre → "
        "post | time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["runs"]:
        s = r["summary"]
        fl = f"{s['fluency_pre']:.3f} → {s['fluency_post']:.3f}" if s.get("fluency_post") is not None else "–"
        kp = (
            "–"
            if r["keep_factor"] is None
            else (
                f"{r.get('keep_templates', [1])} ({r.get('keep_prompts_mean', data.get('keep_prompts_mean', 0)):.1f})"
            )
        )
        factor = r["keep_factor"] if r["keep_factor"] is not None else "– (as published)"
        lines.append(
            f"| {r['method']} (layer {r['layer']}) | {factor} | {kp} | {_pc(s['post']['es'])} | "
            f"{_pc(s['post']['ps'])} | {_pc(s['post']['ns'])} ({_pc(s['pre']['ns'])}) | "
            f"{_pc(s.get('ss'))} ({s.get('n_ss')}) | {_pc(s.get('stn'))} ({s.get('n_stn')}) | {fl} | "
            f"{r['seconds']:.0f} |"
        )
    return {"subject_specificity": "\n".join(lines)}


def figures(data: dict) -> dict[str, Figure]:
    from matplotlib.figure import Figure

    from gpt2_interp.plots.layout import finish_layout

    runs = data["runs"]
    names = [
        f"{r['method']}\n"
        + (
            "published"
            if r["keep_factor"] is None
            else f"keep ×{r['keep_factor']:g}"
            + (f"\nprompts {','.join(map(str, r['keep_templates']))}" if r.get("keep_templates", [1]) != [1] else "")
        )
        for r in runs
    ]
    metrics = {
        "ES": lambda s: s["post"]["es"],
        "PS": lambda s: s["post"]["ps"],
        "NS": lambda s: s["post"]["ns"],
        "SS": lambda s: s.get("ss"),
        "STN": lambda s: s.get("stn"),
    }
    fig = Figure(figsize=(1.6 * len(names) + 3, 3.6))
    ax = fig.subplots()
    width = 0.8 / len(metrics)
    for j, (m, get) in enumerate(metrics.items()):
        vals = [100 * (get(r["summary"]) or 0) for r in runs]
        ax.bar([i + (j - len(metrics) / 2 + 0.5) * width for i in range(len(names))], vals, width, label=m)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("%")
    ax.set_ylim(0, 105)
    ax.legend(ncol=len(metrics), fontsize=8, loc="lower center")
    ax.set_title(f"{data['model']}: does an edit keep the subject's other facts? (SS)")
    finish_layout(fig)
    return {"subject_specificity": fig}


@register("subject_specificity", Config, tables=tables, figures=figures, cache_depends=defaults_digest)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    cases = known_cases(model, cfg.n, cfg.seed)
    kept = keep_other_relations(cases, template=cfg.keep_templates)
    report = earlier_report(ctx, cfg, model.cfg.name, len(cases))
    report = (
        dict(report)
        if report
        else {
            "model": model.cfg.name,
            "n": len(cases),
            "seed": cfg.seed,
            "torch_threads": torch.get_num_threads(),
            "runs": [],
        }
    )
    report["runs"] = list(report["runs"])
    for method in cfg.methods:
        for factor in ([None] if cfg.published else []) + list(cfg.keep_factors):
            report["runs"].append(one_run(model, cases if factor is None else kept, method, factor, cfg, ctx.progress))
    return report
