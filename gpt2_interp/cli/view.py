"""``view``: the interactive page of a saved result (a result's JSON or an experiment's result folder)."""

from __future__ import annotations

import argparse
import base64
import io
import sys
import webbrowser
from pathlib import Path
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "view",
        help="write (and open) the interactive HTML view of a saved result",
        description="Write the interactive view of RESULT (a result's to_json() file, an experiment's "
        "result.json, or its folder) as one self-contained HTML page: no network needed to open it.",
    )
    p.add_argument("result", help="a result JSON file, or a folder holding result.json")
    p.add_argument("-o", "--out", default=None, help="the page to write (default: RESULT with the suffix .html)")
    p.add_argument("--open", action="store_true", help="open the page in the web browser")
    p.set_defaults(func=run, outputs={"out": ("--out", "file")})


def _experiment_extras(d: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """The tables (as HTML) and figures (PNG, base64) the experiment renders from its saved data."""
    from ..experiments.runner import get
    from ..views import markdown_html

    try:
        exp = get(str(d["experiment"]))
    except ValueError:
        return {}, {}
    tables = {k: markdown_html(v.splitlines()) for k, v in exp.render_tables(d["data"]).items()}
    figures = {}
    for name, fig in exp.render_figures(d["data"]).items():
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
        figures[name] = base64.b64encode(buf.getvalue()).decode("ascii")
    return tables, figures


def run(args: argparse.Namespace) -> int:
    from ..views import kind_of, load_result, view, view_experiment

    d = load_result(args.result)
    if kind_of(d) is None and {"experiment", "data"} <= set(d):
        tables, figures = _experiment_extras(d)
        page = view_experiment(d, figures=figures, tables=tables)
    else:
        page = view(d)
    src = Path(args.result)
    out = Path(args.out) if args.out else (src / "view.html" if src.is_dir() else src.with_suffix(".html"))
    page.save(out)
    print(f"Wrote {out} ({out.stat().st_size / 1e6:.1f} MB): {page.title}", file=sys.stderr)
    if args.open:
        webbrowser.open(out.resolve().as_uri())
    return 0
