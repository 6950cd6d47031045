"""Which hook points a sweep's ``hook=`` and ``layers=`` arguments name: the one rule (and the one set
of error messages) of activation patching (:mod:`.patching`) and its gradient estimate (:mod:`.attribution`).

>>> resolve_hook(model, "resid_pre", [0, -1])      # a family swept over layers
('resid_pre', {0: 'blocks.0.hook_resid_pre', 11: 'blocks.11.hook_resid_pre'})
>>> resolve_hook(model, "blocks.3.attn.hook_z", None)   # one full hook name
(None, {3: 'blocks.3.attn.hook_z'})
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..core.checks import check_indices
from ..model.hooks import hook_name, layer_of, suggest

if TYPE_CHECKING:
    from ..model import HookedGPT2

EMBED_HOOKS = ("hook_embed", "hook_pos_embed")


def is_full_name(hook: str) -> bool:
    """Whether ``hook`` is one full hook name (``blocks.3.hook_resid_pre``, ``hook_embed``) rather than a family."""
    return "hook_" in hook or hook.startswith("blocks.")


def resolve_hook(model: HookedGPT2, hook: str, layers: Sequence[int] | None) -> tuple[str | None, dict[int, str]]:
    """``(family, {layer: hook name})`` for a sweep over ``hook`` and ``layers``.

    A family (``resid_pre``, ``z``, … anything :func:`~gpt2_interp.model.hooks.hook_name` knows) is
    swept over ``layers`` (default every block; negatives count from the end; repeats dropped).
    ``embed`` / ``pos_embed`` and full hook names are one hook point (``family`` None; ``layers``
    must be None); its layer is the block index, -1 for the embeddings, ``n_layer`` for ``ln_final``.
    Unknown names raise a KeyError with the closest valid ones."""
    n = model.cfg.n_layer
    if is_full_name(hook):
        if hook not in model.hook_dict:
            raise KeyError(f"unknown hook name {hook!r}.{suggest(hook, model.hook_names())} See model.hook_names().")
        if layers is not None:
            raise ValueError(f"hook {hook!r} is one hook point; to sweep layers pass a family name such as 'resid_pre'")
        lay = layer_of(hook)
        return None, {(-1 if hook in EMBED_HOOKS else n if lay is None else lay): hook}
    if hook in ("embed", "pos_embed"):
        return resolve_hook(model, hook_name(hook), layers)
    hook_name(hook, 0)  # unknown families raise here, with suggestions
    chosen = range(n) if layers is None else check_indices(layers, n, "layer", "layers", f"the model has {n} layers")
    return hook, {l: hook_name(hook, l) for l in dict.fromkeys(chosen)}


__all__ = ["EMBED_HOOKS", "is_full_name", "resolve_hook"]
