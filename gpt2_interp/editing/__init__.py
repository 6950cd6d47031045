"""Weight editing: key statistics (``stats``), ROME (``rome``), the reversible ``Edit`` value
(``edit``) and CounterFact-style evaluation (``evaluate``).

>>> edit = compute_edit(model, {"prompt": "The capital of {} is", "subject": "France", "target": " Rome"})
>>> with model.edited(edit):
...     model.generate("The capital of France is")
"""

from .edit import Edit, Request, applied_edits, edited, load_edit, undo_all, weights_fingerprint
from .rome import DEFAULT_LAYERS, RomeHparams, apply_rome, compute_edit, rank_one_update
from .stats import KeyStats, key_second_moment

__all__ = [
    "Edit", "Request", "applied_edits", "edited", "load_edit", "undo_all", "weights_fingerprint",
    "DEFAULT_LAYERS", "RomeHparams", "apply_rome", "compute_edit", "rank_one_update",
    "KeyStats", "key_second_moment", "evaluate_edits", "counterfact_requests",
]


def __getattr__(name: str):  # evaluation pulls in the fact base; import it on first use
    if name in ("evaluate_edits", "counterfact_requests"):
        from . import evaluate

        return getattr(evaluate, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
