"""Bad input at the Python API's public entry points: each class of mistake (wrong types, blank
strings, integer-likes, non-positive counts) is answered with an error that names the argument —
never a raw error from deep inside, never a silent coercion."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpt2_interp.analysis.lens import logit_attribution, logit_lens
from gpt2_interp.analysis.metrics import logit_diff
from gpt2_interp.analysis.patching import patch
from gpt2_interp.analysis.tokens import subject_span, target_ids
from gpt2_interp.analysis.tracing import causal_trace
from gpt2_interp.analysis.vocab import find_neurons, neuron_vocab, top_subupdates
from gpt2_interp.editing import Request
from gpt2_interp.editing.rome import compute_edit
from gpt2_interp.editing.settings import RomeHparams

PROMPT, SUBJECT = "The Eiffel Tower is located in", "Eiffel Tower"


# ------------------------------------------------------------------ integer-likes are accepted …
@pytest.mark.parametrize("layer", [np.int64(1), torch.tensor(1), -1])
def test_integer_like_layers_are_accepted(tiny, layer):
    assert tiny.check_layer(layer) == 1
    ref = neuron_vocab(tiny, 1, neurons=[0, 1], k=3)
    got = neuron_vocab(tiny, layer, neurons=[0, 1], k=3)
    assert got.top_tokens == ref.top_tokens


# ------------------------------------------------------------------ … the rest are refused by name
@pytest.mark.parametrize(
    "layer, error",
    [("1", TypeError), (1.0, TypeError), (True, TypeError), (None, TypeError), (2, IndexError), (-3, IndexError)],
)
def test_bad_layers_name_the_argument(tiny, layer, error):
    with pytest.raises(error, match=r"layer"):
        neuron_vocab(tiny, layer, k=3)
    with pytest.raises(error, match=r"layer"):
        tiny.check_layer(layer)


def test_string_layer_to_forward_is_named(tiny):
    with pytest.raises(TypeError, match=r"stop_at_layer must be an int.*'1'"):
        tiny("Hello", stop_at_layer="1")


@pytest.mark.parametrize("k", [0, -1])
def test_non_positive_counts_are_refused(tiny, k):
    with pytest.raises(ValueError, match=r"\bk\b.*≥ 1|k must be"):
        logit_lens(tiny, PROMPT, k=k)
    with pytest.raises(ValueError, match=r"\bk\b.*≥ 1|k must be"):
        find_neurons(tiny, " Paris", k=k)
    with pytest.raises(ValueError, match=r"samples"):
        causal_trace(tiny, PROMPT, SUBJECT, samples=k)


# ------------------------------------------------------------------ strings: prompts, subjects, targets
@pytest.mark.parametrize("subject", [None, 3, ["Eiffel Tower"]])
def test_non_string_subjects_are_refused_not_converted(tiny, subject):
    with pytest.raises(TypeError, match="subject must be a string"):
        subject_span(tiny, PROMPT, subject)
    with pytest.raises(TypeError, match="subject"):
        causal_trace(tiny, PROMPT, subject)
    with pytest.raises(TypeError, match="subject"):
        Request("{} is located in", subject, " Rome")


@pytest.mark.parametrize("subject", ["", "   ", "\t"])
def test_blank_subjects_are_refused(tiny, subject):
    with pytest.raises(ValueError, match=r"subject.*(empty|blank)"):
        subject_span(tiny, "The  Eiffel Tower is  located in", subject)
    with pytest.raises(ValueError, match=r"subject.*(empty|blank)"):
        causal_trace(tiny, "The  Eiffel Tower is  located in", subject)


@pytest.mark.parametrize("prompt", [None, 42, b"bytes"])
def test_non_string_prompts_are_refused(tiny, prompt):
    with pytest.raises(TypeError, match=r"prompt|text"):
        logit_attribution(tiny, prompt, " Paris")
    with pytest.raises(TypeError, match=r"prompt|text"):
        causal_trace(tiny, prompt, SUBJECT)
    with pytest.raises(TypeError, match=r"text|string"):
        tiny.to_tokens([PROMPT, prompt])


def test_targets_name_themselves(tiny):
    with pytest.raises(TypeError, match="target must be a string"):
        target_ids(tiny, 3.5)
    with pytest.raises(ValueError, match=r"target.*empty"):
        target_ids(tiny, "  ")
    with pytest.raises(TypeError, match=r"string.*int id|single token"):
        tiny.to_single_token(None)
    with pytest.raises(ValueError, match="not one"):
        logit_lens(tiny, PROMPT, targets=" Parisian")


def test_metrics_and_positions(tiny):
    with pytest.raises(TypeError, match="metric must be a callable"):
        patch(tiny, "The capital of France is", "The capital of Italy is", "logit_diff")
    with pytest.raises(TypeError, match="token"):
        logit_diff(3.5, " Rome")
    with pytest.raises(TypeError, match="position must be an int"):
        top_subupdates(tiny, PROMPT, position="last")
    with pytest.raises(IndexError, match="position 99 is out of range"):
        top_subupdates(tiny, PROMPT, position=99)


def test_rome_hparams_are_checked_by_name(tiny):
    with pytest.raises((TypeError, ValueError), match="lr"):
        RomeHparams.of(lr="fast")
    with pytest.raises((TypeError, ValueError), match=r"unknown|no hyper|not a"):
        RomeHparams.of(learning_rate=1.0)
    with pytest.raises(TypeError, match=r"request|Request|dict"):
        compute_edit(tiny, "France → Rome", layer=0)
