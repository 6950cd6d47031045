"""Do an SAE's latents mean something — does one latent alone say a subject's continent, language, currency?

For each probing task of the fact base (country → continent, language, currency; prompts in several
templates of the country's relations, folds split by subject), the SAE's latents at the subject's last
token are scored as one-vs-rest detectors of each class: per class, the latent with the best AUROC on
the training folds, scored on the held-out folds (:func:`~gpt2_interp.analysis.features.latent_probe`).
Beside it, on the same activations and the same folds: a sparse probe on those latents alone (one per
class), a linear probe on all the latents, and a linear probe on the residual stream itself at the SAE's
hook (Hewitt & Liang's by-type control for the latter). Each picked latent is shown by the subjects it
fires on most and the tokens its decoder row promotes.

The SAE: ``sae`` (a folder, e.g. the ``sae/`` of a ``sae_train`` run), else the ``sae_train`` result of
this model under the same output folder, else one trained here (``train_tokens`` on ``texts``, 8 ×
d_model latents, TopK ``k``, at the middle block's input).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from gpt2_interp.analysis.features.latent_probes import latent_probe
from gpt2_interp.analysis.features.sae import SAE
from gpt2_interp.analysis.features.sae_train import SAETrainConfig, text_source, token_windows, train_sae
from gpt2_interp.analysis.features.sae_views import logit_effect
from gpt2_interp.analysis.probes import collect_activations, probe_features
from gpt2_interp.core.tables import format_table
from gpt2_interp.experiments.base import ExperimentConfig, register
from gpt2_interp.experiments.runner import RunContext
from gpt2_interp.facts.probing import probing_set

if TYPE_CHECKING:
    from gpt2_interp.model import HookedGPT2

TASKS = ("continent", "language", "currency")


@dataclass
class Config(ExperimentConfig):
    tasks: list[str] = field(default_factory=lambda: list(TASKS), metadata={"help": f"probing tasks, among {TASKS}"})
    per_subject: int = field(default=8, metadata={"help": "templates per subject (prompts = subjects × this)"})
    n_folds: int = field(default=5, metadata={"help": "folds, split by subject"})
    sae: Path | None = field(
        default=None,
        metadata={
            "help": "SAE folder (none: <out>/sae_train/<model>/sae when the run writes its results and it exists, "
            "else an SAE trained here)"
        },
    )
    train_tokens: int = field(default=400_000, metadata={"help": "training tokens of an SAE trained here"})
    texts: str = field(
        default="facts", metadata={"help": "text of an SAE trained here: facts (the fact corpus), brown, generated…"}
    )
    generated: int = field(default=512, metadata={"help": "samples of the model itself when texts=generated"})
    k: int = field(default=32, metadata={"help": "active latents per token of an SAE trained here"})
    epochs: int = field(default=1, metadata={"help": "passes over the text of an SAE trained here"})
    top: int = field(default=5, metadata={"help": "subjects and promoted tokens shown per picked latent"})

    QUICK: ClassVar[dict[str, Any]] = {
        "tasks": ["continent"],
        "per_subject": 2,
        "n_folds": 3,
        "train_tokens": 4096,
        "generated": 64,
        "k": 8,
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown or not self.tasks:
            raise ValueError(f"sae_features: tasks must be among {', '.join(TASKS)}; got {self.tasks}")
        for name, low in (
            ("per_subject", 1),
            ("n_folds", 2),
            ("train_tokens", 1),
            ("generated", 2),
            ("top", 1),
            ("epochs", 1),
        ):
            if getattr(self, name) < low:
                raise ValueError(f"sae_features: {name} must be >= {low}, got {getattr(self, name)}")


def find_sae(model: HookedGPT2, cfg: Config, ctx: RunContext) -> tuple[SAE, str]:
    """The SAE to read (see the module's docstring) and where it came from."""
    if cfg.sae is not None:
        return SAE.load(cfg.sae, model), str(cfg.sae)
    if ctx.out_dir is not None:
        root = next((p.parent for p in (ctx.out_dir, *ctx.out_dir.parents) if p.name == "sae_features"), None)
        found = None if root is None else root / "sae_train" / model.cfg.name / "sae"
        if found is not None and (found / "cfg.json").exists():
            return SAE.load(found, model), str(found)
    hook = f"blocks.{model.cfg.n_layer // 2}.hook_resid_pre"
    batch = max(1, min(2048, cfg.train_tokens // 8))
    tcfg = SAETrainConfig(
        hook_name=hook,
        k=cfg.k,
        tokens=cfg.train_tokens,
        batch_size=batch,
        buffer_tokens=max(4 * batch, min(65_536, cfg.train_tokens)),
        epochs=cfg.epochs,
        seed=cfg.seed,
    )
    docs = text_source(model, cfg.texts, n_generated=cfg.generated, seed=cfg.seed)
    sae, log = train_sae(model, tcfg, windows=token_windows(model, docs, tcfg.context_size), progress=ctx.progress)
    return sae, f"trained here: {cfg.texts}, {log.tokens} tokens ({cfg.epochs} epoch(s)), k={cfg.k}"


def top_subjects(latent: torch.Tensor, subjects: list[str], labels: list[str], top: int) -> list[list]:
    """The ``top`` subjects by their mean activation of a ``latent`` ``[n]`` over their prompts (``subjects``
    and ``labels``: one per prompt): ``[subject, label, mean activation]``."""
    by: dict[str, list[float]] = {}
    label_of = dict(zip(subjects, labels))
    for s, a in zip(subjects, latent.tolist()):
        by.setdefault(s, []).append(a)
    means = sorted(((float(np.mean(v)), s) for s, v in by.items()), reverse=True)[:top]
    return [[s, label_of[s], round(m, 3)] for m, s in means]


def run_task(model: HookedGPT2, sae: SAE, cfg: Config, task: str, promoted: torch.Tensor) -> dict[str, Any]:
    """One ``task`` for ``sae``: the latent probe, the sparse, all-latent and residual probes, and what each
    picked latent is (``promoted``: the SAE's logit effect ``[d_sae, d_vocab]``); ``cfg``: the run's settings."""
    ds = probing_set(task, per_subject=cfg.per_subject)
    hook = sae.cfg.hook_name
    acts = collect_activations(model, ds.prompts, [hook], subjects=ds.subjects, progress=False)[hook]
    with torch.no_grad():
        z = sae.encode(acts.to(sae.W_enc.device)).float().cpu()
    resid = probe_features(
        [acts], ds.labels, groups=ds.groups, layers=[hook], control="by-type", n_folds=cfg.n_folds, seed=cfg.seed
    )
    fold = np.asarray(resid.fold)
    folds = [(np.flatnonzero(fold != k), np.flatnonzero(fold == k)) for k in range(resid.n_folds)]
    all_latents = probe_features([z], ds.labels, groups=ds.groups, control=None, n_folds=cfg.n_folds, seed=cfg.seed)
    lp = latent_probe(z, ds.labels, folds, task=task, hook_name=hook, seed=cfg.seed)
    tok = model.tokenizer
    per_class = []
    for c, lat, auc, agree in zip(lp.classes, lp.latent, lp.auroc, lp.agreement):
        ids = promoted[lat].topk(cfg.top).indices.tolist() if lat >= 0 else []
        per_class.append(
            {
                "class": c,
                "latent": lat,
                "auroc": auc,
                "folds_agreeing": agree,
                "subjects_in_class": len({s for s, y in zip(ds.subjects, ds.labels) if y == c}),
                "fires_on": float((z[:, lat] > 0).float().mean()) if lat >= 0 else 0.0,
                "top_subjects": top_subjects(z[:, lat], ds.subjects, ds.labels, cfg.top) if lat >= 0 else [],
                "promotes": [tok.decode([i]) for i in ids],
            }
        )
    aurocs = [a for a in lp.auroc if a == a]
    return {
        "description": ds.description,
        "prompts": len(ds),
        "subjects": ds.n_subjects,
        "classes": per_class,
        "best": lp.best(),
        "mean_auroc": float(np.mean(aurocs)) if aurocs else float("nan"),
        "sparse_probe_accuracy": float(np.mean(lp.sparse_accuracy)),
        "all_latents_probe_accuracy": float(all_latents.mean[0]),
        "linear_probe_accuracy": float(resid.mean[0]),
        "linear_probe_control": float(resid.control_mean[0]) if resid.control_mean is not None else None,
        "chance": lp.chance,
    }


def tables(data: dict) -> dict[str, str]:
    """The summary (one row per task) and each task's picked latents."""
    head = [
        "task",
        "best class: latent (AUROC)",
        "mean AUROC",
        "1 latent / class probe",
        "all latents probe",
        "linear probe (resid)",
        "chance",
    ]
    rows = []
    for t, v in data["tasks"].items():
        b = v["best"]
        rows.append(
            [
                t,
                f"{b['class']}: #{b['latent']} ({b['auroc']:.3f})",
                f"{v['mean_auroc']:.3f}",
                f"{v['sparse_probe_accuracy']:.3f}",
                f"{v['all_latents_probe_accuracy']:.3f}",
                f"{v['linear_probe_accuracy']:.3f}",
                f"{v['chance']:.3f}",
            ]
        )
    out = {"summary": "\n".join(format_table(head, rows, right=[False, False, True, True, True, True, True]))}
    for t, v in data["tasks"].items():
        rows = [
            [
                c["class"],
                str(c["latent"]),
                f"{c['auroc']:.3f}",
                f"{c['folds_agreeing']:.0%}",
                f"{c['fires_on']:.2f}",
                ", ".join(f"{s} ({y})" for s, y, _ in c["top_subjects"]),
                " ".join(repr(p) for p in c["promotes"]),
            ]
            for c in v["classes"]
        ]
        head2 = ["class", "latent", "AUROC", "folds", "fires on", "top subjects (their class)", "promotes"]
        out[f"latents_{t}"] = "\n".join(format_table(head2, rows, right=[False, True, True, True, True, False, False]))
    return out


@register("sae_features", Config, tables=tables)
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    sae, source = find_sae(model, cfg, ctx)
    promoted = logit_effect(model, sae).float().cpu()
    return {
        "model": model.cfg.name,
        "hook": sae.cfg.hook_name,
        "position": "last subject token",
        "sae": {"source": source, "architecture": sae.cfg.architecture, "d_sae": sae.cfg.d_sae, "k": sae.cfg.k},
        "method": "per class, the latent with the best AUROC on the training folds, scored on held-out subjects",
        "folds": cfg.n_folds,
        "tasks": {t: run_task(model, sae, cfg, t, promoted) for t in cfg.tasks},
    }
