"""Where do facts live in gpt2-facts? ROME's Figure 2, averaged over the embedded fact base.

    python analyses/causal_trace.py [--facts 120] [--quick] [--out-dir analyses/results]
    python analyses/causal_trace.py --model smollm2-135m --known-only --facts 120

``--known-only`` traces only facts the model knows (``known_facts.known_facts``: top-1 on the first
training prompt, an informative first object token), spread over relations — for a real model that
knows a fraction of the fact base. Files of a model other than gpt2-facts are named
``causal_trace_<model>.*``.

Causal traces (hidden states, MLP and attention outputs) of the fact model on the first
training template of a spread of facts, averaged over the facts it knows in ROME's six position
buckets. Writes ``causal_trace.png`` and ``causal_trace.json`` and prints a one-sentence finding
computed from the numbers (where the MLP indirect effect at the last subject token peaks, and
how it compares with the last token).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

import gpt2_interp as gi
from gpt2_interp.analysis.tracing import KINDS, AverageTrace, average_trace, default_window, embedding_std
from gpt2_interp.facts.base import FactBase

RESULTS = Path(__file__).resolve().parent / "results"


def pick_facts(fb: FactBase, n: int, seed: int = 0, among: list | None = None) -> list:
    """``n`` facts spread evenly over the relations (random within each, fixed seed), from ``among``
    (default: the whole fact base)."""
    rng = random.Random(seed)
    pool = fb.facts() if among is None else among
    per = {r: rng.sample(fs, len(fs)) for r in fb.relations for fs in [[f for f in pool if f.relation == r]]}
    out: list = []
    while len(out) < n and any(per.values()):
        for r in fb.relations:
            if per[r] and len(out) < n:
                out.append(per[r].pop())
    return out


def finding(avg: AverageTrace, model_name: str = "gpt2-facts") -> str:
    """One sentence on where the facts are recalled, computed from the averaged indirect effects."""
    ie = {k: avg.indirect_effect[i] for i, k in enumerate(avg.kinds)}
    row = {b: j for j, b in enumerate(avg.buckets)}
    subj, last = row["last subject token"], row["last token"]
    n = len(avg.layer_labels)

    def peak(kind: str, r: int) -> tuple[int, float]:
        layer = int(ie[kind][r].argmax())
        return layer, float(ie[kind][r, layer])

    mlp_l, mlp_v = peak("mlp", subj)
    attn_l, attn_v = peak("attn", last)
    hid = ie["hidden"]
    # the last layer where the last subject token's state still matters, the first where the last token's does
    subj_until = max(l for l in range(n) if hid[subj, l] >= 0.5 * hid[subj].max())
    last_from = min(l for l in range(n) if hid[last, l] >= 0.5 * hid[last].max())
    stage = "early" if mlp_l < n / 3 else "middle" if mlp_l < 2 * n / 3 else "late"
    attn_stage = "early" if attn_l < n / 3 else "middle" if attn_l < 2 * n / 3 else "late"
    mlp_last = peak("mlp", last)[1]
    if mlp_v > mlp_last and attn_l > mlp_l and subj_until <= last_from:
        reading = "the fact is looked up at the subject and moved to the last token by attention"
    else:
        reading = "this does not separate a lookup at the subject from a move to the last token as ROME found"
    return (
        f"Over the {avg.n_known} facts {model_name} knows (of {avg.n_facts} traced; {n} layers, window {avg.window}), "
        f"restoring the {stage} MLPs (window centred on layer {mlp_l}) at the last subject token recovers an average "
        f"indirect effect of {mlp_v:.2f} ({'more' if mlp_v > mlp_last else 'less'} than any MLP window at the last token, "
        f"{mlp_last:.2f}), while attention at the last token peaks {'later' if attn_l > mlp_l else 'no later'} "
        f"({attn_stage} layers, layer {attn_l}, {attn_v:.2f}); the last subject token's hidden "
        f"state matters up to layer {subj_until} and the last token's from layer {last_from} on (≥ half its peak): "
        f"{reading} (clean p = {avg.clean_score:.3f}, corrupted p = {avg.corrupted_score[0]:.3f})."
    )


def peaks(avg: AverageTrace) -> dict:
    """Per kind, the (bucket, layer) cell of largest average indirect effect, and per kind and bucket
    the peak layer — the numbers to set beside ROME's GPT-2 XL finding."""
    out: dict = {"peaks": {}}
    for i, k in enumerate(avg.kinds):
        ie = avg.indirect_effect[i]  # [bucket, layer]
        b, l = divmod(int(ie.argmax()), ie.shape[1])
        out["peaks"][k] = {"bucket": avg.buckets[b], "layer": l, "indirect_effect": round(float(ie[b, l]), 4),
                           "by_bucket": {bk: {"layer": int(ie[j].argmax()), "indirect_effect": round(float(ie[j].max()), 4)}
                                         for j, bk in enumerate(avg.buckets)}}
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--facts", type=int, default=120, help="facts to trace (spread over relations)")
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--noise", type=float, default=3.0, help="noise std as a multiple of σ (see --sigma)")
    ap.add_argument("--sigma", choices=["subjects", "W_E"], default="subjects",
                    help="σ: std of the fact base's subject-token embeddings (ROME's choice; default) or of all of W_E "
                         "(most of gpt2-facts' vocabulary is untrained, which makes std(W_E) small)")
    ap.add_argument("--window", type=int, default=None,
                    help="mlp/attn window (default: half the layers up to 12 layers, else ROME's 10/48 of the depth)")
    ap.add_argument("--known-only", action="store_true", help="trace only facts the model knows (see module doc)")
    ap.add_argument("--quick", action="store_true", help="8 facts, 3 samples (a smoke test, < 30 s)")
    ap.add_argument("--model", default="gpt2-facts")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    if a.quick:
        a.facts, a.samples = 8, 3
    torch.manual_seed(0)
    model = gi.load(a.model)
    # wider than tracing.default_window (1 layer here): a 3-layer window shows where the MLPs'
    # effect lives as a band the eye can follow; the per-request layer choice uses the default
    n_layer = model.cfg.n_layer
    window = a.window or (max(1, n_layer // 2) if n_layer <= 12 else default_window(n_layer))
    fb = FactBase.load()
    among = None
    if a.known_only:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from known_facts import known_facts_saved

        among = known_facts_saved(model, fb)
    facts = pick_facts(fb, a.facts, among=among)
    t0 = time.perf_counter()
    sigma = (embedding_std(model, fb.subject_texts()) if a.sigma == "subjects"
             else float(model.W_E.float().std()))
    avg = average_trace(model, fb.cases(facts), kind=KINDS, noise=a.noise * sigma, samples=a.samples, window=window)
    seconds = time.perf_counter() - t0
    sentence = finding(avg, a.model)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    stem = "causal_trace" if a.model == "gpt2-facts" else f"causal_trace_{a.model}"
    avg.save_plot(a.out_dir / f"{stem}.png")
    out = {"finding": sentence, "seconds": round(seconds, 2), "model": a.model, "known_only": a.known_only,
           "noise": f"{a.noise} × σ_{a.sigma} = {a.noise * sigma:.4g}", **peaks(avg), **avg.to_dict()}
    (a.out_dir / f"{stem}.json").write_text(json.dumps(out, indent=1) + "\n")
    print(sentence)
    print(f"({avg.n_known}/{avg.n_facts} facts known; {seconds:.1f} s; figure and JSON in {a.out_dir})")
    return out


if __name__ == "__main__":
    main()
