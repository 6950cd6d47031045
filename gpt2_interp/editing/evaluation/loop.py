"""The evaluation loop: one pass over the edits, whatever the editor.

1. The unedited model, batched: each case's scores, whether it knows the fact, fluency, the related
   facts it knows, the next-token distribution on unrelated prompts.
2. The edits (one request, or one batch, per edit):

   * independent (``sequential=False``): each edit is made on the unedited model, scored and undone
     bit-exactly (checked);
   * sequential: edits accumulate; the drift on unrelated prompts is recorded after every step, the
     scores of the edits so far at the checkpoints (one-request editors) or after every batch; a time
     limit stops the run after the step that ends past it, and the evaluation covers the requests
     edited so far; everything is undone at the end (checked).

Distributed (an initialised process group, or ``group``): independent one-request edits are sharded
over the ranks (key statistics computed together); the rows are gathered in request order.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from ...core import distributed
from ...core.boundary import boundary
from ...core.progress import progress_bar
from ...model.fingerprint import tensor_digest, weights_fingerprint
from ..edit import Edit, EditFailedWarning, undo_all
from .cases import CounterfactCase, RelatedPrompt, as_cases, known_flags, known_related, unrelated_prompts
from .config import DEFAULT_CHECKPOINTS, EvalConfig
from .editors import Editor, make_editor
from .generation import TwoHopQuestion, generation_scores, two_hop_questions
from .result import EditEvaluation
from .scores import (
    CaseRow,
    CurvePoint,
    MeanScores,
    StepDrift,
    case_scores,
    fluency,
    kl_rows,
    next_logprobs,
    related_hits,
    summarize,
)

if TYPE_CHECKING:
    from ...model import HookedGPT2


@boundary
@dataclass
class Baseline:
    """The unedited model's measurements: one row per case (pre-edit scores, known flag, fluency),
    the related facts it knows per case, and the unrelated prompts with their next-token log-probs.

    ``rows``: one :class:`~.scores.CaseRow` per case (pre-edit); ``related``: per case, the related
    facts the model knows; ``unrelated``: ``(relation, subject, prompt)`` triples; ``unrelated_pre``
    ``[n_unrelated, d_vocab]``: the unedited next-token log-probabilities after each; ``hops``: per case,
    the two-hop questions through its edit (:func:`~.generation.two_hop_questions`; empty unless the
    evaluation scores generations)."""

    rows: list[CaseRow]
    related: list[list[RelatedPrompt]]
    unrelated: list[tuple[str, str, str]]
    unrelated_pre: torch.Tensor  # [n_unrelated, d_vocab]
    hops: list[list[TwoHopQuestion]] = field(default_factory=list)

    @property
    def unrelated_texts(self) -> list[str]:
        """The unrelated prompts' texts, in order."""
        return [p for *_, p in self.unrelated]

    def unrelated_for(self, case: CounterfactCase) -> list[int]:
        """Indices of the unrelated prompts about neither the case's relation nor its subject."""
        return [
            j for j, (r, subj, _) in enumerate(self.unrelated) if r != case.relation and subj != case.request.subject
        ]


@boundary
def baseline(model: HookedGPT2, cases: Sequence[CounterfactCase], config: EvalConfig) -> Baseline:
    """Measure the unedited ``model`` on ``cases`` (batched, ``config.score_batch_size`` prompts a pass),
    with a bar over the measurements (``config.progress``)."""
    sb = config.score_batch_size
    gen = config.generation_tokens > 0
    bar = progress_bar(
        total=4 + gen, unit="step", desc="baseline (unedited model)", enabled=config.progress, leave=False
    )
    bar.set_postfix_str("scores", refresh=False)
    pre = case_scores(model, cases, sb)
    bar.update(1)
    bar.set_postfix_str("known facts", refresh=False)
    known = known_flags(model, cases, sb)
    bar.update(1)
    bar.set_postfix_str("fluency", refresh=False)
    fl = fluency(model, cases, config.fluency_tokens, sb)
    bar.update(1)
    rows = [
        CaseRow(
            c.case_id,
            c.relation,
            c.request.subject,
            c.request.text,
            c.request.target,
            c.target_true,
            k,
            pre=s,
            fluency_pre=f,
        )
        for c, s, k, f in zip(cases, pre, known, fl)
    ]
    bar.set_postfix_str("related facts", refresh=False)
    unrel = unrelated_prompts(config.n_unrelated)
    related = known_related(model, cases, config.seed, sb) if config.related else [[] for _ in cases]
    out = Baseline(rows, related, unrel, next_logprobs(model, [p for *_, p in unrel]))
    bar.update(1)
    if gen:
        bar.set_postfix_str("generations", refresh=False)
        out.hops = two_hop_questions(cases) if all(c.relation for c in cases) else [[] for _ in cases]
        for row, g in zip(rows, generation_scores(model, cases, out.hops, config.generation_tokens, sb)):
            row.gen_pre = g
        bar.update(1)
    bar.close()
    return out


def score_after(
    model: HookedGPT2,
    cases: Sequence[CounterfactCase],
    rows: Sequence[CaseRow],
    related: Sequence[list[RelatedPrompt]],
    base: Baseline,
    config: EvalConfig,
    hops: Sequence[list[TwoHopQuestion]] | None = None,
) -> None:
    """Fill ``rows``' post-edit scores, related-fact hits, fluency and drift on the model as it is, and
    with ``config.generation_tokens`` the generation-based scores (``hops``: the cases' two-hop questions)."""
    sb = config.score_batch_size
    if config.generation_tokens:
        got = generation_scores(model, cases, hops, config.generation_tokens, sb)
        for row, g in zip(rows, got):
            row.gen_post = g
    for row, s, hits in zip(rows, case_scores(model, cases, sb), related_hits(model, related, sb)):
        row.post = s
        (row.ss_hits, row.ss_n), (row.stn_hits, row.stn_n) = hits["ss"], hits["stn"]
    post_u = next_logprobs(model, base.unrelated_texts)
    for c, row, f in zip(cases, rows, fluency(model, cases, config.fluency_tokens, sb)):
        row.fluency_post = f
        idx = base.unrelated_for(c)
        if idx:
            row.kl_drift = float(kl_rows(base.unrelated_pre[idx], post_u[idx]).mean())


def curve_point(
    model: HookedGPT2,
    cases: Sequence[CounterfactCase],
    related: Sequence[list[RelatedPrompt]],
    kl: torch.Tensor,
    batch_size: int,
) -> CurvePoint:
    """Scores of the edits made so far (``cases``), their related facts pooled, and the drift ``kl``
    ``[n_unrelated]`` on the unrelated prompts."""
    hits = related_hits(model, related, batch_size)
    pooled = {}
    for key in ("ss", "stn"):
        n = sum(h[key][1] for h in hits)
        pooled[key] = sum(h[key][0] for h in hits) / n if n else None
    return CurvePoint(
        **vars(MeanScores.over(case_scores(model, cases, batch_size))),
        n_edits=len(cases),
        **pooled,
        kl_drift=float(kl.mean()),
        kl_max=float(kl.max()),
    )


def _units(n: int, editor: Editor, batch_size: int | None) -> list[list[int]]:
    """Case indices per edit: one each for a one-request editor, else batches of ``batch_size`` (all: None)."""
    size = 1 if editor.max_batch == 1 else (batch_size or n)
    return [list(range(s, min(s + size, n))) for s in range(0, n, size)]


def _edit(
    model: HookedGPT2, editor: Editor, cases: Sequence[CounterfactCase], rows: Sequence[CaseRow], unit: Sequence[int]
) -> tuple[Edit, float]:
    """The edit of ``unit``'s cases and its time; their rows get their share of the time and the layer(s).
    An edit that did not take does not warn here: the evaluation's efficacy score counts it."""
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EditFailedWarning)
        edit = editor.compute(model, [cases[i].request for i in unit])
    secs = time.perf_counter() - t0
    for i in unit:
        rows[i].edit_seconds = secs / len(unit)
        rows[i].layer = edit.layers[0] if len(edit.layers) == 1 else edit.layers
    return edit, secs


def _independent(
    model: HookedGPT2, editor: Editor, cases: Sequence[CounterfactCase], base: Baseline, config: EvalConfig, bar: Any
) -> None:
    """Each edit on the unedited model: make, apply, score, undo, check W_out bit-exactly restored."""
    for unit in _units(len(cases), editor, config.batch_size):
        edit, _ = _edit(model, editor, cases, base.rows, unit)
        before = {l: tensor_digest(model.blocks[l].mlp.W_out) for l in edit.layers}
        edit.apply(model, verify=False)
        bar.update(len(unit))
        try:
            score_after(
                model,
                [cases[i] for i in unit],
                [base.rows[i] for i in unit],
                [base.related[i] for i in unit],
                base,
                config,
                [base.hops[i] for i in unit] if base.hops else None,
            )
        finally:
            edit.undo(model)
        if any(tensor_digest(model.blocks[l].mlp.W_out) != d for l, d in before.items()):  # pragma: no cover
            raise RuntimeError(f"undoing the edit of cases {unit[:5]} did not restore W_out bit-exactly")


def _sequential(
    model: HookedGPT2,
    editor: Editor,
    cases: Sequence[CounterfactCase],
    base: Baseline,
    config: EvalConfig,
    bar: Any,
    t_start: float,
) -> tuple[int, list[CurvePoint], list[StepDrift]]:
    """Accumulate the edits, recording drift per step and the curve; returns how many cases were
    edited (fewer past the time limit), the curve and the drift per step."""
    marks = {k for k in (config.checkpoints or DEFAULT_CHECKPOINTS) if k <= len(cases)} | {len(cases)}
    curve: list[CurvePoint] = []
    steps: list[StepDrift] = []
    n_done = 0
    for step, unit in enumerate(_units(len(cases), editor, config.batch_size), start=1):
        edit, secs = _edit(model, editor, cases, base.rows, unit)
        edit.apply(model, verify=False)
        n_done += len(unit)
        bar.update(len(unit))
        kl = kl_rows(base.unrelated_pre, next_logprobs(model, base.unrelated_texts))
        steps.append(StepDrift(step, n_done, float(kl.mean()), float(kl.max()), secs))
        out_of_time = config.time_limit is not None and time.perf_counter() - t_start > config.time_limit
        if editor.max_batch != 1 or n_done in marks or out_of_time:
            curve.append(curve_point(model, cases[:n_done], base.related[:n_done], kl, config.score_batch_size))
        if out_of_time:
            break
    return n_done, curve, steps


@boundary
def evaluate_local(
    model: HookedGPT2,
    cases: Sequence[CounterfactCase],
    editor: Editor,
    config: EvalConfig,
    t_start: float | None = None,
) -> EditEvaluation:
    """Edit and score ``cases`` in this process (module doc); the weights are restored (checked).
    ``editor``: a prepared :class:`~.editors.Editor`; ``config``: the :class:`~.config.EvalConfig`
    (sequential or not, batch size, scoring sizes, progress); ``t_start``: when the evaluation began
    (``time.perf_counter``; default now), for the reported seconds. Returns an
    :class:`~.result.EditEvaluation`; sequential edits that do not undo bit-exactly raise RuntimeError."""
    t_start = time.perf_counter() if t_start is None else t_start
    cases = list(cases)
    base_fp = weights_fingerprint(model)
    base = baseline(model, cases, config)
    bar = progress_bar(total=len(cases), desc=f"editing ({editor.name})", enabled=config.progress)
    curve: list[CurvePoint] = []
    steps: list[StepDrift] = []
    if config.sequential:
        n, curve, steps = _sequential(model, editor, cases, base, config, bar, t_start)
        cases, base.rows, base.related, base.hops = cases[:n], base.rows[:n], base.related[:n], base.hops[:n]
        bar.close()
        score_after(model, cases, base.rows, base.related, base, config, base.hops or None)
        undo_all(model)
        if weights_fingerprint(model) != base_fp:  # pragma: no cover
            raise RuntimeError("undoing the sequential edits did not restore the weights bit-exactly")
    else:
        _independent(model, editor, cases, base, config, bar)
        bar.close()
    return _result(editor, config, base.rows, curve, steps, True, t_start)


def _result(
    editor: Editor,
    config: EvalConfig,
    rows: list[CaseRow],
    curve: list[CurvePoint],
    steps: list[StepDrift],
    restored: bool,
    t_start: float,
) -> EditEvaluation:
    known = [r for r in rows if r.known]
    return EditEvaluation(
        editor.name,
        config.sequential,
        editor.layer,
        rows,
        {"all": summarize(rows), "known": summarize(known)},
        curve or None,
        editor.hparams,
        time.perf_counter() - t_start,
        restored,
        1 if editor.max_batch == 1 else config.batch_size,
        steps or None,
    )


def _evaluate_sharded(
    model: HookedGPT2, cases: list[CounterfactCase], editor: Editor, config: EvalConfig, group: Any, t_start: float
) -> EditEvaluation:
    """Each rank edits and scores its share of the cases; every rank returns all rows in order."""
    mine = distributed.shard(cases, group)
    local_config = replace(config, progress=config.progress if distributed.is_main(group) else False)
    local = evaluate_local(model, mine, editor, local_config, t_start) if mine else None
    rows = distributed.gather_in_order(local.rows if local else [], len(cases), group)
    restored = bool(distributed.all_reduce_number(int(local.restored_exactly if local else True), group, "min"))
    return _result(editor, config, rows, [], [], restored, t_start)


@boundary
def run_evaluation(
    model: HookedGPT2,
    requests: Sequence[Any] | int,
    config: EvalConfig | None = None,
    editor: Editor | None = None,
    group: Any = None,
    local: bool = False,
) -> EditEvaluation:
    """Edit the requests and score them (module doc; :mod:`.scores` for the scores).

    ``requests``: CounterFact cases, Requests/dicts, or an int n (that many cases from the embedded
    fact base). ``config``: :class:`EvalConfig` (defaults: ROME, one request at a time).
    ``editor``: an :class:`~.editors.Editor` to evaluate instead of the one ``config.method`` names.
    Distributed (an initialised process group, or ``group``; not with ``local=True``): independent
    one-request edits are sharded over the ranks; sequential runs and batch edits are not (each rank
    runs them whole).

    Returns an :class:`~.result.EditEvaluation`; the model's weights are restored bit-exactly
    afterwards. ``local=True`` keeps the evaluation in this process. Refused: no requests, a
    malformed request, ``targets`` with a ``batch_size`` other than all cases, and the refusals of
    the editor's ``compute_edit``/``compute_edits`` (ValueError/TypeError)."""
    t_start = time.perf_counter()
    config = config or EvalConfig()
    cases = as_cases(requests, config.seed)
    config.check_cases(len(cases))
    one_each = editor.max_batch == 1 if editor is not None else config.method == "rome"
    sharded = not local and not config.sequential and one_each and distributed.is_distributed(group)
    if editor is None:
        editor = make_editor(model, config, [c.request for c in cases], group if sharded else None)
    if sharded:
        return _evaluate_sharded(model, cases, editor, config, group, t_start)
    return evaluate_local(model, cases, editor, config, t_start)


@boundary
def evaluate_edits(
    model: HookedGPT2,
    requests: Sequence[Any] | int,
    *args: Any,
    group: Any = None,
    config: EvalConfig | None = None,
    **kwargs: Any,
) -> EditEvaluation:
    """Edit the requests and score them: :func:`run_evaluation` with the settings given as
    :class:`EvalConfig`'s fields (by position after ``requests`` or by name; every other keyword is
    an editor hyperparameter), or as one ``config``.

    Distributed (an initialised process group, or ``group``): the ranks compute the key statistics
    together, then each edits and scores its share of the requests on its own copy of the model;
    every rank returns all rows in request order (those of one process, up to float rounding of
    differently batched prompts) and the summaries over them. ``sequential=True`` and MEMIT/AlphaEdit
    batch edits are not sharded (each rank runs them whole).

    ``requests``: CounterFact cases, Requests/dicts, or an int n (that many cases from the embedded
    fact base). Defaults (:class:`EvalConfig`): ROME at the model's default layer, each edit made on
    the unedited model, scored and undone. Refused: settings given both as ``config`` and as
    arguments, or twice (TypeError), every :class:`EvalConfig` refusal, and those of
    :func:`run_evaluation`."""
    return run_evaluation(model, requests, _config(config, args, kwargs), group=group)


@boundary
def evaluate_edits_local(
    model: HookedGPT2, requests: Sequence[Any] | int, *args: Any, config: EvalConfig | None = None, **kwargs: Any
) -> EditEvaluation:
    """:func:`evaluate_edits` in this process only, even when a process group is initialised."""
    return run_evaluation(model, requests, _config(config, args, kwargs), local=True)


def _config(config: EvalConfig | None, args: tuple, kwargs: dict[str, Any]) -> EvalConfig:
    if config is None:
        return EvalConfig.of(*args, **kwargs)
    if args or kwargs:
        raise TypeError(
            f"config: give the settings either as one EvalConfig or as arguments, not both "
            f"(got config and {len(args)} positional, {sorted(kwargs)} named)"
        )
    if not isinstance(config, EvalConfig):
        raise TypeError(f"config must be an EvalConfig, got {type(config).__name__}")
    return config


__all__ = [
    "Baseline",
    "baseline",
    "curve_point",
    "evaluate_edits",
    "evaluate_edits_local",
    "evaluate_local",
    "run_evaluation",
    "score_after",
]
