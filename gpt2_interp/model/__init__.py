"""The hookable GPT-2: config, hook points and cache, modules, generation."""

from .cache import ActivationCache
from .config import KNOWN_CONFIGS, GPT2Config, llama_config
from .factored import FactoredMatrix
from .hooked_gpt2 import HookedGPT2
from .hooks import HookPoint, PortingWarning, get_act_name, hook_name
from .modules import KVCache
from .root import HookedRootModule
from .steer import Steer
from .tl_names import HookedTransformer, TransformerConfig  # TransformerLens's names (compatibility layer)

__all__ = [
    "KNOWN_CONFIGS",
    "ActivationCache",
    "FactoredMatrix",
    "GPT2Config",
    "HookPoint",
    "HookedGPT2",
    "HookedRootModule",
    "KVCache",
    "PortingWarning",
    "Steer",
    "get_act_name",
    "hook_name",
    "llama_config",
]
# TransformerLens's names for HookedGPT2 and GPT2Config (compatibility layer: tl_names)
__all__ += ["HookedTransformer", "TransformerConfig"]
