"""Named activation points, the hooks that read or replace them, and the activation cache.

A :class:`HookPoint` is an identity on the forward path until a hook is added;
a hook ``fn(activation, hook)`` may return a tensor of the same shape to
replace the activation. Names follow TransformerLens.
"""

from __future__ import annotations

import contextvars
import difflib
import inspect
import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Literal, Union

import torch

from ..core.boundary import boundary
from ..core.finite import NonFiniteWarning, is_finite
from ..core.porting import PortingWarning

HookFn = Callable[[torch.Tensor, "HookPoint"], torch.Tensor | None]
NameFilter = Union[None, str, Callable[[str], bool], "list[str]", "tuple[str, ...]", "set[str]"]


class _Hook:
    """One registered hook function and its bookkeeping (direction, permanence, context level)."""

    __slots__ = ("active", "by_keyword", "dir", "fn", "is_permanent", "level")
    fn: Callable[..., Any]  # a HookFn, called as fn(x, hook) or as fn(x, hook=hook)

    def __init__(self, fn: HookFn, dir: str, is_permanent: bool, level: int | None) -> None:
        self.fn, self.dir, self.is_permanent, self.level, self.active = fn, dir, is_permanent, level, True
        self.by_keyword = _takes_hook_keyword(fn)

    def __call__(self, x: torch.Tensor, hook: HookPoint) -> Any:
        return self.fn(x, hook=hook) if self.by_keyword else self.fn(x, hook)

    def __repr__(self) -> str:
        return f"<{self.dir} hook {getattr(self.fn, '__name__', self.fn)!r}{' permanent' if self.is_permanent else ''}>"


def _takes_hook_keyword(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is called as TransformerLens calls hooks, ``fn(activation, hook=hook_point)``: it has a
    parameter named ``hook`` (keyword-only included), or takes ``**kwargs`` and at most one positional
    parameter. Otherwise (a second parameter with another name) the hook point is passed by position.
    Decided once, when the hook is added."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature: by position
        return False
    if any(p.name == "hook" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params):
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    return any(p.kind == p.VAR_KEYWORD for p in params) and len(positional) <= 1


@boundary
class HookPoint:
    """An activation point with a name. Calling it runs its forward hooks in order.

    Forward hooks ``fn(activation, hook)`` may return a tensor of the same shape to
    replace the activation. A hook with a parameter named ``hook`` is called as TransformerLens
    calls it, ``fn(activation, hook=hook_point)``; any other gets the hook point by position. Backward hooks
    ``fn(grad, hook)`` see the gradient of the
    loss with respect to this activation during ``backward()`` (and may return a
    replacement gradient). ``fwd_hooks``/``bwd_hooks`` list what is registered.
    """

    __slots__ = ("bwd_hooks", "ctx", "fwd_hooks", "name")

    def __init__(self, name: str = "") -> None:
        self.name = name
        self.fwd_hooks: list[_Hook] = []
        self.bwd_hooks: list[_Hook] = []
        self.ctx: dict[Any, Any] = {}  # hooks' own state (TransformerLens's ``hook.ctx``), emptied by reset_hooks()

    def clear_context(self) -> None:
        """Empty :attr:`ctx`."""
        self.ctx = {}

    @property
    def has_hooks(self) -> bool:
        """Whether any forward or backward hook is attached."""
        return bool(self.fwd_hooks or self.bwd_hooks)

    def layer(self) -> int:
        """The block index of this hook point (``blocks.3.attn.hook_q`` → 3)."""
        i = layer_of(self.name)
        if i is None:
            raise ValueError(f"hook point {self.name!r} is not inside a block, so it has no layer")
        return i

    def add_hook(
        self,
        fn: HookFn,
        dir: Literal["fwd", "bwd"] = "fwd",
        is_permanent: bool = False,
        level: int | None = None,
        prepend: bool = False,
    ) -> Callable[[], None]:
        """Add the hook ``fn(activation, hook)`` (``dir`` "fwd", the default, or "bwd"; ``prepend`` runs it
        before the others; hooks added with ``is_permanent`` survive ``reset_hooks()``; ``level`` tags
        the hook so that ``remove_hooks(level=...)`` removes only that context's hooks). Returns a
        function that removes exactly this hook. Another ``dir`` raises ValueError, a non-callable
        ``fn`` TypeError."""
        if dir not in ("fwd", "bwd"):
            raise ValueError(f"dir must be 'fwd' or 'bwd', got {dir!r}")
        if not callable(fn):
            raise TypeError(f"a hook is a function fn(activation, hook); got {type(fn).__name__}")
        h = _Hook(fn, dir, is_permanent, level)
        hooks = self.fwd_hooks if dir == "fwd" else self.bwd_hooks
        hooks.insert(0, h) if prepend else hooks.append(h)

        def remove() -> None:
            h.active = False
            for i, other in enumerate(hooks):
                if other is h:
                    del hooks[i]
                    return

        return remove

    def add_perma_hook(self, fn: HookFn, dir: Literal["fwd", "bwd"] = "fwd") -> Callable[[], None]:
        """:meth:`add_hook` with ``is_permanent=True`` (TransformerLens's name)."""
        return self.add_hook(fn, dir, is_permanent=True)

    def remove_hooks(
        self, dir: Literal["fwd", "bwd", "both"] = "fwd", including_permanent: bool = False, level: int | None = None
    ) -> None:
        """Remove hooks in direction ``dir`` (TransformerLens's defaults: forward hooks that are not
        permanent); ``including_permanent`` removes every hook in that direction, whatever its level,
        else only non-permanent ones added at context ``level`` (any level when None)."""
        if dir not in ("fwd", "bwd", "both"):
            raise ValueError(f"dir must be 'fwd', 'bwd' or 'both', got {dir!r}")
        for d, hooks in (("fwd", self.fwd_hooks), ("bwd", self.bwd_hooks)):
            if dir not in (d, "both"):
                continue
            keep = []
            for h in hooks:
                if not including_permanent and (h.is_permanent or (level is not None and h.level != level)):
                    keep.append(h)
                else:
                    h.active = False
            hooks[:] = keep

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for h in list(self.fwd_hooks):
            out = h(x, self)
            fn = h.fn
            if out is None:
                if not getattr(fn, "reads_only", False):  # it may have written into x in place
                    _record(self.name, f"the activation that hook {_fn_name(fn)!r} wrote into in place", x)
                continue
            if not isinstance(out, torch.Tensor):
                raise TypeError(
                    f"hook {getattr(fn, '__name__', fn)!r} on {self.name} returned {type(out).__name__}; "
                    "return a tensor to replace the activation, or None to leave it"
                )
            if out.shape != x.shape:
                raise ValueError(
                    f"hook {getattr(fn, '__name__', fn)!r} on {self.name} returned shape {tuple(out.shape)}, "
                    f"but the activation has shape {tuple(x.shape)}; a replacement must keep the shape"
                )
            x = out if out.dtype == x.dtype else out.to(x.dtype)
            _record(self.name, f"the activation that hook {_fn_name(fn)!r} returned", x)
        if self.bwd_hooks and x.requires_grad:
            x = x.view_as(x)  # the gradient of this activation only, whatever else shares the tensor
            x.register_hook(self._backward(list(self.bwd_hooks)))
        return x

    def _backward(self, hooks: list[_Hook]) -> Callable[[torch.Tensor], torch.Tensor | None]:
        def run(grad: torch.Tensor) -> torch.Tensor:
            for h in hooks:
                if not h.active:  # removed since the forward pass: a hook never outlives its context
                    continue
                out = h(grad, self)
                if isinstance(out, torch.Tensor):
                    grad = out
            return grad

        return run

    def __repr__(self) -> str:
        return f"HookPoint({self.name!r}, fwd={len(self.fwd_hooks)}, bwd={len(self.bwd_hooks)})"


def warn_port(message: str) -> None:
    """Warn (once per call site) where a TransformerLens idiom would silently give another result."""
    warnings.warn(message, PortingWarning, stacklevel=3)


# (hook name, hook fn name, 0-d float32 sum) for every activation a hook replaced in the current forward
_WATCH: contextvars.ContextVar[list[tuple[str, str, torch.Tensor]] | None] = contextvars.ContextVar(
    "gpt2_interp_hook_watch", default=None
)


def _fn_name(fn: Any) -> str:
    return getattr(fn, "__name__", repr(fn))


def _record(name: str, what: str, x: torch.Tensor) -> None:
    """Note, for the forward pass watching (see :func:`watch_replacements`), a tensor written at hook
    point ``name`` (``what`` says by whom): NaN/inf propagate into its sum, one cheap reduction, no
    device sync here."""
    watch = _WATCH.get()
    if watch is not None:
        watch.append((name, what, x.sum(dtype=torch.float32)))


def reads_only(fn: HookFn) -> HookFn:
    """Mark a hook that only reads its activation (never writes into it), such as one that caches it:
    the non-finite check then skips it, so reading activations costs nothing extra."""
    fn.reads_only = True  # type: ignore[attr-defined]  # a marker attribute on the function object
    return fn


_MODEL_INPUTS: contextvars.ContextVar[bool] = contextvars.ContextVar("gpt2_interp_model_inputs", default=False)


@contextmanager
def model_computed_inputs() -> Iterator[None]:
    """For the ``with`` block, residual streams handed to ``forward(start_at_layer=…)`` are ones the
    model computed itself (an engine resuming a forward pass), so they are not checked for NaN/inf:
    resuming costs no device read-back."""
    token = _MODEL_INPUTS.set(True)
    try:
        yield
    finally:
        _MODEL_INPUTS.reset(token)


def note_input(name: str, what: str, x: torch.Tensor) -> None:
    """Note a tensor the user handed in (``what``, e.g. "the residual stream given with start_at_layer")
    entering at hook point ``name``, for the non-finite check of the forward pass watching (not
    inside :func:`model_computed_inputs`)."""
    if not _MODEL_INPUTS.get():
        _record(name, what, x)


@contextmanager
def watch_replacements() -> Iterator[list[tuple[str, str, torch.Tensor]]]:
    """Record, for the ``with`` block, every activation a hook replaced (name, hook, its float32 sum:
    one reduction per replacement, no device sync). Nested forwards get their own record."""
    record: list[tuple[str, str, torch.Tensor]] = []
    token = _WATCH.set(record)
    try:
        yield record
    finally:
        _WATCH.reset(token)


def warn_if_nonfinite(record: list[tuple[str, str, torch.Tensor]], output: torch.Tensor | None, what: str) -> bool:
    """After a forward whose hooks wrote activations (``record``): when any written activation holds
    NaN/inf, warn with a :class:`NonFiniteWarning` naming the first hook point and hook that wrote them,
    even when the ``output`` is finite (a fused attention kernel may absorb a NaN in ``hook_rot_q``
    and return finite, wrong values); when only ``output`` holds them, say they arose downstream.
    One device read-back per call; nothing more unless it fails. Returns True when it warned."""
    if not record:
        return False
    sums = torch.stack([total for _, _, total in record])
    scores = torch.tensor([name.endswith("hook_attn_scores") for name, _, _ in record], device=sums.device)
    # attention scores hold -inf at masked places by design: there only NaN is wrong
    flags = torch.where(scores, sums.isnan(), ~sums.isfinite())
    if output is not None:
        flags = torch.cat([flags, ~output.sum(dtype=torch.float32).isfinite()[None]])
    bad_flags = flags.tolist()
    first = next((i for i, bad in enumerate(bad_flags[: len(record)]) if bad), None)
    if first is not None:
        name, by, _ = record[first]
        where = (
            f"they first appeared in {by} at {name!r} (NaN/inf, or values so large "
            "that they overflow); check what computes it"
        )
        if output is not None and not bad_flags[-1]:
            where += (
                " (the output is finite, but computed from them: a fused kernel can hide NaN, so it is not trustworthy)"
            )
    elif (
        output is not None and bad_flags[-1] and not is_finite(output)
    ):  # the float32 sum can overflow on finite values
        names = list(dict.fromkeys(name for name, _, _ in record))
        where = (
            f"the hooks that wrote activations ({', '.join(names[:4])}{', …' if len(names) > 4 else ''}) "
            "wrote finite values, so they arose downstream (e.g. values too large for the dtype)"
        )
    else:
        return False
    warnings.warn(f"non-finite values (NaN/inf) in the {what}: {where}", NonFiniteWarning, stacklevel=5)
    return True


def suggest(name: str, names: list[str], n: int = 3) -> str:
    """A ' Did you mean ...?' hint for a misspelled name (empty if nothing is close)."""
    close = difflib.get_close_matches(name, names, n=n, cutoff=0.5)
    return f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""


# Short TransformerLens-style names: cache["resid_pre", 3] -> "blocks.3.hook_resid_pre".
_SHORT = {
    "embed": "hook_embed",
    "pos_embed": "hook_pos_embed",
    "resid_pre": "blocks.{}.hook_resid_pre",
    "resid_mid": "blocks.{}.hook_resid_mid",
    "resid_post": "blocks.{}.hook_resid_post",
    "attn_out": "blocks.{}.hook_attn_out",
    "mlp_out": "blocks.{}.hook_mlp_out",
    "attn_in": "blocks.{}.hook_attn_in",
    "q_input": "blocks.{}.hook_q_input",
    "k_input": "blocks.{}.hook_k_input",
    "v_input": "blocks.{}.hook_v_input",
    "mlp_in": "blocks.{}.hook_mlp_in",
    "q": "blocks.{}.attn.hook_q",
    "k": "blocks.{}.attn.hook_k",
    "v": "blocks.{}.attn.hook_v",
    "z": "blocks.{}.attn.hook_z",
    "result": "blocks.{}.attn.hook_result",
    "attn_scores": "blocks.{}.attn.hook_attn_scores",
    "scores": "blocks.{}.attn.hook_attn_scores",
    "pattern": "blocks.{}.attn.hook_pattern",
    "attn": "blocks.{}.attn.hook_pattern",
    "pre": "blocks.{}.mlp.hook_pre",
    "post": "blocks.{}.mlp.hook_post",
    "mlp_pre": "blocks.{}.mlp.hook_pre",
    "mlp_post": "blocks.{}.mlp.hook_post",
    "scale": "blocks.{}.{}.hook_scale",
    "normalized": "blocks.{}.{}.hook_normalized",
}


# hook points that fire only while one of the model's TransformerLens switches is on (name suffix → switch)
_SWITCHED = {
    "attn.hook_result": "use_attn_result",
    "hook_q_input": "use_split_qkv_input",
    "hook_k_input": "use_split_qkv_input",
    "hook_v_input": "use_split_qkv_input",
    "hook_attn_in": "use_attn_in",
    "hook_mlp_in": "use_hook_mlp_in",
}


def switch_of(name: str) -> str | None:
    """The model switch (``cfg.use_…``) without which hook point ``name`` never fires, or None if it always
    may: ``switch_of("blocks.0.hook_q_input") == "use_split_qkv_input"``."""
    return next((switch for suffix, switch in _SWITCHED.items() if name.endswith("." + suffix)), None)


_SUBLAYERS = {
    "attn": "attn",
    "a": "attn",
    "mlp": "mlp",
    "m": "mlp",
    "block": None,
    "b": None,
    "ln1": "ln1",
    "ln2": "ln2",
    "ln_final": "ln_final",
}


@boundary
def hook_name(family: str, layer: int | None = None, sub: str | None = None) -> str:
    """Full hook name of a short family name and layer: ``hook_name("resid_pre", 3)``.

    TransformerLens's ``utils.get_act_name`` spellings are accepted too: ``hook_name("k6")``,
    ``hook_name("pattern", 3, "attn")`` (a sublayer that the family already implies is ignored),
    ``hook_name("scale", 3, "ln2")``: ``sub`` names the sublayer (``attn``, ``mlp``, ``ln1``, ``ln2``,
    ``ln_final``). A negative ``layer`` is kept as given (the cache and the model count it from the
    end). A full hook name is returned unchanged. An unknown family or sublayer, or a per-block
    family without ``layer``, raises KeyError.
    """
    if layer is None and family not in _SHORT and re.fullmatch(r"[a-z_]+\d+[a-z0-9]*", family):
        m = re.fullmatch(r"([a-z_]+?)(\d+)([a-z0-9]*)", family)  # TL's "k6", "scale4ln1"
        if m and m.group(1) in _SHORT:
            return hook_name(m.group(1), int(m.group(2)), m.group(3) or None)
    if family not in _SHORT:
        if "hook_" in family or family.startswith("blocks."):
            return family
        raise KeyError(f"unknown hook family {family!r}.{suggest(family, list(_SHORT))} Known: {', '.join(_SHORT)}")
    if sub is not None and sub not in _SUBLAYERS:
        raise KeyError(f"unknown sublayer {sub!r} for {family!r}; known: {', '.join(_SUBLAYERS)}")
    template = _SHORT[family]
    if family in ("scale", "normalized"):
        if layer is None or sub == "ln_final":
            return f"ln_final.hook_{family}"
        return template.format(layer, sub or "ln1")
    if "{}" in template:
        if layer is None:
            raise KeyError(f"hook family {family!r} needs a layer, e.g. ({family!r}, 0)")
        return template.format(layer)
    return template


get_act_name = hook_name  # TransformerLens's name for it


def layer_of(name: str) -> int | None:
    """The block index a hook name belongs to (None for embeddings and ln_final)."""
    m = re.match(r"blocks\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def name_filter_fn(names_filter: NameFilter, known: list[str]) -> Callable[[str], bool]:
    """Normalise a names filter (None, a name, a list of names or a predicate); unknown names raise."""
    if names_filter is None:
        return lambda _: True
    if callable(names_filter):
        return names_filter
    wanted = {names_filter} if isinstance(names_filter, str) else set(names_filter)
    known_set = set(known)
    for n in wanted:
        if n not in known_set:
            raise KeyError(f"unknown hook name {n!r}.{suggest(n, known)} See model.hook_names().")
    return wanted.__contains__


def slice_positions(act: torch.Tensor, name: str, pos: Any) -> torch.Tensor:
    """Keep positions ``pos`` of an activation ``[batch, pos, ...]`` (query positions of
    ``[batch, head, q, k]`` scores/patterns; ``[batch, pos, head, d_head]`` for q/k/v/z)."""
    dim = -2 if name.endswith(("hook_attn_scores", "hook_pattern")) else 1
    if isinstance(pos, list):
        pos = torch.as_tensor(pos)
    elif isinstance(pos, tuple):
        pos = slice(*pos)
    index: list[Any] = [slice(None)] * act.ndim
    index[dim] = pos
    return act[tuple(index)]


def __getattr__(name: str) -> Any:
    """``ActivationCache`` lives in :mod:`.cache` (which imports this module); kept importable from here."""
    if name == "ActivationCache":
        from .cache import ActivationCache

        return ActivationCache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
