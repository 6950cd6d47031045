"""Named activation points, the hooks that read or replace them, and the activation cache.

A :class:`HookPoint` is an identity on the forward path until a hook is added;
a hook ``fn(activation, hook)`` may return a tensor of the same shape to
replace the activation. Names follow TransformerLens.
"""

from __future__ import annotations

import contextvars
import difflib
import re
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Union

import torch

from ..core.finite import NonFiniteWarning, is_finite

HookFn = Callable[[torch.Tensor, "HookPoint"], Union[torch.Tensor, None]]
NameFilter = Union[None, str, Callable[[str], bool], "list[str]", "tuple[str, ...]", "set[str]"]


class HookPoint:
    """An activation point with a name. Calling it runs its hooks in order."""

    __slots__ = ("name", "_hooks")

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._hooks: list[HookFn] = []

    @property
    def has_hooks(self) -> bool:
        return bool(self._hooks)

    def add_hook(self, fn: HookFn) -> Callable[[], None]:
        """Add a forward hook; returns a function that removes exactly this hook."""
        self._hooks.append(fn)

        def remove() -> None:
            for i, h in enumerate(self._hooks):
                if h is fn:
                    del self._hooks[i]
                    return

        return remove

    def remove_hooks(self) -> None:
        self._hooks.clear()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for fn in self._hooks:
            out = fn(x, self)
            if out is None:
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
            watch = _WATCH.get()
            if watch is not None:  # a forward pass is watching replacements (see watch_replacements)
                # NaN/inf propagate into the sum: one cheap reduction, a 0-d tensor, no device sync here
                watch.append((self.name, getattr(fn, "__name__", repr(fn)), x.sum(dtype=torch.float32)))
        return x

    def __repr__(self) -> str:
        return f"HookPoint({self.name!r}, hooks={len(self._hooks)})"


# (hook name, hook fn name, 0-d float32 sum) for every activation a hook replaced in the current forward
_WATCH: "contextvars.ContextVar[list[tuple[str, str, torch.Tensor]] | None]" = contextvars.ContextVar(
    "gpt2_interp_hook_watch", default=None)


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
    """After a forward whose hooks replaced activations (``record``): when ``output`` (or, when it is
    None, any replaced activation) holds NaN/inf, warn with a :class:`NonFiniteWarning` naming the hook
    point where they first appeared. One check of ``output`` (a device sync) per call; nothing
    more unless it fails. Returns True when it warned."""
    if not record:
        return False
    if output is not None and is_finite(output):
        return False

    def bad_sum(name: str, total: torch.Tensor) -> bool:  # attention scores hold -inf at masked places by design
        return bool(torch.isnan(total)) if name.endswith("hook_attn_scores") else not bool(torch.isfinite(total))

    bad = next(((name, fn) for name, fn, total in record if bad_sum(name, total)), None)
    if bad is None and output is None:
        return False
    if bad is not None:
        where = (f"they first appeared in the activation that hook {bad[1]!r} returned at {bad[0]!r} (NaN/inf, or "
                 "values so large that they overflow); check what that hook computes")
    else:
        names = list(dict.fromkeys(name for name, _, _ in record))
        where = (f"the hooks that replaced activations ({', '.join(names[:4])}{', …' if len(names) > 4 else ''}) "
                 "returned finite values, so they arose downstream (e.g. values too large for the dtype)")
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
    "q": "blocks.{}.attn.hook_q",
    "k": "blocks.{}.attn.hook_k",
    "v": "blocks.{}.attn.hook_v",
    "z": "blocks.{}.attn.hook_z",
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


def hook_name(family: str, layer: int | None = None, sub: str | None = None) -> str:
    """Full hook name of a short family name and layer: ``hook_name("resid_pre", 3)``."""
    if family not in _SHORT:
        if "hook_" in family or family.startswith("blocks."):
            return family
        raise KeyError(f"unknown hook family {family!r}.{suggest(family, list(_SHORT))} Known: {', '.join(_SHORT)}")
    template = _SHORT[family]
    if family in ("scale", "normalized"):
        if layer is None:
            return f"ln_final.hook_{family}"
        return template.format(layer, sub or "ln1")
    if "{}" in template:
        if layer is None:
            raise KeyError(f"hook family {family!r} needs a layer, e.g. ({family!r}, 0)")
        return template.format(layer)
    return template


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


class ActivationCache(Mapping[str, torch.Tensor]):
    """Activations by hook name, as recorded by ``run_with_cache``.

    Index by full name (``cache["blocks.3.hook_resid_pre"]``) or TransformerLens
    style (``cache["resid_pre", 3]``, ``cache["scale", 3, "ln2"]``).
    """

    def __init__(self, store: dict[str, torch.Tensor], model: Any = None) -> None:
        self._store = store
        self.model = model

    def _key(self, key: str | tuple) -> str:
        if isinstance(key, tuple):
            return hook_name(key[0], *(key[1:]))
        return key

    def __getitem__(self, key: str | tuple) -> torch.Tensor:
        name = self._key(key)
        try:
            return self._store[name]
        except KeyError:
            hint = suggest(name, list(self._store))
            raise KeyError(
                f"{name!r} is not in this cache ({len(self._store)} names cached).{hint} "
                "If it is a valid hook name, include it in run_with_cache's names_filter."
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._store)

    def __len__(self) -> int:
        return len(self._store)

    def __repr__(self) -> str:
        return f"ActivationCache({len(self._store)} names: {', '.join(list(self._store)[:4])}{', ...' if len(self) > 4 else ''})"

    def to(self, device: torch.device | str) -> "ActivationCache":
        return ActivationCache({k: v.to(device) for k, v in self._store.items()}, self.model)

    def stack(self, family: str) -> torch.Tensor:
        """Stack a per-layer family over layers: ``[n_layer, *shape]``."""
        n = self.model.cfg.n_layer
        return torch.stack([self[family, i] for i in range(n)])

    def accumulated_resid(self, incl_mid: bool = False) -> tuple[torch.Tensor, list[str]]:
        """Residual stream at every layer boundary: ``[n_boundaries, batch, pos, d_model]`` and labels.

        Boundaries: ``embed`` (resid_pre 0), then after each block (``L{i}``); with
        ``incl_mid`` also the mid-block residuals (``L{i}_mid``). The last entry is
        the final residual stream, before ln_final.
        """
        n = self.model.cfg.n_layer
        resids, labels = [self["resid_pre", 0]], ["embed"]
        for i in range(n):
            if incl_mid:
                resids.append(self["resid_mid", i])
                labels.append(f"L{i}_mid")
            resids.append(self["resid_post", i])
            labels.append(f"L{i}")
        return torch.stack(resids), labels
