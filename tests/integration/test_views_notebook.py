"""The views' Jupyter display, checked in an executed notebook: a throwaway notebook (written to the test's
temporary folder, never committed) runs in a throwaway kernel of this interpreter; each view's output is
``text/html``, the first carrying plotly.js and every one drawing its figures with it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("plotly", reason="the views need Plotly: pip install gpt2-interp[views]")
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

pytestmark = pytest.mark.slow  # a kernel start and the library's import: a few seconds

KERNEL = "gpt2-interp-views-tests"

CELLS = [
    "import sys\nsys.path.insert(0, {tests!r})\n"
    "from view_results import small_circuit, small_feature\nfrom gpt2_interp.views import view",
    "view(small_circuit())",
    "view(small_feature()).show()",
]


def test_views_display_as_html_with_plotly_in_an_executed_notebook(tmp_path, monkeypatch):
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (spec / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": KERNEL, "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    here = str(Path(__file__).parent)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c.format(tests=here)) for c in CELLS])
    nbformat.write(nb, tmp_path / "views.ipynb")
    nbclient.NotebookClient(
        nb, timeout=120, kernel_name=KERNEL, resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    outs = [c.outputs for c in nb.cells[1:]]
    assert [[o.output_type for o in out] for out in outs] == [["execute_result"], ["display_data"]]
    circuit_html, feature_html = (out[0].data["text/html"] for out in outs)
    assert "Circuit (eap): 9 of 82 edges" in circuit_html and "Feature: latent 7" in feature_html
    assert circuit_html.count("Plotly.newPlot") == 1 and feature_html.count("Plotly.newPlot") == 2
    # plotly.js travels with the first view of the kernel only; the second reuses it
    # (the cartesian bundle, 1.5 MB, which draws every trace type these views use)
    assert "plotly.js (cartesian" in circuit_html and len(circuit_html) > 1_000_000
    assert "plotly.js (cartesian" not in feature_html and len(feature_html) < 100_000
