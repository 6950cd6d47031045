"""The settings of an edit evaluation, checked once (:class:`EvalConfig`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from ...core.boundary import boundary
from ...core.checks import as_int, check_count

if TYPE_CHECKING:
    from ..edit import TargetResiduals
    from ..stats import KeyStats

#: The editing methods an evaluation can run: ROME (one request per edit), MEMIT and AlphaEdit (batches).
EDIT_METHODS = ("rome", "memit", "alphaedit")
#: Sequential ROME records the scores of the edits so far after these many edits (and after the last).
DEFAULT_CHECKPOINTS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


@boundary
@dataclass
class EvalConfig:
    """How an evaluation edits and scores (``evaluate_edits``' keywords, in its positional order).

    ``method``: one of :data:`EDIT_METHODS`. ``sequential``: edits accumulate (False: each edit is
    made on the unedited model, scored and undone). ``layer``: ROME's layer (int, None = the model's
    default, "auto") or MEMIT's layers (ints, None, "auto"). ``stats``: key statistics (computed
    when None). ``fluency_tokens``: greedy tokens per fluency prompt. ``n_unrelated``: prompts for
    the drift. ``checkpoints``: sequential ROME's curve marks. ``batch_size``: MEMIT/AlphaEdit
    requests per edit (None: all at once). ``progress``: bars for the baseline, the edits (done out
    of total, time left) and each edit's own work (None: on a terminal or in a notebook; False: none).
    ``seed``: of the cases drawn for an int ``requests`` and of the related facts. ``score_batch_size``:
    prompts per forward pass when scoring. ``preserve``: AlphaEdit's :class:`~..memit.NullSpace` or statistics to
    preserve (None: the edit layers' statistics). ``related``: score subject specificity and
    shared-token neighbours. ``time_limit``: seconds (sequential only). ``targets``: target
    residuals of an earlier edit of the same one batch (MEMIT/AlphaEdit). ``generation_tokens``: greedy
    tokens per prompt for the generation-based scores and the two-hop questions through the edits
    (:mod:`.generation`; 0, the default: not scored; 10 suits one-entity answers). ``hparams``: the
    editor's hyperparameters (ROME's or MEMIT's).

    Refused when made: an unknown method; ``n_unrelated``, ``score_batch_size``, ``batch_size`` or
    a checkpoint < 1, negative ``fluency_tokens`` or ``generation_tokens``, a non-integer seed;
    ``batch_size`` > 1 with ROME; ``time_limit`` without ``sequential`` or negative;
    ``targets`` with ROME or sequential editing (ValueError/TypeError, naming the field);
    ``hparams`` that is not a mapping (TypeError)."""

    method: str = "rome"
    sequential: bool = False
    layer: int | Sequence[int] | str | None = None
    stats: KeyStats | Mapping[int, KeyStats] | None = None
    fluency_tokens: int = 40
    n_unrelated: int = 30
    checkpoints: Sequence[int] | None = None
    batch_size: int | None = None
    progress: bool | None = None
    seed: int = 0
    score_batch_size: int = 64
    preserve: Any = None
    related: bool = True
    time_limit: float | None = None
    targets: TargetResiduals | None = None
    generation_tokens: int = 0
    hparams: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.method not in EDIT_METHODS:
            raise ValueError(f"method must be one of {EDIT_METHODS}, got {self.method!r}")
        self.fluency_tokens = check_count(self.fluency_tokens, "fluency_tokens", minimum=0)
        self.generation_tokens = check_count(self.generation_tokens, "generation_tokens", minimum=0)
        self.n_unrelated = check_count(self.n_unrelated, "n_unrelated")
        self.score_batch_size = check_count(self.score_batch_size, "score_batch_size")
        self.seed = as_int(self.seed, "seed")
        if self.checkpoints is not None:
            self.checkpoints = tuple(check_count(k, "checkpoints (each)") for k in self.checkpoints)
        if self.batch_size is not None:
            self.batch_size = check_count(self.batch_size, "batch_size")
        if self.method == "rome" and self.batch_size not in (None, 1):
            raise ValueError(
                f"batch_size: ROME edits one request at a time; batch_size={self.batch_size} needs "
                "method='memit' or 'alphaedit'"
            )
        self._check_time_limit()
        if self.targets is not None and (self.method == "rome" or self.sequential):
            raise ValueError(
                f"targets are the target residuals of one MEMIT/AlphaEdit batch of all the requests "
                f"(method='memit' or 'alphaedit', not sequential), got method={self.method!r}, "
                f"sequential={self.sequential}"
            )
        if not isinstance(self.hparams, Mapping):
            raise TypeError(
                f"hparams must be a mapping of the editor's hyperparameters, got {type(self.hparams).__name__}"
            )
        self.hparams = dict(self.hparams)

    def _check_time_limit(self) -> None:
        if self.time_limit is None:
            return
        if not self.sequential:
            raise ValueError("time_limit applies to sequential editing (sequential=True)")
        if isinstance(self.time_limit, bool) or not isinstance(self.time_limit, (int, float)) or self.time_limit < 0:
            raise ValueError(f"time_limit must be a number of seconds ≥ 0 or None, got {self.time_limit!r}")

    def check_cases(self, n: int) -> None:
        """Settings that depend on the number of cases ``n``: ``targets`` need one batch of all of them."""
        if self.targets is not None and self.batch_size not in (None, n):
            raise ValueError(
                f"targets are the target residuals of one batch of all the requests: batch_size must "
                f"be None (or {n}), got {self.batch_size}"
            )

    @classmethod
    def of(cls, *args: Any, **kwargs: Any) -> EvalConfig:
        """From ``evaluate_edits``' arguments: positional settings in the order of the fields, named
        settings, and every other keyword as an editor hyperparameter (``hparams``)."""
        names = [f.name for f in fields(cls) if f.name != "hparams"]
        if len(args) > len(names):
            raise TypeError(f"at most {len(names)} positional settings ({', '.join(names)}), got {len(args)}")
        given = dict(zip(names, args))
        twice = sorted(given.keys() & kwargs.keys())
        if twice:
            raise TypeError(f"settings given both by position and by name: {twice}")
        hparams = dict(kwargs.pop("hparams", None) or {})
        for k in [k for k in kwargs if k in names]:
            given[k] = kwargs.pop(k)
        return cls(**given, hparams=hparams | kwargs)


__all__ = ["DEFAULT_CHECKPOINTS", "EDIT_METHODS", "EvalConfig"]
