"""Experiments: the analyses behind the findings, each a typed config plus ``run()``, run by one runner.

>>> from gpt2_interp.experiments import run_experiment
>>> result = run_experiment("logit_lens", "gpt2-facts", quick=True, out="results")
>>> result.provenance["code"]["commit"], result.tables().keys()

On the command line: ``gpt2-interp run --list``, ``gpt2-interp run NAME --help-settings`` (its settings),
``gpt2-interp run NAME --model smollm2-135m --set key=value … --out analyses/results``.
Each module of this package except the framework (``base``, ``provenance``, ``runner``) is one
experiment; it registers itself with :func:`register`.
"""

from .base import REGISTRY, Experiment, ExperimentConfig, Refused, parse_value, register
from .provenance import carried_over, code_state
from .runner import ExperimentResult, RunContext, get, load_all, render, result_dir, run_experiment

__all__ = [
    "REGISTRY",
    "Experiment",
    "ExperimentConfig",
    "ExperimentResult",
    "Refused",
    "RunContext",
    "carried_over",
    "code_state",
    "get",
    "load_all",
    "parse_value",
    "register",
    "render",
    "result_dir",
    "run_experiment",
]
