"""Do two checkouts of gpt2-interp compute the same edits? One ROME edit and one MEMIT batch of gpt2-facts.

    git worktree add --detach /tmp/old <commit>
    python benchmarks/compare_edits.py /tmp/old .

Each tree runs in a fresh process (so imports cannot mix) and saves its edits' factors; the table gives the
largest absolute difference of every factor (0 means bit-identical) beside its largest magnitude.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

WORKER = r"""
import sys, torch
tree, out = sys.argv[1], sys.argv[2]
sys.path.insert(0, tree)
import gpt2_interp as gi
from gpt2_interp.editing.memit import compute_edits
from gpt2_interp.editing.rome import compute_edit
assert gi.__file__.startswith(tree), gi.__file__
torch.manual_seed(0)
m = gi.load("gpt2-facts")
rome = compute_edit(m, {"prompt": "The capital of {} is", "subject": "France", "target": " Rome"})
memit = compute_edits(m, [{"prompt": "The capital of {} is", "subject": s, "target": t}
                          for s, t in [("France", " Rome"), ("Germany", " Paris"), ("Italy", " Berlin")]])
torch.save({name: {l: f for l, f in e.factors.items()} for name, e in (("rome", rome), ("memit", memit))}, out)
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old", type=Path)
    ap.add_argument("new", type=Path)
    a = ap.parse_args(argv)
    got = []
    with tempfile.TemporaryDirectory() as d:
        for i, tree in enumerate((a.old, a.new)):
            out = str(Path(d) / f"{i}.pt")
            subprocess.run([sys.executable, "-c", WORKER, str(tree.resolve()), out], check=True)
            got.append(torch.load(out))
    print("| edit | layer | factor | max abs difference | max abs value |\n|---|---|---|---|---|")
    for name in got[0]:
        for layer, factors in got[0][name].items():
            for which, x, y in zip("UV", factors, got[1][name][layer]):
                if x is not None:
                    print(
                        f"| {name} | {layer} | {which} | {(x - y).abs().max().item():.3g} | "
                        f"{x.abs().max().item():.3g} |"
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
