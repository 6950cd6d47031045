#!/usr/bin/env bash
# Build the documentation site into docs/_build/html, offline and strict: any warning (a broken link, a reference
# to a name that does not exist, a docstring that does not render, an exported name missing from the API
# reference) fails the build.
#   bash scripts/docs.sh            # then open docs/_build/html/index.html
# The notebook pages render the executed copies that tests/integration/test_notebooks.py writes to docs/_executed/
# (never committed). A copy that is missing, has no outputs or whose cells differ from its notebook's is made
# first, by running that test for its notebook; the build itself executes nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
# The project's venv (scripts/setup.sh makes it), or the interpreter named by PYTHON; never a system python.
py="${PYTHON:-.venv/bin/python}"
if [ ! -x "$py" ]; then
  echo "docs: no $py: run bash scripts/setup.sh first (or set PYTHON to a venv's python)" >&2
  exit 2
fi
if ! "$py" -c "import sphinx, myst_nb, furo" >/dev/null 2>&1; then
  "$py" -m pip install -q -e ".[docs]"
fi
start=$(date +%s)
stale=$("$py" - <<'PY'
import json, pathlib
for nb in sorted(pathlib.Path("notebooks").glob("*.ipynb")):
    copy = pathlib.Path("docs/_executed") / nb.name
    cells = lambda p: [(c["cell_type"], "".join(c["source"])) for c in json.loads(p.read_text())["cells"]]
    executed = copy.is_file() and any(c.get("outputs") for c in json.loads(copy.read_text())["cells"])
    if not executed or cells(copy) != cells(nb):
        print(nb.stem)
PY
)
if [ -n "$stale" ]; then
  echo "docs: executing the notebooks without an up-to-date copy in docs/_executed: $(echo $stale)" >&2
  "$py" -m pytest -p no:cacheprovider -q tests/integration/test_notebooks.py -k "$(echo $stale | sed 's/ / or /g')"
fi
rm -rf docs/_build/html
"$py" -m sphinx -b html -W --keep-going -n -q docs docs/_build/html
echo "docs: built docs/_build/html/index.html in $(( $(date +%s) - start )) s"
