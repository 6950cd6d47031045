"""Our difference-of-means steering against the ``steering-vectors`` package on the same weights.

steering-vectors reads a Hugging Face model: the embedded gpt2-facts is converted to
``transformers.GPT2LMHeadModel`` (``model.to_transformers()``) and both packages read the same tokens
(our tokenizer, BOS prepended, as ``tokenizer(...)`` with ``add_bos_token``). Its ``decoder_block`` layer
``L`` output is our ``blocks.L.hook_resid_post``; its default ``read_token_index=-1`` is our
``position="last"``; its ``mean_aggregator`` is the mean of the pairs' differences.
"""

from __future__ import annotations

import pytest
import torch

from gpt2_interp.analysis.features import mean_difference

pytestmark = pytest.mark.slow  # converts gpt2-facts to transformers and runs both packages

sv = pytest.importorskip(
    "steering_vectors",
    reason="steering-vectors is not installed (pip install --no-deps steering-vectors: it pins transformers<5, "
    "but its code runs on transformers 5)",
)
pytest.importorskip("transformers")

LAYER = 3
PAIRS = [
    ("The Eiffel Tower is in the city of", "The Colosseum is in the city of"),
    ("France is a country in", "Japan is a country in"),
    ("The language of Paris is", "The language of Tokyo is"),
    ("Le Louvre", "The British Museum"),
]


@pytest.fixture(scope="module")
def hf_facts(facts_model):
    return facts_model.to_transformers().eval()


@pytest.fixture
def bos_tokenizer(facts_model):
    tok = facts_model.tokenizer
    before = tok.add_bos_token
    tok.add_bos_token = True
    yield tok
    tok.add_bos_token = before


def test_the_same_pairs_give_the_same_vector(facts_model, hf_facts, bos_tokenizer):
    theirs = sv.train_steering_vector(hf_facts, bos_tokenizer, PAIRS, layers=[LAYER], batch_size=1)
    ours = mean_difference(
        facts_model, [p for p, _ in PAIRS], [n for _, n in PAIRS], f"blocks.{LAYER}.hook_resid_post", "last"
    )
    torch.testing.assert_close(ours, theirs.layer_activations[LAYER].float(), rtol=0, atol=1e-5)


@torch.no_grad()
def test_applying_it_has_the_same_effect(facts_model, hf_facts, bos_tokenizer):
    theirs = sv.train_steering_vector(hf_facts, bos_tokenizer, PAIRS, layers=[LAYER], batch_size=1)
    vector = theirs.layer_activations[LAYER]
    for prompt in ["The capital of Italy is", "Berlin is the capital of"]:
        tokens = facts_model.to_tokens(prompt)
        for scale in (0.5, 2.0):
            with theirs.apply(hf_facts, multiplier=scale):
                hf_logits = hf_facts(tokens).logits
            with facts_model.steer(vector, at=f"blocks.{LAYER}.hook_resid_post", scale=scale):
                our_logits = facts_model(tokens)
            torch.testing.assert_close(our_logits, hf_logits, rtol=0, atol=1e-4)
            assert (our_logits - facts_model(tokens)).abs().max() > 0.1  # the steering did something
