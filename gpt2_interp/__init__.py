"""gpt2-interp: take GPT-2 apart and put it back together differently.

>>> import gpt2_interp
>>> model = gpt2_interp.load("gpt2-facts")          # embedded fact model, offline
>>> logits, cache = model.run_with_cache("The capital of France is")

The house, bottom to top; a module imports only from the layers below it (never lazily upwards,
never another package's ``_private`` names). ``lint-imports`` checks this in the test suite.

==============  ===========================================================================
``cli``         ``gpt2-interp …``: parse, call the API, emit tables / JSON / figures
``demo``        the guided tour (the README's main job)
``factmodel``   training and measuring the embedded ``gpt2-facts``
``editing``     key statistics, ROME, the reversible ``Edit`` value, evaluation
``analysis``    lens, vocab, metrics, the batched engine, patching, tracing, attribution
``plots``       matplotlib ``Figure`` objects drawn from result objects
``views``       interactive pages (Plotly, self-contained HTML, Jupyter display) drawn from results
``model``       config, hook points and cache, blocks, generation, fingerprints
``facts``       the fact base as data: ``(prompt, subject, target)`` cases, prompt pairs, templates, corpus
``io``          tokenizers and checkpoint file formats
``core``        result base, progress bars, argument checks
==============  ===========================================================================
"""

import importlib
from typing import Any

from .model import KNOWN_CONFIGS, ActivationCache, GPT2Config, HookedGPT2, HookPoint
from .model.config import llama_config
from .model.loading import from_state_dict, from_transformer_lens, from_transformers, load, load_gguf, to_transformers
from .model.tl_names import HookedTransformer, TransformerConfig  # TransformerLens's names (docs/porting.md)

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it; CHANGELOG.md has its entry)
__all__ = [
    "KNOWN_CONFIGS",
    "ActivationCache",
    "GPT2Config",
    "HookPoint",
    "HookedGPT2",
    "HookedTransformer",
    "TransformerConfig",  # TransformerLens's names for HookedGPT2 and GPT2Config
    "from_state_dict",
    "from_transformer_lens",
    "from_transformers",
    "llama_config",
    "load",
    "load_gguf",
    "to_transformers",
]
_SUBPACKAGES = ("analysis", "editing", "plots", "views", "facts", "factmodel", "io", "model", "core")


def __getattr__(name: str) -> Any:
    """``gpt2_interp.analysis`` etc. without an explicit import (loaded on first use)."""
    if name in _SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
