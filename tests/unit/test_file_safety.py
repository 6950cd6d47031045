"""No file can run code: a payload planted in every kind of file the library reads never runs.

Each kind is first written by the library, then replaced by a crafted file whose unpickling would create
a marker file (a plain pickle, and the same payload in PyTorch's zip format); reading it must be refused
with an error that names the file, and the marker must never appear. The file layer's tree format is also
checked to round-trip what caches and checkpoints hold, and to refuse a class it was not told to rebuild."""

from __future__ import annotations

import io
import json
import pickle
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import gpt2_interp as gi
from gpt2_interp.analysis.circuits import Circuit
from gpt2_interp.analysis.features.sae import SAE, SAEConfig, load_sae
from gpt2_interp.analysis.features.sae_train import CHECKPOINT_FILE, SAETrainConfig, token_windows, train_sae
from gpt2_interp.analysis.patching import PatchResult
from gpt2_interp.analysis.tuned_lens import TunedLens
from gpt2_interp.editing import Edit, Request, weights_fingerprint
from gpt2_interp.editing.edit import load_edit
from gpt2_interp.editing.stats import KeyStats
from gpt2_interp.experiments import ExperimentConfig, ExperimentResult, register, run_experiment
from gpt2_interp.experiments.base import REGISTRY
from gpt2_interp.io.files import FileFormatError, load_tree, read_json, save_tree, write_json
from gpt2_interp.io.integrity import IntegrityError


class _Payload:
    """Unpickling this calls ``open(marker, "w")``: the marker file appearing means code ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _payloads(marker: Path) -> dict[str, bytes]:
    buf = io.BytesIO()
    torch.save({"weights": torch.zeros(2), "x": _Payload(marker)}, buf)
    return {"pickle": pickle.dumps({"x": _Payload(marker)}), "torch zip": buf.getvalue()}


def _plant(path: Path, data: bytes) -> None:
    path.write_bytes(data)


def _refused(load, path: Path, marker: Path) -> None:
    with pytest.raises((ValueError, OSError)) as info:
        load()
    assert not marker.exists(), f"reading the crafted {path.name} ran code"
    assert str(path) in str(info.value) or path.name in str(info.value), info.value


# ------------------------------------------------------------------ one writer + one reader per file kind
def _edit_file(tiny, d: Path):
    g = torch.Generator().manual_seed(0)
    u = torch.randn(tiny.cfg.d_mlp, generator=g)
    e = Edit.rank_one(1, u / u.norm(), torch.randn(tiny.cfg.d_model, generator=g), Request("{} is in", "X", " Y"),
             weights_fingerprint(tiny), model_name=tiny.cfg.name)  # fmt: skip
    return e.save(d / "a.edit"), lambda p: load_edit(p)


def _stats_file(tiny, d: Path):
    key = {"model_name": "tiny", "layer": 0, "corpus": "x", "n": 3, "dtype": "float32", "weights": "0"}
    return KeyStats(torch.eye(4), 3, key).save(d / "stats.safetensors"), lambda p: KeyStats.load(p)


def _lens_file(tiny, d: Path):
    return TunedLens.identity(tiny).save(d / "lens.safetensors"), lambda p: TunedLens.load(p)


def _sae_weights(tiny, d: Path):
    folder = SAE(SAEConfig(d_in=tiny.cfg.d_model, d_sae=8, hook_name="blocks.0.hook_resid_post", k=2)).save(d / "s")
    return folder / "sae_weights.safetensors", lambda p: load_sae(p.parent)


def _sae_config(tiny, d: Path):
    folder = SAE(SAEConfig(d_in=tiny.cfg.d_model, d_sae=8, hook_name="blocks.0.hook_resid_post", k=2)).save(d / "s")
    return folder / "cfg.json", lambda p: load_sae(p.parent)


def _sae_checkpoint(tiny, d: Path):
    cfg = SAETrainConfig(hook_name="blocks.0.hook_resid_post", expansion=2, k=4, tokens=200, batch_size=50,
                         buffer_tokens=100, checkpoint_every=1)  # fmt: skip
    windows = token_windows(tiny, ["The cat sat on the mat and looked out of the window."] * 40, 8)
    train_sae(tiny, cfg, windows=windows, checkpoint=d / "ckpt", progress=False)
    return d / "ckpt" / CHECKPOINT_FILE, lambda p: train_sae(tiny, cfg, windows=windows, checkpoint=p.parent,
                                                             progress=False)  # fmt: skip


def _circuit_file(tiny, d: Path):
    c = Circuit(["a0.h0->logits"], [1.0], "eap", "m", tiny.cfg.n_layer, tiny.cfg.n_head, tiny.cfg.n_head, 10)
    return c.save(d / "c.json"), lambda p: Circuit.load(p)


def _result_file(tiny, d: Path):
    folder = d / "r"
    write_json(folder / "result.json", {"experiment": "toy", "model": "tiny", "config": {}, "data": {"x": [1.0]}})
    return folder / "result.json", lambda p: ExperimentResult.load(p.parent)


def _checkpoint_bin(tiny, d: Path):
    folder = tiny.save(d / "hf")
    (folder / "model.safetensors").unlink()
    return folder / "pytorch_model.bin", lambda p: gi.load(p.parent)


def _gguf_file(tiny, d: Path):
    return d / "m.gguf", lambda p: gi.load(p)


KINDS = {
    "edit": _edit_file,
    "key statistics": _stats_file,
    "tuned lens": _lens_file,
    "SAE weights": _sae_weights,
    "SAE config": _sae_config,
    "SAE training checkpoint": _sae_checkpoint,
    "circuit": _circuit_file,
    "experiment result": _result_file,
    "model checkpoint (.bin)": _checkpoint_bin,
    "GGUF": _gguf_file,
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("payload", ["pickle", "torch zip"])
def test_a_crafted_file_of_every_kind_never_runs_code(kind, payload, tiny, tmp_path):
    marker = tmp_path / "RAN"
    path, load = KINDS[kind](tiny, tmp_path)
    _plant(path, _payloads(marker)[payload])
    _refused(lambda: load(path), path, marker)


@dataclass
class _ToyConfig(ExperimentConfig):
    n: int = 3


def test_a_crafted_experiment_cache_never_runs_code(tiny, tmp_path):
    """The runner's cache is read without unpickling: a payload in a cache file (under its own name, or an
    older ``.pt`` name beside it) is refused or ignored, and never runs."""
    marker, calls = tmp_path / "RAN", []

    def run(model, cfg, ctx):
        sweep = ctx.cached("sweep", lambda: (calls.append(1), {"r": torch.ones(cfg.n), "k": {0: (1, "a")}})[1])
        return {"x": sweep["r"].tolist(), "k": sweep["k"][0][1]}

    register("toy_safe", _ToyConfig)(run)
    try:
        first = run_experiment("toy_safe", tiny, out=tmp_path, progress=False)
        cache = tmp_path / "toy_safe" / "tiny" / ".cache"
        (file,) = cache.iterdir()
        again = run_experiment("toy_safe", tiny, out=tmp_path, progress=False)
        assert len(calls) == 1 and again.data == first.data  # read back from the safe file
        for data in _payloads(marker).values():
            (cache / (file.stem + ".pt")).write_bytes(data)  # the old pickle name is never read
            file.write_bytes(data)
            with pytest.raises(IntegrityError, match=file.name):
                run_experiment("toy_safe", tiny, out=tmp_path, progress=False)
            assert not marker.exists()
    finally:
        REGISTRY.pop("toy_safe")


# -------------------------------------------------------------------------------- the tree format itself
@dataclass
class _Point:
    x: float
    t: torch.Tensor


def test_trees_round_trip_what_caches_and_checkpoints_hold(tmp_path):
    import numpy as np

    value = {
        "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.randn(4, 2)}},
        "groups": [{"betas": (0.9, 0.999), "params": [0, 1], "lr": 1e-3, "flag": True, "none": None}],
        "array": np.arange(6).reshape(2, 3),
        "nan": float("nan"),
        "__odd__": "a key that looks like a marker",
        "dtype": torch.bfloat16,
        "point": _Point(1.5, torch.ones(2)),
    }
    path = save_tree(tmp_path / "t.safetensors", value, "test", finite=False)
    back = load_tree(path, "test", types=[_Point])
    assert back["state"][0]["step"].item() == 3.0 and torch.equal(
        back["state"][0]["exp_avg"], value["state"][0]["exp_avg"]
    )
    assert back["groups"] == value["groups"] and isinstance(back["groups"][0]["betas"], tuple)
    assert (back["array"] == value["array"]).all() and back["nan"] != back["nan"]
    assert back["__odd__"] == value["__odd__"] and back["dtype"] is torch.bfloat16
    assert back["point"].x == 1.5 and torch.equal(back["point"].t, torch.ones(2))
    with pytest.raises(FileFormatError, match="_Point"):  # a class the reader did not name is not rebuilt
        load_tree(path, "test")


def test_a_cached_result_object_comes_back_as_itself(tmp_path):
    r = PatchResult(torch.ones(2, 3), torch.ones(1, 2, 3), ("layer", "pos"), [0, 1], ["0", "1"], [0, 1, 2],
                    ["a", "b", "c"], None, None, "resid_pre", "denoise", "logit_diff", True, 1.0, 0.0,
                    torch.ones(1), torch.zeros(1))  # fmt: skip
    back = load_tree(save_tree(tmp_path / "r.safetensors", {"result": r}, "cache"), "cache")["result"]
    assert isinstance(back, PatchResult) and torch.equal(back.values, r.values) and back.index_names == r.index_names


def test_non_finite_tensors_and_edited_trees_are_refused_naming_the_file(tmp_path):
    with pytest.raises(ValueError, match=r"'w' holds 1 non-finite"):
        save_tree(tmp_path / "bad.safetensors", {"w": torch.tensor([1.0, float("inf")])}, "checkpoint")
    path = save_tree(tmp_path / "ok.safetensors", {"w": torch.ones(3)}, "checkpoint")
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1  # one flipped bit in the last tensor byte
    path.write_bytes(bytes(raw))
    with pytest.raises(IntegrityError, match=r"ok\.safetensors"):
        load_tree(path, "checkpoint")


def test_json_files_name_the_file_when_cut_short_edited_or_incomplete(tmp_path):
    path = write_json(tmp_path / "c.json", {"edges": ["a"], "n": 1})
    assert read_json(path, "circuit", required=["edges"]) == {"edges": ["a"], "n": 1}
    text = path.read_text()
    (tmp_path / "cut.json").write_text(text[: len(text) // 2])
    with pytest.raises(FileFormatError, match=r"cut\.json.*truncated"):
        read_json(tmp_path / "cut.json", "circuit")
    edited = json.loads(text) | {"n": 2}
    (tmp_path / "edited.json").write_text(json.dumps(edited))
    with pytest.raises(IntegrityError, match=r"edited\.json"):
        read_json(tmp_path / "edited.json", "circuit")
    with pytest.raises(FileFormatError, match=r"lacks the field\(s\) scores"):
        read_json(path, "circuit", required=["edges", "scores"])
