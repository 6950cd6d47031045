"""Per-method, per-model editing settings as data: ``hparams/<method>/<model>.json``.

Each file holds ``"settings"`` (names of :class:`~..settings.RomeHparams` / :class:`~..memit.MemitHparams`
fields and their values) and ``"justified_by"``: a list of groups ``{"settings": [names], "run":
"<results>/<study>/<model>" | "source": "<publication>", "why": "<one line>"}`` naming the result
folder of the study run (or the publication) behind every setting: the justification is data, kept with the
settings; the library reads it only to check its shape. ``<method>/default.json`` holds the
settings of a model without a file of its own; a model's file lists only what differs for it.

>>> load_hparams("rome", "gpt2-facts")["layer"]
0
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import cache
from importlib import resources
from typing import Any

from ...core.boundary import boundary

METHODS = ("rome", "memit", "alphaedit")
#: The documented form of a ``"run"`` entry: a relative results folder ``<results>/<study>/<model>``
#: (at least three parts, none of them ``..``); which study and which folder is the file's to say.
RUN_PATTERN = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9._-]*/)+(?P<study>[A-Za-z0-9_]+)/(?P<model>[A-Za-z0-9._-]+)")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@cache
def defaults_digest() -> str:
    """A digest of the package's settings files (:func:`settings_digest`): what a cached editing result
    depends on besides its config."""
    return settings_digest(resources.files(__package__))


def settings_digest(root: Any) -> str:
    """A digest of the ``"settings"`` of every settings file under the folder ``root``. The justifications
    are left out, so rewording one does not discard cached results."""
    h = hashlib.sha256()
    for name, entry in sorted(_json_files(root), key=lambda p: p[0]):
        settings = json.loads(entry.read_text()).get("settings")
        h.update(json.dumps([name, settings], sort_keys=True).encode())
    return h.hexdigest()


def _json_files(folder: Any, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for entry in folder.iterdir():
        if entry.is_dir():
            out += _json_files(entry, f"{prefix}{entry.name}/")
        elif entry.name.endswith(".json"):
            out.append((prefix + entry.name, entry))
    return out


def _check_method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return method


def _tuples(settings: dict[str, Any]) -> dict[str, Any]:
    """JSON lists as tuples (the dataclasses' sequence fields are tuples)."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()}


def _check_file(data: Any, where: str) -> None:
    """Raise naming ``where`` unless ``data`` has the documented shape (see the module doc)."""
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("settings"), dict)
        or not isinstance(data.get("justified_by"), list)
    ):
        raise ValueError(f"{where} must be a JSON object with 'settings' (an object) and 'justified_by' (a list)")
    covered: list[str] = []
    for i, group in enumerate(data["justified_by"]):
        if (
            not isinstance(group, dict)
            or not isinstance(group.get("settings"), list)
            or not isinstance(group.get("why"), str)
            or ("run" in group) == ("source" in group)
        ):
            raise ValueError(
                f"{where}: justified_by[{i}] must hold 'settings' (a list of names), 'why' (text) and "
                f"exactly one of 'run' (<results>/<study>/<model>) or 'source', got {group!r}"
            )
        if "run" in group:
            m = RUN_PATTERN.fullmatch(str(group["run"]))
            if m is None or ".." in str(group["run"]).split("/"):
                raise ValueError(
                    f"{where}: justified_by[{i}] run {group['run']!r} is not of the form "
                    "<results>/<study>/<model> (a relative results folder)"
                )
        covered += group["settings"]
    if sorted(covered) != sorted(data["settings"]):
        raise ValueError(
            f"{where}: justified_by must name every setting exactly once; settings "
            f"{sorted(data['settings'])}, named {sorted(covered)}"
        )


@cache
def _read(method: str, name: str) -> dict[str, Any] | None:
    """The parsed file ``<method>/<name>.json`` (checked), or None when there is none."""
    if not _NAME.fullmatch(name):
        return None
    path = resources.files(__package__).joinpath(method).joinpath(f"{name}.json")  # one part per call (3.10)
    if not path.is_file():
        return None
    where = f"gpt2_interp/editing/hparams/{method}/{name}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{where} is not valid JSON ({e})") from None
    _check_file(data, where)
    return data


@boundary
def hparams_file(method: str, model_name: str) -> dict[str, Any] | None:
    """The whole file of ``model_name`` (``"default"`` for the default file) as parsed JSON, or None."""
    data = _read(_check_method(method), model_name)
    return None if data is None else json.loads(json.dumps(data))


@boundary
def model_hparams(method: str, model_name: str) -> dict[str, Any]:
    """The settings that differ for ``model_name`` (its own file; empty when it has none)."""
    data = _read(_check_method(method), model_name)
    return {} if data is None or model_name == "default" else _tuples(data["settings"])


@boundary
def load_hparams(method: str, model_name: str) -> dict[str, Any]:
    """The settings of ``method`` for ``model_name``: ``default.json`` updated by the model's own file."""
    default = _read(_check_method(method), "default")
    return _tuples(default["settings"] if default else {}) | model_hparams(method, model_name)


#: Named presets (``hparams/preset-<name>.json``): ``"paper"`` selects the authors' algorithm and values.
PRESETS = ("paper",)


@cache
def _read_preset(preset: str) -> dict[str, Any]:
    """The parsed, checked file ``preset-<preset>.json``."""
    if preset not in PRESETS:
        raise ValueError(f"hparams preset must be one of {PRESETS} or None, got {preset!r}")
    where = f"gpt2_interp/editing/hparams/preset-{preset}.json"
    data = json.loads(resources.files(__package__).joinpath(f"preset-{preset}.json").read_text(encoding="utf-8"))
    for method, block in data["methods"].items():
        _check_file(block, f"{where} [{method}]")
        for model, own in block.get("models", {}).items():
            _check_file(own, f"{where} [{method}, {model}]")
    return data


@boundary
def preset_hparams(preset: str, method: str, model_name: str) -> dict[str, Any]:
    """The settings of ``preset`` for ``method`` on ``model_name``: the method's preset settings updated by
    the model's entry (its published size class; the name's case ignored) when the preset has one.

    >>> preset_hparams("paper", "rome", "gpt2-medium")["clamp_factor"]
    3.0
    """
    block = _read_preset(preset)["methods"][_check_method(method)]
    by_name = {name.lower(): entry for name, entry in block.get("models", {}).items()}
    own = by_name.get(model_name.lower(), {"settings": {}})  # a hub id's case varies: gpt-j-6B is gpt-j-6b
    return _tuples(block["settings"]) | _tuples(own["settings"])


@boundary
def models_with_hparams(method: str) -> list[str]:
    """The model names that have a file of their own for ``method``."""
    folder = resources.files(__package__).joinpath(_check_method(method))
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json") and p.name != "default.json")


__all__ = [
    "METHODS",
    "PRESETS",
    "RUN_PATTERN",
    "hparams_file",
    "load_hparams",
    "model_hparams",
    "models_with_hparams",
    "preset_hparams",
]
