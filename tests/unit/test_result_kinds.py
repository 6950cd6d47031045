"""Every result type names its kind, and a saved result finds its view by that name."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import gpt2_interp
from gpt2_interp.core.result import KIND_KEY, Result
from gpt2_interp.views import kind_of, view
from gpt2_interp.views.dispatch import FIELDS, VIEWS


def _result_types() -> list[type[Result]]:
    for info in pkgutil.walk_packages(gpt2_interp.__path__, "gpt2_interp."):
        if ".cli" not in info.name and not info.name.endswith("__main__"):
            importlib.import_module(info.name)
    found, todo = [], list(Result.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if not cls.__name__.startswith("_") and cls.__module__.startswith("gpt2_interp."):
            found.append(cls)
    return found


def test_every_result_type_names_its_own_kind():
    types = _result_types()
    assert len(types) >= 20
    kinds = {cls: cls.result_kind for cls in types}
    assert all(kinds.values()), [c.__name__ for c, k in kinds.items() if not k]
    assert len(set(kinds.values())) == len(kinds), "two result types share a kind"
    # every kind with a view belongs to a result type, and every fields rule names a kind with a view
    assert set(VIEWS) <= set(kinds.values())
    assert {name for name, _ in FIELDS} <= set(VIEWS)


def test_the_recorded_kind_decides_not_the_fields():
    # a dict naming its kind is that kind even when it also has another kind's fields
    assert kind_of({KIND_KEY: "lens", "traces": []}) == "lens"
    assert kind_of({"traces": []}) == "trace set"  # no kind recorded: its fields
    assert kind_of({KIND_KEY: "parameter table", "traces": []}) is None  # a kind without a view
    with pytest.raises(ValueError, match="no view for a result of kind 'parameter table'"):
        view({KIND_KEY: "parameter table", "rows": []})
