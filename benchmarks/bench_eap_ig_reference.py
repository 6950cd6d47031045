"""EAP and EAP-IG against the EAP-IG authors' own code (Hanna et al. 2024), same weights, pairs and edges.

    git -C /path/to/EAP-IG archive HEAD src | tar -x -C /tmp/eap-ig     # github.com/hannamw/EAP-IG
    python benchmarks/bench_eap_ig_reference.py --eap-src /tmp/eap-ig/src [--pairs 20] [--steps 5 50]
        [--out benchmarks/RESULTS_eap_ig_reference.md]

The authors' package (``eap``: ``attribute.get_scores_eap`` and ``get_scores_eap_ig``, their graph
``Graph.from_model``) runs on a TransformerLens ``HookedTransformer`` holding gpt2-facts's weights
(``bench_circuits.to_transformer_lens``: split q/k/v inputs, per-head results and MLP inputs on). It is read
from ``--eap-src`` and copied to a temporary folder, never into this package; the one change made to the copy is
the device of their score matrices (``device='cuda'`` → the model's device), so that it runs on a CPU. Their
``tokenize_plus`` (which needs a tokenizer TransformerLens would download) is replaced by a lookup of the very
token ids our task holds for each prompt (BOS + prompt, one length: the task's pairs of its most common
length), so both sides see the same tokens. Metric: ``logit[answer] − logit[other answer]`` at the last
position, summed over a batch (their scores are then divided by the number of pairs: the pair mean, as ours).

Their graph names edges as ours do (``a0.h3->a2.h1<q>``, ``input->m0``, ``m5->logits``); each of their edges is
matched to ours by name. Reported: Spearman ρ (goal ≥ 0.99 for the same method) and the largest difference
relative to the largest |score|, for EAP and for EAP-IG on the inputs path at each ``--steps``. The two
EAP-IG implementations integrate the same path with different points: theirs at ``k/m`` of the way from the
corrupted to the clean input, ``k = 0 … m−1`` (the corrupted end included, the clean end not); ours at the
midpoints ``(i + ½)/m`` — so at few steps they differ by the quadrature, and they converge as ``m`` grows.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from scipy.stats import spearmanr

import gpt2_interp as gi
from gpt2_interp.analysis.circuits import edge_scores, fact_recall, graph_of
from gpt2_interp.experiments.provenance import standalone, write_beside

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_circuits import aligned_pairs, to_transformer_lens


def import_authors(src: Path) -> Any:
    """The authors' ``eap`` package from ``src`` (a folder holding ``eap/``), copied to a temporary folder
    with its score matrices allocated on the model's device instead of ``'cuda'``."""
    if not (src / "eap" / "attribute.py").is_file():
        raise FileNotFoundError(f"{src} holds no eap/attribute.py (the EAP-IG repository's src folder)")
    tmp = Path(tempfile.mkdtemp(prefix="eap-ig-"))
    shutil.copytree(src / "eap", tmp / "eap")
    for f in (tmp / "eap").glob("*.py"):
        text = f.read_text()
        f.write_text(re.sub(r"device='cuda'", "device=model.cfg.device", text))
    sys.path.insert(0, str(tmp))
    return importlib.import_module("eap.attribute"), importlib.import_module("eap.graph")


def authors_scores(attribute: Any, graph_mod: Any, ref: Any, task: Any, method: str, steps: int) -> dict[str, float]:
    """Their scores by edge name: ``method`` ``"eap"`` or ``"eap-ig"`` (``steps`` points)."""
    tokens = dict(zip(task.clean, task.clean_tokens)) | dict(zip(task.corrupted, task.corrupted_tokens))

    def tokenize_plus(model: Any, inputs: list[str], max_length: int | None = None) -> tuple:
        t = torch.stack([tokens[p] for p in inputs])
        mask = torch.ones_like(t)
        return t, mask, mask.sum(1), t.shape[1]

    attribute.tokenize_plus = tokenize_plus
    label = torch.stack([task.answers, task.wrongs], 1)

    def metric(logits: torch.Tensor, clean_logits: Any, input_lengths: torch.Tensor, lab: torch.Tensor) -> Any:
        rows = torch.arange(len(logits))
        last = logits[rows, input_lengths - 1]
        return (last[rows, lab[:, 0]] - last[rows, lab[:, 1]]).sum()

    batches = [(list(task.clean), list(task.corrupted), label)]
    graph = graph_mod.Graph.from_model(ref)
    if method == "eap":
        s = attribute.get_scores_eap(ref, graph, batches, metric, quiet=True)
    else:
        s = attribute.get_scores_eap_ig(ref, graph, batches, metric, steps=steps, quiet=True)
    return {name: float(s[e.matrix_index]) for name, e in graph.edges.items()}


def compare(ours: torch.Tensor, theirs: dict[str, float], names: list[str]) -> tuple[float, float]:
    t = torch.tensor([theirs[n] for n in names])
    rho = float(spearmanr(ours.numpy(), t.numpy()).statistic)
    return rho, float((ours - t).abs().max() / t.abs().max())


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--eap-src", type=Path, required=True, help="the EAP-IG repository's src folder")
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--steps", type=int, nargs="+", default=[5, 50])
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    attribute, graph_mod = import_authors(a.eap_src)
    model = gi.load("gpt2-facts")
    ref = to_transformer_lens(model)
    task = aligned_pairs(fact_recall(model, n=a.pairs, seed=0))
    names = graph_of(model).edges
    load0 = os.getloadavg()[0]
    rows: list[str] = []
    data: dict[str, Any] = {"pairs": len(task), "edges": len(names)}
    kept: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}
    for method, steps in [("eap", 1)] + [("eap-ig", s) for s in a.steps]:
        t = time.perf_counter()
        ours = edge_scores(
            model,
            task.clean_tokens,
            task.corrupted_tokens,
            task.metric,
            method=method,
            ig_steps=steps,
            progress=False,
        ).scores
        t_ours = time.perf_counter() - t
        t = time.perf_counter()
        theirs = authors_scores(attribute, graph_mod, ref, task, method, steps)
        t_theirs = time.perf_counter() - t
        missing = set(names) ^ set(theirs)
        if missing:
            raise AssertionError(f"edges not matched by name: {sorted(missing)[:5]}")
        rho, rel = compare(ours, theirs, names)
        kept[(method, steps)] = (ours, torch.tensor([theirs[n] for n in names]))
        label = "EAP" if method == "eap" else f"EAP-IG, inputs, {steps} steps"
        rows.append(f"| {label} | {rho:.6f} | {rel:.1e} | {t_ours:.1f} | {t_theirs:.1f} |")
        data[label] = {"rho": rho, "max_rel_diff": rel, "seconds_ours": t_ours, "seconds_theirs": t_theirs}
    quad = []
    lo, hi = min(a.steps), max(a.steps)
    if lo < hi:  # which points integrate better at few steps: both against the authors' at the most steps
        ref_scores = kept[("eap-ig", hi)][1]
        for who, i in (("ours (midpoints)", 0), ("the authors' (from the corrupted end)", 1)):
            x = kept[("eap-ig", lo)][i]
            r = float(spearmanr(x.numpy(), ref_scores.numpy()).statistic)
            err = float((x - ref_scores).abs().max() / ref_scores.abs().max())
            quad.append(f"| {who} | {r:.4f} | {err:.1e} |")
            data[f"{lo} steps vs {hi}, {who}"] = {"rho": r, "max_rel_diff": err}
        quad = [
            "",
            f"Quadrature at {lo} steps, each against the authors' EAP-IG at {hi} steps (the integral it converges to):",
            "",
            f"| {lo}-step points | Spearman ρ | largest difference ÷ largest \\|score\\| |",
            "|---|---|---|",
            *quad,
        ]
    now = datetime.now(timezone.utc)
    text = "\n".join(
        [
            f"gpt2-facts, {len(task)} fact-recall pairs of {task.clean_tokens.shape[1]} tokens (BOS included), "
            f"{len(names)} edges, every one matched by name; torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads; load average {load0:.1f} before, {os.getloadavg()[0]:.1f} after; "
            f"{now:%Y-%m-%d %H:%M} UTC.",
            "",
            "| method | Spearman ρ, ours vs the authors' | largest difference ÷ largest \\|score\\| "
            "| ours s | theirs s |",
            "|---|---|---|---|---|",
            *rows,
            *quad,
        ]
    )
    print(text)
    if a.out:
        a.out.write_text(
            "# EAP and EAP-IG against the authors' code\n\n`python benchmarks/bench_eap_ig_reference.py`\n\n"
            + __doc__.split("\n\n", 2)[2].strip()
            + "\n\n"
            + text
            + "\n"
        )
        write_beside(a.out, standalone(sys.argv))
    return data


if __name__ == "__main__":
    main()
