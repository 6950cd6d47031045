"""What each departure from the authors' ROME, MEMIT and AlphaEdit does to an edit.

The reference is the authors' algorithm (``preset="paper"``, which equals the authors' code on the golden data,
tests/unit/test_paper_golden.py). Each row edits the same requests with the reference and one named option
flipped to the library's default for this model (where the default is the authors' value, to the other
choice), and one row with every default (no preset). ROME edits each request alone (edit, score, undo);
MEMIT edits the requests as one batch; AlphaEdit (``preserve`` = the edit layers' key statistics) solves
with the MEMIT rows' target residuals of the same δ settings, so its rows differ in the solve only.

Scores (:mod:`gpt2_interp.editing.evaluation`): efficacy ES, paraphrase PS and neighbourhood NS (CounterFact's,
as fractions), and subject specificity SS: of the edited subjects' other facts the unedited model knows, the
share it still knows after the edit (pooled over the requests).
"""

from __future__ import annotations

import functools
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from gpt2_interp.editing import memit, rome
from gpt2_interp.editing.evaluate import known_cases, known_related, related_hits
from gpt2_interp.editing.hparams import defaults_digest
from gpt2_interp.editing.stats import key_second_moment
from gpt2_interp.experiments.base import ExperimentConfig, register
from gpt2_interp.experiments.runner import RunContext

from .mass_editing import mean_scores

if TYPE_CHECKING:
    from gpt2_interp.model import HookedGPT2

METHODS = ("rome", "memit", "alphaedit")

#: The named departures of the δ optimisation and the keys (:class:`~gpt2_interp.editing.settings.RomeHparams`),
#: each flipped alone; the prefix settings go together (one generation rule).
DELTA_OPTIONS: tuple[tuple[str, ...], ...] = (
    ("key_weighting",),
    ("target_state",),
    ("exact_edit",),
    ("kl_positions",),
    ("step_count",),
    ("prefix_style", "prefix_lengths", "prefixes_per_length"),
    ("prepend_bos",),
    ("clamp_factor",),
)
#: MEMIT's and AlphaEdit's own (:class:`~gpt2_interp.editing.memit.MemitHparams`).
MEMIT_OPTIONS: tuple[tuple[str, ...], ...] = (("mom2_weight",), ("delta_norm",))
ALPHAEDIT_OPTIONS: tuple[tuple[str, ...], ...] = (
    ("nullspace_rule", "nullspace_threshold"),
    ("alpha", "alpha_scale"),
)
#: The other choice of a two-valued option, for a row where the library's default is the authors' value.
OTHER: dict[str, dict[Any, Any]] = {
    "key_weighting": {"uniform": "per_context_type", "per_context_type": "uniform"},
    "target_state": {"averaged": "bare_prompt", "bare_prompt": "averaged"},
    "exact_edit": {True: False, False: True},
    "prepend_bos": {True: False, False: True},
}


@dataclass
class Config(ExperimentConfig):
    n: int = field(default=24, metadata={"help": "requests (facts the unedited model knows); one MEMIT batch"})
    rome_n: int | None = field(default=None, metadata={"help": "of those, the requests ROME edits (none: n)"})
    methods: list[str] = field(
        default_factory=lambda: list(METHODS), metadata={"help": f"editors measured: {', '.join(METHODS)}"}
    )
    n_samples: int = field(default=100_000, metadata={"help": "tokens for the key statistics"})
    v_steps: int | None = field(
        default=None, metadata={"help": "δ optimisation steps in every row (none: each mode's own)"}
    )
    options: list[str] | None = field(
        default=None,
        metadata={"help": "measure only the departures of these options, e.g. key_weighting (none: every one)"},
    )
    from_defaults: bool = field(
        default=True,
        metadata={"help": "also flip each option the other way: the defaults with the authors' value of it"},
    )

    QUICK: ClassVar[dict[str, Any]] = {"n": 2, "rome_n": 1, "n_samples": 2000, "v_steps": 2}

    def __post_init__(self) -> None:
        super().__post_init__()
        bad = sorted(set(self.methods) - set(METHODS))
        if bad or not self.methods:
            raise ValueError(f"paper_departures: methods must be among {', '.join(METHODS)}; got {self.methods}")
        if self.n < 1 or self.n_samples < 1 or (self.rome_n is not None and not 1 <= self.rome_n <= self.n):
            raise ValueError(
                f"paper_departures: need n >= 1, 1 <= rome_n <= n and n_samples >= 1; got n={self.n}, "
                f"rome_n={self.rome_n}, n_samples={self.n_samples}"
            )
        if self.v_steps is not None and self.v_steps < 1:
            raise ValueError(f"paper_departures: v_steps must be >= 1 or none, got {self.v_steps}")


def flips(paper: Mapping[str, Any], ours: Mapping[str, Any], options: Sequence[tuple[str, ...]]) -> list[dict]:
    """Per option group, the overrides that flip it on the reference ``paper``: the library default ``ours``
    where it differs, else the other choice of a two-valued option (none for a number both agree on)."""
    out = []
    for names in options:
        if any(paper[k] != ours[k] for k in names):
            out.append({k: ours[k] for k in names})
        elif len(names) == 1 and names[0] in OTHER:
            out.append({names[0]: OTHER[names[0]][paper[names[0]]]})
    return out


def _only(groups: Sequence[tuple[str, ...]], names: Sequence[str] | None) -> list[tuple[str, ...]]:
    """The option groups naming one of ``names`` (all when None)."""
    return [g for g in groups if names is None or set(g) & set(names)]


def _describe(overrides: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={list(v) if isinstance(v, tuple) else v}" for k, v in overrides.items())


@dataclass
class _Scorer:
    """ES/PS/NS and pooled SS of ``cases`` on the model as it stands (SS: the related facts it still knows)."""

    model: HookedGPT2
    cases: list
    related: list

    def __call__(self, cases: list | None = None, related: list | None = None) -> dict[str, Any]:
        cases, related = cases or self.cases, related or self.related
        hits = related_hits(self.model, related)
        n = sum(h["ss"][1] for h in hits)
        return {**mean_scores(self.model, cases), "ss": sum(h["ss"][0] for h in hits) / n if n else None}


def _quiet(fn: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn()


def rome_row(
    model: HookedGPT2, name: str, overrides: dict, stats: Any, scorer: _Scorer, v_steps: int | None
) -> dict[str, Any]:
    """ROME on each of ``scorer``'s cases alone with ``overrides``: the scores averaged over the edits."""
    extra = {"v_steps": v_steps} if v_steps is not None else {}
    t = time.perf_counter()
    rows, label = [], ""
    for c, rel in zip(scorer.cases, scorer.related):

        def one(c: Any = c) -> Any:
            return rome.compute_edit(model, c.request, stats=stats, progress=False, **overrides, **extra)

        e = _quiet(one)
        label = e.label
        with model.edited(e):
            rows.append(scorer([c], [rel] if rel else [[]]))
    keys = ("es", "ps", "ns")
    out: dict[str, Any] = {
        k: _mean([r[k] for r in rows if r[k] is not None]) for k in keys
    }  # per-edit scores, averaged
    ss = [r["ss"] for r in rows if r["ss"] is not None]
    out["ss"] = _mean(ss)
    return {"row": name, "label": label, "n": len(rows), **out, "seconds": time.perf_counter() - t}


def _mean(xs: Sequence[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def memit_row(
    model: HookedGPT2,
    name: str,
    hp: memit.MemitHparams,
    stats: Any,
    scorer: _Scorer,
    preserve: Any = None,
    targets: Any = None,
) -> dict[str, Any]:
    """One MEMIT (AlphaEdit with ``preserve``) batch of ``scorer``'s cases with ``hp``; the target residuals
    are returned with the scores so the AlphaEdit rows can reuse them."""
    t = time.perf_counter()
    e = _quiet(
        lambda: memit.compute_edits(
            model,
            [c.request for c in scorer.cases],
            stats=stats,
            hparams=hp,
            preserve=preserve,
            targets=targets,
            progress=False,
        )
    )
    with model.edited(e):
        scores = scorer()
    return {
        "row": name,
        "label": e.label,
        "n": len(scorer.cases),
        **scores,
        "seconds": time.perf_counter() - t,
        "targets": e.targets,
    }


def _hp_key(hp: Any) -> dict:
    return hp.to_dict() if hasattr(hp, "to_dict") else dict(vars(hp))


def tables(report: dict) -> dict[str, str]:
    """``paper_departures``: per editor, the reference row, each flipped option, and the defaults."""

    def pc(x: float | None) -> str:
        return f"{100 * x:.1f}" if x is not None else "–"

    def diff(x: float | None, ref: float | None) -> str:
        return f"{100 * (x - ref):+.1f}" if x is not None and ref is not None else "–"

    lines = [
        f"# Departures from the papers, measured ({report['model']})",
        "",
        f"{report['n']} requests the unedited model knows (ROME: the first {report['rome_n']}, each edited alone; "
        f"MEMIT and AlphaEdit: one batch); key statistics {report['n_samples']} tokens; edit layers: ROME "
        f'{report["layers"]["rome"]}, MEMIT/AlphaEdit {report["layers"]["memit"]}. Reference: `preset="paper"` '
        "(the authors' algorithm); each row flips one option to the value named (the library's default, or the "
        "other choice where the default is the authors'); 'defaults' uses no preset. Δ: the row minus the "
        "reference, in points. SS: the edited subjects' other known facts still known.",
        "",
    ]
    for method in report["methods"]:
        rows = report["rows"][method]
        ref = rows[0]
        lines += [
            f"## {method}",
            "",
            "| row | ES | PS | NS | SS | ΔES | ΔPS | ΔNS | ΔSS | s |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            lines.append(
                f"| {r['row']} | {pc(r['es'])} | {pc(r['ps'])} | {pc(r['ns'])} | {pc(r['ss'])} | "
                + " | ".join(diff(r[k], ref[k]) for k in ("es", "ps", "ns", "ss"))
                + f" | {r['seconds']:.0f} |"
            )
        lines.append("")
    return {"paper_departures": "\n".join(lines)}


@register("paper_departures", Config, tables=tables, cache_depends=defaults_digest)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    """The reference, each option flipped, and the defaults, for each editor in ``cfg.methods``."""
    cases = known_cases(model, cfg.n, cfg.seed)
    related = known_related(model, cases, cfg.seed)
    scorer = _Scorer(model, cases, related)
    rome_n = cfg.rome_n or len(cases)
    steps: dict[str, Any] = {"v_steps": cfg.v_steps} if cfg.v_steps is not None else {}
    rome_layer = rome.default_layer(model)
    mem_layers = memit.default_layers(model)
    report: dict[str, Any] = {
        "model": model.cfg.name,
        "n": len(cases),
        "rome_n": rome_n,
        "n_samples": cfg.n_samples,
        "methods": cfg.methods,
        "layers": {"rome": [rome_layer], "memit": mem_layers},
        "requests": [c.request.text + " →" + c.request.target for c in cases],
        "rows": {},
    }
    stats = key_second_moment(model, sorted({rome_layer, *mem_layers}), n_samples=cfg.n_samples, progress=False)
    depends = {"requests": report["requests"], "n_samples": cfg.n_samples}

    if "rome" in cfg.methods:
        paper = rome.hparams_for(model, preset="paper").__dict__
        ours = rome.hparams_for(model).__dict__
        opts = _only(DELTA_OPTIONS, cfg.options)
        variants = [("reference (paper)", {"preset": "paper"})]
        variants += [(_describe(f), {"preset": "paper", **f}) for f in flips(paper, ours, opts)]
        variants.append(("defaults (no preset)", {}))
        if cfg.from_defaults:
            variants += [(f"defaults, {_describe(f)}", f) for f in flips(ours, paper, opts)]
        sub = _Scorer(model, cases[:rome_n], related[:rome_n])
        report["rows"]["rome"] = [
            ctx.cached(
                "rome",
                functools.partial(rome_row, model, name, ov, stats[rome_layer], sub, cfg.v_steps),
                depends={**depends, "rome_n": rome_n, "hp": _hp_key(rome.hparams_for(model, **ov, **steps))},
            )
            for name, ov in variants
        ]
        for (name, _), r in zip(variants, report["rows"]["rome"]):  # a row cached under another name
            r["row"] = name

    if {"memit", "alphaedit"} & set(cfg.methods):
        paper_hp = memit.MemitHparams.of(model, preset="paper", **steps)
        ours_hp = memit.MemitHparams.of(model, **steps)
        d_opts, m_opts = _only(DELTA_OPTIONS, cfg.options), _only(MEMIT_OPTIONS, cfg.options)
        delta_flips = flips(paper_hp.rome.__dict__, ours_hp.rome.__dict__, d_opts)
        memit_flips = flips(paper_hp.to_dict(), ours_hp.to_dict(), m_opts)
        variants = [("reference (paper)", {"preset": "paper", **steps})]
        variants += [(_describe(f), {"preset": "paper", **steps, **f}) for f in delta_flips + memit_flips]
        variants.append(("defaults (no preset)", dict(steps)))
        if cfg.from_defaults:
            back = flips(ours_hp.rome.__dict__, paper_hp.rome.__dict__, d_opts)
            back += flips(ours_hp.to_dict(), paper_hp.to_dict(), m_opts)
            variants += [(f"defaults, {_describe(f)}", {**steps, **f}) for f in back]
        memit_rows = [
            ctx.cached(
                "memit",
                functools.partial(memit_row, model, name, memit.MemitHparams.of(model, **ov), stats, scorer),
                depends={**depends, "hp": memit.MemitHparams.of(model, **ov).to_dict()},
            )
            for name, ov in variants
        ]
        for (name, _), r in zip(variants, memit_rows):  # a row cached under another name has the same settings
            r["row"] = name
        if "memit" in cfg.methods:
            report["rows"]["memit"] = [{k: v for k, v in r.items() if k != "targets"} for r in memit_rows]
        if "alphaedit" in cfg.methods:
            paper_d, ours_d = paper_hp.to_dict(), ours_hp.to_dict()
            a_opts = _only(ALPHAEDIT_OPTIONS, cfg.options)
            defaults_row = [name for name, _ in variants].index("defaults (no preset)")
            a_variants = [("reference (paper)", {"preset": "paper", **steps}, 0)]
            a_variants += [(_describe(f), {"preset": "paper", **steps, **f}, 0) for f in flips(paper_d, ours_d, a_opts)]
            a_variants.append(("defaults (no preset)", dict(steps), defaults_row))
            if cfg.from_defaults:
                a_variants += [
                    (f"defaults, {_describe(f)}", {**steps, **f}, defaults_row) for f in flips(ours_d, paper_d, a_opts)
                ]
            rows = []
            for name, ov, from_row in a_variants:
                hp = memit.MemitHparams.of(model, **ov)
                ns = memit.NullSpace.from_stats(
                    {l: stats[l] for l in mem_layers}, hp.nullspace_threshold, hp.nullspace_rule
                )
                row = ctx.cached(
                    "alphaedit",
                    functools.partial(
                        memit_row, model, name, hp, stats, scorer, preserve=ns, targets=memit_rows[from_row]["targets"]
                    ),
                    depends={**depends, "hp": hp.to_dict(), "targets_of": variants[from_row][0]},
                )
                rows.append({k: v for k, v in row.items() if k != "targets"} | {"row": name, "null_dim": ns.null_dim})
            report["rows"]["alphaedit"] = rows
    return report
