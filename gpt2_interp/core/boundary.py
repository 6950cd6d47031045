"""The public boundary: every public function checks its arguments against its own signature.

``@boundary`` on a public function (or class: its ``__init__``) checks each argument against the function's
type hints at every call, before the body runs, and refuses a wrong one with a ``TypeError`` that names the
function, the parameter, what was given and what is accepted (for a ``Literal``, the closest valid choice): an
:class:`ArgumentError`, which is both a ``TypeError`` and a ``ValueError``. A few parameter names carry a rule
of their own wherever they appear (:data:`COUNTS`: a batch size or a number of samples is an integer ≥ 1). A
new public function inherits all of it by carrying the decorator, and ``tests/unit/test_boundary.py`` walks
every public name of every face to keep it so.

The type checks are beartype's (:func:`beartype.door.is_bearable`): a container's type, then every item of a list or
tuple (beartype alone samples one item, so a bad list would pass or fail by chance), no coercion or copy (values
pass through unchanged, so bit-exact results stay bit-exact), and driven by the signatures the code already states.
The hints are widened the way the library reads its arguments: an ``int`` hint accepts NumPy integers (and 0-d
integer tensors), a ``float`` hint ints and NumPy numbers (Python's numeric tower as NumPy extends it), a tuple of
any length a list, a sequence of numbers an array or a tensor. Hints are resolved at the first call, from the
function's module and the names its ``if TYPE_CHECKING:`` block imports (a name that cannot be resolved there is not
checked).
"""

from __future__ import annotations

import ast
import collections.abc as cabc
import dataclasses
import difflib
import functools
import importlib
import inspect
import sys
import textwrap
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np

F = TypeVar("F", bound=Callable[..., Any])

#: Parameter names that are counts wherever they appear: an integer argument below 1 is refused.
COUNTS = frozenset(
    {"batch_size", "forward_batch", "n_samples", "samples", "ig_steps", "max_batch", "chunk_size", "epochs"}
)
MARK = "__gpt2_interp_boundary__"


class ArgumentError(TypeError, ValueError):
    """An argument refused at the boundary (its type or its value): both a ``TypeError`` and a
    ``ValueError``, so that code catching either for a bad argument catches it. ``reason``: the message
    without the function's name (``"k must be an int, got str '3'"``); ``function``: that name."""

    def __init__(self, reason: str, function: str | None = None):
        super().__init__(reason + (f" — {function}()" if function else ""))
        self.reason, self.function = reason, function


def boundary(obj: F) -> F:
    """Check the arguments of the public function (or class constructor) ``obj`` against its signature at
    every call (see the module's docstring); returns the checked function (or the class, its ``__init__``
    checked)."""
    if isinstance(obj, type):
        init = obj.__init__  # type: ignore[misc]
        if getattr(init, MARK, None) is None:
            # a value that validates itself (a dataclass's __post_init__) answers first, in its own words;
            # what it lets through is then checked against the signature
            own = dataclasses.is_dataclass(obj) and hasattr(obj, "__post_init__")
            checked = _Checked(init, owner=obj.__qualname__, after=own)
            obj.__init__ = checked.wrap()  # type: ignore[misc]
        setattr(obj, MARK, getattr(obj.__init__, MARK))  # type: ignore[misc]
        return obj
    return typing.cast(F, _Checked(obj).wrap())


class _Checked:
    """One function's checks: its hints resolved (once, at the first call) and each argument tested."""

    def __init__(self, fn: Callable[..., Any], owner: str | None = None, after: bool = False):
        self.fn, self.sig, self.after = fn, inspect.signature(fn), after
        self.name: str = owner or str(getattr(fn, "__qualname__", getattr(fn, "__name__", "function")))
        self.hints: dict[str, Any] | None = None  # what is checked (widened)
        self.shown: dict[str, Any] = {}  # the hints as written (their descriptions), for messages

    def wrap(self) -> Callable[..., Any]:
        fn = self.fn

        if self.after:

            @functools.wraps(fn)
            def checked(*args: Any, **kwargs: Any) -> Any:
                try:
                    self.sig.bind(*args, **kwargs)
                except TypeError:
                    self.check(args, kwargs)  # names the function and the argument
                out = fn(*args, **kwargs)
                self.check(args, kwargs)
                return out

        else:

            @functools.wraps(fn)
            def checked(*args: Any, **kwargs: Any) -> Any:
                self.check(args, kwargs)
                return fn(*args, **kwargs)

        setattr(checked, MARK, self)
        return checked

    # ------------------------------------------------------------------ hints
    def resolved(self) -> dict[str, Any]:
        """``{parameter: hint}`` for the parameters whose hints could be resolved (``self``/``cls`` and
        ``Any`` left out)."""
        if self.hints is None:
            self.hints = {}
            ns = _namespace(self.fn)
            for p in self.sig.parameters.values():
                if p.name in ("self", "cls") or p.annotation is inspect.Parameter.empty:
                    continue
                hint = _resolve(p.annotation, ns)
                if hint is None:
                    continue
                if p.kind is p.VAR_POSITIONAL:
                    hint = tuple[hint, ...]  # type: ignore[valid-type]
                elif p.kind is p.VAR_KEYWORD:
                    hint = dict[str, hint]  # type: ignore[valid-type]
                self.hints[p.name] = _widen(hint)
                self.shown[p.name] = hint
        return self.hints

    # ----------------------------------------------------------------- checks
    def check(self, args: tuple, kwargs: dict) -> None:
        hints = self.resolved()
        try:
            bound = self.sig.bind(*args, **kwargs)
        except TypeError as e:
            raise ArgumentError(f"{self.name}(): {e}") from None  # Python's own wording names the function
        for name, value in bound.arguments.items():
            hint = hints.get(name)
            if hint is not None and not _bearable(value, hint):
                raise _violation(self.name, name, value, self.shown[name])
            if name in COUNTS and isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value < 1:
                raise ArgumentError(f"{name} must be an integer ≥ 1, got {value}", self.name)


def _bearable(value: Any, hint: Any) -> bool:
    """Whether ``value`` satisfies ``hint``, every item of a list or tuple included: beartype checks one item
    at random, which would make the same bad list pass or fail by chance."""
    from beartype.door import is_bearable

    if not is_bearable(value, hint, conf=_conf()):
        return False
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, set, frozenset)):
        return True
    alternatives = typing.get_args(hint) if _is_union(hint) else (hint,)
    items = [item for container, item in _sequences(hint) if isinstance(value, container)]
    others = [a for a in alternatives if not any(isinstance(value, c) for c, _ in _sequences(a))]
    if not items or any(is_bearable(value, a, conf=_conf()) for a in others):
        return True
    return any(all(_bearable(x, item) for x in value) for item in items)


@functools.cache
def _conf() -> Any:
    from beartype import BeartypeConf

    return BeartypeConf(is_pep484_tower=False, strategy=_strategy())


def _strategy() -> Any:
    from beartype import BeartypeStrategy

    return BeartypeStrategy.O1


def _violation(func: str, name: str, value: Any, hint: Any) -> Exception:
    """The error for ``value`` refused by ``hint``, in the library's words: the argument first, then what is
    accepted and what was given; for a list whose container is right, the first item at fault."""
    from beartype.door import is_bearable

    literal = _literal_values(hint)
    if literal and isinstance(value, str):
        choices = [v for v in literal if isinstance(v, str)]
        close = difflib.get_close_matches(value, choices, n=1)
        hint_text = f"; did you mean {close[0]!r}?" if close else ""
        return ArgumentError(f"{name} must be one of {', '.join(map(repr, literal))}; got {value!r}{hint_text}", func)
    for container, item in _sequences(hint):
        if isinstance(value, container) and not isinstance(value, (str, bytes)):
            for i, x in enumerate(typing.cast(Iterable[Any], value)):
                if not is_bearable(x, _widen(item), conf=_conf()):
                    one = f"{name}[{i}]"  # the item by its place: prompts[1], layers[0]
                    got = f"got {type(x).__name__} {_shown(x)} (in {name}={_shown(value)})"
                    return ArgumentError(f"{one} must be {describe(item)}, {got}", func)
    return ArgumentError(f"{name} must be {describe(hint)}, got {type(value).__name__} {_shown(value)}", func)


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _sequences(hint: Any) -> list[tuple[type, Any]]:
    """The ``(container type, item hint)`` alternatives of a hint (``list[int] | None`` → ``[(list, int)]``)."""
    found = []
    for h in typing.get_args(hint) if _is_union(hint) else (hint,):
        origin, args = typing.get_origin(h), typing.get_args(h)
        if origin in (list, cabc.Sequence, cabc.MutableSequence, set, frozenset, cabc.Collection) and args:
            found.append((origin, args[0]))
        elif origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            found.append((tuple, args[0]))
    return found


def _kind(value: Any) -> str:
    if isinstance(value, (list, tuple)) and value:
        return f"{type(value).__name__} of {type(value[0]).__name__}"
    return type(value).__name__


def _literal_values(hint: Any) -> list[Any]:
    if typing.get_origin(hint) is typing.Literal:
        return list(typing.get_args(hint))
    if _is_union(hint):
        return [v for a in typing.get_args(hint) for v in _literal_values(a)]
    return []


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def describe(hint: Any) -> str:
    """A hint in words: ``list[str] | None`` → "a list of strings or None"; ``Annotated[hint, "words"]`` →
    "words"."""
    if hint is type(None) or hint is None:
        return "None"
    if _is_union(hint):
        parts = [a for a in typing.get_args(hint) if not (isinstance(a, type) and issubclass(a, np.generic))]
        if float in parts and int in parts:  # a widened float: any real number
            parts.remove(int)
        if _sequences(hint):  # arrays and tensors, taken quietly for lists of numbers, go unsaid
            parts = [a for a in parts if getattr(a, "__name__", "") not in ("ndarray", "Tensor") or len(parts) == 1]
        words = list(dict.fromkeys(describe(a) for a in parts))
        return ", or ".join([", ".join(words[:-1]), words[-1]]) if len(words) > 2 else " or ".join(words)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin is typing.Annotated:  # Annotated[hint, "in words"]: the signature's own description
        return next((m for m in args[1:] if isinstance(m, str)), None) or describe(args[0])
    if origin in (list, cabc.Sequence, cabc.MutableSequence, set, frozenset, cabc.Iterable, cabc.Collection):
        what = {set: "a set", frozenset: "a set", cabc.Iterable: "an iterable"}.get(origin, "a list")
        return f"{what} of {_plural(args[0])}" if args else what
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_plural(args[0])}"
        return "a tuple (" + ", ".join(describe(a) for a in args) + ")"
    if origin in (dict, cabc.Mapping, cabc.MutableMapping):
        return f"a dict of {_plural(args[0])} to {_plural(args[1])}" if args else "a dict"
    if origin is type:
        return "a class"
    if origin in (cabc.Callable,) or hint is cabc.Callable:
        return "a callable"
    if isinstance(hint, type):
        if hint in _WORDS:
            return _WORDS[hint][0]
        if hint.__name__ in ("ndarray", "Tensor"):
            return "an array" if hint.__name__ == "ndarray" else "a tensor"
        return hint.__name__
    return str(hint).replace("typing.", "")


_WORDS: dict[type, tuple[str, str]] = {
    int: ("an int", "ints"),
    float: ("a number", "numbers"),
    str: ("a string", "strings"),
    bool: ("True or False", "bools"),
}


def _plural(hint: Any) -> str:
    """The items of a container hint in words: ``float`` → "numbers", ``int | str`` → "integers or strings"."""
    if _is_union(hint):
        parts = [a for a in typing.get_args(hint) if not (isinstance(a, type) and issubclass(a, np.generic))]
        if float in parts and int in parts:
            parts.remove(int)
        return " or ".join(dict.fromkeys(_plural(a) for a in parts))
    if isinstance(hint, type) and hint in _WORDS:
        return _WORDS[hint][1]
    return describe(hint)


# ---------------------------------------------------------------------------------------- resolution
def _namespace(fn: Callable[..., Any]) -> dict[str, Any]:
    """The names a hint of ``fn`` may use: its module's globals and what the module imports for type
    checkers only (``if TYPE_CHECKING:``), from the library and from packages already loaded."""
    target = inspect.unwrap(fn)
    module = sys.modules.get(getattr(target, "__module__", ""), None)
    ns: dict[str, Any] = dict(getattr(target, "__globals__", {}) or (vars(module) if module else {}))
    if module is not None:
        ns.update(_type_checking_names(module.__name__))
    return ns


@functools.cache
def _type_checking_names(module_name: str) -> dict[str, Any]:
    module = sys.modules[module_name]
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(module)))
    except (OSError, TypeError, SyntaxError):
        return {}
    found: dict[str, Any] = {}
    package = module.__package__ or module_name.rpartition(".")[0]
    for node in ast.walk(tree):
        if not (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)):
            continue
        for stmt in node.body:
            if not isinstance(stmt, ast.ImportFrom):
                continue
            source = "." * stmt.level + (stmt.module or "")
            absolute = importlib.util.resolve_name(source, package) if stmt.level else source
            if not absolute.startswith("gpt2_interp") and absolute not in sys.modules:
                continue  # a package not loaded (matplotlib for a hint): its hints are not checked
            try:
                mod = importlib.import_module(absolute)
            except ImportError:
                continue
            for alias in stmt.names:
                if hasattr(mod, alias.name):
                    found[alias.asname or alias.name] = getattr(mod, alias.name)
    return found


def _resolve(annotation: Any, ns: dict[str, Any]) -> Any:
    """The hint an annotation (a string under ``from __future__ import annotations``) stands for, or None
    when it cannot be resolved or checks nothing (``Any``, a type variable)."""
    if isinstance(annotation, str):
        try:
            annotation = eval(annotation, ns)
        except Exception:
            return None
    if annotation is Any or isinstance(annotation, TypeVar) or annotation is object:
        return None
    return annotation


def _widen(hint: Any) -> Any:
    """``int`` also accepts NumPy integers and 0-d integer tensors, ``float`` ints and NumPy numbers, a tuple of
    any length a list, a sequence of numbers a NumPy array or a tensor."""
    if hint is int:
        return int | np.integer | _int_tensor()
    if hint is float:
        return float | int | np.floating | np.integer
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if _is_union(hint):
        return functools.reduce(lambda a, b: a | b, [_widen(a) for a in args])
    if origin is typing.Annotated:  # words for messages stay out of what beartype checks
        checks = tuple(m for m in hint.__metadata__ if not isinstance(m, str))
        inner = _widen(args[0])
        return typing.Annotated.__class_getitem__((inner, *checks)) if checks else inner
    if origin is typing.Literal or not args:
        return hint
    if origin in (cabc.Callable, type):
        return cabc.Callable if origin is cabc.Callable else hint
    try:
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:  # any length: a list is taken as well
            widened = tuple[_widen(args[0]), ...] | list[_widen(args[0])]  # type: ignore[misc,valid-type]
        else:
            widened = origin[tuple(_widen(a) for a in args)]
    except TypeError:
        return hint
    numbers = origin in (list, tuple, cabc.Sequence) and all(a in (int, float, Ellipsis) for a in args)
    # an array or a tensor is a sequence of numbers too (the library reads it as one)
    return widened | np.ndarray | _tensor_type() if numbers else widened


@functools.cache
def _int_tensor() -> Any:
    """A 0-d integer tensor: an int as a tensor holds it (the library reads it with ``operator.index``)."""
    import torch
    from beartype.vale import Is

    return typing.Annotated[torch.Tensor, Is[lambda t: t.ndim == 0 and not t.is_floating_point()]]


@functools.cache
def _tensor_type() -> type:
    import torch

    return torch.Tensor


def checked_parameters(fn: Callable[..., Any]) -> dict[str, Any]:
    """``{parameter: hint}`` that the boundary of ``fn`` (a function or class carrying :func:`boundary`)
    checks; empty when ``fn`` carries none."""
    checked = getattr(fn, MARK, None)
    return {} if checked is None else dict(checked.resolved())


__all__ = ["COUNTS", "ArgumentError", "boundary", "checked_parameters", "describe"]
