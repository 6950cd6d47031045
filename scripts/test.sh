#!/usr/bin/env bash
# Set up (scripts/setup.sh test,lint), lint and type-check, and run the test suite, notebooks included (CI's lane:
# all but the tests marked `full`; `--full`: every test), then build the documentation site.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test,lint
. .venv/bin/activate
# Lint, format and types first: seconds, and a failure stops before the slow suite (config: pyproject.toml).
lint_paths=(gpt2_interp analyses tests benchmarks scripts docs/conf.py docs/_ext)
ruff check "${lint_paths[@]}"
ruff format --check "${lint_paths[@]}"
mypy
# No kernel is installed anywhere: tests/integration/test_notebooks.py writes a throwaway kernel spec that runs
# this venv's python (JUPYTER_PATH, a temporary folder), so the user's own Jupyter kernels are never touched.
# Two workers, one per core of the 2-core machines, each test file on one worker (its module fixtures built once);
# one thread each, so the workers do not oversubscribe the cores.
# CI's lane leaves out the few tests marked `full` (the longest oracle runs, each named in its marker's reason);
# `bash scripts/test.sh --full` runs them too.
lane=(-m "not full")
if [ "${1:-}" = "--full" ]; then
  shift
  lane=()
fi
OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python -m pytest -p no:cacheprovider -n 2 --dist loadfile --durations=25 \
  ${lane[@]+"${lane[@]}"} "$@"
# The documentation site, strict, after the full suite (whose notebook test writes the executed notebooks it shows).
# Sphinx 9 needs Python >= 3.11: on 3.10 the site is not built (the guide examples still run in the suite).
if [ $# -eq 0 ]; then
  if python -c "import sys; sys.exit(sys.version_info < (3, 11))"; then
    bash scripts/docs.sh
  else
    echo "docs: not built: Sphinx 9 needs Python >= 3.11 (this is $(python -V))" >&2
  fi
fi
