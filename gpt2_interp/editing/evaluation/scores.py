"""What an evaluation measures: target probabilities, CounterFact's scores, fluency, drift, and
their per-case rows and summaries.

* **Efficacy** on the rewrite prompt: score = [P(new) > P(true)], magnitude = P(new) − P(true);
* **Paraphrase** on held-out paraphrases: the same, averaged over the paraphrases;
* **Neighbourhood** on prompts about other subjects whose true object is ``target_true``:
  score = [P(true) > P(new)], magnitude = P(true) − P(new);
* **S**: the harmonic mean of the three scores;
* **fluency**: ROME's n-gram entropy of greedy continuations;
* **KL drift**: KL(unedited ‖ edited) of the next-token distribution on unrelated prompts.

P of a multi-token target is the product of its token probabilities (sum of log-probs), batched.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ...analysis.known import knows
from ...analysis.tokens import target_ids
from ...core.boundary import boundary
from .cases import CounterfactCase, RelatedPrompt

if TYPE_CHECKING:
    from ...model import HookedGPT2


# ---------------------------------------------------------------- probabilities and scores
@boundary
@torch.no_grad()
def target_logprobs(
    model: HookedGPT2, prompts: Sequence[str], targets: Sequence[str], batch_size: int = 64
) -> torch.Tensor:
    """``[n]``: log P(target | BOS + prompt), summed over the target's tokens, batched (``batch_size``
    rows per forward pass, default 64); ``prompts`` and ``targets``: one target per prompt. Lists of
    different lengths, an empty target or a row longer than the context raise ValueError."""
    if len(prompts) != len(targets):
        raise ValueError(f"{len(prompts)} prompts but {len(targets)} targets")
    out = torch.empty(len(prompts))
    for s in range(0, len(prompts), batch_size):
        ps, ts = prompts[s : s + batch_size], targets[s : s + batch_size]
        ids = [target_ids(model, t) for t in ts]
        rows = [model.to_tokens(p)[0].tolist() + i for p, i in zip(ps, ids)]
        model.check_length(max(map(len, rows)))
        width, tmax = max(map(len, rows)), max(map(len, ids))
        tokens, mask = model.pad(rows)
        want = torch.zeros((len(rows), tmax), dtype=torch.long)
        keep = torch.zeros((len(rows), tmax))
        for j, i in enumerate(ids):
            want[j, tmax - len(i) :] = torch.tensor(i)
            keep[j, tmax - len(i) :] = 1
        resid = model(tokens, attention_mask=mask, stop_at_layer=model.cfg.n_layer)
        lp = model.unembed(model.ln_final(resid[:, width - tmax - 1 : width - 1])).float().log_softmax(-1).cpu()
        out[s : s + len(rows)] = (lp.gather(-1, want[..., None])[..., 0] * keep).sum(-1)
    return out


def _case_pairs(case: CounterfactCase) -> list[tuple[str, str, str]]:
    """(part, prompt, target) rows: every prompt with the new and the true target."""
    if not case.target_true:
        return [("rewrite", case.request.text, case.request.target)]
    rows = []
    for part, prompts in (
        ("rewrite", [case.request.text]),
        ("paraphrase", case.paraphrases),
        ("neighbourhood", case.neighbourhood),
    ):
        for p in prompts:
            rows += [(part, p, case.request.target), (part, p, case.target_true)]
    return rows


SCORES = ("es", "em", "ps", "pm", "ns", "nm")


@boundary
@dataclass
class Scores:
    """CounterFact's efficacy / paraphrase / neighbourhood scores (``es``/``ps``/``ns``) and
    magnitudes (``em``/``pm``/``nm``); None where there are no such prompts."""

    es: float | None = None
    em: float | None = None
    ps: float | None = None
    pm: float | None = None
    ns: float | None = None
    nm: float | None = None


@boundary
@dataclass
class GenerationScores:
    """One case's (or, averaged, many cases') scores from greedy continuations (:mod:`.generation`): ``es``,
    ``ps``, ``ns`` as rates in [0, 1]; ``hop`` / ``hop_true``: the two-hop questions whose continuation
    states the answer through the new / the true object; ``hop_tf``: those where P(answer through new) >
    P(answer through true). None where the case has no such prompt."""

    es: float | None = None
    ps: float | None = None
    ns: float | None = None
    hop: float | None = None
    hop_true: float | None = None
    hop_tf: float | None = None

    @classmethod
    def over(cls, scores: Sequence[GenerationScores | None]) -> GenerationScores:
        """The mean of each score over ``scores`` (None entries and undefined scores skipped)."""
        got = [s for s in scores if s is not None]
        out = cls()
        for k in vars(out):
            xs = [getattr(s, k) for s in got if getattr(s, k) is not None]
            setattr(out, k, sum(xs) / len(xs) if xs else None)
        return out


@boundary
@dataclass
class CaseScores(Scores):
    """One case's :class:`Scores` on the model as it is, and ``p_new`` = P(new) / ``p_true`` = P(true) on
    its rewrite prompt (``p_true`` None for a case without a true target)."""

    p_new: float | None = None
    p_true: float | None = None


def _compare(new: Sequence[float], true: Sequence[float], sign: int) -> tuple[float, float]:
    """(score, magnitude) over prompts from log P(new), log P(true): the share of prompts where new
    beats true (``sign`` 1; true beats new for -1) and the mean of sign·(P(new) − P(true))."""
    wins = sum((a > b) if sign > 0 else (b > a) for a, b in zip(new, true))
    return wins / len(new), sum(sign * (math.exp(a) - math.exp(b)) for a, b in zip(new, true)) / len(new)


def _scores_of(case: CounterfactCase, by_part: Mapping[str, list[float]]) -> CaseScores:
    """A case's scores from its log-probs per part (new, true alternating, as :func:`_case_pairs`)."""
    row = CaseScores(p_new=math.exp(by_part["rewrite"][0]))
    if not case.target_true:
        return row
    row.p_true = math.exp(by_part["rewrite"][1])
    for part, key, sign in (("rewrite", "e", 1), ("paraphrase", "p", 1), ("neighbourhood", "n", -1)):
        vals = by_part.get(part, [])
        if vals:
            score, magnitude = _compare(vals[0::2], vals[1::2], sign)
            setattr(row, f"{key}s", score)
            setattr(row, f"{key}m", magnitude)
    return row


@boundary
def case_scores(model: HookedGPT2, cases: Sequence[CounterfactCase], batch_size: int = 64) -> list[CaseScores]:
    """Efficacy/paraphrase/neighbourhood scores and magnitudes of each case on the model as it is."""
    pairs = [(i, *row) for i, c in enumerate(cases) for row in _case_pairs(c)]
    lp = target_logprobs(model, [p for _, _, p, _ in pairs], [t for *_, t in pairs], batch_size)
    per: list[dict[str, list[float]]] = [{} for _ in cases]
    for (i, part, _, _), x in zip(pairs, lp.tolist()):
        per[i].setdefault(part, []).append(x)
    return [_scores_of(c, d) for c, d in zip(cases, per)]


# ---------------------------------------------------------------- fluency and drift
def _ngram_entropy(text: str, ns: Sequence[int] = (2, 3), weights: Sequence[float] = (2 / 3, 4 / 3)) -> float:
    words = re.findall(r"\w+|[^\w\s]", text.lower())
    ents = []
    for n in ns:
        grams = Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))
        total = sum(grams.values())
        ents.append(-sum(c / total * math.log2(c / total) for c in grams.values()) if total else 0.0)
    return sum(w * e for w, e in zip(weights, ents)) / len(ents)


@boundary
def n_gram_entropy(
    texts: str | Sequence[str], ns: Sequence[int] = (2, 3), weights: Sequence[float] = (2 / 3, 4 / 3)
) -> float:
    """ROME's fluency measure: per text the weighted mean of its 2- and 3-gram entropies (bits,
    word n-grams), averaged over texts. Repetitive text scores low. ``ns``: the n-gram sizes
    (default 2 and 3), ``weights`` their weights (default 2/3 and 4/3, ROME's); 0 for no texts."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    return sum(_ngram_entropy(t, ns, weights) for t in texts) / max(len(texts), 1)


@boundary
def greedy_continuations(
    model: HookedGPT2, prompts: Sequence[str], n_tokens: int = 40, suppress_eos: bool = True
) -> list[str]:
    """Prompt + greedy continuation of each of ``prompts`` (``model.generate``: batched, KV cache), up to
    ``n_tokens`` new tokens (default 40, fewer where the context ends). With ``suppress_eos``
    (default True) the model cannot end the text (the fact model would stop after one sentence)."""
    longest = model.tokenize(list(prompts))[0].shape[1]
    return model.generate(
        list(prompts),
        max_new_tokens=min(n_tokens, model.cfg.n_ctx - longest),
        stop_at_eos=False,
        suppress_eos=suppress_eos,
        do_sample=False,
    )


@boundary
def fluency_prompts(case: CounterfactCase) -> list[str]:
    """The prompts whose continuations measure a case's fluency: the rewrite prompt and the first
    two paraphrases."""
    return [case.request.text, *case.paraphrases[:2]]


@boundary
def fluency(
    model: HookedGPT2, cases: Sequence[CounterfactCase], n_tokens: int = 40, batch_size: int = 64
) -> list[float]:
    """Per case of ``cases``: :func:`n_gram_entropy` of the greedy continuations (``n_tokens`` new
    tokens, default 40) of its :func:`fluency_prompts` (all prompts batched together, ``batch_size``
    at a time)."""
    groups = [fluency_prompts(c) for c in cases]
    flat = [p for g in groups for p in g]
    texts = [
        t
        for s in range(0, len(flat), batch_size)
        for t in greedy_continuations(model, flat[s : s + batch_size], n_tokens)
    ]
    out, i = [], 0
    for g in groups:
        out.append(n_gram_entropy(texts[i : i + len(g)]))
        i += len(g)
    return out


@boundary
@torch.no_grad()
def next_logprobs(model: HookedGPT2, prompts: Sequence[str]) -> torch.Tensor:
    """``[n, d_vocab]``: log-probabilities of the next token after each prompt (float32)."""
    return model.last_logits(list(prompts)).float().log_softmax(-1)


@boundary
def kl_rows(pre: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
    """``[n]``: KL(pre ‖ post) per row of next-token log-probabilities ``[n, d_vocab]``."""
    return (pre.exp() * (pre - post)).sum(-1)


@boundary
def related_hits(
    model: HookedGPT2, related: Sequence[list[RelatedPrompt]], batch_size: int = 64
) -> list[dict[str, tuple[int, int]]]:
    """Per case: ``{"ss": (hits, n), "stn": (hits, n)}`` — of its related facts of kind "subject"
    (subject specificity) and "shared" (shared-token neighbours), how many the model knows
    (:func:`~gpt2_interp.analysis.known.knows`) and how many there are."""
    flat = [p for ps in related for p in ps]
    hits = iter(knows(model, [p.prompt for p in flat], [p.target_true for p in flat], batch_size))
    out = []
    for ps in related:
        got = [(p.kind, next(hits)) for p in ps]
        out.append(
            {
                key: (sum(h for k, h in got if k == kind), sum(k == kind for k, _ in got))
                for key, kind in (("ss", "subject"), ("stn", "shared"))
            }
        )
    return out


# ---------------------------------------------------------------- rows and summaries
def _mean(xs: Sequence[Any]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


@boundary
def harmonic_score(*scores: float | None) -> float | None:
    """CounterFact's S: the harmonic mean of the defined scores (ES, PS, NS); 0 if any is 0,
    None if none is defined."""
    parts = [x for x in scores if x is not None]
    if not parts:
        return None
    return len(parts) / sum(1 / x for x in parts) if min(parts) > 0 else 0.0


@boundary
def choose_setting(rows: Sequence[Any], unedited_ns: float, ns_tolerance: float = 0.05) -> Any:
    """The tuning choice among settings scored on the same requests: each row (a mapping or an
    object) has ``es``, ``ps``, ``ns`` (fractions; None where undefined).

    The row with the largest ES + PS among those whose NS stays within ``ns_tolerance`` of the
    unedited model's ``unedited_ns`` (0.05 = 5 points); when none does, the row with the best
    CounterFact S (:func:`harmonic_score` of ES, PS, NS) — the best NS alone would pick a setting
    that edits nothing (a huge ridge keeps NS at 100 % with ES 0). Ties keep the earlier row.
    No ``rows``, or ``ns_tolerance`` outside [0, 1], raises ValueError."""
    rows = list(rows)
    if not rows:
        raise ValueError("rows: give at least one scored setting")
    if not 0 <= ns_tolerance <= 1:
        raise ValueError(f"ns_tolerance is a fraction of the scores' 0..1 range (0.05 = 5 points), got {ns_tolerance}")

    def get(r: Any, k: str) -> float | None:
        return r.get(k) if isinstance(r, Mapping) else getattr(r, k, None)

    ok = [r for r in rows if (ns := get(r, "ns")) is not None and ns >= unedited_ns - ns_tolerance]
    if ok:
        return max(ok, key=lambda r: (get(r, "es") or 0) + (get(r, "ps") or 0))
    return max(rows, key=lambda r: harmonic_score(get(r, "es"), get(r, "ps"), get(r, "ns")) or 0)


@boundary
@dataclass
class CaseRow:
    """One evaluated case: what was asked, whether the unedited model knew it, its scores before and
    after the edit, the other facts it kept (subject specificity ``ss`` over ``ss_n`` facts of the
    edited subject's other relations; shared-token neighbours ``stn`` over ``stn_n`` facts of subjects
    ending in the same token), fluency, drift on unrelated prompts, and the edit's time and layer(s).

    ``case_id``, ``relation``, ``subject``, ``prompt`` (the rewrite prompt), ``target_new`` and
    ``target_true``: the case; ``known``: whether the unedited model knew the fact; ``pre``/``post``:
    its :class:`CaseScores` before and after (``post`` None until edited); ``fluency_pre`` and
    ``fluency_post``: :func:`n_gram_entropy` of its continuations; ``ss_hits``/``stn_hits``: related
    facts still known after the edit; ``kl_drift``: mean KL(unedited ‖ edited) on unrelated prompts;
    ``edit_seconds``: the time to compute the edit; ``gen_pre``/``gen_post``: its
    :class:`GenerationScores` before and after (None unless the evaluation scores generations)."""

    case_id: int
    relation: str
    subject: str
    prompt: str
    target_new: str
    target_true: str
    known: bool
    pre: CaseScores = field(default_factory=CaseScores)
    post: CaseScores | None = None
    fluency_pre: float | None = None
    fluency_post: float | None = None
    ss_hits: int = 0
    ss_n: int = 0
    stn_hits: int = 0
    stn_n: int = 0
    kl_drift: float | None = None
    edit_seconds: float | None = None
    layer: int | list[int] | None = None
    gen_pre: GenerationScores | None = None
    gen_post: GenerationScores | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CaseRow:
        """A row back from its JSON form (``to_dict()`` / a saved report's ``rows``)."""
        d = dict(d)
        for stage in ("pre", "post"):
            if d.get(stage) is not None:
                d[stage] = CaseScores(**d[stage])
            if d.get(f"gen_{stage}") is not None:
                d[f"gen_{stage}"] = GenerationScores(**d[f"gen_{stage}"])
        return cls(**d)

    @property
    def ss(self) -> float | None:
        """Subject specificity: the share of the edited subject's other facts still known (None without any)."""
        return self.ss_hits / self.ss_n if self.ss_n else None

    @property
    def stn(self) -> float | None:
        """The share of shared-token neighbours' facts still known (None without any)."""
        return self.stn_hits / self.stn_n if self.stn_n else None


@boundary
@dataclass
class MeanScores(Scores):
    """Means of :class:`Scores` over cases (those without a score skipped) and CounterFact's ``S``
    (their harmonic mean)."""

    S: float | None = None

    @classmethod
    def over(cls, scores: Sequence[Scores | None]) -> MeanScores:
        """The mean of each score over ``scores`` (None entries and undefined scores skipped) and S."""
        got = [s for s in scores if s is not None]
        out = cls(**{k: _mean([getattr(s, k) for s in got]) for k in SCORES})
        out.S = harmonic_score(out.es, out.ps, out.ns)
        return out


@boundary
@dataclass
class Summary:
    """A set of :class:`CaseRow` summarised: mean scores before and after the edits; subject
    specificity ``ss`` and shared-token neighbours ``stn`` pooled over the related facts (``n_ss``,
    ``n_stn`` of them; after the edits — before, they are 1 by construction); mean fluency, drift and
    edit time.

    ``n``: rows summarised; ``pre``/``post``: :class:`MeanScores` before and after; ``n_neighbourhood``:
    rows with a neighbourhood score after the edit; ``fluency_pre``/``fluency_post``, ``kl_drift``,
    ``edit_seconds`` (mean) and ``edit_seconds_median``: means over the rows that have them;
    ``gen_pre``/``gen_post``: the mean :class:`GenerationScores` (None unless scored); ``n_hop``: rows
    with two-hop questions."""

    n: int
    pre: MeanScores
    post: MeanScores
    n_neighbourhood: int = 0
    ss: float | None = None
    n_ss: int = 0
    stn: float | None = None
    n_stn: int = 0
    fluency_pre: float | None = None
    fluency_post: float | None = None
    kl_drift: float | None = None
    edit_seconds: float | None = None
    edit_seconds_median: float | None = None
    gen_pre: GenerationScores | None = None
    gen_post: GenerationScores | None = None
    n_hop: int = 0


def _share(hits: int, n: int) -> float | None:
    return hits / n if n else None


def _generated_mean(scores: Sequence[GenerationScores | None]) -> GenerationScores | None:
    """The mean generation-based scores of the rows scored by generation; None when none was."""
    got = [g for g in scores if g is not None]
    return GenerationScores.over(got) if got else None


@boundary
def summarize(rows: Sequence[CaseRow]) -> Summary:
    """Means of every score over ``rows`` (cases without a score are skipped) + S, before and after;
    subject specificity and shared-token neighbours pooled over the related facts."""
    n_ss, n_stn = sum(r.ss_n for r in rows), sum(r.stn_n for r in rows)
    times = [r.edit_seconds for r in rows if r.edit_seconds is not None]
    return Summary(
        len(rows),
        MeanScores.over([r.pre for r in rows]),
        MeanScores.over([r.post for r in rows]),
        n_neighbourhood=sum(r.post is not None and r.post.ns is not None for r in rows),
        ss=_share(sum(r.ss_hits for r in rows), n_ss),
        n_ss=n_ss,
        stn=_share(sum(r.stn_hits for r in rows), n_stn),
        n_stn=n_stn,
        fluency_pre=_mean([r.fluency_pre for r in rows]),
        fluency_post=_mean([r.fluency_post for r in rows]),
        kl_drift=_mean([r.kl_drift for r in rows]),
        edit_seconds=_mean(times),
        edit_seconds_median=statistics.median(times) if times else None,
        gen_pre=_generated_mean([r.gen_pre for r in rows]),
        gen_post=_generated_mean([r.gen_post for r in rows]),
        n_hop=sum(r.gen_pre is not None and r.gen_pre.hop_tf is not None for r in rows),
    )


@boundary
@dataclass
class CurvePoint(MeanScores):
    """Scores of the edits made so far, after ``n_edits`` of them (sequential editing), their subject
    specificity ``ss`` and shared-token neighbours ``stn``, and the drift on unrelated prompts:
    ``kl_drift`` the mean KL(unedited ‖ edited) over those prompts, ``kl_max`` the largest."""

    n_edits: int = 0
    ss: float | None = None
    stn: float | None = None
    kl_drift: float = 0.0  # mean KL(unedited ‖ edited) on unrelated prompts
    kl_max: float = 0.0  # max over those prompts


@boundary
@dataclass
class StepDrift:
    """KL(unedited ‖ edited) of the next-token distribution on fixed unrelated prompts after one
    editing step (one ROME edit or one MEMIT batch), mean (``kl_mean``) and max (``kl_max``) over the
    prompts; ``step``: the step's number, ``n_edits``: edits made so far, ``seconds``: the step's time."""

    step: int
    n_edits: int
    kl_mean: float
    kl_max: float
    seconds: float = 0.0
