"""Our attribution graph against circuit-tracer 0.5's on the same model, transcoders and prompt: node set,
adjacency, pruning, scores and wall time; once with per-layer transcoders and once with a cross-layer transcoder
(CLT), and a CLT that circuit-tracer writes read by ours.

    OMP_NUM_THREADS=1 python benchmarks/compare_circuit_tracer.py [--python /work/venvs/ct/bin/python]
        [--d-sae 1024] [--prompt "..."] [--batch-size 64] [--repeats 3] [--out benchmarks/RESULTS_circuit_tracer.md]

circuit-tracer pins ``transformers<=4.57.3`` and runs on TransformerLens, so it lives in a Python environment of
its own (``--python``, default ``$CIRCUIT_TRACER_PYTHON`` or ``/work/venvs/ct/bin/python``; made with
``python3 -m venv /work/venvs/ct && /work/venvs/ct/bin/pip install torch circuit-tracer==0.5.0``). This side
(gpt2-interp's environment) loads the embedded ``gpt2-facts`` model, makes one transcoder per layer (BatchTopK,
so circuit-tracer reads its threshold as a JumpReLU, with a linear skip; random weights, random biases and
thresholds, seeded: every term of the maths is exercised and nothing is trained) and writes into a temporary
folder the model as a transformers GPT-2 folder, the transcoders in circuit-tracer's layout
(:meth:`~gpt2_interp.graphs.transcoder.TranscoderSet.save`), the prompt's token ids (BOS first) and our graph's
adjacency. ``benchmarks/circuit_tracer_side.py`` then runs in the other environment on the same files (see its
docstring) and writes circuit-tracer's graph, its pruning and its pruning of our adjacency.

Both sides run in float32 (timed) and again in float64 (the same weights, cast; the algorithms without
float32's rounding). Compared: the feature nodes ``(layer, position, feature)`` and their activations, the
logit nodes; the adjacency (the largest difference over all entries, relative to the largest entry, and the
largest relative difference on the edges circuit-tracer's pruning keeps), in each precision and each side's
float32 graph against its own float64 one; pruning (ours and
circuit-tracer's ``prune_graph`` on our adjacency: node and edge masks) and the replacement and completeness
scores; wall time of one ``attribute`` call (median of ``--repeats`` after one warm-up; each side in its own
process with one thread; ours timed before and after circuit-tracer's runs).

The CLT leg does the same with one BatchTopK cross-layer transcoder (:func:`make_clt`: ``--d-sae`` features per
layer, random encoders, decoders into every later layer, biases and thresholds, seeded; no skip, as
circuit-tracer's CLT file loader reads none), written by
:meth:`~gpt2_interp.graphs.clt.CrossLayerTranscoder.save` and read on the other side by circuit-tracer's own
loader (``load_transcoder_from_hub`` of the folder's absolute path, which calls ``load_clt``). Then the other way
(``circuit_tracer_side.py --write-clt``): circuit-tracer makes a random JumpReLU CLT of its own (float64),
writes it with its ``to_safetensors`` and a ``config.yaml`` of its keys, and computes its ``forward`` on random
MLP inputs; this side loads the folder with :func:`~gpt2_interp.graphs.clt.load_transcoders` and compares its
outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
PROMPT = "The capital of France is Paris. The capital of Spain is Madrid. The capital of Italy is"


def default_python() -> Path:
    """The circuit-tracer environment's interpreter: ``$CIRCUIT_TRACER_PYTHON`` or ``/work/venvs/ct/bin/python``."""
    return Path(os.environ.get("CIRCUIT_TRACER_PYTHON", "/work/venvs/ct/bin/python"))


def make_transcoders(model: Any, d_sae: int, seed: int = 0) -> Any:
    """Random BatchTopK transcoders with a skip: ``b_enc ~ N(0, 0.3)``, thresholds uniform in [1.5, 2.5] (about 2 %
    of the features fire: pre-activations are ``N(b_enc, 1)``), ``b_dec ~ N(0, 0.1)``, ``W_skip ~ N(0, 0.05)``."""
    from gpt2_interp.graphs.transcoder import TranscoderTrainConfig, new_transcoders

    ts = new_transcoders(model, TranscoderTrainConfig(d_sae=d_sae, k=8, architecture="batchtopk", skip=True, seed=seed))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in ts:
            t.b_enc.copy_(0.3 * torch.randn(t.b_enc.shape, generator=g))
            t.threshold.copy_(1.5 + torch.rand(t.threshold.shape, generator=g))
            t.b_dec.copy_(0.1 * torch.randn(t.b_dec.shape, generator=g))
            t.W_skip.copy_(0.05 * torch.randn(t.W_skip.shape, generator=g))
    return ts


def make_clt(model: Any, d_sae: int, seed: int = 0) -> Any:
    """A random BatchTopK CLT without a skip, drawn as :func:`make_transcoders` draws a layer:
    ``W_enc ~ N(0, 1/d_model)`` (pre-activations about ``N(b_enc, 1)``), ``b_enc ~ N(0, 0.3)``, thresholds
    uniform in [1.5, 2.5], ``b_dec ~ N(0, 0.1)``, and each decoder ``W_dec[ℓ] ~ N(0, 1/(d_model (n − ℓ)))`` (a
    feature's decoders into the ``n − ℓ`` layers together about unit norm)."""
    from gpt2_interp.graphs.clt import CLTTrainConfig, new_cross_layer_transcoder

    clt = new_cross_layer_transcoder(model, CLTTrainConfig(d_sae=d_sae, k=8, architecture="batchtopk", seed=seed))
    g = torch.Generator().manual_seed(seed)
    n, d = clt.n_layers, clt.cfg.d_model
    with torch.no_grad():
        assert clt.threshold is not None
        clt.W_enc.copy_(torch.randn(clt.W_enc.shape, generator=g) / d**0.5)
        clt.b_enc.copy_(0.3 * torch.randn(clt.b_enc.shape, generator=g))
        clt.threshold.copy_(1.5 + torch.rand(clt.threshold.shape, generator=g))
        clt.b_dec.copy_(0.1 * torch.randn(clt.b_dec.shape, generator=g))
        for L, w in enumerate(clt.W_dec):
            w.copy_(torch.randn(w.shape, generator=g) / (d * (n - L)) ** 0.5)
    return clt.eval()


def _edges(ours: torch.Tensor, theirs: torch.Tensor, kept: torch.Tensor) -> dict[str, float]:
    """How two adjacencies ``[n, n]`` differ: the largest difference relative to the largest entry, and the
    largest relative difference on the ``kept`` edges (a mask)."""
    diff = (ours - theirs).abs()
    return {
        "max_rel_to_largest": float(diff.max() / theirs.abs().max()),
        "kept_max_rel": float((diff[kept] / theirs[kept].abs()).max()),
    }


def compare(
    python: Path,
    d_sae: int = 1024,
    prompt: str = PROMPT,
    batch_size: int = 64,
    repeats: int = 3,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
    dtypes: tuple[str, ...] = ("float32", "float64"),
    kind: str = "transcoders",
) -> dict[str, Any]:
    """Run both sides (see the module's docstring) with per-layer transcoders (``kind`` ``"transcoders"``) or
    a CLT (``"clt"``) in each of ``dtypes`` (float32, float64: the algorithms without float32's rounding),
    timing ``repeats`` calls in the first; the measurements as a dict."""
    import copy
    import dataclasses

    from safetensors.torch import load_file, save_file

    import gpt2_interp as gi
    from gpt2_interp.graphs.attribution import AttributionConfig, attribute
    from gpt2_interp.graphs.prune import graph_scores, prune_graph
    from gpt2_interp.model.fingerprint import weights_fingerprint

    torch.set_num_threads(1)
    model = gi.load("gpt2-facts")
    ts = make_transcoders(model, d_sae) if kind == "transcoders" else make_clt(model, d_sae)
    tokens = model.to_tokens(prompt)[0]
    cfg = AttributionConfig(batch_size=batch_size)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH="", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    graphs, theirs, info = {}, {}, {}
    ours_s: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model.to_transformers().save_pretrained(work / "model")
        ts.save(work / kind)
        job = {
            "model_name": model.cfg.name,
            "tokens": tokens.tolist(),
            "max_n_logits": cfg.max_n_logits,
            "desired_logit_prob": cfg.desired_logit_prob,
            "node_threshold": node_threshold,
            "edge_threshold": edge_threshold,
        }
        (work / "job.json").write_text(json.dumps(job))

        def ours_timed(m: Any, t: Any) -> None:
            for _ in range(repeats):
                start = time.perf_counter()
                attribute(m, t, tokens, cfg)
                ours_s.append(time.perf_counter() - start)

        for dtype in dtypes:
            m, t = model, ts
            if dtype == "float64":
                m, t = copy.deepcopy(model).to(torch.float64), copy.deepcopy(ts)
                for one in t if kind == "transcoders" else [t]:  # the same weights, cast, for the cast model
                    one.to(torch.float64)
                    one.cfg = dataclasses.replace(one.cfg, base_fingerprint=weights_fingerprint(m))
            timed = dtype == dtypes[0]
            graph = graphs[dtype] = attribute(m, t, tokens, cfg)  # the warm-up of the timed runs
            if timed:
                ours_timed(m, t)
            save_file(
                {
                    "adjacency": graph.adjacency.contiguous(),
                    "features": graph.features.contiguous(),
                    "activations": graph.activations.contiguous(),
                    "logit_probabilities": graph.logit_probabilities.contiguous(),
                },
                str(work / f"ours_{kind}_{dtype}.safetensors"),
            )
            n_runs = repeats if timed else 0
            side = [str(python), str(HERE / "circuit_tracer_side.py"), str(work), "--batch-size", str(batch_size)]
            side += ["--repeats", str(n_runs), "--dtype", dtype, "--kind", kind]
            out = subprocess.run(side, capture_output=True, text=True, env=env, check=False)
            if out.returncode:
                raise RuntimeError(f"circuit-tracer's side failed:\n{out.stderr[-4000:]}")
            if timed:
                ours_timed(m, t)  # ours again, after theirs: a change of load hits both
            theirs[dtype] = load_file(work / f"theirs_{kind}_{dtype}.safetensors")
            info[dtype] = json.loads((work / f"theirs_{kind}_{dtype}.json").read_text())

    first = dtypes[0]
    graph, th = graphs[first], theirs[first]
    same_features = all(torch.equal(graphs[d].features, theirs[d]["features"].to(torch.long)) for d in graphs)
    same_logits = all(torch.equal(graphs[d].logit_tokens, theirs[d]["logit_tokens"].to(torch.long)) for d in graphs)
    result: dict[str, Any] = {
        "kind": kind,
        "prompt": prompt,
        "n_tokens": len(tokens),
        "d_sae": d_sae,
        "batch_size": batch_size,
        "n_features": graph.n_features,
        "n_features_theirs": len(th["features"]),
        "n_nodes": len(graph.adjacency),
        "n_logits": len(graph.logit_tokens),
        "same_features": same_features,
        "same_logit_tokens": same_logits,
        "ours_seconds": ours_s,
        "theirs_seconds": info[first]["seconds"],
        "ours_median_s": statistics.median(ours_s) if ours_s else None,
        "theirs_median_s": info[first]["median_s"],
        "threads": [torch.get_num_threads(), info[first]["threads"]],
        "versions": info[first]["versions"],
    }
    if not (same_features and same_logits):
        return result
    kept = th["edge_mask"] & (th["adjacency"] != 0)
    pruned = prune_graph(graph, node_threshold, edge_threshold)
    assert pruned.node_mask is not None and pruned.edge_mask is not None
    result |= {
        "activation_max_rel": float(((graph.activations - th["activations"]).abs() / th["activations"].abs()).max()),
        "logit_prob_max_abs": float((graph.logit_probabilities - th["logit_probabilities"]).abs().max()),
        "adjacency_max_entry": float(th["adjacency"].abs().max()),
        "nonzero_pattern_equal": torch.equal(graph.adjacency != 0, th["adjacency"] != 0),
        "n_edges": int((th["adjacency"] != 0).sum()),
        "n_kept_edges": int(kept.sum()),
        **{d: _edges(graphs[d].adjacency, theirs[d]["adjacency"], kept) for d in dtypes},
        "prune_node_mask_equal": torch.equal(pruned.node_mask, th["ours_node_mask"]),
        "prune_edge_mask_equal": torch.equal(pruned.edge_mask, th["ours_edge_mask"]),
        "prune_nodes_kept": [int(pruned.node_mask.sum()), int(th["ours_node_mask"].sum())],
        "prune_edges_kept": [int(pruned.edge_mask.sum()), int(th["ours_edge_mask"].sum())],
        "theirs_prune_on_theirs_equal": torch.equal(th["ours_node_mask"], th["node_mask"])
        and torch.equal(th["ours_edge_mask"], th["edge_mask"]),
        "scores_ours": list(graph_scores(graph)),
        "scores_theirs_on_ours": info[first]["ours_scores"],
        "scores_theirs": info[first]["scores"],
    }
    if set(dtypes) == {"float32", "float64"}:
        a64, t64 = graphs["float64"].adjacency, theirs["float64"]["adjacency"]
        result["ours_float32_vs_float64"] = _edges(graphs["float32"].adjacency, a64, kept)
        result["theirs_float32_vs_float64"] = _edges(theirs["float32"]["adjacency"], t64, kept)
    return result


def read_circuit_tracers_clt(python: Path) -> dict[str, Any]:
    """A CLT circuit-tracer writes (``circuit_tracer_side.py --write-clt``: its own random JumpReLU CLT, saved by
    its ``to_safetensors`` in float32 with a ``config.yaml`` of its keys, its ``forward`` computed in float64 on
    random MLP inputs), loaded by :func:`~gpt2_interp.graphs.clt.load_transcoders`, cast to float64 and run on
    the same inputs: the largest differences of the features and of the outputs."""
    from safetensors.torch import load_file

    from gpt2_interp.graphs.clt import CrossLayerTranscoder, load_transcoders

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH="", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        side = [str(python), str(HERE / "circuit_tracer_side.py"), str(work), "--write-clt"]
        out = subprocess.run(side, capture_output=True, text=True, env=env, check=False)
        if out.returncode:
            raise RuntimeError(f"circuit-tracer's side failed:\n{out.stderr[-4000:]}")
        files = sorted(p.name for p in (work / "clt").iterdir())
        clt = load_transcoders(work / "clt")
        io = load_file(work / "clt_io.safetensors")
    assert isinstance(clt, CrossLayerTranscoder)
    clt = clt.to(torch.float64)
    x, want, feats = io["x"], io["out"], io["features"]
    with torch.no_grad():
        got = torch.stack(clt(list(x)))
        acts = torch.stack([clt.encode(L, x[L]) for L in range(clt.n_layers)])
    return {
        "files": files,
        "shape": [clt.n_layers, clt.cfg.d_sae, clt.cfg.d_model],
        "architecture": clt.cfg.architecture,
        "n_positions": x.shape[1],
        "active": [int((acts != 0).sum()), int((feats != 0).sum())],
        "same_active": torch.equal(acts != 0, feats != 0),
        "features_max_abs": float((acts - feats).abs().max()),
        "out_max_abs": float((got - want).abs().max()),
        "out_max_rel_to_largest": float((got - want).abs().max() / want.abs().max()),
    }


def report(r: dict[str, Any], argv: list[str]) -> str:
    """The results page (markdown)."""
    first = r["transcoders"]
    lines = [
        "# Attribution graphs against circuit-tracer 0.5",
        "",
        f"Command: `OMP_NUM_THREADS=1 python benchmarks/compare_circuit_tracer.py {' '.join(argv)}`".replace(" `", "`")
        if not argv
        else f"Command: `OMP_NUM_THREADS=1 python benchmarks/compare_circuit_tracer.py {' '.join(argv)}`",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs (shared), Python {platform.python_version()}; CPU, "
        f"float32 (timed) and float64, one thread each side. circuit-tracer's side: "
        + ", ".join(f"{k} {v}" for k, v in first["versions"].items())
        + ".",
        "",
        f"Model `gpt2-facts` (6 layers, d_model 256); prompt {first['prompt']!r} ({first['n_tokens']} tokens with "
        f"BOS); batch size {first['batch_size']} on both sides; max_n_logits 10, desired_logit_prob 0.95.",
        "",
        "## Per-layer transcoders",
        "",
        f"One BatchTopK transcoder per layer, d_tc {first['d_sae']}, with a skip, random weights, biases and "
        "thresholds (seeded), written by `TranscoderSet.save` and read by circuit-tracer's `load_transcoder_from_hub`.",
        "",
        *_table(first),
    ]
    if "clt" in r:
        c = r["clt"]
        lines += [
            "## Cross-layer transcoder",
            "",
            f"One BatchTopK CLT, d_tc {c['d_sae']} per layer, decoders into every later layer, "
            "no skip (circuit-tracer's "
            "CLT file loader reads none), random weights, biases and thresholds (seeded), written by "
            "`CrossLayerTranscoder.save` and read by circuit-tracer's own loader (`load_transcoder_from_hub` of the "
            "folder, which calls `load_clt`).",
            "",
            *_table(c),
        ]
    if "clt_from_circuit_tracer" in r:
        f = r["clt_from_circuit_tracer"]
        n, d_tc, d = f["shape"]
        lines += [
            "## A CLT circuit-tracer writes, read by gpt2-interp",
            "",
            f"circuit-tracer's own random JumpReLU `CrossLayerTranscoder` ({n} layers, d_tc {d_tc}, d_model {d}), "
            f"saved by its `to_safetensors` (float32) with a `config.yaml` of its keys ({', '.join(f['files'])}); "
            f"loaded by `load_transcoders` (read as {f['architecture']}), both cast to float64 and run on the same "
            f"random MLP inputs ({f['n_positions']} positions per layer).",
            "",
            "| check | result |",
            "|---|---|",
            f"| active features, ours and circuit-tracer's `encode` | {f['active'][0]}, {f['active'][1]}: "
            f"{'identical' if f['same_active'] else 'DIFFERENT'} |",
            f"| feature values, largest difference | {f['features_max_abs']:.1e} |",
            f"| every layer's output (`forward`), largest difference ÷ largest entry | "
            f"{f['out_max_rel_to_largest']:.1e} |",
            "",
        ]
    return "\n".join(lines)


def _table(r: dict[str, Any]) -> list[str]:
    """One kind's comparison as markdown table rows."""
    speed = r["theirs_median_s"] / r["ours_median_s"]
    lines = [
        "| check | result |",
        "|---|---|",
        f"| feature nodes (layer, position, feature), in order | {r['n_features']} ours, {r['n_features_theirs']} "
        f"circuit-tracer: {'identical' if r['same_features'] else 'DIFFERENT'} |",
        f"| logit nodes | {r['n_logits']}: {'identical' if r['same_logit_tokens'] else 'DIFFERENT'} |",
    ]
    if "n_kept_edges" in r:
        lines += [
            f"| feature activations, largest relative difference | {r['activation_max_rel']:.1e} |",
            f"| logit probabilities, largest difference | {r['logit_prob_max_abs']:.1e} |",
            f"| adjacency ({r['n_nodes']}² entries, {r['n_edges']} non-zero): same non-zero pattern | "
            f"{r['nonzero_pattern_equal']} |",
            f"| adjacency, float32: largest difference ÷ largest entry ({r['adjacency_max_entry']:.3g}) | "
            f"{r['float32']['max_rel_to_largest']:.1e} |",
            f"| the {r['n_kept_edges']} edges circuit-tracer's pruning keeps, float32: largest relative difference | "
            f"{r['float32']['kept_max_rel']:.1e} |",
            f"| same, each side's float32 graph against its own float64 graph: ours, circuit-tracer | "
            f"{r['ours_float32_vs_float64']['kept_max_rel']:.1e}, "
            f"{r['theirs_float32_vs_float64']['kept_max_rel']:.1e} |",
            f"| both sides in float64: largest difference ÷ largest entry; on the kept edges, largest relative | "
            f"{r['float64']['max_rel_to_largest']:.1e}; {r['float64']['kept_max_rel']:.1e} |",
            f"| pruning our adjacency (node 0.8, edge 0.98), ours vs circuit-tracer's `prune_graph`: node mask | "
            f"{'identical' if r['prune_node_mask_equal'] else 'DIFFERENT'} ({r['prune_nodes_kept'][0]} vs "
            f"{r['prune_nodes_kept'][1]} kept) |",
            f"| same, edge mask | {'identical' if r['prune_edge_mask_equal'] else 'DIFFERENT'} "
            f"({r['prune_edges_kept'][0]} vs {r['prune_edges_kept'][1]} kept) |",
            f"| circuit-tracer's pruning of its own graph = of ours | {r['theirs_prune_on_theirs_equal']} |",
            f"| replacement, completeness score: ours | {r['scores_ours'][0]:.6f}, {r['scores_ours'][1]:.6f} |",
            f"| same, circuit-tracer's `compute_graph_scores` on our graph | {r['scores_theirs_on_ours'][0]:.6f}, "
            f"{r['scores_theirs_on_ours'][1]:.6f} |",
            f"| same, on its own graph | {r['scores_theirs'][0]:.6f}, {r['scores_theirs'][1]:.6f} |",
        ]
    lines += [
        f"| `attribute` wall time, median (s): ours | {r['ours_median_s']:.3f} "
        f"(runs {', '.join(f'{s:.3f}' for s in r['ours_seconds'])}) |",
        f"| same, circuit-tracer | {r['theirs_median_s']:.3f} "
        f"(runs {', '.join(f'{s:.3f}' for s in r['theirs_seconds'])}) |",
        f"| circuit-tracer ÷ ours | {speed:.2f}× |",
        "",
    ]
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--python", type=Path, default=default_python(), help="circuit-tracer's environment's python")
    ap.add_argument("--d-sae", type=int, default=1024)
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--no-clt", action="store_true", help="per-layer transcoders only")
    a = ap.parse_args(argv)
    if not a.python.is_file():
        sys.exit(f"no circuit-tracer environment at {a.python}: make one (see the docstring) or pass --python")
    r = {"transcoders": compare(a.python, a.d_sae, a.prompt, a.batch_size, a.repeats)}
    if not a.no_clt:
        r["clt"] = compare(a.python, a.d_sae, a.prompt, a.batch_size, a.repeats, kind="clt")
        r["clt_from_circuit_tracer"] = read_circuit_tracers_clt(a.python)
    text = report(r, [x for x in (argv if argv is not None else sys.argv[1:]) if x])
    print(text)
    if a.out:
        Path(a.out).write_text(text)
        (Path(a.out).with_suffix(".json")).write_text(json.dumps(r, indent=1) + "\n")
        from gpt2_interp.experiments.provenance import standalone, write_beside

        write_beside(a.out, standalone(sys.argv))
    return r


if __name__ == "__main__":
    main()
