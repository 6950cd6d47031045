"""The common shape of every analysis result: tensors + labels, JSON, plot."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from .boundary import boundary


@boundary
def to_jsonable(x: Any) -> Any:
    """Tensors/arrays to nested lists (floats rounded to 6 significant digits), recursively."""
    if isinstance(x, torch.Tensor):
        x = x.detach().float().cpu().numpy() if x.is_floating_point() else x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return to_jsonable(x.tolist())
    if isinstance(x, float):
        return float(f"{x:.6g}")
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [to_jsonable(v) for v in x]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return to_jsonable(dataclasses.asdict(x))
    return x


#: The key under which :meth:`Result.to_dict` records the result's kind.
KIND_KEY = "result"


class Result:
    """Mixin for result dataclasses: ``to_dict()``, ``to_json(path=None)``, ``save(path)`` figure.

    Each result type declares its kind (``result_kind``, e.g. ``"lens"``, ``"patching"``), which
    :meth:`to_dict` writes under :data:`KIND_KEY`; readers of saved results (the views, ``gpt2-interp view``)
    find the view of a result by that name."""

    result_kind: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        """``{"result": kind}`` and the public fields (names not starting with ``_``) as JSON-ready values:
        tensors and arrays become nested lists, floats are rounded to 6 significant digits (:func:`to_jsonable`)."""
        assert dataclasses.is_dataclass(self), f"{type(self).__name__} must be a dataclass to be a Result"
        fields = {
            f.name: to_jsonable(getattr(self, f.name)) for f in dataclasses.fields(self) if not f.name.startswith("_")
        }
        return {KIND_KEY: self.result_kind, **fields} if self.result_kind else fields

    def to_json(self, path: str | Path | None = None, **kwargs: Any) -> str:
        """:meth:`to_dict` as JSON text (``indent=1`` unless ``kwargs`` for :func:`json.dumps` say
        otherwise); with ``path``, also written there (with a final newline). Returns the text."""
        text = json.dumps(self.to_dict(), **({"indent": 1} | kwargs))
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    def plot(self, **kwargs: Any):  # pragma: no cover - overridden
        """This result drawn as a :class:`matplotlib.figure.Figure` (the drawing function of
        :mod:`gpt2_interp.plots` for this kind of result; ``kwargs`` go to it). Results without a
        figure raise ``NotImplementedError``."""
        raise NotImplementedError

    def save_plot(self, path: str | Path, **kwargs: Any) -> Path:
        """Draw ``plot()`` and save it (PNG/PDF/SVG by suffix); returns the path. Figures are plain
        ``Figure`` objects (no pyplot state), so nothing needs closing."""
        self.plot(**kwargs).savefig(path, dpi=130, bbox_inches="tight")
        return Path(path)


#: What the views and other readers of results take: a result object, or its ``to_dict()`` (read back from JSON).
ResultLike = Result | Mapping[str, Any]
