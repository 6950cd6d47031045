"""A package face whose public names are imported on first use: ``__all__`` lists them, and
importing the package pays for none of its submodules until one of their names is read."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_face(
    package: str, names: Mapping[str, Sequence[str]], namespace: dict[str, Any]
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """``(__all__, __getattr__, __dir__)`` for ``package`` exporting ``names`` (``{submodule: names}``);
    a name is imported from its submodule when first read and then kept in ``namespace`` (the
    package's globals)."""
    where = {name: module for module, exported in names.items() for name in exported}

    def getattr_(name: str) -> Any:
        if name in where:
            value = getattr(importlib.import_module(f".{where[name]}", package), name)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(where))

    return sorted(where), getattr_, dir_
