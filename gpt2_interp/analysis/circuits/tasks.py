"""Circuit tasks: prompt pairs a circuit is found on, with the metric that scores them.

A :class:`Task` holds clean and corrupted prompts (the same number of tokens in every pair, so that
positions align), their tokens through one model's tokenizer, the answer and wrong token of each
pair and the metric (a function of last-position logits, :mod:`gpt2_interp.analysis.metrics`):

- :func:`ioi`: indirect-object identification (Wang et al. 2023), "When Mary and John went to the
  store, John gave a drink to" → ``" Mary"`` vs ``" John"``; corrupted from the ABC distribution (the
  three names replaced by three other names); metric ``logit[IO] − logit[S]``.
- :func:`greater_than`: years (Hanna et al. 2023), "The war lasted from the year 1732 to the year 17"
  → probability of the two-digit years > 32 minus that of the years ≤ 32; corrupted with the year
  1701. Needs two-digit year tokens (GPT-2's BPE has them; a tokenizer that splits digits is refused).
- :func:`fact_recall`: a fact of the fact base against the same template with another subject
  (:func:`gpt2_interp.facts.pairs.subject_swaps`); metric ``logit[answer] − logit[other answer]``.

:func:`performance` measures the model's own metric and accuracy on a task — the first thing to
report, since a circuit of a task the model cannot do means nothing:

>>> task = ioi(model, n=50, seed=0)
>>> perf = performance(model, task)
>>> perf.clean_metric, perf.accuracy
>>> patch(model, task.clean, task.corrupted, task.metric, hook="resid_pre")
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ...core.boundary import boundary
from ...core.checks import check_count, check_indices
from ...core.result import Result
from ...facts.base import FactBase
from ...facts.pairs import subject_swaps
from ..metrics import LogitDiff, Metric, apply_metric, metric_name
from .graph import CircuitWarning

if TYPE_CHECKING:
    from ...model import HookedGPT2

# =============================================================== data
#: Wang et al.'s IOI templates (their ``BABA_TEMPLATES``): ``[B]`` the subject, ``[A]`` the indirect
#: object; the prompt ends before the final ``[A]``, the answer. The ABBA form swaps the first two names.
IOI_TEMPLATES: tuple[str, ...] = (
    "Then, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Then, [B] and [A] had a lot of fun at the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Then, [B] and [A] were working at the [PLACE]. [B] decided to give a [OBJECT] to [A]",
    "Then, [B] and [A] were thinking about going to the [PLACE]. [B] wanted to give a [OBJECT] to [A]",
    "Then, [B] and [A] had a long argument, and afterwards [B] said to [A]",
    "After [B] and [A] went to the [PLACE], [B] gave a [OBJECT] to [A]",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give it to [A]",
    "When [B] and [A] got a [OBJECT] at the [PLACE], [B] decided to give the [OBJECT] to [A]",
    "While [B] and [A] were working at the [PLACE], [B] gave a [OBJECT] to [A]",
    "While [B] and [A] were commuting to the [PLACE], [B] gave a [OBJECT] to [A]",
    "After the lunch, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Afterwards, [B] and [A] went to the [PLACE]. [B] gave a [OBJECT] to [A]",
    "Then, [B] and [A] had a long argument. Afterwards [B] said to [A]",
    "The [PLACE] [B] and [A] went to had a [OBJECT]. [B] gave it to [A]",
    "Friends [B] and [A] found a [OBJECT] at the [PLACE]. [B] gave it to [A]",
)
#: Wang et al.'s first names; each model keeps those that are one token after a space.
IOI_NAMES: tuple[str, ...] = (
    "Michael", "Christopher", "Jessica", "Matthew", "Ashley", "Jennifer", "Joshua", "Amanda", "Daniel", "David",
    "James", "Robert", "John", "Joseph", "Andrew", "Ryan", "Brandon", "Jason", "Justin", "Sarah", "William",
    "Jonathan", "Stephanie", "Brian", "Nicole", "Nicholas", "Anthony", "Heather", "Eric", "Elizabeth", "Adam",
    "Megan", "Melissa", "Kevin", "Steven", "Thomas", "Timothy", "Christina", "Kyle", "Rachel", "Laura", "Lauren",
    "Amber", "Brittany", "Danielle", "Richard", "Kimberly", "Jeffrey", "Amy", "Crystal", "Michelle", "Tiffany",
    "Jeremy", "Benjamin", "Mark", "Emily", "Aaron", "Charles", "Rebecca", "Jacob", "Stephen", "Patrick", "Sean",
    "Erin", "Jamie", "Kelly", "Samantha", "Nathan", "Sara", "Dustin", "Paul", "Angela", "Tyler", "Scott",
    "Katherine", "Andrea", "Gregory", "Erica", "Mary", "Travis", "Lisa", "Kenneth", "Bryan", "Lindsey", "Kristen",
    "Jose", "Alexander", "Jesse", "Katie", "Lindsay", "Shannon", "Vanessa", "Courtney", "Christine", "Alicia",
    "Cody", "Allison", "Bradley", "Samuel"
)  # fmt: skip
IOI_PLACES: tuple[str, ...] = ("store", "garden", "restaurant", "school", "hospital", "office", "house", "station")
IOI_OBJECTS: tuple[str, ...] = ("ring", "kiss", "bone", "basketball", "computer", "necklace", "drink", "snack")

#: Hanna et al.'s event nouns; each model keeps those that are one token after a space.
GREATER_THAN_NOUNS: tuple[str, ...] = (
    "abduction", "accord", "affair", "agreement", "appraisal", "assaults", "assessment", "attack", "attempts",
    "campaign", "captivity", "case", "challenge", "chaos", "clash", "collaboration", "coma", "competition",
    "confrontation", "consequence", "conspiracy", "construction", "consultation", "contact", "contract",
    "convention", "cooperation", "custody", "deal", "decline", "decrease", "demonstrations", "development",
    "disagreement", "disorder", "dispute", "domination", "dynasty", "effect", "effort", "employment", "endeavor",
    "engagement", "epidemic", "evaluation", "exchange", "existence", "expansion", "expedition", "experiments",
    "fall", "fame", "flights", "friendship", "growth", "hardship", "hostility", "illness", "impact", "imprisonment",
    "improvement", "incarceration", "increase", "insurgency", "invasion", "investigation", "journey", "kingdom",
    "marriage", "modernization", "negotiation", "notoriety", "obstruction", "operation", "order", "outbreak",
    "outcome", "overhaul", "patrols", "pilgrimage", "plague", "plan", "practice", "process", "program", "progress",
    "project", "pursuit", "quest", "raids", "reforms", "reign", "relationship", "retaliation", "riot", "rise",
    "rivalry", "romance", "rule", "sanctions", "shift", "siege", "slump", "stature", "stint", "strikes", "study",
    "test", "testing", "tests", "therapy", "tour", "tradition", "treaty", "trial", "trip", "unemployment", "voyage",
    "war", "warfare", "work"
)  # fmt: skip
GREATER_THAN_TEMPLATE = "The {noun} lasted from the year {century}{yy:02d} to the year {century}"


# =============================================================== metric of greater-than
@boundary
@dataclass
class ProbMassDiff:
    """Hanna et al.'s probability difference: ``Σ p(year > threshold) − Σ p(year ≤ threshold)`` over
    the next-token probabilities of the two-digit year tokens ``years`` (``[100]``, the ids of
    ``"00"`` … ``"99"``), with ``threshold`` the clean prompt's year (one per pair, ``[n_pairs]``).
    Logits ``[..., n_pairs, d_vocab]`` → ``[..., n_pairs]`` in [−1, 1]; ``name``: how results name it."""

    years: torch.Tensor
    threshold: torch.Tensor
    name: str = "prob_diff(year > YY)"

    def bind(self, model: HookedGPT2, clean_logits: torch.Tensor | None = None) -> ProbMassDiff:
        """This metric (its ids are resolved already)."""
        return self

    def _year_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """``[..., n_pairs, 100]``: the probability of each two-digit year token."""
        return logits.float().softmax(-1)[..., self.years.to(logits.device)]

    def _above(self, device: torch.device) -> torch.Tensor:
        """``[n_pairs, 100]``: whether each year is after the pair's threshold."""
        return torch.arange(100, device=device) > self.threshold.to(device)[:, None]

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        p = self._year_probs(logits)
        above = self._above(logits.device)
        return torch.where(above, p, -p).sum(-1)

    def correct(self, logits: torch.Tensor) -> torch.Tensor:
        """``[..., n_pairs]`` bool: the most probable two-digit year is after the threshold."""
        return self._year_probs(logits).argmax(-1) > self.threshold.to(logits.device)


# =============================================================== the task
@boundary
@dataclass
class Task:
    """Prompt pairs of one task, tokenized for one model.

    - ``name``: the task (``"ioi"``, ``"greater_than"``, ``"fact_recall"``); ``model``: the model whose
      tokenizer made the tokens; ``description``: the task and its corruption in words;
    - ``clean`` / ``corrupted``: the prompts (``patch(model, task.clean, task.corrupted, task.metric)``);
    - ``clean_tokens`` / ``corrupted_tokens`` ``[n_pairs, pos]``: BOS + prompt, left-padded to one
      width; ``attention_mask`` ``[n_pairs, pos]`` (None when every prompt has the same length, so that
      positions mean the same in every pair: see :attr:`aligned`);
    - ``answers`` / ``wrongs`` ``[n_pairs]``: the token the clean prompt should continue with and the
      one it should not (IOI: indirect object / subject; fact recall: the two subjects' answers;
      greater-than: the clean year's two-digit token, whose later years are right, and the corrupted
      year's ``"01"``);
    - ``metric``: last-position logits ``[..., n_pairs, d_vocab]`` → ``[..., n_pairs]``, higher = the
      task done (IOI and fact recall: ``logit_diff(answers, wrongs)``; greater-than: :class:`ProbMassDiff`);
    - ``pairs``: per pair, what was drawn (names, template, year, facts), JSON-able.
    """

    name: str
    model: str
    description: str
    clean: list[str]
    corrupted: list[str]
    clean_tokens: torch.Tensor
    corrupted_tokens: torch.Tensor
    attention_mask: torch.Tensor | None
    answers: torch.Tensor
    wrongs: torch.Tensor
    metric: Metric
    pairs: list[dict[str, Any]] = field(repr=False)

    def __len__(self) -> int:
        return len(self.clean)

    @property
    def aligned(self) -> bool:
        """Whether all prompts have the same number of tokens (no padding): position ``p`` is then
        the same slot of the template in every pair, as per-position circuits need."""
        return self.attention_mask is None

    def correct(self, logits: torch.Tensor) -> torch.Tensor:
        """``[..., n_pairs]`` bool from last-position logits ``[..., n_pairs, d_vocab]``: the task done
        (logit difference > 0; greater-than: the most probable two-digit year is a later one)."""
        judge = getattr(self.metric, "correct", None)
        return judge(logits) if callable(judge) else apply_metric(self.metric, logits) > 0

    def subset(self, keep: Sequence[int]) -> Task:
        """The pairs at indices ``keep``, in that order (padding columns no pair needs are dropped)."""
        idx = check_indices(keep, len(self), "pair", "keep", f"the task has {len(self)} pairs")
        clean = self.clean_tokens[idx]
        corrupted = self.corrupted_tokens[idx]
        mask = None if self.attention_mask is None else self.attention_mask[idx]
        if mask is not None:
            start = int((mask.sum(0) == 0).sum())  # left padding: columns with no real token come first
            clean, corrupted, mask = clean[:, start:], corrupted[:, start:], mask[:, start:]
            if bool(mask.all()):
                mask = None
        return Task(
            self.name,
            self.model,
            self.description,
            [self.clean[i] for i in idx],
            [self.corrupted[i] for i in idx],
            clean,
            corrupted,
            mask,
            self.answers[idx],
            self.wrongs[idx],
            _metric_subset(self.metric, idx),
            [self.pairs[i] for i in idx],
        )


def _metric_subset(metric: Metric, idx: list[int]) -> Metric:
    if isinstance(metric, LogitDiff):
        return LogitDiff(_rows(metric.answer, idx), _rows(metric.wrong, idx), metric.name)
    if isinstance(metric, ProbMassDiff):
        return ProbMassDiff(metric.years, metric.threshold[idx], metric.name)
    raise TypeError(f"cannot take a subset of pairs of metric {metric_name(metric)}")


def _rows(ids: Any, idx: list[int]) -> Any:
    return ids[idx] if isinstance(ids, torch.Tensor) and ids.ndim == 1 else ids


def _single(model: HookedGPT2, text: str) -> int | None:
    """The id of ``text`` if the model's tokenizer makes it one token, else None."""
    ids = model.tokenizer.encode_ids(text)
    return ids[0] if len(ids) == 1 else None


def _build(
    model: HookedGPT2,
    name: str,
    description: str,
    rows: list[tuple[str, str, int, int, dict[str, Any]]],
    metric: Callable[[torch.Tensor, torch.Tensor], Metric],
) -> Task:
    """A task from ``(clean, corrupted, answer id, wrong id, info)`` rows, every pair checked for equal
    token counts (the error shows both tokenizations)."""
    clean, corrupted, answers, wrongs, info = (list(x) for x in zip(*rows))
    for a, b in zip(clean, corrupted):
        ta, tb = model.tokenizer.encode_ids(a), model.tokenizer.encode_ids(b)
        if len(ta) != len(tb):
            show = model.tokenizer.token_str
            raise ValueError(
                f"{name}: {model.cfg.name}'s tokenizer gives the pair different token counts, so positions do not "
                f"align:\n  clean     {a!r} -> {[show(i) for i in ta]}\n  corrupted {b!r} -> {[show(i) for i in tb]}"
            )
    tokens, mask = model.tokenize(clean + corrupted)
    n = len(clean)
    a, w = torch.tensor(answers), torch.tensor(wrongs)
    return Task(
        name,
        model.cfg.name,
        description,
        clean,
        corrupted,
        tokens[:n],
        tokens[n:],
        None if mask is None else mask[:n],
        a,
        w,
        metric(a, w),
        info,
    )


def _logit_diff(name: str) -> Callable[[torch.Tensor, torch.Tensor], Metric]:
    return lambda a, w: LogitDiff(a, w, name)


# =============================================================== IOI
@boundary
def ioi_names(model: HookedGPT2) -> list[str]:
    """The IOI names (:data:`IOI_NAMES`) that ``model``'s tokenizer makes one token after a space."""
    return [n for n in IOI_NAMES if _single(model, " " + n) is not None]


@boundary
def ioi(model: HookedGPT2, n: int = 100, seed: int = 0, templates: Sequence[int] | None = None) -> Task:
    """Indirect-object identification (Wang et al. 2023), ``n`` pairs drawn with ``seed``.

    Each pair draws a template of :data:`IOI_TEMPLATES` (``templates``: their indices; default all),
    half in the ABBA and half in the BABA order, a place, an object and two names (IO, S) among those
    that are one token for ``model`` (:func:`ioi_names`); the clean prompt ends before the IO, which is
    the answer, the subject S the wrong token. The corrupted prompt is the same text with the three
    name slots (IO, S1, S2) filled by three other distinct names — Wang et al.'s ABC distribution, in
    which no name repeats, so nothing tells the model which name to say. Metric ``logit[IO] − logit[S]``.
    Prompts of different templates differ in length (``task.aligned`` is False unless one template
    length is chosen)."""
    n = check_count(n, "n")
    chosen = (
        list(range(len(IOI_TEMPLATES)))
        if templates is None
        else check_indices(templates, len(IOI_TEMPLATES), "template", "templates", "IOI has 15 templates")
    )
    if not chosen:
        raise ValueError("templates is empty; give template indices in 0..14, or None for all")
    names = ioi_names(model)
    if len(names) < 5:
        raise ValueError(
            f"ioi: only {len(names)} of the {len(IOI_NAMES)} IOI names are one token for {model.cfg.name}'s "
            "tokenizer (5 are needed: two clean names and three other corrupted ones); the task does not fit it"
        )
    ids = {name: model.to_single_token(" " + name) for name in names}
    rng = random.Random(seed)
    rows: list[tuple[str, str, int, int, dict[str, Any]]] = []
    for i in range(n):
        t = chosen[rng.randrange(len(chosen))]
        order = "ABBA" if i % 2 == 0 else "BABA"
        place, obj = rng.choice(IOI_PLACES), rng.choice(IOI_OBJECTS)
        io, s, c1, c2, c3 = rng.sample(names, 5)
        form = IOI_TEMPLATES[t].rsplit(" [A]", 1)[0]  # the prompt ends before the answer
        if order == "ABBA":  # "[A] and [B] …, [B] … to": swap the first two name slots
            form = form.replace("[B]", "[X]", 1).replace("[A]", "[B]", 1).replace("[X]", "[A]", 1)
        form = form.replace("[PLACE]", place).replace("[OBJECT]", obj)
        clean = form.replace("[A]", io).replace("[B]", s)
        # ABC: IO -> c1, S1 -> c2, S2 (the last [B]) -> c3
        head, tail = form.rsplit("[B]", 1)
        corrupted = head.replace("[A]", c1).replace("[B]", c2) + c3 + tail
        info = {"template": t, "order": order, "io": io, "s": s, "place": place, "object": obj, "abc": [c1, c2, c3]}
        rows.append((clean, corrupted, ids[io], ids[s], info))
    desc = (
        "indirect-object identification (Wang et al. 2023): clean 'When A and B …, B gave … to' -> ' A' vs ' B'; "
        "corrupted: the three names replaced by three other names (ABC); metric logit[IO] - logit[S]"
    )
    return _build(model, "ioi", desc, rows, _logit_diff("logit_diff(IO, S)"))


# =============================================================== greater-than
@boundary
def year_tokens(model: HookedGPT2, century: int = 17) -> tuple[int, list[int]]:
    """``(century token, [100] two-digit token ids)``: the ids of ``" 17"`` and of ``"00"`` … ``"99"``
    for ``model``'s tokenizer. A tokenizer without them (one that splits numbers into digits, such as
    SmolLM2's) raises a ValueError saying the greater-than task does not fit it."""
    head = _single(model, f" {century}")
    years = [_single(model, f"{y:02d}") for y in range(100)]
    if head is None or any(y is None for y in years):
        show = [model.tokenizer.token_str(i) for i in model.tokenizer.encode_ids(f" {century}32")]
        raise ValueError(
            f"greater_than needs a token for ' {century}' and one for each two-digit year '00'..'99', and "
            f"{model.cfg.name}'s tokenizer has not got them (' {century}32' -> {show}): the task does not fit "
            "this tokenizer (the model would predict the year digit by digit)"
        )
    return head, [int(y) for y in years if y is not None]


@boundary
def greater_than(model: HookedGPT2, n: int = 100, seed: int = 0, century: int = 17) -> Task:
    """Greater-than over years (Hanna et al. 2023), ``n`` pairs drawn with ``seed``: "The {noun} lasted
    from the year {century}{YY} to the year {century}" with a noun of :data:`GREATER_THAN_NOUNS` that is
    one token for ``model`` and ``YY`` in 02..98 where ``" {century}{YY}"`` is the century token then the
    ``YY`` token (so every prompt has the same length); corrupted: the same prompt with the year
    ``{century}01``. Metric (:class:`ProbMassDiff`): the probability of the two-digit years after ``YY``
    minus that of those up to ``YY``. A tokenizer without two-digit tokens is refused (:func:`year_tokens`)."""
    n = check_count(n, "n")
    head, years = year_tokens(model, century)
    nouns = [w for w in GREATER_THAN_NOUNS if _single(model, " " + w) is not None]
    yys = [y for y in range(2, 99) if model.tokenizer.encode_ids(f" {century}{y:02d}") == [head, years[y]]]
    if model.tokenizer.encode_ids(f" {century}01") != [head, years[1]] or not yys or not nouns:
        raise ValueError(
            f"greater_than: {model.cfg.name}'s tokenizer does not write ' {century}01' and the years "
            f"{century}02..{century}98 as the century token then the two-digit token; the task does not fit it"
        )
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        noun, yy = rng.choice(nouns), rng.choice(yys)
        clean = GREATER_THAN_TEMPLATE.format(noun=noun, century=century, yy=yy)
        corrupted = GREATER_THAN_TEMPLATE.format(noun=noun, century=century, yy=1)
        rows.append((clean, corrupted, years[yy], years[1], {"noun": noun, "year": century * 100 + yy, "yy": yy}))
    desc = (
        f"greater-than (Hanna et al. 2023): 'The war lasted from the year {century}YY to the year {century}' -> "
        f"p(years > YY) - p(years <= YY); corrupted: YY = 01"
    )
    table = torch.tensor(years)
    return _build(
        model, "greater_than", desc, rows, lambda a, w: ProbMassDiff(table, torch.tensor([r[4]["yy"] for r in rows]))
    )


# =============================================================== fact recall
@boundary
def fact_recall(
    model: HookedGPT2, n: int = 100, seed: int = 0, relations: Sequence[str] | None = None, template: int = 0
) -> Task:
    """Fact recall from the fact base, ``n`` pairs drawn with ``seed`` (spread over ``relations``,
    default all): a fact's prompt (training template ``template`` of its relation) against the same
    template with another subject of the relation whose answer starts with a different token and whose
    prompt has as many tokens (:func:`~gpt2_interp.facts.pairs.subject_swaps`). Answer / wrong: the
    first token of each subject's object; metric ``logit[answer] − logit[other answer]``. Relations
    have templates of different lengths (``task.aligned`` is False with more than one)."""
    n = check_count(n, "n")
    fb = FactBase.load()
    if relations is not None:
        unknown = [r for r in relations if r not in fb.relations]
        if unknown or not relations:
            raise ValueError(f"fact_recall: relations must be among {', '.join(fb.relations)}; got {list(relations)}")
        fb = FactBase([f for r in relations for f in fb.facts(r)])
    fp = subject_swaps(fb, model.tokenizer, n, seed=seed, template=template)
    if not len(fp):
        raise ValueError(f"fact_recall: no pair of subjects with prompts of equal length for {model.cfg.name}")
    if len(fp) < n:
        warnings.warn(
            f"fact_recall: {len(fp)} prompt pairs, not the {n} asked for (n): the fact base has no more pairs of "
            f"subjects with prompts of equal length for {model.cfg.name}"
            + (f" among the relations {', '.join(relations)}" if relations is not None else ""),
            CircuitWarning,
            stacklevel=3,  # the caller of fact_recall (past the boundary's wrapper)
        )
    rows = [
        (c, k, a, w, {"relation": f.relation, "subject": f.subject, "object": f.object, "other": [g.subject, g.object]})
        for c, k, a, w, (f, g) in zip(fp.clean, fp.corrupted, fp.answers, fp.wrongs, fp.facts)
    ]
    desc = (
        "fact recall from the fact base: a fact's prompt vs the same template with another subject of the "
        "relation; metric logit[answer] - logit[other subject's answer]"
    )
    return _build(model, "fact_recall", desc, rows, _logit_diff("logit_diff(answer, other answer)"))


#: The tasks by name: ``TASKS[name](model, n=..., seed=...)``.
TASKS: dict[str, Callable[..., Task]] = {"ioi": ioi, "greater_than": greater_than, "fact_recall": fact_recall}


@boundary
def make_task(name: str, model: HookedGPT2, n: int = 100, seed: int = 0, **kwargs: Any) -> Task:
    """The task called ``name`` (one of :data:`TASKS`) for ``model``, ``n`` pairs drawn with ``seed``;
    ``kwargs`` go to its builder (e.g. ``templates=[0, 1]`` for IOI)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; tasks: {', '.join(TASKS)}")
    return TASKS[name](model, n=n, seed=seed, **kwargs)


# =============================================================== performance
@boundary
@dataclass
class TaskPerformance(Result):
    """How well a model does a task, on its clean and its corrupted prompts.

    - ``task``, ``model``, ``metric``: names; ``n_pairs``: the number of prompt pairs;
    - ``clean_metric`` / ``corrupted_metric``: the metric's mean over pairs on each run, with
      ``clean_metric_sem`` its standard error; a circuit's faithfulness is normalised between them;
    - ``accuracy``: the share of clean prompts the model gets right (:meth:`Task.correct`: the answer's
      logit above the wrong one's; greater-than: the most probable two-digit year is a later one),
      ``corrupted_accuracy`` the same on the corrupted prompts, scored against the clean answers;
    - ``clean_pair_metric`` / ``corrupted_pair_metric`` ``[n_pairs]``, ``correct`` ``[n_pairs]`` bool.
    """

    result_kind = "task performance"

    task: str
    model: str
    metric: str
    n_pairs: int
    clean_metric: float
    clean_metric_sem: float
    corrupted_metric: float
    accuracy: float
    corrupted_accuracy: float
    clean_pair_metric: torch.Tensor = field(repr=False)
    corrupted_pair_metric: torch.Tensor = field(repr=False)
    correct: torch.Tensor = field(repr=False)

    def summary(self) -> str:
        """One line: the task, the model, the clean and corrupted metric and the accuracy."""
        return (
            f"{self.task} on {self.model} ({self.n_pairs} pairs): {self.metric} clean {self.clean_metric:.3f} "
            f"± {self.clean_metric_sem:.3f}, corrupted {self.corrupted_metric:.3f}; accuracy {self.accuracy:.0%} "
            f"(corrupted {self.corrupted_accuracy:.0%})"
        )

    def performs(self) -> bool:
        """Whether the model performs the task reliably (:func:`performs_reliably` of this result)."""
        return performs_reliably(self.accuracy, self.clean_metric, self.clean_metric_sem, self.corrupted_metric)


@boundary
def performs_reliably(accuracy: float, clean_metric: float, clean_metric_sem: float, corrupted_metric: float) -> bool:
    """Whether a model performs a task reliably enough for a circuit of it to mean something: an ``accuracy`` of at
    least 80% on the clean prompts and a ``clean_metric`` (mean over pairs, with ``clean_metric_sem`` its standard
    error) more than two standard errors above the ``corrupted_metric``."""
    return accuracy >= 0.8 and clean_metric - 2 * clean_metric_sem > corrupted_metric


@boundary
@torch.no_grad()
def last_logits(
    model: HookedGPT2, tokens: torch.Tensor, mask: torch.Tensor | None, batch_size: int = 32
) -> torch.Tensor:
    """``[n, d_vocab]`` float: the next-token logits after each left-padded row of ``tokens`` ``[n, pos]``
    (``mask`` ``[n, pos]`` or None), run ``batch_size`` rows at a time."""
    batch_size = check_count(batch_size, "batch_size")
    out = []
    for s in range(0, len(tokens), batch_size):
        m = None if mask is None else mask[s : s + batch_size]
        out.append(model(tokens[s : s + batch_size], attention_mask=m)[:, -1].float())
    return torch.cat(out)


@boundary
def performance(model: HookedGPT2, task: Task, batch_size: int = 32) -> TaskPerformance:
    """The model's own metric and accuracy on ``task`` (a :class:`Task` built for this model), on the
    clean and the corrupted prompts; ``batch_size`` rows per forward pass."""
    if not isinstance(task, Task):
        raise TypeError(f"task must be a Task (e.g. ioi(model)), got {type(task).__name__}")
    if task.model != model.cfg.name:
        raise ValueError(f"the task {task.name} was tokenized for {task.model}, not {model.cfg.name}; rebuild it")
    clean = last_logits(model, task.clean_tokens, task.attention_mask, batch_size)
    corrupted = last_logits(model, task.corrupted_tokens, task.attention_mask, batch_size)
    mc, mk = apply_metric(task.metric, clean), apply_metric(task.metric, corrupted)
    ok, ok_k = task.correct(clean), task.correct(corrupted)
    n = len(task)
    sem = float(mc.std() / n**0.5) if n > 1 else 0.0
    return TaskPerformance(
        task.name,
        model.cfg.name,
        metric_name(task.metric),
        n,
        float(mc.mean()),
        sem,
        float(mk.mean()),
        float(ok.float().mean()),
        float(ok_k.float().mean()),
        mc,
        mk,
        ok,
    )


__all__ = [
    "GREATER_THAN_NOUNS",
    "IOI_NAMES",
    "IOI_TEMPLATES",
    "TASKS",
    "ProbMassDiff",
    "Task",
    "TaskPerformance",
    "fact_recall",
    "greater_than",
    "ioi",
    "ioi_names",
    "last_logits",
    "make_task",
    "performance",
    "performs_reliably",
    "year_tokens",
]
