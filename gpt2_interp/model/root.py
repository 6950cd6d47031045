"""``HookedRootModule``: TransformerLens's hook API for any module with :class:`.hooks.HookPoint` attributes."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal

import torch
from torch import nn

from ..core.boundary import boundary
from ..core.devices import resolve_device, resolve_dtype
from .cache import ActivationCache, own_storage
from .hooks import HookFn, HookPoint, NameFilter, name_filter_fn, reads_only, slice_positions, suggest

HookSpec = tuple[str | Callable[[str], bool], HookFn]


@boundary
class HookedRootModule(nn.Module):
    """A module whose :class:`HookPoint` attributes (at any depth) are named and hookable, with
    TransformerLens's hook API: ``hooks()``, ``run_with_hooks``, ``run_with_cache``, ``add_hook``,
    ``reset_hooks``. A subclass calls :meth:`setup` at the end of ``__init__`` (or sets ``hook_dict``
    itself, in forward order).

    Hooks added by ``hooks()``/``run_with_hooks``/``run_with_cache`` are removed when the call or the
    ``with`` block ends, also when it raises, and a backward hook removed before ``backward()`` does
    not fire. Hooks added with ``add_hook`` stay until ``reset_hooks()`` (permanent ones until
    ``reset_hooks(including_permanent=True)``).
    """

    hook_dict: dict[str, HookPoint]

    def setup(self) -> None:
        """Name every HookPoint by its attribute path and collect them in ``hook_dict``."""
        found: dict[str, HookPoint] = {}
        for prefix, module in self.named_modules():
            for attr, value in vars(module).items():
                if isinstance(value, HookPoint):
                    value.name = f"{prefix}.{attr}" if prefix else attr
                    found[value.name] = value
        self.hook_dict = found

    def hook_names(self) -> list[str]:
        """Every hook point's name, in forward order."""
        return list(self.hook_dict)

    def hook_points(self, name: str | Callable[[str], bool]) -> list[HookPoint]:
        """The hook points a name or a predicate on names selects (an unknown name raises)."""
        if callable(name):
            return [hp for n, hp in self.hook_dict.items() if name(n)]
        if name not in self.hook_dict:
            raise KeyError(f"unknown hook name {name!r}.{suggest(name, self.hook_names())} See model.hook_names().")
        return [self.hook_dict[name]]

    def add_hook(
        self,
        name: str | Callable[[str], bool],
        hook: HookFn,
        dir: Literal["fwd", "bwd"] = "fwd",
        is_permanent: bool = False,
        level: int | None = None,
        prepend: bool = False,
    ) -> Callable[[], None]:
        """Add ``hook`` (``fn(activation, hook)``) to the hook point ``name`` (or every one a predicate on
        names selects) until ``reset_hooks()``; returns a function removing exactly what was added.
        ``dir``: ``"fwd"`` (default) or ``"bwd"``; ``is_permanent`` hooks survive ``reset_hooks()``;
        ``level`` tags the hook for ``reset_hooks(level=...)``; ``prepend`` runs it before the hooks
        already there. An unknown name raises KeyError (with the closest names)."""
        removers = [hp.add_hook(hook, dir, is_permanent, level, prepend) for hp in self.hook_points(name)]

        def remove() -> None:
            for r in removers:
                r()

        return remove

    def reset_hooks(
        self,
        clear_contexts: bool = True,
        direction: Literal["fwd", "bwd", "both"] = "both",
        including_permanent: bool = False,
        level: int | None = None,
    ) -> None:
        """Remove every hook in ``direction`` (``"fwd"``, ``"bwd"`` or ``"both"``, the default), permanent
        ones too with ``including_permanent=True``, only those tagged ``level`` when it is given; with
        ``clear_contexts``, empty each hook point's ``ctx``."""
        for hp in self.hook_dict.values():
            hp.remove_hooks(direction, including_permanent, level)
            if clear_contexts:
                hp.clear_context()

    def remove_all_hook_fns(
        self,
        direction: Literal["fwd", "bwd", "both"] = "both",
        including_permanent: bool = False,
        level: int | None = None,
    ) -> None:
        """TransformerLens's name for :meth:`reset_hooks` (same ``direction``, ``including_permanent`` and
        ``level``)."""
        self.reset_hooks(True, direction, including_permanent, level)

    @contextmanager
    def hooks(
        self,
        fwd_hooks: Sequence[HookSpec] = (),
        bwd_hooks: Sequence[HookSpec] = (),
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
    ) -> Iterator[Any]:
        """Add ``(name or predicate, fn)`` hooks, ``fwd_hooks`` forward and ``bwd_hooks`` backward, for the
        ``with`` block; all are removed on exit, also when the body raises (``reset_hooks_end=False``
        keeps them until ``reset_hooks()``, as in TransformerLens, e.g. to call ``backward()``
        afterwards). ``clear_contexts`` is accepted for TransformerLens and has no effect. A spec that
        is not a pair raises TypeError, an unknown hook name KeyError."""
        removers: list[Callable[[], None]] = []
        try:
            directions: tuple[tuple[Sequence[HookSpec], Literal["fwd", "bwd"]], ...] = (
                (fwd_hooks, "fwd"),
                (bwd_hooks, "bwd"),
            )
            for specs, dir in directions:
                for spec in specs:
                    if not (isinstance(spec, (tuple, list)) and len(spec) == 2):
                        raise TypeError(f"{dir}_hooks takes (name or predicate, fn) pairs; got {spec!r}")
                    name, fn = spec
                    for hp in self.hook_points(name):
                        removers.append(hp.add_hook(fn, dir))
            yield self
        except BaseException:
            for remove in reversed(removers):
                remove()
            raise
        else:
            if reset_hooks_end:
                for remove in reversed(removers):
                    remove()
        finally:
            if clear_contexts:
                for hp in self.hook_dict.values():
                    hp.clear_context()

    def run_with_hooks(
        self,
        *model_args: Any,
        fwd_hooks: Sequence[HookSpec] = (),
        bwd_hooks: Sequence[HookSpec] = (),
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
        **model_kwargs: Any,
    ) -> Any:
        """``forward(*model_args, **model_kwargs)`` with ``fwd_hooks``/``bwd_hooks`` (``(name or predicate,
        fn)`` pairs) active for this call only. Backward hooks need the ``backward()`` inside the
        call's lifetime: pass ``reset_hooks_end=False``, call ``backward()``, then ``reset_hooks()``
        (or use ``with model.hooks(bwd_hooks=...)``); ``bwd_hooks`` with ``reset_hooks_end=True``
        warns. ``clear_contexts`` has no effect (TransformerLens's keyword)."""
        if len(model_args) == 2 and not fwd_hooks and _is_hook_list(model_args[1]):
            fwd_hooks = model_args[1]  # our earlier positional form (input, fwd_hooks)
            model_args = model_args[:1]
        if bwd_hooks and reset_hooks_end:
            warnings.warn(
                "run_with_hooks with bwd_hooks removes them when it returns, before you can call backward(); "
                "use `with model.hooks(bwd_hooks=...):` around forward and backward, or reset_hooks_end=False",
                UserWarning,
                stacklevel=2,
            )
        with self.hooks(fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts):
            return self(*model_args, **model_kwargs)

    def run_with_cache(
        self,
        *model_args: Any,
        names_filter: NameFilter = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | str | None = None,
        remove_batch_dim: bool = False,
        incl_bwd: bool = False,
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
        pos_slice: Any = None,
        fwd_hooks: Sequence[HookSpec] = (),
        bwd_hooks: Sequence[HookSpec] = (),
        **model_kwargs: Any,
    ) -> tuple[Any, ActivationCache]:
        """``(forward output, ActivationCache)``: ``forward(*model_args, **model_kwargs)`` recording the
        activations ``names_filter`` selects (None: all; a hook name, a list of names, or a predicate
        on names), detached. Each keeps its hook's shape, e.g. ``blocks.0.hook_resid_post``
        ``[batch, pos, d_model]``, ``blocks.0.attn.hook_pattern`` ``[batch, head, q_pos, k_pos]``.

        The cache holds only what was asked for: an activation that is a view of a larger tensor (a
        ``pos_slice`` of it, or ``hook_q``/``hook_k``/``hook_v`` of the fused query/key/value
        projection) is copied out, so the larger tensor is freed after its layer as in a plain forward.
        ``device`` moves each activation as it is recorded (e.g. ``"cpu"`` to keep a GPU's memory for
        the run, TransformerLens's keyword); ``dtype`` stores it in that floating type (e.g.
        ``torch.float16`` or ``"bf16"``: half the bytes of fp32; token ids stay integers; our keyword,
        TransformerLens has none). ``pos_slice`` (an int, slice, list or tensor) keeps only those
        positions (an int keeps a position dimension of 1, as in TransformerLens); ``remove_batch_dim``
        drops the batch dimension (batch 1 only, else ValueError). ``incl_bwd`` runs
        ``output.backward()`` (a scalar output, e.g. ``return_type="loss"``, else ValueError) and also
        records gradients as ``name + "_grad"``. ``fwd_hooks``/``bwd_hooks`` are added for the run as in
        :meth:`run_with_hooks`; ``reset_hooks_end`` and ``clear_contexts`` as there. An unknown hook
        name in the filter raises KeyError."""
        if (
            len(model_args) == 2
            and names_filter is None
            and (
                callable(model_args[1])
                or isinstance(model_args[1], (list, tuple, set))
                or (isinstance(model_args[1], str) and model_args[1] in self.hook_dict)
            )
        ):
            names_filter = model_args[1]  # our earlier positional form (input, names_filter)
            model_args = model_args[:1]
        keep = name_filter_fn(names_filter, self.hook_names())
        dtype = resolve_dtype(dtype)
        device = resolve_device(device)
        store: dict[str, torch.Tensor] = {}
        pos = None if pos_slice is None else getattr(pos_slice, "slice", pos_slice)
        if isinstance(pos, int):  # as TransformerLens: the cache keeps a position dimension of 1
            pos = slice(pos, pos + 1 if pos != -1 else None)

        def record(key: str, act: torch.Tensor, name: str) -> None:
            act = act.detach()
            if pos is not None:
                act = slice_positions(act, name, pos)
            if device is not None or dtype is not None:
                act = act.to(device=device, dtype=dtype if act.is_floating_point() else None)
            store[key] = own_storage(act)

        @reads_only
        def save(act: torch.Tensor, hook: HookPoint) -> None:
            record(hook.name, act, hook.name)

        def save_grad(grad: torch.Tensor, hook: HookPoint) -> None:
            record(hook.name + "_grad", grad, hook.name)

        names = [n for n in self.hook_dict if keep(n)]
        fwd = list(fwd_hooks) + [(n, save) for n in names]
        bwd = list(bwd_hooks) + ([(n, save_grad) for n in names] if incl_bwd else [])
        with self.hooks(fwd, bwd, reset_hooks_end, clear_contexts):
            out = self(*model_args, **model_kwargs)
            if incl_bwd:
                if not (isinstance(out, torch.Tensor) and out.numel() == 1):
                    raise ValueError("incl_bwd=True needs a scalar output to differentiate; pass return_type='loss'")
                out.backward()
        cache = ActivationCache(store, self, has_batch_dim=True)
        return out, cache.remove_batch_dim() if remove_batch_dim else cache


def _is_hook_list(x: Any) -> bool:
    """A list of ``(name or predicate, fn)`` pairs (never a valid second argument of ``forward``)."""
    return (
        isinstance(x, (list, tuple))
        and all(isinstance(p, (list, tuple)) and len(p) == 2 and callable(p[1]) for p in x)
        and len(x) > 0
    )
