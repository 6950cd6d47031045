#!/usr/bin/env bash
# Set up (scripts/setup.sh test,lint), lint and type-check, and run the whole test suite, notebooks included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,lint
. .venv/bin/activate
# Lint, format and types first: seconds, and a failure stops before the slow suite (config: pyproject.toml).
lint_paths=(gpt2_interp tests benchmarks scripts)
ruff check "${lint_paths[@]}"
ruff format --check "${lint_paths[@]}"
mypy
# No kernel is installed anywhere: tests/integration/test_notebooks.py writes a throwaway kernel spec that runs
# this venv's python (JUPYTER_PATH, a temporary folder), so the user's own Jupyter kernels are never touched.
python -m pytest -p no:cacheprovider "$@"
# The documentation site, strict, after the full suite (whose notebook test writes the executed notebooks it shows).
if [ $# -eq 0 ]; then bash scripts/docs.sh; fi
