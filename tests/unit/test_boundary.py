"""Every public function checks its arguments at the boundary: the faces are walked, and each public function
and class is called with arguments of a type no signature accepts; each must refuse naming a parameter, before
any work. The mechanism's rules are checked against hand-written cases."""

from __future__ import annotations

import enum
import importlib
import inspect
import pkgutil
import typing
from collections.abc import Sequence
from typing import Literal

import numpy as np
import pytest

import gpt2_interp
from gpt2_interp.core.boundary import MARK, boundary, checked_parameters


def _faces() -> list[str]:
    return ["gpt2_interp"] + [m.name for m in pkgutil.walk_packages(gpt2_interp.__path__, "gpt2_interp.") if m.ispkg]


def _public() -> dict[str, object]:
    """Every public function and class of every face (``__all__``), by ``face.name``; constants, exception and
    warning types, enums and protocols (nothing to call with arguments) left out."""
    found = {}
    for face in _faces():
        mod = importlib.import_module(face)
        for name in getattr(mod, "__all__", []):
            obj = getattr(mod, name)
            if inspect.isclass(obj):
                if issubclass(obj, (BaseException, enum.Enum)) or getattr(obj, "_is_protocol", False):
                    continue
                if obj.__init__ is object.__init__:  # an interface or mixin: nothing to construct
                    continue
            elif not inspect.isfunction(obj):
                continue
            found[f"{face}.{name}"] = obj
    return found


PUBLIC = _public()


class _Wrong:
    """A value of a type no public signature accepts."""

    def __repr__(self) -> str:
        return "<wrong>"


def test_every_public_function_and_class_carries_the_boundary():
    missing = sorted(name for name, obj in PUBLIC.items() if getattr(obj, MARK, None) is None)
    assert not missing, f"public names without @boundary: {missing}"
    assert len(PUBLIC) > 250  # the walk found the faces


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_a_wrong_type_is_refused_naming_a_parameter(name):
    obj = PUBLIC[name]
    params = checked_parameters(obj)
    target = obj.__init__ if inspect.isclass(obj) else obj
    sig = inspect.signature(target)
    names = [p for p in sig.parameters if p not in ("self", "cls")]
    if not names:
        pytest.skip("takes no arguments")
    if all(sig.parameters[p].annotation in ("Any", typing.Any) for p in names):
        pytest.skip("its signature accepts any value for every parameter")
    assert params, f"{name}: no parameter has a type hint the boundary can check"
    kinds = {p.name: p.kind for p in sig.parameters.values()}
    positional = (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
    )
    args = [_Wrong() for p in names if kinds[p] in positional]
    kwargs = {p: _Wrong() for p in names if kinds[p] is inspect.Parameter.KEYWORD_ONLY}
    with pytest.raises((TypeError, ValueError)) as info:
        obj(*args, **kwargs)
    message = str(info.value)
    assert any(f"{p} must be" in message or f"{p}[0] must be" in message for p in params), f"{name}: {message}"


# ------------------------------------------------------------------------------------ the rules themselves
@boundary
def _f(
    n: int,
    xs: Sequence[float],
    texts: str | Sequence[str],
    mode: Literal["mean", "last"] = "mean",
    batch_size: int | None = None,
) -> int:
    return n


def test_numbers_follow_the_numeric_tower_and_strings_are_not_lists_of_numbers():
    assert _f(np.int64(3), [1, 2.5, np.float32(1)], "a") == 3
    with pytest.raises(TypeError, match=r"^n must be an int, got float 3.0 — _f\(\)$"):
        _f(3.0, [1.0], "a")
    with pytest.raises(TypeError, match=r"xs must be a list of numbers, got str '1,2'"):
        _f(1, "1,2", "a")
    with pytest.raises(TypeError, match="texts must be a string or a list of strings"):
        _f(1, [1.0], 5)


def test_every_item_of_a_list_is_checked_not_a_sample():
    # one bad item among many: refused on every call, whichever item a sampling checker would have drawn
    bad = ["a"] * 40 + [5] + ["b"] * 40
    for _ in range(50):
        with pytest.raises(TypeError, match=r"texts\[40\] must be a string, got int 5"):
            _f(1, [1.0], bad)
    with pytest.raises(TypeError, match=r"xs\[30\] must be a number, got str 'x'"):
        _f(1, [1.0] * 30 + ["x"], "a")


def test_a_literal_names_its_choices_and_the_closest_one():
    with pytest.raises(ValueError, match="mode must be one of 'mean', 'last'; got 'lats'; did you mean 'last'"):
        _f(1, [1.0], "a", mode="lats")


def test_counts_are_at_least_one_wherever_they_are_named():
    assert _f(1, [1.0], "a", batch_size=None) == 1
    with pytest.raises(ValueError, match="batch_size must be an integer ≥ 1, got 0"):
        _f(1, [1.0], "a", batch_size=0)


def test_a_bad_call_shape_names_the_function():
    with pytest.raises(TypeError, match=r"_f\(\): missing a required argument: 'xs'"):
        _f(1)
    with pytest.raises(TypeError, match=r"_f\(\): got an unexpected keyword argument 'nn'"):
        _f(1, [1.0], "a", nn=2)


def test_values_pass_through_unchanged():
    @boundary
    def same(x: list[float]) -> list[float]:
        return x

    xs = [1.0, 2.0]
    assert same(xs) is xs  # no copy, no coercion


def test_hints_imported_for_type_checkers_only_are_resolved():
    from gpt2_interp.analysis import logit_lens
    from gpt2_interp.model import HookedGPT2

    assert checked_parameters(logit_lens)["model"] is HookedGPT2
    assert typing.get_origin(checked_parameters(logit_lens)["k"]) is not None or checked_parameters(logit_lens)["k"]
