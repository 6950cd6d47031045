"""gpt2-interp: take GPT-2 apart and put it back together differently.

>>> import gpt2_interp
>>> model = gpt2_interp.load("gpt2-facts")          # embedded fact model, offline
>>> logits, cache = model.run_with_cache("The capital of France is")
"""

from .io.checkpoints import from_state_dict, from_transformer_lens, from_transformers, load
from .model import KNOWN_CONFIGS, ActivationCache, GPT2Config, HookedGPT2, HookPoint
from .editing.rome import compute_edit as rome_edit

__version__ = "0.1.0"
__all__ = [
    "load", "from_transformers", "from_transformer_lens", "from_state_dict",
    "HookedGPT2", "GPT2Config", "KNOWN_CONFIGS", "ActivationCache", "HookPoint",
    "rome_edit",
]
