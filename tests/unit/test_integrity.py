"""Files and numbers we do not trust blindly: integrity-checked edit and key-statistics files,
checkpoints with NaN/inf weights, non-finite metrics, and NaN introduced by a user's hook."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import gpt2_interp as gi
from gpt2_interp.analysis.lens import logit_lens
from gpt2_interp.analysis.patching import patch, prob
from gpt2_interp.core.finite import NonFiniteWarning
from gpt2_interp.editing import Edit, Request, weights_fingerprint
from gpt2_interp.editing import stats as stats_mod
from gpt2_interp.editing.stats import KeyStats, key_second_moment
from gpt2_interp.io.integrity import IntegrityError, UnverifiedFileWarning, content_digest, load_checked, save_checked
from gpt2_interp.model import HookedGPT2

from ..conftest import TINY


def _edit(model: HookedGPT2, layer: int = 1) -> Edit:
    g = torch.Generator().manual_seed(0)
    u = torch.randn(model.cfg.d_mlp, generator=g)
    return Edit.rank_one(
        layer,
        u / u.norm(),
        torch.randn(model.cfg.d_model, generator=g) * 0.1,
        Request("{} is located in", "Eiffel Tower", " Rome"),
        weights_fingerprint(model),
        k=torch.randn(model.cfg.d_mlp, generator=g),
        model_name=model.cfg.name,
    )


def _rewrite(path, tensors=None, meta_change=None, keep_digest=True):
    """Rewrite a safetensors file with changed tensors/header, keeping the stored digest (as a naive
    editor of the file would)."""
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata())
        ts = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safetensors safe_open handles have keys() but are not iterable)
    ts.update(tensors or {})
    if meta_change:
        meta_change(meta)
    if not keep_digest:
        meta.pop("sha256")
    save_file(ts, str(path), metadata=meta)


# ------------------------------------------------------------------ edit files
def test_edit_file_round_trips_and_carries_a_digest_of_tensors_and_header(tiny, tmp_path):
    e = _edit(tiny)
    path = e.save(tmp_path / "e.edit")
    with safe_open(str(path), framework="pt") as f:
        meta = dict(f.metadata())
        ts = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safetensors safe_open handles have keys() but are not iterable)
    stored = meta.pop("sha256")
    assert stored == content_digest(ts, meta) and set(ts) == {"L1.U", "L1.V", "k"}  # layer 1's factors, the key
    loaded = Edit.load(path, tiny)
    assert torch.equal(loaded.u, e.u) and loaded.layer == 1


def test_flipped_tensor_bytes_are_refused_naming_the_file(tiny, tmp_path):
    path = _edit(tiny).save(tmp_path / "e.edit")
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x40  # inside the last tensor's bytes
    path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=r"e\.edit.*integrity check"):
        Edit.load(path)


def test_edited_header_layer_is_refused(tiny, tmp_path):
    path = _edit(tiny, layer=1).save(tmp_path / "e.edit")

    def move_to_layer_0(meta):
        edit = json.loads(meta["edit"])
        edit["layer"] = 0
        meta["edit"] = json.dumps(edit)

    _rewrite(path, meta_change=move_to_layer_0)
    with pytest.raises(IntegrityError, match="modified or damaged"):
        Edit.load(path, tiny)


def test_replaced_tensor_with_kept_digest_is_refused(tiny, tmp_path):
    e = _edit(tiny)
    path = e.save(tmp_path / "e.edit")
    _rewrite(path, tensors={"v": e.v * 100})
    with pytest.raises(IntegrityError):
        Edit.load(path)


@pytest.mark.parametrize("keep", [0.9, 0.5, 0.02])
def test_truncated_edit_file_is_refused_naming_the_file(tiny, tmp_path, keep):
    path = _edit(tiny).save(tmp_path / "e.edit")
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ValueError, match=r"e\.edit"):
        Edit.load(path)


def test_edit_file_without_digest_loads_with_a_warning(tiny, tmp_path):
    """Files written before digests existed: accepted, unverified, with an UnverifiedFileWarning."""
    e = _edit(tiny)
    path = e.save(tmp_path / "old.edit")
    _rewrite(path, keep_digest=False)
    with pytest.warns(UnverifiedFileWarning, match="old.edit"):
        loaded = Edit.load(path, tiny)
    assert torch.equal(loaded.v, e.v)
    with pytest.raises(IntegrityError, match="no integrity digest"):
        load_checked(path, "edit", allow_unverified=False)


def test_edit_with_nan_tensor_is_refused_even_with_a_valid_digest(tiny, tmp_path):
    e = _edit(tiny)
    with pytest.raises(ValueError, match="not finite"):  # Edit.save refuses to write it …
        e.v[3] = float("nan")
        e.save(tmp_path / "refused.edit")
    e.v[3] = 0.0
    path = e.save(tmp_path / "nan.edit")
    with safe_open(str(path), framework="pt") as f:  # … so write one by hand, with a digest that matches it
        meta = dict(f.metadata())
        ts = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safetensors safe_open handles have keys() but are not iterable)
    meta.pop("sha256")
    ts["L1.V"].view(-1)[3] = float("nan")
    save_checked(path, ts, meta)
    with pytest.raises(ValueError, match=r"tensor 'L1\.V'.*not finite"):  # v is layer 1's V factor
        Edit.load(path)


def test_save_checked_digest_covers_every_header_field(tmp_path):
    path = save_checked(tmp_path / "x.st", {"a": torch.arange(4.0)}, {"format": "x", "note": "hello"})
    _rewrite(path, meta_change=lambda m: m.update(note="hullo"))
    with pytest.raises(IntegrityError):
        load_checked(path)
    path = save_checked(tmp_path / "y.st", {"a": torch.arange(4.0)}, {"format": "x"})
    _rewrite(path, meta_change=lambda m: m.update(extra="1"))  # an added field counts too
    with pytest.raises(IntegrityError):
        load_checked(path)


# ------------------------------------------------------------------ key statistics
@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("\n\n".join(f"The Eiffel Tower is in Paris, number {i}." for i in range(40)))
    return path


def test_tampered_stats_file_is_refused_and_a_damaged_cache_is_recomputed(tiny, corpus, tmp_path):
    stats_mod.clear_memory_cache()
    st = key_second_moment(tiny, 0, corpus=str(corpus), n_samples=200, cache_dir=tmp_path, progress=False)
    assert KeyStats.load(st.path).count == st.count
    data = bytearray(st.path.read_bytes())
    data[-9] ^= 0x01
    st.path.write_bytes(bytes(data))
    with pytest.raises(IntegrityError, match=st.path.name):
        KeyStats.load(st.path)
    stats_mod.clear_memory_cache()
    with pytest.warns(UserWarning, match="ignoring the key-statistics cache file"):
        again = key_second_moment(tiny, 0, corpus=str(corpus), n_samples=200, cache_dir=tmp_path, progress=False)
    assert torch.equal(again.C, st.C)  # recomputed from the corpus, the same numbers
    assert KeyStats.load(st.path).count == st.count  # and the cache file rewritten, valid again
    path = st.path
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(IntegrityError, match="damaged"):
        KeyStats.load(path)


# ------------------------------------------------------------------ checkpoints
def test_checkpoint_with_nan_weight_is_refused_naming_the_tensor(tiny, tmp_path):
    tiny.save(tmp_path / "m")
    sd = load_file(str(tmp_path / "m" / "model.safetensors"))
    sd["transformer.h.1.mlp.c_proj.weight"][2, 3] = float("nan")
    save_file(sd, str(tmp_path / "m" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"transformer\.h\.1\.mlp\.c_proj\.weight.*1 NaN"):
        gi.load(tmp_path / "m")
    # the bare-file path, and inf, and the state-dict path
    sd["transformer.h.1.mlp.c_proj.weight"][2, 3] = float("inf")
    save_file(sd, str(tmp_path / "w.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"w\.safetensors.*c_proj\.weight.*inf"):
        gi.load(tmp_path / "w.safetensors", config=TINY)
    with pytest.raises(ValueError, match="non-finite"):
        gi.from_state_dict(sd, TINY)


def test_damaged_checkpoint_and_config_name_the_file(tiny, tmp_path):
    tiny.save(tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ValueError, match=r"model\.safetensors is damaged"):
        gi.load(tmp_path / "m")
    tiny.save(tmp_path / "c")
    (tmp_path / "c" / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json is not valid JSON"):
        gi.load(tmp_path / "c")
    (tmp_path / "c" / "config.json").write_text(json.dumps({"n_layer": "two", "n_embd": 64}))
    with pytest.raises(ValueError, match="n_layer='two' must be"):
        gi.load(tmp_path / "c")


def test_unknown_dtype_and_device_are_named():
    with pytest.raises(ValueError, match=r"unknown dtype 'fp64'.*fp32"):
        gi.load("gpt2-facts", dtype="fp64")
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        gi.load("gpt2-facts", device="gpu")


# ------------------------------------------------------------------ non-finite analyses
def _nan_everywhere(act, hook):
    return torch.full_like(act, float("nan"))


def test_nan_from_a_hook_is_named_in_a_warning(tiny):
    with pytest.warns(NonFiniteWarning, match=r"'_nan_everywhere' returned at 'blocks\.0\.hook_mlp_out'"):
        tiny.run_with_hooks("The cat sat", [("blocks.0.hook_mlp_out", _nan_everywhere)])


def test_hooks_returning_finite_values_do_not_warn(tiny):
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteWarning)
        # attention scores hold -inf at masked places by design: returning them is fine
        tiny.run_with_hooks(
            "The cat sat on the mat",
            [
                ("blocks.0.attn.hook_attn_scores", lambda a, h: a.clone()),
                ("blocks.1.hook_resid_pre", lambda a, h: a * 2),
            ],
        )


def test_overflow_downstream_of_a_finite_hook_is_reported_as_downstream(tiny):
    with pytest.warns(NonFiniteWarning, match="downstream"):
        tiny.run_with_hooks("The cat sat", [("blocks.0.mlp.hook_pre", lambda a, h: a * 1e30)])


def test_logit_lens_refuses_to_rank_nan_logits(tiny):
    with (
        tiny.hooks([("blocks.0.hook_mlp_out", _nan_everywhere)]),
        pytest.warns(NonFiniteWarning),
        pytest.raises(ValueError, match=r"blocks\.0\.hook_resid_post.*non-finite"),
    ):
        logit_lens(tiny, "The cat sat", targets=" mat")


def test_patching_refuses_a_nan_metric(tiny):
    def nan_metric(logits):
        return logits[..., 0] * float("nan")

    with pytest.raises(ValueError, match="metric nan_metric on the clean run is not finite"):
        patch(tiny, "The cat sat", "The dog sat", nan_metric)
    r = patch(tiny, "The cat sat", "The dog sat", prob(" on"))  # the same call with a finite metric works
    assert torch.isfinite(r.values).all()
