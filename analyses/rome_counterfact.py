"""ROME, CounterFact-style: efficacy, paraphrase and neighbourhood scores, one edit at a time and sequentially.

1. Layer choice (``trace_facts`` > 0): the average MLP causal trace over ``trace_facts`` random facts (the
   known ones among them), indirect effect at the last subject token, per layer — the justification of
   ``DEFAULT_LAYERS["gpt2-facts"]``.
2. ``n`` counterfactual requests edited one at a time (each undone bit-exactly): efficacy, paraphrase,
   neighbourhood scores and magnitudes, fluency, KL drift, edit time.
3. ``sequential_n`` of them edited sequentially (edits accumulate): how the scores decay.

A real model (``known_only``): requests about facts the model knows
(:func:`gpt2_interp.editing.evaluate.known_cases`), split in two disjoint sets: the first ``tune_n`` for
tuning hyperparameters (``split=tune`` evaluates those) and the rest for the reported evaluation
(``split=eval``), ``n`` of them from ``offset`` within the split; case ids count from ``offset``.
``layer``: an int, ``default`` (the model's ROME default) or ``trace`` (the argmax of step 1).
``hparams``: ROME hyperparameter overrides ``k=v`` (values read as JSON, lists as tuples). Key
statistics: ``corpus`` (none: the model's own) over ``n_samples`` tokens, kept in the run's folder.

A long evaluation can run in parts (``offset``, one result folder each, e.g. ``--tag o0``, ``--tag o100``);
``merge`` names those folders: the run then pools their rows (same model, layer, statistics corpus and
hyperparameters; distinct case ids), recomputes the summaries and records each part's command and settings.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from gpt2_interp.analysis.tracing import average_trace
from gpt2_interp.core.result import to_jsonable
from gpt2_interp.editing.evaluate import (
    CaseRow,
    CounterfactCase,
    EditEvaluation,
    counterfact_requests,
    evaluate_edits,
    known_cases,
    summarize,
)
from gpt2_interp.editing.hparams import defaults_digest
from gpt2_interp.editing.settings import DEFAULT_LAYERS, default_layer
from gpt2_interp.editing.stats import key_second_moment
from gpt2_interp.experiments.base import ExperimentConfig, register
from gpt2_interp.experiments.runner import ExperimentResult, RunContext
from gpt2_interp.facts.base import FactBase

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from gpt2_interp.model import HookedGPT2


@dataclass
class Config(ExperimentConfig):
    n: int = field(default=200, metadata={"help": "requests edited one at a time"})
    sequential_n: int = field(default=50, metadata={"help": "of those, edited sequentially (0: skip)"})
    layer: int | Literal["default", "trace"] = field(
        default="default",
        metadata={"help": "edit layer: an int, default (the model's) or trace (the layer choice's argmax)"},
    )
    known_only: bool = field(default=False, metadata={"help": "requests about facts the model knows (real models)"})
    tune_n: int = field(default=0, metadata={"help": "known-fact requests held out for tuning (known_only)"})
    split: Literal["eval", "tune"] = field(default="eval", metadata={"help": "which known-fact split to evaluate"})
    offset: int = field(default=0, metadata={"help": "first request within the split (a part of a longer run)"})
    merge: list[str] = field(
        default_factory=list,
        metadata={"help": "result folders of parts to merge (no editing): rows pooled, summaries recomputed"},
    )
    hparams: list[str] = field(
        default_factory=list,
        metadata={"help": "ROME hyperparameter overrides k=v (JSON values, e.g. v_lr=1,kl_factor=0.5)"},
    )
    corpus: str | None = field(default=None, metadata={"help": "key statistics corpus (none: the model's)"})
    trace_facts: int = field(default=64, metadata={"help": "facts in the layer-choice trace (0: skip)"})
    n_samples: int = field(default=100_000, metadata={"help": "tokens for the key statistics"})

    QUICK: ClassVar[dict[str, Any]] = {
        "n": 3,
        "sequential_n": 3,
        "trace_facts": 0,
        "n_samples": 4000,
        "hparams": ["v_steps=5"],
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("n", "sequential_n", "tune_n", "offset", "trace_facts"):
            if getattr(self, name) < 0:
                raise ValueError(f"rome_counterfact setting {name} must be >= 0, got {getattr(self, name)}")
        if self.n_samples < 1:
            raise ValueError(f"rome_counterfact setting n_samples must be >= 1, got {self.n_samples}")
        if self.layer == "trace" and not self.trace_facts and not self.merge:
            raise ValueError(
                "rome_counterfact setting layer=trace takes the layer choice's argmax: give trace_facts > 0"
            )
        parse_hparams(self.hparams)  # refuse malformed overrides before any work


def parse_hparams(items: list[str]) -> dict[str, Any]:
    """``["v_lr=1", "prefix_lengths=[3]"]`` → ``{"v_lr": 1, "prefix_lengths": (3,)}`` (values read as JSON,
    text otherwise; lists become tuples)."""
    out: dict[str, Any] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"rome_counterfact setting hparams: overrides are KEY=VALUE, got {item!r}")
        try:
            v = json.loads(value)
        except json.JSONDecodeError:
            v = value
        out[key.strip()] = tuple(v) if isinstance(v, list) else v
    return out


# ---------------------------------------------------------------- steps
def layer_choice(model: HookedGPT2, n_facts: int, seed: int = 0) -> dict:
    """Average MLP indirect effect at the last subject token, per layer, over ``n_facts`` random facts
    (those the model knows among them)."""
    fb = FactBase.load()
    t0 = time.perf_counter()
    facts = random.Random(seed).sample(fb.facts(), n_facts)
    avg = average_trace(model, fb.cases(facts), kind="mlp", samples=5, progress=False)  # default_window
    effect = avg.indirect_effect[avg.kinds.index("mlp"), avg.buckets.index("last subject token")]  # [n_layer]
    return {
        "n_facts": n_facts,
        "n_known": avg.n_known,
        "window": avg.window,
        "mlp_indirect_effect_last_subject_token": effect.tolist(),
        "argmax": int(effect.argmax()),
        "seconds": time.perf_counter() - t0,
    }


def split_cases(
    model: HookedGPT2, n: int, tune_n: int, split: str, seed: int, offset: int = 0
) -> list[CounterfactCase]:
    """CounterFact cases about facts the model knows (:func:`~gpt2_interp.editing.evaluate.known_cases`, in
    its seeded order): the first ``tune_n`` are the tuning split, the rest the evaluation split; ``n`` of the
    chosen split from ``offset`` within it, case ids counting from ``offset``."""
    if split == "tune":
        picked = known_cases(model, tune_n, seed)[offset : min(offset + n, tune_n)]
    else:
        picked = known_cases(model, tune_n + offset + n, seed)[tune_n + offset :]
    for i, c in enumerate(picked, start=offset):
        c.case_id = i
    return picked


def edit_layer(model: HookedGPT2, cfg: Config, choice: dict | None) -> int:
    """The layer to edit: the given int, the model's default, or the layer choice's argmax (``trace``)."""
    if cfg.layer == "default":
        return default_layer(model)
    if cfg.layer == "trace":
        assert choice is not None, "layer='trace' reads the layer choice"
        return int(choice["argmax"])
    if not 0 <= cfg.layer < model.cfg.n_layer:
        raise ValueError(f"rome_counterfact setting layer={cfg.layer}: the model has layers 0..{model.cfg.n_layer - 1}")
    return cfg.layer


def check_parts(folders: list[str], datas: list[dict]) -> None:
    """Refuse parts that differ in model, layer, statistics corpus or hyperparameters."""
    same = {
        "model": lambda x: x["model"],
        "layer": lambda x: x["layer"],
        "statistics corpus": lambda x: x["stats"]["corpus"],
        "hyperparameters": lambda x: x["one_at_a_time"]["hparams"],
    }
    for f, d in zip(folders[1:], datas[1:]):
        for what, get in same.items():
            if get(d) != get(datas[0]):
                raise ValueError(
                    f"rome_counterfact setting merge: {f} differs from {folders[0]} in its {what}: cannot merge"
                )


def merge_parts(folders: list[str]) -> dict:
    """The data of a run pooled from part folders (same model, layer, statistics corpus, hyperparameters;
    distinct case ids): rows sorted by case id, summaries recomputed, each part's command and settings kept."""
    parts = [ExperimentResult.load(Path(f)) for f in folders]
    if any(p.experiment != "rome_counterfact" for p in parts):
        raise ValueError(f"rome_counterfact setting merge: {folders} must all be rome_counterfact result folders")
    datas = [p.data for p in parts]
    first = datas[0]
    check_parts(folders, datas)
    rows = sorted((CaseRow.from_dict(r) for d in datas for r in d["one_at_a_time"]["rows"]), key=lambda r: r.case_id)
    ids = [r.case_id for r in rows]
    if len(set(ids)) != len(ids):
        raise ValueError(f"rome_counterfact setting merge: the parts {folders} overlap (repeated case ids)")
    ev = EditEvaluation(
        "rome",
        False,
        first["layer"],
        rows,
        {"all": summarize(rows), "known": summarize([r for r in rows if r.known])},
        None,
        first["one_at_a_time"]["hparams"],
        sum(d["one_at_a_time"]["seconds"] for d in datas),
        all(d["one_at_a_time"]["restored_exactly"] for d in datas),
    )
    keep = ("model", "layer", "default_layers", "stats", "known_only", "split", "tune_n")
    return {
        **{k: first.get(k) for k in keep},
        "one_at_a_time": ev.to_dict(),
        "sequential": None,
        "parts": [
            {
                "folder": str(f),
                "command": p.provenance.get("command"),
                "config": p.config,
                "n": len(p.data["one_at_a_time"]["rows"]),
                "seconds": p.data["one_at_a_time"]["seconds"],
            }
            for f, p in zip(folders, parts)
        ],
    }


def tables(data: dict) -> dict[str, str]:
    ev = EditEvaluation.from_dict(data["one_at_a_time"])
    st = data["stats"]
    md = [f"ROME on {data['model']}: CounterFact-style evaluation, layer {data['layer']}.", ""]
    if data.get("parts"):
        md += [f"{len(data['parts'])} parts merged, each:", ""]
        md += [f"- `{p['command']}` ({p['n']} requests, {p['seconds']:.0f} s)" for p in data["parts"]] + [""]
    md += [f"Key statistics: {st['count']} tokens of corpus `{st['corpus']}`.", "", "```", ev.table(), "```", ""]
    if data.get("sequential"):
        md += [
            "Sequential (edits accumulate):",
            "",
            "```",
            EditEvaluation.from_dict(data["sequential"]).table(),
            "```",
            "",
        ]
    return {"rome_counterfact": "\n".join(md)}


def figures(data: dict) -> dict[str, Figure]:
    out = {"rome_counterfact": EditEvaluation.from_dict(data["one_at_a_time"]).plot()}
    if data.get("sequential"):
        out["rome_sequential"] = EditEvaluation.from_dict(data["sequential"]).plot()
    return out


@register("rome_counterfact", Config, tables=tables, figures=figures, cache_depends=defaults_digest)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    if cfg.merge:
        return merge_parts(cfg.merge)
    data: dict[str, Any] = {"model": model.cfg.name, "default_layers": DEFAULT_LAYERS}
    if cfg.trace_facts:
        data["layer_choice"] = layer_choice(model, cfg.trace_facts, cfg.seed)
    layer = data["layer"] = edit_layer(model, cfg, data.get("layer_choice"))
    hparams = parse_hparams(cfg.hparams)
    t0 = time.perf_counter()
    stats = key_second_moment(
        model,
        layer,
        corpus=cfg.corpus,
        n_samples=cfg.n_samples,
        progress=ctx.progress,
        cache_dir=False if ctx.out_dir is None else ctx.out_dir / ".cache" / "stats",
    )
    data["stats"] = {"corpus": stats.key["corpus"], "count": stats.count, "seconds": time.perf_counter() - t0}
    if cfg.known_only:
        cases = split_cases(model, cfg.n, cfg.tune_n, cfg.split, cfg.seed, cfg.offset)
        data |= {"known_only": True, "split": cfg.split, "tune_n": cfg.tune_n, "offset": cfg.offset}
    else:
        cases = counterfact_requests(n=cfg.n, seed=cfg.seed)
    ev = evaluate_edits(model, cases, layer=layer, stats=stats, seed=cfg.seed, progress=ctx.progress, **hparams)
    ctx.record("rome_hparams", ev.hparams)
    data["one_at_a_time"] = ev.to_dict()
    data["sequential"] = None
    if cfg.sequential_n:
        seq = evaluate_edits(
            model,
            cases[: cfg.sequential_n],
            layer=layer,
            stats=stats,
            sequential=True,
            seed=cfg.seed,
            progress=ctx.progress,
            **hparams,
        )
        data["sequential"] = seq.to_dict()
    return to_jsonable(data)
