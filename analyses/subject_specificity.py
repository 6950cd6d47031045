"""Subject specificity: does an edit keep the edited subject's OTHER facts? ROME and MEMIT, with and
without :attr:`Request.keep`.

CounterFact's neighbourhood score checks other subjects; it never checks the edited subject's other
relations, and locate-and-edit methods write to the subject's representation, which every relation
reads. For ``--n`` requests the model knows (:func:`known_cases`), each method edits:

- ROME: one request at a time, each edit on the unedited model, scored and undone;
- MEMIT: all requests in one batch;

once as published and once per ``--keep-factors`` value with ``keep`` = the subject's other relations'
training prompts ``--keep-templates`` (default: the SECOND, index 1; :func:`keep_other_relations`);
subject specificity (SS) is scored on their FIRST training prompt (index 0), which is never optimised.
``--no-published`` skips the published run; ``--append`` adds the runs to the existing report of the
same model, requests and seed instead of starting a new one. Reported: ES/PS/NS, SS, shared-token neighbours
(STN), fluency, edit time. Writes ``subject_specificity[_<model>].json/.md/.png`` to ``--out-dir``.

    python analyses/subject_specificity.py --model gpt2-facts --n 100
    python analyses/subject_specificity.py --model smollm2-135m --n 40 --methods rome
    python analyses/subject_specificity.py --model smollm2-135m --n 30 --methods rome --no-published \
        --keep-templates 1,2,3,4 --append
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import gpt2_interp as gi
from gpt2_interp.core.result import to_jsonable
from gpt2_interp.editing.evaluate import evaluate_edits, keep_other_relations, known_cases

RESULTS = Path(__file__).resolve().parent / "results"


def stem(model_name: str) -> str:
    return "subject_specificity" if model_name == "gpt2-facts" else f"subject_specificity_{model_name}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2-facts")
    p.add_argument("--n", type=int, default=100, help="requests (facts the unedited model knows)")
    p.add_argument("--methods", default="rome,memit")
    p.add_argument("--keep-factors", default="1", help="keep_factor values to run with keep prompts")
    p.add_argument("--keep-templates", default="1",
                   help="training-prompt indices of the other relations kept (0 is scored: not allowed)")
    p.add_argument("--no-published", action="store_true", help="skip the run without keep")
    p.add_argument("--append", action="store_true",
                   help="add the runs to the existing report (same --model, --n, --seed)")
    p.add_argument("--mom2-weight", type=float, default=None, help="MEMIT's λ (default: the model's)")
    p.add_argument("--fluency-tokens", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--quick", action="store_true", help="a tiny run for the tests")
    a = p.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    quick = dict(v_steps=3, prefixes_per_length=1, prefix_lengths=(3,)) if a.quick else {}
    if a.quick:
        a.n, a.fluency_tokens = 3, 6
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    bad = set(methods) - {"rome", "memit"}
    if bad:
        p.error(f"unknown method(s) {sorted(bad)}: choose rome, memit")
    factors = [float(x) for x in a.keep_factors.split(",") if x.strip()]
    try:
        tmpl = [int(x) for x in a.keep_templates.split(",") if x.strip()]
    except ValueError:
        p.error(f"--keep-templates: comma-separated integers, got {a.keep_templates!r}")
    if not tmpl or 0 in tmpl:
        p.error("--keep-templates: give indices ≥ 1 (subject specificity is scored on training prompt 0)")
    out = a.out_dir
    path = out / f"{stem(a.model)}.json"
    if a.append and not path.exists():
        p.error(f"--append: no report at {path}")
    model = gi.load(a.model)
    cases = known_cases(model, a.n, a.seed)
    kept = keep_other_relations(cases, template=tmpl)
    report = {"model": a.model, "n": len(cases), "seed": a.seed, "torch_threads": torch.get_num_threads(), "runs": []}
    if a.append:
        report = json.loads(path.read_text())
        if (report["model"], report["n"], report.get("seed", 0)) != (a.model, len(cases), a.seed):
            p.error(f"--append: the report at {path} is for {report['model']}, n={report['n']}, seed "
                    f"{report.get('seed', 0)}")
    out.mkdir(parents=True, exist_ok=True)
    for method in methods:
        extra = dict(quick)
        if method == "memit" and a.mom2_weight is not None:
            extra["mom2_weight"] = a.mom2_weight
        for factor in ([] if a.no_published else [None]) + factors:
            t = time.perf_counter()
            ev = evaluate_edits(model, cases if factor is None else kept, method=method, progress=True,
                                fluency_tokens=a.fluency_tokens, **extra,
                                **({} if factor is None else {"keep_factor": factor}))
            s = ev.summary["all"]
            report["runs"].append({"method": method, "keep_factor": factor, "layer": ev.layer,
                                   "keep_templates": None if factor is None else tmpl,
                                   "keep_prompts_mean": None if factor is None else
                                   sum(len(c.request.keep) for c in kept) / max(len(kept), 1),
                                   "torch_threads": torch.get_num_threads(),
                                   "summary": to_jsonable(s), "seconds": time.perf_counter() - t})
            print(f"{method} keep={factor}: ES {s.post.es} PS {s.post.ps} NS {s.post.ns} SS {s.ss} STN {s.stn}",
                  file=sys.stderr, flush=True)
            path.write_text(json.dumps(to_jsonable(report), indent=1) + "\n")
    render(report, out)
    return 0


def render(report: dict, out: Path) -> None:
    """The markdown table and the bar figure from the JSON report."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pc = lambda x: f"{100 * x:.1f}" if x is not None else "–"  # noqa: E731
    lines = [f"# Subject specificity on {report['model']}", "",
             f"{report['n']} requests the model knows; keep = the subject's other relations' training prompts "
             "of the listed indices (1 = the second; the count is per request, on average); SS is scored on their "
             "first (index 0), never optimised.", "",
             "| method | keep factor | keep prompts | ES | PS | NS (unedited) | SS (facts) | STN (facts) | fluency pre → post | time (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in report["runs"]:
        s = r["summary"]
        fl = f"{s['fluency_pre']:.3f} → {s['fluency_post']:.3f}" if s.get("fluency_post") is not None else "–"
        kp = "–" if r["keep_factor"] is None else (
            f"{r.get('keep_templates', [1])} ({r.get('keep_prompts_mean', report.get('keep_prompts_mean', 0)):.1f})")
        lines.append(f"| {r['method']} (layer {r['layer']}) | {r['keep_factor'] if r['keep_factor'] is not None else '– (as published)'} | {kp} | "
                     f"{pc(s['post']['es'])} | {pc(s['post']['ps'])} | {pc(s['post']['ns'])} ({pc(s['pre']['ns'])}) | "
                     f"{pc(s.get('ss'))} ({s.get('n_ss')}) | {pc(s.get('stn'))} ({s.get('n_stn')}) | {fl} | {r['seconds']:.0f} |")
    (out / f"{stem(report['model'])}.md").write_text("\n".join(lines) + "\n")
    names = [f"{r['method']}\n" + ("published" if r["keep_factor"] is None else f"keep ×{r['keep_factor']:g}"
                                    + (f"\nprompts {','.join(map(str, r['keep_templates']))}"
                                       if r.get("keep_templates", [1]) != [1] else ""))
             for r in report["runs"]]
    metrics = {"ES": lambda s: s["post"]["es"], "PS": lambda s: s["post"]["ps"], "NS": lambda s: s["post"]["ns"],
               "SS": lambda s: s.get("ss"), "STN": lambda s: s.get("stn")}
    fig, ax = plt.subplots(figsize=(1.6 * len(names) + 3, 3.6))
    width = 0.8 / len(metrics)
    for j, (m, get) in enumerate(metrics.items()):
        vals = [100 * (get(r["summary"]) or 0) for r in report["runs"]]
        ax.bar([i + (j - len(metrics) / 2 + 0.5) * width for i in range(len(names))], vals, width, label=m)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("%")
    ax.set_ylim(0, 105)
    ax.legend(ncol=len(metrics), fontsize=8, loc="lower center")
    ax.set_title(f"{report['model']}: does an edit keep the subject's other facts? (SS)")
    fig.tight_layout()
    fig.savefig(out / f"{stem(report['model'])}.png", dpi=120)


if __name__ == "__main__":
    sys.exit(main())
