"""Where does gpt2-facts make each attribute of a subject linearly decodable — and does that agree with
where causal tracing locates the fact?

    python analyses/probes.py [--quick] [--out-dir analyses/results]
    python analyses/probes.py --model smollm2-135m      # → probes_smollm2-135m.*, beside causal_trace_smollm2-135m.json

For each probing task of the fact base (country → continent, city → country, element → period, …;
prompts in several templates of the subject's relations, folds split by subject), a logistic-regression
probe per layer boundary (embeddings, after each block) on the residual stream at the subject's last
token, with Hewitt & Liang's by-type control task (one random label per subject) on the same folds;
selectivity = accuracy − control accuracy. The continent task is also probed at the prompt's last
token of the continent templates, where the answer must arrive to be said. The per-layer selectivity
is set beside the averaged causal trace at the last subject token (``results/causal_trace.json``,
written by ``analyses/causal_trace.py``). Also times the 2,000-prompt probe against a plain forward
pass over the same prompts (the peer, same run).

Writes ``probes.json``, ``probes.md`` and ``probes.png`` (for another ``--model``: ``probes_<model>.*``,
set beside that model's trace, ``causal_trace_<model>.json``, if it has been written).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

import gpt2_interp as gi
from gpt2_interp.analysis.probes import probe
from gpt2_interp.facts.probing import probing_set
from gpt2_interp.plots.probes import plot_probe_summary

RESULTS = Path(__file__).resolve().parent / "results"
# task -> templates per subject (sizes ~1,000–2,000 prompts)
TASKS = {"continent": 8, "language": 8, "currency": 8, "country": 8, "city_continent": 2, "period": 8,
         "atomic_number": 8}


@torch.no_grad()
def forward_seconds(model, prompts: list[str], batch_size: int = 64) -> float:
    """The peer: one plain forward pass over the prompts, batched as the probe batches them."""
    t = time.perf_counter()
    for s in range(0, len(prompts), batch_size):
        tokens, mask = model.tokenize(prompts[s : s + batch_size])
        model(tokens, attention_mask=mask, return_type=None)
    return time.perf_counter() - t


def trace_curves(path: Path) -> dict | None:
    """Averaged causal-trace indirect effects at the last subject token and the last token, by layer."""
    if not path.exists():
        return None
    tr = json.loads(path.read_text())
    b = tr["buckets"]
    ie = {k: tr["indirect_effect"][i] for i, k in enumerate(tr["kinds"])}
    s, last = b.index("last subject token"), b.index("last token")
    return {"layers": tr["layer_labels"], "mlp at last subject token": ie["mlp"][s],
            "hidden at last subject token": ie["hidden"][s], "hidden at last token": ie["hidden"][last],
            "attn at last token": ie["attn"][last]}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2-facts")
    ap.add_argument("--quick", action="store_true", help="two tasks, 2 templates per subject (for the test suite)")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    ap.add_argument("--per-subject", type=int, default=None,
                    help="at most this many templates per subject in every task (fewer prompts: a deep model's budget)")
    ap.add_argument("--stride", type=int, default=1,
                    help="probe L0 and every stride-th block output (with the last) instead of every boundary")
    ap.add_argument("--no-forward-timing", action="store_true", help="skip timing the plain forward pass (the speed peer)")
    ap.add_argument("--render", action="store_true", help="redo finding, table and figure from the saved JSON")
    args = ap.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.model == "gpt2-facts" else f"_{args.model}"
    stem = ("probes_quick" if args.quick else "probes") + suffix
    if args.render:
        return render(json.loads((args.out_dir / f"{stem}.json").read_text()), args.out_dir, stem)
    torch.manual_seed(0)
    load0 = os.getloadavg()[0]
    model = gi.load(args.model)
    tasks = {"continent": 2, "period": 2} if args.quick else dict(TASKS)
    if args.per_subject:
        tasks = {t: min(per, args.per_subject) for t, per in tasks.items()}
    n = model.cfg.n_layer
    layers = "all" if args.stride <= 1 else sorted({0, n - 1} | set(range(args.stride - 1, n, args.stride)))

    # speed: the probe of ~2,000 prompts × every boundary against a forward pass over the same prompts
    ds = probing_set("continent", per_subject=tasks["continent"])
    fwd = None if args.no_forward_timing else forward_seconds(model, ds.prompts)
    t = time.perf_counter()
    main_result = probe(model, ds, hook="resid", layers=layers, control="by-type", progress=False)
    probe_s = time.perf_counter() - t
    timing = {"prompts": len(ds), "boundaries": len(main_result.layers), "probe_seconds": round(probe_s, 1),
              "forward_seconds": None if fwd is None else round(fwd, 2),
              "ratio_to_forward": None if fwd is None else round(probe_s / fwd, 1),
              "threads": torch.get_num_threads(), "load_average": round(load0, 1)}
    print(f"continent probe: {len(ds)} prompts × {len(main_result.layers)} boundaries in {probe_s:.1f} s "
          + ("" if fwd is None else f"(a plain forward pass over them: {fwd:.2f} s)"), flush=True)

    results = {}
    for task, per in tasks.items():
        r = main_result if task == "continent" else probe(model, probing_set(task, per_subject=per), hook="resid",
                                                           layers=layers, control="by-type", progress=False)
        results[task] = r
        print(r.table(), "\n", flush=True)
    ds_last = probing_set("continent", per_subject=tasks["continent"], which="own")
    at_last = probe(model, ds_last, hook="resid", layers=layers, position="last", control="by-type", progress=False)
    print(at_last.table(), "\n")

    layers = main_result.layers
    summary = {}
    for task, r in list(results.items()) + [("continent at the last token (own templates)", at_last)]:
        summary[task] = {
            "kind": r.kind, "metric": r.metric, "n_prompts": r.n_prompts, "n_subjects": r.n_groups,
            "chance": r.chance, "score": r.mean.tolist(), "ci": r.ci.tolist(), "control": r.control_mean.tolist(),
            "selectivity": r.selectivity.tolist(), "selectivity_ci": r.selectivity_ci.tolist(),
        }
    # this model's own trace only (another model's layers say nothing about this one)
    trace_name = f"causal_trace{suffix}.json"
    trace = trace_curves(args.out_dir / trace_name) or trace_curves(RESULTS / trace_name)
    out = {"model": args.model, "layers": layers, "hook": "resid (embed = resid_pre 0, L{i} = resid_post i)",
           "position": "last subject token", "control": "by-type", "folds": main_result.n_folds,
           "timing": timing, "tasks": summary, "causal_trace": trace,
           "command": " ".join(["python analyses/probes.py", *(argv if argv is not None else sys.argv[1:])])}
    return render(out, args.out_dir, stem)


def decodable_from(t: dict, layers: list[str]) -> str | None:
    """The first layer whose selectivity reaches 90% of the task's best, if the task is decodable at all:
    somewhere its score beats chance (R² beats 0) and its control, both beyond the 95% fold intervals."""
    n = len(t["score"])
    ci = t.get("ci", [0.0] * n)
    sci = t.get("selectivity_ci", [0.0] * n)
    base = 0.0 if t.get("kind") == "regression" else t.get("chance", 0.0)
    ok = [t["score"][i] - ci[i] > base and t["selectivity"][i] - sci[i] > 0 for i in range(n)]
    if not any(ok):
        return None
    best = max(t["selectivity"][i] for i in range(n) if ok[i])
    return layers[min(i for i in range(n) if ok[i] and t["selectivity"][i] >= 0.9 * best)]


def timing_line(timing: dict) -> str:
    """The timing sentence of the report."""
    peer = ("the forward pass was not timed in this run" if timing.get("forward_seconds") is None else
            f"a plain forward pass over the same prompts took {timing['forward_seconds']} s in the same run")
    where = (f"{timing['threads']} thread(s), load average {timing['load_average']} at the start on our shared 2-core CPU"
             if "load_average" in timing else "a 2-core CPU shared with other jobs, load average ≈ 20")
    return (f"Timing: {timing['prompts']} prompts × {timing['boundaries']} boundaries probed in "
            f"{timing['probe_seconds']} s; {peer} ({where}).")


def render(out: dict, out_dir: Path, stem: str) -> dict:
    """Finding, table, figure and JSON from the measured numbers (``--render`` redoes this from the JSON)."""
    summary, trace, timing = out["tasks"], out["causal_trace"], out["timing"]
    n = len(next(iter(summary.values()))["score"])
    layers = out["layers"] = out.get("layers") or ["embed"] + [f"L{i}" for i in range(n - 1)]
    last_key = "continent at the last token (own templates)"
    for k in ("kind", "metric", "chance", "n_subjects"):  # same subjects and labels as the continent task
        summary[last_key].setdefault(k, summary["continent"][k])
    first = {t: decodable_from(v, layers) for t, v in summary.items()}
    for t, v in summary.items():
        v["first_decodable"] = first[t]
    subj = {t: f for t, f in first.items() if t != last_key}
    yes = [f"{t} from {f}" for t, f in subj.items() if f]
    no = [t for t, f in subj.items() if not f]
    finding = (
        "At the subject's last token (selectivity ≥ 90% of its best, beyond chance and control): "
        + "; ".join(yes) + "."
        + (f" Not linearly decodable for unseen subjects: {', '.join(no)}." if no else "")
        + f" At the prompt's last token (continent templates) the continent is decodable from {first[last_key]}."
    )
    if trace:
        mlp = trace["mlp at last subject token"]
        hid_last = trace["hidden at last token"]
        peak = max(range(len(mlp)), key=mlp.__getitem__)
        arrive = min(i for i, v in enumerate(hid_last) if v >= 0.5 * max(hid_last))
        finding += (f" Causal tracing puts the lookup in the MLPs at the last subject token (window centred on "
                    f"{trace['layers'][peak]}, indirect effect {mlp[peak]:.2f}) and the move to the last token from "
                    f"{trace['layers'][arrive]} on (hidden state ≥ half its peak effect).")
    print(finding)
    out["finding"] = finding
    sel = {(t if t != last_key else "continent @ last token"): v["selectivity"] for t, v in summary.items()}
    fig = plot_probe_summary(
        layers, sel,
        trace={k: v for k, v in trace.items() if k != "layers"} if trace else None,
        trace_layers=trace["layers"] if trace else None,
        title=f"{out['model']}: linear probes (by-type control) vs causal trace",
    )
    fig.savefig(out_dir / f"{stem}.png", dpi=130, bbox_inches="tight")
    (out_dir / f"{stem}.json").write_text(json.dumps(out, indent=1) + "\n")
    rows = [f"| {t} ({v.get('metric', 'accuracy')}) | {v['n_prompts']} / {v.get('n_subjects', '')} | "
            + " | ".join(f"{m:.2f} ({s:+.2f})" for m, s in zip(v["score"], v["selectivity"]))
            + f" | {v['first_decodable'] or '–'} |" for t, v in summary.items()]
    md = [f"# Linear probes on {out['model']}", "",
          "Accuracy (R² for atomic_number) by layer boundary, 5 folds split by subject, at the subject's last token "
          "(last row: at the prompt's last token); in brackets the selectivity against the by-type control "
          f"(Hewitt & Liang). Generated by `{out.get('command', 'python analyses/probes.py')}`.", "",
          "| task | prompts / subjects | " + " | ".join(layers) + " | decodable from |",
          "|---|---|" + "---|" * len(layers) + "---|", *rows, "", finding, "",
          timing_line(timing), ""]
    (out_dir / f"{stem}.md").write_text("\n".join(md))
    return out


if __name__ == "__main__":
    main()
