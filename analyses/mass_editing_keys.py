"""Why batched edits miss on gpt2-facts: requests that share a key.

MEMIT writes each request's new value at one key: the edit layer's MLP input at the subject's last
token. In gpt2-facts the facts are edited at layer 0, where that key is made mostly by the last token
itself, so two requests whose subjects end in the same token (or name the same subject under two
relations) ask for two values at nearly the same key — a least-squares update cannot give both.

This experiment counts those collisions in the fact base and edits two request sets of the same size
in one MEMIT batch each: ``n`` known requests as drawn (with their collisions), and ``n`` known
requests whose subjects all end in different tokens. If collisions were the whole story, the second
set would reach ROME-like efficacy.
"""

from __future__ import annotations

import collections
import functools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from gpt2_interp.editing.evaluate import known_cases
from gpt2_interp.editing.hparams import defaults_digest
from gpt2_interp.editing.memit import compute_edits, default_layers
from gpt2_interp.editing.stats import key_second_moment
from gpt2_interp.experiments.base import register
from gpt2_interp.experiments.runner import RunContext
from gpt2_interp.facts.base import FactBase

from .mass_editing import QUICK_DELTA, DeltaConfig, mean_scores

if TYPE_CHECKING:
    from gpt2_interp.model import HookedGPT2


@dataclass
class Config(DeltaConfig):
    n: int = field(default=200, metadata={"help": "requests in each of the two batches"})
    lam: float = field(default=100.0, metadata={"help": "MEMIT's λ (mom2_weight)"})
    pool: int = field(default=1200, metadata={"help": "known requests to draw the two sets from"})
    n_samples: int = field(default=100_000, metadata={"help": "tokens for the key statistics"})

    QUICK: ClassVar[dict[str, Any]] = {"n": 3, "pool": 40, "n_samples": 3000, **QUICK_DELTA}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.n < 1 or self.pool < self.n or self.n_samples < 1 or self.lam < 0:
            raise ValueError(
                f"mass_editing_keys: need n >= 1, pool >= n, n_samples >= 1 and lam >= 0; got n={self.n}, "
                f"pool={self.pool}, n_samples={self.n_samples}, lam={self.lam}"
            )


def key_token(model: HookedGPT2, case: Any) -> int:
    """The subject's last token as it stands in the rewrite prompt (the position the edit writes to)."""
    return int(model.to_tokens(case.request.prompt.split("{}")[0] + case.request.subject, prepend_bos=False)[0, -1])


def distinct_keys(model: HookedGPT2, pool: list) -> list:
    """The requests of ``pool`` whose key token no earlier request has, in order."""
    seen, out = set(), []
    for c in pool:
        t = key_token(model, c)
        if t not in seen:
            seen.add(t)
            out.append(c)
    return out


def fact_base_counts(model: HookedGPT2) -> dict[str, int]:
    """Facts, subjects and distinct final tokens of the subjects (``" " + subject``) in the fact base."""
    fb = FactBase.load()
    subjects = {f.subject for r in fb.relations for f in fb.facts(r)}
    return {
        "facts": sum(len(fb.facts(r)) for r in fb.relations),
        "subjects": len(subjects),
        "subject_final_tokens": len({int(model.to_tokens(" " + s, prepend_bos=False)[0, -1]) for s in subjects}),
    }


def batch_row(model: HookedGPT2, name: str, cases: list, stats: dict, cfg: Config) -> dict[str, Any]:
    """One MEMIT batch of ``cases``: how many share a key token, ES/PS/NS, seconds."""
    counts = collections.Counter(key_token(model, c) for c in cases)
    t = time.perf_counter()
    edit = compute_edits(
        model,
        [c.request for c in cases],
        stats=stats,
        hparams={"mom2_weight": cfg.lam, **cfg.delta_overrides()},
        progress=False,
    )
    with model.edited(edit):
        scores = mean_scores(model, cases, 64)
    return {
        "set": name,
        "n": len(cases),
        "requests_sharing_a_key": sum(v for v in counts.values() if v > 1),
        **scores,
        "seconds": time.perf_counter() - t,
    }


def tables(report: dict) -> dict[str, str]:
    """``mass_editing_keys``: the two batches side by side."""

    def pc(x):
        return f"{100 * x:.1f}" if x is not None else "–"

    fbk, kp = report["fact_base"], report["known_pool"]
    lines = [
        f"# Shared keys in batched editing ({report['model']}, layer(s) {report['layers']}, λ = {report['lambda']:g})",
        "",
        f"The fact base has {fbk['facts']} facts about {fbk['subjects']} subjects, whose names end in "
        f"{fbk['subject_final_tokens']} distinct tokens; the first {kp['n']} known requests name "
        f"{kp['subjects']} subjects and {kp['key_tokens']} distinct key tokens. A 1,000-request set therefore "
        "cannot avoid requests that share a key.",
        "",
        "| request set | n | requests sharing a key | ES | PS | NS |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['set']} | {r['n']} | {r['requests_sharing_a_key']} | {pc(r['es'])} | {pc(r['ps'])} | {pc(r['ns'])} |"
        for r in report["runs"]
    ]
    return {"mass_editing_keys": "\n".join(lines)}


@register("mass_editing_keys", Config, tables=tables, cache_depends=defaults_digest)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    """Collision counts, then one MEMIT batch as drawn and one with all-distinct key tokens."""
    pool = known_cases(model, cfg.pool, cfg.seed)
    distinct = distinct_keys(model, pool)
    report: dict[str, Any] = {
        "model": model.cfg.name,
        "lambda": cfg.lam,
        "layers": default_layers(model),
        "fact_base": fact_base_counts(model),
        "known_pool": {"n": len(pool), "subjects": len({c.request.subject for c in pool}), "key_tokens": len(distinct)},
        "runs": [],
    }
    stats = key_second_moment(model, report["layers"], n_samples=cfg.n_samples, progress=False)
    for name, cases in (("as drawn", pool[: cfg.n]), ("distinct key tokens", distinct[: cfg.n])):
        report["runs"].append(
            ctx.cached(
                f"batch-{name.replace(' ', '-')}",
                functools.partial(batch_row, model, name, cases, stats, cfg),
            )
        )
    return report
