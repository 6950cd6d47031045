"""The authors' algorithm as named options and the ``"paper"`` preset (docs/guide/editing.md, "Departures
from the papers"), checked against quantities computed here by hand from the model's own activations:
MEMIT's per-context-type key weighting, the state z and the residual come from, the KL's positions,
ROME's step counting, ROME's/MEMIT's prefix generation, and ROME's bare-prompt denominator."""

from __future__ import annotations

import copy
import math
import warnings
from dataclasses import asdict

import pytest
import torch

from gpt2_interp.editing import memit, rome, settings, targets
from gpt2_interp.editing.edit import Edit, Request
from gpt2_interp.editing.hparams import load_hparams
from gpt2_interp.editing.stats import key_second_moment

REQ = Request.of({"prompt": "{} is located in the country of", "subject": "Paris", "target": " Japan"})
REQ2 = Request.of({"prompt": "{} is located in the country of", "subject": "Berlin", "target": " Italy"})


@pytest.fixture(scope="module")
def stats(facts_model):
    return key_second_moment(facts_model, [0], n_samples=2000, progress=False)


def _at_subject_end(model, text: str, subject: str, name: str, bos: bool = True) -> torch.Tensor:
    """The activation ``name`` at the subject's last token of ``text`` (BOS first when ``bos``), found by
    tokenising the text up to the end of the subject (the subject is followed by a space, a token boundary)."""
    end = text.index(subject) + len(subject)
    pos = model.to_tokens(text[:end], prepend_bos=bos).shape[1] - 1
    with torch.no_grad():
        tokens = model.to_tokens(text, prepend_bos=bos)
        _, cache = model.run_with_cache(tokens, names_filter=[name], return_type=None)
    return cache[name][0, pos].float()


def _variants(req: Request, prefixes: list[str]) -> list[str]:
    return [req.text] + [f"{p}. {req.text}" for p in prefixes]


# ---------------------------------------------------------------- the preset
def test_paper_preset_takes_the_authors_values_and_no_preset_is_unchanged(facts_model):
    hp = settings.hparams_for(facts_model, preset="paper")
    assert (hp.v_steps, hp.step_count, hp.v_lr, hp.clamp_factor, hp.weight_decay, hp.kl_factor) == (
        20,
        "evaluations",
        0.5,
        4.0,
        0.5,
        0.0625,
    )
    assert (hp.prefix_style, hp.prefix_lengths, hp.prefixes_per_length) == ("rome", (5, 10), 10)
    assert (hp.key_weighting, hp.target_state, hp.kl_positions, hp.exact_edit, hp.prepend_bos) == (
        "uniform",
        "bare_prompt",
        "subject_last",
        False,
        False,
    )
    assert hp.layer == 0 and hp.bare_weight is None and hp.preset == "paper"  # the model's layer stays
    assert settings.hparams_for(facts_model, preset="paper", v_steps=7).v_steps == 7  # the user's value wins
    # without a preset: the model's files, as before
    own = settings.RomeHparams.of(**load_hparams("rome", "gpt2-facts"))
    assert asdict(settings.hparams_for(facts_model)) == asdict(own)
    m = memit.MemitHparams.of(facts_model, preset="paper")
    assert (m.mom2_weight, m.delta_norm, m.layers, m.preset) == (20000.0, "resid", (0,), "paper")
    assert (m.rome.clamp_factor, m.rome.prefix_style, m.rome.prefix_lengths, m.rome.prefixes_per_length) == (
        0.75,
        "memit",
        (10,),
        5,
    )
    assert (m.rome.key_weighting, m.rome.target_state, m.rome.kl_positions, m.rome.step_count) == (
        "per_context_type",
        "bare_prompt",
        "subject_last",
        "evaluations",
    )
    with pytest.raises(ValueError, match="preset must be one of"):
        settings.RomeHparams(preset="mine")
    with pytest.raises(ValueError, match="key_weighting must be one of"):
        settings.RomeHparams(key_weighting="median")


def test_clamp_follows_the_published_size_class():
    class M:
        class cfg:
            name = "gpt2-medium"

    assert settings.hparams_for(M, preset="paper").clamp_factor == 3.0  # hparams/ROME/gpt2-medium.json
    M.cfg.name = "gpt2-large"
    assert settings.hparams_for(M, preset="paper").clamp_factor == 4.0
    assert settings.hparams_for(M).clamp_factor == 4.0 and settings.hparams_for(M).preset is None


# ---------------------------------------------------------------- prefixes
def test_rome_prefixes_count_the_endoftext_token_in_their_length(facts_model):
    groups = targets.context_prefix_groups(facts_model, (5, 10), 10, seed=0, style="rome")
    assert [len(g) for g in groups] == [10, 10]  # [[5, 10], [10, 10]]: 20 prefixes
    for n, group in zip((5, 10), groups):
        # max_out_len n counts the '<|endoftext|>' the texts are sampled from: n - 1 tokens of text
        assert [len(facts_model.tokenizer.encode_ids(t)) for t in group] == [n - 1] * 10


def test_memit_prefixes_start_from_its_seed_words(facts_model):
    (group,) = targets.context_prefix_groups(facts_model, (10,), 5, seed=0, style="memit")
    assert len(group) == 5
    for text, word in zip(group, ("The", "Therefore", "Because", "I", "You")):
        assert text.startswith(word) and "{" not in text and "}" not in text
    with pytest.raises(ValueError, match="multiple of 5"):
        settings.RomeHparams(prefix_style="memit", prefixes_per_length=3)


def test_our_prefixes_are_the_flattened_groups(facts_model):
    flat = targets.context_prefixes(facts_model, (5, 10), 5, 0)
    assert flat == [p for g in targets.context_prefix_groups(facts_model, (5, 10), 5, 0) for p in g]


# ---------------------------------------------------------------- keys and states
def test_per_context_type_keys_weight_the_bare_prompt_half(facts_model, stats):
    hp = memit.MemitHparams.of(facts_model, preset="paper", v_steps=2)
    groups = targets.context_prefix_groups(facts_model, hp.rome.prefix_lengths, hp.rome.prefixes_per_length, 0, "memit")
    (prefixes,) = groups
    assert targets.variant_weights(hp.rome, groups) == [0.5] + [0.1] * 5
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        e = memit.compute_edits(facts_model, [REQ, REQ2], layers=[0], stats=stats, hparams=hp, progress=False)
    for i, req in enumerate((REQ, REQ2)):
        keys = [
            _at_subject_end(facts_model, t, req.subject, "blocks.0.mlp.hook_post", bos=False)
            for t in _variants(req, prefixes)
        ]
        by_hand = 0.5 * keys[0] + 0.5 * torch.stack(keys[1:]).mean(0)  # MEMIT's compute_ks
        torch.testing.assert_close(e.keys[0][i], by_hand, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(e.keys[0][i], torch.stack(keys).mean(0), rtol=1e-3, atol=1e-3)
        # z = the bare prompt's residual + δ (MEMIT's compute_z), δ clamped by that residual's norm
        h_bare = _at_subject_end(facts_model, req.text, req.subject, "blocks.0.hook_resid_post", bos=False)
        delta = e.v_star[i] - h_bare
        assert float(delta.norm()) <= 0.75 * float(h_bare.norm()) * (1 + 1e-5)
    assert e.label == "memit (paper)" and e.method == "memit"


def test_default_keys_are_weighted_per_context_type(facts_model, stats):
    """MEMIT's default keys (chosen by measurement, hparams/memit/default.json) weight each context type
    equally: the bare prompt and each prefix length's mean, on the prompts as the model reads them (with BOS)."""
    hp = memit.MemitHparams.of(facts_model, v_steps=2)
    assert (hp.rome.key_weighting, hp.rome.target_state, hp.rome.prepend_bos) == ("per_context_type", "averaged", True)
    groups = targets.context_prefix_groups(facts_model, hp.rome.prefix_lengths, hp.rome.prefixes_per_length, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        e = memit.compute_edits(facts_model, [REQ], layers=[0], stats=stats, hparams=hp, progress=False)

    def key(text: str) -> torch.Tensor:
        return _at_subject_end(facts_model, text, REQ.subject, "blocks.0.mlp.hook_post")

    types = [key(REQ.text)] + [torch.stack([key(f"{p}. {REQ.text}") for p in g]).mean(0) for g in groups if g]
    by_hand = torch.stack(types).mean(0)
    torch.testing.assert_close(e.keys[0][0], by_hand, rtol=1e-5, atol=1e-5)
    uniform = torch.stack([key(t) for t in _variants(REQ, [p for g in groups for p in g])]).mean(0)
    assert not torch.allclose(e.keys[0][0], uniform, rtol=1e-3, atol=1e-3)
    assert e.label == "memit"


def test_rome_paper_inserts_delta_at_the_bare_key_with_the_averaged_direction(facts_model, stats):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        e = rome.compute_edit(facts_model, REQ, layer=0, stats=stats[0], progress=False, preset="paper", v_steps=3)
    prefixes = targets.context_prefixes(facts_model, (5, 10), 10, 0, style="rome")
    keys = [
        _at_subject_end(facts_model, t, REQ.subject, "blocks.0.mlp.hook_post", bos=False)
        for t in _variants(REQ, prefixes)
    ]
    torch.testing.assert_close(e.k, torch.stack(keys).mean(0), rtol=1e-5, atol=1e-5)  # compute_u: uniform mean
    k_bare = keys[0]
    mlp = facts_model.blocks[0].mlp
    v0 = k_bare @ mlp.W_out.detach().float() + mlp.b_out.detach().float()
    # ROME's compute_v: v = (v₀ + δ − v₀) / (k_bare · u): the bare prompt's key gets exactly δ, v* = v₀ + δ
    torch.testing.assert_close((k_bare @ e.u) * e.v, e.v_star - v0, rtol=1e-4, atol=1e-5)
    u_dir = stats[0].solve(e.k.float())
    torch.testing.assert_close(e.u, (u_dir / u_dir.norm()).float(), rtol=1e-4, atol=1e-6)
    assert e.label == "rome (paper)"
    assert Edit.label.fget(e) == "rome (paper)"


# ---------------------------------------------------------------- the δ loop
def _kl_by_hand(model, subject: str, delta: torch.Tensor, layer: int) -> dict[str, torch.Tensor]:
    """KL(edited ‖ unedited) of the next-token distributions on ``"{subject} is a"`` with δ added to the
    layer's MLP output at the subject's last token, per position from that token on (``kl``), with what its
    float32 rounding scales with: the edited distribution's entropy ``h`` and cross-entropy ``ce`` with the
    unedited one, and ``dz``, the largest rounding error of the logits (float32 against a float64 copy)."""
    text = f"{subject} is a"
    tokens = model.to_tokens(text)
    p = model.to_tokens(subject).shape[1] - 1

    def add(act, hook):
        act = act.clone()
        act[:, p] += delta.to(act.dtype)
        return act

    def logits(m) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            clean = m(tokens)[0, p:]
            with m.hooks([(f"blocks.{layer}.hook_mlp_out", add)]):
                return clean, m(tokens)[0, p:]

    clean, edited = logits(model)
    clean64, edited64 = logits(copy.deepcopy(model).double())
    dz = max(float((clean.double() - clean64).abs().max()), float((edited.double() - edited64).abs().max()))
    lq, lp = clean.float().log_softmax(-1), edited.float().log_softmax(-1)
    return {
        "kl": (lp.exp() * (lp - lq)).sum(-1),
        "h": -(lp.exp() * lp).sum(-1),
        "ce": -(lp.exp() * lq).sum(-1),
        "dz": torch.tensor(dz),
    }


@pytest.mark.parametrize("positions", ["subject_last", "subject_last_and_after"])
def test_kl_reads_the_positions_named(facts_model, positions):
    # v_lr 2: one Adam step moves δ by 2 per coordinate (‖δ‖ = 32), which puts the KL at ~3e-4 (subject's last
    # token) and ~8e-4 (averaged on), far above float32's rounding floor (~1e-7), which a smaller δ (KL ~6e-6)
    # would leave within a few percent of the value
    hp = settings.RomeHparams(
        v_steps=1, v_lr=2.0, early_stop=0.0, exact_edit=False, kl_positions=positions, prefix_lengths=()
    )
    ids = facts_model.tokenizer.encode_ids(REQ.target)
    opt = targets.optimise_delta(facts_model, REQ, ids, 0, [], hp, progress=False)
    assert len(opt["log"]) == 2 and opt["log"][0]["kl"] == pytest.approx(0.0, abs=1e-7)
    t = _kl_by_hand(facts_model, REQ.subject, opt["delta"], 0)
    last_only = positions == "subject_last"
    want, other = float(t["kl"][0] if last_only else t["kl"].mean()), float(t["kl"].mean() if last_only else t["kl"][0])
    # Tolerance: KL = Σᵢ pᵢ (log pᵢ − log qᵢ), here and in the library from float32 log-softmaxes of logits each
    # computed on its own floating-point path. (1) The logits' rounding δz cancels to first order from the
    # edited distribution's terms (Σᵢ pᵢ δlog pᵢ = 0: δlog p = δz − Σ p δz) and leaves Σᵢ (pᵢ − qᵢ) δzᵢ from the
    # unedited one's, ≤ ‖p − q‖₁ max|δz| ≤ √(2 KL) max|δz| (Pinsker). (2) The log-softmax's own rounding does not
    # cancel: each log pᵢ is off by ≤ u (2|log pᵢ| + log₂ V) (the max's subtraction, log Σ exp, and the sum's
    # pairwise rounding), u = 2⁻²⁴, so each KL by ≤ 2u (H + CE + log₂ V). Both computations: twice each. Per
    # position, then read as the KL reads them (≈ 4e-6 here, against a KL of 3e-4 and 8e-4; measured 1e-8 to 4e-8).
    u, log2v = torch.finfo(torch.float32).eps / 2, math.log2(facts_model.cfg.d_vocab)
    tol_pos = 4 * u * (t["h"] + t["ce"] + log2v) + 2 * (2 * t["kl"].clamp(min=0)).sqrt() * t["dz"]
    tol = float(tol_pos[0] if last_only else tol_pos.mean())
    assert abs(opt["log"][1]["kl"] - want) <= tol, (opt["log"][1]["kl"], want, tol)
    assert abs(want - other) > 4 * tol  # the two readings differ here, far beyond the tolerance


def test_step_count_evaluations_is_romes_loop(facts_model):
    ids = facts_model.tokenizer.encode_ids(REQ.target)
    base = dict(early_stop=0.0, prefix_lengths=(), exact_edit=False)
    ours = targets.optimise_delta(facts_model, REQ, ids, 0, [], settings.RomeHparams(v_steps=5, **base), progress=False)
    theirs = targets.optimise_delta(
        facts_model, REQ, ids, 0, [], settings.RomeHparams(v_steps=5, step_count="evaluations", **base), progress=False
    )
    # ROME: `for it in range(5)`: 5 evaluations, the last one without an update: 4 updates
    assert len(ours["log"]) == 6 and len(theirs["log"]) == 5
    four = targets.optimise_delta(facts_model, REQ, ids, 0, [], settings.RomeHparams(v_steps=4, **base), progress=False)
    torch.testing.assert_close(theirs["delta"], four["delta"], rtol=0, atol=0)
    assert settings.RomeHparams(v_steps=20, step_count="evaluations").n_updates == 19


def test_alphaedit_paper_is_the_authors_solve_with_their_null_space(facts_model, stats):
    """AlphaEdit_main: ΔW = solve(P(KKᵀ) + L2·I, P K Rᵀ) with P from the eigen-directions of C whose
    eigenvalue is below 2e-2 (experiments/evaluate.py get_project) and L2 = 10, R = z − h (bare prompt)."""
    hp = memit.MemitHparams.of(facts_model, preset="paper", v_steps=2)
    assert (hp.nullspace_rule, hp.nullspace_threshold, hp.alpha, hp.alpha_scale) == (
        "alphaedit",
        0.02,
        10.0,
        "absolute",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        e = memit.compute_edits(
            facts_model, [REQ, REQ2], layers=[0], stats=stats, hparams=hp, preserve=True, progress=False
        )
    assert e.label == "alphaedit (paper)"
    C = stats[0].C.double()
    U, S, _ = torch.linalg.svd(C)
    small = U[:, S < 0.02]
    P = small @ small.T
    K = e.keys[0].double().T  # [d_mlp, n], the authors' layer_ks
    h = torch.stack(
        [_at_subject_end(facts_model, r.text, r.subject, "blocks.0.hook_resid_post", bos=False) for r in (REQ, REQ2)]
    )
    R = (e.v_star.double() - h.double()).T  # [d_model, n]
    dW = torch.linalg.solve(P @ (K @ K.T) + 10.0 * torch.eye(K.shape[0], dtype=torch.float64), P @ K @ R.T)
    assert int((S < 0.02).sum()) > 0
    torch.testing.assert_close(e.delta(0).double(), dW, rtol=1e-4, atol=1e-4 * float(dW.abs().max()))


# ---------------------------------------------------------------- the mode in results and files
@pytest.mark.slow  # a ROME and an AlphaEdit edit through the CLI, with the causal trace of layers="auto"
def test_cli_json_and_saved_files_name_the_mode(tmp_path, monkeypatch, capsys):
    """``edit --json`` carries the edit's label, ``--layer auto`` works with the preset (AlphaEdit too: its
    null space is built for the layers chosen), and a saved edit file records the label."""
    import json

    from gpt2_interp.cli import main

    monkeypatch.setenv("GPT2_INTERP_STATS_DIR", str(tmp_path / "stats"))
    common = ["--model", "gpt2-facts", "--n-samples", "500", "--allow-failed", "--json", "--quiet"]
    fast = ["--hparam", "preset=paper", "--hparam", "v_steps=2"]
    assert main(["edit", *common, *fast, "--subject", "Paris", "--prompt", "{} is located in the country of",
                 "--target", " Japan", "--hparam", "prefix_lengths=[3]", "--hparam", "prefixes_per_length=1",
                 "--layer", "auto"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["edit"]["label"] == "rome (paper)"
    reqs = tmp_path / "r.jsonl"
    reqs.write_text("\n".join(json.dumps(asdict(r)) for r in (REQ, REQ2)) + "\n")
    saved = tmp_path / "a.edit"
    assert main(["edit", *common, *fast, "--requests", str(reqs), "--method", "alphaedit", "--layer", "auto",
                 "--save", str(saved)]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["label"] == "alphaedit (paper)" and out["method"] == "alphaedit" and out["layers"]
    loaded = Edit.load(saved)
    assert loaded.label == "alphaedit (paper)" and repr(loaded).startswith("Edit(alphaedit (paper), 2 requests")
    from safetensors import safe_open

    with safe_open(str(saved), "pt") as f:
        assert json.loads(f.metadata()["edit"])["label"] == "alphaedit (paper)"
