"""Memory: a cache keeps only what was asked for, in the device and precision asked for, and the
memory estimates of sweeps are upper bounds within a small factor of the measured peak."""

from __future__ import annotations

import pytest
import torch

from gpt2_interp.analysis import engine, patching, tracing
from gpt2_interp.core.memory import TensorMemory, free_memory
from gpt2_interp.model import HookedGPT2
from gpt2_interp.model.cache import storage_bytes
from gpt2_interp.model.config import llama_config
from tests.conftest import TINY

LLAMA = llama_config(n_layer=2, d_model=64, n_head=4, n_kv_heads=2, d_mlp=176, n_ctx=64, d_vocab=512, name="tiny-llama")


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def model(request):
    return HookedGPT2(TINY if request.param == "gpt2" else LLAMA, seed=0).eval()


def tokens(model, batch=3, pos=16):
    return torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(0))


def kept_bytes(fn):
    """Activation bytes still alive after ``fn()`` returns (its result held), and the peak during it
    (``fn`` runs once before, so that what the model builds once and keeps is not counted)."""
    with torch.inference_mode():
        fn()
    with torch.inference_mode(), TensorMemory() as mem:
        out = fn()
        kept = mem.current
    del out
    return kept, mem.peak


def test_tensor_memory_counts_created_storages_once_and_frees_them():
    a = torch.ones(1000)  # before the block: not counted
    with TensorMemory() as mem:
        b = a * 2  # 4000 bytes
        c = b[:10]  # a view: nothing new
        d = torch.empty(500, dtype=torch.float64)  # 4000 bytes
        assert mem.current == 8000
        del b, c, d
        e = a + 1
        assert mem.current == 4000
    assert mem.peak == 8000
    assert e.shape == (1000,)


@pytest.mark.parametrize("family", ["hook_k", "hook_q", "hook_v", "hook_resid_post", "hook_pattern"])
def test_a_filtered_cache_keeps_exactly_its_activations(model, family):
    """The bytes alive after run_with_cache, beyond a plain forward's, are those of the cached
    activations: a view (q/k/v of the fused projection) does not keep the projection alive. (The
    last block's ``resid_post`` is the forward's own output: it costs nothing extra.)"""
    t = tokens(model)
    n = model.cfg.n_layer
    plain, _ = kept_bytes(lambda: model(t, stop_at_layer=n))
    kept, _ = kept_bytes(lambda: model.run_with_cache(t, names_filter=lambda s: s.endswith(family), stop_at_layer=n))
    _, cache = model.run_with_cache(t, names_filter=lambda s: s.endswith(family), stop_at_layer=n)
    want = sum(v.numel() * v.element_size() for v in cache.values())
    assert len(cache) == n
    assert cache.nbytes() == want  # each activation owns a storage of its own size
    output = t.numel() * model.cfg.d_model * 4 if family == "hook_resid_post" else 0
    assert kept - plain == want - output


def test_a_position_selection_keeps_only_those_positions(model):
    t = tokens(model)
    n = model.cfg.n_layer
    _, full = model.run_with_cache(t, names_filter=lambda s: s.endswith("resid_post"))
    _, last = model.run_with_cache(t, names_filter=lambda s: s.endswith("resid_post"), pos_slice=-1)
    assert last.nbytes() == full.nbytes() // t.shape[1] == n * t.shape[0] * model.cfg.d_model * 4
    torch.testing.assert_close(last["resid_post", 1], full["resid_post", 1][:, -1:])


def test_a_filter_does_not_materialise_the_rest(model):
    """The peak of a run caching one family is the plain forward's plus that family, not the full cache's."""
    t = tokens(model, batch=4, pos=32)
    n = model.cfg.n_layer
    _, plain = kept_bytes(lambda: model(t, stop_at_layer=n))
    _, one = kept_bytes(
        lambda: model.run_with_cache(t, names_filter=lambda s: s.endswith("resid_mid"), stop_at_layer=n)
    )
    _, every = kept_bytes(lambda: model.run_with_cache(t, stop_at_layer=n))
    family = n * t.numel() * model.cfg.d_model * 4
    assert one <= plain + family
    assert every > plain + 5 * family  # the full cache is much bigger: the bound above is not trivially met


def test_cache_dtype_and_device(model):
    t = tokens(model)
    _, ref = model.run_with_cache(t, names_filter=lambda s: s.endswith("resid_pre"))
    _, half = model.run_with_cache(t, names_filter=lambda s: s.endswith("resid_pre"), dtype=torch.float16, device="cpu")
    assert {v.dtype for v in half.values()} == {torch.float16}
    assert {v.device.type for v in half.values()} == {"cpu"}
    assert half.nbytes() * 2 == ref.nbytes()
    torch.testing.assert_close(half["resid_pre", 1].float(), ref["resid_pre", 1], atol=2e-3, rtol=2e-3)
    bf = ref.to(dtype=torch.bfloat16)
    assert bf["resid_pre", 0].dtype == torch.bfloat16 and bf.nbytes() * 2 == ref.nbytes()


def test_cache_dtype_keeps_token_ids_integer(model):
    model.set_use_hook_tokens(True)
    try:
        _, cache = model.run_with_cache(tokens(model), names_filter=["hook_tokens", "hook_embed"], dtype="bf16")
    finally:
        model.set_use_hook_tokens(False)
    assert cache["hook_tokens"].dtype == torch.long
    assert cache["hook_embed"].dtype == torch.bfloat16


def test_cache_refuses_an_unknown_dtype(model):
    with pytest.raises(ValueError, match="unknown dtype"):
        model.run_with_cache(tokens(model), names_filter="blocks.0.hook_resid_pre", dtype="int8")


def test_free_memory_is_positive_and_the_budget_follows_it():
    free = free_memory("cpu")
    assert free > 0
    assert engine.memory_budget("cpu") == min(engine.CPU_MEMORY_BUDGET, free // 4)


@pytest.mark.parametrize("cfg, hook, batch_size", [(TINY, "resid_pre", 8), (LLAMA, "mlp_out", None), (LLAMA, "z", 32)])
def test_sweep_memory_estimate_bounds_the_measured_peak(cfg, hook, batch_size):
    """sweep_work's memory (less the weights) is at least the measured activation peak of the sweep
    and within a factor of 6 of it."""
    model = HookedGPT2(cfg, seed=0).eval()
    P, pairs = 12, 2
    clean = tokens(model, pairs, P)
    corr = clean.clone()
    corr[:, 4] = (corr[:, 4] + 1) % model.cfg.d_vocab
    work = patching.sweep_work(model, P, hook, n_pairs=pairs, batch_size=batch_size)
    estimate = work.memory - engine.weight_bytes(model)
    with torch.inference_mode(), TensorMemory() as mem:
        patching.patch(model, clean, corr, patching.logit_diff(1, 2), hook=hook, batch_size=batch_size, progress=False)
    assert mem.peak <= estimate <= 6 * mem.peak, (mem.peak, estimate)
    assert "chunks of" in work.line() and "peak memory" in work.line()


def test_trace_memory_estimate_bounds_the_measured_peak():
    model = HookedGPT2(TINY, seed=0).eval()
    case = ("The Eiffel Tower is in the city of", "Eiffel Tower")
    work = tracing.trace_work(model, [case], "hidden", samples=3)
    with torch.inference_mode(), TensorMemory() as mem:
        tracing.causal_trace(model, *case, kind="hidden", samples=3, progress=False)
    estimate = work.memory - engine.weight_bytes(model)
    assert mem.peak <= estimate <= 6 * mem.peak, (mem.peak, estimate)


def test_a_sweep_that_cannot_fit_is_refused_before_any_work(model, monkeypatch):
    clean = tokens(model, 2, 8)
    corr = clean.flip(0)
    monkeypatch.setattr(engine, "free_memory", lambda device="cpu": 1000)
    with pytest.raises(MemoryError, match=r"needs .* free"):
        patching.patch(model, clean, corr, patching.logit_diff(1, 2), progress=False)


def test_storage_bytes_counts_a_shared_storage_once():
    x = torch.zeros(10, 10)
    assert storage_bytes([x, x[0], x[:, 1]]) == 400
    assert storage_bytes([x, torch.zeros(5)]) == 420


def test_estimate_states_runs_time_and_memory_before_patching(tmp_path, capsys):
    from gpt2_interp.cli import main

    model = HookedGPT2(TINY, seed=0).eval()
    clean = tokens(model, 3, 10)
    corr = clean.flip(0)
    work = patching.estimate(model, clean, corr, hook="mlp_out")
    counted = patching.sweep_work(model, 10, "mlp_out", n_pairs=3)
    assert (work.runs, work.passes, work.memory) == (counted.runs, counted.passes, counted.memory)
    assert work.seconds > 0
    assert work.memory > engine.weight_bytes(model)
    model.save(tmp_path / "m")
    args = ["patch", "--model", str(tmp_path / "m"), "--clean", "a b c d", "--corrupted", "a b c e"]
    assert main([*args, "--answer", " x", "--dry-run"]) == 0
    line = capsys.readouterr().out
    assert "exact patching of resid_pre" in line and "expected ≈" in line and "peak memory ≈" in line
