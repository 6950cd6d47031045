"""A view page carries plotly.js's cartesian bundle (shipped with the package, 1.5 MB of the whole library's
4.8 MB) once: every trace type the views draw is in it; a page with a figure of another trace type, or an
installed ``plotly`` of another plotly.js version than the bundle, gets the whole library instead."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("plotly", reason="the views need Plotly")

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from gpt2_interp.views import View, html_page, view
from gpt2_interp.views import page as page_module
from gpt2_interp.views.page import CARTESIAN_BUNDLE, CARTESIAN_TRACES, figure_part, plotly_js

VIEWS = Path(__file__).resolve().parents[2] / "gpt2_interp" / "views"


def test_the_shipped_bundle_is_the_installed_plotly_version_and_holds_every_trace_the_views_draw():
    from plotly.offline import get_plotlyjs_version

    head = CARTESIAN_BUNDLE.read_text()[:200]
    assert f"plotly.js (cartesian - minified) v{get_plotlyjs_version()}" in head
    assert CARTESIAN_BUNDLE.with_name(CARTESIAN_BUNDLE.name + ".LICENSE").read_text().startswith("MIT License")
    used = {m.lower() for p in VIEWS.glob("*.py") for m in re.findall(r"go\.([A-Z][a-zA-Z]+)\(", p.read_text())}
    assert used - {"figure"} and used - {"figure"} <= CARTESIAN_TRACES
    assert plotly_js() == CARTESIAN_BUNDLE.read_text() and len(plotly_js()) < len(get_plotlyjs()) / 3


def test_a_view_page_embeds_the_cartesian_bundle_once(facts_model):
    from gpt2_interp.analysis.lens import logit_lens

    lens = logit_lens(facts_model, ["The capital of France is"], targets=[" Paris"], positions="all")
    html = html_page([view(lens), "<p>between</p>", view(lens)], "two views")
    assert html.count(plotly_js()[:300]) == 1 and get_plotlyjs()[:300] not in html
    assert len(html.encode()) < 2_000_000


def test_a_figure_of_another_trace_type_gets_the_whole_library(monkeypatch):
    flat = View("flat", [figure_part(go.Figure(go.Heatmap(z=[[1, 2], [3, 4]])))])
    solid = View("solid", [figure_part(go.Figure(go.Scatter3d(x=[1], y=[2], z=[3])))])
    assert not flat.needs_full_plotlyjs() and solid.needs_full_plotlyjs()
    assert get_plotlyjs()[:300] in solid.html() and get_plotlyjs()[:300] not in flat.html()
    assert get_plotlyjs()[:300] in html_page([flat, solid], "both")
    monkeypatch.setattr(page_module, "_notebook_loaded", None)
    first, second, third = flat._repr_html_(), solid._repr_html_(), solid._repr_html_()
    assert plotly_js()[:300] in first and get_plotlyjs()[:300] in second and "<script>/**" not in third


def test_another_plotly_version_gets_its_own_whole_library(monkeypatch):
    monkeypatch.setattr("plotly.offline.get_plotlyjs_version", lambda: "99.0.0")
    assert plotly_js() == get_plotlyjs()
