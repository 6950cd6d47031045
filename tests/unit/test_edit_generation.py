"""Generation-based edit scores and two-hop questions through an edit, against hand-made cases and a slow
greedy loop of the model's own forward pass."""

from __future__ import annotations

import pytest
import torch

from gpt2_interp.editing.edit import Request, weights_fingerprint
from gpt2_interp.editing.evaluation import (
    CounterfactCase,
    EditEvaluation,
    EvalConfig,
    GenerationScores,
    TwoHopQuestion,
    counterfact_requests,
    generation_scores,
    run_evaluation,
    states,
    two_hop_questions,
)
from gpt2_interp.facts.base import Fact, FactBase


def test_states_reads_the_first_line_for_the_object_as_a_whole_word():
    assert states(" Paris, the city of light", " Paris")
    assert not states(" Parisian streets", " Paris")  # not a whole word
    assert not states(" paris", " Paris")  # case-sensitive
    assert states(" Rome, not Paris", " Rome", " Paris") and not states(" Rome, not Paris", " Paris", " Rome")
    assert states(" Paris or Rome", " Paris", " Rome")
    assert not states(" the city.\nParis", " Paris")  # after the first line
    assert not states(" anything", "")
    assert states(" New York City", " New York") and not states(" New Yorker", " New York")


def _facts() -> FactBase:
    return FactBase(
        [
            Fact("city_country", "Aalborg", "Denmark"),
            Fact("city_country", "Turin", "Italy"),
            Fact("city_country", "Luxembourg", "Luxembourg"),
            Fact("country_capital", "Denmark", "Copenhagen"),
            Fact("country_capital", "Italy", "Rome"),
            Fact("country_capital", "Luxembourg", "Luxembourg"),
            Fact("country_continent", "Denmark", "Europe"),
            Fact("country_continent", "Italy", "Europe"),
            Fact("country_currency", "Denmark", "Danish krone"),
        ]
    )


def _case(subject: str, true: str, new: str, relation: str = "city_country") -> CounterfactCase:
    return CounterfactCase(
        0, Request("{} is a city in the country of", subject, " " + new), " " + true, [], [], relation
    )


def test_two_hop_questions_follow_the_edit_through_the_fact_base():
    cases = [
        _case("Aalborg", "Denmark", "Italy"),  # capital differs: a question; continent equal, currency missing: none
        _case("Turin", "Italy", "Luxembourg"),  # the new capital is the subject's own name? no: Luxembourg ≠ Turin
        _case("Luxembourg", "Luxembourg", "Denmark"),  # the subject names its country and capital: none
        _case("Denmark", "Copenhagen", "Rome", "country_capital"),  # a relation no chain starts from: none
    ]
    got = two_hop_questions(cases, _facts())
    assert got[0] == [
        TwoHopQuestion(
            "The capital of the country that contains Aalborg is",
            " Rome",
            " Copenhagen",
            ("city_country", "country_capital"),
        )
    ]
    assert [q.answer_new for q in got[1]] == [" Luxembourg"] and [q.answer_true for q in got[1]] == [" Rome"]
    assert got[2] == [] and got[3] == []


def _slow_greedy(model, prompt: str, n_tokens: int) -> str:
    """Greedy decoding one prompt at a time, each step a full forward pass of the whole row."""
    tokens = model.to_tokens(prompt)[0].tolist()
    new: list[int] = []
    eos = model.tokenizer.eos_id
    with torch.no_grad():
        for _ in range(n_tokens):
            resid = model(torch.tensor([tokens + new]), stop_at_layer=model.cfg.n_layer)[:, -1]
            nxt = int(model.unembed(model.ln_final(resid))[0].argmax())  # the last position's logits only
            if nxt == eos:
                break
            new.append(nxt)
    return model.to_string(new)


def _slow_logprob(model, prompt: str, target: str) -> float:
    ids = model.to_tokens(target, prepend_bos=False)[0].tolist()
    row = model.to_tokens(prompt)[0].tolist() + ids
    with torch.no_grad():
        lp = model(torch.tensor([row]))[0].log_softmax(-1)
    return float(sum(lp[len(row) - len(ids) - 1 + j, t] for j, t in enumerate(ids)))


def test_generation_scores_equal_a_slow_greedy_loop(facts_model):
    """Batched, padded generation scored per part equals one-prompt-at-a-time greedy decoding scored by
    hand; the fact model states its own facts on the neighbourhood prompts, and not the new objects."""
    fb = FactBase.load()
    cases = [c for c in counterfact_requests(fb, n=40, seed=3, n_neighbours=2) if c.relation == "city_country"][:1]
    cases += counterfact_requests(fb, n=1, seed=5, n_neighbours=2)
    for c in cases:
        c.paraphrases = c.paraphrases[:2]
    hops = two_hop_questions(cases, fb)
    assert len(hops[0]) >= 2 and hops[1] == []
    got = generation_scores(facts_model, cases, hops, n_tokens=5, batch_size=3)
    for c, q, g in zip(cases, hops, got):

        def rate(rows):
            hits = [states(_slow_greedy(facts_model, p, 5), obj, other) for p, obj, other in rows]
            return sum(hits) / len(hits) if hits else None

        new, true = c.request.target, c.target_true
        tf = [
            _slow_logprob(facts_model, x.prompt, x.answer_new) > _slow_logprob(facts_model, x.prompt, x.answer_true)
            for x in q
        ]
        ref = GenerationScores(
            rate([(c.request.text, new, true)]),
            rate([(p, new, true) for p in c.paraphrases]),
            rate([(p, true, new) for p in c.neighbourhood]),
            rate([(x.prompt, x.answer_new, x.answer_true) for x in q]),
            rate([(x.prompt, x.answer_true, x.answer_new) for x in q]),
            sum(tf) / len(tf) if tf else None,
        )
        assert g == ref
    mean = GenerationScores.over(got)
    assert mean.es == 0.0 and mean.ns is not None and mean.ns >= 0.5


class ShiftEditor:
    """A fixed random rank-one change of the last layer's W_out, whatever the requests."""

    name = "shift"
    max_batch = None

    def __init__(self, model):
        self.layer = model.cfg.n_layer - 1
        self.hparams: dict = {}

    def compute(self, model, requests):
        from gpt2_interp.editing.edit import Edit

        g = torch.Generator().manual_seed(0)
        u, v = torch.randn(model.cfg.d_mlp, generator=g), torch.randn(model.cfg.d_model, generator=g)
        return Edit.rank_one(self.layer, u / u.norm(), 8 * v, requests[0], weights_fingerprint(model))


def test_an_evaluation_scores_generations_before_and_after_the_edit(facts_model):
    fb = FactBase.load()
    cases = [c for c in counterfact_requests(fb, n=40, seed=3, n_neighbours=2) if c.relation == "city_country"][:2]
    for c in cases:
        c.paraphrases = c.paraphrases[:1]
    cfg = EvalConfig(
        method="memit", fluency_tokens=0, n_unrelated=2, related=False, progress=False, generation_tokens=5
    )
    editor = ShiftEditor(facts_model)
    fp = weights_fingerprint(facts_model)
    ev = run_evaluation(facts_model, cases, cfg, editor=editor)
    assert weights_fingerprint(facts_model) == fp
    hops = two_hop_questions(cases)
    assert [r.gen_pre for r in ev.rows] == generation_scores(facts_model, cases, hops, 5)
    with facts_model.edited(editor.compute(facts_model, [c.request for c in cases])):
        assert [r.gen_post for r in ev.rows] == generation_scores(facts_model, cases, hops, 5)
    s = ev.summary["all"]
    assert s.gen_post == GenerationScores.over([r.gen_post for r in ev.rows]) and s.n_hop == sum(map(bool, hops))
    back = EditEvaluation.from_dict(ev.to_dict())
    for a, b in zip(back.rows, ev.rows):  # the saved form keeps 6 significant digits
        assert vars(a.gen_pre) == pytest.approx(vars(b.gen_pre)) and vars(a.gen_post) == pytest.approx(vars(b.gen_post))
    assert vars(back.summary["all"].gen_post) == pytest.approx(vars(s.gen_post)) and back.table() == ev.table()
    assert "by greedy generation" in ev.table()
    plain = run_evaluation(facts_model, cases, EvalConfig(**{**vars(cfg), "generation_tokens": 0}), editor=editor)
    assert plain.rows[0].gen_pre is None and plain.summary["all"].gen_post is None


def test_generation_settings_are_refused_when_malformed(facts_model):
    with pytest.raises(ValueError, match="generation_tokens"):
        EvalConfig(generation_tokens=-1)
    with pytest.raises(ValueError, match="two-hop"):
        generation_scores(facts_model, [_case("Aalborg", "Denmark", "Italy")], [[], []])
