"""benchmarks/gpu_check.py must keep running: its CPU smoke mode, end to end, writes complete results."""

from __future__ import annotations

import json

import pytest

from ..conftest import script


def _load():
    return script("gpu_check", "benchmarks")


@pytest.mark.slow
@pytest.mark.full  # every section of the GPU check on the CPU (~50 s); what it checks is tested module by module
def test_gpu_check_quick_cpu_runs_every_section_and_writes_results(tmp_path):
    # a generous budget: on a busy CI machine no item may be skipped for lack of time
    out = tmp_path / "RESULTS_gpu.md"
    res = _load().main(["--device", "cpu", "--quick", "--dtypes", "bf16", "--budget", "3000", "--out", str(out)])
    errors = {k: v["error"] for k, v in res.items() if isinstance(v, dict) and "error" in v}
    errors |= {
        f"{k}.{i}": v[i]["error"]
        for k, v in res.items()
        if isinstance(v, dict)
        for i in v
        if isinstance(v[i], dict) and "error" in v[i]
    }
    assert not errors, errors
    # CPU against CPU: the same computation twice is bit-identical, so every parity difference is exactly 0
    par = res["parity"]
    for key in ("logits", "run_with_cache", "patch_resid_pre", "causal_trace_hidden", "gpt2_random_logits"):
        assert par[key]["max_abs_diff"] == 0.0, key
    assert par["rome"]["u"]["max_abs_diff"] == 0.0 and par["rome"]["edited_logits"]["max_abs_diff"] == 0.0
    for model in ("gpt2 (random)", "gpt2-facts"):
        r = res[f"throughput {model} bf16"]
        for item in ("forward", "run_with_cache", "patch_sweep_resid_pre", "causal_trace_hidden"):
            assert r[item]["best"]["units_per_s"] > 0, (model, item, r[item])
        assert r["forward_vs_transformers"]["ours_over_transformers"] > 0
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["environment"]["device"] == "cpu"
    text = out.read_text()
    assert "## 1. fp32 parity" in text and "patch_sweep_resid_pre" in text and "ROME edit: u" in text
