"""The hookable GPT-2: config, hook points and cache, modules, generation."""

from .config import KNOWN_CONFIGS, GPT2Config
from .hooked_gpt2 import HookedGPT2
from .hooks import ActivationCache, HookPoint, hook_name
from .modules import KVCache

__all__ = ["GPT2Config", "KNOWN_CONFIGS", "HookedGPT2", "ActivationCache", "HookPoint", "hook_name", "KVCache"]
