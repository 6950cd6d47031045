"""Circuit discovery on a task: the model's performance, EAP and EAP-IG scores, faithfulness curves, the circuit.

For one task (:mod:`gpt2_interp.analysis.circuits.tasks`: IOI, greater-than, fact recall) the model's own
performance comes first (``n_performance`` pairs; the verdict of :mod:`.circuit_tasks`): a task the model
does not perform (or whose prompts do not fit its tokenizer) is refused unless ``force`` is set — the run raises
:class:`~gpt2_interp.experiments.base.Refused`, writes no result and ``gpt2-interp run`` exits non-zero — and a
forced run is flagged in every table. On the first ``n``
of those pairs every edge of the model's graph is scored by EAP and by EAP-IG (inputs path, ``ig_steps``
steps); for each method the exact faithfulness of its top-``k`` circuit (dangling edges pruned) is measured
for ``sizes`` edge counts from 0.1% of the edges to all of them, and the smallest circuit reaching
``target`` faithfulness is reported as a share of all edges ("needs > 10%" when it does). That circuit is
evaluated (faithfulness and completeness) and saved as JSON (``circuit_<method>.json`` in the run's folder).

On IOI the known mechanism is checked: the heads the EAP-IG circuit holds at the last position (its edges
into the logits, which are read there, and into later heads' queries) and, from a cached clean run, each
head's attention from the last position to the indirect object (IO) and to the subject (S1, S2) — a head
that writes to the logits and attends to the IO is a name-mover candidate (Wang et al. 2023) — set beside
Wang et al.'s GPT-2 small circuit.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from gpt2_interp.analysis.circuits import (
    FAITHFUL_ENOUGH,
    Circuit,
    EdgeScores,
    FaithfulnessCurve,
    circuit,
    edge_scores,
    evaluate,
    faithfulness_curve,
    faithfulness_text,
)
from gpt2_interp.analysis.circuits.tasks import TASKS, Task, make_task, performance
from gpt2_interp.experiments.base import ExperimentConfig, Refused, register
from gpt2_interp.experiments.runner import RunContext

from .circuit_tasks import verdict

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from gpt2_interp.model import HookedGPT2

#: the scoring methods compared, as :func:`edge_scores` names them
METHODS = ("eap", "eap-ig")
#: a circuit larger than this share of all edges is reported as such
LARGE = 0.10
#: the attention from the last position a head must give a name to count as attending to it
MIN_ATTENTION = 0.1
#: Wang et al. (2023), GPT-2 small (12 layers × 12 heads): the IOI circuit's head classes
WANG = {
    "name movers": ["9.6", "9.9", "10.0"],
    "negative name movers": ["10.7", "11.10"],
    "backup name movers": ["9.0", "9.7", "10.1", "10.2", "10.6", "10.10", "11.2", "11.9"],
    "S-inhibition": ["7.3", "7.9", "8.6", "8.10"],
    "induction": ["5.5", "5.8", "5.9", "6.9"],
    "duplicate token": ["0.1", "0.10", "3.0"],
    "previous token": ["2.2", "4.11"],
}


@dataclass
class Config(ExperimentConfig):
    task: str = field(default="ioi", metadata={"help": f"the task, one of {', '.join(TASKS)}"})
    n: int = field(default=16, metadata={"help": "prompt pairs the edges are scored and circuits measured on"})
    n_performance: int = field(default=100, metadata={"help": "prompt pairs the model's own performance is read on"})
    ig_steps: int = field(default=5, metadata={"help": "EAP-IG interpolation steps (inputs path)"})
    sizes: int = field(default=20, metadata={"help": "circuit sizes of each faithfulness curve"})
    target: float = field(default=0.8, metadata={"help": "the faithfulness the smallest circuit must reach"})
    top_heads: int = field(default=10, metadata={"help": "IOI: heads listed by attention to the IO"})
    force: bool = field(default=False, metadata={"help": "find a circuit even when the model does not do the task"})
    per_position: bool = field(
        default=False,
        metadata={
            "help": "score and keep (position, edge) items instead of whole edges; the prompts must align "
            "(IOI: one template, ioi_template)"
        },
    )
    ioi_template: int = field(default=0, metadata={"help": "IOI with per_position: the one template (0-14)"})

    QUICK: ClassVar[dict[str, Any]] = {"n": 4, "n_performance": 8, "ig_steps": 2, "sizes": 6, "top_heads": 4}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.task not in TASKS:
            raise ValueError(f"circuit_discovery: task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if min(self.n, self.n_performance, self.ig_steps, self.sizes, self.top_heads) < 1:
            raise ValueError("circuit_discovery: n, n_performance, ig_steps, sizes and top_heads must be >= 1")
        if self.n > self.n_performance:
            raise ValueError(f"circuit_discovery: n ({self.n}) must be <= n_performance ({self.n_performance})")
        if not 0 < self.target <= 1:
            raise ValueError(f"circuit_discovery: target must be in (0, 1], got {self.target}")


# =============================================================== performance
def _performance(model: HookedGPT2, cfg: Config) -> tuple[Task | None, dict[str, Any]]:
    """The task's pairs and the model's performance record (``fits``/``verdict``), or why it does not fit."""
    kwargs = {"templates": [cfg.ioi_template]} if cfg.per_position and cfg.task == "ioi" else {}
    try:
        task = make_task(cfg.task, model, n=cfg.n_performance, seed=cfg.seed, **kwargs)
    except ValueError as e:
        return None, {"fits": False, "reason": str(e), "verdict": "does not fit the tokenizer"}
    if cfg.per_position and not task.aligned:
        reason = f"per_position needs prompts of one token length; {cfg.task}'s pairs differ in length"
        return None, {"fits": False, "reason": reason, "verdict": "prompts not aligned"}
    perf = performance(model, task)
    rec: dict[str, Any] = {
        "fits": True,
        "description": task.description,
        "metric": perf.metric,
        "pairs": perf.n_pairs,
        "clean_metric": perf.clean_metric,
        "clean_metric_sem": perf.clean_metric_sem,
        "corrupted_metric": perf.corrupted_metric,
        "accuracy": perf.accuracy,
        "corrupted_accuracy": perf.corrupted_accuracy,
    }
    rec["verdict"] = verdict(rec)
    return task, rec


# =============================================================== circuits
def smallest_record(curve: FaithfulnessCurve, i: int, target: float) -> dict[str, Any]:
    """Method ``i``'s smallest circuit reaching ``target``: the requested size, the edges kept, their
    share of all edges and whether it needs more than :data:`LARGE` of them (None values: no size does)."""
    f, kept = curve.faithfulness[i], curve.kept[i]
    ok = (f >= target).nonzero()[:, 0].tolist()
    best = int(f.argmax())
    rec: dict[str, Any] = {"best_faithfulness": float(f[best]), "best_edges": int(kept[best])}
    if not ok:
        return rec | {"size": None, "edges": None, "share": None, "needs_more_than_10pct": None}
    j = min(ok, key=lambda j: (int(kept[j]), j))
    share = int(kept[j]) / curve.total_edges
    return rec | {
        "size": curve.sizes[j],
        "edges": int(kept[j]),
        "share": share,
        "faithfulness": float(f[j]),
        "needs_more_than_10pct": share > LARGE,
    }


def share_text(rec: dict[str, Any], target: float, unit: str = "edges") -> str:
    """How a table states a method's smallest faithful circuit (``unit``: what it counts)."""
    if rec["share"] is None:
        return (
            f"not reached (best {rec['best_faithfulness']:.2f} at {rec['best_edges']} {unit}): "
            f"no tested size reaches {target:.0%}"
        )
    s = f"{rec['edges']} {unit}, {100 * rec['share']:.2f}% of all (faithfulness {rec['faithfulness']:.3f})"
    return f"needs > 10%: {s}" if rec["needs_more_than_10pct"] else s


# =============================================================== IOI mechanism
def _positions(tokens: torch.Tensor, ids: torch.Tensor, last: bool) -> torch.Tensor:
    """``[n]``: per row of ``tokens`` ``[n, pos]`` the first (or ``last``) position holding that row's id."""
    hit = tokens == ids[:, None]
    if not bool(hit.any(1).all()):
        raise ValueError("a name token is missing from its prompt")
    pos = torch.arange(tokens.shape[1]).expand_as(tokens)
    return torch.where(hit, pos, -1).amax(1) if last else torch.where(hit, pos, tokens.shape[1]).amin(1)


@torch.no_grad()
def ioi_attention(model: HookedGPT2, task: Task) -> dict[str, torch.Tensor]:
    """Mean attention over pairs from the last position of the clean prompts to the IO, S1 and S2
    tokens, per head: ``{"io"|"s1"|"s2": [n_layer, n_head]}``."""
    tokens, mask = task.clean_tokens, task.attention_mask
    io = _positions(tokens, task.answers, last=False)
    s1, s2 = _positions(tokens, task.wrongs, last=False), _positions(tokens, task.wrongs, last=True)
    names = [f"blocks.{l}.attn.hook_pattern" for l in range(model.cfg.n_layer)]
    _, cache = model.run_with_cache(tokens, attention_mask=mask, names_filter=names, return_type=None)
    rows = torch.arange(len(task))
    out = {}
    for key, where in (("io", io), ("s1", s1), ("s2", s2)):
        per = [cache[n][:, :, -1].float().cpu()[rows, :, where].mean(0) for n in names]  # [n_head] each
        out[key] = torch.stack(per)
    return out


def _head(name: str) -> tuple[int, int] | None:
    """``(layer, head)`` of a head node ``a{l}.h{h}``; None for other nodes."""
    if not name.startswith("a"):
        return None
    l, h = name[1:].split(".h")
    return int(l), int(h)


def _role(logit: float | None, io: float, s: float) -> str:
    """A head's IOI role from its head → logits score (None: no such edge in the circuit) and its
    attention from the last position to the IO (``io``) and to both S tokens (``s``). A score is
    M(patched) − M(clean): patching a head that pushes the IO up lowers the metric (negative score)."""
    if logit is None:
        return "feeds later queries"
    if io >= MIN_ATTENTION and io > s:
        return "name mover" if logit < 0 else "negative name mover"
    if s >= MIN_ATTENTION and s > io:
        return "writes to logits, attends to S"
    return "writes to logits, attends elsewhere"


def ioi_mechanism(model: HookedGPT2, task: Task, circ: Circuit, top_heads: int) -> dict[str, Any]:
    """The heads ``circ`` holds at the last position, with their attention to IO vs S, and the
    ``top_heads`` heads of the whole model that attend most to the IO from the last position."""
    att = ioi_attention(model, task)
    L, H = model.cfg.n_layer, model.cfg.n_head
    to_logits: dict[tuple[int, int], float] = {}
    into_q: dict[tuple[int, int], list[tuple[str, float]]] = {}
    for e, s in zip(circ.edges, circ.scores):
        sender, receiver = e.split("->")
        hs = _head(sender)
        if hs is None:
            continue
        if receiver == "logits":
            to_logits[hs] = s
        elif receiver.endswith("<q>"):
            into_q.setdefault(hs, []).append((receiver.split("<")[0], s))

    def row(lh: tuple[int, int]) -> dict[str, Any]:
        l, h = lh
        io, s1, s2 = (float(att[k][l, h]) for k in ("io", "s1", "s2"))
        logit = to_logits.get(lh)
        return {
            "head": f"{l}.{h}",
            "depth": (l + 0.5) / L,
            "attn_io": io,
            "attn_s1": s1,
            "attn_s2": s2,
            "to_logits_score": logit,
            "into_q_of": [r for r, _ in sorted(into_q.get(lh, []), key=lambda x: -abs(x[1]))][:5],
            # a score is M(patched) - M(clean): patching a head that pushes the IO up lowers the metric
            "role": _role(logit, io, s1 + s2),
        }

    held = sorted(set(to_logits) | set(into_q))
    heads = sorted((row(lh) for lh in held), key=lambda r: -abs(r["to_logits_score"] or 0.0))
    flat = att["io"].flatten()
    top = flat.argsort(descending=True)[:top_heads].tolist()
    ranked = [{**row((i // H, i % H)), "in_circuit": (i // H, i % H) in set(held)} for i in top]
    movers = [r for r in heads if r["role"] == "name mover"]
    return {
        "circuit_method": circ.method,
        "circuit_edges": len(circ.edges),
        "heads": heads,
        "top_io_heads": ranked,
        "name_movers": [r["head"] for r in movers],
        "negative_name_movers": [r["head"] for r in heads if r["role"] == "negative name mover"],
        "n_layer": L,
        "n_head": H,
        "wang": WANG,
        "finding": _ioi_finding(heads, movers, ranked, L),
    }


def _with_roles(mech: dict[str, Any]) -> dict[str, Any]:
    """``mech`` (the data of :func:`ioi_mechanism`) with every head's role and the finding derived
    again from the measured scores and attention (so that a saved result renders with this code)."""
    role = lambda r: _role(r["to_logits_score"], r["attn_io"], r["attn_s1"] + r["attn_s2"])  # noqa: E731
    heads = [r | {"role": role(r)} for r in mech["heads"]]
    ranked = [r | {"role": role(r)} for r in mech["top_io_heads"]]
    movers = [r for r in heads if r["role"] == "name mover"]
    return mech | {
        "heads": heads,
        "top_io_heads": ranked,
        "name_movers": [r["head"] for r in movers],
        "negative_name_movers": [r["head"] for r in heads if r["role"] == "negative name mover"],
        "finding": _ioi_finding(heads, movers, ranked, mech["n_layer"]),
    }


def _ioi_finding(heads: list[dict], movers: list[dict], ranked: list[dict], L: int) -> str:
    """The comparison with Wang et al.'s GPT-2 small circuit, in words, from the measured heads."""
    logits_heads = [r for r in heads if r["to_logits_score"] is not None]
    if not logits_heads:
        return "The circuit holds no head → logits edge: no name-mover candidate to compare with Wang et al."
    depths = ", ".join(f"{r['head']} ({r['depth']:.0%} deep)" for r in movers) or "none"
    attend_s = [r["head"] for r in logits_heads if r["role"] == "writes to logits, attends to S"]
    q_feeders = {r["head"] for r in heads if r["into_q_of"]}
    mover_names = {r["head"] for r in movers}
    feed_movers = sorted(
        r["head"] for r in heads if any(q.replace("a", "", 1).replace(".h", ".") in mover_names for q in r["into_q_of"])
    )
    in_top = sum(r["in_circuit"] for r in ranked)
    others = f" (heads feeding other heads' queries: {', '.join(sorted(q_feeders))})" if q_feeders else ""
    return (
        f"{len(logits_heads)} heads of the circuit write to the logits; {len(movers)} of them attend from the last "
        f"position to the IO (≥ {MIN_ATTENTION}, more than to both S tokens together) and raise "
        f"logit[IO] − logit[S] (name-mover candidates): "
        f"{depths}. Wang et al.'s GPT-2 small name movers (9.6, 9.9, 10.0) sit at 79–88% depth. "
        f"Heads writing to the logits that attend more to S: {', '.join(attend_s) or 'none'}. "
        f"Heads of the circuit feeding a name mover's query (the S-inhibition role, 7.3/7.9/8.6/8.10 in GPT-2 "
        f"small; q edges are summed over positions): {', '.join(feed_movers) or 'none'}{others}. "
        f"Of the {len(ranked)} heads of the whole model attending most to the IO from the last position, "
        f"{in_top} are in the circuit."
    )


# =============================================================== run
@register("circuit_discovery", Config, tables=lambda d: tables(d), figures=lambda d: figures(d))
def run(model: HookedGPT2, cfg: Config, ctx: RunContext) -> dict:
    data: dict[str, Any] = {"model": model.cfg.name, "task": cfg.task, "seed": cfg.seed}
    full, perf = _performance(model, cfg)
    data["performance"] = perf
    if full is None:
        raise Refused(f"circuit_discovery: {cfg.task} on {model.cfg.name}: {perf['reason']}")
    if perf["verdict"] != "performs it" and not cfg.force:
        raise Refused(
            f"circuit_discovery: {model.cfg.name} does not perform {cfg.task} ({_perf_line(perf).replace('**', '')}): "
            "a circuit of a task the model does not do means nothing, so none is looked for (--set force=true finds "
            "one anyway, flagged)"
        )
    data["flag"] = None if perf["verdict"] == "performs it" else f"forced: the model {perf['verdict']}"
    task = full.subset(range(cfg.n))
    args = (model, task.clean, task.corrupted, task.metric)
    scores, seconds = [], {}
    for m in METHODS:
        t0 = time.perf_counter()
        scores.append(
            edge_scores(*args, method=m, ig_steps=cfg.ig_steps, per_position=cfg.per_position, progress=ctx.progress)  # type: ignore[arg-type]
        )
        seconds[m] = time.perf_counter() - t0
    t0 = time.perf_counter()
    curve = faithfulness_curve(model, scores, *args[1:], sizes=cfg.sizes)
    seconds["faithfulness_curve"] = time.perf_counter() - t0
    data |= {
        "pairs": len(task),
        "per_position": cfg.per_position,
        "ig_steps": cfg.ig_steps,
        "total_edges": curve.total_edges,
        "clean_metric": curve.clean_metric,
        "corrupted_metric": curve.corrupted_metric,
        "curve": {
            "sizes": curve.sizes,
            "methods": curve.methods,
            "faithfulness": curve.faithfulness,
            "kept": curve.kept,
        },
        "target": cfg.target,
        "seconds": seconds,
        "top_edges": {m: _top(s, 15) for m, s in zip(METHODS, scores)},
        "smallest": {},
        "circuits": {},
    }
    chosen = {}
    for i, (m, s) in enumerate(zip(METHODS, scores)):
        rec = smallest_record(curve, i, cfg.target)
        data["smallest"][m] = rec
        if rec["size"] is None:
            continue
        c = evaluate(model, circuit(s, top=rec["size"]), task.clean, task.corrupted, task.metric)
        chosen[m] = c
        path = None if ctx.out_dir is None else c.save(ctx.out_dir / f"circuit_{m}.json")
        data["circuits"][m] = {
            "edges": len(c.edges),
            "share": c.share,
            "faithfulness": c.faithfulness,
            "completeness": c.completeness,
            "nodes": len(c.nodes()),
            "whole_edges": len(c.collapsed().edges),
            "file": None if path is None else path.name,
            "plot": {"edges": c.collapsed().edges[:300], "scores": c.collapsed().scores[:300]},
            "n_layer": c.n_layer,
            "n_head": c.n_head,
            "n_kv": c.n_kv,
        }
    if cfg.task == "ioi":
        best = chosen.get("eap-ig") or chosen.get("eap")
        if best is not None and best.per_position:  # the heads it holds at the last position
            best = _at_last_position(best)
        data["ioi_mechanism"] = None if best is None else ioi_mechanism(model, task, best, cfg.top_heads)
    return data


def _at_last_position(c: Circuit) -> Circuit:
    """A per-position circuit's items at the last position, as a circuit of whole edges."""
    assert c.positions is not None and c.n_pos is not None
    at = [(e, v) for e, p, v in zip(c.edges, c.positions, c.scores) if p == c.n_pos - 1]
    return dataclasses.replace(
        c, edges=[e for e, _ in at], scores=[v for _, v in at], positions=None, n_pos=None, _mask=None
    )


def _top(scores: EdgeScores, k: int) -> list[tuple[str, float]]:
    """The ``k`` largest-``|score|`` edges (per position: ``edge@position`` items)."""
    if not scores.per_position:
        return scores.top(k)
    s = scores.scores.float().reshape(-1)
    E = scores.scores.shape[1]
    idx = s.abs().nan_to_num(-1.0).argsort(descending=True)[:k].tolist()
    return [(f"{scores.edges[i % E]}@{i // E}", float(s[i])) for i in idx]


# =============================================================== rendering
def _perf_line(p: dict[str, Any]) -> str:
    if not p["fits"]:
        return f"does not fit: {p['reason']}"
    return (
        f"{p['metric']} clean {p['clean_metric']:.3f} ± {p['clean_metric_sem']:.3f}, corrupted "
        f"{p['corrupted_metric']:.3f}; accuracy {p['accuracy']:.0%} (corrupted {p['corrupted_accuracy']:.0%}) "
        f"over {p['pairs']} pairs: **{p['verdict']}**"
    )


def tables(data: dict) -> dict[str, str]:
    md = [
        f"# Circuit discovery: {data['task']} on {data['model']}",
        "",
        f"Performance: {_perf_line(data['performance'])}",
    ]
    if "refused" in data:  # a result saved before refusals raised
        return {"circuit_discovery": "\n".join([*md, "", f"Refused: {data['refused']}"])}
    if data.get("flag"):
        md += ["", f"**Flag: {data['flag']}.** The circuit below explains a behaviour the model does not have."]
    s = data["seconds"]
    unit = "(position, edge) items" if data.get("per_position") else "edges"
    md += [
        "",
        f"{data['pairs']} pairs, {data['total_edges']} {unit}; clean metric {data['clean_metric']:.3f}, corrupted "
        f"{data['corrupted_metric']:.3f}. EAP {s['eap']:.0f} s, EAP-IG ({data['ig_steps']} steps, inputs path) "
        f"{s['eap-ig']:.0f} s, faithfulness curves ({len(data['curve']['sizes'])} sizes × {len(METHODS)} methods, "
        f"exact) {s['faithfulness_curve']:.0f} s (wall clock on a shared machine).",
        "",
        f"## Smallest circuit with faithfulness ≥ {data['target']:.0%}",
        "",
        "| method | smallest circuit | faithfulness / completeness of the saved circuit | file |",
        "|---|---|---|---|",
    ]
    for m in METHODS:
        c = data["circuits"].get(m)
        fc = "–" if c is None else f"{c['faithfulness']:.3f} / {c['completeness']:.3f}"
        if c is not None and c["faithfulness"] < FAITHFUL_ENOUGH:
            fc += f" (below {FAITHFUL_ENOUGH:g}: not faithful)"
        file = "–" if c is None else c["file"]
        md.append(f"| {m} | {share_text(data['smallest'][m], data['target'], unit)} | {fc} | {file} |")
    cv = data["curve"]
    md += ["", "## Faithfulness curves (exact; edges kept after pruning in brackets)", ""]
    md += ["| top edges | " + " | ".join(cv["methods"]) + " |", "|---|" + "---|" * len(cv["methods"])]
    for j, k in enumerate(cv["sizes"]):
        cells = [f"{cv['faithfulness'][i][j]:.3f} ({cv['kept'][i][j]})" for i in range(len(cv["methods"]))]
        md.append(f"| {k} | " + " | ".join(cells) + " |")
    md += ["", "## Top edges", "", "| rank | " + " | ".join(METHODS) + " |", "|---|" + "---|" * len(METHODS)]
    for r in range(len(data["top_edges"][METHODS[0]])):
        md.append(
            f"| {r + 1} | "
            + " | ".join(f"{e} ({v:+.3g})" for e, v in (data["top_edges"][m][r] for m in METHODS))
            + " |"
        )
    mech = data.get("ioi_mechanism")
    if mech:
        mech = _with_roles(mech)
        md += [
            "",
            f"## IOI mechanism ({mech['circuit_method']} circuit, {mech['circuit_edges']} edges)",
            "",
            mech["finding"],
            "",
            "Attention: mean over pairs from the last position of the clean prompt. Score of the head → logits edge: "
            "M(patched) − M(clean), negative when the head raises logit[IO] − logit[S].",
            "",
            "| head | depth | attn → IO | attn → S1 | attn → S2 | head → logits score | into queries of | role |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in mech["heads"][:25]:
            lg = "–" if r["to_logits_score"] is None else f"{r['to_logits_score']:+.3g}"
            md.append(
                f"| {r['head']} | {r['depth']:.0%} | {r['attn_io']:.2f} | {r['attn_s1']:.2f} | {r['attn_s2']:.2f} "
                f"| {lg} | {', '.join(r['into_q_of']) or '–'} | {r['role']} |"
            )
        md += [
            "",
            "Heads of the whole model attending most to the IO from the last position "
            f"(top {len(mech['top_io_heads'])}):",
            "",
            "| head | attn → IO | attn → S1 + S2 | in the circuit |",
            "|---|---|---|---|",
        ]
        md += [
            f"| {r['head']} | {r['attn_io']:.2f} | {r['attn_s1'] + r['attn_s2']:.2f} "
            f"| {'yes' if r['in_circuit'] else 'no'} |"
            for r in mech["top_io_heads"]
        ]
        md += [
            "",
            "Wang et al. (2023), GPT-2 small: "
            + "; ".join(f"{k} {', '.join(v)}" for k, v in mech["wang"].items())
            + ".",
        ]
    return {"circuit_discovery": "\n".join(md)}


def figures(data: dict) -> dict[str, Figure]:
    from gpt2_interp.plots.circuits import plot_circuit, plot_faithfulness

    if "curve" not in data:
        return {}
    cv = data["curve"]
    curve = FaithfulnessCurve(
        torch.tensor(cv["faithfulness"]),
        cv["sizes"],
        torch.tensor(cv["kept"]),
        cv["methods"],
        data["total_edges"],
        data["performance"]["metric"],
        data["clean_metric"],
        data["corrupted_metric"],
    )
    out = {
        "faithfulness": plot_faithfulness(
            curve,
            target=data["target"],
            title=f"{data['task']} on {data['model']}: faithfulness ({data['pairs']} pairs)",
        )
    }
    for m, c in data["circuits"].items():
        circ = Circuit(
            c["plot"]["edges"],
            c["plot"]["scores"],
            m,
            curve.metric,
            c["n_layer"],
            c["n_head"],
            c["n_kv"],
            data["total_edges"],
        )
        shown = len(c["plot"]["edges"])
        out[f"circuit_{m}"] = plot_circuit(
            circ,
            title=f"{data['task']} on {data['model']}, {m}: {c['edges']} edges ({100 * c['share']:.2f}%), "
            f"{faithfulness_text(c['faithfulness'], 2)[2:]}"
            + (f"; largest {shown} drawn" if shown < c["edges"] else ""),
        )
    return out
