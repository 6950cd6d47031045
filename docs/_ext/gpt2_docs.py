"""Sphinx extension of the gpt2-interp site.

- ``resolve_unlinked``: a Python cross-reference that Sphinx cannot resolve by itself is looked up as a real
  Python object: from the docstring's module and class, then by name among every module of the package, then as
  an importable name of another library. If that object is documented in the API reference (under any of the
  names the package exports it as), the reference links there; if it exists but is not part of the API
  reference (a private helper, a module, ``torch.Tensor``: there is no intersphinx offline), it renders as code
  without a link. A name that exists nowhere stays unresolved, and the strict build fails on it.
- ``findings``: the Results page includes ``analyses/README.md`` (the findings) with its figures, table links
  and a provenance link for every results folder a finding cites (``results_findings`` below).
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import pkgutil
import re
from functools import cache
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.nodes import make_refnode

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "gpt2_interp"
_MISSING = object()
_FIELD = object()  # a dataclass field or annotated attribute without a class-level value


@cache
def _modules() -> dict[str, Any]:
    """Every module of the package, imported (``__main__`` modules, which run the CLI, are left out)."""
    pkg = importlib.import_module(PACKAGE)
    out = {PACKAGE: pkg}
    for info in pkgutil.walk_packages(pkg.__path__, PACKAGE + "."):
        if info.name.endswith("__main__"):
            continue
        out[info.name] = importlib.import_module(info.name)
    return out


def _dotted(path: str) -> Any:
    """The object a dotted path names (module attributes and class attributes), or ``_MISSING``."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except Exception:
            continue
        for attr in parts[cut:]:
            try:
                obj = getattr(obj, attr)
            except Exception:
                annotated = isinstance(obj, type) and any(
                    attr in vars(k).get("__annotations__", {}) for k in obj.__mro__
                )
                return _FIELD if annotated else _MISSING
        return obj
    return _MISSING


def _lookup(target: str, module: str | None, cls: str | None) -> Any:
    name = target.lstrip(".")
    if not name:
        return _MISSING
    bases = []
    if module:
        if cls:
            bases.append(f"{module}.{cls}")
        parts = module.split(".")
        bases += [".".join(parts[:i]) for i in range(len(parts), 0, -1)]
    for base in [*bases, ""]:
        obj = _dotted(f"{base}.{name}" if base else name)
        if obj is not _MISSING:
            return obj
    first, _, rest = name.partition(".")
    for mod_name, mod in _modules().items():  # a name the docstring's own module defines or imports
        if mod_name.rsplit(".", 1)[-1] == first and rest:
            obj = _dotted(f"{mod_name}.{rest}")
            if obj is not _MISSING:
                return obj
        if mod_name.rsplit(".", 1)[-1] == name:
            return mod
        obj = _dotted(f"{mod_name}.{name}")
        if obj is not _MISSING:
            return obj
        for value in vars(mod).values():  # Class.attr written without its module
            if isinstance(value, type) and value.__name__ == first and rest:
                obj = _dotted(f"{value.__module__}.{name}")
                if obj is not _MISSING:
                    return obj
    if hasattr(builtins, name):
        return getattr(builtins, name)
    return _MISSING


def _documented(env) -> dict[int, list[str]]:
    """id(object) -> the full names under which the reference documents it."""
    py = env.get_domain("py")
    key = (len(py.objects), id(py.objects))
    memo = getattr(env, "_gpt2_documented", None)
    if memo and memo[0] == key:
        return memo[1]
    out: dict[int, list[str]] = {}
    for fullname in py.objects:
        obj = _dotted(fullname)
        if obj is not _MISSING:
            out.setdefault(id(obj), []).append(fullname)
    env._gpt2_documented = (key, out)
    return out


_IDENT = re.compile(r"[A-Za-z_][\w.]*")


def resolve_unlinked(app: Sphinx, env, node, contnode):
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"]
    module, cls = node.get("py:module"), node.get("py:class")
    if re.search(r"[\[\]|, ]", target):  # a piece of a type expression: every name in it must exist
        found = all(_lookup(n, module, cls) is not _MISSING for n in _IDENT.findall(target))
        return contnode if found else None
    obj = _lookup(target, module, cls)
    if obj is _MISSING:
        return None  # names nothing: the strict build reports it
    if obj is _FIELD:
        return contnode
    linkable = inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj) or isinstance(obj, property)
    names = _documented(env).get(id(obj)) if linkable else None  # values (ints, tuples) are not identities
    if names:
        fullname = sorted(names, key=lambda n: (-n.count("."), n))[0]
        entry = env.get_domain("py").objects[fullname]
        return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, fullname)
    return contnode  # exists, outside the API reference: code, no link


# ---- the findings page ------------------------------------------------------------------------------------------

FINDINGS = ROOT / "analyses" / "README.md"
MARKER = "<!-- findings: analyses/README.md -->"
_LINK = re.compile(r"(!?)\[([^\]]*)\]\((results/[^)\s#]+)(#[^)]*)?\)")
_FOLDER = re.compile(r"results/([a-z_0-9]+)/([A-Za-z0-9_.-]+)(?:/([A-Za-z0-9_.-]+))?")


def results_findings(text: str) -> str:
    """``analyses/README.md`` as a section of ``docs/results.md``: paths made relative to ``docs/``, the title
    dropped, and after every finding the provenance records of the results folders it cites."""
    body = text.split("\n", 1)[1] if text.startswith("# ") else text
    body = body.replace("](../docs/", "](")

    def link(m: re.Match) -> str:
        bang, label, path, anchor = m.group(1), m.group(2), m.group(3), m.group(4) or ""
        if bang:
            return f"![{label}](../analyses/{path})"
        return f"[{label}](../analyses/{path}){anchor}" if not anchor else f"[{label}](../analyses/{path})"

    body = _LINK.sub(link, body)
    sections = re.split(r"(?m)^(?=## )", body)
    out = []
    for section in sections:
        folders = []
        for m in _FOLDER.finditer(section):
            name, model, tag = m.group(1), m.group(2), m.group(3)
            base = ROOT / "analyses" / "results" / name / model
            if tag and (base / tag / "provenance.json").is_file():
                base = base / tag
            rel = base.relative_to(ROOT / "analyses" / "results").as_posix()
            if (base / "provenance.json").is_file() and rel not in folders:
                folders.append(rel)
        out.append(section.rstrip() + "\n")
        names = sorted(set(re.findall(r"gpt2-interp run ([a-z_0-9]+)", section)) & set(_experiments()))
        if names and section.startswith("## "):
            refs = ", ".join(f"{{ref}}`{n} <experiment-{n}>`" for n in names)
            out.append(f"\n**Experiment{'s' if len(names) > 1 else ''}**: {refs}.\n")
        if folders and section.startswith("## "):
            links = ", ".join(f"[{f}](../analyses/results/{f}/provenance.json)" for f in folders)
            out.append(f"\n**Provenance** (commit, command, settings, weights, machine): {links}.\n")
        out.append("\n")
    return "".join(out)


_MD_LINK = re.compile(r"(?<!!)\[([^\]]*)\]\((?!https?:|#|path:|mailto:)([^)\s#]+)(#[^)\s]*)?\)")


def repo_links(app: Sphinx, docname: str, text: str) -> str:
    """Markdown links from a page to repository files outside ``docs/`` (a benchmark's results, the model
    card) become links to a copy of the file (``path:``); a link to ``analyses/README.md`` goes to the Results
    page, which includes it. A link to a file that does not exist is left for the build to report."""
    srcdir = Path(app.srcdir).resolve()
    here = (srcdir / docname).parent

    def fix(m: re.Match) -> str:
        label, path, anchor = m.group(1), m.group(2), m.group(3) or ""
        target = (here / path).resolve()
        if target == FINDINGS:
            rel = Path("results.md")
            rel = Path(*([".."] * len(Path(docname).parent.parts)), "results.md") if Path(docname).parent.parts else rel
            return f"[{label}]({rel.as_posix()}{anchor})"
        if srcdir in target.parents or not target.exists():
            return m.group(0)
        return f"[{label}](path:{path})"

    return _MD_LINK.sub(fix, text)


CATALOG = "<!-- experiments: catalog -->"


@cache
def _experiments() -> dict[str, Any]:
    return dict(sorted(importlib.import_module(f"{PACKAGE}.experiments").load_all().items()))


def _md(text: str) -> str:
    """reST inline markup of a docstring as Markdown: ``code`` and :role:`target` become `code`."""
    text = re.sub(r":[a-z]+:`~?\.?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def experiment_catalog() -> str:
    """Every registered experiment: what it measures (its module's docstring) and its settings."""
    import dataclasses
    import sys

    out = []
    for name, exp in _experiments().items():
        doc = (sys.modules[exp.run.__module__].__doc__ or exp.summary or "").strip().split("\n\n")[0]
        out.append(f"(experiment-{name})=\n### `{name}`\n\n{_md(doc)}\n\n")
        rows = ["| setting | default | what it sets |", "|---|---|---|"]
        for f in dataclasses.fields(exp.config):
            if f.default is not dataclasses.MISSING:
                default = repr(f.default)
            elif f.default_factory is not dataclasses.MISSING:
                default = repr(f.default_factory())
            else:
                default = ""
            cells = [f"`{f.name}`", f"`{default}`" if default else "", _md(f.metadata.get("help", ""))]
            rows.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
        quick = ", ".join(f"`{k}={v!r}`" for k, v in getattr(exp.config, "QUICK", {}).items())
        out.append("\n".join(rows) + "\n\n" + (f"`--quick`: {quick}.\n\n" if quick else ""))
    return "".join(out)


def include_findings(app: Sphinx, docname: str, source: list[str]) -> None:
    if CATALOG in source[0]:
        source[0] = source[0].replace(CATALOG, experiment_catalog())
    if MARKER in source[0]:
        app.env.note_dependency(str(FINDINGS))
        source[0] = source[0].replace(MARKER, results_findings(FINDINGS.read_text()))
    if API_MARKER.search(source[0]):
        source[0] = API_MARKER.sub(lambda m: api_section(m.group(1)), source[0])
    if app.env.doc2path(docname).suffix == ".md":
        source[0] = repo_links(app, docname, source[0])


# ---- the API reference --------------------------------------------------------------------------------------------

API_MARKER = re.compile(r"<!-- api: ([\w.]+) -->")


@cache
def faces() -> dict[str, Any]:
    """Every package of gpt2_interp with an ``__all__`` (its face), and the top-level modules with one."""
    out = {}
    for name, mod in _modules().items():
        top_module = name.count(".") == 1 and not hasattr(mod, "__path__")
        if hasattr(mod, "__all__") and (hasattr(mod, "__path__") or top_module):
            out[name] = mod
    return out


def _key(name: str, obj: Any) -> Any:
    return id(obj) if callable(obj) or isinstance(obj, type) else (name, id(obj))


@cache
def canonical() -> dict[Any, tuple[str, str]]:
    """Each exported object -> (face, name) of the page that documents it: among the faces that export it,
    the one whose name is the longest prefix of the module that defines it (else the deepest)."""
    exporters: dict[Any, list[tuple[str, str]]] = {}
    for face, mod in faces().items():
        for name in mod.__all__:
            obj = getattr(mod, name)
            exporters.setdefault(_key(name, obj), []).append((face, name))
    out = {}
    for key, where in exporters.items():
        face, name = where[0]
        defined = getattr(getattr(faces()[face], name), "__module__", None) or ""

        def rank(fn: tuple[str, str], defined: str = defined) -> tuple[int, int]:
            prefix = defined == fn[0] or defined.startswith(fn[0] + ".")
            return (1 if prefix else 0, fn[0].count("."))

        out[key] = max(where, key=rank)
    return out


def _is_data(obj: Any) -> bool:
    return not (inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj))


def _data_doc(name: str, obj: Any) -> str:
    """The ``#:`` comment above the assignment that defines ``name`` (autodoc finds it only in the module that
    holds the assignment, never in a face that imports the value)."""
    for mod_name, mod in _modules().items():
        if getattr(mod, name, _MISSING) is obj:
            try:
                docs = ModuleAnalyzer.for_module(mod_name).find_attr_docs()
            except Exception:
                continue
            if ("", name) in docs:
                return "\n".join(docs[("", name)]).strip()
    return ""


def api_section(face: str) -> str:
    """The reference of one face: autodoc for its own classes and functions, and its constants (with the
    comment that documents them where they are defined, and their value when it is short)."""
    mod = faces()[face]
    own, data, elsewhere = [], [], []
    for name in mod.__all__:
        obj = getattr(mod, name)
        home = canonical()[_key(name, obj)]
        if home[0] != face:
            elsewhere.append((name, home))
        else:
            (data if _is_data(obj) else own).append(name)
    lines = ["```{eval-rst}", f".. automodule:: {face}"]
    if own:
        lines.append(f"   :members: {', '.join(own)}")
        lines.append("   :undoc-members:")
    for name in data:
        obj = getattr(mod, name)
        lines += ["", f".. py:data:: {name}", f"   :module: {face}"]
        value = repr(obj)
        if len(value) <= 100 and "\n" not in value:
            lines.append(f"   :value: {value}")
        else:
            lines.append(f"   :type: {type(obj).__name__}")
        doc = _data_doc(name, obj)
        if doc:
            lines += [""] + ["   " + line for line in doc.splitlines()]
    lines.append("```")
    if elsewhere:
        refs = ", ".join(f"{{py:obj}}`{n} <{h[0]}.{h[1]}>`" for n, h in elsewhere)
        lines.append(f"\nAlso exported by `{face}`, documented with the package that defines them: {refs}.")
    return "\n".join(lines) + "\n"


def check_reference(app: Sphinx, env) -> None:
    """Every face has a reference page, and every name it exports is documented (the strict build fails
    otherwise)."""
    from sphinx.util import logging

    log = logging.getLogger(__name__)
    py = env.get_domain("py")
    pages = {}
    for docname in env.found_docs:
        path = env.doc2path(docname)
        if path.suffix == ".md":
            for m in API_MARKER.finditer(path.read_text()):
                pages[m.group(1)] = docname
    for face in faces():
        if face not in pages:
            log.warning(f"API reference: no page documents {face} (add <!-- api: {face} --> to a page)")
            continue
        for name in faces()[face].__all__:
            home = canonical()[_key(name, getattr(faces()[face], name))]
            if home[0] == face and f"{face}.{name}" not in py.objects:
                log.warning(f"API reference: {face}.{name} is exported but not documented")


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("missing-reference", resolve_unlinked, priority=900)
    app.connect("source-read", include_findings)
    app.connect("env-check-consistency", check_reference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
