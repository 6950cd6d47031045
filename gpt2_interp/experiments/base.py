"""What an experiment is: a typed config, a ``run``, and how its data becomes tables and figures.

An experiment module defines a config dataclass (subclass of :class:`ExperimentConfig`) and registers
its ``run(model, config, ctx) -> dict`` with :func:`register`. The dict it returns is the experiment's
data (JSON-able); ``tables(data)`` and ``figures(data)`` render it, so a figure can be redrawn from a
saved result without running again. An experiment module is a study: it lives outside the package, in a
study folder the runner discovers (:func:`~gpt2_interp.experiments.runner.load_all`). The runner
(:mod:`.runner`) owns everything around that: parsing ``key=value`` settings into the config, seeding,
threads, the model, progress, the output layout and the provenance record.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, Union

from ..core.boundary import boundary

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..model import HookedGPT2


@boundary
@dataclass
class ExperimentConfig:
    """The settings every experiment has. Subclasses add their own fields (with a ``help`` in the
    field's metadata, shown by ``gpt2-interp run NAME --help``) and may set ``QUICK``: the overrides
    of ``--quick``, a small version for the test suite."""

    seed: int = field(default=0, metadata={"help": "seed of every random choice (torch, numpy, random)"})

    QUICK: ClassVar[dict[str, Any]] = {}
    #: Settings that choose which work runs but not what any cached partial result holds: left out of the
    #: cache key, so a rerun that changes only these reuses what was kept (e.g. ``mass_editing``'s ``only``).
    NOT_IN_CACHE_KEY: ClassVar[tuple[str, ...]] = ()

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"{self.label()} setting {f.name} must be finite, got {v}")

    @classmethod
    def label(cls) -> str:
        """How messages name this config: the experiment module's name for a class called ``Config``."""
        return cls.__module__.rsplit(".", 1)[-1] if cls.__name__ == "Config" else cls.__name__

    @classmethod
    def quick(cls, **overrides: Any) -> ExperimentConfig:
        """The quick version (``QUICK``), with ``overrides`` on top."""
        return cls.from_settings({**cls.QUICK, **overrides})

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> ExperimentConfig:
        """A config from ``{field: value}``; values may be strings (``--set key=value``), parsed by
        the field's type. Unknown fields are refused with the closest name."""
        names = [f.name for f in dataclasses.fields(cls)]
        hints = typing.get_type_hints(cls)
        label = cls.label()
        kwargs = {}
        for key, value in settings.items():
            key = key.replace("-", "_")
            if key not in names:
                close = difflib.get_close_matches(key, names, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ValueError(f"{label} has no setting {key!r}{hint} (settings: {', '.join(names)})")
            kwargs[key] = parse_value(value, hints[key], f"{label} setting {key}") if isinstance(value, str) else value
        return cls(**kwargs)

    def differences(self) -> dict[str, dict[str, Any]]:
        """``{field: {"used": value, "default": default}}`` for every field that differs from the default."""
        out = {}
        for f in dataclasses.fields(self):
            default = (
                f.default
                if f.default is not dataclasses.MISSING
                else (f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
            )
            v = getattr(self, f.name)
            if default is dataclasses.MISSING or v != default:
                out[f.name] = {"used": v, "default": None if default is dataclasses.MISSING else default}
        return out

    @classmethod
    def describe(cls) -> str:
        """One line per field: name, type, default and help."""
        hints = typing.get_type_hints(cls)
        rows = []
        for f in dataclasses.fields(cls):
            default = (
                f.default
                if f.default is not dataclasses.MISSING
                else (f.default_factory() if f.default_factory is not dataclasses.MISSING else "required")
            )
            quick = f" (quick: {cls.QUICK[f.name]!r})" if f.name in cls.QUICK else ""
            rows.append(
                f"  {f.name} ({type_name(hints[f.name])}, default {default!r}{quick}): {f.metadata.get('help', '')}"
            )
        return "\n".join(rows)


def type_name(tp: Any) -> str:
    """``int``, ``list[str]``, ``float | None`` …: a type as a user reads it."""
    return tp.__name__ if isinstance(tp, type) else str(tp).replace("typing.", "")


@boundary
def parse_value(text: str, tp: Any, what: str) -> Any:
    """Parse the text of a ``key=value`` setting as type ``tp`` (int, float, bool, str, Path, a
    ``Literal``, an optional ``X | None`` where ``none`` is None, or a list/tuple of those written
    ``a,b,c``, empty for an empty list). ``what`` names the setting in errors: text that does not
    parse as ``tp``, a non-finite float, or a type that cannot be given as text raises ValueError."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        if text.strip().lower() in ("none", "null") and len(inner) < len(args):
            return None
        errors = []
        for a in inner:
            try:
                return parse_value(text, a, what)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(errors[0] if len(errors) == 1 else f"{what}: cannot read {text!r} as {type_name(tp)}")
    if origin in (list, tuple):
        item = args[0] if args else str
        parts = [p.strip() for p in text.split(",")] if text.strip() else []
        values = [parse_value(p, item, what) for p in parts]
        return values if origin is list else tuple(values)
    if origin is typing.Literal:
        for a in args:
            if str(a) == text:
                return a
        raise ValueError(f"{what} must be one of {', '.join(map(repr, args))}, got {text!r}")
    if tp is bool:
        low = text.strip().lower()
        if low in ("1", "true", "yes", "on"):
            return True
        if low in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{what} must be true or false, got {text!r}")
    if tp in (int, float):
        try:
            value = tp(text)
        except ValueError:
            raise ValueError(f"{what} must be {'an integer' if tp is int else 'a number'}, got {text!r}") from None
        if tp is float and not math.isfinite(value):
            raise ValueError(f"{what} must be finite, got {text!r}")
        return value
    if tp is Path:
        return Path(text)
    if tp is str or tp is Any:
        return text
    raise ValueError(f"{what}: settings of type {type_name(tp)} cannot be given as text")


class Refused(ValueError):
    """A study declines the run it was asked for (a task the model does not perform, prompts that do not fit
    its tokenizer): raised from its ``run``, it leaves no result behind — the runner writes nothing and
    ``gpt2-interp run`` exits with status 2, the message on one line."""


C = TypeVar("C", bound=ExperimentConfig)
RunFn = Callable[["HookedGPT2", Any, Any], dict]


@boundary
@dataclass(frozen=True)
class Experiment:
    """A registered experiment: its name, config class, ``run`` and renderers.

    ``tables(data) -> {name: markdown}`` and ``figures(data) -> {name: Figure}`` render the data
    ``run`` returned (None: none); ``summary``: one line describing the experiment (``run --list``);
    ``cache_depends() -> JSON-able``: what its cached parts depend on besides its config and the weights
    (e.g. the editing defaults' digest, :func:`gpt2_interp.editing.hparams.defaults_digest`), folded into
    the cache key (None: nothing else)."""

    name: str
    config: type[ExperimentConfig]
    run: RunFn
    tables: Callable[[dict], dict[str, str]] | None = None
    figures: Callable[[dict], dict[str, Figure]] | None = None
    summary: str = ""
    cache_depends: Callable[[], Any] | None = None

    def render_tables(self, data: dict) -> dict[str, str]:
        """``{name: markdown}`` from the experiment's data."""
        return dict(self.tables(data)) if self.tables else {}

    def render_figures(self, data: dict) -> dict[str, Figure]:
        """``{name: Figure}`` from the experiment's data."""
        return dict(self.figures(data)) if self.figures else {}


REGISTRY: dict[str, Experiment] = {}


@boundary
def register(
    name: str,
    config: type[C],
    *,
    tables: Callable[[dict], dict[str, str]] | None = None,
    figures: Callable[[dict], dict[str, Figure]] | None = None,
    summary: str | None = None,
    cache_depends: Callable[[], Any] | None = None,
) -> Callable[[RunFn], RunFn]:
    """Decorator: register ``run(model, config, ctx) -> dict`` as experiment ``name`` with its
    ``config`` class (an :class:`ExperimentConfig` dataclass, else TypeError), the renderers
    ``tables`` and ``figures`` and ``cache_depends`` (see :class:`Experiment`). ``summary`` defaults to
    the first line of the defining module's docstring. A name registered by another module raises
    ValueError naming both modules' files."""
    if not (dataclasses.is_dataclass(config) and issubclass(config, ExperimentConfig)):
        raise TypeError(f"experiment {name!r}: config must be an ExperimentConfig dataclass, got {config!r}")

    def deco(run: RunFn) -> RunFn:
        import sys

        doc = summary if summary is not None else (sys.modules[run.__module__].__doc__ or "").strip().split("\n")[0]
        if name in REGISTRY and REGISTRY[name].run.__module__ != run.__module__:
            raise ValueError(
                f"experiment {name!r} is registered twice: in {module_file(REGISTRY[name].run.__module__)} "
                f"and in {module_file(run.__module__)}"
            )
        REGISTRY[name] = Experiment(name, config, run, tables, figures, doc, cache_depends)
        return run

    return deco


def module_file(module: str) -> str:
    """The file a module was loaded from (its name when it has none)."""
    import sys

    return str(getattr(sys.modules.get(module), "__file__", None) or module)
