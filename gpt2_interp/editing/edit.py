"""A weight edit as a value: a change of one or several layers' ``W_out`` that can be applied,
undone bit-exactly, stacked, saved and loaded, and that refuses a model it was not made for.

Per edited layer ``l``, ``ΔW_l = U_l @ V_l`` with ``U_l: [d_mlp, r]``, ``V_l: [r, d_model]``
(low rank) or ``ΔW_l`` stored densely ``[d_mlp, d_model]``, added to
``blocks[l].mlp.W_out: [d_mlp, d_model]`` (our layout is ``out = k @ W_out + b_out``, so a key
``k`` gains ``k @ ΔW_l``). A ROME edit is the rank-one, one-layer case ``ΔW = outer(u, v)``
(``u: [d_mlp]``, ``v: [d_model]``; ``edit.layer``, ``edit.u``, ``edit.v``); a MEMIT edit covers
several layers and requests (``edit.layers``, ``edit.requests``).

Bookkeeping is owned by this module (a weak map from model to its edit state, so the model class
knows nothing of edits): the state lists the applied edits in order and keeps, per edited layer, ONE
copy of the layer's ``W_out`` as it was before the first edit there. Undo restores that copy and
replays the remaining edits of the layer in order; each edit adds the same ``ΔW`` tensor every time
(rank one: ``outer(u, v)``, elementwise; higher rank: ``U @ V`` materialised once and kept), and
``W.add_`` is deterministic, so the result is bit-identical to the state before the undone edit
(checked against digests recorded at apply time). Memory: one ``W_out`` per edited layer, however
many edits are stacked (gpt2-xl: 6400 × 1600 × 4 B = 41 MB per layer), plus one ``ΔW`` per layer of
each applied edit of rank > 1.

Files are safetensors (no pickle) with a JSON header and a sha256 over header and tensors, checked at
load: a truncated or altered file is refused.
"""

from __future__ import annotations

import json
import time
import warnings
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from ..core.boundary import boundary
from ..core.finite import require_finite
from ..io.integrity import load_checked, save_checked
from ..model.fingerprint import tensor_digest, weights_fingerprint

if TYPE_CHECKING:
    from ..model import HookedGPT2

FORMAT = "gpt2-interp-edit/2"
FORMATS_READ = ("gpt2-interp-edit/1", FORMAT)


# ---------------------------------------------------------------- the request
@boundary
@dataclass(frozen=True)
class Request:
    """What to write: ``prompt`` holds ``{}`` where ``subject`` goes, ``target`` is the new continuation.

    ``keep`` (optional): prompts about the same subject (``{}`` where it goes) whose next-token
    prediction the edit must leave as it is — the subject's OTHER attributes. The δ optimisation then
    also minimises the KL of those predictions (``RomeHparams.keep_factor``), so that writing one
    relation does not rewrite the rest of what the model says about the subject.

    >>> Request("{} is located in the city of", "Eiffel Tower", " Rome")
    >>> Request("The capital of {} is", "Norway", " Madrid", keep=("The official language of {} is",))
    """

    prompt: str
    subject: str
    target: str
    keep: Sequence[str] = ()  # stored as a tuple

    def __post_init__(self) -> None:
        for name in ("prompt", "subject", "target"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"request {name} must be a string, got {type(value).__name__} {value!r:.40}")
        if isinstance(self.keep, (str, bytes)):
            raise TypeError(
                f"request keep must be a list of prompt templates, got a str ({self.keep!r:.60}); wrap it in a list"
            )
        if not isinstance(self.keep, (list, tuple)) or not all(isinstance(k, str) for k in self.keep):
            raise TypeError(f"request keep must be a list of prompt templates (strings), got {self.keep!r:.60}")
        object.__setattr__(self, "keep", tuple(self.keep))
        bad = [k for k in self.keep if k.count("{}") != 1]
        if bad:
            raise ValueError(
                f"request keep prompts must contain '{{}}' exactly once, where the subject goes; got {bad}"
            )
        if not self.subject.strip():
            raise ValueError("request subject is empty; give the entity to edit, e.g. 'Eiffel Tower'")
        if self.prompt.count("{}") != 1:
            hint = ""
            if "{}" not in self.prompt and self.subject in self.prompt:
                hint = f"; did you mean {self.prompt.replace(self.subject, '{}', 1)!r}?"
            elif "{}" not in self.prompt:
                hint = (
                    f"; note the subject {self.subject!r} does not occur in the prompt either"
                    if self.subject not in self.prompt
                    else ""
                )
            raise ValueError(
                f"request prompt must contain '{{}}' exactly once, where the subject goes "
                f"(e.g. '{{}} is located in the city of'); got {self.prompt!r}{hint}"
            )
        if not self.target.strip():
            raise ValueError(f"request target {self.target!r} is empty; give the new continuation, e.g. ' Rome'")
        if self.prompt in self.keep:
            raise ValueError(
                f"request keep holds the rewrite prompt itself ({self.prompt!r}): the edit cannot both "
                "change and keep its next token; drop it from keep"
            )

    @property
    def text(self) -> str:
        """The rewrite prompt with the subject filled in."""
        return self.prompt.format(self.subject)

    @classmethod
    def of(cls, x: Request | Mapping[str, Any], index: int | None = None) -> Request:
        """A Request from a Request or a dict with ``prompt``, ``subject``, ``target`` (or ROME's
        ``target_new`` as ``{"str": ...}`` or a string) and optionally ``keep``; other keys are ignored.
        Values are not coerced: a non-string field raises. ``index``: the request's position in a list,
        named in the error."""
        try:
            return cls._from(x)
        except (TypeError, ValueError) as e:
            if index is None:
                raise
            raise type(e)(f"request {index}: {e}") from None

    @classmethod
    def _from(cls, x: Request | Mapping[str, Any]) -> Request:
        if isinstance(x, Request):
            return x
        if not isinstance(x, Mapping):
            raise TypeError(f"a request is a Request or a dict, got {type(x).__name__} {x!r:.40}")
        target = x.get("target")
        if target is None and x.get("target_new") is not None:
            target = x["target_new"]
            target = target.get("str") if isinstance(target, Mapping) else target
            if isinstance(target, str) and target and not target.startswith(" "):
                target = " " + target  # ROME's CounterFact stores objects without the leading space
        given = {"prompt": x.get("prompt"), "subject": x.get("subject"), "target": target}
        missing = [k for k in given if k not in x and not (k == "target" and target is not None)]
        if missing:
            raise ValueError(f"request dict lacks {missing}; give prompt ('{{}} …'), subject and target")
        keep = x.get("keep")
        # target: a string unless given as None (the constructor refuses that)
        return cls(x["prompt"], x["subject"], cast(str, target), () if keep is None else keep)


#: An edit of a request is reported as weak (``edit.metrics["weak"]``, the CLI's tables) when
#: P(target | rewrite prompt) after the edit is below ``WEAK_EDIT_P_AFTER`` and rose by less than
#: ``WEAK_EDIT_GAIN``: the edit hardly moved the model toward the target. Whether it took is
#: :data:`EDIT_TOOK_RULE` (an edit can take and be weak: a target already the answer before it).
WEAK_EDIT_GAIN = 0.1
WEAK_EDIT_P_AFTER = 0.5


class EditWarning(UserWarning):
    """An edit that may not do what was asked: a duplicate request, an update that is (near) zero, a
    target that barely moved, a target spelling unlikely to follow its prompt, an edit that did not take."""


class TargetSpacingWarning(EditWarning):
    """Raised before any work: a target whose first token, as written, is unlikely to follow its prompt
    (:data:`TARGET_SPACING_RULE`)."""


class EditFailedWarning(EditWarning):
    """Raised after an edit is computed: the target did not become the model's answer (:data:`EDIT_TOOK_RULE`)."""


#: When a request's target is reported as unlikely as written (a :class:`TargetSpacingWarning`, before any work).
TARGET_SPACING_RULE = (
    "neither the prompt ends nor the target starts with whitespace, the target with a leading space "
    "starts with another token, and the model gives that token a higher probability after the prompt "
    "than the target's own first token"
)

#: When an edit of a request took (``edit.took``, ``edit.failed``; an :class:`EditFailedWarning` otherwise).
EDIT_TOOK_RULE = (
    "the edited model's greedy continuation of the rewrite prompt is the target (each target token is the "
    "top-1 next token after the prompt and the target tokens before it)"
)


def report_failed(
    requests: Iterable[Request],
    took: Iterable[bool],
    p_before: Iterable[float],
    p_after: Iterable[float],
    top1_after: Iterable[str],
    stacklevel: int = 3,
) -> list[int]:
    """Indices of the requests whose edit did not take (:data:`EDIT_TOOK_RULE`), with one
    :class:`EditFailedWarning` naming them: P(target) before → after and what the model says instead."""
    reqs, ok, before, after, top = list(requests), list(took), list(p_before), list(p_after), list(top1_after)
    failed = [i for i, t in enumerate(ok) if not t]
    if failed:
        shown = "; ".join(
            f"request {i} ({reqs[i].text!r} → {reqs[i].target!r}): P(target) {before[i]:.4f} → {after[i]:.4f}, "
            f"top-1 now {top[i]!r}"
            for i in failed[:5]
        )
        more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
        warnings.warn(
            f"{len(failed)} of {len(reqs)} edits did not take (the edited model does not answer with the "
            f"target): {shown}{more}. Check the target's spelling (a leading space?), or try more δ steps "
            "(v_steps), another layer, or a larger clamp_factor",
            EditFailedWarning,
            stacklevel=stacklevel,
        )
    return failed


def is_weak(p_before: float, p_after: float) -> bool:
    """Whether an edit moving P(target) from ``p_before`` to ``p_after`` is weak (see :data:`WEAK_EDIT_GAIN`)."""
    return p_after < WEAK_EDIT_P_AFTER and p_after - p_before < WEAK_EDIT_GAIN


# ---------------------------------------------------------------- the edit
Factor = tuple[torch.Tensor, "torch.Tensor | None"]  # (U [d_mlp, r], V [r, d_model]) or (ΔW [d_mlp, d_model], None)


@boundary
class Edit:
    """A change of ``blocks[l].mlp.W_out`` for each layer ``l`` in ``edit.layers``: ``ΔW_l = U @ V``.

    Two constructors say which kind is built:

    * :meth:`rank_one` (ROME, one layer): ``Edit.rank_one(layer, u, v, request, base_fingerprint, k=…,
      v_star=…)`` with ``ΔW = outer(u, v)``, ``u: [d_mlp]`` (unit norm, ∝ C⁻¹k*), ``v: [d_model]``; ``k`` is
      the key k* and ``v_star`` the MLP output the edited layer now gives for it;
    * :meth:`factored` (MEMIT, AlphaEdit: several layers and requests): ``Edit.factored({l: (U, V)},
      requests, base_fingerprint, keys={l: K})`` with ``U: [d_mlp, r]``, ``V: [r, d_model]``, or
      ``(ΔW_l, None)`` dense; ``keys[l]: [n, d_mlp]`` are the edited keys. ``Edit(factors, …)`` is the same.

    ``base_fingerprint`` identifies the exact weights the edit was computed on (earlier edits included).
    ``hparams`` and ``metrics``: what the edit was computed with and measured at (JSON-ready dicts;
    ``metrics["weak"]`` lists weak requests); ``model_name``: the model's name (shown in errors);
    ``shape``: the edited ``W_out`` shape ``(d_mlp, d_model)`` (default: from the factors);
    ``method``: ``"rome"``, ``"memit"`` or ``"alphaedit"`` (default: ``"rome"`` for a rank-one
    one-layer edit, else ``"memit"``).

    Refused (ValueError): no layer, factors of mismatched shapes, non-vector ``u``/``v``; requests are
    checked as :meth:`Request.of` checks them.
    """

    def __init__(
        self,
        factors: Mapping[int, Factor],
        requests: Iterable[Request] = (),
        base_fingerprint: str = "",
        *,
        keys: Mapping[int, torch.Tensor] | None = None,
        k: torch.Tensor | None = None,
        v_star: torch.Tensor | None = None,
        hparams: dict[str, Any] | None = None,
        metrics: dict[str, Any] | None = None,
        model_name: str = "",
        shape: tuple[int, int] = (0, 0),
        method: str | None = None,
    ) -> None:
        if not factors:
            raise ValueError("an Edit needs at least one layer in factors")
        self.factors: dict[int, Factor] = {}
        for lay, (U, V) in factors.items():
            if U.ndim != 2 or (V is not None and (V.ndim != 2 or V.shape[0] != U.shape[1])):
                raise ValueError(
                    f"layer {lay}: factors must be U [d_mlp, r] and V [r, d_model] (or V None for a "
                    f"dense ΔW), got {tuple(U.shape)} and {None if V is None else tuple(V.shape)}"
                )
            self.factors[int(lay)] = (U, V)
        self.requests: list[Request] = [Request.of(r) for r in requests]
        self.base_fingerprint = base_fingerprint
        self.k, self.v_star = k, v_star
        self.keys: dict[int, torch.Tensor] = dict(keys or {})
        self.hparams: dict[str, Any] = dict(hparams or {})
        self.metrics: dict[str, Any] = dict(metrics or {})
        self.model_name = model_name
        self.method = method or ("rome" if self.is_rank_one else "memit")
        if tuple(shape) == (0, 0):
            U, V = next(iter(self.factors.values()))
            shape = (U.shape[0], U.shape[1] if V is None else V.shape[1])
        self.shape = tuple(int(x) for x in shape)
        self._dense: dict[int, torch.Tensor] = {}  # layer -> materialised ΔW (rank > 1 only)

    @classmethod
    def rank_one(
        cls,
        layer: int,
        u: torch.Tensor,
        v: torch.Tensor,
        request: Request | None = None,
        base_fingerprint: str = "",
        **fields: Any,
    ) -> Edit:
        """The rank-one edit ``ΔW = outer(u, v)`` of one ``layer`` (``u: [d_mlp]``, ``v: [d_model]``) for one
        ``request``, computed on the weights ``base_fingerprint`` identifies; ``fields``: the keyword fields of
        :class:`Edit` (``k``, ``v_star``, ``hparams``, …)."""
        if u.ndim != 1 or v.ndim != 1:
            raise ValueError(f"u and v must be vectors, got shapes {tuple(u.shape)} and {tuple(v.shape)}")
        requests = [request] if request is not None else []
        return cls({int(layer): (u[:, None], v[None, :])}, requests, base_fingerprint, **fields)

    @classmethod
    def factored(
        cls,
        factors: Mapping[int, Factor],
        requests: Iterable[Request] = (),
        base_fingerprint: str = "",
        **fields: Any,
    ) -> Edit:
        """The edit ``ΔW_l = U_l @ V_l`` (or a dense ``(ΔW_l, None)``) of each layer in ``factors``, for
        ``requests``, computed on the weights ``base_fingerprint`` identifies; ``fields``: the keyword fields of
        :class:`Edit` (``keys``, ``hparams``, …)."""
        return cls(factors, requests, base_fingerprint, **fields)

    # ------------------------------------------------------------ views
    @property
    def label(self) -> str:
        """The method and the mode that produced the edit: ``"memit"``, or ``"memit (paper)"`` when its
        hyperparameters came from the ``"paper"`` preset (the authors' algorithm)."""
        preset = self.hparams.get("preset")
        if preset is None and isinstance(self.hparams.get("rome"), dict):
            preset = self.hparams["rome"].get("preset")
        return self.method if not preset else f"{self.method} ({preset})"

    @property
    def layers(self) -> list[int]:
        """The edited layers, ascending."""
        return sorted(self.factors)

    @property
    def is_rank_one(self) -> bool:
        """Whether this is a rank-one edit of one layer (a ROME edit: :attr:`u` and :attr:`v` exist)."""
        return len(self.factors) == 1 and all(V is not None and U.shape[1] == 1 for U, V in self.factors.values())

    @property
    def layer(self) -> int:
        """The edited layer of a one-layer edit."""
        if len(self.factors) != 1:
            raise ValueError(f"this edit changes layers {self.layers}; use edit.layers")
        return next(iter(self.factors))

    @layer.setter
    def layer(self, value: int) -> None:
        (f,) = self.factors.values() if len(self.factors) == 1 else (None,)
        if f is None:
            raise ValueError(f"this edit changes layers {self.layers}; set factors instead")
        self.factors = {int(value): f}
        self._dense.clear()

    def _rank_one(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_rank_one:
            raise ValueError(
                f"u and v exist for rank-one one-layer edits; this one has layers {self.layers} "
                f"of rank {[self.rank(l) for l in self.layers]}: use edit.factors or edit.delta(layer)"
            )
        U, V = next(iter(self.factors.values()))
        assert V is not None, "a rank-one edit keeps its factors (U, V), not a dense ΔW"
        return U[:, 0], V[0]

    @property
    def u(self) -> torch.Tensor:
        """``u`` ``[d_mlp]`` of a rank-one edit ``ΔW = outer(u, v)`` (ValueError for any other edit)."""
        return self._rank_one()[0]

    @property
    def v(self) -> torch.Tensor:
        """``v`` ``[d_model]`` of a rank-one edit ``ΔW = outer(u, v)`` (ValueError for any other edit)."""
        return self._rank_one()[1]

    @property
    def failed(self) -> list[int] | None:
        """Indices (into ``edit.requests``) of the requests whose edit did not take (:data:`EDIT_TOOK_RULE`),
        measured when the edit was computed; None for an edit that does not record it (an older file)."""
        took = self.metrics.get("took")
        if took is None:
            return None
        return [i for i, t in enumerate([took] if isinstance(took, bool) else took) if not t]

    @property
    def succeeded(self) -> bool | None:
        """Whether every request's edit took (:data:`EDIT_TOOK_RULE`); None when not recorded."""
        failed = self.failed
        return None if failed is None else not failed

    @property
    def request(self) -> Request:
        """The request of a one-request edit."""
        if len(self.requests) != 1:
            raise ValueError(f"this edit holds {len(self.requests)} requests; use edit.requests")
        return self.requests[0]

    def rank(self, layer: int) -> int:
        """The rank of ``ΔW`` at ``layer``: ``r`` of ``U [d_mlp, r]``, or an upper bound ``min(d_mlp, d_model)``
        for a dense ``ΔW``; a layer the edit does not change raises KeyError."""
        U, V = self.factors[layer]
        return int(U.shape[1]) if V is not None else int(min(U.shape))

    def __len__(self) -> int:
        return len(self.requests)

    def __repr__(self) -> str:
        if len(self.requests) == 1 and len(self.factors) == 1:
            r = self.request
            return (
                f"Edit({self.label}, layer={self.layer}, {r.text!r} → {r.target!r}, model={self.model_name!r}, "
                f"‖ΔW‖={float(self.delta(self.layer).norm()):.4g})"
            )
        norms = ", ".join(f"{l}: {float(self.delta(l).norm()):.3g}" for l in self.layers)
        return (
            f"Edit({self.label}, {len(self.requests)} requests, layers {self.layers}, "
            f"model={self.model_name!r}, ‖ΔW‖ per layer {{{norms}}})"
        )

    def delta(
        self, layer: int | None = None, dtype: torch.dtype | None = None, device: torch.device | str | None = None
    ) -> torch.Tensor:
        """``ΔW`` of ``layer`` (the only layer when None): ``[d_mlp, d_model]``.

        Rank one: ``outer(u, v)`` (elementwise, recomputed bit-identically). Higher rank: ``U @ V``
        in float64, materialised once and kept, so that every replay adds the very same tensor.
        Returned in ``dtype`` (default float32) on ``device`` (default: the factors'). A layer the
        edit does not change raises KeyError; None for a several-layer edit raises ValueError."""
        layer = self.layer if layer is None else layer
        if layer not in self.factors:
            raise KeyError(f"this edit does not change layer {layer}; its layers: {self.layers}")
        U, V = self.factors[layer]
        if V is None:
            d = U.float()
        elif U.shape[1] == 1:
            d = torch.outer(U[:, 0].float(), V[0].float())
        else:
            if layer not in self._dense:
                self._dense[layer] = (U.double() @ V.double()).float()
            d = self._dense[layer]
        return d.to(device=device or U.device, dtype=dtype or torch.float32)

    # ------------------------------------------------------------ apply / undo
    def _check_shape(self, model: HookedGPT2) -> None:
        n = model.cfg.n_layer
        for lay in self.layers:
            if not 0 <= lay < n:
                raise IndexError(f"edit layer {lay} is out of range for a model with {n} layers (0..{n - 1})")
        want = (model.cfg.d_mlp, model.cfg.d_model)
        if tuple(self.shape) != want:
            raise ValueError(
                f"edit is for W_out of shape {tuple(self.shape)} ({self.model_name}), "
                f"this model's is {want} ({model.cfg.name})"
            )

    def check(self, model: HookedGPT2) -> None:
        """Raise unless ``model`` has exactly the weights this edit was computed on: an edited layer out of
        range raises IndexError; another ``W_out`` shape or another weights fingerprint ValueError."""
        self._check_shape(model)
        fp = weights_fingerprint(model)
        if fp != self.base_fingerprint:
            raise ValueError(
                f"this edit was computed on a model with weights fingerprint {self.base_fingerprint[:12]} "
                f"({self.model_name}), but this model's weights have fingerprint {fp[:12]} ({model.cfg.name}). "
                "Apply it to the model it was computed on, with the same earlier edits applied in the same "
                "order (see gpt2_interp.editing.applied_edits(model))."
            )

    def apply(self, model: HookedGPT2, verify: bool = True) -> Edit:
        """Add each layer's ``ΔW`` to the model's ``W_out`` in place and push the edit on the model's stack.

        ``verify`` (default True) checks the base weights first (one hash of the weights; see
        :meth:`check`); pass False only when you just computed the edit on this very model (the
        shapes are still checked). A non-finite factor raises ValueError before any weight changes.
        Returns the edit itself."""
        if verify:
            self.check(model)
        else:
            self._check_shape(model)
        self.require_finite("apply")
        stack, originals = _stack(model), _originals(model)
        digests = {}
        for lay in self.layers:
            W = model.blocks[lay].mlp.W_out
            if lay not in originals:
                originals[lay] = W.detach().clone()
            with torch.no_grad():
                W.add_(self.delta(lay, W.dtype, W.device))
            digests[lay] = tensor_digest(W)
        stack.append(_Applied(self, digests))
        return self

    def undo(self, model: HookedGPT2, out_of_order: bool = False) -> None:
        """Remove this edit, restoring each ``W_out`` it changed bit-exactly to the state without it.

        Edits are undone last-in first-out. ``out_of_order=True`` removes an edit that has others
        applied after it: each layer is rebuilt from its original weights by replaying the other
        edits in order, which is bit-identical to never having applied this one — but note the
        later edits were *computed* on a model that contained it.

        Refused: an edit that is not applied to ``model``, or one with later edits without
        ``out_of_order`` (ValueError); a ``W_out`` changed outside the edit API since the last edit
        there (RuntimeError: it cannot be restored bit-exactly)."""
        stack = _stack(model)
        idx = [i for i, a in enumerate(stack) if a.edit is self]
        if not idx:
            shown = applied_edits(model)
            raise ValueError(
                f"{self!r} is not applied to this model; applied: {shown if len(shown) <= 5 else f'{len(shown)} edits'}"
            )
        i = idx[-1]
        later = stack[i + 1 :]
        if later and not out_of_order:
            raise ValueError(
                f"cannot undo {self!r} out of order: {len(later)} edit(s) were applied after it "
                f"(undo them first, last-in first-out, or use undo_all(model); pass out_of_order=True "
                "to remove it anyway and replay the later edits)"
            )
        for lay in self.layers:
            W = model.blocks[lay].mlp.W_out
            last = [a for a in stack if lay in a.digests][-1]
            if tensor_digest(W) != last.digests[lay]:
                raise RuntimeError(
                    f"W_out of layer {lay} was changed outside the edit API since the last edit there was "
                    "applied; it cannot be restored bit-exactly. Reload the model."
                )
        del stack[i]
        for lay in self.layers:
            _rebuild(model, lay, check_digests=not later)

    def require_finite(self, action: str = "use") -> None:
        """Raise, naming the layer and tensor, unless every factor (and key, k*, v*) is finite: a NaN or
        inf factor would write NaN into ``W_out``."""
        named: list[tuple[str, torch.Tensor]] = []
        for lay, (U, V) in self.factors.items():
            named += [(f"factor U of layer {lay}", U)] + ([] if V is None else [(f"factor V of layer {lay}", V)])
        named += [(f"edited keys of layer {lay}", K) for lay, K in self.keys.items()]
        named += [(name, t) for name, t in (("k*", self.k), ("v*", self.v_star)) if t is not None]
        for name, t in named:
            require_finite(
                t,
                f"cannot {action} this edit: its {name}",
                "it was computed from non-finite values (check the hyperparameters and key statistics)",
            )

    @property
    def targets(self) -> TargetResiduals:
        """The target residuals of a MEMIT/AlphaEdit edit (``v_star``) with what they were computed for,
        to re-solve the same batch under other settings: ``compute_edits(…, targets=edit.targets)``."""
        if self.method not in ("memit", "alphaedit") or self.v_star is None or self.v_star.ndim != 2:
            raise ValueError(f"target residuals come from a MEMIT/AlphaEdit edit; this one is {self.method!r}")
        return TargetResiduals(self.v_star, self.layers[-1], self.base_fingerprint, tuple(self.requests))

    # ------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        """Write the edit as one safetensors file at ``path`` (tensors + a JSON header + a digest; no
        pickle) and return the path; :func:`load_edit` reads it. A non-finite tensor raises ValueError."""
        return _write(self, path)

    @staticmethod
    def load(path: str | Path, model: HookedGPT2 | None = None) -> Edit:
        """Read an edit file; with ``model``, refuse it unless the model has the edit's base weights
        (see :func:`load_edit`)."""
        return load_edit(path, model)


@boundary
@dataclass(frozen=True)
class TargetResiduals:
    """MEMIT's target residuals ``z: [n, d_model]`` after the top edit ``layer``, with the weights
    ``fingerprint`` of the model and the ``requests`` they were computed for: handed back to
    ``compute_edits(targets=…)`` they are refused for another model or other requests.
    ``targets[idx]`` selects requests (an int list, a slice or an index tensor)."""

    z: torch.Tensor
    layer: int
    fingerprint: str
    requests: tuple[Request, ...]

    def __len__(self) -> int:
        return len(self.requests)

    def __getitem__(self, idx: Any) -> TargetResiduals:
        rows = (
            list(range(len(self.requests)))[idx]
            if isinstance(idx, slice)
            else [int(i) for i in (idx.tolist() if isinstance(idx, torch.Tensor) else idx)]
        )
        return TargetResiduals(self.z[rows], self.layer, self.fingerprint, tuple(self.requests[i] for i in rows))

    def check(self, fingerprint: str, requests: list[Request], layer: int, d_model: int) -> None:
        """Raise, saying which, unless these targets fit a batch of ``requests`` with top layer ``layer``
        on a model with weights ``fingerprint`` and width ``d_model``."""
        if tuple(self.z.shape) != (len(self.requests), d_model):
            raise ValueError(
                f"targets must be [n_requests, d_model] = [{len(self.requests)}, {d_model}], got {list(self.z.shape)}"
            )
        if self.fingerprint != fingerprint:
            raise ValueError(
                f"the targets were computed on a model with weights {self.fingerprint[:12]}, this model "
                f"has {fingerprint[:12]}: compute them on this model (with the same earlier edits)"
            )
        if self.layer != layer:
            raise ValueError(f"the targets are residuals after layer {self.layer}, this edit's top layer is {layer}")
        if len(self.requests) != len(requests):
            raise ValueError(
                f"the targets were computed for {len(self.requests)} requests, this batch has {len(requests)}"
            )
        for i, (a, b) in enumerate(zip(self.requests, requests)):
            if a != b:
                raise ValueError(
                    f"the targets were computed for other requests: request {i} is {a.text!r} → "
                    f"{a.target!r} there and {b.text!r} → {b.target!r} here"
                )
        require_finite(self.z, "the target residuals")


@dataclass
class _Applied:
    edit: Edit
    digests: dict[int, str]  # layer -> digest of its W_out right after this edit was applied


@dataclass
class _EditState:
    stack: list[_Applied] = field(default_factory=list)  # applied edits, oldest first
    originals: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> W_out before its first edit


_STATE: weakref.WeakKeyDictionary[HookedGPT2, _EditState] = weakref.WeakKeyDictionary()


def _state(model: HookedGPT2) -> _EditState:
    if model not in _STATE:
        _STATE[model] = _EditState()
    return _STATE[model]


def _stack(model: HookedGPT2) -> list[_Applied]:
    return _state(model).stack


def _originals(model: HookedGPT2) -> dict[int, torch.Tensor]:
    return _state(model).originals


def original_weights(model: HookedGPT2) -> dict[int, torch.Tensor]:
    """``{layer: W_out}`` as it was before the first applied edit there (edited layers only); read-only use."""
    return dict(_originals(model))


@torch.no_grad()
def _rebuild(model: HookedGPT2, layer: int, check_digests: bool) -> None:
    """Restore ``W_out[layer]`` from its original and replay the stack's edits there, in order."""
    W = model.blocks[layer].mlp.W_out
    originals = _originals(model)
    W.copy_(originals[layer])
    entries = [a for a in _stack(model) if layer in a.digests]
    for a in entries:
        W.add_(a.edit.delta(layer, W.dtype, W.device))
        d = tensor_digest(W)
        if check_digests and d != a.digests[layer]:  # pragma: no cover - would mean a non-deterministic add
            raise RuntimeError(f"replaying the edits of layer {layer} did not reproduce the recorded weights")
        a.digests[layer] = d
    if not entries:
        del originals[layer]


@boundary
def applied_edits(model: HookedGPT2) -> list[Edit]:
    """The edits applied to ``model``, oldest first."""
    return [a.edit for a in _stack(model)]


@boundary
@torch.no_grad()
def undo_all(model: HookedGPT2) -> int:
    """Undo every applied edit at once (restores each edited layer's original ``W_out``);
    returns how many were undone. A ``W_out`` changed outside the edit API raises RuntimeError
    (before any layer of that kind is restored)."""
    stack, originals = _stack(model), _originals(model)
    n = len(stack)
    for layer in list(originals):
        last = [a for a in stack if layer in a.digests][-1]
        W = model.blocks[layer].mlp.W_out
        if tensor_digest(W) != last.digests[layer]:
            raise RuntimeError(f"W_out of layer {layer} was changed outside the edit API; reload the model")
        W.copy_(originals.pop(layer))
    stack.clear()
    return n


# ---------------------------------------------------------------- save / load
def _write(edit: Edit, path: str | Path) -> Path:
    """One safetensors file: per layer ``L{l}.U`` (and ``L{l}.V`` unless dense), ``L{l}.keys``,
    ``k``/``v_star`` when present, and a JSON header (no pickle), with a sha256 digest over every
    tensor and the header (:mod:`gpt2_interp.io.integrity`), checked at load. A non-finite tensor is
    refused (it could not be loaded)."""
    edit.require_finite("save")
    tensors: dict[str, torch.Tensor] = {}
    for lay, (U, V) in edit.factors.items():
        tensors[f"L{lay}.U"] = U
        if V is not None:
            tensors[f"L{lay}.V"] = V
    for lay, K in edit.keys.items():
        tensors[f"L{lay}.keys"] = K
    if edit.k is not None:
        tensors["k"] = edit.k
    if edit.v_star is not None:
        tensors["v_star"] = edit.v_star
    meta = {
        "layers": edit.layers,
        "requests": [asdict(r) for r in edit.requests],
        "method": edit.method,
        "label": edit.label,  # the method and its mode ("memit (paper)"), for a reader of the file
        "base_fingerprint": edit.base_fingerprint,
        "hparams": edit.hparams,
        "metrics": edit.metrics,
        "model_name": edit.model_name,
        "shape": list(edit.shape),
        "saved": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return save_checked(path, tensors, {"format": FORMAT, "edit": json.dumps(meta, default=_json_default)})


@boundary
def load_edit(path: str | Path, model: HookedGPT2 | None = None) -> Edit:
    """Read an edit written by :meth:`Edit.save` (or a rank-one ``/1`` file of earlier versions);
    with ``model``, also check it fits that model.

    Refuses (``IntegrityError``, a ``ValueError``, naming the file) a file whose tensors or header
    changed after it was saved, a truncated file, and non-finite tensors; a file from before
    digests existed loads with an ``UnverifiedFileWarning``. A safetensors file that is not an edit,
    or whose header or tensors are incomplete, raises ValueError; with ``model``, the refusals of
    :meth:`Edit.check`, and the factors are moved to the model's device."""
    path = Path(path)
    tensors, header, _ = load_checked(path, kind="edit")
    fmt = header.get("format")
    if fmt not in FORMATS_READ:
        raise ValueError(
            f"{path} is a safetensors file but not a gpt2-interp edit (format {fmt!r}; "
            f"this version reads {FORMATS_READ})"
        )
    try:
        meta = json.loads(header["edit"])
        common = dict(
            base_fingerprint=meta["base_fingerprint"],
            k=tensors.get("k"),
            v_star=tensors.get("v_star"),
            hparams=meta.get("hparams", {}),
            metrics=meta.get("metrics", {}),
            model_name=meta.get("model_name", ""),
            shape=tuple(meta.get("shape", (0, 0))),
        )
        if fmt == "gpt2-interp-edit/1":  # rank-one files written before multi-layer edits
            edit = Edit.rank_one(int(meta["layer"]), tensors["u"], tensors["v"], Request(**meta["request"]), **common)
        else:
            factors = {int(l): (tensors[f"L{l}.U"], tensors.get(f"L{l}.V")) for l in meta["layers"]}
            keys = {int(l): tensors[f"L{l}.keys"] for l in meta["layers"] if f"L{l}.keys" in tensors}
            edit = Edit.factored(
                factors,
                [Request(**r) for r in meta["requests"]],
                keys=keys,
                method=meta.get("method"),
                **common,
            )
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(
            f"{path} is not a valid edit file: its header or tensors are incomplete ({type(e).__name__}: {e})"
        ) from None
    for name, t in tensors.items():
        require_finite(t, f"tensor {name!r} of the edit file {path}", "the edit was computed from non-finite values")
    if model is not None:
        edit.check(model)
        edit.factors = {
            l: (U.to(model.device), None if V is None else V.to(model.device)) for l, (U, V) in edit.factors.items()
        }
    return edit


def _json_default(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.tolist()
    if isinstance(x, (tuple, set)):
        return list(x)
    return str(x)
