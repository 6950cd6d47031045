"""The public API documents itself: every name a package's ``__all__`` exports (and every public method
and property of an exported class) has a docstring, explains its parameters when it takes more than two,
and parses as reStructuredText without errors or warnings — the API reference is built from these
docstrings alone (Sphinx autodoc), so what is missing or malformed here is missing or broken there.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import io
import pkgutil
import re
from collections.abc import Iterator
from typing import Any

import pytest

import gpt2_interp

PACKAGE = "gpt2_interp"
# Parameters that need no explanation: the receiver and the model every analysis takes first.
SELF_EVIDENT = {"self", "cls", "model"}
MAX_UNEXPLAINED = 2  # a callable with more parameters than this (beyond SELF_EVIDENT) explains them
# Sphinx's Python-domain roles and directives, unknown to plain docutils: accepted as no-ops.
SPHINX_ROLES = ("class", "func", "meth", "attr", "mod", "obj", "data", "exc", "const", "any", "ref", "doc", "term")
SPHINX_DIRECTIVES = ("seealso", "versionadded", "versionchanged", "deprecated", "note", "warning")


def _packages() -> list[str]:
    """Every package (``__init__``) under gpt2_interp, itself included."""
    names = [PACKAGE]
    for info in pkgutil.walk_packages(gpt2_interp.__path__, prefix=f"{PACKAGE}."):
        if info.ispkg:
            names.append(info.name)
    return sorted(names)


def _ours(obj: Any) -> bool:
    return (getattr(obj, "__module__", None) or "").startswith(PACKAGE)


def _exported() -> dict[str, Any]:
    """``{qualified name: object}`` for each function and class a package's ``__all__`` exports
    (each object once, under the first package that exports it)."""
    seen: dict[int, str] = {}
    out: dict[str, Any] = {}
    for name in _packages():
        module = importlib.import_module(name)
        for public in getattr(module, "__all__", ()):
            obj = getattr(module, public)
            if not (inspect.isclass(obj) or inspect.isfunction(obj)) or not _ours(obj) or id(obj) in seen:
                continue
            seen[id(obj)] = f"{name}.{public}"
            out[f"{name}.{public}"] = obj
    return out


def _members(cls: type) -> Iterator[tuple[str, Any, Any]]:
    """``(name, raw member, function)`` for each public method and property of ``cls`` (the function
    behind a static or class method; the property itself for a property),
    its own and those it inherits from classes of this package (not from ``object``, ``torch`` etc.)."""
    names: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if klass is cls or _ours(klass):
            for key, value in vars(klass).items():
                names[key] = value
        else:
            for key in vars(klass):
                names.pop(key, None)
    for key, raw in sorted(names.items()):
        if key.startswith("_"):
            continue
        if isinstance(raw, (staticmethod, classmethod)):
            yield key, raw, raw.__func__
        elif isinstance(raw, (property, functools.cached_property)) or inspect.isfunction(raw):
            yield key, raw, raw


@functools.cache
def _documented() -> tuple[dict[str, tuple[str, list[str]]], dict[str, str]]:
    """``({qualified name: (docstring, parameters to explain)}, {class: text that explains its fields
    besides its own docstring})`` over the whole public API: the docstrings of its base classes in this
    package and its fields' ``#:`` comments. An inherited member is named by the class defining it."""
    out: dict[str, tuple[str, list[str]]] = {}
    elsewhere: dict[str, str] = {}
    done: set[int] = set()
    exported = _exported()
    class_names = {id(obj): name for name, obj in exported.items()}
    for qualname, obj in exported.items():
        if not inspect.isclass(obj):
            out[qualname] = (inspect.cleandoc(obj.__doc__ or ""), _parameters(obj))
            continue
        out[qualname] = (_class_doc(obj), _parameters(obj))
        bases = [_class_doc(b) for b in obj.__mro__[1:] if _ours(b)]
        elsewhere[qualname] = "\n".join([*bases, _doc_comments(obj)])
        for key, raw, func in _members(obj):
            if id(func) in done:
                continue
            done.add(id(func))
            if isinstance(raw, (property, functools.cached_property)):
                doc, params = raw.__doc__, []
            else:  # a method without a docstring shows its base method's (autodoc does the same)
                doc, params = inspect.getdoc(getattr(obj, key)), _parameters(func)
            owner = next(k for k in obj.__mro__ if key in vars(k))
            where = class_names.get(id(owner), f"{owner.__module__}.{owner.__qualname__}")
            out[f"{where}.{key}"] = (inspect.cleandoc(doc or ""), params)
    return out, elsewhere


def _class_doc(cls: type) -> str:
    """The class's own docstring (a dataclass's or NamedTuple's generated ``Name(field, …)`` signature
    does not count)."""
    doc = vars(cls).get("__doc__") or ""
    if doc.startswith(f"{cls.__name__}("):
        return ""
    return inspect.cleandoc(doc)


def _parameters(obj: Any) -> list[str]:
    """The named parameters of a function, or of a class's constructor, that must be explained."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    names = [p.name for p in signature.parameters.values() if p.name not in SELF_EVIDENT and p.kind not in kinds]
    return [name for name in names if not name.startswith("_")]


def _doc_comments(cls: type) -> str:
    """The ``#:`` attribute doc comments in the bodies of ``cls`` and its bases in this package, as
    ``name: comment`` lines (autodoc shows them under the attribute, so they explain a field)."""
    lines = []
    for klass in cls.__mro__:
        if not _ours(klass):
            continue
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        for line in source.splitlines():
            match = re.match(r"\s+(\w+)\s*:[^#]*#:\s*(.+)", line)
            if match:
                lines.append(f"{match[1]}: {match[2]}")
    return "\n".join(lines)


def _sphinx_aware_docutils() -> Any:
    """``docutils.core`` with Sphinx's Python-domain roles (``:class:`` …) and directives registered as
    no-ops, so that only real reST errors are reported (the test is skipped without docutils)."""
    core = pytest.importorskip("docutils.core")
    from docutils import nodes
    from docutils.parsers.rst import Directive, directives, roles

    def noop_role(name, rawtext, text, lineno, inliner, options=None, content=None):
        return [nodes.literal(rawtext, text)], []

    class NoopDirective(Directive):
        has_content = True
        optional_arguments = 10
        final_argument_whitespace = True

        def run(self) -> list:
            return []

    for role in SPHINX_ROLES:
        roles.register_local_role(role, noop_role)
        roles.register_local_role(f"py:{role}", noop_role)
    for directive in SPHINX_DIRECTIVES:
        if directive not in ("note", "warning"):  # docutils has these two
            directives.register_directive(directive, NoopDirective)
    return core


def _rest_problems(core: Any, doc: str) -> list[str]:
    """docutils' system messages (level ≥ warning) for ``doc`` as one-line strings."""
    stream = io.StringIO()
    core.publish_doctree(
        doc,
        settings_overrides={"report_level": 2, "halt_level": 5, "warning_stream": stream, "input_encoding": "unicode"},
    )
    return [line for line in stream.getvalue().splitlines() if re.search(r"\((WARNING|ERROR|SEVERE)/", line)]


def test_the_walk_finds_the_public_api() -> None:
    """The walk reaches the names the reference must show (a broken walk would pass everything)."""
    for name in (
        "gpt2_interp.load",
        "gpt2_interp.HookedGPT2",
        "gpt2_interp.model.HookedRootModule.run_with_cache",
        "gpt2_interp.analysis.logit_lens",
        "gpt2_interp.editing.compute_edit",
        "gpt2_interp.editing.Edit.undo",
        "gpt2_interp.experiments.run_experiment",
    ):
        assert name in _documented()[0], name
    assert len(_documented()[0]) > 300


def test_every_public_name_has_a_docstring() -> None:
    missing = sorted(name for name, (doc, _) in _documented()[0].items() if not doc.strip())
    assert not missing, f"{len(missing)} public names without a docstring:\n" + "\n".join(missing)


def _unexplained(doc: str, params: list[str]) -> list[str]:
    return [p for p in params if not re.search(rf"(?<![\w]){re.escape(p)}(?![\w])", doc)]


def test_parameters_are_explained() -> None:
    """A callable with more than two parameters (beyond self/cls/model) names each one in its docstring
    (a class's fields may instead carry a ``#:`` doc comment, which autodoc shows under the field, or
    be explained by the docstring of a base class of this package)."""
    documented, elsewhere = _documented()
    bad = []
    for name, (doc, params) in sorted(documented.items()):
        if doc.strip() and len(params) > MAX_UNEXPLAINED:
            unexplained = _unexplained(doc + "\n" + elsewhere.get(name, ""), params)
            if unexplained:
                bad.append(f"{name}: {', '.join(unexplained)}")
    assert not bad, f"{len(bad)} docstrings leave parameters unexplained:\n" + "\n".join(bad)


def test_docstrings_parse_as_rest() -> None:
    core = _sphinx_aware_docutils()
    bad = []
    for name, (doc, _) in sorted(_documented()[0].items()):
        if doc.strip():
            bad.extend(f"{name}: {problem}" for problem in _rest_problems(core, doc))
    assert not bad, f"{len(bad)} reST problems in docstrings:\n" + "\n".join(bad)
