"""Is a change a speed regression? Time two checkouts of gpt2-interp alternately in one run.

    git worktree add --detach /tmp/old <commit>
    python benchmarks/compare_trees.py /tmp/old . [--rounds 3] [--repeats 5]

For each measurement (forward 8×64, causal trace, resid patching sweep on random full-size gpt2
weights), each round runs the old tree then the new one in fresh processes (so imports cannot mix),
each a warm-up and the median of ``--repeats`` runs; the table gives the median over rounds and the
spread between rounds, which is the noise a difference must beat.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

WORKER = r"""
import sys, time, statistics, json
tree, mode, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, tree)
import torch, transformers
import gpt2_interp as gi
assert gi.__file__.startswith(tree), gi.__file__
torch.manual_seed(0)
m = gi.from_transformers(transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()).eval()
if mode == "forward":
    toks = torch.randint(0, 50257, (8, 64), generator=torch.Generator().manual_seed(0))
    fn = lambda: m(toks)
elif mode == "trace":
    from gpt2_interp.analysis.tracing import causal_trace
    fn = lambda: causal_trace(m, "After a long walk along the river we saw the Eiffel Tower in", "Eiffel Tower",
                              samples=10, progress=False)
else:
    from gpt2_interp.analysis.patching import logit_diff, patch
    fn = lambda: patch(m, "When Mary and John went to the store, John gave a cold drink to",
                       "When Mary and John went to the store, Mary gave a cold drink to", logit_diff(" Mary", " John"),
                       hook="resid_pre", progress=False)
with torch.no_grad():
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter(); fn(); ts.append(time.perf_counter() - t0)
print(json.dumps(statistics.median(ts)))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    trees = [str(a.old.resolve()), str(a.new.resolve())]
    print("| measurement | old (s) | new (s) | new ÷ old | spread between rounds |\n|---|---|---|---|---|")
    for mode in ("forward", "trace", "sweep"):
        got: dict[str, list[float]] = {t: [] for t in trees}
        for _ in range(a.rounds):
            for t in trees:
                out = subprocess.run(
                    [sys.executable, "-c", WORKER, t, mode, str(a.repeats)], check=True, capture_output=True, text=True
                ).stdout
                got[t].append(json.loads(out.strip().splitlines()[-1]))
        old, new = (statistics.median(got[t]) for t in trees)
        spread = max(max(v) / min(v) for v in got.values())
        print(f"| {mode} | {old:.3f} | {new:.3f} | {new / old:.2f}× | {spread:.2f}× |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
