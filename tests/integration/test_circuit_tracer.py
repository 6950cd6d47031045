"""Our attribution graph equals circuit-tracer 0.5's on the same model, transcoders and prompt.

circuit-tracer pins ``transformers<=4.57.3`` and runs on TransformerLens, so it is never a dependency of the
package: it runs in a Python environment of its own (``$CIRCUIT_TRACER_PYTHON``, default
``/work/venvs/ct/bin/python``) through ``benchmarks/compare_circuit_tracer.py``, and this test is skipped where
that environment does not exist."""

from __future__ import annotations

import subprocess

import pytest

from ..conftest import script

compare_ct = script("compare_circuit_tracer", "benchmarks")
PYTHON = compare_ct.default_python()


pytestmark = pytest.mark.skipif(
    not PYTHON.is_file(),
    reason=f"no circuit-tracer environment at {PYTHON} (python3 -m venv /work/venvs/ct && "
    "/work/venvs/ct/bin/pip install torch circuit-tracer==0.5.0, or set CIRCUIT_TRACER_PYTHON)",
)


def test_graph_pruning_and_scores_equal_circuit_tracers():
    probe = [str(PYTHON), "-c", "import circuit_tracer, transformer_lens"]
    if subprocess.run(probe, capture_output=True, check=False).returncode:
        pytest.skip(f"{PYTHON} cannot import circuit_tracer and transformer_lens")
    # float64 on both sides: the algorithms compared without float32's rounding
    r = compare_ct.compare(PYTHON, d_sae=256, prompt="The capital of France is", repeats=0, dtypes=("float64",))
    assert r["same_features"] and r["same_logit_tokens"] and r["n_features"] > 100
    # both sides store activations and edges in float32: a last-bit difference is 6e-8 relative
    assert r["activation_max_rel"] <= 1e-6 and r["logit_prob_max_abs"] <= 1e-6
    assert r["nonzero_pattern_equal"] and r["n_kept_edges"] > 0
    assert r["float64"]["max_rel_to_largest"] <= 1e-6
    assert r["float64"]["kept_max_rel"] <= 1e-6
    assert r["prune_node_mask_equal"] and r["prune_edge_mask_equal"]
    assert r["scores_ours"] == pytest.approx(r["scores_theirs_on_ours"], rel=1e-6)
    assert r["scores_ours"] == pytest.approx(r["scores_theirs"], rel=1e-6)
