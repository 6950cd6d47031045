"""CounterFact-style evaluation of fact edits: the public face of :mod:`gpt2_interp.editing.evaluation`
(cases, metrics, editors, the loop and the result live there; see its module doc for what is measured).

>>> from gpt2_interp.editing.evaluate import counterfact_requests, evaluate_edits
>>> ev = evaluate_edits(model, counterfact_requests(n=20), method="rome")
>>> print(ev.table())
"""

from __future__ import annotations

from .evaluation import *  # noqa: F403 - the public names, re-exported
from .evaluation import __all__ as _names

__all__ = list(_names)
