"""Two CPU processes (gloo) give the single-process results: key statistics, averaged traces, patching over
prompt pairs, edit evaluation, tuned-lens training (DDP); and the CLI's data loops under torchrun.

One 2-rank job (``torch.multiprocessing.spawn``) runs every sharded function on a tiny random model;
rank 0 saves what it got and the test process compares it with the same calls made without a
process group. Plus the helpers' contract (shards, order) and a failing rank stopping the job.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gpt2_interp.core import distributed
from gpt2_interp.editing.stats import ENV_DIR
from gpt2_interp.model import GPT2Config, HookedGPT2

WORLD = 2
CORPUS = "\n\n".join(
    f"Document {i}: the river runs past {i * 7} old houses and a mill near the bridge." for i in range(40)
)
PROMPTS = [
    "The capital of France is",
    "A cat sat on the",
    "Water is made of",
    "The river runs past",
    "Paris is a city in",
    "The old mill near",
]
LENS_TEXTS = [f"Text {i}: the river runs past {i * 7} old houses, a mill and the bridge near town." for i in range(12)]
FAST_ROME = {"v_steps": 2, "prefix_lengths": (2,), "prefixes_per_length": 1}


def tiny() -> HookedGPT2:
    return HookedGPT2(GPT2Config(n_layer=2, d_model=32, n_head=4, d_mlp=64, n_ctx=64, name="tiny-dist"), seed=0).eval()


def self_known_facts(model: HookedGPT2) -> list[tuple[str, str, str]]:
    """(prompt, subject, target) cases whose target is the model's own top-1: a random model 'knows' them."""
    top = model.last_logits(PROMPTS).argmax(-1).tolist()
    return [(p, p.split()[1], model.to_string([t])) for p, t in zip(PROMPTS, top)]


def requests():
    from gpt2_interp.editing.evaluate import counterfact_requests

    return counterfact_requests(n=3, seed=5)


def run_all(model: HookedGPT2, corpus: Path, cache: Path):
    """Every sharded function, called the same way with and without a process group."""
    from gpt2_interp.analysis.patching import logit_diff, patch
    from gpt2_interp.analysis.tracing import average_trace
    from gpt2_interp.analysis.tuned_lens import lens_divergence, train_tuned_lens
    from gpt2_interp.editing.evaluate import evaluate_edits
    from gpt2_interp.editing.stats import clear_memory_cache, key_second_moment

    clear_memory_cache()
    # 333 tokens: not a whole number of rows or batches, so the cut-short last row is exercised
    stats = key_second_moment(
        model, 1, corpus=str(corpus), n_samples=333, batch_size=4, cache_dir=cache, progress=False
    )
    avg = average_trace(
        model, self_known_facts(model), kind=["hidden", "mlp"], samples=2, facts_per_batch=2, progress=False
    )
    # its key statistics come from the same small corpus (computed by the ranks together)
    ev = evaluate_edits(
        model,
        requests(),
        layer=0,
        fluency_tokens=3,
        n_unrelated=3,
        progress=False,
        corpus=str(corpus),
        n_samples=300,
        **FAST_ROME,
    )
    # 5 pairs of two lengths (left-padded together), per-pair answers, normalised: 3 pairs on rank 0, 2 on rank 1
    clean = [
        "The capital of France is",
        "A cat sat on the",
        "Water is made of",
        "The river runs past",
        "Paris is a town in",
    ]
    corrupt = [
        "The capital of Italy is",
        "A dog sat on the",
        "Fire is made of",
        "The road runs past",
        "London is a town in",
    ]
    pt = patch(
        model,
        clean,
        corrupt,
        logit_diff(
            [" Paris", " mat", " hydrogen", " old", " France"], [" Rome", " floor", " oxygen", " new", " Italy"]
        ),
        hook="resid_pre",
        normalize=True,
        progress=False,
    )
    # tuned lens: least-squares start on the corpus (rows sharded), then 3 DDP steps of 4 rows (2 per rank)
    lens = train_tuned_lens(model, LENS_TEXTS, steps=3, batch_tokens=64, lr=1e-2, seq_len=16, progress=False)
    div = lens_divergence(model, LENS_TEXTS[:3], lens, seq_len=16)
    return {
        "C": stats.C,
        "count": stats.count,
        "key": stats.key,
        "avg": avg.to_dict(),
        "rows": ev.rows,
        "summary": ev.summary,
        "restored": ev.restored_exactly,
        "patch": pt.to_dict(),
        "lens_weight": lens.weight,
        "lens_bias": lens.bias,
        "lens_div": div,
        "lens_meta": {k: v for k, v in lens.meta.items() if k != "world_size"},
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(rank: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD, timeout=timedelta(seconds=120)
    )


def _worker(rank: int, port: int, corpus: str, cache: str, out: str) -> None:
    _init(rank, port)
    try:
        res = run_all(tiny(), Path(corpus), Path(cache))
        res["files_by_rank"] = sorted(p.name for p in Path(cache).glob("*"))
        if rank == 0:
            torch.save(res, out)
        else:
            torch.save(res, out + ".rank1")
    finally:
        dist.destroy_process_group()


def _failing_worker(rank: int, port: int) -> None:
    _init(rank, port)
    if rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    distributed.all_reduce_sum(torch.ones(3))  # rank 0 waits here for a rank that is gone


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dist")
    corpus = tmp / "corpus.txt"
    corpus.write_text(CORPUS)
    out = tmp / "rank0.pt"
    old = os.environ.get(ENV_DIR)
    os.environ[ENV_DIR] = str(tmp / "default-cache")  # evaluate_edits' statistics use the default cache
    try:
        yield from _results(tmp, corpus, out)
    finally:
        if old is None:
            os.environ.pop(ENV_DIR)
        else:
            os.environ[ENV_DIR] = old


def _results(tmp, corpus, out):
    mp.spawn(_worker, args=(_free_port(), str(corpus), str(tmp / "cache2"), str(out)), nprocs=WORLD, join=True)
    got = torch.load(out, weights_only=False)
    got1 = torch.load(str(out) + ".rank1", weights_only=False)
    ref = run_all(tiny(), corpus, tmp / "cache1")
    yield got, got1, ref, tmp


def _close(a, b, path=""):
    """Nested results equal: tensors/floats to 1e-5 relative, everything else exactly; timings skipped."""
    if dataclasses.is_dataclass(a):
        assert type(a) is type(b), path
        a, b = dataclasses.asdict(a), dataclasses.asdict(b)
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            if "seconds" not in k:
                _close(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]")
    elif isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=path)
    elif isinstance(a, float):
        # a cell whose effect is 0 in one process comes out as ±1e-5 of a logit difference when another batch
        # composition changes the summation order (as the tensors' atol allows)
        assert a == pytest.approx(b, rel=1e-5, abs=2e-5), path
    else:
        assert a == b, path


@pytest.mark.slow
def test_key_second_moment_on_two_ranks_equals_one_process_with_the_same_cache_key(results):
    got, got1, ref, tmp = results
    assert got["count"] == ref["count"] == 333
    assert got["key"] == ref["key"]  # the same cache key, so either run's file serves the other
    torch.testing.assert_close(got["C"], ref["C"], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got1["C"], got["C"], rtol=0, atol=0)  # every rank holds the all-reduced result
    assert [p.name for p in (tmp / "cache2").glob("*")] == [
        p.name for p in (tmp / "cache1").glob("*")
    ]  # rank 0 wrote one file


@pytest.mark.slow
def test_average_trace_on_two_ranks_equals_one_process(results):
    got, _, ref, _ = results
    assert ref["avg"]["n_known"] == len(PROMPTS)
    _close(got["avg"], ref["avg"])


@pytest.mark.slow
def test_evaluate_edits_on_two_ranks_gives_the_single_process_rows_in_order(results):
    got, got1, ref, _ = results
    assert [r.case_id for r in got["rows"]] == [r.case_id for r in ref["rows"]]
    _close(got["rows"], ref["rows"])
    _close(got["summary"], ref["summary"])
    assert got["restored"] and got1["rows"] == got["rows"]


@pytest.mark.slow
def test_patching_over_a_prompt_set_on_two_ranks_equals_one_process(results):
    got, got1, ref, _ = results
    assert len(ref["patch"]["pair_values"]) == 5
    _close(got["patch"], ref["patch"])
    _close(got1["patch"], ref["patch"])


@pytest.mark.slow
def test_tuned_lens_trained_with_ddp_on_two_ranks_equals_one_process(results):
    got, got1, ref, _ = results
    assert ref["lens_meta"]["steps"] == 3 and ref["lens_weight"][0].abs().max() > 1e-3  # it did train
    torch.testing.assert_close(got["lens_weight"], ref["lens_weight"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got["lens_bias"], ref["lens_bias"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got1["lens_weight"], got["lens_weight"], rtol=0, atol=0)  # DDP keeps the ranks identical
    # the same losses (all-reduced over the ranks; rounded to 5 decimals), batch size, token counts
    assert got["lens_meta"]["final_kl_nats"] == pytest.approx(ref["lens_meta"]["final_kl_nats"], abs=2e-5)
    _close(
        {k: v for k, v in got["lens_meta"].items() if k != "final_kl_nats"},
        {k: v for k, v in ref["lens_meta"].items() if k != "final_kl_nats"},
    )
    _close(got["lens_div"], ref["lens_div"])


def test_shards_cover_every_item_once_and_gather_restores_order():
    n, W = 11, 3
    shards = [list(range(r, n, W)) for r in range(W)]
    assert sorted(i for s in shards for i in s) == list(range(n))
    assert distributed.shard_indices(n) == range(n)  # no process group: everything, in order
    assert distributed.gather_in_order(["a", "b"], 2) == ["a", "b"]


@pytest.mark.slow
def test_a_failing_rank_stops_the_job_with_its_error_instead_of_hanging():
    t0 = time.perf_counter()
    with pytest.raises(Exception, match="rank 1 fails on purpose"):
        mp.spawn(_failing_worker, args=(_free_port(),), nprocs=WORLD, join=True)
    assert time.perf_counter() - t0 < 60


@pytest.mark.slow
def test_torchrun_cli_stats_on_two_ranks_writes_the_single_process_statistics_and_prints_once(tmp_path):
    import subprocess
    import sys

    from safetensors.torch import load_file

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    args = ["-m", "gpt2_interp", "stats", "--layer", "0", "--n-samples", "1500"]
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            *args,
            "--cache-dir",
            str(tmp_path / "two"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert two.returncode == 0, two.stderr[-2000:]
    one = subprocess.run(
        [sys.executable, *args, "--cache-dir", str(tmp_path / "one")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert one.returncode == 0, one.stderr[-2000:]
    assert two.stdout.count("KeyStats(") == 1  # rank 0 alone prints
    (f2,), (f1,) = list((tmp_path / "two").glob("*.safetensors")), list((tmp_path / "one").glob("*.safetensors"))
    assert f2.name == f1.name  # the same cache key
    torch.testing.assert_close(load_file(str(f2))["C"], load_file(str(f1))["C"], rtol=1e-6, atol=1e-7)


def _cli(args: list[str], nproc: int = 1) -> subprocess.CompletedProcess[str]:
    import sys

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    launch = (
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc)]
        if nproc > 1
        else [sys.executable]
    )
    out = subprocess.run([*launch, "-m", "gpt2_interp", *args], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


@pytest.mark.slow
def test_torchrun_cli_trace_and_patch_over_a_dataset_print_the_single_process_result_once(tmp_path):
    import json

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "\n".join(
            json.dumps(p)
            for p in [
                {
                    "clean": "The capital of France is",
                    "corrupted": "The capital of Italy is",
                    "answer": " Paris",
                    "wrong": " Rome",
                },
                {
                    "clean": "The capital of Spain is",
                    "corrupted": "The capital of Japan is",
                    "answer": " Madrid",
                    "wrong": " Tokyo",
                },
                {
                    "clean": "The capital of Germany is",
                    "corrupted": "The capital of Egypt is",
                    "answer": " Berlin",
                    "wrong": " Cairo",
                },
            ]
        )
        + "\n"
    )
    runs = {
        "trace": [
            "trace",
            "--dataset",
            "facts:6",
            "--samples",
            "2",
            "--kind",
            "all",
            "--facts-per-batch",
            "2",
            "--json",
        ],
        "patch": ["patch", "--dataset", str(pairs), "--normalize", "--json"],
    }
    for name, args in runs.items():
        two, one = _cli(args, nproc=2), _cli(args)
        got, want = json.loads(two.stdout), json.loads(one.stdout)  # rank 0 alone prints: one JSON document
        _close(got, want, name)
    assert len(want["pair_values"]) == 3


@pytest.mark.slow
def test_torchrun_cli_tuned_lens_writes_the_single_process_lens(tmp_path):
    from gpt2_interp.analysis.tuned_lens import TunedLens

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS)
    args = ["tuned-lens", "--corpus", str(corpus), "--steps", "2", "--batch-tokens", "256", "--seq-len", "64"]
    two = _cli([*args, "--save", str(tmp_path / "two.safetensors")], nproc=2)
    _cli([*args, "--save", str(tmp_path / "one.safetensors")])
    assert two.stdout.count("saved to") == 1
    a, b = TunedLens.load(tmp_path / "two.safetensors"), TunedLens.load(tmp_path / "one.safetensors")
    assert a.meta["world_size"] == 2 and b.meta["world_size"] == 1
    # equal up to summation order — except that Adam divides each element's step by its gradient's size, so an
    # element whose gradient is at round-off level (its sign set by the summation order) may move by ±lr on one
    # run and not the other (about 1 in 10,000 elements here), each by at most a few lr per step; what the lens
    # reads does not change
    diff = torch.cat([(a.weight - b.weight).abs().flatten(), (a.bias - b.bias).abs().flatten()])
    assert float(diff.max()) <= 2 * 2 * a.meta["lr"]
    assert float((diff > 1e-5).float().mean()) < 1e-3
    import gpt2_interp as gi
    from gpt2_interp.analysis.tuned_lens import lens_divergence

    model = gi.load("gpt2-facts")
    texts = CORPUS.split("\n\n")[:6]
    da, db = lens_divergence(model, texts, a, seq_len=64), lens_divergence(model, texts, b, seq_len=64)
    assert da["kl_bits"][:-1] == pytest.approx(db["kl_bits"][:-1], rel=1e-3)
    assert da["top1_agreement"] == pytest.approx(db["top1_agreement"], abs=1 / da["n_tokens"])
