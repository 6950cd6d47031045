"""``gpt2-interp demo``: the whole story on one fact, written to a report folder.

1. the model and its parameter table; 2. greedy generation from a fact prompt;
3. the logit lens on that prompt; 4. the top MLP sub-updates at the last position;
5. a causal trace (hidden / MLP / attention); 6. a ROME edit of the fact to a
counterfactual object (layer from the trace), verified on the rewrite prompt, two
held-out paraphrases, two neighbourhood prompts and the subject's other facts, then undone with a bit-exact
check.
Writes ``report.md``, PNG figures, ``results.json`` and ``index.html`` (the same story with interactive
views: attention patterns, logit lens, causal traces, the edit's before/after top-k; Plotly, a dependency of
the package, draws them) — and nothing else but a small manifest
(``.gpt2-interp-demo.json``, the sha256 of each file it wrote). Re-running into the same folder
refreshes those files; a file of the same name that the demo did not write (or that was changed
since) is overwritten only with ``force=True``; nothing else in the folder is ever touched.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import torch

from .analysis.tokens import target_ids
from .core.checks import check_count
from .core.result import to_jsonable
from .core.tables import markdown_rule

# (relation, subject, counterfactual object): the first one the model knows is used.
CANDIDATES = [
    ("city_country", "Munich", "Italy"),
    ("city_country", "Lyon", "Spain"),
    ("city_country", "Osaka", "China"),
    ("city_country", "Milan", "France"),
    ("country_capital", "France", "Rome"),
]


OUTPUTS = ("report.md", "results.json", "logit_lens.png", "causal_trace.png", "index.html")
MANIFEST = ".gpt2-interp-demo.json"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _manifest(out: Path) -> dict[str, str]:
    """``{file name: sha256}`` of the files a previous demo run wrote into ``out`` (empty if none)."""
    try:
        data = json.loads((out / MANIFEST).read_text())
        return {str(k): str(v) for k, v in data.get("files", {}).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def prepare_output(out: str | Path, force: bool = False) -> Path:
    """Check that the demo may write its files into ``out`` (created if missing) and return it.

    Files the demo wrote before (recorded in the manifest, unchanged since) are refreshed freely;
    any other existing file with one of the demo's names is overwritten only with ``force``.
    Nothing is deleted."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} is a file, not a folder; choose a folder for the report")
    ours = _manifest(out) if out.is_dir() else {}
    foreign = [n for n in OUTPUTS if (out / n).exists() and ours.get(n) != _sha256(out / n)]
    if foreign and not force:
        raise FileExistsError(
            f"{out} already holds {', '.join(foreign)}, which this demo did not write (or which changed since); "
            f"choose another --out, or pass --force to overwrite just those files (nothing else in {out} is touched)"
        )
    out.mkdir(parents=True, exist_ok=True)
    return out


def _write_manifest(out: Path) -> None:
    files = {n: _sha256(out / n) for n in OUTPUTS if (out / n).exists()}
    (out / MANIFEST).write_text(json.dumps({"written_by": "gpt2-interp demo", "files": files}, indent=1) + "\n")


def _step(i: int, text: str, t0: float) -> None:
    print(f"[{i}/6] {text}  ({time.time() - t0:.0f} s)", flush=True)


def pick_fact(model, fb) -> tuple[Any, str]:
    """The first candidate fact the model answers correctly (top-1), with its counterfactual target."""
    facts = {(f.relation, f.subject): f for f in fb.facts()}
    for relation, subject, new in CANDIDATES:
        fact = facts.get((relation, subject))
        if fact and int(model.last_logits(fb.prompts(fact)[0])[0].argmax()) == target_ids(model, fact.target)[0]:
            return fact, " " + new
    fact = fb.facts("city_country")[0]
    return fact, fb.counterfactual(fact, 0).target


def run_demo(
    model_name: str = "gpt2-facts",
    out: str | Path = "demo-report",
    force: bool = False,
    device: str | None = None,
    samples: int = 10,
    dtype: str | None = None,
    stats_tokens: int | None = None,
) -> dict[str, Any]:
    """Run the six steps, write the report files into ``out`` (see the module doc for what is
    overwritten), return the results dict. ``stats_tokens``: tokens of ROME's key statistics (default:
    the model's ROME hyperparameters; a real model's come from its own generations, which take a while
    the first time — they are cached)."""
    from . import load
    from .facts.base import FactBase

    samples = check_count(samples, "samples")
    stats_tokens = None if stats_tokens is None else check_count(stats_tokens, "stats_tokens")
    out = prepare_output(out, force)
    t0 = time.time()
    results: dict[str, Any] = {}
    shown: dict[str, Any] = {}  # the result objects the HTML report shows as interactive views
    story: list[tuple[list[str], list[str]]] = []  # (markdown of a section, the views that follow it)

    _step(1, f"loading {model_name}", t0)
    model = load(model_name, device=device, dtype=dtype)
    results["model"], md = _model_section(model)
    story.append((list(md), []))
    fb = FactBase.load()
    fact, new_target = pick_fact(model, fb)
    prompt = fb.prompts(fact)[0]
    _step(2, f"generating from {prompt!r}", t0)
    results["fact"] = {"relation": fact.relation, "subject": fact.subject, "object": fact.object, "prompt": prompt}
    results["generation"], part = _generation_section(model, fact, prompt)
    md += part
    shown["attention"] = _attention(model, prompt)
    story.append((part, ["attention"]))
    _step(3, "logit lens", t0)
    results["logit_lens"], part = _lens_section(model, prompt, fact.target, out, shown)
    md += part
    story.append((part, ["lens"]))
    _step(4, "MLP sub-updates", t0)
    results["subupdates"], part = _subupdates_section(model, prompt, fact.target, shown)
    md += part
    story.append((part, ["subupdates"]))
    _step(5, f"causal trace ({samples} noise samples × 3 kinds)", t0)
    results["causal_trace"], part = _trace_section(model, prompt, fact.subject, samples, out, shown)
    md += part
    story.append((part, ["traces"]))
    layer, tied = results["causal_trace"]["edit_layer"], results["causal_trace"]["tied_layers"]
    among = f" (of the tied layers {_layer_span(tied)}: the largest mean effect)" if len(tied) > 1 else ""
    _step(6, f"ROME edit {fact.subject}: {fact.target!r} → {new_target!r} at layer {layer}{among}", t0)
    results["edit"], part = _edit_section(model, fb, fact, new_target, layer, stats_tokens, shown)
    md += part
    story.append((part, ["edit"]))

    results["seconds"] = round(time.time() - t0, 1)
    (out / "results.json").write_text(json.dumps(to_jsonable(results), indent=1) + "\n")
    footer = f"_{results['seconds']} s on {model.device}._"
    (out / "report.md").write_text("\n".join(md) + f"\n{footer}\n")
    wrote_html = _write_index(out, story, shown, footer)
    _write_manifest(out)
    html = ", index.html" if wrote_html else ""
    print(f"\nWrote {out}/report.md{html}, results.json, logit_lens.png, causal_trace.png in {results['seconds']} s")
    for r in results["edit"]["checks"]:
        print(f"  {r['role']:<10} {r['prompt']!r}: {r['top1_before']!r} → {r['top1_after']!r}")
    print(f"  undo bit-exact: {results['edit']['weights_restored_bit_exact']}")
    return results


Section = tuple[Any, list[str]]  # (the step's results, its markdown lines)


def _attention(model: Any, prompt: str) -> Any:
    from .views.attention import attention_patterns

    return attention_patterns(model, prompt)


def _write_index(out: Path, story: list[tuple[list[str], list[str]]], shown: dict[str, Any], footer: str) -> bool:
    """``index.html``: the report's sections, each followed by its interactive views (one self-contained
    page, plotly.js inside once). Returns False (and writes nothing, saying why) in an environment that lacks
    Plotly, a dependency of the package (e.g. installed with ``--no-deps``)."""
    try:
        import plotly  # noqa: F401
    except ImportError:
        print("index.html not written: Plotly, a dependency of gpt2-interp, is missing (pip install 'plotly>=7,<8')")
        return False
    from .views import html_page, markdown_html, view, view_topk

    items: list[Any] = []
    for md, keys in story:
        items.append(markdown_html(md))
        for key in keys:
            if key == "edit":
                items.append(view_topk(shown["edit"], roles=shown["edit_roles"], scores=shown["edit_scores"]))
            else:
                items.append(view(shown[key]))
    items.append(markdown_html([footer]))
    title = story[0][0][0].lstrip("# ").replace("`", "") if story and story[0][0] else "gpt2-interp demo"
    (out / "index.html").write_text(html_page(items, title), encoding="utf-8")
    return True


def _model_section(model: Any) -> Section:
    from .model.params import parameter_table

    table = parameter_table(model)
    c = model.cfg
    md = [
        f"# gpt2-interp demo on `{c.name}`",
        "",
        f"{c.n_layer} layers, d_model {c.d_model}, {c.n_head} heads, d_mlp {c.d_mlp}, context {c.n_ctx}, "
        f"vocabulary {c.d_vocab}: **{table.total:,} parameters** "
        f"({'W_U tied to W_E' if c.tied_embeddings else 'untied W_U'}).",
        "",
        "| part | shape | parameters |",
        markdown_rule("llr"),
    ]
    md += [f"| {p} | {s} | {n:,} |" for p, s, n in table.rows] + [f"| **total** | | **{table.total:,}** |", ""]
    return {"name": c.name, "config": c.to_dict(), "n_params": table.total}, md


def _generation_section(model: Any, fact: Any, prompt: str) -> Section:
    generation = model.generate(prompt, max_new_tokens=8, do_sample=False)
    return generation, [
        "## 1. Greedy generation",
        "",
        f"Fact: *{fact.subject}* —{fact.relation}→ *{fact.object}*",
        "",
        f"```\n{generation}\n```",
        "",
    ]


def _lens_section(model: Any, prompt: str, true_target: str, out: Path, shown: dict[str, Any]) -> Section:
    from .analysis.lens import logit_lens

    answer = target_ids(model, true_target)[0]
    lens = logit_lens(model, [prompt], targets=[answer], positions="all")
    lens.save_plot(out / "logit_lens.png")
    shown["lens"] = lens
    assert lens.target_rank is not None and lens.target_prob is not None, "the lens scores the target it is given"
    ranks = lens.target_rank[:, 0, -1].tolist()
    first_top1 = next((lens.layers[i] for i, r in enumerate(ranks) if r == 1), None)
    res = {
        "layers": lens.layers,
        "target_rank": ranks,
        "target_prob": lens.target_prob[:, 0, -1].tolist(),
        "first_top1_layer": first_top1,
    }
    return res, [
        "## 2. Logit lens",
        "",
        f"Rank of the answer {true_target!r} at the last position, by layer: "
        + ", ".join(f"{l} {int(r)}" for l, r in zip(lens.layers, ranks))
        + f". It first becomes the top token at **{first_top1}**.",
        "",
        "![logit lens](logit_lens.png)",
        "",
    ]


def _subupdates_section(model: Any, prompt: str, true_target: str, shown: dict[str, Any]) -> Section:
    from .analysis.vocab import top_subupdates

    subs = top_subupdates(model, prompt, k=8, target=target_ids(model, true_target)[0])
    shown["subupdates"] = subs
    return subs.to_dict(), ["## 3. Top MLP sub-updates at the last position", "", "```", subs.table(), "```", ""]


def _trace_section(model: Any, prompt: str, subject: str, samples: int, out: Path, shown: dict[str, Any]) -> Section:
    from .analysis.tracing import causal_trace_all

    # the library defaults — ROME's noise rule (3 × the std of the subject tokens' embeddings) and the MLP
    # window — are what layer="auto" uses, so the trace's layer is the one the edit would choose
    traces = causal_trace_all(model, prompt, subject, samples=samples)
    traces.save_plot(out / "causal_trace.png")
    shown["traces"] = traces
    mlp = traces["mlp"]
    last_subject = mlp.subject_range[1] - 1
    ie = mlp.indirect_effect[last_subject]
    trace_layer = int(ie.argmax())
    tied = tied_layers(ie, mlp.clean_score - mlp.corrupted_score)
    res: dict[str, Any] = {
        kind: {
            "clean": traces[kind].clean_score,
            "corrupted": traces[kind].corrupted_score,
            "peak": traces[kind].peak(),
            "subject_peak": traces[kind].subject_peak(),
            "late_peak": traces[kind].late_peak(),
        }
        for kind in ("hidden", "mlp", "attn")
    }
    res["mlp_indirect_effect_last_subject_token"] = ie.tolist()
    res["attn_indirect_effect_last_subject_token"] = traces["attn"].indirect_effect[last_subject].tolist()
    res["edit_layer"] = trace_layer
    res["tied_layers"] = tied
    res["edit_layer_rule"] = LAYER_RULE
    if len(tied) > 1:
        ceiling = " — restoring any of them brings back the clean probability" if _at_ceiling(mlp, ie, tied) else ""
        why = (
            f"Layers {_layer_span(tied)} tie at the peak (within {TIE_FRACTION:.0%} of the clean − corrupted gap, "
            f"which {mlp.samples} noise samples do not resolve){ceiling}; the edit takes **layer {trace_layer}**, "
            f"{LAYER_RULE}."
        )
    else:
        why = f"The edit goes there ({LAYER_RULE})."
    return res, [
        "## 4. Causal trace",
        "",
        f"Noise on the subject's embeddings drops P({mlp.target!r}) from {mlp.clean_score:.3f} to "
        f"{mlp.corrupted_score:.3f}. Restoring the MLP output at the last subject token "
        f"({mlp.tokens[last_subject]!r}) recovers most at **layer {trace_layer}** "
        f"(indirect effect {float(ie[trace_layer]):+.3f}). {why}",
        "",
        *trace_reading(traces, trace_layer, float(ie[trace_layer])),
        "",
        "![causal trace](causal_trace.png)",
        "",
    ]


#: Layers whose MLP indirect effect is within this fraction of the clean − corrupted gap of the peak's tie with it.
TIE_FRACTION = 0.01
#: How the demo picks the edit layer from the MLP trace at the last subject token (ROME's ``layer="auto"``).
LAYER_RULE = "the layer with the largest mean indirect effect, as ROME's layer='auto' picks"


def tied_layers(effect: Any, gap: float, fraction: float = TIE_FRACTION) -> list[int]:
    """The layers whose indirect effect (``effect``, one value per layer) is within ``fraction`` × ``gap`` (the
    clean − corrupted probability) of the largest: the peak's layer and those the trace cannot tell from it."""
    values = torch.as_tensor(effect, dtype=torch.float64)
    tol = fraction * abs(float(gap))
    return [int(i) for i in torch.nonzero(values >= values.max() - tol).flatten()]


def _at_ceiling(trace: Any, effect: Any, layers: list[int]) -> bool:
    """Every one of ``layers`` restores the clean probability (to the tie tolerance)."""
    tol = TIE_FRACTION * abs(trace.clean_score - trace.corrupted_score)
    return all(trace.corrupted_score + float(effect[l]) >= trace.clean_score - tol for l in layers)


def _layer_span(layers: list[int]) -> str:
    """``3–5`` for consecutive layers, ``3, 5, 6`` otherwise."""
    if layers == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}–{layers[-1]}"
    return ", ".join(map(str, layers))


def trace_reading(traces: Any, mlp_layer: int, mlp_effect: float) -> list[str]:
    """What the three panels of the trace figure show, from the traces' own numbers (a
    :class:`~gpt2_interp.analysis.tracing.TraceSet` of hidden, mlp and attn): the hidden state's
    site at the subject and at the last token, and attention beside the MLP (at the subject, and at the
    last token). Cells that are the clean run by construction are never named."""

    def site(p: tuple[str, str, float] | None, r: Any) -> str:
        return "none" if p is None else f"{p[0]!r} at {p[1]} (indirect effect {p[2] - r.corrupted_score:+.3f})"

    hidden, attn = traces["hidden"], traces["attn"]
    lines = [
        f"- Hidden state: the subject's peak is {site(hidden.subject_peak(), hidden)}; at the last token, "
        f"{site(hidden.late_peak(), hidden)} (its final layer is the clean run by construction and is not counted)."
    ]
    a_subj = attn.subject_peak()
    if a_subj is not None:
        a_effect = a_subj[2] - attn.corrupted_score
        notes = ["the MLP's layer"] if attn.layer_labels.index(a_subj[1]) == mlp_layer else []
        notes += [f"{a_effect / mlp_effect:.0%} of the MLP's {mlp_effect:+.3f}"] if mlp_effect > 0 else []
        beside = f" ({'; '.join(notes)})" if notes else ""
        lines.append(
            f"- Attention: restoring its output at the subject recovers {a_effect:+.3f} at {a_subj[0]!r} at "
            f"{a_subj[1]}{beside}; at the last token its peak is {site(attn.late_peak(), attn)}."
        )
    return lines


def _other_facts(fb: Any, fact: Any, n: int) -> list[Any]:
    """Up to ``n`` facts of ``fact``'s subject under other relations (what an edit should leave alone)."""
    return [f for f in fb.facts() if f.subject == fact.subject and f.relation != fact.relation][:n]


def _edit_section(
    model: Any, fb: Any, fact: Any, new_target: str, layer: int, stats_tokens: int | None, shown: dict[str, Any]
) -> Section:
    from .editing.compare import compare_topk
    from .editing.rome import compute_edit
    from .model.fingerprint import parameter_digests

    prompt, true_target = fb.prompts(fact)[0], fact.target
    template = prompt.replace(fact.subject, "{}", 1)
    request = {"prompt": template, "subject": fact.subject, "target": new_target}
    before = parameter_digests(model)
    w_before = model.blocks[layer].mlp.W_out.detach().clone()
    t_edit = time.time()
    hparams: dict[str, Any] = {} if stats_tokens is None else {"n_samples": stats_tokens}
    edit = compute_edit(model, request, layer=layer, **hparams)
    edit_seconds = time.time() - t_edit
    checks = (
        [("rewrite", prompt)]
        + [("paraphrase", p) for p in fb.prompts(fact, "heldout")[:2]]
        + [("neighbour", p) for p in fb.neighbourhood(fact, 2)]
        + [("other fact", fb.prompts(f)[0]) for f in _other_facts(fb, fact, 2)]
    )
    cmp = compare_topk(model, edit, [p for _, p in checks], k=3)
    shown["edit"], shown["edit_roles"] = cmp, [role for role, _ in checks]
    edit.apply(model)
    generation_after = model.generate(prompt, max_new_tokens=8, do_sample=False)
    edit.undo(model)
    restored = parameter_digests(model) == before and torch.equal(model.blocks[layer].mlp.W_out, w_before)
    rows = [
        {
            "role": role,
            "prompt": p,
            "top1_before": b[0][0],
            "p_top1_before": b[0][1],
            "top1_after": a[0][0],
            "p_top1_after": a[0][1],
        }
        for (role, p), b, a in zip(checks, cmp.before, cmp.after)
    ]
    shown["edit_scores"] = {
        "layer": layer,
        "edit time (s)": round(edit_seconds, 2),
        "rewrite flipped": rows[0]["top1_after"] == new_target,
        "weights restored bit-exactly after undo": restored,
    }
    res = {
        "request": request,
        "true_target": true_target,
        "layer": layer,
        "seconds": round(edit_seconds, 2),
        "checks": rows,
        "generation_after": generation_after,
        "weights_restored_bit_exact": restored,
    }
    md = [
        "## 5. ROME edit, verified, then undone",
        "",
        f"Request: `{template}` with subject *{fact.subject}* → {new_target!r} (was {true_target!r}); "
        f"computed in {edit_seconds:.1f} s.",
        "",
        "| role | prompt | top-1 before | top-1 after |",
        markdown_rule("llll"),
    ]
    md += [
        f"| {r['role']} | {r['prompt']} | {r['top1_before']!r} ({r['p_top1_before']:.2f}) | "
        f"{r['top1_after']!r} ({r['p_top1_after']:.2f}) |"
        for r in rows
    ]
    md += [
        "",
        f"After the edit: `{generation_after}`",
        "",
        f"Undo restored every weight bit for bit: **{restored}**.",
        "",
    ]
    return res, md
