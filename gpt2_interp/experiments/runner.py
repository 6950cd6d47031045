"""The one runner: every experiment is run, written and recorded the same way.

``run_experiment(name, model, ...)`` resolves the config (defaults ← ``--quick`` ← settings), seeds
every generator, sets the threads, loads the model, calls the experiment's ``run`` with a
:class:`RunContext` (progress, resumable partial results, the earlier result to merge with) and
returns an :class:`ExperimentResult` with its provenance; with ``out`` it writes the result in the
fixed layout::

    <out>/<experiment>/<model>[/<tag>]/
        result.json        the data, the resolved config and the experiment's name
        provenance.json    what produced it (see :mod:`.provenance`)
        <table>.md         each table the experiment renders
        <figure>.png       each figure it renders
        .cache/            partial results a rerun with the same config and weights resumes from (not committed)

Only the experiments that ask :meth:`RunContext.cached` for their slow parts resume; the others compute
everything on every run. The run says which on stderr as it starts (``resuming: N cached parts found in …`` or
``no cached parts: computing everything …``), and saving over an earlier ``result.json`` says so too
(``overwriting <dir>/result.json (previous run from <date>, commit <sha>; …)``). A study that declines the run
(:class:`~gpt2_interp.experiments.base.Refused`) writes nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import os
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch

from ..core import progress as _progress
from ..core.boundary import boundary
from ..core.checks import check_path_name, check_writable
from ..core.result import Result, to_jsonable
from ..io.files import load_tree, read_json, save_tree, write_json
from . import provenance as prov
from .base import REGISTRY, Experiment, ExperimentConfig, Refused

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ..model import HookedGPT2

#: The environment variable that names study folders (separated by ``os.pathsep``).
STUDIES_ENV = "GPT2_INTERP_STUDIES"
T = TypeVar("T")


@boundary
def study_folders(studies: Sequence[str | Path] = ()) -> list[Path]:
    """The folders :func:`load_all` imports studies from, in order, each once and only those that exist:
    ``studies``, the folders in ``$GPT2_INTERP_STUDIES`` (``os.pathsep``-separated), ``./analyses``, then the
    ``analyses/`` folder of the source checkout the package runs from (beside its ``pyproject.toml``)."""
    from .. import __file__ as package_file

    checkout = Path(package_file).resolve().parents[1]
    candidates = [
        *map(Path, studies),
        *(Path(p) for p in os.environ.get(STUDIES_ENV, "").split(os.pathsep) if p),
        Path.cwd() / "analyses",
    ]
    if (checkout / "pyproject.toml").is_file():
        candidates.append(checkout / "analyses")
    folders: list[Path] = []
    for c in candidates:
        folder = c.expanduser().resolve()
        if folder.is_dir() and folder not in folders:
            folders.append(folder)
    return folders


def _import_study(path: Path) -> None:
    """Import the study file ``path``: as ``analyses.<name>`` when it lies in a folder named ``analyses`` that
    is (or can be) the package ``analyses``; else as ``gpt2_interp_studies_<digest>.<name>``, its folder made a
    package of that name (so the studies of one folder import each other with relative imports there too)."""
    folder = path.parent
    if folder.name == "analyses" and _as_package(folder):
        importlib.import_module(f"analyses.{path.stem}")
        return
    package = f"gpt2_interp_studies_{hashlib.sha256(str(folder).encode()).hexdigest()[:12]}"
    if package not in sys.modules:
        spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
        spec.submodule_search_locations = [str(folder)]
        sys.modules[package] = importlib.util.module_from_spec(spec)
    importlib.import_module(f"{package}.{path.stem}")


def _as_package(folder: Path) -> bool:
    """Whether ``folder`` is, or can be made, the package ``analyses`` (its parent put on ``sys.path``)."""
    module = sys.modules.get("analyses")
    if module is None:
        if str(folder.parent) not in sys.path and not importlib.util.find_spec("analyses"):
            sys.path.append(str(folder.parent))
        spec = importlib.util.find_spec("analyses")
        places = list(spec.submodule_search_locations or []) if spec is not None else []
    else:
        places = list(getattr(module, "__path__", []))
    return any(Path(p).resolve() == folder for p in places)


@boundary
def load_all(studies: Sequence[str | Path] = ()) -> dict[str, Experiment]:
    """Import every study (each registers itself with :func:`~.base.register`); returns the registry.

    A study is a module ``<folder>/<name>.py`` (names starting with ``_`` are helpers, not studies) in one
    of the study folders (:func:`study_folders`: ``studies``, ``$GPT2_INTERP_STUDIES``, ``./analyses``, the
    checkout's ``analyses/``). A folder named ``analyses`` is imported as the package ``analyses`` (its parent
    goes on ``sys.path``), so studies import each other and tests import ``analyses.<name>``; any other folder
    (or a second ``analyses``) is imported from its location as a package of its own (``_helper.py`` files
    shared by relative imports). One study name registered from two files raises ValueError naming both."""
    for folder in study_folders(studies):
        for path in sorted(folder.glob("*.py")):
            if not path.name.startswith("_"):
                _import_study(path)
    return REGISTRY


@boundary
def get(name: str, studies: Sequence[str | Path] = ()) -> Experiment:
    """The registered experiment ``name``, looked for in the study folders (:func:`load_all`, with the
    folders ``studies`` first); the error lists the names and the closest one."""
    import difflib

    experiments = load_all(studies)
    if name not in experiments:
        close = difflib.get_close_matches(name, list(experiments), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"no experiment {name!r}{hint} (experiments: {', '.join(sorted(experiments))})")
    return experiments[name]


@boundary
def result_dir(out: str | Path, experiment: str, model: str, tag: str | None = None) -> Path:
    """``<out>/<experiment>/<model>[/<tag>]``: where a run's files live; a ``tag`` (or an experiment name)
    that would place them outside ``out`` is refused (ValueError)."""
    check_path_name(experiment, "experiment")
    d = Path(out) / experiment / Path(model).name.replace(".gguf", "")
    return d / check_path_name(tag, "tag") if tag else d


@boundary
@dataclass
class RunContext:
    """What the runner hands an experiment besides the model and the config.

    ``progress``: whether to show progress bars (pass it to the library's ``progress=``).
    ``previous``: the data of an earlier result in the same place, for experiments that merge parts
    (reading it marks the new provenance as merged with the earlier one); ``previous_matching`` reads it
    only if it was made with the same values of the given fields.
    ``record(key, value)``: add resolved settings (e.g. per-model hyperparameters) to the provenance.
    ``cached(key, compute)``: a partial result kept on disk under the run's folder, keyed by the config,
    the weights and ``key``, so an interrupted or repeated run resumes instead of recomputing.
    ``out_dir``: the run's folder (None: nothing is written or cached); ``settings``: what
    ``record`` collected; ``cache_key``: the digest of experiment, config and weights; ``weights``:
    the model's weights fingerprint; ``experiment``: the experiment's name.
    """

    out_dir: Path | None = None
    progress: bool = True
    settings: dict[str, Any] = field(default_factory=dict)
    cache_key: str = ""
    weights: str = ""  # the model's weights fingerprint
    experiment: str = ""
    _earlier: ExperimentResult | None = None  # read on first use of ``previous`` (None: none there)
    _read_earlier: bool = False

    @property
    def previous(self) -> dict | None:
        """The earlier result's data in this run's folder (None if there is none); read when first asked for."""
        if not self._read_earlier:
            self._earlier, self._read_earlier = _earlier(self.out_dir, self.experiment), True
        return None if self._earlier is None else self._earlier.data

    def previous_matching(
        self, setting: str | None, expected: dict[str, Any], unrecorded: dict[str, Any] | None = None
    ) -> dict | None:
        """The earlier result's data (None if there is none), refused with one message naming every
        field whose recorded value differs from ``expected`` (``{field: value}``, compared with the
        earlier result's top-level fields; a dict value is compared key by key). ``unrecorded`` gives
        the value a field had when an older result did not record it. ``setting`` names the setting
        that asked for the merge, for the message (None: the experiment always merges)."""
        old = self.previous
        if old is None:
            return None
        unrecorded = unrecorded or {}

        differ: list[tuple[str, Any, Any]] = []
        for key, want in expected.items():
            had = old.get(key, unrecorded.get(key, "not recorded"))
            if isinstance(want, dict) and isinstance(had, dict):
                differ += [
                    (f"{key}.{k}", had.get(k, "not recorded"), v)
                    for k, v in want.items()
                    if had.get(k, "not recorded") != v
                ]
            elif had != want:
                differ.append((key, had, want))
        if differ:
            was = ", ".join(f"{k}={a!r}" for k, a, _ in differ)
            now = ", ".join(f"{k}={b!r}" for k, _, b in differ)
            who = self.experiment + (f" setting {setting}" if setting else "")
            raise ValueError(
                f"{who}: the earlier result in this folder has {was}; this run has "
                f"{now}: rerun with the same settings, or write to another --tag or --out"
            )
        return old

    def record(self, key: str, value: Any) -> None:
        """Record a resolved setting in the provenance under ``settings[key]``."""
        self.settings[key] = to_jsonable(value)

    def cached(self, key: str, compute: Callable[[], T], depends: Any = None) -> T:
        """``compute()``, or its saved value from an earlier run with the same weights and the same
        whole config — or, with ``depends`` (JSON-able), the same ``depends`` instead of the whole
        config: an exact sweep that does not depend on the estimators' settings is then reused when
        only those change. ``key`` names the partial result (a file ``.cache/<key>-<digest>.safetensors``,
        written by :func:`~gpt2_interp.io.files.save_tree`: tensors, dicts, lists, numbers, strings and result
        objects, read back without unpickling and refused when its digest does not match); without an
        ``out_dir`` nothing is kept."""
        if self.out_dir is None:
            return compute()
        digest = (
            self.cache_key
            if depends is None
            else hashlib.sha256(
                json.dumps([self.weights, to_jsonable(depends)], sort_keys=True, default=str).encode()
            ).hexdigest()
        )
        path = self.out_dir / ".cache" / f"{check_path_name(key, 'cache key')}-{digest[:16]}.safetensors"
        if path.exists():
            return load_tree(path, kind="experiment cache")
        value = compute()
        save_tree(path, value, kind="experiment cache", finite=False)
        return value


@boundary
@dataclass
class ExperimentResult(Result):
    """An experiment's data with the config and provenance that produced it; ``tables()``,
    ``figures()``, ``table()``/``plot()`` render it, ``save(dir)`` writes the layout above."""

    result_kind = "experiment"

    experiment: str
    model: str
    config: dict[str, Any]
    data: dict[str, Any]
    provenance: dict[str, Any] = field(default_factory=dict)

    def tables(self) -> dict[str, str]:
        """``{name: markdown}``."""
        return get(self.experiment).render_tables(self.data)

    def figures(self) -> dict[str, Figure]:
        """``{name: matplotlib Figure}``."""
        return get(self.experiment).render_figures(self.data)

    def table(self) -> str:
        """Every table, each under its name."""
        return "\n\n".join(f"## {k}\n\n{v}" for k, v in self.tables().items()) or "(no tables)"

    def plot(self, **kwargs: Any) -> Figure:
        """The first figure."""
        figs = self.figures()
        if not figs:
            raise ValueError(f"experiment {self.experiment!r} draws no figure")
        return next(iter(figs.values()))

    def save(self, directory: str | Path) -> Path:
        """Write ``result.json``, ``provenance.json``, the tables and the figures into ``directory``."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        body = {
            "experiment": self.experiment,
            "model": self.model,
            "config": self.config,
            "data": to_jsonable(self.data),
        }
        write_json(d / "result.json", body)
        write_json(d / "provenance.json", self.provenance)
        render(self, d)
        return d

    @classmethod
    def load(cls, directory: str | Path) -> ExperimentResult:
        """Read a result folder written by :meth:`save` (each file's digest checked, a missing field or a
        damaged file refused naming it: :func:`~gpt2_interp.io.files.read_json`)."""
        d = Path(directory)
        if not (d / "result.json").exists():
            raise FileNotFoundError(f"{d} holds no result.json (a folder written by the experiment runner)")
        body = read_json(d / "result.json", "experiment result", required=("experiment", "model", "data"))
        provenance = read_json(d / "provenance.json", "provenance") if (d / "provenance.json").exists() else {}
        return cls(body["experiment"], body["model"], body.get("config", {}), body["data"], provenance)


@boundary
def render(result: ExperimentResult, directory: str | Path) -> list[Path]:
    """Write the result's tables (``.md``) and figures (``.png``) into ``directory``; returns the paths."""
    d = Path(directory)
    paths = []
    for name, text in result.tables().items():
        paths.append(d / f"{name}.md")
        paths[-1].write_text(text.rstrip() + "\n")
    for name, fig in result.figures().items():
        paths.append(d / f"{name}.png")
        fig.savefig(paths[-1], dpi=130, bbox_inches="tight")
    return paths


def seed_everything(seed: int) -> None:
    """Seed torch, numpy and ``random``."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def resolve_config(exp: Experiment, quick: bool, settings: Mapping[str, Any]) -> ExperimentConfig:
    """Defaults, then ``QUICK`` when ``quick``, then ``settings`` (strings are parsed by field type)."""
    base = dict(exp.config.QUICK) if quick else {}
    return exp.config.from_settings({**base, **settings})


def _load_model(model: str | HookedGPT2, device: str | None, dtype: str | None) -> HookedGPT2:
    if not isinstance(model, str):
        return model
    from .. import load

    return load(model, device=device, dtype=dtype)


def _earlier(directory: Path | None, experiment: str) -> ExperimentResult | None:
    """The result of ``experiment`` already in ``directory``, if there is one."""
    if directory is None or not (directory / "result.json").exists():
        return None
    old = ExperimentResult.load(directory)
    return old if old.experiment == experiment else None


@boundary
def run_experiment(
    name: str,
    model: str | HookedGPT2 = "gpt2-facts",
    *,
    quick: bool = False,
    settings: Mapping[str, Any] | None = None,
    out: str | Path | None = None,
    tag: str | None = None,
    threads: int | None = None,
    device: str | None = None,
    dtype: str | None = None,
    progress: bool = True,
    argv: list[str] | None = None,
    studies: Sequence[str | Path] = (),
) -> ExperimentResult:
    """Run experiment ``name`` on ``model`` (a name/path, or a loaded model) and return its result with
    provenance; with ``out``, also write it to ``<out>/<name>/<model>[/<tag>]`` (``tag`` defaults to
    ``"quick"`` for quick runs). ``settings``: ``{field: value}`` over the config's defaults.

    ``quick``: start from the config's ``QUICK`` overrides (a small version); ``threads``: torch's
    CPU threads for the run (None: unchanged); ``device``/``dtype``: as for :func:`gpt2_interp.load`
    when ``model`` is a name; ``progress`` (default True): progress bars; ``argv``: the command
    recorded in the provenance (default ``sys.argv``); ``studies``: study folders to look in first
    (:func:`load_all`). Every generator is seeded with the config's
    ``seed`` before the run.

    Refused before any work — before the model loads — with a ValueError: an unknown experiment or setting
    (with the closest name), a setting that does not parse as its type, ``threads`` < 1, a ``tag`` that would
    leave ``out``, and an ``out`` that cannot be written (:func:`~gpt2_interp.core.checks.check_writable`,
    naming ``out``). The run's folder is created after the model has loaded."""
    exp = get(name, studies)
    settings = dict(settings or {})
    config = resolve_config(exp, quick, settings)
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    model_name = model if isinstance(model, str) else model.cfg.name
    given_tag, tag = tag, (tag if tag is not None else ("quick" if quick else None))
    directory = result_dir(out, name, model_name, tag) if out is not None else None
    if directory is not None:
        check_writable(directory, "out", "dir")  # refuse an unwritable place before the model loads
    if threads is not None:
        torch.set_num_threads(threads)
    started, t0 = prov.now_utc(), time.perf_counter()
    load_start, code = prov.load_average(), prov.code_state()  # the code as the run starts
    study = prov.study_state(exp.run.__module__)
    m = _load_model(model, device, dtype)
    created = directory is not None and not directory.exists()
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    identity = prov.model_identity(m)
    config_json = to_jsonable(dataclasses.asdict(config))
    keyed = {k: v for k, v in config_json.items() if k not in type(config).NOT_IN_CACHE_KEY}
    depends = [to_jsonable(exp.cache_depends())] if exp.cache_depends is not None else []  # the study's own
    cache_key = hashlib.sha256(
        json.dumps([name, keyed, identity["weights_fingerprint"], *depends], sort_keys=True).encode()
    ).hexdigest()
    ctx = RunContext(
        out_dir=directory,
        progress=progress,
        cache_key=cache_key,
        weights=identity["weights_fingerprint"],
        experiment=name,
    )
    if directory is not None:
        say(resume_line(exp, directory))
    seed_everything(config.seed)
    try:
        with _progress.enabled(progress):
            data = exp.run(m, config, ctx)
    except Refused:
        if created and directory is not None and out is not None:
            remove_empty(directory, Path(out))  # a refused run leaves no folder behind
        raise
    record = {
        "experiment": name,
        "command": prov.command_line(
            name,
            model_name,
            dict(settings),
            quick,
            given_tag,
            None if out is None else str(out),
            [str(s) for s in studies],
        ),
        "argv": argv if argv is not None else list(sys.argv),
        "config": config_json,
        "differs_from_defaults": to_jsonable(config.differences()),
        "settings": ctx.settings,
        "model": identity,
        "code": code,
        "study": study,
        "software": prov.software(),
        "machine": {
            **prov.machine(str(next(m.parameters()).device)),
            "load_at_start": load_start,
            "load_at_end": prov.load_average(),
        },
        "time": {"started": started, "wall_seconds": round(time.perf_counter() - t0, 2)},
    }
    if ctx._earlier is not None:  # the run read the earlier result to merge with it
        record["merged_with"] = ctx._earlier.provenance
    result = ExperimentResult(name, model_name, config_json, to_jsonable(data), record)  # as saved
    if directory is not None:
        if (directory / "result.json").exists():
            say(overwrite_line(directory, merged=ctx._earlier is not None))
        result.save(directory)
    return result


def say(line: str) -> None:
    """A line about the run (what it reuses, what it replaces) on stderr."""
    print(line, file=sys.stderr, flush=True)


def caches_parts(exp: Experiment) -> bool:
    """Whether the experiment's module asks :meth:`RunContext.cached` for any part (read from its source)."""
    import inspect

    try:
        return ".cached(" in inspect.getsource(sys.modules[exp.run.__module__])
    except (OSError, TypeError, KeyError):
        return True  # unknown: say what is on disk


def resume_line(exp: Experiment, directory: Path) -> str:
    """What a run in ``directory`` starts from: ``"resuming: N cached parts found in …"`` or
    ``"no cached parts: computing everything …"`` (saying when the experiment caches none at all)."""
    cache = directory / ".cache"
    parts = [p for p in cache.iterdir() if p.is_file() and not p.name.endswith(".tmp")] if cache.is_dir() else []
    if parts:
        return (
            f"resuming: {len(parts)} cached part{'s' if len(parts) != 1 else ''} found in {cache} (each reused when "
            "this run's config and weights match the run that stored it; every other part is computed)"
        )
    if caches_parts(exp):
        return f"no cached parts: computing everything ({exp.name} keeps its slow parts in {cache} for a rerun)"
    return f"no cached parts: computing everything ({exp.name} caches no parts: a rerun computes everything again)"


def overwrite_line(directory: Path, merged: bool = False) -> str:
    """``"overwriting <dir>/result.json (previous run from <date>, commit <sha>)"``: what saving over an
    earlier result replaces (``merged``: the new result holds the earlier one's parts)."""
    when = "an unrecorded time"
    try:
        prov_old = json.loads((directory / "provenance.json").read_text())
        code = prov_old.get("code", {})
        when = f"{prov_old['time']['started']}, commit {str(code.get('commit'))[:10]}" + (
            " with uncommitted changes" if code.get("dirty") else ""
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    what = "merged with this run" if merged else "its tables and figures are replaced too"
    return f"overwriting {directory / 'result.json'} (previous run from {when}; {what})"


def remove_empty(directory: Path, root: Path) -> None:
    """Remove ``directory`` and its parents below ``root`` while they are empty."""
    d = directory
    while d != root and root in d.parents and d.is_dir() and not any(d.iterdir()):
        d.rmdir()
        d = d.parent
