"""Where do facts live? ROME's Figure 2: causal traces averaged over the fact base in six position buckets.

Causal traces (hidden states, MLP and attention outputs) on the first training template of ``facts``
facts spread evenly over the relations (random within each, seeded), averaged over the facts the
model knows in ROME's six position buckets (:func:`gpt2_interp.analysis.tracing.average_trace`). The
subject is corrupted with Gaussian noise of ``noise`` × σ, σ the std of the fact base's subject-token
embeddings (ROME's choice) or of all of W_E. ``known_only`` draws the facts from those the model knows
(:func:`gpt2_interp.analysis.known.known_facts`), for a real model that knows a fraction of the fact
base. The data holds the averaged trace, the peak cell of each kind and a one-sentence finding
computed from the numbers (where the MLP indirect effect at the last subject token peaks, and how it
compares with the last token).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch

from gpt2_interp.analysis.known import known_facts
from gpt2_interp.analysis.tracing import KINDS, AverageTrace, average_trace, default_window, embedding_std
from gpt2_interp.experiments.base import ExperimentConfig, register
from gpt2_interp.experiments.runner import RunContext
from gpt2_interp.facts.base import Fact, FactBase

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from gpt2_interp.model import HookedGPT2


@dataclass
class Config(ExperimentConfig):
    facts: int = field(default=120, metadata={"help": "facts to trace (spread over relations)"})
    samples: int = field(default=10, metadata={"help": "noise samples per fact"})
    noise: float = field(default=3.0, metadata={"help": "noise std as a multiple of σ (see sigma)"})
    sigma: Literal["subjects", "W_E"] = field(
        default="subjects",
        metadata={
            "help": "σ: std of the fact base's subject-token embeddings (ROME's choice) or of all of W_E "
            "(most of gpt2-facts' vocabulary is untrained, which makes std(W_E) small)"
        },
    )
    window: int | None = field(
        default=None,
        metadata={"help": "mlp/attn window (none: half the layers up to 12 layers, else ROME's 10/48 of the depth)"},
    )
    known_only: bool = field(default=False, metadata={"help": "trace only facts the model knows"})

    QUICK: ClassVar[dict[str, Any]] = {"facts": 8, "samples": 3}

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("facts", "samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"causal_trace: {name} must be >= 1, got {getattr(self, name)}")
        if self.window is not None and self.window < 1:
            raise ValueError(f"causal_trace: window must be >= 1 or none, got {self.window}")


def pick_facts(fb: FactBase, n: int, seed: int = 0, among: list[Fact] | None = None) -> list[Fact]:
    """``n`` facts spread evenly over the relations (random within each, seeded), from ``among``
    (default: the whole fact base)."""
    rng = random.Random(seed)
    pool = fb.facts() if among is None else among
    per = {r: rng.sample(fs, len(fs)) for r in fb.relations for fs in [[f for f in pool if f.relation == r]]}
    out: list[Fact] = []
    while len(out) < n and any(per.values()):
        for r in fb.relations:
            if per[r] and len(out) < n:
                out.append(per[r].pop())
    return out


def trace_window(n_layer: int, window: int | None) -> int:
    """The window: ``window``, else half the layers for a model of up to 12 layers (a band the eye can
    follow; wider than :func:`~gpt2_interp.analysis.tracing.default_window`), else ROME's 10/48 of the depth."""
    return window or (max(1, n_layer // 2) if n_layer <= 12 else default_window(n_layer))


def stage(layer: int, n: int) -> str:
    """``early`` / ``middle`` / ``late``: the third of the ``n`` layers that ``layer`` is in."""
    return "early" if layer < n / 3 else "middle" if layer < 2 * n / 3 else "late"


def finding(avg: AverageTrace, model_name: str) -> str:
    """One sentence on where the facts are recalled, computed from the averaged indirect effects."""
    ie = {k: avg.indirect_effect[i] for i, k in enumerate(avg.kinds)}
    row = {b: j for j, b in enumerate(avg.buckets)}
    subj, last = row["last subject token"], row["last token"]
    n = len(avg.layer_labels)

    def peak(kind: str, r: int) -> tuple[int, float]:
        layer = int(ie[kind][r].argmax())
        return layer, float(ie[kind][r, layer])

    mlp_l, mlp_v = peak("mlp", subj)
    attn_l, attn_v = peak("attn", last)
    hid = ie["hidden"]
    # the last layer where the last subject token's state still matters, the first where the last token's does
    subj_until = max(l for l in range(n) if hid[subj, l] >= 0.5 * hid[subj].max())
    last_from = min(l for l in range(n) if hid[last, l] >= 0.5 * hid[last].max())
    mlp_last = peak("mlp", last)[1]
    if mlp_v > mlp_last and attn_l > mlp_l and subj_until <= last_from:
        reading = "the fact is looked up at the subject and moved to the last token by attention"
    else:
        reading = "this does not separate a lookup at the subject from a move to the last token as ROME found"
    return (
        f"Over the {avg.n_known} facts {model_name} knows (of {avg.n_facts} traced; {n} layers, window {avg.window}), "
        f"restoring the {stage(mlp_l, n)} MLPs (window centred on layer {mlp_l}) at the last subject token recovers "
        f"an average indirect effect of {mlp_v:.2f} ({'more' if mlp_v > mlp_last else 'less'} than any MLP window at "
        f"the last token, {mlp_last:.2f}), while attention at the last token peaks "
        f"{'later' if attn_l > mlp_l else 'no later'} ({stage(attn_l, n)} layers, layer {attn_l}, {attn_v:.2f}); the "
        f"last subject token's hidden state matters up to layer {subj_until} and the last token's from layer "
        f"{last_from} on (≥ half its peak): {reading} (clean p = {avg.clean_score:.3f}, corrupted p = "
        f"{avg.corrupted_score[0]:.3f})."
    )


def peaks(avg: AverageTrace) -> dict[str, Any]:
    """Per kind, the (bucket, layer) cell of largest average indirect effect, and per kind and bucket
    the peak layer — the numbers to set beside ROME's GPT-2 XL finding. Cells that are the clean run by
    construction (:meth:`~gpt2_interp.analysis.tracing.AverageTrace.clean_layers`) are left out."""
    out: dict[str, Any] = {}
    for k in avg.kinds:
        by = {bk: avg.peak(k, bk) for bk in avg.buckets}  # (layer, indirect effect)
        best = max(avg.buckets, key=lambda bk: by[bk][1])
        out[k] = {
            "bucket": best,
            "layer": by[best][0],
            "indirect_effect": round(by[best][1], 4),
            "by_bucket": {bk: {"layer": l, "indirect_effect": round(v, 4)} for bk, (l, v) in by.items()},
        }
    return out


def average_from_data(data: dict) -> AverageTrace:
    """The :class:`AverageTrace` that ``data`` (this experiment's data, or its saved JSON) holds."""
    names = [f for f in AverageTrace.__dataclass_fields__ if f in data]
    kw = {k: data[k] for k in names}
    kw["scores"], kw["indirect_effect"] = torch.tensor(data["scores"]), torch.tensor(data["indirect_effect"])
    return AverageTrace(**kw)


def tables(data: dict) -> dict[str, str]:
    return {"causal_trace": f"{data['finding']}\n\n```\n{average_from_data(data).table()}\n```"}


def figures(data: dict) -> dict[str, Figure]:
    return {"causal_trace": average_from_data(data).plot()}


@register("causal_trace", Config, tables=tables, figures=figures)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    fb = FactBase.load()
    among = known_facts(model, fb) if cfg.known_only else None
    facts = pick_facts(fb, cfg.facts, seed=cfg.seed, among=among)
    t0 = time.perf_counter()
    sigma = embedding_std(model, fb.subject_texts()) if cfg.sigma == "subjects" else float(model.W_E.float().std())
    avg = average_trace(
        model,
        fb.cases(facts),
        kind=KINDS,
        noise=cfg.noise * sigma,
        samples=cfg.samples,
        window=trace_window(model.cfg.n_layer, cfg.window),
        seed=cfg.seed,
        progress=ctx.progress,
    )
    return {
        "finding": finding(avg, model.cfg.name),
        "seconds": round(time.perf_counter() - t0, 2),
        "model": model.cfg.name,
        "known_only": cfg.known_only,
        "noise": f"{cfg.noise} × σ_{cfg.sigma} = {cfg.noise * sigma:.4g}",
        "peaks": peaks(avg),
        **avg.to_dict(),
    }
