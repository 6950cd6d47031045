"""The settings of the δ optimisation and the key: :class:`RomeHparams`, one typed field per choice, validated
in one place, each departure from the authors' code a named field (``preset="paper"`` selects theirs:
:func:`hparams_for`), and the per-model defaults read from ``hparams/rome/<model>.json``.

ROME (:mod:`.rome`) and MEMIT (:mod:`.memit`) both take these settings; the optimisation they drive is in
:mod:`.targets`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from ..core.boundary import boundary
from ..core.checks import check_choice, check_number
from .hparams import PRESETS, load_hparams, model_hparams, models_with_hparams, preset_hparams

if TYPE_CHECKING:
    from ..model import HookedGPT2

#: Default edit layer per model (``hparams/rome/<model>.json``' ``layer``); other models: ``n_layer // 3``.
DEFAULT_LAYERS: dict[str, int] = {
    name: int(model_hparams("rome", name)["layer"])
    for name in models_with_hparams("rome")
    if "layer" in model_hparams("rome", name)
}


#: How k* averages a request's prompt variants (``RomeHparams.key_weighting``).
KEY_WEIGHTINGS = ("uniform", "per_context_type")
#: Which state the update's target and residual are taken from (``RomeHparams.target_state``).
TARGET_STATES = ("averaged", "bare_prompt")
#: Where the essence KL is read on ``kl_prompt`` (``RomeHparams.kl_positions``).
KL_POSITIONS = ("subject_last_and_after", "subject_last")
#: What ``v_steps`` counts (``RomeHparams.step_count``).
STEP_COUNTS = ("updates", "evaluations")
#: How the context prefixes are generated (``RomeHparams.prefix_style``).
PREFIX_STYLES = ("sampled", "rome", "memit")
#: MEMIT's seed words for its context prefixes (memit_main.get_context_templates).
MEMIT_PREFIX_SEEDS = ("The", "Therefore", "Because", "I", "You")


@boundary
@dataclass
class RomeHparams:
    """ROME's hyperparameters (defaults: ROME's gpt2-medium/-xl settings; per model: ``hparams/rome/``).

    Every value is checked when the object is made (:meth:`__post_init__`): a wrong kind, a non-finite
    number or a value out of range raises naming the field.

    - ``layer``: the edit layer :func:`~.rome.compute_edit` uses when it is given none (None, or a layer
      the model does not have: :func:`default_layer`);
    - ``v_steps`` Adam steps on δ at learning rate ``v_lr``; ``early_stop``: stop when the total loss
      falls below it (with ``bare_early_stop``, the bare prompt's mean target NLL must also be below
      that);
    - ``kl_factor``: weight of the essence KL on ``kl_prompt`` (``"{} is a"``); ``keep_factor``: weight
      of the KL on a request's ``keep`` prompts; ``weight_decay``: weight of ‖δ‖ / ‖v₀‖²;
      ``clamp_factor``: ‖δ‖ ≤ ``clamp_factor`` · ‖v₀‖;
    - context prefixes: ``prefixes_per_length`` texts of each of ``prefix_lengths`` tokens, sampled
      with ``prefix_seed``;
    - ``exact_edit``: optimise δ under the rank-one update's exact effect (see the module doc);
    - ``bare_weight``: the NLL weight of the bare rewrite prompt (None: uniform over variants, as ROME);
    - ``corpus`` and ``n_samples``: the key statistics computed when ``stats=None`` (:mod:`.stats`);
    - ``preset``: the named preset the values came from (``"paper"``: the authors' algorithm, see
      :func:`hparams_for`), recorded in the edit (:attr:`~.edit.Edit.label`).

    Departures from the authors' code, each a named option (the first value is ours, the default; the
    documentation's editing guide tabulates them):

    - ``key_weighting``: ``"uniform"`` mean of the keys over every variant (ROME's k*) or
      ``"per_context_type"`` (MEMIT's ``compute_ks``: the bare prompt and each prefix length are one
      type each; the types' means are averaged; MEMIT's default, chosen by measurement:
      ``hparams/memit/default.json``);
    - ``target_state``: ``"averaged"`` (r-ROME: the update's residual and denominator use k*; MEMIT's
      target residual z and per-layer residual are averaged over the variants like the keys) or
      ``"bare_prompt"`` (the authors: the bare prompt's key / residual);
    - ``kl_positions``: ``"subject_last_and_after"`` (the KL on every position of ``kl_prompt`` from the
      subject's last token on) or ``"subject_last"`` (the authors: that token only);
    - ``step_count``: ``"updates"`` (``v_steps`` Adam updates) or ``"evaluations"`` (ROME's
      ``v_num_grad_steps``: loop passes, ``v_steps − 1`` updates);
    - ``prefix_style``: ``"sampled"`` (ours: ``prefix_lengths`` new tokens after BOS, seeded),
      ``"rome"`` (texts of ``prefix_lengths`` tokens counting the ``<|endoftext|>`` they start from) or
      ``"memit"`` (``prefixes_per_length / 5`` texts from each of MEMIT's seed words, the length
      counting the seed);
    - ``prepend_bos``: ``True`` (the δ optimisation's and the keys' prompts start with BOS, as the model
      reads text everywhere else) or ``False`` (the authors' code tokenises without it)."""

    layer: int | None = None  # edit layer when none is given (None: default_layer)
    v_steps: int = 20  # Adam steps on δ
    v_lr: float = 0.5  # Adam learning rate
    kl_factor: float = 0.0625  # weight of the essence KL on "{subject} is a"
    weight_decay: float = 0.5  # weight of ‖δ‖ / ‖v₀‖²
    clamp_factor: float = 4.0  # ‖δ‖ ≤ clamp_factor · ‖v₀‖
    early_stop: float = 0.05  # stop when the total loss falls below this
    prefix_lengths: tuple[int, ...] = (5, 10)  # lengths (tokens) of the generated context prefixes
    prefixes_per_length: int = 5  # prefixes sampled per length
    prefix_seed: int = 0
    kl_prompt: str = "{} is a"
    keep_factor: float = 1.0  # weight of the KL on a request's ``keep`` prompts (their next token)
    exact_edit: bool = True  # optimise δ under the rank-one update's exact effect (see module doc)
    bare_weight: float | None = None  # NLL weight of the bare rewrite prompt (None: uniform over variants, ROME)
    bare_early_stop: float | None = None  # early stop also needs the bare prompt's mean target NLL below this
    corpus: str | None = None  # key statistics corpus when stats=None (see stats.py)
    n_samples: int = 100_000  # key statistics sample size when stats=None
    # departures from the authors' code (first value: ours; see the class doc)
    key_weighting: str = "uniform"  # k*: uniform over variants (ROME) or "per_context_type" (MEMIT's compute_ks)
    target_state: str = "averaged"  # residual/denominator from k* (r-ROME) or "bare_prompt" (the authors')
    kl_positions: str = "subject_last_and_after"  # essence KL also after the subject; "subject_last": authors'
    step_count: str = "updates"  # v_steps counts Adam updates; "evaluations": ROME's loop passes (one fewer)
    prefix_style: str = "sampled"  # our seeded prefixes; "rome"/"memit": the authors' generation and lengths
    prepend_bos: bool = True  # the δ/key prompts start with BOS, as the model reads text; False: the authors'
    preset: str | None = None  # the named preset the values came from ("paper": the authors'), recorded

    def __post_init__(self) -> None:
        what = "ROME hyperparameter {}".format
        for name, choices in (
            ("key_weighting", KEY_WEIGHTINGS),
            ("target_state", TARGET_STATES),
            ("kl_positions", KL_POSITIONS),
            ("step_count", STEP_COUNTS),
            ("prefix_style", PREFIX_STYLES),
        ):
            setattr(self, name, check_choice(getattr(self, name), what(name), choices))
        if self.preset is not None:
            self.preset = check_choice(self.preset, what("preset"), PRESETS)
        for name, minimum in (("v_steps", 0), ("prefixes_per_length", 0), ("n_samples", 1), ("prefix_seed", None)):
            setattr(self, name, _integer(getattr(self, name), what(name), minimum))
        if self.layer is not None:
            self.layer = _integer(self.layer, what("layer"), 0)
        for name, low, low_open in (
            ("v_lr", 0, True),
            ("clamp_factor", 0, True),
            ("kl_factor", 0, False),
            ("weight_decay", 0, False),
            ("early_stop", 0, False),
            ("keep_factor", 0, False),
        ):
            setattr(self, name, check_number(getattr(self, name), what(name), low, low_open=low_open))
        if self.bare_weight is not None:
            self.bare_weight = check_number(self.bare_weight, what("bare_weight"), 0, 1)
        if self.bare_early_stop is not None:
            self.bare_early_stop = check_number(self.bare_early_stop, what("bare_early_stop"), 0)
        if isinstance(self.prefix_lengths, (str, bytes)) or not isinstance(self.prefix_lengths, (list, tuple)):
            raise ValueError(f"{what('prefix_lengths')} must be a list of integers, got {self.prefix_lengths!r}")
        self.prefix_lengths = tuple(_integer(x, f"{what('prefix_lengths')} entry", 1) for x in self.prefix_lengths)
        for name in ("exact_edit", "prepend_bos"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{what(name)} must be true or false, got {getattr(self, name)!r}")
        if not isinstance(self.kl_prompt, str) or self.kl_prompt.count("{}") != 1:
            raise ValueError(f"{what('kl_prompt')} must be a string holding '{{}}' once, got {self.kl_prompt!r}")
        if self.corpus is not None and not isinstance(self.corpus, (str, os.PathLike)):
            raise ValueError(f"{what('corpus')} must be a corpus name or path, got {self.corpus!r}")
        if self.prefix_style == "memit" and self.prefixes_per_length % len(MEMIT_PREFIX_SEEDS):
            raise ValueError(
                f"{what('prefixes_per_length')} must be a multiple of {len(MEMIT_PREFIX_SEEDS)} with "
                f"prefix_style 'memit' (one share per seed word), got {self.prefixes_per_length}"
            )

    @property
    def n_updates(self) -> int:
        """The Adam updates δ gets at most: ``v_steps`` (``step_count="updates"``) or ``v_steps − 1``
        (``"evaluations"``, ROME's loop)."""
        return self.v_steps if self.step_count == "updates" else max(self.v_steps - 1, 0)

    @classmethod
    def of(cls, **kwargs: Any) -> RomeHparams:
        """The hyperparameters with ``kwargs`` replacing the defaults; an unknown name raises listing the valid ones."""
        names = {f.name for f in fields(cls)}
        bad = sorted(set(kwargs) - names)
        if bad:
            raise ValueError(f"unknown ROME hyperparameter(s) {bad}; valid: {sorted(names)}")
        return cls(**kwargs)


#: Per-model overrides of :class:`RomeHparams` other than the layer (``hparams/rome/<model>.json``;
#: user arguments win). Each file names the run behind every value.
MODEL_HPARAMS: dict[str, dict[str, Any]] = {
    name: {k: v for k, v in model_hparams("rome", name).items() if k != "layer"}
    for name in models_with_hparams("rome")
    if set(model_hparams("rome", name)) - {"layer"}
}


def _integer(value: Any, what: str, minimum: int | None) -> int:
    """``value`` as an int (not a bool) ≥ ``minimum``, else a ValueError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(
            f"{what} must be an integer{'' if minimum is None else f' ≥ {minimum}'}, "
            f"got {value!r} ({type(value).__name__})"
        )
    if minimum is not None and value < minimum:
        raise ValueError(f"{what} must be an integer ≥ {minimum}, got {value}")
    return value


def hparams_for(model: HookedGPT2, **overrides: Any) -> RomeHparams:
    """:class:`RomeHparams` for ``model``: ``hparams/rome/default.json``, then the model's own file, then
    ``overrides``. With ``preset="paper"`` in ``overrides``: the dataclass defaults, the model's edit
    layer, then the preset's values for ROME (the authors' for the model's size class,
    ``hparams/preset-paper.json``), then the other ``overrides``."""
    preset = overrides.get("preset")
    if preset is None:
        return RomeHparams.of(**(load_hparams("rome", model.cfg.name) | overrides))
    own = {k: v for k, v in load_hparams("rome", model.cfg.name).items() if k == "layer"}
    return RomeHparams.of(**(own | preset_hparams(preset, "rome", model.cfg.name) | overrides))


def default_layer(model: HookedGPT2) -> int:
    """The edit layer used when ``layer=None``: the model's ``hparams/rome`` ``layer`` or ``n_layer // 3``."""
    layer = DEFAULT_LAYERS.get(model.cfg.name)
    return layer if layer is not None and layer < model.cfg.n_layer else model.cfg.n_layer // 3


__all__ = [
    "DEFAULT_LAYERS",
    "KEY_WEIGHTINGS",
    "KL_POSITIONS",
    "MEMIT_PREFIX_SEEDS",
    "MODEL_HPARAMS",
    "PREFIX_STYLES",
    "STEP_COUNTS",
    "TARGET_STATES",
    "RomeHparams",
    "default_layer",
    "hparams_for",
]
