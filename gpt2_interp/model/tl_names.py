"""TransformerLens's names for our model and its config: the compatibility layer's face.

Code written for TransformerLens ports by changing an import (``docs/porting.md``):
``from gpt2_interp import HookedTransformer`` gives :class:`~.hooked_gpt2.HookedGPT2` (with
``from_pretrained``/``from_pretrained_no_processing``) and ``TransformerConfig`` gives
:class:`~.config.GPT2Config` — the same classes under TransformerLens's names, not subclasses.
Everywhere else in gpt2-interp, and in its documentation, the names are ``HookedGPT2`` and ``GPT2Config``.
"""

from .config import GPT2Config
from .hooked_gpt2 import HookedGPT2

HookedTransformer = HookedGPT2
TransformerConfig = GPT2Config

__all__ = ["HookedTransformer", "TransformerConfig"]
