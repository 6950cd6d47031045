"""Can the model do the circuit tasks? Its own logit difference and accuracy on IOI, greater-than and fact recall.

Each task (:mod:`gpt2_interp.analysis.circuits.tasks`) is a set of clean/corrupted prompt pairs drawn with
the seed for this model's tokenizer; the model runs the clean and the corrupted prompts and the task's
metric is read at the last position: IOI ``logit[IO] − logit[S]`` (Wang et al.'s templates and names,
corrupted from the ABC distribution), greater-than the probability of later two-digit years minus that
of earlier ones (Hanna et al.; corrupted with the year 01), fact recall ``logit[answer] − logit[other
subject's answer]``. Accuracy: the share of clean prompts whose answer beats the wrong token (greater-than:
whose most probable two-digit year is a later one). A task whose tokens the model's tokenizer cannot
write (greater-than under a tokenizer that splits numbers into digits) is reported as not fitting, with
the reason. A circuit of a task the model cannot do means nothing: this is reported before any circuit.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from gpt2_interp.analysis.circuits.tasks import TASKS, Task, make_task, performance, performs_reliably
from gpt2_interp.experiments.base import ExperimentConfig, register
from gpt2_interp.experiments.runner import RunContext

if TYPE_CHECKING:
    from gpt2_interp.model import HookedGPT2

#: per task, the field of a pair's record its accuracy is broken down by
GROUP_BY = {"ioi": "order", "fact_recall": "relation", "greater_than": None}


@dataclass
class Config(ExperimentConfig):
    tasks: list[str] = field(
        default_factory=lambda: list(TASKS), metadata={"help": f"tasks to measure, among {', '.join(TASKS)}"}
    )
    n: int = field(default=100, metadata={"help": "prompt pairs per task"})
    batch_size: int = field(default=32, metadata={"help": "prompts per forward pass"})

    QUICK: ClassVar[dict[str, Any]] = {"n": 8}

    def __post_init__(self) -> None:
        super().__post_init__()
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown or not self.tasks:
            raise ValueError(f"circuit_tasks: tasks must be among {', '.join(TASKS)}; got {self.tasks}")
        if self.n < 1 or self.batch_size < 1:
            raise ValueError(f"circuit_tasks: n and batch_size must be >= 1, got n={self.n}, batch={self.batch_size}")


def groups(task: Task, clean_metric: torch.Tensor, correct: torch.Tensor, key: str | None) -> dict[str, dict]:
    """Per value of the pairs' ``key`` (IOI: ABBA/BABA; fact recall: relation): pairs, mean metric, accuracy."""
    if key is None:
        return {}
    idx: dict[str, list[int]] = defaultdict(list)
    for i, p in enumerate(task.pairs):
        idx[str(p[key])].append(i)
    return {
        g: {"pairs": len(ix), "metric": float(clean_metric[ix].mean()), "accuracy": float(correct[ix].float().mean())}
        for g, ix in sorted(idx.items())
    }


def measure(model: HookedGPT2, name: str, cfg: Config) -> dict[str, Any]:
    """One task's record: its performance and how its pairs were made, or why it does not fit the model."""
    try:
        task = make_task(name, model, n=cfg.n, seed=cfg.seed)
    except ValueError as e:
        return {"fits": False, "reason": str(e)}
    perf = performance(model, task, batch_size=cfg.batch_size)
    return {
        "fits": True,
        "description": task.description,
        "metric": perf.metric,
        "pairs": perf.n_pairs,
        "aligned": task.aligned,
        "tokens": int(task.clean_tokens.shape[1]),
        "clean_metric": perf.clean_metric,
        "clean_metric_sem": perf.clean_metric_sem,
        "corrupted_metric": perf.corrupted_metric,
        "accuracy": perf.accuracy,
        "corrupted_accuracy": perf.corrupted_accuracy,
        "groups": groups(task, perf.clean_pair_metric, perf.correct, GROUP_BY[name]),
        "example": {
            "clean": task.clean[0],
            "corrupted": task.corrupted[0],
            "answer": model.tokenizer.token_str(int(task.answers[0])),
            "wrong": model.tokenizer.token_str(int(task.wrongs[0])),
        },
    }


def verdict(r: dict[str, Any]) -> str:
    """Whether a circuit of the task on this model is worth finding, from its accuracy and its metric."""
    if not r["fits"]:
        return "does not fit the tokenizer"
    done = performs_reliably(r["accuracy"], r["clean_metric"], r["clean_metric_sem"], r["corrupted_metric"])
    return "performs it" if done else "does not perform it reliably"


def tables(data: dict) -> dict[str, str]:
    rows = []
    for name, r in data["tasks"].items():
        if not r["fits"]:
            rows.append(f"| {name} | – | – | – | – | – | {verdict(r)}: {r['reason'].splitlines()[0]} |")
            continue
        rows.append(
            f"| {name} | {r['pairs']} | {r['metric']} | {r['clean_metric']:.3f} ± {r['clean_metric_sem']:.3f} | "
            f"{r['corrupted_metric']:.3f} | {r['accuracy']:.0%} (corrupted {r['corrupted_accuracy']:.0%}) | "
            f"{verdict(r)} |"
        )
    md = [
        f"# Circuit tasks on {data['model']}: the model's own performance",
        "",
        "Metric at the last position on the clean and the corrupted prompts (mean ± standard error over pairs); "
        "accuracy = share of clean prompts done (answer above the wrong token; greater-than: the most probable "
        "two-digit year is a later one). 'Performs it': accuracy ≥ 80% and the clean metric more than two "
        "standard errors above the corrupted one.",
        "",
        "| task | pairs | metric | clean | corrupted | accuracy | verdict |",
        "|---|---|---|---|---|---|---|",
        *rows,
    ]
    for name, r in data["tasks"].items():
        if r["fits"]:
            ex = r["example"]
            md += ["", f"**{name}**: {r['description']}.", ""]
            md.append(
                f"Example: {ex['clean']!r} → {ex['answer']!r} (wrong {ex['wrong']!r}); corrupted {ex['corrupted']!r}."
            )
            md.append(
                f"Prompts {'all have' if r['aligned'] else 'do not all have'} the same length "
                f"({r['tokens']} tokens at most)."
            )
            if r["groups"]:
                shares = "; ".join(f"{g} {v['accuracy']:.0%} ({v['pairs']} pairs)" for g, v in r["groups"].items())
                md.append(f"By {GROUP_BY[name]}: {shares}.")
        else:
            md += ["", f"**{name}** does not fit {data['model']}: {r['reason']}"]
    return {"circuit_tasks": "\n".join(md)}


@register("circuit_tasks", Config, tables=tables)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    return {"model": model.cfg.name, "seed": cfg.seed, "tasks": {t: measure(model, t, cfg) for t in cfg.tasks}}
