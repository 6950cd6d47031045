"""A weight edit as a value: a rank-one change of one layer's ``W_out`` that can be applied,
undone bit-exactly, stacked, saved and loaded, and that refuses a model it was not made for.

``ΔW = outer(u, v)`` with ``u: [d_mlp]``, ``v: [d_model]``, added to
``blocks[layer].mlp.W_out: [d_mlp, d_model]`` (our layout is ``out = k @ W_out + b_out``,
so a key ``k`` gains ``(k · u) v``).

Bookkeeping is owned by this module (a weak map from model to its edit state, so the model class
knows nothing of edits): the state lists the applied edits in order and keeps, per edited layer, ONE copy of the layer's ``W_out`` as it was before the
first edit there. Undo restores that copy and replays the remaining edits of the layer in
order; since ``W.add_(outer(u, v))`` is a deterministic elementwise op, the result is
bit-identical to the state before the undone edit (checked against a digest recorded at
apply time). Memory: one ``W_out`` per edited layer, however many edits are stacked
(gpt2-xl: 6400 × 1600 × 4 B = 41 MB per layer).
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import torch

from ..core.finite import require_finite
from ..io.integrity import load_checked, save_checked
from ..model.fingerprint import parameter_digests, tensor_digest, weights_fingerprint

if TYPE_CHECKING:
    from ..model import HookedGPT2

FORMAT = "gpt2-interp-edit/1"


# ---------------------------------------------------------------- the request
@dataclass(frozen=True)
class Request:
    """What to write: ``prompt`` holds ``{}`` where ``subject`` goes, ``target`` is the new continuation.

    >>> Request("{} is located in the city of", "Eiffel Tower", " Rome")
    """

    prompt: str
    subject: str
    target: str

    def __post_init__(self) -> None:
        for name in ("prompt", "subject", "target"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(f"request {name} must be a string, got {type(getattr(self, name)).__name__}")
        if not self.subject.strip():
            raise ValueError("request subject is empty; give the entity to edit, e.g. 'Eiffel Tower'")
        if self.prompt.count("{}") != 1:
            hint = ""
            if "{}" not in self.prompt and self.subject in self.prompt:
                hint = f"; did you mean {self.prompt.replace(self.subject, '{}', 1)!r}?"
            elif "{}" not in self.prompt:
                hint = (f"; note the subject {self.subject!r} does not occur in the prompt either"
                        if self.subject not in self.prompt else "")
            raise ValueError(
                f"request prompt must contain '{{}}' exactly once, where the subject goes "
                f"(e.g. '{{}} is located in the city of'); got {self.prompt!r}{hint}"
            )
        if not self.target.strip():
            raise ValueError(f"request target {self.target!r} is empty; give the new continuation, e.g. ' Rome'")

    @property
    def text(self) -> str:
        """The rewrite prompt with the subject filled in."""
        return self.prompt.format(self.subject)

    @classmethod
    def of(cls, x: "Request | Mapping[str, Any]") -> "Request":
        """A Request from a Request or a dict with ``prompt``, ``subject``, ``target`` (or ROME's
        ``target_new`` as ``{"str": ...}`` or a string); other keys are ignored."""
        if isinstance(x, Request):
            return x
        if not isinstance(x, Mapping):
            raise TypeError(f"a request is a Request or a dict, got {type(x).__name__}")
        target = x.get("target")
        if target is None and x.get("target_new") is not None:
            target = x["target_new"]
            target = str(target.get("str") if isinstance(target, Mapping) else target)
            if target and not target.startswith(" "):
                target = " " + target  # ROME's CounterFact stores objects without the leading space
        missing = [k for k, v in (("prompt", x.get("prompt")), ("subject", x.get("subject")), ("target", target)) if v is None]
        if missing:
            raise ValueError(f"request dict lacks {missing}; give prompt ('{{}} …'), subject and target")
        return cls(str(x["prompt"]), str(x["subject"]), str(target))


# ---------------------------------------------------------------- the edit
@dataclass(eq=False)
class Edit:
    """A rank-one edit of ``blocks[layer].mlp.W_out``: ``ΔW = outer(u, v)``.

    ``u: [d_mlp]`` (unit norm, ∝ C⁻¹k*), ``v: [d_model]``; ``k: [d_mlp]`` is the key k* and
    ``v_star: [d_model]`` the MLP output the edited layer now gives for it. ``base_fingerprint``
    identifies the exact weights the edit was computed on (earlier edits included).
    """

    layer: int
    u: torch.Tensor
    v: torch.Tensor
    request: Request
    base_fingerprint: str
    k: torch.Tensor | None = None
    v_star: torch.Tensor | None = None
    hparams: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    model_name: str = ""
    shape: tuple[int, int] = (0, 0)  # (d_mlp, d_model) of the model it was made for

    def __post_init__(self) -> None:
        if self.u.ndim != 1 or self.v.ndim != 1:
            raise ValueError(f"u and v must be vectors, got shapes {tuple(self.u.shape)} and {tuple(self.v.shape)}")
        if self.shape == (0, 0):
            self.shape = (self.u.shape[0], self.v.shape[0])

    def __repr__(self) -> str:
        r = self.request
        return (f"Edit(layer={self.layer}, {r.text!r} → {r.target!r}, model={self.model_name!r}, "
                f"‖ΔW‖={float(self.u.norm() * self.v.norm()):.4g})")

    def delta(self, dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> torch.Tensor:
        """``ΔW = outer(u, v)``: ``[d_mlp, d_model]``."""
        d = torch.outer(self.u.float(), self.v.float())
        return d.to(device=device or self.u.device, dtype=dtype or torch.float32)

    # ------------------------------------------------------------ apply / undo
    def _check_shape(self, model: "HookedGPT2") -> None:
        n = model.cfg.n_layer
        if not 0 <= self.layer < n:
            raise IndexError(f"edit layer {self.layer} is out of range for a model with {n} layers (0..{n - 1})")
        want = (model.cfg.d_mlp, model.cfg.d_model)
        if tuple(self.shape) != want:
            raise ValueError(f"edit is for W_out of shape {tuple(self.shape)} ({self.model_name}), "
                             f"this model's is {want} ({model.cfg.name})")

    def check(self, model: "HookedGPT2") -> None:
        """Raise unless ``model`` has exactly the weights this edit was computed on."""
        self._check_shape(model)
        fp = weights_fingerprint(model)
        if fp != self.base_fingerprint:
            raise ValueError(
                f"this edit was computed on a model with weights fingerprint {self.base_fingerprint[:12]} "
                f"({self.model_name}), but this model's weights have fingerprint {fp[:12]} ({model.cfg.name}). "
                "Apply it to the model it was computed on, with the same earlier edits applied in the same "
                "order (see gpt2_interp.editing.applied_edits(model))."
            )

    def apply(self, model: "HookedGPT2", verify: bool = True) -> "Edit":
        """Add ``ΔW`` to the model's ``W_out`` in place and push the edit on the model's stack.

        ``verify`` checks the base weights first (one hash of the weights); pass False only when
        you just computed the edit on this very model."""
        if verify:
            self.check(model)
        else:
            self._check_shape(model)
        W = model.blocks[self.layer].mlp.W_out
        stack, originals = _stack(model), _originals(model)
        if self.layer not in originals:
            originals[self.layer] = W.detach().clone()
        with torch.no_grad():
            W.add_(self.delta(W.dtype, W.device))
        stack.append(_Applied(self, tensor_digest(W)))
        return self

    def undo(self, model: "HookedGPT2", out_of_order: bool = False) -> None:
        """Remove this edit, restoring ``W_out`` bit-exactly to the state without it.

        Edits are undone last-in first-out. ``out_of_order=True`` removes an edit that has others
        applied after it: the layer is rebuilt from its original weights by replaying the other
        edits in order, which is bit-identical to never having applied this one — but note the
        later edits were *computed* on a model that contained it."""
        stack = _stack(model)
        idx = [i for i, a in enumerate(stack) if a.edit is self]
        if not idx:
            raise ValueError(f"{self!r} is not applied to this model; applied: {applied_edits(model)}")
        i = idx[-1]
        later = stack[i + 1 :]
        if later and not out_of_order:
            raise ValueError(
                f"cannot undo {self!r} out of order: {len(later)} edit(s) were applied after it "
                f"(undo them first, last-in first-out, or use undo_all(model); pass out_of_order=True "
                "to remove it anyway and replay the later edits)"
            )
        W = model.blocks[self.layer].mlp.W_out
        same = [a for a in stack if a.edit.layer == self.layer]
        if tensor_digest(W) != same[-1].digest:
            raise RuntimeError(
                f"W_out of layer {self.layer} was changed outside the edit API since the last edit there was "
                "applied; it cannot be restored bit-exactly. Reload the model."
            )
        del stack[i]
        _rebuild(model, self.layer, check_digests=not later)

    # ------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        """Write the edit as one safetensors file (tensors + a JSON header; no pickle)."""
        return save_edit(self, path)

    @staticmethod
    def load(path: str | Path, model: "HookedGPT2 | None" = None) -> "Edit":
        """Read an edit file; with ``model``, refuse it unless the model has the edit's base weights."""
        return load_edit(path, model)


@dataclass
class _Applied:
    edit: Edit
    digest: str  # digest of W_out[layer] right after this edit was applied


@dataclass
class _EditState:
    stack: list[_Applied] = field(default_factory=list)  # applied edits, oldest first
    originals: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> W_out before its first edit


_STATE: "weakref.WeakKeyDictionary[HookedGPT2, _EditState]" = weakref.WeakKeyDictionary()


def _state(model: "HookedGPT2") -> _EditState:
    if model not in _STATE:
        _STATE[model] = _EditState()
    return _STATE[model]


def _stack(model: "HookedGPT2") -> list[_Applied]:
    return _state(model).stack


def _originals(model: "HookedGPT2") -> dict[int, torch.Tensor]:
    return _state(model).originals


def original_weights(model: "HookedGPT2") -> dict[int, torch.Tensor]:
    """``{layer: W_out}`` as it was before the first applied edit there (edited layers only); read-only use."""
    return dict(_originals(model))


@torch.no_grad()
def _rebuild(model: "HookedGPT2", layer: int, check_digests: bool) -> None:
    """Restore ``W_out[layer]`` from its original and replay the stack's edits there, in order."""
    W = model.blocks[layer].mlp.W_out
    originals = _originals(model)
    W.copy_(originals[layer])
    entries = [a for a in _stack(model) if a.edit.layer == layer]
    for a in entries:
        W.add_(a.edit.delta(W.dtype, W.device))
        d = tensor_digest(W)
        if check_digests and d != a.digest:  # pragma: no cover - would mean a non-deterministic add
            raise RuntimeError(f"replaying the edits of layer {layer} did not reproduce the recorded weights")
        a.digest = d
    if not entries:
        del originals[layer]


def applied_edits(model: "HookedGPT2") -> list[Edit]:
    """The edits applied to ``model``, oldest first."""
    return [a.edit for a in _stack(model)]


@torch.no_grad()
def undo_all(model: "HookedGPT2") -> int:
    """Undo every applied edit at once (restores each edited layer's original ``W_out``);
    returns how many were undone."""
    stack, originals = _stack(model), _originals(model)
    n = len(stack)
    for layer in list(originals):
        last = [a for a in stack if a.edit.layer == layer][-1]
        W = model.blocks[layer].mlp.W_out
        if tensor_digest(W) != last.digest:
            raise RuntimeError(f"W_out of layer {layer} was changed outside the edit API; reload the model")
        W.copy_(originals.pop(layer))
    stack.clear()
    return n


@contextmanager
def edited(model: "HookedGPT2", *edits: Edit, verify: bool = True) -> Iterator["HookedGPT2"]:
    """Apply ``edits`` (in order) for the ``with`` block; they are undone bit-exactly on exit."""
    done: list[Edit] = []
    try:
        for e in edits:
            done.append(e.apply(model, verify=verify))
        yield model
    finally:
        for e in reversed(done):
            e.undo(model)


# ---------------------------------------------------------------- save / load
def save_edit(edit: Edit, path: str | Path) -> Path:
    """One safetensors file: tensors ``u, v[, k, v_star]`` + a JSON header (no pickle), with a sha256
    digest over every tensor and the header (see :mod:`gpt2_interp.io.integrity`), checked at load."""
    tensors = {"u": edit.u, "v": edit.v}
    if edit.k is not None:
        tensors["k"] = edit.k
    if edit.v_star is not None:
        tensors["v_star"] = edit.v_star
    meta = {
        "layer": edit.layer, "request": asdict(edit.request), "base_fingerprint": edit.base_fingerprint,
        "hparams": edit.hparams, "metrics": edit.metrics, "model_name": edit.model_name,
        "shape": list(edit.shape), "saved": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return save_checked(path, tensors, {"format": FORMAT, "edit": json.dumps(meta, default=_json_default)})


def load_edit(path: str | Path, model: "HookedGPT2 | None" = None) -> Edit:
    """Read an edit written by :func:`save_edit`; with ``model``, also check it fits that model.

    Refuses (``IntegrityError``, a ``ValueError``, naming the file) a file whose tensors or header
    changed after it was saved, a truncated file, and non-finite tensors; a file from before
    digests existed loads with an ``UnverifiedFileWarning``."""
    path = Path(path)
    tensors, header, _ = load_checked(path, kind="edit")
    if header.get("format") != FORMAT:
        raise ValueError(f"{path} is a safetensors file but not a gpt2-interp edit (format {header.get('format')!r}, "
                         f"expected {FORMAT!r})")
    try:
        meta = json.loads(header["edit"])
        for name in ("u", "v"):
            if name not in tensors:
                raise KeyError(name)
        edit = Edit(
            layer=int(meta["layer"]), u=tensors["u"], v=tensors["v"], request=Request(**meta["request"]),
            base_fingerprint=meta["base_fingerprint"], k=tensors.get("k"), v_star=tensors.get("v_star"),
            hparams=meta.get("hparams", {}), metrics=meta.get("metrics", {}), model_name=meta.get("model_name", ""),
            shape=tuple(meta.get("shape", (0, 0))),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path} is not a valid edit file: its header or tensors are incomplete ({type(e).__name__}: {e})") from None
    for name, t in tensors.items():
        require_finite(t, f"tensor {name!r} of the edit file {path}", "the edit was computed from non-finite values")
    if model is not None:
        edit.check(model)
        edit.u, edit.v = edit.u.to(model.device), edit.v.to(model.device)
    return edit


def _json_default(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, (tuple, set)):
        return list(x)
    return str(x)
