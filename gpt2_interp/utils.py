"""TransformerLens's ``utils`` names that TL code reaches for: ``from gpt2_interp import utils``.

``utils.get_act_name("k", 6)`` is ``"blocks.6.attn.hook_k"``; ``utils.Slice`` is what
``run_with_cache(pos_slice=)`` and the cache's ``pos_slice=`` accept (an int, slice, tuple or list work too);
``utils.to_numpy`` and ``utils.test_prompt`` behave as TransformerLens's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .model.hooks import get_act_name, hook_name

__all__ = ["Slice", "get_act_name", "hook_name", "test_prompt", "to_numpy"]


class Slice:
    """A position selection: an int (drops the dimension), a ``(start, stop[, step])`` tuple,
    a ``slice``, a list/array of indices, or None (everything)."""

    def __init__(self, input_slice: Any = None) -> None:
        if isinstance(input_slice, tuple):
            input_slice = slice(*input_slice)
        elif input_slice is None:
            input_slice = slice(None)
        elif isinstance(input_slice, (list, np.ndarray)):
            input_slice = torch.as_tensor(input_slice)
        elif not isinstance(input_slice, (int, slice, torch.Tensor)):
            raise ValueError(
                f"Slice takes an int, tuple, slice, list, array, tensor or None; got {type(input_slice).__name__}"
            )
        self.slice = input_slice

    def apply(self, tensor: torch.Tensor, dim: int = 0) -> torch.Tensor:
        index: list[Any] = [slice(None)] * tensor.ndim
        index[dim] = self.slice
        return tensor[tuple(index)]


def to_numpy(t: Any) -> np.ndarray:
    """A tensor (any device, any grad state; bfloat16 as float32), numpy array, list, tuple, number or
    string as a numpy array (anything else raises a ValueError, as TransformerLens's)."""
    if isinstance(t, np.ndarray):
        return t
    if isinstance(t, (list, tuple)):
        return np.array(t)
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy()
    if isinstance(t, (int, float, bool, str)):
        return np.array(t)
    raise ValueError(f"Input to to_numpy has invalid type: {type(t)}")


def test_prompt(
    prompt: str,
    answer: str | list[str],
    model: Any,
    prepend_space_to_answer: bool = True,
    print_details: bool = True,
    prepend_bos: bool | None = None,
    top_k: int = 10,
) -> None:
    """Print how ``model`` ranks ``answer`` after ``prompt`` (rank, logit, probability of each answer
    token, and the ``top_k`` tokens), as TransformerLens's ``utils.test_prompt``: a multi-token answer
    is scored token by token; a list of answers compares their first tokens. Prints, returns None."""
    answers = [answer] if isinstance(answer, str) else list(answer)
    several = len(answers) > 1
    if prepend_space_to_answer:
        answers = [a if a.startswith(" ") else " " + a for a in answers]
    bos = True if prepend_bos is None else prepend_bos
    prompt_tokens = model.to_tokens(prompt, prepend_bos=bos)
    answer_tokens = model.to_tokens(answers, prepend_bos=False, padding_side="right")
    if several:
        answer_tokens = answer_tokens[:, :1]
    tokens = torch.cat((prompt_tokens.repeat(answer_tokens.shape[0], 1), answer_tokens), dim=1)
    prompt_str = model.to_str_tokens(prompt, prepend_bos=bos)
    answer_strs = [model.to_str_tokens(a, prepend_bos=False) for a in answers]
    n_prompt, n_answer = len(prompt_str), 1 if several else len(answer_strs[0])
    if print_details:
        print("Tokenized prompt:", prompt_str)
        print("Tokenized answers:" if several else "Tokenized answer:", answer_strs if several else answer_strs[0])
    with torch.no_grad():
        logits = model(tokens)  # [n_answers, pos, d_vocab]
    probs = logits.softmax(dim=-1)
    ranks = []
    for index in range(n_prompt, n_prompt + n_answer):
        wanted = tokens[:, index]
        strs = [a[index - n_prompt] for a in answer_strs]
        token_probs = probs[:, index - 1]
        sorted_probs, order = token_probs.sort(descending=True)
        answer_ranks = order.argsort(-1)[range(len(answers)), wanted.cpu()].tolist()
        ranks.append(list(zip(strs, answer_ranks)))
        if print_details:
            print(f"Performance on answer token{'s' if several else ''}:")
            for i in range(len(answers)):
                print(
                    f"Rank: {answer_ranks[i]: <8} Logit: {logits[i, index - 1, wanted[i]].item():5.2f} "
                    f"Prob: {token_probs[i, wanted[i]].item():6.2%} Token: |{strs[i]}|"
                )
            for i in range(top_k):
                print(
                    f"Top {i}th token. Logit: {logits[0, index - 1, order[0, i]].item():5.2f} "
                    f"Prob: {sorted_probs[0, i].item():6.2%} Token: |{model.to_string(order[0, i])}|"
                )
    print("Ranks of the answer tokens:", ranks if several else [r[0] for r in ranks])


test_prompt.__test__ = False  # type: ignore[attr-defined]  # a helper, not a pytest test
