"""Sphinx configuration of the gpt2-interp documentation site (``bash scripts/docs.sh`` builds it).

The build is strict: ``sphinx-build -W --keep-going -n`` turns every warning into a failure, so a broken link, a
reference to a name that does not exist or a docstring that does not render fails it. It runs offline: there is no
intersphinx, so references to other libraries' names (``torch.Tensor``, ``pathlib.Path``) are checked by importing
the name and rendered as code without a link (see ``resolve_unlinked`` below).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # the checkout's package, whether or not it is installed
sys.path.insert(0, str(DOCS / "_ext"))

project = "gpt2-interp"
author = "gpt2-interp contributors"
copyright = "gpt2-interp contributors, MIT licence"
release = version = importlib.import_module("gpt2_interp").__version__

extensions = [
    "myst_nb",  # Markdown pages (MyST) and the executed notebooks
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "gpt2_docs",  # docs/_ext/gpt2_docs.py: the findings page, reference resolution for names outside the API
]

source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
exclude_patterns = ["_build", "README.md", "guide/README.md", "**/.ipynb_checkpoints"]
html_theme = "furo"
html_title = "gpt2-interp"
html_static_path: list[str] = []
suppress_warnings: list[str] = []
nitpicky = True

# MyST: headings get anchors (links such as editing.md#rome), $…$ maths, ``{py:func}`` roles in Markdown.
myst_heading_anchors = 3
myst_enable_extensions = ["dollarmath", "colon_fence", "deflist"]
myst_links_external_new_tab = False

# Notebooks: rendered from the copies tests/integration/test_notebooks.py executes (docs/_executed/, never
# committed); the build never executes a notebook itself. scripts/docs.sh checks that every copy is there and
# matches its notebook before it builds.
nb_execution_mode = "off"
nb_merge_streams = True

# API reference: the members each package exports (its ``__all__``), in that package's order.
autodoc_default_options = {"member-order": "bysource", "show-inheritance": True}  # members: named per page
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_class_signature = "separated"
autodoc_inherit_docstrings = True
autosummary_generate = False
python_use_unqualified_type_names = True
