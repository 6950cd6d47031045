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
  answer (top-1 next token = the true object's first token), over those the unedited model knows;
* **shared-token neighbours** (STN): facts of subjects whose last token equals the edited
  subject's (the position the edit writes to) keep their answer;
* **drift per step** (sequential): mean and max KL on the unrelated prompts after every edit or batch.

P of a multi-token target is the product of its token probabilities (sum of log-probs), batched.
Scores are reported over all cases and over the cases whose fact the unedited model knows
(its top-1 next token on the rewrite prompt is the first token of ``target_true``).
"""

from __future__ import annotations

import inspect
import math
import random
import re
import statistics
import time
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..core import distributed
from ..core.result import Result
from ..analysis.known import knows
from ..analysis.tokens import target_ids
from ..core.progress import progress_bar
from ..model.fingerprint import tensor_digest, weights_fingerprint
from .edit import Edit, Request, undo_all
from .memit import MemitHparams, NullSpace, choose_layers, compute_edits, default_layers
from .rome import compute_edit, default_layer, hparams_for
from .stats import KeyStats, key_second_moment

if TYPE_CHECKING:
    from ..facts.base import FactBase
    from ..model import HookedGPT2


# ---------------------------------------------------------------- cases
@dataclass
class CounterfactCase:
    """One counterfactual request with the prompts that test it (prompts are filled-in text)."""

    case_id: int
    request: Request
    target_true: str
    paraphrases: list[str] = field(default_factory=list)
    neighbourhood: list[str] = field(default_factory=list)
    relation: str = ""

    @classmethod
    def of(cls, x: Any, case_id: int = 0) -> "CounterfactCase":
        """From a case, or a Request/dict (dict keys ``target_true``, ``paraphrases`` or ROME's
        ``paraphrase_prompts``, ``neighbourhood`` or ``neighborhood_prompts`` are optional)."""
        if isinstance(x, CounterfactCase):
            return x
        req = Request.of(x)
        d = x if isinstance(x, Mapping) else {}
        true = d.get("target_true")
        if isinstance(true, Mapping):
            true = " " + str(true.get("str", "")).lstrip()
        return cls(int(d.get("case_id", case_id)), req, str(true) if true else "",
                   list(d.get("paraphrases", d.get("paraphrase_prompts", []))),
                   list(d.get("neighbourhood", d.get("neighborhood_prompts", []))), str(d.get("relation", "")))


def counterfact_requests(fb: "FactBase | None" = None, n: int = 200, seed: int = 0,
                         n_neighbours: int = 10) -> list[CounterfactCase]:
    """``n`` counterfactual cases from the fact base, spread evenly over the relations.

    Each rewrites a fact's object to another object of the same relation
    (``FactBase.counterfactual``); the rewrite prompt is the relation's first training template,
    the paraphrases its held-out templates, the neighbourhood up to ``n_neighbours`` prompts about
    other subjects with the same true object (none exist for one-to-one relations such as
    element symbols: those cases have no neighbourhood score)."""
    from ..facts.base import FactBase
    from ..facts.templates import templates

    fb = fb or FactBase.load()
    rng = random.Random(seed)
    pools = {r: rng.sample(fb.facts(r), len(fb.facts(r))) for r in fb.relations}
    if n > len(fb):
        raise ValueError(f"asked for {n} cases but the fact base has {len(fb)} facts")
    picked = []
    while len(picked) < n:  # round-robin over relations
        for r in fb.relations:
            if pools[r] and len(picked) < n:
                picked.append(pools[r].pop())
    cases = []
    for i, fact in enumerate(picked):
        new = fb.counterfactual(fact, rng)
        cases.append(CounterfactCase(
            i, Request(templates(fact.relation, "train")[0], fact.subject, new.target), fact.target,
            fb.prompts(fact, "heldout"), fb.neighbourhood(fact, n_neighbours, rng), fact.relation))
    return cases


def keep_other_relations(cases: Sequence[CounterfactCase], template: int | Sequence[int] = 1,
                         fb: "FactBase | None" = None) -> list[CounterfactCase]:
    """Copies of ``cases`` whose requests keep the subject's other facts (:attr:`Request.keep`): the
    fact base's ``template``-th training prompt (or each of several: ``template=(1, 2, 3)``) of every
    other relation the subject has. Subject specificity is scored on the 0th
    (:func:`related_prompts`), so with the default the scored prompts are not the ones optimised."""
    from dataclasses import replace

    from ..facts.base import FactBase
    from ..facts.templates import templates

    idx = [template] if isinstance(template, int) else list(template)
    if not idx:
        raise ValueError("template: give at least one training-prompt index")
    fb = fb or FactBase.load()
    rels: dict[str, list[str]] = {}
    for f in fb.facts():
        rels.setdefault(f.subject, []).append(f.relation)
    out = []
    for c in cases:
        others = [r for r in rels.get(c.request.subject, []) if r != c.relation]
        for r in others:
            if max(idx) >= len(templates(r, "train")) or min(idx) < -len(templates(r, "train")):
                raise ValueError(f"template {idx}: relation {r!r} has {len(templates(r, 'train'))} training prompts")
        keep = tuple(templates(r, "train")[i] for r in others for i in idx)
        out.append(replace(c, request=replace(c.request, keep=keep)))
    return out


def known_cases(model: "HookedGPT2", n: int, seed: int = 0, exclude: Collection[tuple[str, str]] = frozenset(),
                batch_size: int = 256) -> list[CounterfactCase]:
    """Up to ``n`` CounterFact cases (:func:`counterfact_requests` over the whole fact base, seeded
    shuffle spread over relations) whose fact the unedited ``model`` knows on the rewrite prompt
    (:func:`~gpt2_interp.analysis.known.knows`: top-1 next token = the true object's first token,
    a token that holds more than whitespace), none with a ``(relation, subject)`` in ``exclude``.
    Fewer when the model knows fewer."""
    from ..facts.base import FactBase

    fb = FactBase.load()
    pool = [c for c in counterfact_requests(fb, n=len(fb), seed=seed) if (c.relation, c.request.subject) not in exclude]
    out: list[CounterfactCase] = []
    for s in range(0, len(pool), batch_size):
        chunk = pool[s : s + batch_size]
        hits = knows(model, [c.request.text for c in chunk], [c.target_true for c in chunk], batch_size)
        out += [c for c, hit in zip(chunk, hits) if hit]
        if len(out) >= n:
            break
    return out[:n]


def unrelated_prompts(n: int = 30, seed: int = 1) -> list[tuple[str, str, str]]:
    """A fixed set of ``(relation, subject, prompt)`` from the fact base, spread over relations."""
    cases = counterfact_requests(n=n, seed=seed, n_neighbours=0)
    return [(c.relation, c.request.subject, c.request.text) for c in cases]


# ---------------------------------------------------------------- scoring
@torch.no_grad()
def target_logprobs(model: "HookedGPT2", prompts: Sequence[str], targets: Sequence[str],
                    batch_size: int = 64) -> torch.Tensor:
    """``[n]``: log P(target | BOS + prompt), summed over the target's tokens, batched."""
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
            want[j, tmax - len(i):] = torch.tensor(i)
            keep[j, tmax - len(i):] = 1
        resid = model(tokens, attention_mask=mask, stop_at_layer=model.cfg.n_layer)
        lp = model.unembed(model.ln_final(resid[:, width - tmax - 1 : width - 1])).float().log_softmax(-1).cpu()
        out[s : s + len(rows)] = (lp.gather(-1, want[..., None])[..., 0] * keep).sum(-1)
    return out


def _case_pairs(case: CounterfactCase) -> list[tuple[str, str, str]]:
    """(part, prompt, target) rows: every prompt with the new and the true target."""
    if not case.target_true:
        return [("rewrite", case.request.text, case.request.target)]
    rows = []
    for part, prompts in (("rewrite", [case.request.text]), ("paraphrase", case.paraphrases),
                          ("neighbourhood", case.neighbourhood)):
        for p in prompts:
            rows += [(part, p, case.request.target), (part, p, case.target_true)]
    return rows


SCORES = ("es", "em", "ps", "pm", "ns", "nm")


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


@dataclass
class CaseScores(Scores):
    """One case's :class:`Scores` on the model as it is, and P(new) / P(true) on its rewrite prompt."""

    p_new: float | None = None
    p_true: float | None = None


def case_scores(model: "HookedGPT2", cases: Sequence[CounterfactCase], batch_size: int = 64) -> list[CaseScores]:
    """Efficacy/paraphrase/neighbourhood scores and magnitudes of each case on the model as it is."""
    pairs = [(i, *row) for i, c in enumerate(cases) for row in _case_pairs(c)]
    lp = target_logprobs(model, [p for _, _, p, _ in pairs], [t for *_, t in pairs], batch_size)
    per: list[dict[str, list[float]]] = [{} for _ in cases]
    for (i, part, _, _), x in zip(pairs, lp.tolist()):
        per[i].setdefault(part, []).append(x)
    out = []
    for c, d in zip(cases, per):
        row = CaseScores(p_new=math.exp(d["rewrite"][0]))
        if c.target_true:
            row.p_true = math.exp(d["rewrite"][1])
            for part, key, sign in (("rewrite", "e", 1), ("paraphrase", "p", 1), ("neighbourhood", "n", -1)):
                vals = d.get(part, [])
                new, true = vals[0::2], vals[1::2]
                if new:
                    setattr(row, f"{key}s", sum((a > b) if sign > 0 else (b > a) for a, b in zip(new, true)) / len(new))
                    setattr(row, f"{key}m", sum(sign * (math.exp(a) - math.exp(b)) for a, b in zip(new, true)) / len(new))
        out.append(row)
    return out


def _ngram_entropy(text: str, ns: Sequence[int] = (2, 3), weights: Sequence[float] = (2 / 3, 4 / 3)) -> float:
    words = re.findall(r"\w+|[^\w\s]", text.lower())
    ents = []
    for n in ns:
        grams = Counter(tuple(words[i : i + n]) for i in range(len(words) - n + 1))
        total = sum(grams.values())
        ents.append(-sum(c / total * math.log2(c / total) for c in grams.values()) if total else 0.0)
    return sum(w * e for w, e in zip(weights, ents)) / len(ents)


def n_gram_entropy(texts: str | Sequence[str], ns: Sequence[int] = (2, 3),
                   weights: Sequence[float] = (2 / 3, 4 / 3)) -> float:
    """ROME's fluency measure: per text the weighted mean of its 2- and 3-gram entropies (bits,
    word n-grams), averaged over texts. Repetitive text scores low."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    return sum(_ngram_entropy(t, ns, weights) for t in texts) / max(len(texts), 1)


def greedy_continuations(model: "HookedGPT2", prompts: Sequence[str], n_tokens: int = 40,
                         suppress_eos: bool = True) -> list[str]:
    """Prompt + greedy continuation of each prompt (``model.generate``: batched, KV cache). With
    ``suppress_eos`` the model cannot end the text (the fact model would stop after one sentence)."""
    longest = model.tokenize(list(prompts))[0].shape[1]
    return model.generate(list(prompts), max_new_tokens=min(n_tokens, model.cfg.n_ctx - longest),
                          stop_at_eos=False, suppress_eos=suppress_eos, do_sample=False)


@torch.no_grad()
def _next_logprobs(model: "HookedGPT2", prompts: Sequence[str]) -> torch.Tensor:
    return model.last_logits(list(prompts)).float().log_softmax(-1)


def _kl(pre: torch.Tensor, post: torch.Tensor) -> float:
    """Mean over rows of KL(pre ‖ post) (log-probs in)."""
    return float((pre.exp() * (pre - post)).sum(-1).mean())


# ---------------------------------------------------------------- beyond CounterFact
@dataclass
class RelatedPrompt:
    """A fact the edit should leave alone: ``kind`` "subject" (another relation of the edited
    subject) or "shared" (a subject whose last token is the edited subject's)."""

    prompt: str
    target_true: str
    kind: str
    subject: str = ""
    relation: str = ""


def related_prompts(model: "HookedGPT2", cases: Sequence[CounterfactCase], fb: "FactBase | None" = None,
                    n_max: int = 10, seed: int = 0) -> list[list[RelatedPrompt]]:
    """Per case: the edited subject's facts of the other relations, and up to ``n_max`` facts of
    subjects that share the edited subject's last token in its rewrite prompt (the position the
    edit writes to), facts of the edited relation first. Facts that any case edits are left out.
    Cases whose subject/relation are not in the fact base get none."""
    from ..analysis.tokens import subject_span
    from ..facts.base import FactBase
    from ..facts.templates import templates

    fb = fb or FactBase.load()
    rng = random.Random(seed)
    edited = {(c.relation, c.request.subject) for c in cases}
    by_subject: dict[str, list[Any]] = {}
    for f in fb.facts():
        by_subject.setdefault(f.subject, []).append(f)

    def last_token(subject: str, relation: str) -> str:
        text = templates(relation, "train")[0].format(subject)
        _, end = subject_span(model, text, subject)
        return model.to_str_tokens(text)[end - 1]

    by_last: dict[str, list[Any]] = {}
    for f in fb.facts():
        by_last.setdefault(last_token(f.subject, f.relation), []).append(f)
    out = []
    for c in cases:
        rel, subj = c.relation, c.request.subject
        if subj not in by_subject:
            out.append([])
            continue
        rows = [RelatedPrompt(templates(f.relation, "train")[0].format(f.subject), f.target, "subject",
                              f.subject, f.relation)
                for f in by_subject[subj] if f.relation != rel and (f.relation, f.subject) not in edited]
        shared = [f for f in by_last.get(last_token(subj, rel), [])
                  if f.subject != subj and (f.relation, f.subject) not in edited]
        shared = sorted(shared, key=lambda f: (f.relation != rel, rng.random()))[:n_max]
        rows += [RelatedPrompt(templates(f.relation, "train")[0].format(f.subject), f.target, "shared",
                               f.subject, f.relation)
                 for f in shared]
        out.append(rows)
    return out


def _top1_hits(model: "HookedGPT2", prompts: Sequence[RelatedPrompt], batch_size: int) -> list[bool]:
    """Whether the model knows each related fact (:func:`~gpt2_interp.analysis.known.knows`)."""
    return knows(model, [p.prompt for p in prompts], [p.target_true for p in prompts], batch_size) if prompts else []


# ---------------------------------------------------------------- the result
def _mean(xs: Sequence[Any]) -> float | None:
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def harmonic_score(*scores: float | None) -> float | None:
    """CounterFact's S: the harmonic mean of the defined scores (ES, PS, NS); 0 if any is 0,
    None if none is defined."""
    parts = [x for x in scores if x is not None]
    if not parts:
        return None
    return len(parts) / sum(1 / x for x in parts) if min(parts) > 0 else 0.0


def choose_setting(rows: Sequence[Any], unedited_ns: float, ns_tolerance: float = 0.05) -> Any:
    """The tuning choice among settings scored on the same requests: each row (a mapping or an
    object) has ``es``, ``ps``, ``ns`` (fractions; None where undefined).

    The row with the largest ES + PS among those whose NS stays within ``ns_tolerance`` of the
    unedited model's ``unedited_ns`` (0.05 = 5 points); when none does, the row with the best
    CounterFact S (:func:`harmonic_score` of ES, PS, NS) — the best NS alone would pick a setting
    that edits nothing (a huge ridge keeps NS at 100 % with ES 0). Ties keep the earlier row."""
    rows = list(rows)
    if not rows:
        raise ValueError("rows: give at least one scored setting")
    if not 0 <= ns_tolerance <= 1:
        raise ValueError(f"ns_tolerance is a fraction of the scores' 0..1 range (0.05 = 5 points), got {ns_tolerance}")

    def get(r: Any, k: str) -> float | None:
        return r.get(k) if isinstance(r, Mapping) else getattr(r, k, None)

    ok = [r for r in rows if get(r, "ns") is not None and get(r, "ns") >= unedited_ns - ns_tolerance]
    if ok:
        return max(ok, key=lambda r: (get(r, "es") or 0) + (get(r, "ps") or 0))
    return max(rows, key=lambda r: harmonic_score(get(r, "es"), get(r, "ps"), get(r, "ns")) or 0)


@dataclass
class CaseRow:
    """One evaluated case: what was asked, whether the unedited model knew it, its scores before and
    after the edit, the other facts it kept (subject specificity ``ss`` over ``ss_n`` facts of the
    edited subject's other relations; shared-token neighbours ``stn`` over ``stn_n`` facts of subjects
    ending in the same token), fluency, drift on unrelated prompts, and the edit's time and layer(s)."""

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

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CaseRow":
        """A row back from its JSON form (``to_dict()`` / a saved report's ``rows``)."""
        d = dict(d)
        for stage in ("pre", "post"):
            if d.get(stage) is not None:
                d[stage] = CaseScores(**d[stage])
        return cls(**d)

    @property
    def ss(self) -> float | None:
        return self.ss_hits / self.ss_n if self.ss_n else None

    @property
    def stn(self) -> float | None:
        return self.stn_hits / self.stn_n if self.stn_n else None


@dataclass
class MeanScores(Scores):
    """Means of :class:`Scores` over cases (those without a score skipped) and CounterFact's ``S``
    (their harmonic mean)."""

    S: float | None = None

    @classmethod
    def over(cls, scores: Sequence[Scores | None]) -> "MeanScores":
        got = [s for s in scores if s is not None]
        out = cls(**{k: _mean([getattr(s, k) for s in got]) for k in SCORES})
        out.S = harmonic_score(out.es, out.ps, out.ns)
        return out


@dataclass
class Summary:
    """A set of :class:`CaseRow` summarised: mean scores before and after the edits; subject
    specificity ``ss`` and shared-token neighbours ``stn`` pooled over the related facts (``n_ss``,
    ``n_stn`` of them; after the edits — before, they are 1 by construction); mean fluency, drift and
    edit time."""

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


def summarize(rows: Sequence[CaseRow]) -> Summary:
    """Means of every score over ``rows`` (cases without a score are skipped) + S, before and after;
    subject specificity and shared-token neighbours pooled over the related facts."""
    n_ss, n_stn = sum(r.ss_n for r in rows), sum(r.stn_n for r in rows)
    times = [r.edit_seconds for r in rows if r.edit_seconds is not None]
    return Summary(
        len(rows), MeanScores.over([r.pre for r in rows]), MeanScores.over([r.post for r in rows]),
        n_neighbourhood=sum(r.post is not None and r.post.ns is not None for r in rows),
        ss=sum(r.ss_hits for r in rows) / n_ss if n_ss else None, n_ss=n_ss,
        stn=sum(r.stn_hits for r in rows) / n_stn if n_stn else None, n_stn=n_stn,
        fluency_pre=_mean([r.fluency_pre for r in rows]), fluency_post=_mean([r.fluency_post for r in rows]),
        kl_drift=_mean([r.kl_drift for r in rows]), edit_seconds=_mean(times),
        edit_seconds_median=statistics.median(times) if times else None)


@dataclass
class CurvePoint(MeanScores):
    """Scores of the edits made so far, after ``n_edits`` of them (sequential editing), their subject
    specificity ``ss`` and shared-token neighbours ``stn``, and the drift on unrelated prompts."""

    n_edits: int = 0
    ss: float | None = None
    stn: float | None = None
    kl_drift: float = 0.0       # mean KL(unedited ‖ edited) on unrelated prompts
    kl_max: float = 0.0         # max over those prompts


@dataclass
class StepDrift:
    """KL(unedited ‖ edited) of the next-token distribution on fixed unrelated prompts after one
    editing step (one ROME edit or one MEMIT batch), mean and max over the prompts."""

    step: int
    n_edits: int
    kl_mean: float
    kl_max: float
    seconds: float = 0.0


@dataclass
class EditEvaluation(Result):
    """Per-case rows, summaries over all cases and the known subset, and (sequential) the decay
    curve and the drift after every step."""

    method: str
    sequential: bool
    layer: int | list[int] | None
    rows: list[CaseRow]
    summary: dict[str, Summary]  # {"all": …, "known": …}
    curve: list[CurvePoint] | None = None  # sequential: scores after k edits
    hparams: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    restored_exactly: bool = True
    batch_size: int | None = None
    steps: list[StepDrift] | None = None

    def table(self) -> str:
        """The summary as a text table (scores in %)."""
        how = ("sequential" if self.sequential else "one at a time") if self.batch_size in (None, 1) and \
            self.method == "rome" else (f"batches of {self.batch_size}" if self.batch_size else "one batch") + \
            (", sequential" if self.sequential else "")
        lines = [f"{self.method} on {self.summary['all'].n} requests ({how}), layer {self.layer}; "
                 f"the unedited model knows {self.summary['known'].n} of the facts"]
        head = f"{'subset':8} {'stage':5} " + " ".join(f"{k:>7}" for k in ("ES", "EM", "PS", "PM", "NS", "NM", "S"))
        lines += [head, "-" * len(head)]
        for subset in ("all", "known"):
            s = self.summary[subset]
            for stage in ("pre", "post"):
                vals = [getattr(getattr(s, stage), k) for k in (*SCORES, "S")]
                lines.append(f"{subset:8} {stage:5} " + " ".join(
                    f"{100 * v:7.1f}" if v is not None else f"{'–':>7}" for v in vals))
        s = self.summary["all"]
        fmt = lambda x, f: format(x, f) if x is not None else "–"  # noqa: E731
        pc = lambda x: f"{100 * x:.1f}%" if x is not None else "–"  # noqa: E731
        lines.append(f"subject specificity {pc(s.ss)} of {s.n_ss} other facts of the edited "
                     f"subjects; shared-token neighbours {pc(s.stn)} of {s.n_stn} facts")
        lines.append(f"fluency (n-gram entropy) {fmt(s.fluency_pre, '.3f')} → {fmt(s.fluency_post, '.3f')}; "
                     f"KL drift on unrelated prompts {fmt(s.kl_drift, '.2e')}; neighbourhood cases "
                     f"{s.n_neighbourhood}; edit time {fmt(s.edit_seconds, '.2f')} s mean, "
                     f"{fmt(s.edit_seconds_median, '.2f')} s median; weights restored bit-exactly: "
                     f"{self.restored_exactly}")
        if self.curve:
            pct = lambda x: f"{100 * x:.0f}" if x is not None else "–"  # noqa: E731
            lines.append("after k edits:  " + "  ".join(
                f"k={c.n_edits}: ES {pct(c.es)} PS {pct(c.ps)} NS {pct(c.ns)}" for c in self.curve))
        if self.steps:
            worst = max(self.steps, key=lambda d: d.kl_max)
            lines.append(f"drift per step: mean KL {fmt(_mean([d.kl_mean for d in self.steps]), '.2e')}, largest "
                         f"single-prompt KL {worst.kl_max:.3g} (step {worst.step}, after {worst.n_edits} edits)")
        return "\n".join(lines)

    def plot(self, **kwargs: Any):
        from ..plots.editing import plot_edit_evaluation

        return plot_edit_evaluation(self, **kwargs)


# ---------------------------------------------------------------- the loop
METHODS = ("rome", "memit", "alphaedit")


def evaluate_edits(model: "HookedGPT2", requests: Sequence[Any] | int, *args: Any, group: Any = None,
                   **kwargs: Any) -> EditEvaluation:
    """Edit the requests and score them: :func:`evaluate_edits_local`'s arguments.

    Distributed (an initialised process group, or ``group``): the ranks compute the key statistics
    together, then each edits and scores its share of the requests on its own copy of the model;
    every rank returns all rows in request order (those of one process, up to float rounding of
    differently batched prompts) and the summaries over them. ``sequential=True`` and MEMIT/AlphaEdit
    batch edits are not sharded (each rank runs them whole)."""
    if not distributed.is_distributed(group):
        return evaluate_edits_local(model, requests, *args, **kwargs)
    a = inspect.signature(evaluate_edits_local).bind(model, requests, *args, **kwargs)
    a.apply_defaults()
    opts = dict(a.arguments)
    hparams = opts.pop("hparams")
    if opts["sequential"] or opts["method"] != "rome":  # one evolving model / one batch edit: not sharded
        return evaluate_edits_local(model, requests, *args, **kwargs)
    t0 = time.perf_counter()
    cases = counterfact_requests(n=requests, seed=opts["seed"]) if isinstance(requests, int) else \
        [CounterfactCase.of(r, i) for i, r in enumerate(requests)]
    hp = hparams_for(model, **hparams)
    layer = opts["layer"]
    fixed_layer = None if layer == "auto" else (default_layer(model) if layer is None else layer)
    if opts["stats"] is None and fixed_layer is not None:  # together: every rank takes part
        opts["stats"] = key_second_moment(model, fixed_layer, corpus=hp.corpus, n_samples=hp.n_samples,
                                          progress=opts["progress"], group=group)
    mine = distributed.shard(cases, group)
    opts.update(model=model, requests=mine, progress=opts["progress"] and distributed.is_main(group))
    local = evaluate_edits_local(**opts, **hparams) if mine else None
    rows = distributed.gather_in_order(local.rows if local else [], len(cases), group)
    restored = bool(distributed.all_reduce_number(int(local.restored_exactly if local else True), group, "min"))
    known = [r for r in rows if r.known]
    return EditEvaluation(opts["method"], False, fixed_layer, rows, {"all": summarize(rows), "known": summarize(known)},
                          None, dict(vars(hp)), time.perf_counter() - t0, restored)


def evaluate_edits_local(
    model: "HookedGPT2",
    requests: Sequence[Any] | int,
    method: str = "rome",
    sequential: bool = False,
    layer: int | Sequence[int] | str | None = None,
    stats: "KeyStats | Mapping[int, KeyStats] | None" = None,
    fluency_tokens: int = 40,
    n_unrelated: int = 30,
    checkpoints: Sequence[int] | None = None,
    batch_size: int | None = None,
    progress: bool = True,
    seed: int = 0,
    score_batch_size: int = 64,
    preserve: Any = None,
    related: bool = True,
    time_limit: float | None = None,
    targets: "torch.Tensor | None" = None,
    **hparams: Any,
) -> EditEvaluation:
    """Edit the requests and score them (see module doc).

    ``requests``: CounterFact cases (:func:`counterfact_requests`), Requests/dicts, or an int n
    (that many cases from the embedded fact base). ``method``: "rome" (one request per edit),
    "memit" or "alphaedit" (``batch_size`` requests per edit, all at once when None; AlphaEdit
    preserves the key statistics' span — ``preserve`` may give a :class:`~.memit.NullSpace` or other
    statistics — and remembers earlier batches' keys). ``layer``: ROME's layer, or MEMIT's layers.

    Not sequential: each edit (one request, or one batch) is made on the unedited model, scored and
    undone bit-exactly (checked). ``sequential=True``: edits accumulate; the scores of the edits so
    far are recorded after ``checkpoints`` edits (ROME) or after every batch (MEMIT/AlphaEdit), and
    the drift on unrelated prompts after every step; all are undone at the end (checked).
    ``time_limit`` (seconds, sequential only): stop editing after the first step that ends past it;
    the evaluation then covers the requests edited so far (``summary["all"].n`` of them, the curve
    ending at that count).
    ``targets`` (MEMIT/AlphaEdit, one batch of all requests, not sequential): the target residuals
    ``v_star`` of an earlier edit of the same requests (:func:`~.memit.compute_edits`), so MEMIT and
    AlphaEdit on one batch share one δ optimisation.
    ``hparams`` go to the editor (ROME's or MEMIT's hyperparameters).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if time_limit is not None and not sequential:
        raise ValueError("time_limit applies to sequential editing (sequential=True)")
    if method == "rome" and batch_size not in (None, 1):
        raise ValueError(f"ROME edits one request at a time; batch_size={batch_size} needs method='memit' or "
                         "'alphaedit'")
    t_start = time.perf_counter()
    cases = counterfact_requests(n=requests, seed=seed) if isinstance(requests, int) else \
        [CounterfactCase.of(r, i) for i, r in enumerate(requests)]
    if not cases:
        raise ValueError("no requests to evaluate")
    if targets is not None and (method == "rome" or sequential or batch_size not in (None, len(cases))):
        raise ValueError("targets are the target residuals of one MEMIT/AlphaEdit batch of all the requests "
                         "(method='memit' or 'alphaedit', not sequential, batch_size=None)")
    sb = score_batch_size
    # ---- the editor
    if method == "rome":
        hp: Any = hparams_for(model, **hparams)
        fixed = None if layer == "auto" else (default_layer(model) if layer is None else layer)
        shown_layer: Any = fixed
        rome_stats = stats if isinstance(stats, KeyStats) else (stats or {}).get(fixed) if fixed is not None else None
        if fixed is not None and rome_stats is None:
            rome_stats = key_second_moment(model, fixed, corpus=hp.corpus, n_samples=hp.n_samples, progress=progress)

        def make(reqs: list[Request]) -> Edit:
            return compute_edit(model, reqs[0], layer=layer if fixed is None else fixed, stats=rome_stats, **hparams)

        units = [[i] for i in range(len(cases))]
        hp_dict = dict(vars(hp))
    else:
        mhp = MemitHparams.of(model, **hparams)
        if layer == "auto":
            layers = choose_layers(model, [c.request for c in cases])
        elif layer is None:
            layers = list(mhp.layers) if mhp.layers is not None else default_layers(model)
        else:
            layers = [layer] if isinstance(layer, int) else list(layer)
        shown_layer = layers
        if stats is None:
            mstats = key_second_moment(model, layers, corpus=mhp.rome.corpus, n_samples=mhp.rome.n_samples,
                                       progress=progress)
        else:
            mstats = {stats.layer: stats} if isinstance(stats, KeyStats) else dict(stats)
        ns = None
        if method == "alphaedit":
            ns = preserve if isinstance(preserve, NullSpace) else NullSpace.from_stats(
                {l: mstats[l] for l in layers} if preserve in (None, True) else preserve, mhp.nullspace_threshold,
                mhp.nullspace_rule)

        def make(reqs: list[Request]) -> Edit:  # independent batches do not remember each other's keys
            return compute_edits(model, reqs, layers=layers, stats=mstats, hparams=mhp, preserve=ns,
                                 remember=sequential, progress=progress, targets=targets)

        size = batch_size or len(cases)
        units = [list(range(s, min(s + size, len(cases)))) for s in range(0, len(cases), size)]
        hp_dict = mhp.to_dict()
    base_fp = weights_fingerprint(model)

    # ---- the unedited model, batched
    pre = case_scores(model, cases, sb)
    with_true = [i for i, c in enumerate(cases) if c.target_true]
    known_flags = [False] * len(cases)
    for i, hit in zip(with_true, knows(model, [cases[i].request.text for i in with_true],
                                       [cases[i].target_true for i in with_true], sb)):
        known_flags[i] = hit
    gen_prompts = [[c.request.text] + c.paraphrases[:2] for c in cases]
    flat = [p for g in gen_prompts for p in g]
    texts_pre = [t for s in range(0, len(flat), sb) for t in greedy_continuations(model, flat[s : s + sb], fluency_tokens)]
    fluency_pre, i = [], 0
    for g in gen_prompts:
        fluency_pre.append(n_gram_entropy(texts_pre[i : i + len(g)]))
        i += len(g)
    unrel = unrelated_prompts(n_unrelated)
    unrel_pre = _next_logprobs(model, [p for *_, p in unrel])
    rel: list[list[RelatedPrompt]] = [[] for _ in cases]
    if related and all(c.relation for c in cases):
        rel = related_prompts(model, cases, seed=seed)
        flat_rel = [p for ps in rel for p in ps]
        known_rel = iter(_top1_hits(model, flat_rel, sb))
        rel = [[p for p in ps if next(known_rel)] for ps in rel]  # only facts the unedited model knows

    def unrelated_for(c: CounterfactCase) -> list[int]:
        return [j for j, (r, subj, _) in enumerate(unrel) if r != c.relation and subj != c.request.subject]

    rows: list[CaseRow] = []
    for c, s, known, fl in zip(cases, pre, known_flags, fluency_pre):
        rows.append(CaseRow(c.case_id, c.relation, c.request.subject, c.request.text, c.request.target, c.target_true,
                            known, pre=s, fluency_pre=fl))

    curve: list[CurvePoint] = []
    steps: list[StepDrift] = []
    restored = True
    marks = sorted({k for k in (checkpoints or (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)) if k <= len(cases)}
                   | {len(cases)})
    bar = progress_bar(total=len(cases), desc=f"editing ({method})", enabled=progress)
    n_done = 0
    for step, unit in enumerate(units, start=1):
        t0 = time.perf_counter()
        edit = make([cases[i].request for i in unit])
        secs = time.perf_counter() - t0
        for i in unit:
            rows[i].edit_seconds = secs / len(unit)
            rows[i].layer = edit.layers[0] if len(edit.layers) == 1 else edit.layers
        before = None if sequential else {l: tensor_digest(model.blocks[l].mlp.W_out) for l in edit.layers}
        edit.apply(model, verify=False)
        n_done += len(unit)
        bar.update(len(unit))
        if sequential:
            post_u = _next_logprobs(model, [p for *_, p in unrel])
            kl_rows = (unrel_pre.exp() * (unrel_pre - post_u)).sum(-1)
            steps.append(StepDrift(step, n_done, float(kl_rows.mean()), float(kl_rows.max()), secs))
            out_of_time = time_limit is not None and time.perf_counter() - t_start > time_limit
            if (method == "rome" and n_done in marks) or (method != "rome") or n_done == len(cases) or out_of_time:
                curve.append(_curve_point(model, cases[:n_done], rel[:n_done], unrel_pre, unrel, sb))
            if out_of_time and n_done < len(cases):
                cases, rows, rel = cases[:n_done], rows[:n_done], rel[:n_done]
                break
            continue
        try:
            _score_after(model, [cases[i] for i in unit], [rows[i] for i in unit], [rel[i] for i in unit],
                         unrelated_for, unrel, unrel_pre, fluency_tokens, sb)
        finally:
            edit.undo(model)
        ok = all(tensor_digest(model.blocks[l].mlp.W_out) == d for l, d in before.items())
        restored &= ok
        if not ok:  # pragma: no cover - undo is exact by construction
            raise RuntimeError(f"undoing the edit of cases {unit[:5]} did not restore W_out bit-exactly")
    bar.close()
    if sequential:
        _score_after(model, cases, rows, rel, unrelated_for, unrel, unrel_pre, fluency_tokens, sb)
        undo_all(model)
        restored = weights_fingerprint(model) == base_fp
        if not restored:  # pragma: no cover
            raise RuntimeError("undoing the sequential edits did not restore the weights bit-exactly")
    known = [r for r in rows if r.known]
    return EditEvaluation(method, sequential, shown_layer, rows, {"all": summarize(rows), "known": summarize(known)},
                          curve or None, hp_dict, time.perf_counter() - t_start, restored,
                          batch_size if method != "rome" else 1, steps or None)


def _score_after(model: "HookedGPT2", cases: Sequence[CounterfactCase], rows: Sequence[CaseRow],
                 rel: Sequence[list[RelatedPrompt]], unrelated_for: Any, unrel: list, unrel_pre: torch.Tensor,
                 fluency_tokens: int, batch_size: int) -> None:
    """Post-edit scores, related-fact hits, fluency and drift of ``cases`` on the model as it is."""
    scores = case_scores(model, cases, batch_size)
    for row, s in zip(rows, scores):
        row.post = s
    hits = iter(_top1_hits(model, [p for ps in rel for p in ps], batch_size))
    for row, ps in zip(rows, rel):
        h = [(p.kind, next(hits)) for p in ps]
        for key, kind in (("ss", "subject"), ("stn", "shared")):
            mine = [x for k, x in h if k == kind]
            setattr(row, f"{key}_hits", sum(mine))
            setattr(row, f"{key}_n", len(mine))
    gen = [[c.request.text] + c.paraphrases[:2] for c in cases]
    flat = [p for g in gen for p in g]
    texts = [t for s in range(0, len(flat), batch_size)
             for t in greedy_continuations(model, flat[s : s + batch_size], fluency_tokens)]
    post_u = _next_logprobs(model, [p for *_, p in unrel])
    i = 0
    for c, row, g in zip(cases, rows, gen):
        row.fluency_post = n_gram_entropy(texts[i : i + len(g)])
        i += len(g)
        idx = unrelated_for(c)
        if idx:
            row.kl_drift = _kl(unrel_pre[idx], post_u[idx])


def _curve_point(model: "HookedGPT2", cases: Sequence[CounterfactCase], rel: Sequence[list[RelatedPrompt]],
                 unrel_pre: torch.Tensor, unrel: list, batch_size: int) -> CurvePoint:
    s = case_scores(model, cases, batch_size)
    flat = [p for ps in rel for p in ps]
    hits = _top1_hits(model, flat, batch_size)
    rel_scores = {}
    for key, kind in (("ss", "subject"), ("stn", "shared")):
        mine = [h for p, h in zip(flat, hits) if p.kind == kind]
        rel_scores[key] = sum(mine) / len(mine) if mine else None
    post = _next_logprobs(model, [p for *_, p in unrel])
    kl_rows = (unrel_pre.exp() * (unrel_pre - post)).sum(-1)
    return CurvePoint(**vars(MeanScores.over(s)), n_edits=len(cases), **rel_scores, kl_drift=float(kl_rows.mean()),
                      kl_max=float(kl_rows.max()))


__all__ = ["CounterfactCase", "Scores", "CaseScores", "MeanScores", "CaseRow", "Summary", "counterfact_requests", "known_cases", "keep_other_relations", "evaluate_edits", "evaluate_edits_local", "EditEvaluation", "case_scores",
           "CurvePoint", "StepDrift", "RelatedPrompt", "related_prompts", "METHODS",
           "target_logprobs", "n_gram_entropy", "greedy_continuations", "summarize", "choose_setting", "harmonic_score",
           "unrelated_prompts"]
