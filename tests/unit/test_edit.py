"""The Edit value: bit-exact apply/undo, LIFO stacks, save/load, refusal of other models."""

from __future__ import annotations

import json

import pytest
import torch

from gpt2_interp.editing import Edit, Request, applied_edits, undo_all, weights_fingerprint
from gpt2_interp.editing.edit import load_edit, original_weights, tensor_digest
from gpt2_interp.model import HookedGPT2

from ..conftest import TINY


def _snapshot(model: HookedGPT2) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _same(model: HookedGPT2, snap: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(p, snap[n]) for n, p in model.named_parameters())


def _edit(model: HookedGPT2, layer: int, seed: int, target: str = " Rome") -> Edit:
    """A random rank-one edit made for the model's current weights (the algebra of ROME is tested
    in test_rome; here only the bookkeeping matters)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(model.cfg.d_mlp, generator=g)
    return Edit.rank_one(
        layer,
        u / u.norm(),
        torch.randn(model.cfg.d_model, generator=g) * 0.1,
        Request("{} is located in", "Eiffel Tower", target),
        weights_fingerprint(model),
        model_name=model.cfg.name,
    )


def test_apply_changes_w_out_by_the_outer_product_and_undo_is_bit_exact(tiny):
    snap = _snapshot(tiny)
    e = _edit(tiny, 1, 0)
    e.apply(tiny)
    W = tiny.blocks[1].mlp.W_out
    torch.testing.assert_close(W - snap["blocks.1.mlp.W_out"], torch.outer(e.u, e.v), rtol=0, atol=1e-6)
    assert all(torch.equal(p, snap[n]) for n, p in tiny.named_parameters() if n != "blocks.1.mlp.W_out")
    assert applied_edits(tiny) == [e]
    e.undo(tiny)
    assert _same(tiny, snap) and applied_edits(tiny) == []
    assert original_weights(tiny) == {}  # nothing kept


def test_context_manager_undoes_even_on_error(tiny):
    snap = _snapshot(tiny)
    e = _edit(tiny, 0, 1)
    with pytest.raises(RuntimeError, match="boom"), tiny.edited(e):
        assert not _same(tiny, snap)
        raise RuntimeError("boom")
    assert _same(tiny, snap)


def test_stacked_edits_undo_lifo_and_refuse_out_of_order(tiny):
    snap = _snapshot(tiny)
    e1 = _edit(tiny, 1, 1).apply(tiny)
    after1 = _snapshot(tiny)
    e2 = _edit(tiny, 1, 2).apply(tiny)  # made for the model with e1 applied
    e3 = _edit(tiny, 0, 3).apply(tiny)
    assert applied_edits(tiny) == [e1, e2, e3]
    assert len(original_weights(tiny)) == 2  # one W_out copy per edited layer, not per edit
    with pytest.raises(ValueError, match="out of order"):
        e1.undo(tiny)
    e3.undo(tiny)
    e2.undo(tiny)
    assert _same(tiny, after1)
    e1.undo(tiny)
    assert _same(tiny, snap)
    with pytest.raises(ValueError, match="not applied"):
        e1.undo(tiny)


def test_out_of_order_undo_equals_never_applying(tiny):
    """Removing e1 from [e1, e2] by replay gives exactly the weights of applying only e2."""
    e1 = _edit(tiny, 1, 1).apply(tiny)
    e2 = _edit(tiny, 1, 2).apply(tiny, verify=False)
    e1.undo(tiny, out_of_order=True)
    assert applied_edits(tiny) == [e2]
    reference = HookedGPT2(TINY, seed=0).eval()
    e2.apply(reference, verify=False)
    assert _same(tiny, _snapshot(reference))
    e2.undo(tiny)
    assert _same(tiny, _snapshot(HookedGPT2(TINY, seed=0)))


def test_undo_all_and_tampering(tiny):
    snap = _snapshot(tiny)
    for i in range(3):
        _edit(tiny, i % 2, i).apply(tiny, verify=False)
    assert undo_all(tiny) == 3
    assert _same(tiny, snap) and applied_edits(tiny) == []
    e = _edit(tiny, 1, 5).apply(tiny)
    with torch.no_grad():
        tiny.blocks[1].mlp.W_out[0, 0] += 1.0  # a change outside the edit API
    with pytest.raises(RuntimeError, match="outside the edit API"):
        e.undo(tiny)


def test_refuses_another_model_and_bad_layers(tiny):
    e = _edit(tiny, 1, 0)
    other = HookedGPT2(TINY, seed=1).eval()
    with pytest.raises(ValueError, match="fingerprint"):
        e.apply(other)
    assert applied_edits(other) == []
    e.apply(tiny)
    with pytest.raises(ValueError, match="fingerprint"):  # the model changed: e's base is gone
        _edit(HookedGPT2(TINY, seed=0), 1, 1).apply(tiny)
    e.undo(tiny)
    bad = _edit(tiny, 1, 0)
    bad.layer = 7
    with pytest.raises(IndexError, match=r"0\.\.1"):
        bad.apply(tiny)


def test_fingerprint_is_bit_exact(tiny):
    fp = weights_fingerprint(tiny)
    assert weights_fingerprint(HookedGPT2(TINY, seed=0)) == fp
    with torch.no_grad():
        w = tiny.blocks[0].ln1.w
        w[3] = torch.nextafter(w[3], torch.tensor(2.0))  # one ulp
    assert weights_fingerprint(tiny) != fp
    t = torch.arange(6.0)
    assert tensor_digest(t) != tensor_digest(t.reshape(2, 3)) != tensor_digest(t.double())


def test_save_load_gives_identical_logits_and_refuses_other_models(tiny, tmp_path):
    e = _edit(tiny, 1, 4)
    e.metrics = {"p_target_before": 0.01}
    e.k, e.v_star = torch.randn(tiny.cfg.d_mlp), torch.randn(tiny.cfg.d_model)
    path = e.save(tmp_path / "my.edit")
    assert path.read_bytes()[:8] != b"\x80\x04\x95"  # not a pickle
    with tiny.edited(e):
        want = tiny("The Eiffel Tower is located in")
    fresh = HookedGPT2(TINY, seed=0).eval()
    loaded = Edit.load(path, fresh)
    assert loaded.request == e.request and loaded.layer == 1 and loaded.metrics == e.metrics
    assert torch.equal(loaded.u, e.u) and torch.equal(loaded.v, e.v) and torch.equal(loaded.k, e.k)
    with fresh.edited(loaded):
        got = fresh("The Eiffel Tower is located in")
    assert torch.equal(got, want)
    with pytest.raises(ValueError, match="fingerprint"):
        load_edit(path, HookedGPT2(TINY, seed=1))
    (tmp_path / "junk.edit").write_bytes(b"not an edit")
    with pytest.raises(ValueError, match="not an edit"):
        Edit.load(tmp_path / "junk.edit")
    with pytest.raises(FileNotFoundError):
        Edit.load(tmp_path / "missing.edit")


def test_request_validation():
    r = Request.of({"prompt": "{} is in", "subject": "Louvre", "target_new": {"str": "Rome"}})
    assert r.target == " Rome" and r.text == "Louvre is in"
    with pytest.raises(ValueError, match=r"did you mean '\{\} is in'"):
        Request("Louvre is in", "Louvre", " Rome")
    with pytest.raises(ValueError, match="exactly once"):
        Request("{} and {}", "Louvre", " Rome")
    with pytest.raises(ValueError, match="empty"):
        Request("{} is in", "Louvre", "  ")
    with pytest.raises(ValueError, match="lacks"):
        Request.of({"prompt": "{} is in", "subject": "Louvre"})


@pytest.mark.slow
def test_cli_edit_verify_stats(tiny, tmp_path, monkeypatch, capsys):
    from gpt2_interp.cli import main

    monkeypatch.setenv("GPT2_INTERP_STATS_DIR", str(tmp_path / "stats"))
    tiny.save(tmp_path / "tiny")
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(f"The Eiffel Tower is in Paris, item {i}." for i in range(60)))
    model = ["--model", str(tmp_path / "tiny")]
    assert main(["stats", *model, "--layer", "0", "--corpus", str(corpus), "--n-samples", "500"]) == 0
    assert "500 keys" in capsys.readouterr().out and len(list((tmp_path / "stats").glob("*.safetensors"))) == 1
    edit_args = [
        "edit",
        *model,
        "--subject",
        "Eiffel Tower",
        "--prompt",
        "{} is in",
        "--target",
        " Rome",
        "--layer",
        "0",
        "--corpus",
        str(corpus),
        "--n-samples",
        "500",
        "--hparam",
        "v_steps=2",
        "--allow-failed",  # two δ steps on a random model: the edit need not take (exit 3 without it)
        "--paraphrase",
        "The {} stands in",
        "--save",
        str(tmp_path / "my.edit"),
    ]
    assert main(edit_args) == 0
    out = capsys.readouterr().out
    assert "'The Eiffel Tower stands in'" in out and "saved to" in out
    assert len(list((tmp_path / "stats").glob("*.safetensors"))) == 1  # the cached statistics were reused
    assert main(["verify", str(tmp_path / "my.edit"), *model, "--prompt", "Eiffel Tower is in", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["prompts"] == ["Eiffel Tower is in"] and shown["p_target_after"][0] > 0
    HookedGPT2(TINY, seed=1).save(tmp_path / "other")
    assert main(["verify", str(tmp_path / "my.edit"), "--model", str(tmp_path / "other")]) == 2
    assert "fingerprint" in capsys.readouterr().err
    for keep in ([], ["--keep", "People who visit {} see"]):  # keep prompts enter the δ loss
        assert main([*edit_args[:-2], *keep, "--json"]) == 0
        keep_kl = json.loads(capsys.readouterr().out)["edit"]["metrics"]["final_loss"]["keep_kl"]
        assert (keep_kl > 0) == bool(keep)
    assert main(["edit", *model, "--subject", "Louvre", "--prompt", "is in", "--target", " Rome"]) == 2
    assert "{}" in capsys.readouterr().err
