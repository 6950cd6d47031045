"""The hookable GPT-2: config, hook points and cache, modules, generation."""

from .config import KNOWN_CONFIGS, GPT2Config, TransformerConfig, llama_config
from .hooked_gpt2 import HookedGPT2, HookedTransformer
from .hooks import ActivationCache, HookPoint, hook_name
from .modules import KVCache

__all__ = ["GPT2Config", "TransformerConfig", "llama_config", "KNOWN_CONFIGS", "HookedGPT2", "HookedTransformer", "ActivationCache", "HookPoint", "hook_name", "KVCache"]
