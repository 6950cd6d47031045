"""The page every view is: HTML sections and Plotly figures, with plotly.js inside the page once.

A :class:`View` is a list of parts (a heading or paragraph, a Plotly figure, a small interactive widget
with its own script). :meth:`View.html` writes one self-contained page — plotly.js is embedded a single
time, however many figures the page holds, so the file opens from disk with no network: its cartesian
bundle shipped with the package (1.5 MB, every trace type the views draw), or the whole library of the
installed ``plotly`` package (4.8 MB) for a page with a figure of another trace type. In Jupyter a view
displays itself through ``_repr_html_``; the library is sent to the notebook with the first view of the
kernel and reused by every later one.
"""

from __future__ import annotations

import html as _html
import itertools
import json
import re
import webbrowser
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.boundary import boundary

STYLE = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:1.2em auto;max-width:1200px;padding:0 1em;
color:#222;line-height:1.45}
.g2v-view{margin:0.6em 0 1.6em 0}
.g2v-view h2{font-size:1.15em;margin:0.3em 0}
.g2v-note{color:#555;font-size:0.9em;margin:0.2em 0 0.5em 0}
.g2v-controls{margin:0.3em 0;font-size:0.9em}
.g2v-controls select{margin-right:1em}
.g2v-tokens{font-family:ui-monospace,monospace;line-height:2;margin:0.4em 0}
.g2v-tok{padding:2px 1px;margin:0 1px;border-radius:3px;cursor:pointer;white-space:pre;border:1px solid #ddd}
.g2v-tok.g2v-sel{outline:2px solid #d62728}
.g2v-info{font-family:ui-monospace,monospace;font-size:0.85em;color:#333;min-height:1.3em}
table.g2v-table{border-collapse:collapse;font-size:0.9em;margin:0.5em 0}
table.g2v-table td,table.g2v-table th{border:1px solid #ccc;padding:2px 8px;text-align:left}
code{background:#f3f3f3;padding:0 3px;border-radius:3px}
"""

_ids = itertools.count()
_notebook_loaded: str | None = None  # the plotly.js bundle sent to this kernel's notebook ("cartesian", "full")

#: plotly.js's cartesian partial bundle (npm ``plotly.js-cartesian-dist-min``, MIT; the version in its first
#: lines), shipped beside this module: 1.5 MB where the whole library is 4.8 MB, and about half its start-up
#: time in a freshly started browser. It draws every trace type in :data:`CARTESIAN_TRACES`.
CARTESIAN_BUNDLE = Path(__file__).with_name("data") / "plotly-cartesian.min.js"
#: The trace types plotly.js's cartesian bundle holds: all that the views draw.
CARTESIAN_TRACES = frozenset(
    {"scatter", "bar", "box", "heatmap", "histogram", "histogram2d", "histogram2dcontour", "contour", "pie", "violin"}
    | {"image"}
)


def _cartesian_js() -> str | None:
    """The shipped cartesian bundle when it is there and of the plotly.js version the installed ``plotly``
    writes figures for; else None (the pages then carry the whole library)."""
    from plotly.offline import get_plotlyjs_version

    try:
        head = CARTESIAN_BUNDLE.read_text(encoding="utf-8")
    except OSError:
        return None
    return head if f"v{get_plotlyjs_version()}\n" in head[:200] else None


@boundary
def plotly_js(full: bool = False) -> str:
    """The plotly.js a page embeds: the cartesian bundle (:data:`CARTESIAN_BUNDLE`, 1.5 MB) unless ``full`` or
    it is missing or of another version than the installed ``plotly``'s, then the whole library of the
    installed ``plotly`` package (minified, about 4.8 MB)."""
    from plotly.offline import get_plotlyjs

    cartesian = None if full else _cartesian_js()
    return cartesian if cartesian is not None else get_plotlyjs()


@boundary
def reset_notebook() -> None:
    """Send plotly.js again with the next view displayed in this kernel (after the output holding it was
    cleared, or in a new notebook served by the same kernel)."""
    global _notebook_loaded
    _notebook_loaded = None


def _new_id() -> str:
    return f"g2v{next(_ids)}"


def script_json(obj: Any) -> str:
    """JSON safe inside a ``<script>`` element (no ``</`` that would end it)."""
    return json.dumps(obj, separators=(",", ":")).replace("</", "<\\/")


@dataclass
class Part:
    """One piece of a page: ``body`` (HTML) and ``script`` (JavaScript run once plotly.js is loaded).
    Both may contain ``{id}``, replaced by an id unique to this part on the page."""

    body: str
    script: str = ""
    full_plotlyjs: bool = False  # draws a trace type outside CARTESIAN_TRACES: the page needs all of plotly.js

    def render(self) -> tuple[str, str]:
        """``(html, script)`` with this rendering's unique id filled in."""
        uid = _new_id()
        return self.body.replace("{id}", uid), self.script.replace("{id}", uid)


def text_part(text: str, tag: str = "p", cls: str = "g2v-note") -> Part:
    """A paragraph (or heading, with ``tag="h2"``) of plain ``text``, escaped."""
    return Part(f'<{tag} class="{cls}">{_html.escape(text)}</{tag}>')


def figure_part(fig: Any, height: int | None = None) -> Part:
    """A Plotly figure (a ``plotly.graph_objects.Figure``) drawn into its own ``div``. Its data travel as
    Plotly's JSON, where numeric arrays are base64 typed arrays: the page holds the exact values."""
    spec = fig.to_plotly_json()
    layout = spec.get("layout", {})
    if height is not None:
        layout["height"] = height
    from plotly.io.json import to_json_plotly

    payload = to_json_plotly({"data": spec.get("data", []), "layout": layout}).replace("</", "<\\/")
    script = (
        "(function(){var s=" + payload + ";"
        "Plotly.newPlot('{id}',s.data,s.layout,{responsive:true,displaylogo:false});})();"
    )
    full = any(t.get("type", "scatter") not in CARTESIAN_TRACES for t in spec.get("data", []))
    return Part('<div id="{id}" class="g2v-fig"></div>', script, full_plotlyjs=full)


@boundary
@dataclass
class View:
    """An interactive page: a title, parts (text, Plotly figures, widgets), plotly.js embedded once.

    ``html()`` is the page as a string, ``save(path)`` writes it, ``show()`` displays it (in Jupyter:
    inline; elsewhere: writes a temporary file and opens the browser), and ``_repr_html_`` lets a
    notebook cell display it. Views add up: ``a + b`` is one page with both."""

    title: str
    parts: list[Part] = field(default_factory=list)

    def __add__(self, other: View) -> View:
        return View(self.title, [*self.parts, text_part(other.title, "h2", "g2v-title"), *other.parts])

    def fragment(self, include_plotlyjs: bool) -> str:
        """The view as an HTML fragment: its title, its parts, their scripts; with ``include_plotlyjs``
        the plotly.js bundle first."""
        bodies, scripts = zip(*(p.render() for p in self.parts)) if self.parts else ((), ())
        lib = f"<script>{plotly_js(self.needs_full_plotlyjs())}</script>\n" if include_plotlyjs else ""
        uid = _new_id()
        # without plotly.js (a notebook whose first view's output was cleared) the view says what to do
        missing = (
            f"if (typeof Plotly === 'undefined') {{document.getElementById('{uid}').insertAdjacentHTML('beforeend',"
            '\'<p class="g2v-note">plotly.js is not loaded on this page: run the view again with '
            "gpt2_interp.views.reset_notebook() first</p>'); return;}"
        )
        run = "\n".join(f"<script>(function(){{{missing}{s}}})();</script>" for s in scripts if s)
        return (
            f'{lib}<div class="g2v-view" id="{uid}"><h2>{_html.escape(self.title)}</h2>\n'
            + "\n".join(bodies)
            + f"</div>\n{run}"
        )

    def needs_full_plotlyjs(self) -> bool:
        """Whether a part draws a trace type that plotly.js's cartesian bundle lacks (:data:`CARTESIAN_TRACES`)."""
        return any(p.full_plotlyjs for p in self.parts)

    def html(self) -> str:
        """The whole page: self-contained (plotly.js inside, once), opens from a file with no network."""
        return html_page([self], self.title)

    def save(self, path: str | Path) -> Path:
        """Write :meth:`html` to ``path`` (UTF-8); returns the path."""
        path = Path(path)
        path.write_text(self.html(), encoding="utf-8")
        return path

    def _repr_html_(self) -> str:
        global _notebook_loaded
        need = "full" if self.needs_full_plotlyjs() else "cartesian"
        send = not _notebook_loaded or (need == "full" and _notebook_loaded != "full")
        if send:
            _notebook_loaded = need
        return f"<style>{STYLE.replace('body{', '.g2v-none{')}</style>" + self.fragment(include_plotlyjs=send)

    def show(self, path: str | Path | None = None) -> None:
        """Display the view: inline in Jupyter (IPython's ``display``), otherwise saved to ``path`` (default:
        a temporary file) and opened in the web browser."""
        try:
            from IPython import get_ipython

            shell = get_ipython()
        except ImportError:
            shell = None
        if shell is not None and getattr(shell, "kernel", None) is not None:
            from IPython.display import HTML, display

            display(HTML(self._repr_html_()))
            return
        if path is None:
            import tempfile

            path = Path(tempfile.mkdtemp(prefix="gpt2-interp-view-")) / "view.html"
        webbrowser.open(self.save(path).resolve().as_uri())


@boundary
def html_page(items: Iterable[View | str], title: str) -> str:
    """One self-contained HTML page titled ``title`` holding ``items`` in order: views, and HTML strings
    (trusted, e.g. from :func:`markdown_html`) between them; plotly.js is inside the page once. The
    performance marks ``g2v-views-start`` and ``g2v-views-end`` bracket the drawing of the views (after
    plotly.js has loaded): ``performance.measure`` between them is the time the views take to appear."""
    items = list(items)
    body = "".join(x if isinstance(x, str) else x.fragment(include_plotlyjs=False) for x in items)
    full = any(not isinstance(x, str) and x.needs_full_plotlyjs() for x in items)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{_html.escape(title)}</title><style>{STYLE}</style>\n"
        f"<script>{plotly_js(full)}</script></head>\n<body>\n<script>performance.mark('g2v-views-start')</script>\n"
        f"{body}<script>performance.mark('g2v-views-end')</script>\n</body></html>\n"
    )


def _inline(text: str) -> str:
    """Markdown inline marks (``code``, **bold**, *italic*) over escaped text."""
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for p in parts:
        if p.startswith("`") and p.endswith("`") and len(p) >= 2:
            out.append(f"<code>{_html.escape(p[1:-1])}</code>")
        else:
            s = _html.escape(p, quote=False)
            s = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", s)
            s = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<em>\1</em>", s)
            out.append(s)
    return "".join(out)


class _Markdown:
    """The state of :func:`markdown_html` across lines: the HTML written, and the paragraph, list items, table
    rows and code block being collected."""

    def __init__(self) -> None:
        self.out: list[str] = []
        self.para: list[str] = []
        self.table: list[list[str]] = []
        self.items: list[str] = []
        self.code: list[str] | None = None

    def flush(self) -> None:
        """Write the paragraph, the list and the table collected so far."""
        if self.para:
            self.out.append("<p>" + _inline(" ".join(self.para)) + "</p>")
            self.para.clear()
        if self.items:
            self.out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in self.items) + "</ul>")
            self.items.clear()
        if self.table:
            self.out.append(_table_html(self.table))
            self.table.clear()

    def fence(self) -> None:
        """A ```` ``` ```` line: open a code block, or write the one open."""
        self.flush()
        if self.code is None:
            self.code = []
        else:
            self.out.append("<pre>" + _html.escape("\n".join(self.code)) + "</pre>")
            self.code = None

    def add(self, raw: str) -> None:
        """One line of the Markdown."""
        line = raw.rstrip()
        if line.startswith("```"):
            self.fence()
        elif self.code is not None:
            self.code.append(raw)
        elif not line or line.startswith("!["):
            self.flush()
        else:
            self.text(line)

    def text(self, line: str) -> None:
        """A line of text outside a code block: a heading, a table row, a list item or a paragraph's line."""
        m = re.match(r"^(#{1,6})\s+(.*)$", line)
        if m:
            self.flush()
            n = len(m.group(1))
            self.out.append(f"<h{n}>{_inline(m.group(2))}</h{n}>")
        elif line.startswith("|"):
            self.row(line)
        elif line.startswith(("- ", "* ")):
            if self.para or self.table:
                self.flush()
            self.items.append(line[2:])
        else:
            if self.table or self.items:
                self.flush()
            self.para.append(line)

    def row(self, line: str) -> None:
        """A table row, added to the table being collected (a paragraph or list before it ends first)."""
        if (self.para or self.items) and not self.table:
            self.flush()
        self.table.append([c.strip() for c in line.strip().strip("|").split("|")])


def _table_html(table: list[list[str]]) -> str:
    """A pipe table's rows as an HTML table: the first row the head, separator rows (``-``, ``:``) left out."""
    head, *rows = [r for r in table if not all(set(c.strip()) <= set("-:") for c in r)]
    html_rows = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rows)
    return (
        '<table class="g2v-table"><tr>' + "".join(f"<th>{_inline(c)}</th>" for c in head) + f"</tr>{html_rows}</table>"
    )


@boundary
def markdown_html(lines: Sequence[str]) -> str:
    """The small Markdown the reports are written in — headings, paragraphs, ``-`` lists, pipe tables,
    fenced code blocks, inline code, bold, italic — as HTML. Image lines (``![alt](file)``) are left out:
    a page shows its interactive views in their place."""
    md = _Markdown()
    for raw in lines:
        md.add(raw)
    md.flush()
    return "\n".join(md.out)
