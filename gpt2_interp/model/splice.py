"""Splicing a module into the forward pass at a hook point, its own hook points joining the model's.

A *splice* is any object with ``hook_name`` (where it goes), ``splice_hook_points()`` (its
:class:`~.hooks.HookPoint` objects by local name, in forward order) and ``splice_forward(x,
use_error_term)`` (the activation that flows on in place of ``x``). A sparse autoencoder is one
(:class:`gpt2_interp.analysis.features.SAE`): spliced at ``blocks.3.hook_resid_post``, its hook points
are named ``blocks.3.hook_resid_post.hook_sae_acts_post`` and so on (SAELens's names), so caching,
hooks, patching and attribution read and write its latents like any other activation.

The splice acts first at its hook point: hooks on ``hook_name`` itself see (and may change) what flows
downstream, the splice's output. The model's parameters and its state dict are untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol

import torch

from .hooks import HookPoint

if TYPE_CHECKING:
    from .root import HookedRootModule


class Splice(Protocol):
    """What :func:`splice` needs of the module it splices in."""

    hook_name: str

    def splice_hook_points(self) -> dict[str, HookPoint]:
        """The module's hook points by local name (``hook_sae_acts_post``…), in forward order."""
        ...

    def splice_forward(self, x: torch.Tensor, use_error_term: bool) -> torch.Tensor:
        """The activation that replaces ``x`` (same shape)."""
        ...


class SpliceHandle:
    """A splice in place: :meth:`remove` (or leaving its ``with`` block) takes it out again.
    ``names``: the hook names it added to the model."""

    def __init__(self, model: HookedRootModule, point: HookPoint, names: list[str], remove_hook: Any) -> None:
        self.model, self.point, self.names, self._remove_hook = model, point, names, remove_hook

    def remove(self) -> None:
        """Take the splice out: its hook on the site and its hook points leave the model (idempotent)."""
        if self._remove_hook is None:
            return
        self._remove_hook()
        self._remove_hook = None
        for n in self.names:
            hp = self.model.hook_dict.pop(n, None)
            if hp is not None:
                hp.remove_hooks("both", including_permanent=True)

    def __enter__(self) -> SpliceHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()


def splice(model: HookedRootModule, module: Splice, use_error_term: bool = False) -> SpliceHandle:
    """Splice ``module`` in at its ``hook_name``: in every forward pass the activation there is replaced by
    ``module.splice_forward(activation, use_error_term)``, and the module's hook points are the model's
    under ``{hook_name}.{local name}`` until the returned handle is removed (it is a context manager).

    A module with a ``check_model(model)`` method (an SAE) is first asked whether it was made for this model
    (ValueError naming both models when not). An unknown hook name raises KeyError; a second splice at the
    same site raises ValueError."""
    check = getattr(module, "check_model", None)
    if check is not None:  # a module made for one model (an SAE: its hook, width and base weights) refuses another
        check(model)
    site = module.hook_name
    (point,) = model.hook_points(site)
    points = module.splice_hook_points()
    names = [f"{site}.{local}" for local in points]
    taken = [n for n in names if n in model.hook_dict]
    if taken:
        raise ValueError(f"a module is already spliced at {site!r} ({taken[0]} exists); remove it first")
    for n, hp in zip(names, points.values()):
        hp.name = n

    def run_splice(x: torch.Tensor, hook: HookPoint) -> torch.Tensor:
        return module.splice_forward(x, use_error_term)

    remove_hook = point.add_hook(run_splice, prepend=True, is_permanent=True)
    order: dict[str, HookPoint] = {}
    for n, hp in model.hook_dict.items():
        order[n] = hp
        if n == site:
            order.update(zip(names, points.values()))
    model.hook_dict = order
    return SpliceHandle(model, point, names, remove_hook)


@contextmanager
def spliced(model: HookedRootModule, *modules: Splice, use_error_term: bool = False) -> Iterator[HookedRootModule]:
    """:func:`splice` each of ``modules`` (at most one per site) for the ``with`` block; taken out on exit,
    also when the body raises. ``use_error_term``: add each module's error term, so the model computes
    what it computes without them (its hook points still readable and patchable)."""
    handles: list[SpliceHandle] = []
    try:
        for m in modules:
            handles.append(splice(model, m, use_error_term))
        yield model
    finally:
        for h in reversed(handles):
            h.remove()
