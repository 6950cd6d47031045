"""Every notebook runs top to bottom on the embedded model (offline), shows its figures, and prints
no warnings; notebooks are committed without outputs. The executed copy goes to ``docs/_executed/`` (gitignored;
``GPT2_INTERP_NOTEBOOK_OUT`` names another folder), which the documentation site renders (``scripts/docs.sh``).

The kernel is a throwaway kernel spec written to a temporary JUPYTER_PATH folder that runs THIS
interpreter (the project's venv): nothing is installed into the user's Jupyter, and a user kernel
named "python3" pointing elsewhere cannot be picked up by mistake."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs notebooks / the whole demo: minutes

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
KERNEL = "gpt2-interp-tests"


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "gpt2-interp (tests)",
                "language": "python",
            }
        )
    )
    mp = pytest.MonkeyPatch()
    mp.setenv("JUPYTER_PATH", str(root))
    yield KERNEL
    mp.undo()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_and_shows_its_figures(path, tmp_path, kernel):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(path, as_version=4)
    assert not any(c.get("outputs") or c.get("execution_count") for c in nb.cells if c.cell_type == "code"), (
        "commit notebooks without outputs"
    )
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name=kernel, resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()  # raises CellExecutionError on any error
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [
        o for o in outputs if o.output_type in ("display_data", "execute_result") and "image/png" in o.get("data", {})
    ]
    plotted = sum(("display(" in c.source) for c in nb.cells if c.cell_type == "code")
    assert images, f"{path.name} shows no figure"
    assert len(images) >= plotted, (
        f"{path.name}: {plotted} cells display figures but only {len(images)} images came out"
    )
    stderr = "".join(o.get("text", "") for o in outputs if o.output_type == "stream" and o.get("name") == "stderr")
    assert "Warning" not in stderr, f"{path.name} printed a warning: {stderr[:500]}"
    out = Path(os.environ.get("GPT2_INTERP_NOTEBOOK_OUT") or ROOT / "docs" / "_executed")
    out.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out / path.name)  # a passing run's copy, which the docs site renders
