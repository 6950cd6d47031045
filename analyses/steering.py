"""Steering with a difference-of-means direction: how much it moves a behaviour, and at what cost in fluency.

For one concept (``sentiment``, the default: positive versus negative versions of 30 sentences; ``french``:
French versus English versions of 40 sentences) the direction is the difference of means of the residual
stream after block ``layer`` over the contrast pairs (each sentence's last token, or the mean over its
tokens). Added at every position with a range of scales (:meth:`HookedGPT2.steer`), it is measured on
prompts it was not built from: the target behaviour is the summed next-token probability of the concept's
words (positive adjectives; French function words) after 20 held-out openings; the cost is the steered
model's loss on unrelated natural text (Brown Corpus passages) and the KL drift of its predictions there
(:func:`gpt2_interp.analysis.features.steering_curve`). The headline is the largest probability reached
while the loss on unrelated text rises less than ``max_loss_change``, among the scales that raise it;
when none does, the finding says so and names no best scale. Shifts come with their paired standard error
(of the per-prompt differences from the unsteered model).

With ``compare=true`` the ``steering-vectors`` package (on the same weights converted to transformers,
reading the same tokens) builds the last-token vector from the same pairs: the two vectors are compared
(max |difference|), and both are applied at ``compare_scales`` to the held-out prompts, ours on our model
and theirs on the transformers model, comparing the target probabilities.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch

from gpt2_interp.analysis.features.concepts import CONCEPTS, single_tokens
from gpt2_interp.analysis.features.steering import SteeringCurve, mean_difference, steering_curve, target_token_ids
from gpt2_interp.experiments.base import ExperimentConfig, register
from gpt2_interp.experiments.provenance import load_average
from gpt2_interp.experiments.runner import RunContext
from gpt2_interp.io.corpora import brown_texts

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from gpt2_interp.model import HookedGPT2


@dataclass
class Config(ExperimentConfig):
    concept: Literal["french", "sentiment"] = field(
        default="sentiment", metadata={"help": "the contrast pairs, held-out prompts and target words"}
    )
    layer: int | None = field(
        default=None, metadata={"help": "steer the residual stream after this block (none: n_layer // 3)"}
    )
    position: Literal["mean", "last"] = field(
        default="last",
        metadata={
            "help": "read each sentence's last token (default, as `gpt2-interp steer` and steering-vectors) or "
            "its mean over tokens"
        },
    )
    scales: list[float] = field(
        default_factory=lambda: [0.0, 1.0, 2.0, 2.5, 3.0, 4.0, 6.0],
        metadata={"help": "multiples of the difference of means to add"},
    )
    pairs: int | None = field(default=None, metadata={"help": "use the first N contrast pairs (none: all)"})
    prompts: int | None = field(default=None, metadata={"help": "use the first N held-out prompts (none: all)"})
    unrelated: int = field(default=16, metadata={"help": "Brown passages for the loss and the KL drift"})
    max_tokens: int = field(default=48, metadata={"help": "tokens read of each Brown passage"})
    max_loss_change: float = field(
        default=0.05, metadata={"help": "the fluency budget: largest allowed relative rise of the loss"}
    )
    generate_tokens: int = field(
        default=0,
        metadata={"help": "also score greedy steered continuations of this many tokens with the plain model (0: off)"},
    )
    compare: bool = field(
        default=True, metadata={"help": "compare with the steering-vectors package (skipped if not installed)"}
    )
    compare_scales: list[float] = field(
        default_factory=lambda: [2.0, 4.0], metadata={"help": "scales at which the two packages' effects are compared"}
    )

    QUICK: ClassVar[dict[str, Any]] = {
        "pairs": 4,
        "prompts": 3,
        "scales": [0.0, 0.5],
        "unrelated": 2,
        "max_tokens": 12,
        "compare": False,
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.scales:
            raise ValueError("steering: scales is empty; give e.g. 0,0.1,0.2,0.5")
        for name in ("pairs", "prompts"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"steering: {name} must be >= 1 or none, got {v}")
        if self.unrelated < 1 or self.max_tokens < 2:
            raise ValueError("steering: unrelated must be >= 1 and max_tokens >= 2")


@torch.no_grad()
def target_probs(model: HookedGPT2, prompts: list[str], ids: list[int], at: str, vector: torch.Tensor, scale: float):
    """Our steered model's summed next-token probability of ``ids`` after each prompt ``[n]``."""
    with model.steer(vector, at=at, scale=scale):
        return model.last_logits(prompts).float().softmax(-1)[:, ids].sum(-1).cpu()


@torch.no_grad()
def compare_with_steering_vectors(
    model: HookedGPT2, cfg: Config, layer: int, pairs: list[tuple[str, str]], prompts: list[str], ids: list[int]
) -> dict[str, Any]:
    """steering-vectors on the same weights (transformers) and tokens: its last-token vector from the same
    pairs against ours, and the target probabilities with each applied to its own model."""
    try:
        import steering_vectors as sv
    except ImportError as e:
        return {"skipped": f"steering-vectors is not importable ({e}); pip install --no-deps steering-vectors"}
    at = f"blocks.{layer}.hook_resid_post"
    hf = model.to_transformers().eval()
    tok = model.tokenizer
    before = tok.add_bos_token
    tok.add_bos_token = True  # both read the same tokens, BOS first
    try:
        t = time.perf_counter()
        theirs = sv.train_steering_vector(hf, tok, pairs, layers=[layer], batch_size=1)
        their_s = time.perf_counter() - t
        t = time.perf_counter()
        ours = mean_difference(model, [p for p, _ in pairs], [n for _, n in pairs], at, "last")
        our_s = time.perf_counter() - t
        vector = theirs.layer_activations[layer].float().cpu()
        effects = []
        for scale in cfg.compare_scales:
            p_ours = target_probs(model, prompts, ids, at, ours, scale)
            p_theirs = []
            with theirs.apply(hf, multiplier=scale):
                for p in prompts:  # one at a time: no padding in the transformers model
                    logits = hf(model.to_tokens(p)).logits[0, -1].float()
                    p_theirs.append(float(logits.softmax(-1)[ids].sum()))
            pt = torch.tensor(p_theirs)
            effects.append(
                {
                    "scale": scale,
                    "ours": float(p_ours.mean()),
                    "theirs": float(pt.mean()),
                    "max_abs_diff_per_prompt": float((p_ours - pt).abs().max()),
                }
            )
    finally:
        tok.add_bos_token = before
    import importlib.metadata as md

    return {
        "version": md.version("steering-vectors"),
        "position": "last token (steering-vectors' read_token_index=-1)",
        "vector_max_abs_diff": float((ours - vector).abs().max()),
        "vector_norm": float(ours.norm()),
        "effects": effects,
        "seconds": {"ours": round(our_s, 2), "steering_vectors": round(their_s, 2)},
    }


def curve_of(data: dict) -> SteeringCurve:
    """The :class:`SteeringCurve` saved in the data."""
    c = dict(data["curve"])
    for k in ("result", "loss_change", "prob_shift", "best"):  # the kind and the derived fields
        c.pop(k, None)
    for k in ("scales", "target_prob", "target_sem", "shift_sem", "loss", "kl", "generation_nll"):
        c[k] = None if c.get(k) is None else torch.tensor(c[k])
    return SteeringCurve(**c)


def finding(data: dict) -> str:
    """The headline sentence, derived from the saved curve (:meth:`SteeringCurve.finding`): the best scale
    within the loss budget with its paired standard error, its verbs from the signs of the numbers, or
    that no scale stays within the budget or none within it raises the target (then no best scale)."""
    return curve_of(data).finding(
        data["max_loss_change"],
        target=f"P({data['concept']} target words) after held-out prompts",
        unrelated="unrelated Brown text",
    )


def tables(data: dict) -> dict[str, str]:
    curve = curve_of(data)
    md = [
        f"# Steering {data['model']} towards {data['concept']}",
        "",
        f"Direction: difference of means over {data['n_pairs']} contrast pairs at {curve.at} "
        f"({data['position']} of each sentence), norm {curve.direction_norm:.3g}; added at every position.",
        "",
        "```",
        curve.table(),
        "```",
        "",
        finding(data),
    ]
    cmp = data.get("steering_vectors")
    if cmp and "skipped" not in cmp:
        md += [
            "",
            f"steering-vectors {cmp['version']} on the same weights (transformers) and pairs, {cmp['position']}: "
            f"vectors differ by at most {cmp['vector_max_abs_diff']:.2e} (norm {cmp['vector_norm']:.3g}).",
            "",
            "| scale | P(target), ours | P(target), steering-vectors | max per-prompt difference |",
            "|---|---|---|---|",
            *[
                f"| {e['scale']:g} | {e['ours']:.5f} | {e['theirs']:.5f} | {e['max_abs_diff_per_prompt']:.1e} |"
                for e in cmp["effects"]
            ],
        ]
    elif cmp:
        md += ["", f"steering-vectors comparison skipped: {cmp['skipped']}"]
    md += ["", f"Time: {data['seconds']} s (load average {data['load_average']} at the start)."]
    return {"steering": "\n".join(md)}


def figures(data: dict) -> dict[str, Figure]:
    return {"steering": curve_of(data).plot(max_loss_change=data["max_loss_change"])}


@register("steering", Config, tables=tables, figures=figures)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    t0 = time.perf_counter()
    load0 = load_average()
    pairs, prompts, words = CONCEPTS[cfg.concept]
    pairs, prompts = pairs[: cfg.pairs], prompts[: cfg.prompts]
    layer = model.check_layer(cfg.layer if cfg.layer is not None else model.cfg.n_layer // 3)
    at = f"blocks.{layer}.hook_resid_post"
    targets = single_tokens(model, words)
    ids = target_token_ids(model, targets)
    direction = mean_difference(model, [p for p, _ in pairs], [n for _, n in pairs], at, cfg.position)
    texts = brown_texts()[:: max(1, 500 // cfg.unrelated)][: cfg.unrelated]
    curve = steering_curve(
        model,
        direction,
        at,
        cfg.scales,
        prompts,
        targets,
        texts,
        max_tokens=cfg.max_tokens,
        method=f"difference of means ({cfg.position})",
        generate_tokens=cfg.generate_tokens,
    )
    out: dict[str, Any] = {
        "model": model.cfg.name,
        "concept": cfg.concept,
        "layer": layer,
        "position": cfg.position,
        "n_pairs": len(pairs),
        "max_loss_change": cfg.max_loss_change,
        "curve": curve.to_dict(),
        "best": curve.best(cfg.max_loss_change),
    }
    if cfg.compare:
        out["steering_vectors"] = compare_with_steering_vectors(model, cfg, layer, pairs, prompts, ids)
    out["finding"] = finding(out)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["load_average"] = None if load0 is None else round(load0[0], 1)
    return out
