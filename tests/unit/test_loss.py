"""The model's loss of a padded batch: each row's own next-token cross-entropy, whichever side is padded."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

TEXTS = ["The capital of France is Paris", "Hi there"]


@torch.no_grad()
@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_loss_counts_only_each_rows_own_predictions(tiny, side):
    alone = []  # reference: each text alone, no padding, cross-entropy by hand
    for text in TEXTS:
        tokens, _ = tiny.tokenize(text)
        logits = tiny(tokens)
        alone.append(F.cross_entropy(logits[0, :-1].float(), tokens[0, 1:], reduction="none"))
    tokens, mask = tiny.tokenize(TEXTS, padding_side=side)
    assert mask is not None and not bool(mask.all())  # the short row is padded
    per_token = tiny(tokens, return_type="loss", attention_mask=mask, loss_per_token=True)
    for row, ref in enumerate(alone):
        kept = per_token[row][per_token[row] != 0]
        torch.testing.assert_close(kept, ref, atol=1e-5, rtol=1e-5)
    mean = tiny(tokens, return_type="loss", attention_mask=mask)
    torch.testing.assert_close(mean, torch.cat(alone).mean(), atol=1e-5, rtol=1e-5)
