"""The result of an edit evaluation: per-case rows, summaries, the sequential curve and drift."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...core.boundary import boundary
from ...core.result import Result
from .scores import SCORES, CaseRow, CurvePoint, GenerationScores, MeanScores, StepDrift, Summary, _mean


@boundary
@dataclass
class EditEvaluation(Result):
    """Per-case rows, summaries over all cases and the known subset, and (sequential) the decay
    curve and the drift after every step.

    ``method``: ``"rome"``, ``"memit"`` or ``"alphaedit"``; ``sequential``: whether edits stayed
    applied; ``layer``: the edited layer(s) (None: chosen per request); ``rows``: one
    :class:`~.scores.CaseRow` per case; ``summary``: ``{"all": Summary, "known": Summary}``
    (:class:`~.scores.Summary`; ``known``: the cases whose fact the unedited model knew);
    ``curve``: sequential scores after k edits (:class:`~.scores.CurvePoint`, None otherwise);
    ``hparams``: the editor's settings; ``seconds``: the whole evaluation's time;
    ``restored_exactly``: whether the weights came back bit-exactly; ``batch_size``: requests per
    edit; ``steps``: the drift after every step (:class:`~.scores.StepDrift`, sequential only)."""

    result_kind = "edit evaluation"

    method: str
    sequential: bool
    layer: int | list[int] | None
    rows: list[CaseRow]
    summary: dict[str, Summary]  # {"all": …, "known": …}
    curve: list[CurvePoint] | None = None  # sequential: scores after k edits
    hparams: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    restored_exactly: bool = True
    batch_size: int | None = None
    steps: list[StepDrift] | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EditEvaluation:
        """An evaluation back from its JSON form (:meth:`to_dict`), e.g. to render a saved result's table and figure."""

        def summary(s: dict[str, Any]) -> Summary:
            gen = {k: GenerationScores(**s[k]) for k in ("gen_pre", "gen_post") if s.get(k) is not None}
            return Summary(**{**s, "pre": MeanScores(**s["pre"]), "post": MeanScores(**s["post"]), **gen})

        return cls(
            d["method"],
            d["sequential"],
            d["layer"],
            [CaseRow.from_dict(r) for r in d["rows"]],
            {k: summary(v) for k, v in d["summary"].items()},
            None if d.get("curve") is None else [CurvePoint(**c) for c in d["curve"]],
            d.get("hparams", {}),
            d.get("seconds", 0.0),
            d.get("restored_exactly", True),
            d.get("batch_size"),
            None if d.get("steps") is None else [StepDrift(**s) for s in d["steps"]],
        )

    def table(self) -> str:
        """The summary as a text table (scores in %)."""
        how = (
            ("sequential" if self.sequential else "one at a time")
            if self.batch_size in (None, 1) and self.method == "rome"
            else (f"batches of {self.batch_size}" if self.batch_size else "one batch")
            + (", sequential" if self.sequential else "")
        )
        lines = [
            f"{self.method} on {self.summary['all'].n} requests ({how}), layer {self.layer}; "
            f"the unedited model knows {self.summary['known'].n} of the facts"
        ]
        head = f"{'subset':8} {'stage':5} " + " ".join(f"{k:>7}" for k in ("ES", "EM", "PS", "PM", "NS", "NM", "S"))
        lines += [head, "-" * len(head)]
        for subset in ("all", "known"):
            s = self.summary[subset]
            for stage in ("pre", "post"):
                vals = [getattr(getattr(s, stage), k) for k in (*SCORES, "S")]
                lines.append(
                    f"{subset:8} {stage:5} "
                    + " ".join(f"{100 * v:7.1f}" if v is not None else f"{'–':>7}" for v in vals)
                )
        s = self.summary["all"]

        def fmt(x, f):
            return format(x, f) if x is not None else "–"

        def pc(x):
            return f"{100 * x:.1f}%" if x is not None else "–"

        lines.append(
            f"subject specificity {pc(s.ss)} of {s.n_ss} other facts of the edited "
            f"subjects; shared-token neighbours {pc(s.stn)} of {s.n_stn} facts"
        )
        lines.append(
            f"fluency (n-gram entropy) {fmt(s.fluency_pre, '.3f')} → {fmt(s.fluency_post, '.3f')}; "
            f"KL drift on unrelated prompts {fmt(s.kl_drift, '.2e')}; neighbourhood cases "
            f"{s.n_neighbourhood}; edit time {fmt(s.edit_seconds, '.2f')} s mean, "
            f"{fmt(s.edit_seconds_median, '.2f')} s median; weights restored bit-exactly: "
            f"{self.restored_exactly}"
        )
        if s.gen_post is not None and s.gen_pre is not None:
            g0, g1 = s.gen_pre, s.gen_post
            lines.append(
                f"by greedy generation: ES {pc(g0.es)} → {pc(g1.es)}, PS {pc(g0.ps)} → {pc(g1.ps)}, "
                f"NS {pc(g0.ns)} → {pc(g1.ns)}"
            )
            if s.n_hop:
                lines.append(
                    f"two-hop questions through the edits ({s.n_hop} cases): answer through the new object "
                    f"{pc(g0.hop)} → {pc(g1.hop)} generated, {pc(g0.hop_tf)} → {pc(g1.hop_tf)} teacher-forced; "
                    f"through the true object {pc(g0.hop_true)} → {pc(g1.hop_true)} generated"
                )
        if self.curve:

            def pct(x):
                return f"{100 * x:.0f}" if x is not None else "–"

            lines.append(
                "after k edits:  "
                + "  ".join(f"k={c.n_edits}: ES {pct(c.es)} PS {pct(c.ps)} NS {pct(c.ns)}" for c in self.curve)
            )
        if self.steps:
            worst = max(self.steps, key=lambda d: d.kl_max)
            lines.append(
                f"drift per step: mean KL {fmt(_mean([d.kl_mean for d in self.steps]), '.2e')}, largest "
                f"single-prompt KL {worst.kl_max:.3g} (step {worst.step}, after {worst.n_edits} edits)"
            )
        return "\n".join(lines)

    def plot(self, **kwargs: Any):
        from ...plots.editing import plot_edit_evaluation

        return plot_edit_evaluation(self, **kwargs)


__all__ = ["EditEvaluation"]
