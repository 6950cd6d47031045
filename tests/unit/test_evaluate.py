"""CounterFact-style evaluation: probabilities, scores, fluency, cases, the loop."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gpt2_interp.editing.edit import TargetResiduals, weights_fingerprint
from gpt2_interp.editing.evaluate import (
    CaseRow,
    CaseScores,
    EditEvaluation,
    counterfact_requests,
    evaluate_edits,
    greedy_continuations,
    keep_other_relations,
    known_cases,
    n_gram_entropy,
    summarize,
    target_logprobs,
)
from gpt2_interp.editing.stats import key_second_moment
from gpt2_interp.facts.base import FactBase
from gpt2_interp.facts.templates import templates


def test_target_logprobs_match_a_slow_loop(tiny):
    prompts = ["The Eiffel Tower is in", "Rome", "A much longer prompt about the city of"]
    targets = [" Paris", " is the capital of Italy", " Berlin, Germany"]
    got = target_logprobs(tiny, prompts, targets, batch_size=2)  # two batches, with padding
    for p, t, g in zip(prompts, targets, got):
        ids = tiny.to_tokens(t, prepend_bos=False)[0]
        tokens = torch.cat([tiny.to_tokens(p)[0], ids])
        with torch.no_grad():
            lp = tiny(tokens[None])[0].log_softmax(-1)
        ref = sum(lp[len(tokens) - len(ids) - 1 + j, ids[j]] for j in range(len(ids)))
        assert abs(float(ref) - float(g)) < 1e-4


def test_n_gram_entropy_by_hand():
    # "a b a b": 2-grams ab, ba, ab -> H = h(1/3); 3-grams aba, bab -> 1 bit
    h2 = -(2 / 3 * math.log2(2 / 3) + 1 / 3 * math.log2(1 / 3))
    assert n_gram_entropy("a b a b") == pytest.approx((2 / 3 * h2 + 4 / 3 * 1.0) / 2)
    assert n_gram_entropy(["x x x x x x", "a b a b"]) == pytest.approx((0.0 + (2 / 3 * h2 + 4 / 3) / 2) / 2)
    assert n_gram_entropy("one two three four five six") > n_gram_entropy("one two one two one two")


def test_summarize_scores_and_harmonic_mean():
    base = dict(relation="capital", subject="s", prompt="p", target_new=" a", target_true=" b", known=True)
    rows = [
        CaseRow(0, **base, post=CaseScores(es=1.0, ps=0.5, ns=1.0, em=0.4), ss_hits=2, ss_n=3),
        CaseRow(1, **base, post=CaseScores(es=1.0, ps=1.0, ns=None, em=0.2), ss_hits=1, ss_n=1),
    ]
    s = summarize(rows)
    assert s.post.es == 1.0 and s.post.ps == 0.75 and s.post.ns == 1.0 and s.post.em == pytest.approx(0.3)
    assert pytest.approx(3 / (1 / 1.0 + 1 / 0.75 + 1 / 1.0)) == s.post.S
    assert s.n_neighbourhood == 1 and s.n == 2
    assert rows[0].ss == pytest.approx(2 / 3) and rows[1].ss == 1.0
    assert s.ss == pytest.approx(3 / 4) and s.n_ss == 4  # pooled over facts: 3 of 4, not the mean of 2/3 and 1
    assert s.pre.es is None and s.pre.S is None and s.stn is None


def test_counterfact_requests_are_well_formed():
    fb = FactBase.load()
    cases = counterfact_requests(fb, n=24, seed=3)
    assert len(cases) == 24 and len({c.relation for c in cases}) == len(fb.relations)  # spread over relations
    truth = {(f.relation, f.subject): f.object for f in fb.facts()}
    for c in cases:
        assert c.request.prompt == templates(c.relation, "train")[0]
        assert c.target_true == " " + truth[c.relation, c.request.subject]
        assert c.request.target != c.target_true and c.request.target[1:] in fb.objects(c.relation)
        assert c.paraphrases == [t.format(c.request.subject) for t in templates(c.relation, "heldout")]
        for prompt in c.neighbourhood:  # other subjects whose true object is the same
            subj = next(
                f.subject for f in fb.facts(c.relation) if templates(c.relation, "train")[0].format(f.subject) == prompt
            )
            assert subj != c.request.subject and " " + truth[c.relation, subj] == c.target_true
    assert counterfact_requests(fb, n=24, seed=3)[5].request == cases[5].request  # deterministic


def test_known_cases_are_facts_the_model_completes_and_respect_exclusions(facts_model):
    """Each known case's greedy continuation of the rewrite prompt starts with the true object;
    an excluded (relation, subject) never comes back and the rest keep their order."""
    cases = known_cases(facts_model, 12, seed=3)
    assert len(cases) == 12
    for c in cases:
        out = facts_model.generate(c.request.text, max_new_tokens=1, do_sample=False, verbose=False)
        assert out[len(c.request.text) :].startswith(c.target_true[:2]), (c.request.text, out, c.target_true)
    first = cases[0]
    again = known_cases(facts_model, 12, seed=3, exclude={(first.relation, first.request.subject)})
    assert (first.relation, first.request.subject) not in {(c.relation, c.request.subject) for c in again}
    assert [c.request.text for c in again[:11]] == [c.request.text for c in cases[1:]]


def test_keep_other_relations_lists_the_subjects_other_relations_second_prompts():
    fb = FactBase.load()
    cases = counterfact_requests(fb, n=40, seed=5)
    kept = keep_other_relations(cases, fb=fb)
    for c, k in zip(cases, kept):
        assert c.request.keep == () and k.request.subject == c.request.subject and k.request.target == c.request.target
        others = {f.relation for f in fb.facts() if f.subject == c.request.subject} - {c.relation}
        assert sorted(k.request.keep) == sorted(templates(r, "train")[1] for r in others)
        assert templates(c.relation, "train")[1] not in k.request.keep or any(
            templates(r, "train")[1] == templates(c.relation, "train")[1] for r in others
        )
    assert sum(len(k.request.keep) for k in kept) > 20
    several = keep_other_relations(cases, template=(1, 3), fb=fb)  # several prompts of each other relation
    for c, k in zip(cases, several):
        others = {f.relation for f in fb.facts() if f.subject == c.request.subject} - {c.relation}
        assert sorted(k.request.keep) == sorted(templates(r, "train")[i] for r in others for i in (1, 3))
    with pytest.raises(ValueError, match="training prompts"):
        keep_other_relations(cases, template=(1, 99), fb=fb)


def test_related_prompts_are_the_subjects_other_facts_and_shared_last_token_subjects(facts_model):
    from gpt2_interp.analysis.tokens import subject_span
    from gpt2_interp.editing.evaluate import related_prompts

    fb = FactBase.load()
    cases = counterfact_requests(fb, n=24, seed=2)
    edited = {(c.relation, c.request.subject) for c in cases}
    truth = {(f.relation, f.subject): " " + f.object for f in fb.facts()}

    def last(text, subject):
        return facts_model.to_str_tokens(text)[subject_span(facts_model, text, subject)[1] - 1]

    rel = related_prompts(facts_model, cases, fb)
    n_subject = 0
    for c, ps in zip(cases, rel):
        others = {
            r
            for r in fb.relations
            if r != c.relation and (r, c.request.subject) in truth and (r, c.request.subject) not in edited
        }
        assert {p.relation for p in ps if p.kind == "subject"} == others
        n_subject += len(others)
        for p in ps:
            assert p.target_true == truth[p.relation, p.subject] and (p.relation, p.subject) not in edited
            assert p.prompt == templates(p.relation, "train")[0].format(p.subject)
            if p.kind == "shared":
                assert p.subject != c.request.subject
                assert last(p.prompt, p.subject) == last(c.request.text, c.request.subject)
    assert n_subject > 0 and any(p.kind == "shared" for ps in rel for p in ps)


def test_greedy_continuations_match_generate(tiny):
    prompts = ["The Eiffel Tower is", "Hello"]
    got = greedy_continuations(tiny, prompts, 6, suppress_eos=False)
    assert got == tiny.generate(prompts, max_new_tokens=6, stop_at_eos=False, do_sample=False)


@pytest.mark.slow
def test_evaluate_loop_on_tiny(tiny, tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("\n\n".join(f"The Eiffel Tower is in Paris, item {i}." for i in range(80)))
    stats = key_second_moment(tiny, 0, corpus=str(path), n_samples=800, cache_dir=tmp_path, progress=False)
    reqs = [
        {
            "prompt": "{} is located in the city of",
            "subject": "Eiffel Tower",
            "target": " Rome",
            "target_true": " Paris",
            "paraphrases": ["Eiffel Tower is in"],
            "neighbourhood": ["Louvre is located in the city of"],
        },
        {"prompt": "The capital of {} is", "subject": "France", "target": " Berlin", "target_true": " Paris"},
    ]
    fp = weights_fingerprint(tiny)
    kw = dict(
        layer=0,
        stats=stats,
        fluency_tokens=5,
        n_unrelated=8,
        progress=False,
        v_steps=3,
        prefix_lengths=(3,),
        prefixes_per_length=2,
    )
    ev = evaluate_edits(tiny, reqs, **kw)
    assert isinstance(ev, EditEvaluation) and ev.restored_exactly and weights_fingerprint(tiny) == fp
    assert len(ev.rows) == 2 and ev.rows[1].post.ps is None and ev.rows[0].post.ns is not None
    assert ev.summary["all"].n == 2 and ev.summary["all"].n_neighbourhood == 1
    for r in ev.rows:
        assert r.post.es in (0.0, 1.0) and r.kl_drift >= 0 and r.edit_seconds > 0
        # the row's magnitude is its own probabilities' difference
        assert r.post.em == pytest.approx(r.post.p_new - r.post.p_true)
    assert "ES" in ev.table()
    json.loads(ev.to_json())
    seq = evaluate_edits(tiny, reqs, sequential=True, checkpoints=(1,), **kw)
    assert [c.n_edits for c in seq.curve] == [1, 2] and weights_fingerprint(tiny) == fp
    assert [d.n_edits for d in seq.steps] == [1, 2] and all(d.kl_max >= d.kl_mean >= 0 for d in seq.steps)
    seq.save_plot(tmp_path / "seq.png")
    assert (tmp_path / "seq.png").stat().st_size > 0
    with pytest.raises(ValueError, match="method"):
        evaluate_edits(tiny, reqs, method="ft", **kw)
    with pytest.raises(ValueError, match="one request at a time"):
        evaluate_edits(tiny, reqs, method="rome", batch_size=2, **kw)


def test_memit_and_alphaedit_evaluation_loops_on_tiny(tiny, tmp_path):
    """Batched (one edit for both requests) and sequential (batches of 1) MEMIT/AlphaEdit runs: rows,
    the decay curve after every batch, the drift after every step, weights restored bit-exactly."""
    path = tmp_path / "c.txt"
    path.write_text("\n\n".join(f"The Eiffel Tower is in Paris, item {i}." for i in range(80)))
    stats = key_second_moment(tiny, [0], corpus=str(path), n_samples=800, cache_dir=tmp_path, progress=False)
    reqs = [
        {
            "prompt": "{} is located in the city of",
            "subject": "Eiffel Tower",
            "target": " Rome",
            "target_true": " Paris",
        },
        {"prompt": "The capital of {} is", "subject": "France", "target": " Berlin", "target_true": " Paris"},
    ]
    fp = weights_fingerprint(tiny)
    kw = dict(
        layer=[0],
        stats=stats,
        fluency_tokens=4,
        n_unrelated=6,
        progress=False,
        v_steps=2,
        prefix_lengths=(3,),
        prefixes_per_length=1,
    )
    batch = evaluate_edits(tiny, reqs, method="memit", **kw)
    assert batch.restored_exactly and weights_fingerprint(tiny) == fp and batch.curve is None
    assert len({r.edit_seconds for r in batch.rows}) == 1  # one edit for both
    assert all(r.post.es in (0.0, 1.0) for r in batch.rows) and "one batch" in batch.table()
    seq = evaluate_edits(tiny, reqs, method="alphaedit", sequential=True, batch_size=1, **kw)
    assert weights_fingerprint(tiny) == fp and [c.n_edits for c in seq.curve] == [1, 2]
    assert [d.step for d in seq.steps] == [1, 2] and "drift per step" in seq.table()
    json.loads(seq.to_json())
    # a time limit already passed: the first batch is made, then the run stops and is scored on it alone
    cut = evaluate_edits(tiny, reqs, method="memit", sequential=True, batch_size=1, time_limit=0.0, **kw)
    assert cut.summary["all"].n == 1 and len(cut.rows) == 1 and cut.rows[0].subject == "Eiffel Tower"
    assert [c.n_edits for c in cut.curve] == [1] and [d.n_edits for d in cut.steps] == [1]
    assert cut.rows[0].post is not None and weights_fingerprint(tiny) == fp
    with pytest.raises(ValueError, match="sequential"):
        evaluate_edits(tiny, reqs, method="memit", time_limit=1.0, **kw)


# ROME through the whole CounterFact loop (~3 min); the runner's quick rome_counterfact run scores it in CI's lane
@pytest.mark.full
@pytest.mark.slow
def test_rome_counterfact_on_the_fact_model(facts_model):
    ev = evaluate_edits(facts_model, counterfact_requests(n=8, seed=11), progress=False, fluency_tokens=10)
    s = ev.summary["all"]
    assert ev.restored_exactly
    assert s.pre.es < 0.2 and s.post.es >= 0.85  # the edits take …
    assert s.post.ns >= 0.7  # … and mostly stay put
    assert s.post.em > s.pre.em + 0.5


def test_choose_setting_maximises_es_plus_ps_within_the_ns_tolerance_else_the_best_s():
    from gpt2_interp.editing.evaluate import choose_setting

    rows = [
        {"name": "ridge", "es": 0.0, "ps": 0.0, "ns": 1.0},  # edits nothing, NS intact
        {"name": "a", "es": 0.9, "ps": 0.5, "ns": 0.92},  # ES + PS 1.4, NS 3 points down
        {"name": "b", "es": 1.0, "ps": 0.6, "ns": 0.80},  # ES + PS 1.6, NS 15 points down
        {"name": "c", "es": 0.8, "ps": 0.55, "ns": 0.95},
    ]  # ES + PS 1.35
    assert choose_setting(rows, unedited_ns=0.95)["name"] == "a"
    assert choose_setting(rows, unedited_ns=0.95, ns_tolerance=0.2)["name"] == "b"
    # only the ridge is within 5 points of 1.02, so it is chosen although it edits nothing
    assert choose_setting(rows, unedited_ns=1.02)["name"] == "ridge"
    # none within the tolerance: the best S = 3 / (1/ES + 1/PS + 1/NS)
    far = rows[1:]
    s = {r["name"]: 3 / (1 / r["es"] + 1 / r["ps"] + 1 / r["ns"]) for r in far}  # a 0.70, b 0.77, c 0.73
    assert max(s, key=s.get) == "b" and choose_setting(far, unedited_ns=1.2)["name"] == "b"
    # undefined NS is never within the tolerance; objects with attributes work as rows too
    from gpt2_interp.editing.evaluate import MeanScores

    objs = [MeanScores(es=1.0, ps=1.0, ns=None), MeanScores(es=0.5, ps=0.5, ns=0.9)]
    assert choose_setting(objs, unedited_ns=0.9) is objs[1]
    with pytest.raises(ValueError, match="rows"):
        choose_setting([], unedited_ns=0.9)
    with pytest.raises(ValueError, match="ns_tolerance"):
        choose_setting(rows, unedited_ns=0.9, ns_tolerance=5.0)


def test_eval_config_checks_each_field_by_name_and_maps_evaluate_edits_arguments(tiny):
    from gpt2_interp.editing.evaluation import EvalConfig

    for kw, field in (
        (dict(method="ft"), "method"),
        (dict(fluency_tokens=-1), "fluency_tokens"),
        (dict(n_unrelated=0), "n_unrelated"),
        (dict(score_batch_size=0), "score_batch_size"),
        (dict(method="memit", batch_size=0), "batch_size"),
        (dict(batch_size=2), "batch_size"),
        (dict(checkpoints=(1, 0)), "checkpoints"),
        (dict(time_limit=5.0), "time_limit"),
        (dict(sequential=True, time_limit=-1.0), "time_limit"),
        (dict(targets=torch.zeros(2, 4)), "targets"),
    ):
        with pytest.raises(ValueError, match=field):
            EvalConfig(**kw)
    with pytest.raises(TypeError, match="seed"):
        EvalConfig(seed="zero")
    with pytest.raises(ValueError, match="batch_size must be None"):
        EvalConfig(method="memit", batch_size=2, targets=TargetResiduals(torch.zeros(3, 4), 0, "", ())).check_cases(3)
    # positional settings in the old parameter order, named ones, and the rest as editor hyperparameters
    cfg = EvalConfig.of("memit", True, [0], None, 5, v_steps=3, batch_size=2, hparams={"mom2_weight": 10.0})
    assert (cfg.method, cfg.sequential, cfg.layer, cfg.fluency_tokens, cfg.batch_size) == ("memit", True, [0], 5, 2)
    assert cfg.hparams == {"v_steps": 3, "mom2_weight": 10.0} and cfg.n_unrelated == 30
    with pytest.raises(TypeError, match="both"):
        EvalConfig.of("memit", method="rome")
    with pytest.raises(TypeError, match="config"):
        evaluate_edits(tiny, [], config=cfg, batch_size=3)


class ShiftEditor:
    """A hand-made editor: a fixed random rank-one change of layer 1's W_out per edit (seeded by the
    edit's number), whatever the requests."""

    name = "shift"
    max_batch = None
    layer = 1

    def __init__(self):
        self.hparams = {"scale": 0.5}
        self.calls: list[list[str]] = []

    def edit(self, model, requests, n):
        from gpt2_interp.editing.edit import Edit

        g = torch.Generator().manual_seed(n)
        u, v = torch.randn(model.cfg.d_mlp, generator=g), torch.randn(model.cfg.d_model, generator=g)
        return Edit.rank_one(1, u / u.norm(), 0.5 * v, requests[0] if requests else None, weights_fingerprint(model))

    def compute(self, model, requests):
        self.calls.append([r.subject for r in requests])
        return self.edit(model, requests, len(self.calls))


def test_a_hand_made_editor_runs_through_the_one_loop(tiny):
    """Independent batches are scored each on the unedited model plus its own edit, sequential ones on
    the edits so far; weights come back bit-exactly; the report names the editor."""
    from gpt2_interp.editing.evaluation import (
        Editor,
        EvalConfig,
        as_cases,
        case_scores,
        kl_rows,
        next_logprobs,
        run_evaluation,
        unrelated_prompts,
    )

    reqs = [
        {"prompt": "{} is located in", "subject": s, "target": " Rome", "target_true": " Paris"}
        for s in ("Eiffel Tower", "Louvre", "Notre Dame")
    ]
    fp = weights_fingerprint(tiny)
    cfg = dict(method="memit", batch_size=2, fluency_tokens=2, n_unrelated=4, related=False, progress=False)
    editor = ShiftEditor()
    assert isinstance(editor, Editor)
    ev = run_evaluation(tiny, reqs, EvalConfig(**cfg), editor=editor)
    assert editor.calls == [["Eiffel Tower", "Louvre"], ["Notre Dame"]] and weights_fingerprint(tiny) == fp
    assert ev.method == "shift" and ev.layer == 1 and ev.hparams == {"scale": 0.5} and ev.batch_size == 2
    assert [r.layer for r in ev.rows] == [1, 1, 1] and ev.restored_exactly and ev.curve is None
    cases = as_cases(reqs)
    for n, idx in ((1, [0, 1]), (2, [2])):  # the reference: each batch's edit alone on the unedited model
        with tiny.edited(editor.edit(tiny, [cases[i].request for i in idx], n)):
            ref = case_scores(tiny, [cases[i] for i in idx])
        assert [ev.rows[i].post for i in idx] == ref
    seq = run_evaluation(tiny, reqs, EvalConfig(sequential=True, **cfg), editor=ShiftEditor())
    assert [c.n_edits for c in seq.curve] == [2, 3] and [d.n_edits for d in seq.steps] == [2, 3]
    texts = [p for *_, p in unrelated_prompts(4)]
    pre = next_logprobs(tiny, texts)
    with tiny.edited(editor.edit(tiny, [], 1)), tiny.edited(editor.edit(tiny, [], 2)):
        both = kl_rows(pre, next_logprobs(tiny, texts))
        ref = case_scores(tiny, cases)
    assert seq.steps[-1].kl_mean == pytest.approx(float(both.mean())) and seq.curve[-1].kl_max == pytest.approx(
        float(both.max())
    )
    assert [r.post for r in seq.rows] == ref and weights_fingerprint(tiny) == fp


def test_rome_editor_refuses_several_layers(tiny):
    from gpt2_interp.editing.evaluation import RomeEditor

    with pytest.raises(TypeError, match="ROME edits one layer"):
        RomeEditor.prepare(tiny, layer=[0, 1])
