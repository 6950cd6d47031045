"""Circuit tasks: token layouts written out by hand, equal lengths per pair, and metrics equal to
logit differences and probability sums computed here from a tiny model's own logits."""

from __future__ import annotations

import re

import pytest
import torch

from gpt2_interp.analysis.circuits.tasks import (
    fact_recall,
    greater_than,
    ioi,
    make_task,
    performance,
    year_tokens,
)
from gpt2_interp.io.tokenizer import GPT2Tokenizer
from gpt2_interp.model import HookedGPT2
from tests.conftest import TINY


class DigitSplitting(GPT2Tokenizer):
    """GPT-2's BPE, except that every digit is its own token (as SmolLM2's tokenizer writes numbers)."""

    def encode_ids(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in re.split(r"(\d)", text):
            if piece:
                ids += super().encode_ids(piece)
        return ids


def _last(model: HookedGPT2, prompt: str) -> torch.Tensor:
    """``[d_vocab]``: the next-token logits after BOS + ``prompt``, run alone (no padding)."""
    with torch.no_grad():
        return model(prompt)[0, -1].float()


def test_ioi_tokens_follow_the_template_with_the_names_in_their_slots(tiny):
    task = ioi(tiny, n=6, seed=3, templates=[6])  # "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided …"
    assert task.aligned and task.clean_tokens.shape == task.corrupted_tokens.shape == (6, 18)
    for i, p in enumerate(task.pairs):
        first, second = (p["io"], p["s"]) if p["order"] == "ABBA" else (p["s"], p["io"])
        obj, place = p["object"], p["place"]
        expected = ["<|endoftext|>", "When", f" {first}", " and", f" {second}", " got", " a", f" {obj}", " at"]
        expected += [" the", f" {place}", ",", f" {p['s']}", " decided", " to", " give", " it", " to"]
        assert tiny.to_str_tokens(task.clean_tokens[i]) == expected
        c1, c2, c3 = p["abc"]
        assert len({p["io"], p["s"], c1, c2, c3}) == 5  # ABC: three other names, no repeat
        abc = [f" {c1}", f" {c2}"] if p["order"] == "ABBA" else [f" {c2}", f" {c1}"]
        assert tiny.to_str_tokens(task.corrupted_tokens[i]) == [
            *expected[:2],
            abc[0],
            " and",
            abc[1],
            *expected[5:12],
            f" {c3}",
            *expected[13:],
        ]
        assert task.answers[i] == tiny.to_single_token(f" {p['io']}")
        assert task.wrongs[i] == tiny.to_single_token(f" {p['s']}")
    assert {p["order"] for p in task.pairs} == {"ABBA", "BABA"}


def test_ioi_metric_and_accuracy_are_the_logit_difference_of_each_prompt_run_alone(tiny):
    task = ioi(tiny, n=8, seed=0)  # every template: left-padded to one width
    assert not task.aligned and task.attention_mask is not None
    perf = performance(tiny, task, batch_size=3)
    for run, prompts, values in (
        ("clean", task.clean, perf.clean_pair_metric),
        ("corrupted", task.corrupted, perf.corrupted_pair_metric),
    ):
        ref = []
        for prompt, p in zip(prompts, task.pairs):
            logits = _last(tiny, prompt)
            ref.append(logits[tiny.to_single_token(f" {p['io']}")] - logits[tiny.to_single_token(f" {p['s']}")])
        torch.testing.assert_close(values, torch.stack(ref), atol=1e-4, rtol=1e-4, msg=run)
    assert perf.accuracy == pytest.approx(float((perf.clean_pair_metric > 0).float().mean()))
    assert perf.clean_metric == pytest.approx(float(perf.clean_pair_metric.mean()), abs=1e-6)
    assert perf.n_pairs == 8 and perf.task == "ioi" and perf.model == "tiny"


def test_ioi_pairs_differ_only_in_the_three_name_slots(tiny):
    task = ioi(tiny, n=20, seed=1)
    for i in range(len(task)):
        real = task.attention_mask[i].bool()
        assert int((task.clean_tokens[i][real] != task.corrupted_tokens[i][real]).sum()) == 3


def test_greater_than_tokens_and_probability_difference_by_hand(tiny):
    task = greater_than(tiny, n=5, seed=2)
    assert task.aligned
    ids = {f"{y:02d}": tiny.to_single_token(f"{y:02d}") for y in range(100)}
    perf = performance(tiny, task)
    for i, p in enumerate(task.pairs):
        yy = f"{p['yy']:02d}"
        expected = ["<|endoftext|>", "The", f" {p['noun']}", " lasted", " from", " the", " year", " 17", yy, " to"]
        expected += [" the", " year", " 17"]
        assert tiny.to_str_tokens(task.clean_tokens[i]) == expected
        assert tiny.to_str_tokens(task.corrupted_tokens[i]) == [*expected[:8], "01", *expected[9:]]
        assert task.answers[i] == ids[yy] and task.wrongs[i] == ids["01"]
        probs = _last(tiny, task.clean[i]).softmax(-1)
        later = sum(float(probs[ids[f"{y:02d}"]]) for y in range(p["yy"] + 1, 100))
        earlier = sum(float(probs[ids[f"{y:02d}"]]) for y in range(p["yy"] + 1))
        assert float(perf.clean_pair_metric[i]) == pytest.approx(later - earlier, abs=1e-6)
        best = max(range(100), key=lambda y: float(probs[ids[f"{y:02d}"]]))
        assert bool(perf.correct[i]) == (best > p["yy"])


def test_greater_than_refuses_a_tokenizer_that_splits_digits():
    model = HookedGPT2(TINY, seed=0, tokenizer=DigitSplitting()).eval()
    with pytest.raises(ValueError, match=r"' 1732' -> \[' ', '1', '7', '3', '2'\]\): the task does not fit"):
        year_tokens(model)
    with pytest.raises(ValueError, match="greater_than needs a token for ' 17'"):
        greater_than(model, n=3)
    assert len(ioi(model, n=3)) == 3  # names are words: IOI still fits


def test_fact_recall_answers_are_the_objects_first_tokens_and_the_metric_their_logit_difference(tiny):
    task = fact_recall(tiny, n=6, seed=0, relations=["country_capital"])
    perf = performance(tiny, task)
    for i, p in enumerate(task.pairs):
        assert task.clean[i] == f"The capital of {p['subject']} is"
        assert task.corrupted[i] == f"The capital of {p['other'][0]} is"
        assert len(tiny.to_str_tokens(task.clean[i])) == len(tiny.to_str_tokens(task.corrupted[i]))
        a = tiny.tokenizer.encode_ids(" " + p["object"])[0]
        w = tiny.tokenizer.encode_ids(" " + p["other"][1])[0]
        assert (int(task.answers[i]), int(task.wrongs[i])) == (a, w) and a != w
        logits = _last(tiny, task.clean[i])
        assert float(perf.clean_pair_metric[i]) == pytest.approx(float(logits[a] - logits[w]), abs=1e-4)


def test_subset_keeps_each_pairs_metric_and_drops_unneeded_padding(tiny):
    task = ioi(tiny, n=10, seed=0)
    logits = torch.randn(10, tiny.cfg.d_vocab)
    keep = [7, 2, 4]
    sub = task.subset(keep)
    torch.testing.assert_close(sub.metric(logits[keep]), task.metric(logits)[keep])
    assert sub.clean == [task.clean[i] for i in keep]
    width = max(len(tiny.to_str_tokens(c)) for c in sub.clean)
    assert sub.clean_tokens.shape == (3, width)
    gt = greater_than(tiny, n=6, seed=0)
    six = logits[:6]
    torch.testing.assert_close(gt.subset([5, 1]).metric(six[[5, 1]]), gt.metric(six)[[5, 1]])


def test_bad_task_arguments_are_refused_with_clear_errors(tiny, facts_model):
    with pytest.raises(ValueError, match="unknown task 'iol'; tasks: ioi, greater_than, fact_recall"):
        make_task("iol", tiny)
    with pytest.raises(ValueError, match="n must be ≥ 1"):
        ioi(tiny, n=0)
    with pytest.raises(IndexError, match="template 15 is out of range"):
        ioi(tiny, n=2, templates=[15])
    with pytest.raises(ValueError, match="relations must be among"):
        fact_recall(tiny, n=2, relations=["country_flag"])
    with pytest.raises(ValueError, match="tokenized for tiny, not gpt2-facts"):
        performance(facts_model, ioi(tiny, n=2))
