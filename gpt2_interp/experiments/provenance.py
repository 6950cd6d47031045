"""Provenance: what produced a result — code, command, settings, weights, software, machine.

Every result the runner writes has a ``provenance.json`` beside it:

* ``code``: the package version, the git commit of the source tree and whether it had uncommitted
  changes (``dirty``, with the changed paths of the package and of the checkout's study modules,
  ``analyses/*.py``), or ``null`` outside a git checkout;
* ``study``: the study's module, its file and the sha256 of that file (:func:`study_state`), so a study
  from a folder of one's own is recorded too;
* ``command``: the command that reproduces the run (``gpt2-interp run …``) and the argv it came from;
* ``config``: the resolved settings, and ``differs_from_defaults`` (``{field: {used, default}}``);
* ``settings``: values the experiment resolved itself (e.g. an editor's per-model hyperparameters);
* ``model``: its name, class, parameter count and sha256 weights fingerprint;
* ``software``: Python, torch, numpy, transformers (when imported) and the platform;
* ``machine``: device, torch threads, CPU count, the 1/5/15-minute load at the start and the end;
* ``time``: start (UTC, ISO 8601) and wall seconds.

A result that was not produced by the runner carries a record made by :func:`carried_over` that says
exactly what is known about how it was made and lists what is not known.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..core.boundary import boundary

if TYPE_CHECKING:
    from ..model import HookedGPT2

SOURCE_ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    """git's output (trailing newline removed), None when git fails or is missing."""
    try:
        out = subprocess.run(["git", "-C", str(SOURCE_ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.rstrip("\n") if out.returncode == 0 else None


@boundary
def code_state() -> dict[str, Any]:
    """``{"version", "commit", "dirty", "changed"}`` of the package's source tree (git), commit
    ``None`` when the package is not a git checkout (an installed wheel)."""
    from .. import __version__

    top = _git("rev-parse", "--show-toplevel")
    # the package is a checkout's own source only when that checkout's root is the package's parent folder
    # (an installed wheel in a venv that happens to sit inside some git repository is not that repository's code)
    inside = top is not None and Path(top).resolve() == SOURCE_ROOT
    if not inside:
        return {"version": __version__, "commit": None, "dirty": None, "changed": []}
    paths = ("gpt2_interp", "pyproject.toml", ":(glob)analyses/*.py")  # the package and the checkout's studies
    status = _git("status", "--porcelain", "--untracked-files=all", "--", *paths) or ""
    changed = [line[3:] for line in status.splitlines() if line.strip() and "__pycache__" not in line]
    return {"version": __version__, "commit": _git("rev-parse", "HEAD"), "dirty": bool(changed), "changed": changed}


def study_state(module: str) -> dict[str, Any]:
    """``{"module", "file", "sha256"}`` of the module that defines a study (file and digest None when it has
    no file)."""
    import hashlib

    file = getattr(sys.modules.get(module), "__file__", None)
    digest = hashlib.sha256(Path(file).read_bytes()).hexdigest() if file and Path(file).is_file() else None
    return {"module": module, "file": file, "sha256": digest}


def software() -> dict[str, Any]:
    """Versions of what computes the numbers."""
    import numpy

    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
    }
    for name in ("transformers", "transformer_lens", "sklearn", "scipy"):
        mod = sys.modules.get(name)
        if mod is not None:
            out[name] = getattr(mod, "__version__", "?")
    return out


def load_average() -> list[float] | None:
    """The 1/5/15-minute load average (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def machine(device: str) -> dict[str, Any]:
    """Device, threads, CPU count and the load now."""
    out: dict[str, Any] = {
        "device": device,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_at_start": load_average(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        out["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return out


def model_identity(model: HookedGPT2) -> dict[str, Any]:
    """Name, class, parameter count and the weights' sha256 fingerprint."""
    from ..model.fingerprint import weights_fingerprint

    return {
        "name": model.cfg.name,
        "class": type(model).__name__,
        "n_params": model.n_params(),
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "weights_fingerprint": weights_fingerprint(model),
    }


def now_utc() -> str:
    """The time now, UTC, ISO 8601 to the second."""
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def command_line(
    experiment: str,
    model: str,
    settings: Mapping[str, Any],
    quick: bool,
    tag: str | None,
    out: str | None,
    studies: Sequence[str] = (),
) -> str:
    """The ``gpt2-interp run`` command that reproduces a run with these settings (``studies``: the study
    folders it was given, each a ``--studies``)."""
    parts = ["gpt2-interp", "run", *(a for s in studies for a in ("--studies", s)), experiment, "--model", model]
    if quick:
        parts.append("--quick")
    for k, v in settings.items():
        text = ",".join(map(str, v)) if isinstance(v, (list, tuple)) else ("none" if v is None else str(v))
        parts += ["--set", f"{k}={text}"]
    if tag:
        parts += ["--tag", tag]
    if out:
        parts += ["--out", out]
    return shlex.join(parts)


@boundary
def carried_over(
    result_files: Sequence[str | Path],
    *,
    known: Mapping[str, Any],
    unknown: Sequence[str],
    reproduce: str | None = None,
    note: str = "",
) -> dict[str, Any]:
    """The provenance record of a result that the runner did not produce: ``known`` holds what can be
    established (e.g. the command recorded in the file, the commit that last wrote it), ``unknown``
    names what cannot (e.g. ``"weights_fingerprint"``, ``"machine load"``), ``reproduce`` the runner
    command that would regenerate it. Such a record is never equivalent to a fresh run.
    ``result_files``: the files it describes; ``note``: free text kept with the record."""
    return {
        "carried_over": True,
        "files": [str(p) for p in result_files],
        "known": dict(known),
        "unknown": list(unknown),
        "reproduce": reproduce,
        "note": note,
        "recorded_at": now_utc(),
    }


def standalone(argv: Sequence[str], models: Sequence[HookedGPT2] = (), device: str = "cpu") -> dict[str, Any]:
    """The provenance record of a run outside the experiment runner (a benchmark): the command, the
    code, software and machine now, and the identity of each model it measured."""
    return {
        "command": shlex.join(["python", *argv]),
        "code": code_state(),
        "software": software(),
        "machine": {**machine(device), "load_at_end": load_average()},
        "models": [model_identity(m) for m in models],
        "written_at": now_utc(),
    }


def write_beside(path: str | Path, record: Mapping[str, Any]) -> Path:
    """Write ``record`` as ``<path without suffix>.provenance.json`` (e.g. ``RESULTS_forward.provenance.json``)."""
    from ..io.files import write_json

    return write_json(Path(path).with_suffix(".provenance.json"), dict(record))
