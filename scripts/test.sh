#!/usr/bin/env bash
# Set up (scripts/setup.sh test) and run the whole test suite, notebooks included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
. .venv/bin/activate
# No kernel is installed anywhere: tests/integration/test_notebooks.py writes a throwaway kernel spec that runs
# this venv's python (JUPYTER_PATH, a temporary folder), so the user's own Jupyter kernels are never touched.
python -m pytest -p no:cacheprovider "$@"
# The documentation site, strict, after the full suite (whose notebook test writes the executed notebooks it shows).
if [ $# -eq 0 ]; then bash scripts/docs.sh; fi
