"""Where does a model make each attribute of a subject linearly decodable — and does that agree with causal tracing?

For each probing task of the fact base (country → continent, city → country, element → period, …;
prompts in several templates of the subject's relations, folds split by subject), a logistic-regression
probe per layer boundary (embeddings, after each block) on the residual stream at the subject's last
token, with Hewitt & Liang's by-type control task (one random label per subject) on the same folds;
selectivity = accuracy − control accuracy. The continent task is also probed at the prompt's last token
of the continent templates, where the answer must arrive to be said. The per-layer selectivity is set
beside this model's averaged causal trace at the last subject token (a ``causal_trace`` result, see
``trace``). Also times the continent probe against a plain forward pass over the same prompts (the
peer, same run).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from gpt2_interp.analysis.probes import ProbeResult, probe
from gpt2_interp.experiments.base import ExperimentConfig, register
from gpt2_interp.experiments.provenance import load_average
from gpt2_interp.experiments.runner import RunContext
from gpt2_interp.facts.probing import probing_set
from gpt2_interp.io.files import read_json
from gpt2_interp.plots.probes import plot_probe_summary

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from gpt2_interp.model import HookedGPT2

#: task -> templates per subject (sizes ~1,000–2,000 prompts)
TASKS = {
    "continent": 8,
    "language": 8,
    "currency": 8,
    "country": 8,
    "city_continent": 2,
    "period": 8,
    "atomic_number": 8,
}
LAST = "continent at the last token (own templates)"


@dataclass
class Config(ExperimentConfig):
    tasks: list[str] = field(
        default_factory=lambda: list(TASKS),
        metadata={
            "help": f"probing tasks (continent is required: it is timed and probed at the last token); templates per "
            f"subject: {TASKS}"
        },
    )
    per_subject: int | None = field(
        default=None,
        metadata={
            "help": "at most this many templates per subject in every task (fewer prompts: a deep model's budget)"
        },
    )
    stride: int = field(
        default=1,
        metadata={"help": "probe L0 and every stride-th block output (with the last) instead of every boundary"},
    )
    forward_timing: bool = field(
        default=True, metadata={"help": "time a plain forward pass over the continent prompts"}
    )
    trace: Path | None = field(
        default=None,
        metadata={
            "help": "the causal_trace result (a folder with result.json, or its JSON file) to set beside the probes "
            "(none: <out>/causal_trace/<model> when it holds one)"
        },
    )

    QUICK: ClassVar[dict[str, Any]] = {"tasks": ["continent", "period"], "per_subject": 2}

    def __post_init__(self) -> None:
        super().__post_init__()
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown or "continent" not in self.tasks:
            raise ValueError(
                f"probes: tasks must include 'continent' and be among {', '.join(TASKS)}; got {self.tasks}"
            )
        if self.per_subject is not None and self.per_subject < 1:
            raise ValueError(f"probes: per_subject must be >= 1 or none, got {self.per_subject}")
        if self.stride < 1:
            raise ValueError(f"probes: stride must be >= 1, got {self.stride}")


@torch.no_grad()
def forward_seconds(model: HookedGPT2, prompts: list[str], batch_size: int = 64) -> float:
    """The peer: one plain forward pass over the prompts, batched as the probe batches them."""
    t = time.perf_counter()
    for s in range(0, len(prompts), batch_size):
        tokens, mask = model.tokenize(prompts[s : s + batch_size])
        model(tokens, attention_mask=mask, return_type=None)
    return time.perf_counter() - t


def trace_curves(trace: dict | None) -> dict | None:
    """Averaged causal-trace indirect effects (a ``causal_trace`` result's data) at the last subject
    token and the last token, by layer."""
    if trace is None:
        return None
    b = trace["buckets"]
    ie = {k: trace["indirect_effect"][i] for i, k in enumerate(trace["kinds"])}
    s, last = b.index("last subject token"), b.index("last token")
    return {
        "layers": trace["layer_labels"],
        "mlp at last subject token": ie["mlp"][s],
        "hidden at last subject token": ie["hidden"][s],
        "hidden at last token": ie["hidden"][last],
        "attn at last token": ie["attn"][last],
    }


def trace_source(cfg: Config, ctx: RunContext, model_name: str) -> Path | None:
    """Where this model's causal trace is: ``cfg.trace``, else ``<out>/causal_trace/<model>/result.json``
    when the run writes its results and that file exists (another model's layers say nothing about this one)."""
    if cfg.trace is not None:
        path = cfg.trace / "result.json" if cfg.trace.is_dir() else cfg.trace
        if not path.exists():
            raise FileNotFoundError(f"probes: trace={cfg.trace} holds no causal_trace result (result.json)")
        return path
    if ctx.out_dir is None:
        return None
    root = next((p.parent for p in (ctx.out_dir, *ctx.out_dir.parents) if p.name == "probes"), None)
    found = None if root is None else root / "causal_trace" / model_name / "result.json"
    return found if found is not None and found.exists() else None


def read_trace(path: Path | None) -> dict | None:
    """The trace data in ``path``: a runner ``result.json`` (its ``data``) or a bare JSON of the same fields."""
    if path is None:
        return None
    body = read_json(path, "causal trace result")
    return body["data"] if "data" in body and "experiment" in body else body


def task_summary(r: ProbeResult) -> dict[str, Any]:
    """The numbers of one probe kept in the data (every probe here has a control task)."""
    assert r.control_mean is not None and r.selectivity is not None and r.selectivity_ci is not None
    return {
        "kind": r.kind,
        "metric": r.metric,
        "n_prompts": r.n_prompts,
        "n_subjects": r.n_groups,
        "chance": r.chance,
        "score": r.mean.tolist(),
        "ci": r.ci.tolist(),
        "control": r.control_mean.tolist(),
        "selectivity": r.selectivity.tolist(),
        "selectivity_ci": r.selectivity_ci.tolist(),
    }


def run_probes(model: HookedGPT2, cfg: Config, layers: Any) -> tuple[dict[str, ProbeResult], dict[str, Any]]:
    """Every task's probe at the subject's last token, the continent probe at the last token, and the timing."""
    tasks = {t: TASKS[t] if cfg.per_subject is None else min(TASKS[t], cfg.per_subject) for t in cfg.tasks}
    load0 = load_average()
    ds = probing_set("continent", per_subject=tasks["continent"])
    fwd = forward_seconds(model, ds.prompts) if cfg.forward_timing else None
    t = time.perf_counter()
    results = {"continent": probe(model, ds, hook="resid", layers=layers, control="by-type", progress=False)}
    probe_s = time.perf_counter() - t
    timing = {
        "prompts": len(ds),
        "boundaries": len(results["continent"].layers),
        "probe_seconds": round(probe_s, 1),
        "forward_seconds": None if fwd is None else round(fwd, 2),
        "ratio_to_forward": None if fwd is None else round(probe_s / fwd, 1),
        "threads": torch.get_num_threads(),
        "load_average": None if load0 is None else round(load0[0], 1),
    }
    for task, per in tasks.items():
        if task != "continent":
            results[task] = probe(
                model,
                probing_set(task, per_subject=per),
                hook="resid",
                layers=layers,
                control="by-type",
                progress=False,
            )
    ds_last = probing_set("continent", per_subject=tasks["continent"], which="own")
    results[LAST] = probe(
        model, ds_last, hook="resid", layers=layers, position="last", control="by-type", progress=False
    )
    return results, timing


def decodable_from(t: dict, layers: list[str]) -> str | None:
    """The first layer whose selectivity reaches 90% of the task's best, if the task is decodable at all:
    somewhere its score beats chance (R² beats 0) and its control, both beyond the 95% fold intervals."""
    n = len(t["score"])
    ci = t.get("ci", [0.0] * n)
    sci = t.get("selectivity_ci", [0.0] * n)
    base = 0.0 if t.get("kind") == "regression" else t.get("chance", 0.0)
    ok = [t["score"][i] - ci[i] > base and t["selectivity"][i] - sci[i] > 0 for i in range(n)]
    if not any(ok):
        return None
    best = max(t["selectivity"][i] for i in range(n) if ok[i])
    return layers[min(i for i in range(n) if ok[i] and t["selectivity"][i] >= 0.9 * best)]


def finding(summary: dict, trace: dict | None) -> str:
    """Where each task becomes decodable, set beside where causal tracing puts the lookup and the move."""
    first = {t: v["first_decodable"] for t, v in summary.items()}
    subj = {t: f for t, f in first.items() if t != LAST}
    yes = [f"{t} from {f}" for t, f in subj.items() if f]
    no = [t for t, f in subj.items() if not f]
    text = (
        "At the subject's last token (selectivity ≥ 90% of its best, beyond chance and control): "
        + "; ".join(yes)
        + "."
        + (f" Not linearly decodable for unseen subjects: {', '.join(no)}." if no else "")
        + f" At the prompt's last token (continent templates) the continent is decodable from {first[LAST]}."
    )
    if trace:
        mlp, hid_last = trace["mlp at last subject token"], trace["hidden at last token"]
        peak = max(range(len(mlp)), key=mlp.__getitem__)
        arrive = min(i for i, v in enumerate(hid_last) if v >= 0.5 * max(hid_last))
        text += (
            f" Causal tracing puts the lookup in the MLPs at the last subject token (window centred on "
            f"{trace['layers'][peak]}, indirect effect {mlp[peak]:.2f}) and the move to the last token from "
            f"{trace['layers'][arrive]} on (hidden state ≥ half its peak effect)."
        )
    return text


def summarize(out: dict) -> dict:
    """``out`` with each task's first decodable layer and the finding filled in from the measured numbers."""
    summary = out["tasks"]
    n = len(next(iter(summary.values()))["score"])
    layers = out["layers"] = out.get("layers") or ["embed"] + [f"L{i}" for i in range(n - 1)]
    for k in ("kind", "metric", "chance", "n_subjects"):  # same subjects and labels as the continent task
        summary[LAST].setdefault(k, summary["continent"][k])
    for v in summary.values():
        v["first_decodable"] = decodable_from(v, layers)
    out["finding"] = finding(summary, out["causal_trace"])
    return out


def timing_line(timing: dict) -> str:
    """The timing sentence of the report."""
    peer = (
        "the forward pass was not timed in this run"
        if timing.get("forward_seconds") is None
        else f"a plain forward pass over the same prompts took {timing['forward_seconds']} s in the same run"
    )
    where = (
        f"{timing['threads']} thread(s), load average {timing['load_average']} at the start"
        if "load_average" in timing
        else "a 2-core CPU shared with other jobs, load average ≈ 20"
    )
    return (
        f"Timing: {timing['prompts']} prompts × {timing['boundaries']} boundaries probed in "
        f"{timing['probe_seconds']} s; {peer} ({where})."
    )


def tables(data: dict) -> dict[str, str]:
    layers, summary = data["layers"], data["tasks"]
    rows = [
        f"| {t} ({v.get('metric', 'accuracy')}) | {v['n_prompts']} / {v.get('n_subjects', '')} | "
        + " | ".join(f"{m:.2f} ({s:+.2f})" for m, s in zip(v["score"], v["selectivity"]))
        + f" | {v['first_decodable'] or '–'} |"
        for t, v in summary.items()
    ]
    md = [
        f"# Linear probes on {data['model']}",
        "",
        "Accuracy (R² for atomic_number) by layer boundary, 5 folds split by subject, at the subject's last token "
        "(last row: at the prompt's last token); in brackets the selectivity against the by-type control "
        "(Hewitt & Liang).",
        "",
        "| task | prompts / subjects | " + " | ".join(layers) + " | decodable from |",
        "|---|---|" + "---|" * len(layers) + "---|",
        *rows,
        "",
        data["finding"],
        "",
        timing_line(data["timing"]),
    ]
    return {"probes": "\n".join(md)}


def figures(data: dict) -> dict[str, Figure]:
    trace = data["causal_trace"]
    sel = {(t if t != LAST else "continent @ last token"): v["selectivity"] for t, v in data["tasks"].items()}
    return {
        "probes": plot_probe_summary(
            data["layers"],
            sel,
            trace={k: v for k, v in trace.items() if k != "layers"} if trace else None,
            trace_layers=trace["layers"] if trace else None,
            title=f"{data['model']}: linear probes (by-type control) vs causal trace",
        )
    }


@register("probes", Config, tables=tables, figures=figures)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    n = model.cfg.n_layer
    layers = "all" if cfg.stride <= 1 else sorted({0, n - 1} | set(range(cfg.stride - 1, n, cfg.stride)))
    results, timing = run_probes(model, cfg, layers)
    source = trace_source(cfg, ctx, model.cfg.name)
    out = {
        "model": model.cfg.name,
        "layers": results["continent"].layers,
        "hook": "resid (embed = resid_pre 0, L{i} = resid_post i)",
        "position": "last subject token",
        "control": "by-type",
        "folds": results["continent"].n_folds,
        "timing": timing,
        "tasks": {t: task_summary(r) for t, r in results.items()},
        "causal_trace": trace_curves(read_trace(source)),
        "causal_trace_source": None if source is None else str(source),
    }
    return summarize(out)
