#!/usr/bin/env bash
# Set up (scripts/setup.sh test) and run the whole test suite, notebooks included.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
. .venv/bin/activate
python -m ipykernel install --user --name python3 >/dev/null 2>&1 || true
python -m pytest -p no:cacheprovider "$@"
