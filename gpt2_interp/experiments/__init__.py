"""The experiment runner: each study is a typed config plus ``run()``, run, written and recorded by one runner.

The package holds the runner only (``base``: :class:`Experiment`, :class:`ExperimentConfig`, :func:`register`;
``provenance``; ``runner``); the studies live outside it, one module each, in study folders (the repository's
``analyses/``, ``$GPT2_INTERP_STUDIES``, ``--studies DIR``; see :func:`load_all`). A study of one's own is one
small file::

    # mystudies/first_token.py
    from dataclasses import dataclass
    from gpt2_interp.experiments import ExperimentConfig, register

    @dataclass
    class Config(ExperimentConfig):
        prompt: str = "The Eiffel Tower is in"

    @register("first_token", Config)
    def run(model, cfg, ctx):
        return {"next": model.tokenizer.token_str(int(model.last_logits([cfg.prompt])[0].argmax()))}

run with ``gpt2-interp run --studies mystudies first_token --model gpt2`` or

>>> from gpt2_interp.experiments import run_experiment
>>> result = run_experiment("first_token", "gpt2", studies=["mystudies"], out="results")
>>> result.data, result.provenance["code"]["commit"]

On the command line: ``gpt2-interp run --list``, ``gpt2-interp run NAME --help-settings`` (its settings),
``gpt2-interp run NAME --model smollm2-135m --set key=value … --out results``.
"""

from .base import REGISTRY, Experiment, ExperimentConfig, Refused, parse_value, register
from .provenance import carried_over, code_state
from .runner import ExperimentResult, RunContext, get, load_all, render, result_dir, run_experiment, study_folders

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
    "study_folders",
]
