"""Why batched edits miss on gpt2-facts: requests that share a key.

MEMIT writes each request's new value at one key: the edit layer's MLP input at the subject's last
token. In gpt2-facts the facts are edited at layer 0, where that key is made mostly by the last token
itself, so two requests whose subjects end in the same token (or name the same subject under two
relations) ask for two values at nearly the same key — a least-squares update cannot give both.

This script counts those collisions in the fact base and edits two request sets of the same size in one
MEMIT batch each: ``--n`` known requests as drawn (with their collisions), and ``--n`` known requests
whose subjects all end in different tokens. If collisions were the whole story, the second set would
reach ROME-like efficacy.

    python analyses/mass_editing_keys.py [--n 200] [--lam 100]

Writes ``mass_editing_keys.json`` and ``.md`` to ``--out-dir`` (default ``analyses/results/``).
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import torch

import gpt2_interp as gi
from gpt2_interp.core.result import to_jsonable
from gpt2_interp.editing.edit import edited
from gpt2_interp.editing.memit import compute_edits, default_layers
from gpt2_interp.editing.stats import key_second_moment
from gpt2_interp.facts.base import FactBase

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mass_editing import _scores, known_cases  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def key_token(model, case) -> int:
    """The subject's last token as it stands in the rewrite prompt (the position the edit writes to)."""
    return int(model.to_tokens(case.request.prompt.split("{}")[0] + case.request.subject, prepend_bos=False)[0, -1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gpt2-facts")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--lam", type=float, default=100.0, help="MEMIT's λ (mom2_weight)")
    p.add_argument("--pool", type=int, default=1200, help="known requests to draw the two sets from")
    p.add_argument("--out-dir", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    model = gi.load(a.model)
    fb = FactBase.load()
    facts = [f for r in fb.relations for f in fb.facts(r)]
    subjects = {f.subject for f in facts}
    pool = known_cases(model, a.pool, 0)
    seen, distinct = set(), []
    for c in pool:
        t = key_token(model, c)
        if t not in seen:
            seen.add(t)
            distinct.append(c)
    report = {"model": a.model, "lambda": a.lam, "layers": default_layers(model),
              "fact_base": {"facts": len(facts), "subjects": len(subjects),
                            "subject_final_tokens": len({int(model.to_tokens(" " + s, prepend_bos=False)[0, -1])
                                                         for s in subjects})},
              "known_pool": {"n": len(pool), "subjects": len({c.request.subject for c in pool}),
                             "key_tokens": len(seen)}, "runs": []}
    stats = key_second_moment(model, report["layers"], n_samples=100_000, progress=False)
    for name, cases in (("as drawn", pool[: a.n]), ("distinct key tokens", distinct[: a.n])):
        counts = collections.Counter(key_token(model, c) for c in cases)
        t = time.perf_counter()
        edit = compute_edits(model, [c.request for c in cases], stats=stats, hparams={"mom2_weight": a.lam},
                             progress=False)
        with edited(model, edit, verify=False):
            scores = _scores(model, cases, 64)
        report["runs"].append({"set": name, "n": len(cases),
                               "requests_sharing_a_key": sum(v for v in counts.values() if v > 1),
                               **scores, "seconds": time.perf_counter() - t})
        print(report["runs"][-1], file=sys.stderr, flush=True)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    (a.out_dir / "mass_editing_keys.json").write_text(json.dumps(to_jsonable(report), indent=1) + "\n")
    pc = lambda x: f"{100 * x:.1f}" if x is not None else "–"  # noqa: E731
    fbk, kp = report["fact_base"], report["known_pool"]
    lines = [f"# Shared keys in batched editing ({a.model}, layer(s) {report['layers']}, λ = {a.lam:g})", "",
             f"The fact base has {fbk['facts']} facts about {fbk['subjects']} subjects, whose names end in "
             f"{fbk['subject_final_tokens']} distinct tokens; the first {kp['n']} known requests name "
             f"{kp['subjects']} subjects and {kp['key_tokens']} distinct key tokens. A 1,000-request set therefore "
             "cannot avoid requests that share a key.", "",
             "| request set | n | requests sharing a key | ES | PS | NS |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['set']} | {r['n']} | {r['requests_sharing_a_key']} | {pc(r['es'])} | {pc(r['ps'])} | {pc(r['ns'])} |"
              for r in report["runs"]]
    (a.out_dir / "mass_editing_keys.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    torch.set_grad_enabled(True)
    raise SystemExit(main())
