"""Editing answers bad input clearly and never does harm silently: non-finite settings and factors are
refused naming the field or tensor, edits that do nothing are reported, objects handed in are checked
against the model and requests they meet, values are not coerced, and the CLI refuses counts ≤ 0."""

from __future__ import annotations

import json
import math
import typing
import warnings
from dataclasses import fields

import pytest
import torch

from gpt2_interp.cli import main
from gpt2_interp.editing import rome
from gpt2_interp.editing.edit import (
    Edit,
    EditFailedWarning,
    EditWarning,
    Request,
    TargetSpacingWarning,
    is_weak,
    load_edit,
)
from gpt2_interp.editing.memit import MemitHparams, NullSpace, compute_edits, validate_requests
from gpt2_interp.editing.rome import compute_edit
from gpt2_interp.editing.settings import RomeHparams
from gpt2_interp.editing.stats import KeyStats, key_second_moment
from gpt2_interp.editing.targets import target_outcomes, validate_request
from gpt2_interp.model import HookedGPT2

from ..conftest import TINY

FAST = dict(prefix_lengths=(3,), prefixes_per_length=1, v_steps=2)
REQS = [
    {"prompt": "{} is located in the city of", "subject": "Eiffel Tower", "target": " Rome"},
    {"prompt": "The capital of {} is", "subject": "France", "target": " Berlin"},
    {"prompt": "{} speaks the language", "subject": "Brazil", "target": " German"},
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    docs = [
        f"The tower stands in Paris, and {i} people saw it; Rome and Berlin have {2 * i} museums." for i in range(130)
    ]
    path.write_text("\n\n".join(docs))
    return path


@pytest.fixture
def stats(tiny, corpus, tmp_path):
    return key_second_moment(tiny, [0, 1], corpus=str(corpus), n_samples=2000, cache_dir=tmp_path, progress=False)


def _float_fields(cls) -> list[str]:
    hints = typing.get_type_hints(cls)
    return [f.name for f in fields(cls) if hints[f.name] in (float, float | None)]


# ------------------------------------------------------------------ 1. NaN is not "in range"
@pytest.mark.parametrize("cls", [RomeHparams, MemitHparams])
def test_every_float_setting_refuses_nan_and_inf_naming_the_field(cls):
    names = _float_fields(cls)
    assert len(names) >= (7 if cls is RomeHparams else 3)  # the float settings are all found
    for name in names:
        for bad in (math.nan, math.inf, -math.inf):
            with pytest.raises(ValueError, match=f"hyperparameter {name} must be a finite number"):
                cls(**{name: bad})


def test_out_of_range_settings_name_the_field_and_the_range():
    with pytest.raises(ValueError, match=r"alpha must be > 0, got -1"):
        MemitHparams(alpha=-1.0)
    with pytest.raises(ValueError, match=r"nullspace_threshold must be in \(0, 1\), got 1"):
        MemitHparams(nullspace_threshold=1.0)
    with pytest.raises(ValueError, match=r"bare_weight must be in \[0, 1\], got 1.5"):
        RomeHparams(bare_weight=1.5)
    with pytest.raises(ValueError, match="chunk must be ≥ 1, got 0"):
        MemitHparams(chunk=0)


def test_a_nan_setting_is_refused_before_any_work_even_when_set_after_construction(tiny, stats):
    with pytest.raises(ValueError, match="alpha must be a finite number"):
        compute_edits(tiny, REQS, layers=[0], stats=stats, hparams={"alpha": math.nan}, preserve=True)
    hp = MemitHparams.of(tiny, **FAST)
    hp.alpha = math.nan  # a dataclass can be changed after it was checked: compute_edits checks again
    with pytest.raises(ValueError, match="alpha must be a finite number"):
        compute_edits(tiny, REQS, layers=[0], stats=stats, hparams=hp, preserve=True)
    hp = MemitHparams.of(tiny, **FAST)
    hp.rome.clamp_factor = math.inf
    with pytest.raises(ValueError, match="clamp_factor must be a finite number"):
        compute_edits(tiny, REQS, layers=[0], stats=stats, hparams=hp)
    with pytest.raises(ValueError, match="v_lr must be a finite number"):
        compute_edit(tiny, REQS[0], layer=0, stats=stats[0], v_lr=math.nan)


def _nan_edit(tiny) -> Edit:
    u, v = torch.ones(TINY.d_mlp), torch.ones(TINY.d_model)
    v[3] = math.nan
    return Edit.rank_one(
        1, u, v, Request(**REQS[0]), base_fingerprint="", model_name="tiny", shape=(TINY.d_mlp, TINY.d_model)
    )


def test_an_edit_with_a_nan_factor_is_neither_applied_nor_saved_and_its_file_is_refused(tiny, tmp_path, monkeypatch):
    edit = _nan_edit(tiny)
    W = tiny.blocks[1].mlp.W_out.detach().clone()
    with pytest.raises(ValueError, match="cannot apply this edit: its factor V of layer 1 is not finite"):
        edit.apply(tiny, verify=False)
    assert torch.equal(tiny.blocks[1].mlp.W_out, W)  # nothing written
    with pytest.raises(ValueError, match="cannot save this edit: its factor V of layer 1"):
        edit.save(tmp_path / "nan.edit")
    assert not (tmp_path / "nan.edit").exists()
    monkeypatch.setattr(Edit, "require_finite", lambda self, action="use": None)  # write one anyway
    path = edit.save(tmp_path / "nan.edit")
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"L1\.V.*not finite"):
        load_edit(path)


# ------------------------------------------------------------------ 2. an edit that does nothing is reported
def test_an_empty_null_space_warns_with_the_layer_and_a_larger_threshold(tiny, stats):
    ns = NullSpace.from_stats({0: stats[0]}, threshold=1e-12)
    assert ns.null_dim[0] == 0  # precondition: no eigenvalue of C below 1e-12·λ_max
    with pytest.warns(
        EditWarning,
        match=r"null space has dimension 0 at layer\(s\) \[0\].*the edit does nothing"
        r".*nullspace_threshold \(e.g. τ = 1e-11\)",
    ):
        edit = compute_edits(tiny, REQS[:2], layers=[0], stats=stats, hparams=FAST, preserve=ns, remember=False)
    assert float(edit.delta(0).abs().max()) == 0.0


def test_keep_equal_to_the_rewrite_prompt_is_refused():
    with pytest.raises(ValueError, match="keep holds the rewrite prompt itself"):
        Request("The capital of {} is", "France", " Rome", keep=["The language of {} is", "The capital of {} is"])


def test_conflicting_requests_are_refused_naming_both_indices_and_duplicates_warn(tiny):
    other = dict(REQS[1], target=" Madrid")
    with pytest.raises(ValueError, match=r"conflicting requests 1 and 3 in one batch.*' Berlin'.*' Madrid'"):
        validate_requests(tiny, [REQS[0], REQS[1], REQS[2], other])
    with pytest.warns(EditWarning, match="requests 0 and 2 are the same"):
        reqs, _ = validate_requests(tiny, [REQS[0], REQS[2], dict(REQS[0])])
    assert [r.target for r in reqs] == [" Rome", " German"]


def _p_target(model, req: Request) -> float:
    """P(single-token target | prompt), from the model's last logits (independent of the editors)."""
    (tid,) = model.tokenizer.encode_ids(req.target)
    with torch.no_grad():
        return float(model.last_logits([req.text]).float().softmax(-1)[0, tid])


def test_memit_records_how_far_each_target_moved_and_flags_weak_edits(tiny, stats):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EditWarning)
        edit = compute_edits(tiny, REQS, layers=[0, 1], stats=stats, hparams={**FAST, "mom2_weight": 1e-3})
    m, reqs = edit.metrics, edit.requests
    assert m["p_target_before"] == pytest.approx([_p_target(tiny, r) for r in reqs], rel=1e-4, abs=1e-7)
    with tiny.edited(edit):
        assert m["p_target_after"] == pytest.approx([_p_target(tiny, r) for r in reqs], rel=1e-3, abs=1e-6)
    want = [i for i, (b, a) in enumerate(zip(m["p_target_before"], m["p_target_after"])) if a < 0.5 and a - b < 0.1]
    assert m["weak"] == want


def _top1(model, text: str) -> str:
    with torch.no_grad():
        return model.tokenizer.token_str(int(model.last_logits([text]).argmax()))


def test_an_edit_that_did_not_take_is_reported_for_memit_and_rome(tiny, stats, tmp_path):
    """v_steps=0: δ stays 0, so no target can become the answer; the edit says so (metrics, ``failed``,
    ``succeeded``, an EditFailedWarning naming what the model says instead), also after a save and load."""
    with pytest.warns(EditFailedWarning, match="3 of 3 edits did not take"):
        edit = compute_edits(tiny, REQS, layers=[0], stats=stats, hparams={**FAST, "v_steps": 0})
    assert edit.metrics["weak"] == [0, 1, 2]
    with tiny.edited(edit):
        tops = [_top1(tiny, r.text) for r in edit.requests]
    assert all(t != r.target for t, r in zip(tops, edit.requests))  # independent: none is the top-1
    assert edit.metrics["top1_after"] == tops
    assert edit.failed == [0, 1, 2] and edit.succeeded is False
    assert load_edit(edit.save(tmp_path / "m.edit")).failed == [0, 1, 2]
    with pytest.warns(EditFailedWarning) as got:
        edit = compute_edit(tiny, REQS[0], layer=0, stats=stats[0], **{**FAST, "v_steps": 0})
    with tiny.edited(edit):
        top = _top1(tiny, REQS[0]["prompt"].format(REQS[0]["subject"]))
    msg = str(got[0].message)
    assert "request 0 ('Eiffel Tower is located in the city of' → ' Rome')" in msg and f"top-1 now {top!r}" in msg
    assert edit.metrics["weak"] is True and edit.metrics["took"] is False and edit.succeeded is False
    assert is_weak(0.01, 0.05) and not is_weak(0.01, 0.2) and not is_weak(0.45, 0.6)


def test_an_edit_took_when_the_target_is_the_greedy_continuation(facts_model):
    """The rule (EDIT_TOOK_RULE) against the model's own greedy generation, for one- and two-token targets."""
    tk = facts_model.tokenizer
    cases = [
        ("The capital of France is", " Paris"),
        ("The capital of France is", " Rome"),
        ("The capital of Japan is", " Tokyo"),
    ]
    greedy = [facts_model.generate(p, max_new_tokens=3, do_sample=False)[len(p) :] for p, _ in cases]
    two = (cases[0][0], greedy[0][: len(tk.decode(tk.encode_ids(greedy[0])[:2]))])  # its first two tokens
    wrong = (two[0], tk.decode(tk.encode_ids(greedy[0])[:1]) + " of")  # right first token, wrong second
    cases += [two, wrong]
    got = target_outcomes(facts_model, [p for p, _ in cases], [tk.encode_ids(t) for _, t in cases])
    want = [greedy[0].startswith(t) if p == cases[0][0] else greedy[2].startswith(t) for p, t in cases]
    assert [o.took for o in got] == want and want[0] and not want[1] and want[3] and not want[4]
    assert [o.top1 for o in got[:2]] == [_top1(facts_model, cases[0][0])] * 2


# ------------------------------------------------------------------ 3. objects checked where they meet
def test_targets_are_refused_for_another_model_other_requests_or_another_top_layer(tiny, stats, corpus, tmp_path):
    first = compute_edits(tiny, REQS, layers=[0, 1], stats=stats, hparams=FAST)
    again = compute_edits(tiny, REQS, layers=[1], stats=stats, hparams=FAST, targets=first)  # same batch: fine
    torch.testing.assert_close(again.v_star, first.v_star)
    other = HookedGPT2(TINY, seed=1).eval()
    other_stats = key_second_moment(
        other, [0, 1], corpus=str(corpus), n_samples=500, cache_dir=tmp_path, progress=False
    )
    with pytest.raises(ValueError, match=r"targets were computed on a model with weights \w+, this model has"):
        compute_edits(other, REQS, layers=[0, 1], stats=other_stats, hparams=FAST, targets=first.targets)
    with pytest.raises(
        ValueError,
        match="computed for other requests: request 0 is 'Eiffel Tower is located in the "
        "city of' → ' Rome' there and 'France is",
    ):
        compute_edits(
            tiny,
            [REQS[1] | {"prompt": "{} is"}, REQS[1], REQS[2]],
            layers=[0, 1],
            stats=stats,
            hparams=FAST,
            targets=first.targets,
        )
    with pytest.raises(ValueError, match="residuals after layer 1, this edit's top layer is 0"):
        compute_edits(tiny, REQS, layers=[0], stats=stats, hparams=FAST, targets=first.targets)
    with pytest.raises(TypeError, match=r"edit.targets"):
        compute_edits(tiny, REQS, layers=[0, 1], stats=stats, hparams=FAST, targets=first.v_star)
    sub = first.targets[[2, 0]]  # a subset keeps its requests
    assert [r.target for r in sub.requests] == [" German", " Rome"] and torch.equal(sub.z[1], first.v_star[0])


def test_key_statistics_handed_in_are_verified_on_every_path(tiny, stats, corpus, tmp_path):
    other = key_second_moment(
        HookedGPT2(TINY, seed=1), [0], corpus=str(corpus), n_samples=300, cache_dir=tmp_path, progress=False
    )
    with pytest.raises(ValueError, match="another model"):  # statistics to preserve, as a mapping
        compute_edits(tiny, REQS, layers=[0], stats=stats, hparams=FAST, preserve=other)
    with pytest.raises(ValueError, match="layer 1, not layer 0"):  # statistics of another layer
        compute_edits(tiny, REQS, layers=[0], stats=stats, hparams=FAST, preserve={0: stats[1]})
    bare = NullSpace.from_stats(KeyStats(stats[0].C, 10, {"layer": 0}))
    with pytest.raises(ValueError, match="no keys fingerprint"):
        compute_edits(tiny, REQS, layers=[0], stats=stats, hparams=FAST, preserve=bare)
    with pytest.raises(TypeError, match="stats must be the KeyStats of layer 0"):
        compute_edit(tiny, REQS[0], layer=0, stats=stats, **FAST)


# ------------------------------------------------------------------ 4. no loose coercion
def test_non_string_fields_are_refused_naming_the_field_and_the_request_index(tiny, stats):
    with pytest.raises(TypeError, match="request 1: request subject must be a string, got int 5"):
        compute_edits(tiny, [REQS[0], REQS[1] | {"subject": 5}], layers=[0], stats=stats, hparams=FAST)
    with pytest.raises(TypeError, match="request 0: request target must be a string, got int 7"):
        validate_requests(tiny, [{"prompt": "{} is", "subject": "Rome", "target_new": {"str": 7}}])
    with pytest.raises(TypeError, match="request 2: request prompt must be a string"):
        Request.of({"prompt": ["{} is"], "subject": "Rome", "target": " x"}, 2)


def test_keep_given_as_one_string_is_named_as_such(tiny):
    with pytest.raises(TypeError, match="keep must be a list of prompt templates, got a str"):
        Request.of({**REQS[1], "keep": "The language of {} is"})
    with pytest.raises(TypeError, match="request 4: request keep must be a list of prompt templates, got a str"):
        Request.of({**REQS[1], "keep": "The language of {} is"}, 4)


def test_prompts_without_a_placeholder_are_refused(tiny):
    with pytest.raises(ValueError, match=r"request 1: request prompt must contain '\{\}'.*did you mean"):
        validate_requests(tiny, [REQS[0], {"prompt": "France is", "subject": "France", "target": " x"}])
    with pytest.raises(ValueError, match=r"keep prompts must contain '\{\}'"):
        Request("{} is", "France", " x", keep=["The language is"])


def _first_token_probs(model, text: str, target: str) -> tuple[float, float]:
    """P(target's first token) and P(" " + target's first token) after ``text``, from the last logits."""
    tk = model.tokenizer
    with torch.no_grad():
        p = model.last_logits([text]).float().softmax(-1)[0]
    return float(p[tk.encode_ids(target)[0]]), float(p[tk.encode_ids(" " + target)[0]])


def test_a_target_the_model_expects_after_a_space_warns_before_any_work_with_both_spellings(facts_model, monkeypatch):
    tk = facts_model.tokenizer
    plain, spaced = tk.encode_ids("Paris")[0], tk.encode_ids(" Paris")[0]
    p_plain, p_spaced = _first_token_probs(facts_model, "The capital of France is", "Paris")
    assert plain != spaced and p_spaced > p_plain  # the rule's conditions hold
    req = {"prompt": "The capital of {} is", "subject": "France", "target": "Paris"}
    with pytest.warns(TargetSpacingWarning) as got:
        validate_request(facts_model, req, 3)
    msg = str(got[0].message)
    for needle in (
        "request 3",
        f"{tk.token_str(plain)!r} (id {plain}, P = {p_plain:.2g} after the prompt)",
        f"{tk.token_str(spaced)!r} (id {spaced}, P = {p_spaced:.2g})",
        "' Paris'",
    ):
        assert needle in msg, (needle, msg)

    def no_work_yet(*args, **kwargs):
        raise RuntimeError("no work yet")

    monkeypatch.setattr(rome, "key_second_moment", no_work_yet)  # the first work of an edit
    with pytest.warns(TargetSpacingWarning), pytest.raises(RuntimeError, match="no work yet"):
        compute_edit(facts_model, req)
    # no warning: a spaced target, a prompt ending in a space, a word the prompt really continues
    glued = {"prompt": "The capital of {} is Ber", "subject": "Germany", "target": "lin"}
    p_plain, p_spaced = _first_token_probs(facts_model, "The capital of Germany is Ber", "lin")
    assert tk.encode_ids("lin")[0] != tk.encode_ids(" lin")[0] and p_plain > p_spaced
    with warnings.catch_warnings():
        warnings.simplefilter("error", EditWarning)
        validate_request(facts_model, req | {"target": " Paris"})
        validate_request(facts_model, req | {"prompt": "The capital of {} is "})
        validate_request(facts_model, glued)


# ------------------------------------------------------------------ 5. the CLI
def _run(capsys, *argv: str) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize("value", ["-2", "0"])
def test_cli_refuses_a_batch_size_below_one_naming_the_flag(capsys, tmp_path, value):
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in REQS))
    for cmd in (
        ["edit", "--requests", str(path), "--sequential"],
        ["evaluate-edits", "--method", "memit", "--sequential"],
    ):
        code, err = _run(capsys, *cmd, "--batch-size", value)
        assert code not in (0, None) and "--batch-size" in err and value in err and "Traceback" not in err


def test_cli_refuses_an_empty_requests_file_naming_it(capsys, tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n  \n")
    code, err = _run(capsys, "edit", "--requests", str(path))
    assert code not in (0, None) and str(path) in err and "has no requests" in err
    path.write_text(json.dumps(REQS[0]) + "\n[1, 2]\n")
    code, err = _run(capsys, "edit", "--requests", str(path))
    assert code not in (0, None) and f"{path} line 2" in err and "not a request object" in err


def test_cli_edit_says_plainly_when_an_edit_did_not_take_and_exits_3_unless_allowed(
    tiny, tmp_path, monkeypatch, capsys
):
    """v_steps=0: no edit takes; the output says so per request, states the rule, and the exit status is 3
    (0 with --allow-failed)."""
    monkeypatch.setenv("GPT2_INTERP_STATS_DIR", str(tmp_path / "stats"))
    tiny.save(tmp_path / "tiny")
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(f"The Louvre is in Paris, room {i}." for i in range(60)))
    reqs = tmp_path / "r.jsonl"
    reqs.write_text("\n".join(json.dumps(r) for r in REQS) + "\n")
    common = [
        "--model",
        str(tmp_path / "tiny"),
        "--corpus",
        str(corpus),
        "--n-samples",
        "500",
        "--layer",
        "0",
        "--hparam",
        "v_steps=0",
        "--hparam",
        "prefixes_per_length=1",
        "--hparam",
        "prefix_lengths=[3]",
        "--quiet",
    ]
    for method in ("memit", "rome"):
        assert main(["edit", *common, "--requests", str(reqs), "--method", method]) == 3
        out, err = capsys.readouterr()
        assert "the edit took for 0/3" in out and "3 EDIT(S) DID NOT TAKE" in out and out.count("[did not take:") == 3
        assert "greedy continuation of the rewrite prompt is the target" in out
        assert "3 of 3 edit(s) did not take; exit status 3" in err
        assert "3 weak (P(target) after < 0.5 and up by < 0.1)" in out and out.count("[weak]") == 3
    single = ["--subject", "France", "--prompt", "The capital of {} is", "--target", " Berlin"]
    assert main(["edit", *common, *single]) == 3
    out, err = capsys.readouterr()
    assert "THE EDIT DID NOT TAKE: the edited model continues 'The capital of France is' with" in out
    assert "warning: 1 of 1 edits did not take" in err and "exit status 3" in err
    assert main(["edit", *common, *single, "--allow-failed"]) == 0
    assert main(["edit", *common, "--requests", str(reqs), "--allow-failed"]) == 0
