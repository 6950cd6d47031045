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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ..core import distributed
from ..core.result import Result
from ..analysis.tokens import target_ids
from ..core.progress import progress_bar
from ..model.fingerprint import tensor_digest, weights_fingerprint
from .edit import Edit, Request, undo_all
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


def case_scores(model: "HookedGPT2", cases: Sequence[CounterfactCase], batch_size: int = 64) -> list[dict[str, Any]]:
    """Efficacy/paraphrase/neighbourhood scores and magnitudes of each case on the model as it is."""
    pairs = [(i, *row) for i, c in enumerate(cases) for row in _case_pairs(c)]
    lp = target_logprobs(model, [p for _, _, p, _ in pairs], [t for *_, t in pairs], batch_size)
    per: list[dict[str, list[float]]] = [{} for _ in cases]
    for (i, part, _, _), x in zip(pairs, lp.tolist()):
        per[i].setdefault(part, []).append(x)
    out = []
    for c, d in zip(cases, per):
        row: dict[str, Any] = {"p_new": math.exp(d["rewrite"][0])}
        if not c.target_true:
            out.append(row)
            continue
        for part, key, sign in (("rewrite", "e", 1), ("paraphrase", "p", 1), ("neighbourhood", "n", -1)):
            vals = d.get(part, [])
            new, true = vals[0::2], vals[1::2]
            if not new:
                row[f"{key}s"] = row[f"{key}m"] = None
                continue
            row[f"{key}s"] = sum((a > b) if sign > 0 else (b > a) for a, b in zip(new, true)) / len(new)
            row[f"{key}m"] = sum(sign * (math.exp(a) - math.exp(b)) for a, b in zip(new, true)) / len(new)
        row["p_true"] = math.exp(d["rewrite"][1])
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
                          stop_at_eos=False, suppress_eos=suppress_eos)


@torch.no_grad()
def _next_logprobs(model: "HookedGPT2", prompts: Sequence[str]) -> torch.Tensor:
    return model.last_logits(list(prompts)).float().log_softmax(-1)


def _kl(pre: torch.Tensor, post: torch.Tensor) -> float:
    """Mean over rows of KL(pre ‖ post) (log-probs in)."""
    return float((pre.exp() * (pre - post)).sum(-1).mean())


# ---------------------------------------------------------------- the result
SCORES = ("es", "em", "ps", "pm", "ns", "nm")


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


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Means of every score over ``rows`` (cases without a score are skipped) + S, before and after."""
    out: dict[str, Any] = {"n": len(rows)}
    for stage in ("pre", "post"):
        for k in SCORES:
            out[f"{k}_{stage}"] = _mean([r.get(f"{k}_{stage}") for r in rows])
        out[f"S_{stage}"] = harmonic_score(*(out[f"{k}_{stage}"] for k in ("es", "ps", "ns")))
    out["n_neighbourhood"] = sum(r.get("ns_post") is not None for r in rows)
    for k in ("fluency_pre", "fluency_post", "kl_drift", "edit_seconds"):
        out[k] = _mean([r.get(k) for r in rows])
    times = [r["edit_seconds"] for r in rows if r.get("edit_seconds") is not None]
    out["edit_seconds_median"] = statistics.median(times) if times else None
    return out


@dataclass
class EditEvaluation(Result):
    """Per-case rows, summaries over all cases and the known subset, and (sequential) the decay curve."""

    method: str
    sequential: bool
    layer: int | None
    rows: list[dict[str, Any]]
    summary: dict[str, dict[str, Any]]  # {"all": …, "known": …}
    curve: list[dict[str, Any]] | None = None  # sequential: scores after k edits
    hparams: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    restored_exactly: bool = True

    def table(self) -> str:
        """The summary as a text table (scores in %)."""
        lines = [f"{self.method} on {self.summary['all']['n']} requests "
                 f"({'sequential' if self.sequential else 'one at a time'}), layer {self.layer}; "
                 f"the unedited model knows {self.summary['known']['n']} of the facts"]
        head = f"{'subset':8} {'stage':5} " + " ".join(f"{k:>7}" for k in ("ES", "EM", "PS", "PM", "NS", "NM", "S"))
        lines += [head, "-" * len(head)]
        for subset in ("all", "known"):
            s = self.summary[subset]
            for stage in ("pre", "post"):
                vals = [s.get(f"{k}_{stage}") for k in (*SCORES, "S")]
                lines.append(f"{subset:8} {stage:5} " + " ".join(
                    f"{100 * v:7.1f}" if v is not None else f"{'–':>7}" for v in vals))
        s = self.summary["all"]
        fmt = lambda x, f: format(x, f) if x is not None else "–"  # noqa: E731
        lines.append(f"fluency (n-gram entropy) {fmt(s['fluency_pre'], '.3f')} → {fmt(s['fluency_post'], '.3f')}; "
                     f"KL drift on unrelated prompts {fmt(s['kl_drift'], '.2e')}; neighbourhood cases "
                     f"{s['n_neighbourhood']}; edit time {fmt(s['edit_seconds'], '.2f')} s mean, "
                     f"{fmt(s['edit_seconds_median'], '.2f')} s median; weights restored bit-exactly: "
                     f"{self.restored_exactly}")
        if self.curve:
            pct = lambda x: f"{100 * x:.0f}" if x is not None else "–"  # noqa: E731
            lines.append("after k edits:  " + "  ".join(
                f"k={c['n_edits']}: ES {pct(c['es'])} PS {pct(c['ps'])} NS {pct(c['ns'])}" for c in self.curve))
        return "\n".join(lines)

    def plot(self, **kwargs: Any):
        from ..plots.editing import plot_edit_evaluation

        return plot_edit_evaluation(self, **kwargs)


# ---------------------------------------------------------------- the loop
def evaluate_edits(model: "HookedGPT2", requests: Sequence[Any] | int, *args: Any, group: Any = None,
                   **kwargs: Any) -> EditEvaluation:
    """Edit each request with ROME and score it: :func:`evaluate_edits_local`'s arguments.

    Distributed (an initialised process group, or ``group``): the ranks compute the key statistics
    together, then each edits and scores its share of the requests on its own copy of the model;
    every rank returns all rows in request order (those of one process, up to float rounding of
    differently batched prompts) and the summaries over them. ``sequential=True`` is not sharded
    (each rank runs it whole)."""
    if not distributed.is_distributed(group):
        return evaluate_edits_local(model, requests, *args, **kwargs)
    a = inspect.signature(evaluate_edits_local).bind(model, requests, *args, **kwargs)
    a.apply_defaults()
    opts = dict(a.arguments)
    hparams = opts.pop("hparams")
    if opts["sequential"]:
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
    known = [r for r in rows if r["known"]]
    return EditEvaluation(opts["method"], False, fixed_layer, rows, {"all": summarize(rows), "known": summarize(known)},
                          None, dict(vars(hp)), time.perf_counter() - t0, restored)


def evaluate_edits_local(
    model: "HookedGPT2",
    requests: Sequence[Any] | int,
    method: str = "rome",
    sequential: bool = False,
    layer: int | str | None = None,
    stats: KeyStats | None = None,
    fluency_tokens: int = 40,
    n_unrelated: int = 30,
    checkpoints: Sequence[int] | None = None,
    batch_size: int = 64,
    progress: bool = True,
    seed: int = 0,
    **hparams: Any,
) -> EditEvaluation:
    """Edit each request with ROME and score it (see module doc).

    ``requests``: CounterFact cases (:func:`counterfact_requests`), Requests/dicts, or an int n
    (that many cases from the embedded fact base). One at a time (default), each edit is undone
    bit-exactly before the next (checked). ``sequential=True`` lets the edits accumulate and
    records the scores of the edits so far after ``checkpoints`` edits; all are undone at the end.
    """
    if method != "rome":
        raise ValueError(f"method must be 'rome' (the only editor so far), got {method!r}")
    t_start = time.perf_counter()
    cases = counterfact_requests(n=requests, seed=seed) if isinstance(requests, int) else \
        [CounterfactCase.of(r, i) for i, r in enumerate(requests)]
    if not cases:
        raise ValueError("no requests to evaluate")
    hp = hparams_for(model, **hparams)
    fixed_layer = None if layer == "auto" else (default_layer(model) if layer is None else layer)
    stats_by_layer: dict[int, KeyStats] = {}
    if fixed_layer is not None:
        stats_by_layer[fixed_layer] = stats or key_second_moment(model, fixed_layer, corpus=hp.corpus,
                                                                 n_samples=hp.n_samples, progress=progress)
    base_fp = weights_fingerprint(model)

    # ---- the unedited model, batched
    pre = case_scores(model, cases, batch_size)
    top1 = torch.cat([model.last_logits([c.request.text for c in cases[s : s + batch_size]]).argmax(-1).cpu()
                      for s in range(0, len(cases), batch_size)])
    gen_prompts = [[c.request.text] + c.paraphrases[:2] for c in cases]
    flat = [p for g in gen_prompts for p in g]
    texts_pre = [t for s in range(0, len(flat), batch_size)
                 for t in greedy_continuations(model, flat[s : s + batch_size], fluency_tokens)]
    fluency_pre, i = [], 0
    for g in gen_prompts:
        fluency_pre.append(n_gram_entropy(texts_pre[i : i + len(g)]))
        i += len(g)
    unrel = unrelated_prompts(n_unrelated)
    unrel_pre = _next_logprobs(model, [p for *_, p in unrel])

    def unrelated_for(c: CounterfactCase) -> list[int]:
        return [j for j, (rel, subj, _) in enumerate(unrel) if rel != c.relation and subj != c.request.subject]

    rows: list[dict[str, Any]] = []
    for c, s, t1, fl in zip(cases, pre, top1.tolist(), fluency_pre):
        known = bool(c.target_true) and t1 == target_ids(model, c.target_true)[0]
        rows.append({"case_id": c.case_id, "relation": c.relation, "subject": c.request.subject,
                     "prompt": c.request.text, "target_new": c.request.target, "target_true": c.target_true,
                     "known": known, **{f"{k}_pre": s.get(k) for k in SCORES},
                     "p_new_pre": s.get("p_new"), "p_true_pre": s.get("p_true"), "fluency_pre": fl})

    curve: list[dict[str, Any]] = []
    restored = True
    marks = sorted({k for k in (checkpoints or (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)) if k <= len(cases)}
                   | {len(cases)})
    bar = progress_bar(cases, desc="editing", enabled=progress)
    for n_done, (c, row) in enumerate(zip(bar, rows), start=1):
        lay = fixed_layer
        t0 = time.perf_counter()
        edit = compute_edit(model, c.request, layer=layer if lay is None else lay,
                            stats=stats_by_layer.get(lay) if lay is not None else None, **hparams)
        row["edit_seconds"] = time.perf_counter() - t0
        row["layer"] = edit.layer
        W = model.blocks[edit.layer].mlp.W_out
        before = tensor_digest(W) if not sequential else None
        edit.apply(model, verify=False)
        if sequential:
            if n_done in marks:
                curve.append(_curve_point(model, cases[:n_done], unrel, unrel_pre, batch_size))
            continue
        try:
            _score_after(model, c, row, unrelated_for(c), unrel, unrel_pre, fluency_tokens, batch_size)
        finally:
            edit.undo(model)
        ok = tensor_digest(W) == before
        restored &= ok
        if not ok:  # pragma: no cover - undo is exact by construction
            raise RuntimeError(f"undoing the edit of case {c.case_id} did not restore W_out bit-exactly")
    if sequential:
        post = case_scores(model, cases, batch_size)
        for c, row, s in zip(cases, rows, post):
            row.update({f"{k}_post": s.get(k) for k in SCORES})
            row.update(p_new_post=s.get("p_new"), p_true_post=s.get("p_true"))
        for c, row in zip(cases, rows):
            _fluency_drift(model, c, row, unrelated_for(c), unrel, unrel_pre, fluency_tokens)
        undo_all(model)
        restored = weights_fingerprint(model) == base_fp
        if not restored:  # pragma: no cover
            raise RuntimeError("undoing the sequential edits did not restore the weights bit-exactly")
    known = [r for r in rows if r["known"]]
    return EditEvaluation(method, sequential, fixed_layer, rows, {"all": summarize(rows), "known": summarize(known)},
                          curve or None, {k: v for k, v in vars(hp).items()}, time.perf_counter() - t_start, restored)


def _score_after(model: "HookedGPT2", c: CounterfactCase, row: dict[str, Any], unrel_idx: list[int],
                 unrel: list, unrel_pre: torch.Tensor, fluency_tokens: int, batch_size: int) -> None:
    s = case_scores(model, [c], batch_size)[0]
    row.update({f"{k}_post": s.get(k) for k in SCORES})
    row.update(p_new_post=s.get("p_new"), p_true_post=s.get("p_true"))
    _fluency_drift(model, c, row, unrel_idx, unrel, unrel_pre, fluency_tokens)


def _fluency_drift(model: "HookedGPT2", c: CounterfactCase, row: dict[str, Any], unrel_idx: list[int],
                   unrel: list, unrel_pre: torch.Tensor, fluency_tokens: int) -> None:
    row["fluency_post"] = n_gram_entropy(greedy_continuations(model, [c.request.text] + c.paraphrases[:2],
                                                              fluency_tokens))
    if unrel_idx:
        post = _next_logprobs(model, [unrel[j][2] for j in unrel_idx])
        row["kl_drift"] = _kl(unrel_pre[unrel_idx], post)


def _curve_point(model: "HookedGPT2", cases: Sequence[CounterfactCase], unrel: list, unrel_pre: torch.Tensor,
                 batch_size: int) -> dict[str, Any]:
    s = case_scores(model, cases, batch_size)
    point = {"n_edits": len(cases), **{k: _mean([r.get(k) for r in s]) for k in SCORES}}
    point["S"] = harmonic_score(point["es"], point["ps"], point["ns"])
    point["kl_drift"] = _kl(unrel_pre, _next_logprobs(model, [p for *_, p in unrel]))
    return point


# ---------------------------------------------------------------- before / after top-k
__all__ = ["CounterfactCase", "counterfact_requests", "evaluate_edits", "evaluate_edits_local", "EditEvaluation", "case_scores",
           "target_logprobs", "n_gram_entropy", "greedy_continuations", "summarize",
           "unrelated_prompts"]
