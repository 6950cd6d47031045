"""Where is AtP wrong? AtP, input-path IG and IG on each layer's own activations against exact patching.

The pairs and the metric of the ``attribution`` experiment (subject swaps the model knows, logit
difference between the two objects; by default 50 drawn, the first 50 known kept) and its exact sweep
of one hook family by position (``hook``, default ``mlp_out``). For each estimate — AtP, IG with
``ig_steps`` steps on the input-embedding path (both from :func:`~gpt2_interp.analysis.attribution.attribute`)
and ``layer_ig``: IG with ``steps`` midpoint steps on each layer's own activation, written out here with
autograd (one pass from that layer on, the steps in the batch axis) independently of
``attribute(..., ig_path="activations")`` — on the first ``ig_pairs`` pairs:

* Spearman ρ on the mean effect and per pair × cell, ρ on the ``top`` largest exact cells and on the rest;
* the mean effect's relative L1 error, and the share of that error in each third of the layers and at
  the last position;
* sign agreement on the cells larger than 5% of the largest exact cell.

Also, on all pairs: AtP's ρ and error by layer third, the exact effect's mass by layer third and the
ratio of AtP's summed effect to the exact one; the exact effect's mass in its top-20 cells and at the
last position.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from einops import rearrange, reduce

from gpt2_interp.analysis.attribution import attribute, spearman
from gpt2_interp.analysis.patching import pair_tokens
from gpt2_interp.experiments.base import ExperimentConfig, register
from gpt2_interp.experiments.runner import RunContext
from gpt2_interp.facts.pairs import FactPairs

from .attribution import exact_sweep, fact_pairs, pair_effects, pair_metric

if TYPE_CHECKING:
    from gpt2_interp.model import HookedGPT2


@dataclass
class Config(ExperimentConfig):
    hook: Literal["mlp_out", "attn_out", "resid_pre"] = field(
        default="mlp_out", metadata={"help": "the hook family, patched per layer and position"}
    )
    pairs: int = field(default=50, metadata={"help": "prompt pairs to draw (those the model knows are kept)"})
    keep: int | None = field(default=50, metadata={"help": "keep at most this many known pairs (the first drawn)"})
    ig_pairs: int | None = field(default=None, metadata={"help": "pairs the estimates are compared on (none: all)"})
    steps: int = field(default=4, metadata={"help": "midpoint steps of the per-layer activation-path IG"})
    ig_steps: int = field(default=5, metadata={"help": "steps of the input-path IG"})
    top: int = field(default=60, metadata={"help": "the largest exact cells ρ is also computed on"})

    QUICK: ClassVar[dict[str, Any]] = {"pairs": 6, "keep": 6, "steps": 2}

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("pairs", "steps", "ig_steps", "top"):
            if getattr(self, name) < 1:
                raise ValueError(f"attribution_diagnosis setting {name} must be >= 1, got {getattr(self, name)}")
        for name in ("keep", "ig_pairs"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(
                    f"attribution_diagnosis setting {name} must be >= 1 or none, got {getattr(self, name)}"
                )


def layer_ig(model: HookedGPT2, fp: FactPairs, hook: str, steps: int) -> torch.Tensor:
    """IG on each layer's own activation, by hand: for layer ℓ, the clean−corrupted difference ``d`` of
    ``blocks.ℓ.hook_<hook>`` times the gradient of the metric, averaged over ``steps`` midpoints on the
    straight path from the corrupted to the clean activation (everything upstream at the corrupted run,
    the model run from layer ℓ). Returns ``[n_pairs, n_layer, pos]``."""
    n = model.cfg.n_layer
    ct, kt, mask = pair_tokens(model, fp.clean, fp.corrupted)
    b, P = ct.shape
    names = [f"blocks.{l}.hook_{hook}" for l in range(n)]
    rp = [f"blocks.{l}.hook_resid_pre" for l in range(n)]
    with torch.no_grad():
        _, cc = model.run_with_cache(ct, attention_mask=mask, names_filter=names)
        _, kc = model.run_with_cache(kt, attention_mask=mask, names_filter=names + rp)
    a_ids, w_ids = torch.tensor(fp.answers), torch.tensor(fp.wrongs)
    alphas = (torch.arange(steps) + 0.5) / steps
    out = torch.zeros(b, n, P)
    for l in range(n):
        d = cc[names[l]] - kc[names[l]]
        leaf = rearrange(kc[names[l]][None] + alphas.view(-1, 1, 1, 1) * d[None], "s b p d -> (s b) p d")
        leaf.requires_grad_(True)
        x0 = rearrange(kc[rp[l]][None].expand(steps, -1, -1, -1), "s b p d -> (s b) p d")
        mk = None if mask is None else mask.repeat(steps, 1)

        def use_leaf(act: torch.Tensor, hook: Any, leaf: torch.Tensor = leaf) -> torch.Tensor:
            return leaf

        with torch.enable_grad(), model.hooks([(names[l], use_leaf)]):
            resid = model(x0, start_at_layer=l, stop_at_layer=n, attention_mask=mk)
            logit = model.ln_final(resid[:, -1]) @ model.W_U
            met = logit.gather(1, a_ids.repeat(steps)[:, None]) - logit.gather(1, w_ids.repeat(steps)[:, None])
            (g,) = torch.autograd.grad(met.sum(), [leaf])
        g = reduce(rearrange(g, "(s b) p d -> s b p d", s=steps), "s b p d -> b p d", "mean")
        out[:, l] = (d * g).sum(-1)
    return out


def thirds(x: torch.Tensor) -> list[float]:
    """Shares of ``x.sum()`` ([layer, ...], non-negative) in each third of the layers."""
    n = x.shape[0]
    return [float(x[i * n // 3 : (i + 1) * n // 3].sum() / x.sum()) for i in range(3)]


def estimate_row(est: torch.Tensor, exact: torch.Tensor, top: int) -> dict:
    """How one estimate's per-pair effects ``[pairs, layer, pos]`` agree with the exact ones."""
    em, exm = est.mean(0), exact.mean(0)
    order = exm.abs().flatten().argsort(descending=True)
    err = (em - exm).abs()
    big = exm.abs() > 0.05 * exm.abs().max()
    return {
        "rho_mean": spearman(em, exm),
        "rho_pairs": spearman(est, exact),
        f"rho_mean_top{top}": spearman(em.flatten()[order[:top]], exm.flatten()[order[:top]]),
        "rho_mean_rest": spearman(em.flatten()[order[top:]], exm.flatten()[order[top:]]),
        "rel_err_mean": float(err.sum() / exm.abs().sum()),
        "err_share_by_layer_third": thirds(err),
        "err_share_last_pos": float(err[:, -1].sum() / err.sum()),
        "sign_agreement_large": float((em[big].sign() == exm[big].sign()).float().mean()),
        "large_cells": int(big.sum()),
    }


def atp_on_all_pairs(atp: torch.Tensor, exact: torch.Tensor, top: int) -> dict:
    """AtP against the exact sweep over every pair: ρ, error and exact mass by layer third, summed-effect ratio."""
    em, exm = atp.mean(0), exact.mean(0)
    err = (em - exm).abs()
    order = exm.abs().flatten().argsort(descending=True)
    return {
        "rho_mean": spearman(em, exm),
        "rho_pairs": spearman(atp, exact),
        "rel_err_mean": float(err.sum() / exm.abs().sum()),
        "err_share_by_layer_third": thirds(err),
        "exact_mass_by_layer_third": thirds(exm.abs()),
        "sum_ratio": float(em.sum() / exm.sum()),
        f"rho_mean_top{top}": spearman(em.flatten()[order[:top]], exm.flatten()[order[:top]]),
        f"exact_mass_top{top}": float(exm.abs().flatten()[order[:top]].sum() / exm.abs().sum()),
    }


def tables(data: dict) -> dict[str, str]:
    est = data["estimates"]
    keys = [k for k in next(iter(est.values())) if not isinstance(next(iter(est.values()))[k], list)]
    rows = ["| estimate | " + " | ".join(keys) + " | error share by layer third |", "|---|" + "---|" * (len(keys) + 1)]
    for name, r in est.items():
        rows.append(
            f"| {name} | "
            + " | ".join(f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k]) for k in keys)
            + " | "
            + ", ".join(f"{x:.2f}" for x in r["err_share_by_layer_third"])
            + " |"
        )
    head = (
        f"Where attribution is wrong on {data['model']}, hook {data['hook']}: {data['ig_pairs']} of {data['pairs']} "
        f"known prompt pairs ({data['drawn']} drawn); layer_ig: {data['steps']} midpoint steps on each layer's "
        f"activation; ig: input path. Exact |mean effect| mass in its top-20 cells "
        f"{data['exact_mass_top20']:.3f}, at the last position {data['exact_share_last_pos']:.3f}."
    )
    return {"attribution_diagnosis": head + "\n\n" + "\n".join(rows)}


@register("attribution_diagnosis", Config, tables=tables)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    fp = fact_pairs(model, cfg.pairs, cfg.keep)
    if len(fp) == 0:
        raise ValueError(
            f"attribution_diagnosis setting pairs: the model knows none of the {cfg.pairs} drawn pairs; draw more"
        )
    exact, _, _ = exact_sweep(model, fp, cfg.hook, None, ctx)
    pe_all = pair_effects(exact)
    atp_all = pair_effects(attribute(model, fp.clean, fp.corrupted, pair_metric(fp), hook=cfg.hook, method="atp"))
    n_sub = len(fp) if cfg.ig_pairs is None else min(cfg.ig_pairs, len(fp))
    sub = fp.subset(range(n_sub))
    t0 = time.perf_counter()
    estimates = {"layer_ig": layer_ig(model, sub, cfg.hook, cfg.steps)}
    layer_ig_seconds = time.perf_counter() - t0
    for method in ("atp", "ig"):
        estimates[method] = pair_effects(
            attribute(
                model, sub.clean, sub.corrupted, pair_metric(sub), hook=cfg.hook, method=method, ig_steps=cfg.ig_steps
            )
        )
    pe = pe_all[:n_sub]
    exm = pe.mean(0)
    order = exm.abs().flatten().argsort(descending=True)
    return {
        "model": model.cfg.name,
        "hook": cfg.hook,
        "drawn": cfg.pairs,
        "pairs": len(fp),
        "ig_pairs": n_sub,
        "steps": cfg.steps,
        "ig_steps": cfg.ig_steps,
        "layer_ig_seconds": layer_ig_seconds,
        "atp_all_pairs": atp_on_all_pairs(atp_all, pe_all, cfg.top),
        "estimates": {k: estimate_row(e, pe, cfg.top) for k, e in estimates.items()},
        "exact_mass_top20": float(exm.abs().flatten()[order[:20]].sum() / exm.abs().sum()),
        "exact_share_last_pos": float(exm.abs()[:, -1].sum() / exm.abs().sum()),
        "prompt_pairs": [[c, k] for c, k in zip(fp.clean, fp.corrupted)],
    }
