"""Mass editing on the embedded fact model: ROME, MEMIT and AlphaEdit on the same requests.

1. Requests: ``--n`` CounterFact-style requests whose fact the unedited model knows (its top-1 next
   token on the rewrite prompt is the true object's first token).
2. Key statistics for the edit layers in one pass (time without and with the cache).
3. Tuning on ``--tune-n`` OTHER requests (none shares a subject and relation with the evaluation set),
   in one batch: MEMIT's λ (``mom2_weight``), AlphaEdit's null-space threshold τ × ridge α
   (``--alphas``). The batch's targets come from ONE δ optimisation (they do not depend on λ, τ, α; nor
   do the keys with one edit layer), and each setting re-solves the update exactly; the chosen value
   maximises ES + PS among those whose NS stays within 5 points of the unedited model (else the best S,
   the harmonic mean of ES, PS and NS).
4. One batch of all ``--n`` requests, MEMIT and AlphaEdit: ES/PS/NS, subject specificity (SS),
   shared-token neighbours (STN), fluency, drift, time; the MEMIT edit is also undone (bit-exact
   check), saved, reloaded into a fresh model and re-scored (identical scores check).
5. Sequential editing in batches of ``--batch-size`` (AlphaEdit, MEMIT) and one request at a time
   (ROME, as many as the time budget ``--rome-seconds`` allows): the decay curve after every batch
   and the drift after every step.

``--only PARTS`` reruns some parts (e.g. ``rome_sequential`` on a CPU, or the AlphaEdit rows after
retuning) and merges them into the existing ``mass_editing.json``; ``--rome-seconds`` stops the ROME
run at a time limit and scores the edits made so far.

Writes ``mass_editing.json`` (after every part), ``mass_editing.md`` (tables) and
``mass_editing_decay.png`` to ``--out-dir`` (default ``analyses/results/``; for another model than
gpt2-facts the names carry it: ``mass_editing_smollm2-135m.json``, …). ``--quick``: a tiny run for the
test suite.

    python analyses/mass_editing.py --n 1000 --batch-size 100 --device cuda
    python analyses/mass_editing.py --model smollm2-135m --n 120 --tune-n 80 --batch-size 40 \
        --lambdas 10,100,1000,10000 --thresholds 1e-3,1e-2 --alphas 0.01,1,10,100 --rome-seconds 3600
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

import gpt2_interp as gi
from gpt2_interp.core.result import to_jsonable
from gpt2_interp.editing.edit import Edit, undo_all
from gpt2_interp.editing.evaluate import case_scores, evaluate_edits, harmonic_score, known_cases
from gpt2_interp.editing.memit import (
    NULLSPACE_RULES, MemitHparams, NullSpace, compute_edits, default_layers,
)
from gpt2_interp.editing.stats import key_second_moment
from gpt2_interp.model.fingerprint import weights_fingerprint
from gpt2_interp.plots.editing import plot_decay

RESULTS = Path(__file__).resolve().parent / "results"
MEMIT_PARTS = ("tuning", "batch_memit_edit", "memit_batch", "alphaedit_batch", "alphaedit_sequential",
               "memit_sequential")
PARTS = ("stats", "tuning", "batch_memit_edit", "memit_batch", "alphaedit_batch", "alphaedit_sequential",
         "memit_sequential", "rome_sequential")


def stem(model_name: str) -> str:
    """File-name stem of a model's results: ``mass_editing`` (gpt2-facts) or ``mass_editing_<model>``."""
    return "mass_editing" if model_name == "gpt2-facts" else f"mass_editing_{model_name}"


def _scores(model, cases, sb: int) -> dict:
    rows = case_scores(model, cases, sb)
    mean = lambda k: (lambda xs: sum(xs) / len(xs) if xs else None)([getattr(r, k) for r in rows if getattr(r, k) is not None])  # noqa: E731
    return {"es": mean("es"), "ps": mean("ps"), "ns": mean("ns")}


def edit_settings(model, hp: dict) -> dict:
    """What a MEMIT/AlphaEdit row depends on besides the requests: edit layers, the δ optimisation's
    context variants (the bare prompt + generated prefixes) and λ/τ/α — recorded per part so that a
    table merged from runs under different settings says which row used which."""
    h = MemitHparams.of(model, **hp)
    return {"layers": list(h.layers) if h.layers is not None else default_layers(model),
            "prefix_lengths": list(h.rome.prefix_lengths), "prefixes_per_length": h.rome.prefixes_per_length,
            "delta_norm": h.delta_norm, "mom2_weight": h.mom2_weight, "nullspace_threshold": h.nullspace_threshold,
            "nullspace_rule": h.nullspace_rule, "alpha": h.alpha}


def _describe(s: dict) -> str:
    """``layers [0, 1], 6 context variants (bare + 5 prefixes of each of [10] tokens), δ scaled by resid,
    λ = 1000, τ = 0.001, α = 100``."""
    n_ctx = 1 + s["prefixes_per_length"] * len(s["prefix_lengths"])
    return (f"layers {s['layers']}, {n_ctx} context variants (bare + {s['prefixes_per_length']} prefixes of each of "
            f"{s['prefix_lengths']} tokens), δ scaled by {s.get('delta_norm', 'mlp_out')}, λ = {s['mom2_weight']:g}, "
            f"τ = {s['nullspace_threshold']:g}{_rule(s)}, α = {s['alpha']:g}")


def _rule(s: dict) -> str:
    """`` (energy)`` for a null space by the energy rule, nothing for the (default) relative one."""
    return f" ({s['nullspace_rule']})" if s.get("nullspace_rule", "relative") != "relative" else ""


def _choose(results: list[dict], key: str, ns_pre: float) -> dict:
    """The best ES + PS among settings whose NS is within 5 points of the unedited model's; when none
    is, the best CounterFact S (harmonic mean of ES, PS, NS) — the best NS alone would pick a setting
    that edits nothing (a huge ridge keeps NS at 100 with ES 0)."""
    ok = [r for r in results if r["ns"] is not None and r["ns"] >= ns_pre - 0.05]
    if ok:
        return max(ok, key=lambda r: (r["es"] or 0) + (r["ps"] or 0))
    return max(results, key=lambda r: harmonic_score(r["es"], r["ps"], r["ns"]) or 0)


@torch.no_grad()
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2-facts")
    p.add_argument("--device", default=None)
    p.add_argument("--n", type=int, default=1000, help="requests (facts the unedited model knows)")
    p.add_argument("--batch-size", type=int, default=100, help="requests per sequential batch")
    p.add_argument("--tune-n", type=int, default=200, help="tuning requests (0: use the defaults)")
    p.add_argument("--lambdas", default="3,10,30,100,300,1000")
    p.add_argument("--thresholds", default="1e-4,1e-3,1e-2")
    p.add_argument("--null-rules", default="relative",
                   help="AlphaEdit null-space rules tuned with the thresholds: relative (λ ≤ τ·λ_max) and/or energy "
                        "(the smallest directions holding ≤ τ of tr C₀); tuning rows of other rules/thresholds "
                        "from an earlier run are kept")
    p.add_argument("--rome-seconds", type=float, default=None,
                   help="time limit of the ROME sequential run: it stops after the edit that passes it and is "
                        "scored on the edits made so far (default 240; 1 with --quick)")
    p.add_argument("--rome-n", type=int, default=None, help="requests for the ROME sequential run (default --n)")
    p.add_argument("--deadline", type=float, default=None, help="seconds for the whole script: the ROME run "
                   "gets at most what is left minus a minute")
    p.add_argument("--only", default=None, metavar="PARTS",
                   help=f"comma-separated parts to (re)run, merged into the existing --out-dir/mass_editing.json "
                        f"(the other parts and the chosen λ/τ are kept from it): {', '.join(PARTS)}")
    p.add_argument("--alphas", default=None,
                   help="AlphaEdit ridge values (× tr(C)/d_mlp) tuned with the thresholds (default: the model's)")
    p.add_argument("--n-samples", type=int, default=100_000, help="tokens for the key statistics")
    p.add_argument("--fluency-tokens", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    p.add_argument("--quick", action="store_true", help="a tiny run for tests")
    p.add_argument("--render", type=Path, default=None, metavar="JSON",
                   help="only write the table and figure from an earlier run's mass_editing.json")
    args = p.parse_args(argv)
    if args.render:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        render(json.loads(args.render.read_text()), args.out_dir)
        return 0
    if args.quick:
        args.n, args.batch_size, args.tune_n, args.n_samples, args.fluency_tokens = 4, 2, 4, 3000, 8
        args.lambdas, args.thresholds = "100", "1e-3"
    if args.rome_seconds is None:  # an explicit --rome-seconds wins, also under --quick
        args.rome_seconds = 1.0 if args.quick else 240.0
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    only = set(PARTS) if args.only is None else {x.strip() for x in args.only.split(",") if x.strip()}
    if only - set(PARTS):
        p.error(f"unknown part(s) {sorted(only - set(PARTS))}; choose from {', '.join(PARTS)}")
    bad_rules = {x.strip() for x in args.null_rules.split(",") if x.strip()} - set(NULLSPACE_RULES)
    if bad_rules:
        p.error(f"unknown --null-rules {sorted(bad_rules)}; choose from {', '.join(NULLSPACE_RULES)}")
    t_all = time.perf_counter()
    model = gi.load(args.model, device=args.device) if args.device else gi.load(args.model)
    sb = 512 if model.device.type != "cpu" else 64
    quick_hp = dict(v_steps=3, prefixes_per_length=1, prefix_lengths=(3,)) if args.quick else {}
    report: dict = {"model": args.model, "device": str(model.device), "n": args.n, "batch_size": args.batch_size,
                    "torch_threads": torch.get_num_threads(), "errors": {}}
    if args.only is not None:  # merge into the earlier run: same requests, same chosen settings
        report = json.loads((out / f"{stem(args.model)}.json").read_text())
        if (report["model"], report["n"], report["batch_size"]) != (args.model, args.n, args.batch_size):
            p.error(f"the existing report is for {report['model']}, n={report['n']}, batch size "
                    f"{report['batch_size']}; rerun --only with the same --model/--n/--batch-size")
        report.setdefault("errors", {})
        for name in only:
            report["errors"].pop(name, None)
        report.setdefault("part_devices", {}).update(
            {name: f"{model.device}, {torch.get_num_threads()} thread(s)" for name in only})

    def save() -> None:
        report["seconds_total"] = time.perf_counter() - t_all
        (out / f"{stem(args.model)}.json").write_text(json.dumps(to_jsonable(report), indent=1) + "\n")

    def part(name: str, fn) -> None:
        if name not in only:
            return
        t = time.perf_counter()
        try:
            fn()
            if name in MEMIT_PARTS:  # the settings it ran with (a failed part keeps its earlier row and settings)
                report.setdefault("part_settings", {})[name] = edit_settings(model, {**chosen, **quick_hp})
        except Exception as e:  # keep what the other parts measured
            report["errors"][name] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
            undo_all(model)
        report.setdefault("part_seconds", {})[name] = time.perf_counter() - t
        print(f"[{name}] {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
        save()

    base_fp = weights_fingerprint(model)
    cases = known_cases(model, args.n, args.seed)
    report["n_known_cases"] = len(cases)
    layers = default_layers(model)
    report["layers"] = layers
    stats: dict = {}

    def stats_part() -> None:
        t = time.perf_counter()
        fresh = key_second_moment(model, layers, n_samples=args.n_samples, cache_dir=False, recompute=True,
                                  progress=False)
        t_fresh = time.perf_counter() - t
        stats.update(key_second_moment(model, layers, n_samples=args.n_samples, progress=False))
        t = time.perf_counter()
        key_second_moment(model, layers, n_samples=args.n_samples, progress=False)
        report["stats"] = {"layers": layers, "count": fresh[layers[0]].count, "seconds_computed": t_fresh,
                           "seconds_cached": time.perf_counter() - t, "corpus": fresh[layers[0]].key["corpus"]}
        t = time.perf_counter()
        own = MemitHparams.of(model)
        ns = NullSpace.from_stats({l: stats[l] for l in layers}, own.nullspace_threshold, own.nullspace_rule)
        report["stats"]["projection_seconds"] = time.perf_counter() - t
        report["stats"]["null_dim"] = ns.null_dim
        ev = torch.linalg.eigvalsh(stats[layers[0]].C.double())
        report["stats"]["eig_fraction_below"] = {str(t): float((ev <= t * ev[-1]).float().mean())
                                                 for t in (1e-5, 1e-4, 1e-3, 1e-2)}

    part("stats", stats_part)
    if not stats:
        stats.update(key_second_moment(model, layers, n_samples=args.n_samples, progress=False))
    defaults = MemitHparams.of(model)
    chosen = {"mom2_weight": defaults.mom2_weight, "nullspace_threshold": defaults.nullspace_threshold,
              "nullspace_rule": defaults.nullspace_rule, "alpha": defaults.alpha}
    if args.only is not None:  # the tuning's choice (earlier rows may have run with older settings: marked †)
        chosen.update(report.get("tuning", {}).get("chosen") or report.get("chosen", {}))

    def tune_part() -> None:
        exclude = {(c.relation, c.request.subject) for c in cases}
        tune = known_cases(model, args.tune_n, args.seed + 1, exclude)
        ns_pre = _scores(model, tune, sb)["ns"] or 1.0
        lambdas = [float(x) for x in args.lambdas.split(",") if x.strip()]
        taus = [float(x) for x in args.thresholds.split(",") if x.strip()]
        rules = [x.strip() for x in args.null_rules.split(",") if x.strip()]
        alphas = [float(x) for x in args.alphas.split(",")] if args.alphas else [chosen["alpha"]]
        # one δ optimisation for the tuning batch: the target residuals do not depend on λ, τ or α, so
        # each setting re-solves the update from them (compute_edits(targets=…)), exactly
        reqs = [c.request for c in tune]
        t = time.perf_counter()
        z = compute_edits(model, reqs, stats=stats, hparams=quick_hp).v_star
        report["tuning_targets_seconds"] = time.perf_counter() - t

        def score(setting: dict, preserve=None) -> dict:
            e = compute_edits(model, reqs, stats=stats, hparams={**quick_hp, **setting}, preserve=preserve,
                              remember=False, targets=z)
            with model.edited(e):
                got = _scores(model, tune, sb)
            fit = e.metrics["fit"]
            return {**got, "fit_error": sum(f["fit_error"] for f in fit.values()) / len(fit),
                    "dW_norm": sum(f["dW_norm"] ** 2 for f in fit.values()) ** 0.5, "keys": e.keys}

        lam_rows, tau_rows = [], []
        for lam in lambdas:
            row = score({"mom2_weight": lam})
            row.pop("keys")
            lam_rows.append({"mom2_weight": lam, **row})
            print(lam_rows[-1], file=sys.stderr, flush=True)
        for rule in rules:
            for tau in taus:
                ns = NullSpace.from_stats({l: stats[l] for l in layers}, tau, rule)
                for alpha in alphas:
                    row = score({"nullspace_threshold": tau, "nullspace_rule": rule, "alpha": alpha}, preserve=ns)
                    keys = row.pop("keys")  # the edit keys' energy in the null space, averaged over the layers
                    key_null = sum(float(((K.double() @ ns.P[l]) ** 2).sum(-1).mean() / (K.double() ** 2).sum(-1).mean())
                                   for l, K in keys.items()) / len(keys)
                    tau_rows.append({"nullspace_threshold": tau, "nullspace_rule": rule, "alpha": alpha,
                                     "null_dim": ns.null_dim, "leak": ns.leak, "key_energy_in_null_space": key_null,
                                     **row})
                    print(tau_rows[-1], file=sys.stderr, flush=True)
        old = report.get("tuning", {})
        if tau_rows:  # keep an earlier run's rows of other rules/thresholds/ridges (same requests and targets)
            ident = lambda r: (r.get("nullspace_rule", "relative"), r["nullspace_threshold"], r.get("alpha"))  # noqa: E731
            new = {ident(r) for r in tau_rows}
            tau_rows = [r for r in old.get("nullspace_threshold", []) if ident(r) not in new] + tau_rows
        if lam_rows:
            chosen["mom2_weight"] = _choose(lam_rows, "mom2_weight", ns_pre)["mom2_weight"]
        if tau_rows:
            best = _choose(tau_rows, "nullspace_threshold", ns_pre)
            chosen["nullspace_threshold"], chosen["alpha"] = best["nullspace_threshold"], best["alpha"]
            chosen["nullspace_rule"] = best.get("nullspace_rule", "relative")
        report["tuning"] = {"n": len(tune), "ns_unedited": ns_pre, "method": "one δ optimisation, update re-solved",
                            "mom2_weight": lam_rows or old.get("mom2_weight", []),
                            "nullspace_threshold": tau_rows or old.get("nullspace_threshold", []), "chosen": dict(chosen)}

    if args.tune_n:
        part("tuning", tune_part)
    report["chosen"] = chosen
    hp = {**chosen, **quick_hp}
    report["settings"] = edit_settings(model, hp)
    common = dict(stats=stats, fluency_tokens=args.fluency_tokens, progress=False, score_batch_size=sb, **hp)

    def batch_part() -> None:
        reqs = [c.request for c in cases]
        t = time.perf_counter()
        edit = compute_edits(model, reqs, stats=stats, hparams=hp)
        t_edit = time.perf_counter() - t
        batch_targets["z"] = edit.v_star
        edit.apply(model)
        scores_a = _scores(model, cases, sb)
        edit.undo(model)
        bit_exact = weights_fingerprint(model) == base_fp
        path = out / f"{stem(args.model)}_batch.edit"
        edit.save(path)
        fresh = gi.load(args.model, device=args.device) if args.device else gi.load(args.model)
        loaded = Edit.load(path, fresh)
        with fresh.edited(loaded):
            scores_b = _scores(fresh, cases, sb)
        report["batch_memit_edit"] = {"seconds": t_edit, "metrics": edit.metrics, "scores": scores_a,
                                      "undo_bit_exact": bit_exact, "reloaded_scores": scores_b,
                                      "reload_reproduces": scores_a == scores_b,
                                      "file_mb": path.stat().st_size / 2**20}
        path.unlink()  # a generated file: not committed

    batch_targets: dict = {}  # the one batch's target residuals: MEMIT's and AlphaEdit's batch edits share them
    part("batch_memit_edit", batch_part)
    evals: dict = {}

    def shared_targets() -> torch.Tensor:
        if "z" not in batch_targets:
            batch_targets["z"] = compute_edits(model, [c.request for c in cases], stats=stats, hparams=hp).v_star
        return batch_targets["z"]

    def run(name: str, **kw) -> None:
        def fn() -> None:
            if kw.get("method") != "rome":
                shared = {} if kw.get("sequential") else {"targets": shared_targets()}
                if shared:
                    report["batch_targets_shared"] = True
                ev = evaluate_edits(model, cases, **common, **shared, **kw)
            else:  # ROME's own hyperparameters (MODEL_HPARAMS), its layer's statistics
                rome_kw = {k: v for k, v in common.items() if k not in ("stats", *chosen)}
                ev = evaluate_edits(model, cases[: kw.pop("n_rome")], **rome_kw, **kw)
            evals[name] = ev
            report.setdefault("evaluations", {})[name] = {
                "method": ev.method, "sequential": ev.sequential, "batch_size": ev.batch_size, "layer": ev.layer,
                "summary": ev.summary, "curve": ev.curve, "steps": ev.steps, "seconds": ev.seconds,
                "restored_exactly": ev.restored_exactly}
            print(ev.table(), file=sys.stderr, flush=True)
        part(name, fn)

    run("memit_batch", method="memit")
    run("alphaedit_batch", method="alphaedit")
    run("alphaedit_sequential", method="alphaedit", sequential=True, batch_size=args.batch_size)
    run("memit_sequential", method="memit", sequential=True, batch_size=args.batch_size)
    # ROME: one request at a time, edits accumulating, until --rome-n requests or the time limit
    budget = args.rome_seconds
    if args.deadline:
        budget = min(budget, args.deadline - (time.perf_counter() - t_all) - 60)
    n_rome = min(len(cases), args.rome_n or len(cases))
    marks = sorted({*range(args.batch_size, n_rome + 1, args.batch_size), 1, 10, n_rome})
    if "rome_sequential" in only:
        report["rome_time_limit_seconds"] = budget
        report["rome_requested"] = n_rome
    run("rome_sequential", method="rome", sequential=True, checkpoints=marks, n_rome=n_rome, time_limit=budget)
    report["weights_restored_at_end"] = weights_fingerprint(model) == base_fp
    save()

    render(json.loads(json.dumps(to_jsonable(report))), out)
    save()
    return 0 if not report["errors"] else 1


def render(report: dict, out: Path) -> None:
    """``mass_editing.md`` and ``mass_editing_decay.png`` from the JSON report (``--render``: from a
    report written by an earlier run, e.g. on a GPU machine)."""
    evals = report.get("evaluations", {})
    seq = {k: evals[k] for k in ("rome_sequential", "memit_sequential", "alphaedit_sequential")
           if k in evals and evals[k].get("curve")}
    if seq:
        older = _older(report)
        names = {k: k.replace("_sequential", "") + (" (earlier settings)" if k in older else "") for k in seq}
        if "rome_sequential" in seq and seq["rome_sequential"]["summary"]["all"]["n"] < report.get("rome_requested", 0):
            names["rome_sequential"] = (f"rome ({seq['rome_sequential']['summary']['all']['n']} of "
                                        f"{report['rome_requested']}: time limit)")
        metrics = {"ES": "es", "PS": "ps", "NS": "ns", "subject specificity": "ss"}
        fig = plot_decay({names[k]: [c["n_edits"] for c in ev["curve"]] for k, ev in seq.items()},
                         {m: {names[k]: [c[a] for c in ev["curve"]] for k, ev in seq.items()} for m, a in metrics.items()},
                         reference={"NS": next(iter(seq.values()))["summary"]["all"]["pre"]["ns"]},
                         title=f"{report['model']}: sequential editing, batches of {report['batch_size']}"
                               + (" (ROME: one at a time)" if "rome_sequential" in seq else ""))
        fig.savefig(out / f"{stem(report['model'])}_decay.png", dpi=120)
    (out / f"{stem(report['model'])}.md").write_text(_markdown(report))


def _older(report: dict) -> dict:
    """The MEMIT/AlphaEdit evaluations run under other settings than the report's current ones:
    ``{name: their settings or None (not recorded)}``."""
    now, ps = report.get("settings"), report.get("part_settings", {})
    if now is None:
        return {}
    return {name: ps.get(name) for name in report.get("evaluations", {})
            if name != "rome_sequential" and _relevant(name, ps.get(name)) != _relevant(name, now)}


def _relevant(name: str, settings: dict | None) -> dict | None:
    """The settings an evaluation depends on: a MEMIT row not on τ and α (no projection), an
    AlphaEdit row not on λ (its update has no ``C`` term: ``projected_update``)."""
    if settings is None:
        return None
    drop = {"memit": ("nullspace_threshold", "nullspace_rule", "alpha"),
            "alphaedit": ("mom2_weight",)}.get(name.split("_")[0], ())
    return {k: v for k, v in {"nullspace_rule": "relative", **settings}.items() if k not in drop}


def _markdown(report: dict) -> str:
    pc = lambda x: f"{100 * x:.1f}" if x is not None else "–"  # noqa: E731
    lines = [f"# Mass editing on {report['model']} ({report['device']})", "",
             f"{report['n_known_cases']} requests the unedited model knows; edit layers {report['layers']}; "
             f"chosen λ = {report['chosen']['mom2_weight']}, τ = {report['chosen']['nullspace_threshold']}{_rule(report['chosen'])}"
             + (f", α = {report['chosen']['alpha']:g}" if "alpha" in report["chosen"] else "") + ".", ""]
    if "stats" in report:
        s = report["stats"]
        lines += [f"Key statistics: {s['count']} tokens, {s['seconds_computed']:.1f} s computed, "
                  f"{s['seconds_cached']:.2f} s from the cache; projection {s['projection_seconds']:.2f} s "
                  f"(null-space dims {s['null_dim']}; fraction of eigenvalues below τ·λ_max: "
                  f"{s.get('eig_fraction_below')}).", ""]
    if "tuning" in report:
        t = report["tuning"]
        how = " (one δ optimisation; each setting re-solves the update)" if t.get("method") else ""
        lines += [f"Tuning on {t['n']} other requests, one batch{how} (NS unedited {pc(t['ns_unedited'])}); "
                  "fit = mean ‖KΔW − R‖/‖R‖, null = the edit keys' energy in the null space:", "",
                  "| setting | ES | PS | NS | fit | ‖ΔW‖ | null dim | null |", "|---|---|---|---|---|---|---|---|"]
        f3 = lambda r, k: f"{r[k]:.3g}" if r.get(k) is not None else "–"  # noqa: E731
        lines += [f"| MEMIT λ = {r['mom2_weight']:g} | {pc(r['es'])} | {pc(r['ps'])} | {pc(r['ns'])} | "
                  f"{f3(r, 'fit_error')} | {f3(r, 'dW_norm')} | – | – |" for r in t["mom2_weight"]]
        lines += [f"| AlphaEdit τ = {r['nullspace_threshold']:g}{_rule(r)}" + (f", α = {r['alpha']:g}" if "alpha" in r else "")
                  + f" | {pc(r['es'])} | {pc(r['ps'])} | {pc(r['ns'])} | {f3(r, 'fit_error')} | {f3(r, 'dW_norm')} | "
                  f"{r['null_dim'] if not isinstance(r.get('null_dim'), dict) else '/'.join(map(str, r['null_dim'].values()))} | "
                  f"{f3(r, 'key_energy_in_null_space')} |" for r in t["nullspace_threshold"]]
        lines.append("")
        if t.get("source"):
            lines += [t["source"], ""]
        differ = {k: v for k, v in t.get("chosen", {}).items() if report["chosen"].get(k) != v}
        if differ:
            lines += [f"This tuning chose {differ}; the runs below used {report['chosen']} (they were not rerun "
                      "with the new choice).", ""]
    now, ps = report.get("settings"), report.get("part_settings", {})
    targets_of = ("layers", "prefix_lengths", "prefixes_per_length", "delta_norm")  # what the tuning depended on
    same = lambda a, b: a and b and all(a.get(k) == b.get(k) for k in targets_of)  # noqa: E731
    if "tuning" in report and now and not same(ps.get("tuning"), now):
        lines += ["The tuning above used other edit layers or context variants than the runs below: "
                  + (_describe(ps["tuning"]) if ps.get("tuning") else "settings not recorded") + ".", ""]
    evals = report.get("evaluations", {})
    older = _older(report)
    if now:
        lines += [f"MEMIT/AlphaEdit settings of this table: {_describe(now)}"
                  + (" — except the rows marked †." if older else "."), ""]
    lines += ["| run | edits | ES | PS | NS (unedited) | SS | STN | fluency pre → post | mean KL | time (s) |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for name, ev in evals.items():
        s = ev["summary"]["all"]
        fl = f"{s['fluency_pre']:.3f} → {s['fluency_post']:.3f}" if s.get("fluency_post") is not None else "–"
        kl = f"{s['kl_drift']:.3g}" if s.get("kl_drift") is not None else "–"
        mark = " †" if name in older else ""
        lines.append(f"| {name}{mark} | {s['n']} | {pc(s['post']['es'])} | {pc(s['post']['ps'])} | {pc(s['post']['ns'])} "
                     f"({pc(s['pre']['ns'])}) | {pc(s.get('ss'))} | {pc(s.get('stn'))} | {fl} | {kl} | "
                     f"{ev['seconds']:.0f} |")
    lines.append("")
    if report.get("batch_targets_shared") and "batch_memit_edit" in report:
        lines += ["The two batch rows share one δ optimisation of the batch (their times are the solve and the scoring; "
                  f"the δ optimisation took {report['batch_memit_edit']['metrics']['delta_seconds']:.0f} s, see the "
                  "last line).", ""]
    for name, st in older.items():
        lines += [f"† {name}: " + (f"run with earlier settings ({_describe(st)}), not rerun with this table's"
                                   if st else "settings not recorded (a run before they were)") + ".", ""]
    rome = evals.get("rome_sequential")
    if rome and report.get("rome_requested") and rome["summary"]["all"]["n"] < report["rome_requested"]:
        s = rome["summary"]["all"]
        lines += [f"rome_sequential stopped at its time limit ({report['rome_time_limit_seconds']:.0f} s): "
                  f"{s['n']} of {report['rome_requested']} requests edited (one at a time, "
                  f"{s['edit_seconds']:.2f} s per edit on average); its rows and curve cover those.", ""]
    if report.get("part_devices"):
        lines += ["Parts (re)run separately (`--only`) and merged: " + "; ".join(
            f"{k} on {v}" for k, v in report["part_devices"].items()) + "; the others on " + report["device"] + ".", ""]
    for name, ev in evals.items():
        if ev.get("curve"):
            lines += [f"**{name}** after k edits (ES/PS/NS/SS/STN %, mean/max KL on unrelated prompts):", "",
                      "| k | ES | PS | NS | SS | STN | mean KL | max KL |", "|---|---|---|---|---|---|---|---|"]
            lines += [f"| {c['n_edits']} | {pc(c['es'])} | {pc(c['ps'])} | {pc(c['ns'])} | {pc(c['ss'])} | "
                      f"{pc(c['stn'])} | {c['kl_drift']:.3g} | {c['kl_max']:.3g} |" for c in ev["curve"]]
            lines.append("")
    if "batch_memit_edit" in report:
        b = report["batch_memit_edit"]
        fit = next(iter(b["metrics"]["fit"].values()))
        if now and ps.get("batch_memit_edit") != now:
            lines += ["The edit below was computed with earlier settings: " + (_describe(ps["batch_memit_edit"])
                      if ps.get("batch_memit_edit") else "not recorded") + ".", ""]
        lines += [f"One MEMIT edit of all requests: computed in {b['seconds']:.1f} s (δ optimisation "
                  f"{b['metrics']['delta_seconds']:.1f} s); least-squares residual {100 * fit['fit_error']:.0f}% of the "
                  f"targets; undo bit-exact: {b['undo_bit_exact']}; saved ({b['file_mb']:.1f} MB), reloaded into a "
                  f"fresh model: scores {'identical' if b['reload_reproduces'] else 'DIFFERENT'} "
                  f"({b['scores']} vs {b['reloaded_scores']}).", ""]
    missing = [k for k in ("memit_batch", "alphaedit_batch", "alphaedit_sequential", "memit_sequential",
                           "rome_sequential") if k not in evals]
    if missing:
        lines += [f"Not measured in this run (time limit or error): {', '.join(missing)}.", ""]
    if report.get("errors"):
        lines += ["Errors: " + json.dumps(report["errors"]), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
