"""CounterFact-style evaluation of fact edits (the metrics of ROME's summarize code, written fresh).

For each case — a request to rewrite ``subject``'s object from ``target_true`` to ``target``:

* **Efficacy** on the rewrite prompt: score = [P(new) > P(true)], magnitude = P(new) − P(true);
* **Paraphrase** on held-out paraphrases: the same, averaged over the paraphrases;
* **Neighbourhood** on prompts about other subjects whose true object is ``target_true``:
  score = [P(true) > P(new)], magnitude = P(true) − P(new) (the edit must not leak to them);
* **S**: the harmonic mean of the three scores;
* **fluency**: n-gram entropy of greedy continuations of the case's prompts (ROME's
  ``n_gram_entropy``: 2/3·H(2-grams) and 4/3·H(3-grams), averaged), before and after;
* **KL drift**: mean KL(unedited ‖ edited) of the next-token distribution on a fixed set of
  prompts about other relations (specificity beyond the neighbourhood).

Beyond CounterFact (facts from the embedded fact base only):

* **subject specificity** (SS): the edited subject's facts of the *other* relations keep their
  answer, over those the unedited model knows;
* **shared-token neighbours** (STN): facts of subjects whose last token equals the edited
  subject's (the position the edit writes to) keep their answer;
* **drift per step** (sequential): mean and max KL on the unrelated prompts after every edit or batch;
* **by generation** (``generation_tokens`` > 0, :mod:`.generation`): whether the greedy continuation of
  each prompt states the new object (neighbours: still the true one), and two-hop questions through the
  edited facts, answered by generation and by teacher forcing.

A fact is known, and keeps its answer, by one rule (:func:`gpt2_interp.analysis.known.knows`): the
model's top-1 next token is the object's first token, and that token holds more than whitespace.
P of a multi-token target is the product of its token probabilities (sum of log-probs), batched.
Scores are reported over all cases and over the cases whose fact the unedited model knows on the
rewrite prompt.

The parts: :mod:`.cases` (what is edited and the prompts that test it), :mod:`.scores` (scores,
rows, summaries), :mod:`.editors` (ROME, MEMIT, AlphaEdit behind one :class:`Editor` interface),
:mod:`.config` (:class:`EvalConfig`), :mod:`.loop` (the one loop) and :mod:`.result`
(:class:`EditEvaluation`).

>>> ev = evaluate_edits(model, counterfact_requests(n=20), method="memit", batch_size=10)
>>> ev = run_evaluation(model, 20, EvalConfig(method="alphaedit", sequential=True, batch_size=5))
"""

from .cases import (
    CounterfactCase,
    RelatedPrompt,
    as_cases,
    counterfact_requests,
    keep_other_relations,
    known_cases,
    known_flags,
    known_related,
    related_prompts,
    unrelated_prompts,
)
from .config import DEFAULT_CHECKPOINTS, EDIT_METHODS, EvalConfig
from .editors import AlphaEditEditor, Editor, MemitEditor, RomeEditor, make_editor
from .generation import GENERATION_TOKENS, TwoHopQuestion, continuations, generation_scores, states, two_hop_questions
from .loop import Baseline, baseline, evaluate_edits, evaluate_edits_local, evaluate_local, run_evaluation
from .result import EditEvaluation
from .scores import (
    SCORES,
    CaseRow,
    CaseScores,
    CurvePoint,
    GenerationScores,
    MeanScores,
    Scores,
    StepDrift,
    Summary,
    case_scores,
    choose_setting,
    fluency,
    fluency_prompts,
    greedy_continuations,
    harmonic_score,
    kl_rows,
    n_gram_entropy,
    next_logprobs,
    related_hits,
    summarize,
    target_logprobs,
)

__all__ = [
    "DEFAULT_CHECKPOINTS",
    "EDIT_METHODS",
    "GENERATION_TOKENS",
    "SCORES",
    "AlphaEditEditor",
    "Baseline",
    "CaseRow",
    "CaseScores",
    "CounterfactCase",
    "CurvePoint",
    "EditEvaluation",
    "Editor",
    "EvalConfig",
    "GenerationScores",
    "MeanScores",
    "MemitEditor",
    "RelatedPrompt",
    "RomeEditor",
    "Scores",
    "StepDrift",
    "Summary",
    "TwoHopQuestion",
    "as_cases",
    "baseline",
    "case_scores",
    "choose_setting",
    "continuations",
    "counterfact_requests",
    "evaluate_edits",
    "evaluate_edits_local",
    "evaluate_local",
    "fluency",
    "fluency_prompts",
    "generation_scores",
    "greedy_continuations",
    "harmonic_score",
    "keep_other_relations",
    "kl_rows",
    "known_cases",
    "known_flags",
    "known_related",
    "make_editor",
    "n_gram_entropy",
    "next_logprobs",
    "related_hits",
    "related_prompts",
    "run_evaluation",
    "states",
    "summarize",
    "target_logprobs",
    "two_hop_questions",
    "unrelated_prompts",
]
