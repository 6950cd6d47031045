"""Mass editing: ROME, MEMIT and AlphaEdit on the same requests the model knows.

The run is made of named parts (``PARTS``), in this order:

1. ``stats``: key statistics for the edit layers in one pass (timed without and with the disk cache),
   the null space's dimensions and the share of eigenvalues below τ·λ_max.
2. ``tuning``: on ``tune_n`` OTHER requests (none shares a subject and relation with the evaluation
   set), in one batch, MEMIT's λ (``mom2_weight``) and AlphaEdit's null-space rule × threshold τ ×
   ridge α. The batch's targets come from ONE δ optimisation (they depend on none of λ, τ, α, nor do
   the keys with one edit layer) and each setting re-solves the update exactly; the chosen value is
   :func:`choose_setting`'s (best ES + PS with NS within 5 points of the unedited model, else best S).
3. ``batch_memit_edit``: one MEMIT edit of all ``n`` requests, undone (bit-exact check), saved,
   reloaded into a fresh model and re-scored (identical scores check).
4. ``memit_batch``, ``alphaedit_batch``: one batch of all requests — ES/PS/NS, subject specificity
   (SS), shared-token neighbours (STN), fluency, drift, time; the two share one δ optimisation.
5. ``alphaedit_sequential``, ``memit_sequential``: batches of ``batch_size``, the decay curve after
   every batch and the drift after every step; ``rome_sequential``: one request at a time, as many as
   the time budget ``rome_seconds`` allows, scored on the edits made.

``only=PART,…`` reruns some parts and merges them into the earlier result in the same folder
(``ctx.previous``): the other parts and the tuning's choice are kept. Every MEMIT/AlphaEdit part
records the settings it ran with (``part_settings``); the table marks (†) rows whose settings differ
from the current ones. Finished parts are kept on disk (``ctx.cached``), so an interrupted run resumes.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from gpt2_interp.editing.edit import Edit, TargetResiduals, undo_all
from gpt2_interp.editing.evaluate import case_scores, choose_setting, evaluate_edits, known_cases
from gpt2_interp.editing.hparams import defaults_digest
from gpt2_interp.editing.memit import NULLSPACE_RULES, MemitHparams, NullSpace, compute_edits, default_layers
from gpt2_interp.editing.stats import key_second_moment
from gpt2_interp.experiments.base import ExperimentConfig, register
from gpt2_interp.experiments.runner import RunContext
from gpt2_interp.model.fingerprint import weights_fingerprint
from gpt2_interp.model.loading import load
from gpt2_interp.plots.editing import plot_decay

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from gpt2_interp.model import HookedGPT2

PARTS = (
    "stats",
    "tuning",
    "batch_memit_edit",
    "memit_batch",
    "alphaedit_batch",
    "alphaedit_sequential",
    "memit_sequential",
    "rome_sequential",
)
MEMIT_PARTS = PARTS[1:-1]  # the parts that edit with MEMIT/AlphaEdit settings (recorded per part)


@dataclass
class DeltaConfig(ExperimentConfig):
    """Overrides of the δ optimisation (none: the model's own settings)."""

    v_steps: int | None = field(default=None, metadata={"help": "δ optimisation steps (none: the model's)"})
    prefix_lengths: list[int] | None = field(
        default=None, metadata={"help": "token lengths of the generated context prefixes (none: the model's)"}
    )
    prefixes_per_length: int | None = field(
        default=None, metadata={"help": "generated context prefixes of each length (none: the model's)"}
    )

    def delta_overrides(self) -> dict[str, Any]:
        """The δ settings given, as editor hyperparameter overrides."""
        out: dict[str, Any] = {}
        if self.v_steps is not None:
            out["v_steps"] = self.v_steps
        if self.prefix_lengths is not None:
            out["prefix_lengths"] = tuple(self.prefix_lengths)
        if self.prefixes_per_length is not None:
            out["prefixes_per_length"] = self.prefixes_per_length
        return out


QUICK_DELTA = {"v_steps": 3, "prefix_lengths": [3], "prefixes_per_length": 1}


@dataclass
class Config(DeltaConfig):
    n: int = field(default=1000, metadata={"help": "requests (facts the unedited model knows)"})
    batch_size: int = field(default=100, metadata={"help": "requests per sequential batch"})
    tune_n: int = field(default=200, metadata={"help": "tuning requests (0: the model's defaults)"})
    lambdas: list[float] = field(
        default_factory=lambda: [3.0, 10.0, 30.0, 100.0, 300.0, 1000.0],
        metadata={"help": "MEMIT λ values tuned (empty: keep the earlier rows)"},
    )
    thresholds: list[float] = field(
        default_factory=lambda: [1e-4, 1e-3, 1e-2], metadata={"help": "AlphaEdit null-space thresholds τ tuned"}
    )
    null_rules: list[str] = field(
        default_factory=lambda: ["relative"],
        metadata={
            "help": "AlphaEdit null-space rules tuned with the thresholds: relative (λ ≤ τ·λ_max) and/or energy (the "
            "smallest directions holding ≤ τ of tr C₀); tuning rows of other rules/thresholds are kept"
        },
    )
    alphas: list[float] | None = field(
        default=None,
        metadata={"help": "AlphaEdit ridge values (× tr(C)/d_mlp) tuned with the thresholds (none: the model's)"},
    )
    rome_seconds: float = field(
        default=240.0,
        metadata={"help": "time limit of the ROME sequential run: it stops after the edit that passes it"},
    )
    rome_n: int | None = field(default=None, metadata={"help": "requests for the ROME sequential run (none: n)"})
    deadline: float | None = field(
        default=None,
        metadata={"help": "seconds for the whole run: the ROME run gets at most what is left minus a minute"},
    )
    only: list[str] | None = field(
        default=None,
        metadata={"help": f"parts to (re)run, merged into the earlier result in the same folder: {', '.join(PARTS)}"},
    )
    n_samples: int = field(default=100_000, metadata={"help": "tokens for the key statistics"})
    fluency_tokens: int = field(default=40, metadata={"help": "generated tokens per fluency prompt"})
    generation_tokens: int = field(
        default=10,
        metadata={
            "help": "greedy tokens per prompt for the generation-based scores and the two-hop questions through "
            "the edits (0: not scored)"
        },
    )

    NOT_IN_CACHE_KEY: ClassVar[tuple[str, ...]] = ("only",)  # each part's key holds the settings it ran with
    QUICK: ClassVar[dict[str, Any]] = {
        "n": 4,
        "batch_size": 2,
        "tune_n": 4,
        "n_samples": 3000,
        "fluency_tokens": 8,
        "generation_tokens": 4,
        "lambdas": [100.0],
        "thresholds": [1e-3],
        "rome_seconds": 1.0,
        **QUICK_DELTA,
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("n", "batch_size", "n_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"mass_editing.{name} must be >= 1, got {getattr(self, name)}")
        if self.tune_n < 0:
            raise ValueError(f"mass_editing setting tune_n must be >= 0, got {self.tune_n}")
        bad = sorted(set(self.only or ()) - set(PARTS))
        if bad or self.only == []:
            raise ValueError(
                f"mass_editing setting only: unknown part(s) {bad or '(none given)'}; choose from {', '.join(PARTS)}"
            )
        bad = sorted(set(self.null_rules) - set(NULLSPACE_RULES))
        if bad:
            raise ValueError(
                f"mass_editing setting null_rules: unknown rule(s) {bad}; choose from {', '.join(NULLSPACE_RULES)}"
            )


# ---------------------------------------------------------------- shared with the other editing experiments
def mean_scores(model: HookedGPT2, cases: Sequence[Any], batch_size: int = 64) -> dict[str, float | None]:
    """Mean efficacy (ES), paraphrase (PS) and neighbourhood (NS) scores of ``cases`` on ``model`` as it
    stands (:func:`~gpt2_interp.editing.evaluate.case_scores`); None where no case defines one."""
    rows = case_scores(model, cases, batch_size)

    def mean(key: str) -> float | None:
        xs = [getattr(r, key) for r in rows if getattr(r, key) is not None]
        return sum(xs) / len(xs) if xs else None

    return {"es": mean("es"), "ps": mean("ps"), "ns": mean("ns")}


def edit_settings(model: HookedGPT2, hp: Mapping[str, Any]) -> dict[str, Any]:
    """What a MEMIT/AlphaEdit row depends on besides the requests: edit layers, the δ optimisation's
    context variants (the bare prompt + generated prefixes), δ's scale and λ/τ/α — recorded per part so
    that a table merged from runs under different settings says which row used which."""
    h = MemitHparams.of(model, **hp)
    return {
        "layers": list(h.layers) if h.layers is not None else default_layers(model),
        "prefix_lengths": list(h.rome.prefix_lengths),
        "prefixes_per_length": h.rome.prefixes_per_length,
        "delta_norm": h.delta_norm,
        "mom2_weight": h.mom2_weight,
        "nullspace_threshold": h.nullspace_threshold,
        "nullspace_rule": h.nullspace_rule,
        "alpha": h.alpha,
        "alpha_scale": h.alpha_scale,
        "key_weighting": h.rome.key_weighting,
    }


def _digest(value: Any) -> str:
    """A short digest of a JSON-able value (part cache keys that depend on the chosen settings)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:12]


# ---------------------------------------------------------------- the run, part by part
@dataclass
class MassEditing:
    """One run's state: the requests, the statistics, the chosen settings and the report (the data)."""

    model: HookedGPT2
    cfg: Config
    ctx: RunContext
    report: dict[str, Any]
    only: set[str]
    cases: list[Any] = field(default_factory=list)
    layers: list[int] = field(default_factory=list)
    stats: dict[int, Any] = field(default_factory=dict)
    chosen: dict[str, Any] = field(default_factory=dict)
    delta: dict[str, Any] = field(default_factory=dict)
    batch_targets: dict[str, TargetResiduals] = field(default_factory=dict)
    t0: float = field(default_factory=time.perf_counter)
    base_fp: str = ""

    @property
    def sb(self) -> int:
        """Scoring batch size: large on an accelerator, small on a CPU."""
        return 512 if self.model.device.type != "cpu" else 64

    @property
    def hp(self) -> dict[str, Any]:
        """The editor settings of the MEMIT/AlphaEdit parts: the chosen λ/τ/α and the δ overrides."""
        return {**self.chosen, **self.delta}

    @classmethod
    def start(cls, model: HookedGPT2, cfg: Config, ctx: RunContext) -> MassEditing:
        """A fresh report, or the earlier one (``only``) checked to be for the same requests."""
        only = set(PARTS) if cfg.only is None else set(cfg.only)
        name = model.cfg.name
        report: dict[str, Any] = {
            "model": name,
            "device": str(model.device),
            "n": cfg.n,
            "batch_size": cfg.batch_size,
            "torch_threads": torch.get_num_threads(),
            "errors": {},
        }
        if cfg.only is not None:
            report = earlier_report(ctx, name, cfg)
            for part in only:
                report["errors"].pop(part, None)
        job = cls(model, cfg, ctx, report, only, delta=cfg.delta_overrides())
        job.base_fp = weights_fingerprint(model)
        job.cases = known_cases(model, cfg.n, cfg.seed)
        job.layers = default_layers(model)
        report["n_known_cases"], report["layers"] = len(job.cases), job.layers
        return job

    def part(
        self, name: str, compute: Callable[[], dict], apply: Callable[[dict], None] | None = None, key: Any = None
    ) -> None:
        """Run part ``name`` if asked (its result kept on disk under ``key``), apply it to the report
        (default: merge its keys, ``evaluations`` entry by entry), record its time, settings or error."""
        if name not in self.only:
            return

        def timed() -> dict:
            t = time.perf_counter()
            data = compute()
            where = f"{self.model.device}, {torch.get_num_threads()} thread(s)"
            return {"data": data, "seconds": time.perf_counter() - t, "device": where}

        try:
            got = self.ctx.cached(f"part-{name}" + (f"-{_digest(key)}" if key is not None else ""), timed)
            (apply or self.merge)(got["data"])
            if name in MEMIT_PARTS:  # the settings it ran with (a failed part keeps its earlier row and settings)
                self.report.setdefault("part_settings", {})[name] = edit_settings(self.model, self.hp)
            self.report.setdefault("part_seconds", {})[name] = got["seconds"]
            if self.cfg.only is not None:  # where each merged part was computed (a cached part: where it was)
                self.report.setdefault("part_devices", {})[name] = got.get("device", "not recorded")
        except Exception as e:  # keep what the other parts measured
            self.report["errors"][name] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
            undo_all(self.model)
        print(f"[{name}] done", file=sys.stderr, flush=True)

    def merge(self, fragment: dict) -> None:
        """Put a part's keys into the report (evaluations one by one)."""
        for k, v in fragment.items():
            if k == "evaluations":
                self.report.setdefault(k, {}).update(v)
            else:
                self.report[k] = v

    # -- stats
    def stats_part(self) -> dict:
        """Key statistics, computed (timed) and from the cache (timed), projection and spectrum."""
        model, layers, n = self.model, self.layers, self.cfg.n_samples
        t = time.perf_counter()
        fresh = key_second_moment(model, layers, n_samples=n, cache_dir=False, recompute=True, progress=False)
        t_fresh = time.perf_counter() - t
        self.stats.update(key_second_moment(model, layers, n_samples=n, progress=False))
        t = time.perf_counter()
        key_second_moment(model, layers, n_samples=n, progress=False)
        out = {
            "layers": layers,
            "count": fresh[layers[0]].count,
            "seconds_computed": t_fresh,
            "seconds_cached": time.perf_counter() - t,
            "corpus": fresh[layers[0]].key["corpus"],
        }
        t = time.perf_counter()
        own = MemitHparams.of(model)
        ns = NullSpace.from_stats({l: self.stats[l] for l in layers}, own.nullspace_threshold, own.nullspace_rule)
        out["projection_seconds"] = time.perf_counter() - t
        out["null_dim"] = ns.null_dim
        ev = torch.linalg.eigvalsh(self.stats[layers[0]].C.double())
        out["eig_fraction_below"] = {str(x): float((ev <= x * ev[-1]).float().mean()) for x in (1e-5, 1e-4, 1e-3, 1e-2)}
        return {"stats": out}

    def ensure_stats(self) -> None:
        """The edit layers' statistics (from the disk cache when the stats part did not run)."""
        if not self.stats:
            self.stats.update(key_second_moment(self.model, self.layers, n_samples=self.cfg.n_samples, progress=False))

    def choose_defaults(self) -> None:
        """The model's λ/τ/α, or (``only``) the earlier tuning's choice."""
        d = MemitHparams.of(self.model)
        self.chosen = {
            "mom2_weight": d.mom2_weight,
            "nullspace_threshold": d.nullspace_threshold,
            "nullspace_rule": d.nullspace_rule,
            "alpha": d.alpha,
            "alpha_scale": d.alpha_scale,
        }
        if self.cfg.only is not None:  # earlier rows may have run with older settings: marked †
            self.chosen.update(self.report.get("tuning", {}).get("chosen") or self.report.get("chosen", {}))

    # -- tuning
    def tuning_part(self) -> dict:
        """Score every λ and every rule × τ × α on the tuning batch from one δ optimisation."""
        model, cfg = self.model, self.cfg
        exclude = {(c.relation, c.request.subject) for c in self.cases}
        tune = known_cases(model, cfg.tune_n, cfg.seed + 1, exclude)
        ns_pre = mean_scores(model, tune, self.sb)["ns"] or 1.0
        # the grid's ridges are × tr(C)/d_mlp; without a grid, the model's own ridge and its scale
        alphas = list(cfg.alphas) if cfg.alphas else [self.chosen["alpha"]]
        scale = "trace" if cfg.alphas else self.chosen.get("alpha_scale", "trace")
        reqs = [c.request for c in tune]
        t = time.perf_counter()
        # one δ optimisation: the target residuals do not depend on λ, τ or α, so each setting re-solves
        # the update from them (compute_edits(targets=…)), exactly
        z = compute_edits(model, reqs, stats=self.stats, hparams=self.delta).targets
        targets_seconds = time.perf_counter() - t
        lam_rows = [{"mom2_weight": lam, **self.tuning_score(tune, z, {"mom2_weight": lam})[0]} for lam in cfg.lambdas]
        tau_rows = []
        for rule in cfg.null_rules:
            for tau in cfg.thresholds:
                ns = NullSpace.from_stats({l: self.stats[l] for l in self.layers}, tau, rule)
                for alpha in alphas:
                    row, keys = self.tuning_score(
                        tune,
                        z,
                        {"nullspace_threshold": tau, "nullspace_rule": rule, "alpha": alpha, "alpha_scale": scale},
                        preserve=ns,
                    )
                    energy = ns.key_energy(keys)  # the edit keys' energy in the null space, averaged over the layers
                    tau_rows.append(
                        {
                            "nullspace_threshold": tau,
                            "nullspace_rule": rule,
                            "alpha": alpha,
                            "alpha_scale": scale,
                            "null_dim": ns.null_dim,
                            "leak": ns.leak,
                            "key_energy_in_null_space": sum(energy.values()) / len(energy),
                            **row,
                        }
                    )
        return {
            "n": len(tune),
            "ns_unedited": ns_pre,
            "targets_seconds": targets_seconds,
            "mom2_weight": lam_rows,
            "nullspace_threshold": tau_rows,
        }

    def tuning_score(
        self, tune: list, z: TargetResiduals, setting: dict, preserve: NullSpace | None = None
    ) -> tuple[dict, dict]:
        """ES/PS/NS, mean fit error and ‖ΔW‖ of one setting re-solved from the targets ``z``; and the keys."""
        e = compute_edits(
            self.model,
            [c.request for c in tune],
            stats=self.stats,
            hparams={**self.delta, **setting},
            preserve=preserve,
            remember=False,
            targets=z,
        )
        with self.model.edited(e):
            got = mean_scores(self.model, tune, self.sb)
        fit = e.metrics["fit"]
        return {
            **got,
            "fit_error": sum(f["fit_error"] for f in fit.values()) / len(fit),
            "dW_norm": sum(f["dW_norm"] ** 2 for f in fit.values()) ** 0.5,
        }, e.keys

    def apply_tuning(self, t: dict) -> None:
        """Merge the tuning rows with the earlier run's rows of other rules/thresholds/ridges (same requests
        and targets) and choose λ and (rule, τ, α)."""
        old = self.report.get("tuning", {}) if self.same_delta_settings("tuning") else {}
        lam_rows, tau_rows = t["mom2_weight"], t["nullspace_threshold"]
        if tau_rows:

            def ident(r):
                return (r.get("nullspace_rule", "relative"), r["nullspace_threshold"], r.get("alpha"))

            new = {ident(r) for r in tau_rows}
            tau_rows = [r for r in old.get("nullspace_threshold", []) if ident(r) not in new] + tau_rows
        if lam_rows:
            self.chosen["mom2_weight"] = choose_setting(lam_rows, t["ns_unedited"])["mom2_weight"]
        if tau_rows:
            best = choose_setting(tau_rows, t["ns_unedited"])
            self.chosen.update(
                nullspace_threshold=best["nullspace_threshold"],
                alpha=best["alpha"],
                nullspace_rule=best.get("nullspace_rule", "relative"),
            )
        self.report["tuning_targets_seconds"] = t["targets_seconds"]
        self.report["tuning"] = {
            "n": t["n"],
            "ns_unedited": t["ns_unedited"],
            "method": "one δ optimisation, update re-solved",
            "mom2_weight": lam_rows or old.get("mom2_weight", []),
            "nullspace_threshold": tau_rows or old.get("nullspace_threshold", []),
            "chosen": dict(self.chosen),
        }

    def same_delta_settings(self, part: str) -> bool:
        """Whether the earlier run's ``part`` computed its targets as this run does (edit layers, context
        variants, δ's scale, key weighting): only then are its rows comparable with this run's."""
        tuned = ("mom2_weight", "nullspace_threshold", "nullspace_rule", "alpha", "alpha_scale")
        before = self.report.get("part_settings", {}).get(part)
        now = edit_settings(self.model, self.hp)
        return before is not None and all(before.get(k) == v for k, v in now.items() if k not in tuned)

    # -- one batch
    def batch_edit_part(self) -> dict:
        """One MEMIT edit of all requests: time, scores, bit-exact undo, save → reload → identical scores."""
        model, hp = self.model, self.hp
        t = time.perf_counter()
        edit = compute_edits(model, [c.request for c in self.cases], stats=self.stats, hparams=hp)
        t_edit = time.perf_counter() - t
        self.batch_targets["z"] = self.ctx.cached(f"batch-targets-{_digest(hp)}", lambda: edit.targets)
        edit.apply(model)
        scores_a = mean_scores(model, self.cases, self.sb)
        edit.undo(model)
        bit_exact = weights_fingerprint(model) == self.base_fp
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "batch.edit"
            edit.save(path)
            fresh = load(model.cfg.name, device=str(model.device))
            with fresh.edited(Edit.load(path, fresh)):
                scores_b = mean_scores(fresh, self.cases, self.sb)
            size = path.stat().st_size
        return {
            "batch_memit_edit": {
                "seconds": t_edit,
                "metrics": edit.metrics,
                "scores": scores_a,
                "undo_bit_exact": bit_exact,
                "reloaded_scores": scores_b,
                "reload_reproduces": scores_a == scores_b,
                "file_mb": size / 2**20,
            }
        }

    def shared_targets(self) -> TargetResiduals:
        """The batch's target residuals (one δ optimisation), shared by MEMIT's and AlphaEdit's batch edits."""
        if "z" not in self.batch_targets:
            self.batch_targets["z"] = self.ctx.cached(
                f"batch-targets-{_digest(self.hp)}",
                lambda: (
                    compute_edits(
                        self.model, [c.request for c in self.cases], stats=self.stats, hparams=self.hp
                    ).targets
                ),
            )
        return self.batch_targets["z"]

    # -- the evaluations
    def evaluate(self, name: str, **kw: Any) -> None:
        """Part ``name``: :func:`evaluate_edits` with MEMIT/AlphaEdit (the chosen settings) or ROME (its own)."""
        common = dict(
            stats=self.stats,
            fluency_tokens=self.cfg.fluency_tokens,
            generation_tokens=self.cfg.generation_tokens,
            progress=False,
            score_batch_size=self.sb,
            **self.hp,
        )
        if kw.get("method") != "rome" and not kw.get("sequential") and name in self.only:
            self.report["batch_targets_shared"] = True

        def compute() -> dict:
            if kw.get("method") != "rome":
                shared: dict[str, Any] = {} if kw.get("sequential") else {"targets": self.shared_targets()}
                ev = evaluate_edits(self.model, self.cases, **common, **shared, **kw)
            else:  # ROME's own hyperparameters (MODEL_HPARAMS), its layer's statistics
                rome_kw = {k: v for k, v in common.items() if k not in ("stats", *self.chosen)}
                n_rome = kw["n_rome"]
                ev = evaluate_edits(
                    self.model, self.cases[:n_rome], **rome_kw, **{k: v for k, v in kw.items() if k != "n_rome"}
                )
            out: dict[str, Any] = {
                "evaluations": {
                    name: {
                        "method": ev.method,
                        "sequential": ev.sequential,
                        "batch_size": ev.batch_size,
                        "layer": ev.layer,
                        "summary": ev.summary,
                        "curve": ev.curve,
                        "steps": ev.steps,
                        "seconds": ev.seconds,
                        "restored_exactly": ev.restored_exactly,
                    }
                }
            }
            if kw.get("method") == "rome":
                out["rome_time_limit_seconds"] = kw["time_limit"]
            return out

        self.part(name, compute, key=None if kw.get("method") == "rome" else self.hp)

    def rome(self) -> None:
        """ROME: one request at a time, edits accumulating, until ``rome_n`` requests or the time limit."""
        cfg = self.cfg
        budget = cfg.rome_seconds
        if cfg.deadline:
            budget = min(budget, cfg.deadline - (time.perf_counter() - self.t0) - 60)
        n_rome = min(len(self.cases), cfg.rome_n or len(self.cases))
        marks = sorted({*range(cfg.batch_size, n_rome + 1, cfg.batch_size), 1, 10, n_rome})
        if "rome_sequential" in self.only:
            self.report["rome_requested"] = n_rome
        self.evaluate(
            "rome_sequential", method="rome", sequential=True, checkpoints=marks, n_rome=n_rome, time_limit=budget
        )


def earlier_report(ctx: RunContext, model_name: str, cfg: Config) -> dict:
    """The earlier result's data to merge parts into; it must be for the same model, ``n`` and ``batch_size``."""
    previous = ctx.previous_matching("only", {"model": model_name, "n": cfg.n, "batch_size": cfg.batch_size})
    if previous is None:
        raise ValueError(
            f"mass_editing setting only={','.join(cfg.only or [])}: no earlier result in this folder to merge "
            "into; run all parts first (without only=), with the same --out and --tag"
        )
    report = json.loads(json.dumps(previous))
    report.setdefault("errors", {})
    return report


# ---------------------------------------------------------------- tables and figure
def figures(report: dict) -> dict[str, Figure]:
    """``mass_editing_decay``: the sequential runs' scores after every batch."""
    evals = report.get("evaluations", {})
    seq = {
        k: evals[k]
        for k in ("rome_sequential", "memit_sequential", "alphaedit_sequential")
        if k in evals and evals[k].get("curve")
    }
    if not seq:
        return {}
    older = _older(report)
    names = {k: k.replace("_sequential", "") + (" (earlier settings)" if k in older else "") for k in seq}
    if "rome_sequential" in seq and seq["rome_sequential"]["summary"]["all"]["n"] < report.get("rome_requested", 0):
        names["rome_sequential"] = (
            f"rome ({seq['rome_sequential']['summary']['all']['n']} of {report['rome_requested']}: time limit)"
        )
    metrics = {"ES": "es", "PS": "ps", "NS": "ns", "subject specificity": "ss"}
    fig = plot_decay(
        {names[k]: [c["n_edits"] for c in ev["curve"]] for k, ev in seq.items()},
        {m: {names[k]: [c[a] for c in ev["curve"]] for k, ev in seq.items()} for m, a in metrics.items()},
        reference={"NS": next(iter(seq.values()))["summary"]["all"]["pre"]["ns"]},
        title=f"{report['model']}: sequential editing, batches of {report['batch_size']}"
        + (" (ROME: one at a time)" if "rome_sequential" in seq else ""),
    )
    return {"mass_editing_decay": fig}


def tables(report: dict) -> dict[str, str]:
    """``mass_editing``: the statistics, the tuning, the runs, the curves and the batch edit's checks."""
    parts = [
        _header(report),
        _tuning_table(report),
        _runs_table(report),
        _generation_table(report),
        _curves(report),
        _footer(report),
    ]
    return {"mass_editing": "\n".join(line for p in parts for line in p)}


def _pc(x: float | None) -> str:
    return f"{100 * x:.1f}" if x is not None else "–"


def _describe(s: dict) -> str:
    """``layers [0, 1], 6 context variants (bare + 5 prefixes of each of [10] tokens), δ scaled by resid,
    λ = 1000, τ = 0.001, α = 100``."""
    n_ctx = 1 + s["prefixes_per_length"] * len(s["prefix_lengths"])
    return (
        f"layers {s['layers']}, {n_ctx} context variants (bare + {s['prefixes_per_length']} prefixes of each of "
        f"{s['prefix_lengths']} tokens), δ scaled by {s.get('delta_norm', 'mlp_out')}, λ = {s['mom2_weight']:g}, "
        f"τ = {s['nullspace_threshold']:g}{_rule(s)}, α = {s['alpha']:g}"
    )


def _rule(s: dict) -> str:
    """`` (energy)`` for a null space by the energy rule, nothing for the (default) relative one."""
    return f" ({s['nullspace_rule']})" if s.get("nullspace_rule", "relative") != "relative" else ""


def _older(report: dict) -> dict:
    """The MEMIT/AlphaEdit evaluations run under other settings than the report's current ones:
    ``{name: their settings or None (not recorded)}``."""
    now, ps = report.get("settings"), report.get("part_settings", {})
    if now is None:
        return {}
    return {
        name: ps.get(name)
        for name in report.get("evaluations", {})
        if name != "rome_sequential" and _relevant(name, ps.get(name)) != _relevant(name, now)
    }


def _relevant(name: str, settings: dict | None) -> dict | None:
    """The settings an evaluation depends on: a MEMIT row not on τ and α (no projection), an
    AlphaEdit row not on λ (its update has no ``C`` term: ``projected_update``)."""
    if settings is None:
        return None
    drop = {"memit": ("nullspace_threshold", "nullspace_rule", "alpha"), "alphaedit": ("mom2_weight",)}.get(
        name.split("_")[0], ()
    )
    return {k: v for k, v in {"nullspace_rule": "relative", **settings}.items() if k not in drop}


def _header(report: dict) -> list[str]:
    c = report["chosen"]
    lines = [
        f"# Mass editing on {report['model']} ({'; '.join(_places(report))})",
        "",
        f"{report['n_known_cases']} requests the unedited model knows; edit layers {report['layers']}; "
        f"chosen λ = {c['mom2_weight']}, τ = {c['nullspace_threshold']}{_rule(c)}"
        + (f", α = {c['alpha']:g}" if "alpha" in c else "")
        + ".",
        "",
    ]
    if "stats" in report:
        s = report["stats"]
        lines += [
            f"Key statistics: {s['count']} tokens, {s['seconds_computed']:.1f} s computed, "
            f"{s['seconds_cached']:.2f} s from the cache; projection {s['projection_seconds']:.2f} s "
            f"(null-space dims {s['null_dim']}; fraction of eigenvalues below τ·λ_max: "
            f"{s.get('eig_fraction_below')}).",
            "",
        ]
    return lines


def _tuning_table(report: dict) -> list[str]:
    if "tuning" not in report:
        return []
    t = report["tuning"]

    def f3(r, k):
        return f"{r[k]:.3g}" if r.get(k) is not None else "–"

    how = " (one δ optimisation; each setting re-solves the update)" if t.get("method") else ""
    lines = [
        f"Tuning on {t['n']} other requests, one batch{how} (NS unedited {_pc(t['ns_unedited'])}); "
        "fit = mean ‖KΔW − R‖/‖R‖, null = the edit keys' energy in the null space:",
        "",
        "| setting | ES | PS | NS | fit | ‖ΔW‖ | null dim | null |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| MEMIT λ = {r['mom2_weight']:g} | {_pc(r['es'])} | {_pc(r['ps'])} | {_pc(r['ns'])} | "
        f"{f3(r, 'fit_error')} | {f3(r, 'dW_norm')} | – | – |"
        for r in t["mom2_weight"]
    ]
    for r in t["nullspace_threshold"]:
        dims = r["null_dim"] if not isinstance(r.get("null_dim"), dict) else "/".join(map(str, r["null_dim"].values()))
        lines.append(
            f"| AlphaEdit τ = {r['nullspace_threshold']:g}{_rule(r)}"
            + (f", α = {r['alpha']:g}" if "alpha" in r else "")
            + f" | {_pc(r['es'])} | {_pc(r['ps'])} | {_pc(r['ns'])} | {f3(r, 'fit_error')} | "
            f"{f3(r, 'dW_norm')} | {dims} | {f3(r, 'key_energy_in_null_space')} |"
        )
    lines.append("")
    if t.get("source"):
        lines += [t["source"], ""]
    differ = {k: v for k, v in t.get("chosen", {}).items() if report["chosen"].get(k) != v}
    if differ:
        lines += [
            f"This tuning chose {differ}; the runs below used {report['chosen']} (they were not rerun "
            "with the new choice).",
            "",
        ]
    now, ps = report.get("settings"), report.get("part_settings", {})
    targets_of = ("layers", "prefix_lengths", "prefixes_per_length", "delta_norm")  # what the tuning depended on
    tuned = ps.get("tuning")
    if now and not (tuned and all(tuned.get(k) == now.get(k) for k in targets_of)):
        lines += [
            "The tuning above used other edit layers or context variants than the runs below: "
            + (_describe(tuned) if tuned else "settings not recorded")
            + ".",
            "",
        ]
    return lines


def _runs_table(report: dict) -> list[str]:
    evals, now, older = report.get("evaluations", {}), report.get("settings"), _older(report)
    lines = []
    if now:
        lines += [
            f"MEMIT/AlphaEdit settings of this table: {_describe(now)}"
            + (" — except the rows marked †." if older else "."),
            "",
        ]
    lines += [
        "| run | edits | ES | PS | NS (unedited) | SS | STN | fluency pre → post | mean KL | time (s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, ev in evals.items():
        s = ev["summary"]["all"]
        fl = f"{s['fluency_pre']:.3f} → {s['fluency_post']:.3f}" if s.get("fluency_post") is not None else "–"
        kl = f"{s['kl_drift']:.3g}" if s.get("kl_drift") is not None else "–"
        lines.append(
            f"| {name}{' †' if name in older else ''} | {s['n']} | {_pc(s['post']['es'])} | "
            f"{_pc(s['post']['ps'])} | {_pc(s['post']['ns'])} ({_pc(s['pre']['ns'])}) | {_pc(s.get('ss'))} | "
            f"{_pc(s.get('stn'))} | {fl} | {kl} | {ev['seconds']:.0f} |"
        )
    lines.append("")
    if report.get("batch_targets_shared") and "batch_memit_edit" in report:
        lines += [
            "The two batch rows share one δ optimisation of the batch (their times are the solve and the scoring; "
            f"the δ optimisation took {report['batch_memit_edit']['metrics']['delta_seconds']:.0f} s, see the "
            "last line).",
            "",
        ]
    for name, st in older.items():
        lines += [
            f"† {name}: "
            + (
                f"run with earlier settings ({_describe(st)}), not rerun with this table's"
                if st
                else "settings not recorded (a run before they were)"
            )
            + ".",
            "",
        ]
    rome = evals.get("rome_sequential")
    if rome and report.get("rome_requested") and rome["summary"]["all"]["n"] < report["rome_requested"]:
        s = rome["summary"]["all"]
        lines += [
            f"rome_sequential stopped at its time limit ({report['rome_time_limit_seconds']:.0f} s): "
            f"{s['n']} of {report['rome_requested']} requests edited (one at a time, "
            f"{s['edit_seconds']:.2f} s per edit on average); its rows and curve cover those.",
            "",
        ]
    if report.get("part_devices"):
        others = [k for k in report.get("part_seconds", {}) if k not in report["part_devices"]]
        lines += [
            "Parts (re)run separately (`only=`) and merged: "
            + "; ".join(f"{k} on {v}" for k, v in report["part_devices"].items())
            + (f"; the others ({', '.join(others)}) on {report['device']}" if others else "")
            + ".",
            "",
        ]
    return lines


def _generation_table(report: dict) -> list[str]:
    """The runs scored by greedy generation (those that were), beside their teacher-forced scores."""
    rows = [(k, ev["summary"]["all"]) for k, ev in report.get("evaluations", {}).items()]
    rows = [(k, s) for k, s in rows if s.get("gen_post")]
    if not rows:
        return []
    lines = [
        "By greedy generation (the continuation states the new object; neighbours: still the true one), beside "
        "the teacher-forced scores; two-hop questions through the edited facts (the answer through the new "
        "object, generated and teacher-forced; through the true object, generated). In brackets: the unedited "
        "model.",
        "",
        "| run | ES gen (forced) | PS gen (forced) | NS gen (forced) | two-hop cases | new answer gen | new answer "
        "forced | true answer gen |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in rows:
        g0, g1, tf = s["gen_pre"], s["gen_post"], s["post"]
        lines.append(
            f"| {name} | {_pc(g1['es'])} ({_pc(tf['es'])}) | {_pc(g1['ps'])} ({_pc(tf['ps'])}) | "
            f"{_pc(g1['ns'])} [{_pc(g0['ns'])}] ({_pc(tf['ns'])}) | {s.get('n_hop', 0)} | {_pc(g1['hop'])} "
            f"[{_pc(g0['hop'])}] | {_pc(g1['hop_tf'])} [{_pc(g0['hop_tf'])}] | {_pc(g1['hop_true'])} "
            f"[{_pc(g0['hop_true'])}] |"
        )
    return [*lines, ""]


def _places(report: dict) -> list[str]:
    """The devices the report's parts ran on, each once: a merged part's own record (``"cpu, 1 thread(s)"``
    → ``"cpu"``), else the first run's device."""
    merged = report.get("part_devices", {})
    ran = report.get("part_seconds") or {"": None}
    return list(dict.fromkeys(merged.get(k, report["device"]).split(",")[0] for k in ran))


def _curves(report: dict) -> list[str]:
    lines = []
    for name, ev in report.get("evaluations", {}).items():
        if ev.get("curve"):
            lines += [
                f"**{name}** after k edits (ES/PS/NS/SS/STN %, mean/max KL on unrelated prompts):",
                "",
                "| k | ES | PS | NS | SS | STN | mean KL | max KL |",
                "|---|---|---|---|---|---|---|---|",
            ]
            lines += [
                f"| {c['n_edits']} | {_pc(c['es'])} | {_pc(c['ps'])} | {_pc(c['ns'])} | {_pc(c['ss'])} | "
                f"{_pc(c['stn'])} | {c['kl_drift']:.3g} | {c['kl_max']:.3g} |"
                for c in ev["curve"]
            ]
            lines.append("")
    return lines


def _footer(report: dict) -> list[str]:
    lines = []
    now, ps, evals = report.get("settings"), report.get("part_settings", {}), report.get("evaluations", {})
    if "batch_memit_edit" in report:
        b = report["batch_memit_edit"]
        fit = next(iter(b["metrics"]["fit"].values()))
        if now and ps.get("batch_memit_edit") != now:
            lines += [
                "The edit below was computed with earlier settings: "
                + (_describe(ps["batch_memit_edit"]) if ps.get("batch_memit_edit") else "not recorded")
                + ".",
                "",
            ]
        lines += [
            f"One MEMIT edit of all requests: computed in {b['seconds']:.1f} s (δ optimisation "
            f"{b['metrics']['delta_seconds']:.1f} s); least-squares residual {100 * fit['fit_error']:.0f}% of the "
            f"targets; undo bit-exact: {b['undo_bit_exact']}; saved ({b['file_mb']:.1f} MB), reloaded into a "
            f"fresh model: scores {'identical' if b['reload_reproduces'] else 'DIFFERENT'} "
            f"({b['scores']} vs {b['reloaded_scores']}).",
            "",
        ]
    missing = [k for k in PARTS[3:] if k not in evals]
    if missing:
        lines += [f"Not measured in this run (time limit or error): {', '.join(missing)}.", ""]
    if report.get("errors"):
        lines += ["Errors: " + json.dumps(report["errors"]), ""]
    return lines


@register("mass_editing", Config, tables=tables, figures=figures, cache_depends=defaults_digest)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    """The parts in order (module doc), each kept on disk when done; the report is the data."""
    with torch.no_grad():
        job = MassEditing.start(model, cfg, ctx)
        job.part("stats", job.stats_part)
        job.ensure_stats()
        job.choose_defaults()
        if cfg.tune_n:
            job.part("tuning", job.tuning_part, job.apply_tuning, key=job.chosen)
        job.report["chosen"] = job.chosen
        job.report["settings"] = edit_settings(model, job.hp)
        ctx.record("memit_alphaedit", job.report["settings"])
        job.part("batch_memit_edit", job.batch_edit_part, key=job.hp)
        job.evaluate("memit_batch", method="memit")
        job.evaluate("alphaedit_batch", method="alphaedit")
        job.evaluate("alphaedit_sequential", method="alphaedit", sequential=True, batch_size=cfg.batch_size)
        job.evaluate("memit_sequential", method="memit", sequential=True, batch_size=cfg.batch_size)
        job.rome()
        job.report["weights_restored_at_end"] = weights_fingerprint(model) == job.base_fp
        job.report["seconds_total"] = time.perf_counter() - job.t0
    return job.report
