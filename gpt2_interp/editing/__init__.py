"""Weight editing: key statistics (``stats``), ROME (``rome``), MEMIT and AlphaEdit (``memit``), the
reversible ``Edit`` value (``edit``) and CounterFact-style evaluation (``evaluate``).

>>> edit = compute_edit(model, {"prompt": "The capital of {} is", "subject": "France", "target": " Rome"})
>>> with model.edited(edit):
...     model.generate("The capital of France is", do_sample=False)
>>> many = compute_edits(model, requests)                   # MEMIT: one Edit for a batch
>>> ns = NullSpace.from_stats(key_second_moment(model, [0]))
>>> first = compute_edits(model, batch1, preserve=ns)       # AlphaEdit: sequential batches
"""

from .edit import (
    Edit,
    EditFailedWarning,
    EditWarning,
    Request,
    TargetResiduals,
    TargetSpacingWarning,
    applied_edits,
    load_edit,
    undo_all,
    weights_fingerprint,
)
from .hparams import load_hparams
from .memit import MemitHparams, NullSpace, apply_memit, compute_edits
from .rome import apply_rome, compute_edit, rank_one_update
from .settings import DEFAULT_LAYERS, RomeHparams
from .stats import KeyStats, key_second_moment

__all__ = [
    "DEFAULT_LAYERS",
    "Edit",
    "EditFailedWarning",
    "EditWarning",
    "KeyStats",
    "MemitHparams",
    "NullSpace",
    "Request",
    "RomeHparams",
    "TargetResiduals",
    "TargetSpacingWarning",
    "applied_edits",
    "apply_memit",
    "apply_rome",
    "compute_edit",
    "compute_edits",
    "counterfact_requests",
    "evaluate_edits",
    "key_second_moment",
    "load_edit",
    "load_hparams",
    "rank_one_update",
    "undo_all",
    "weights_fingerprint",
]


def __getattr__(name: str):  # evaluation pulls in the fact base; import it on first use
    if name in ("evaluate_edits", "counterfact_requests"):
        from . import evaluate

        return getattr(evaluate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
