"""The hookable GPT-2: config, hook points and cache, modules, generation."""

from .cache import ActivationCache
from .config import KNOWN_CONFIGS, GPT2Config, TransformerConfig, llama_config
from .factored import FactoredMatrix
from .hooked_gpt2 import HookedGPT2, HookedTransformer
from .hooks import HookPoint, PortingWarning, get_act_name, hook_name
from .root import HookedRootModule
from .modules import KVCache

__all__ = ["GPT2Config", "TransformerConfig", "llama_config", "KNOWN_CONFIGS", "HookedGPT2", "HookedTransformer",
           "ActivationCache", "HookPoint", "hook_name", "KVCache", "HookedRootModule", "FactoredMatrix",
           "PortingWarning", "get_act_name"]
