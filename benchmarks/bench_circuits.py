"""Edge scores against auto-circuit (the peer), measured in one run on the same weights, pairs and edges.

    python benchmarks/bench_circuits.py [--pairs 64] [--exact-edges 200] [--out benchmarks/RESULTS_circuits.md]

gpt2-facts (6 layers × 8 heads, 3,628 edges) is converted to a TransformerLens ``HookedTransformer``
(through its transformers copy and TransformerLens's own ``convert_gpt2_weights``) with TransformerLens's
split inputs on (``use_split_qkv_input``, ``use_attn_result``, ``use_hook_mlp_in``) and wrapped by
auto-circuit (``patchable_model(factorized=True, separate_qkv=True, slice_output="last_seq")``), whose
graph has the same senders (input embedding, every head's output, every MLP) and receivers (every head's
q/k/v input, every MLP's input, the final residual) as ours: each of its edges is matched to ours by name.
The pairs: the fact-recall task (:func:`gpt2_interp.analysis.circuits.tasks.fact_recall`), the pairs of
its most common prompt length (auto-circuit takes no attention mask), metric ``logit[answer] − logit[other
answer]`` at the last position (auto-circuit: ``answer_function="avg_diff"`` on the logits).

1. EAP: ours (:func:`~gpt2_interp.analysis.circuits.edge_scores`, ``method="eap"``) against auto-circuit's
   mask gradient at mask 0 (``mask_gradient_prune_scores(grad_function="logit", mask_val=0)``, which its
   docs state equals Syed et al.'s EAP): Spearman ρ over all edges (goal ≥ 0.99). auto-circuit's score is
   the gradient of the *negated* metric (it minimises a loss), so its sign is flipped before comparing.
2. Exact edge patching: ours (:func:`~gpt2_interp.analysis.circuits.edge_patch`, through the prefix-reuse
   engine) against auto-circuit's (``patch_mode(model, corrupted_outputs, edges=[edge])``, one forward pass
   per edge) on a sample of edges (the top of our EAP ranking and a random draw): the largest difference.
3. Wall time of each, in the same run; auto-circuit's one-off graph wrapping is timed apart.
4. Grouped-query attention: what auto-circuit does with a TransformerLens model whose key/value heads are
   shared (as SmolLM2's are): its receivers per layer and one patched key edge.

auto-circuit 1.0.1 imports two TransformerLens names that TransformerLens 3.9 moved
(``transformer_lens.past_key_value_caching.HookedTransformerKeyValueCache`` and its re-export): the script
aliases them to TransformerLens 3.9's ``TransformerLensKeyValueCache`` before importing auto-circuit; no
key-value cache is used here.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import types
import warnings
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from harness import timed

import gpt2_interp as gi
from gpt2_interp.analysis.circuits import Task, edge_patch, edge_scores, fact_recall, graph_of, pairs_of
from gpt2_interp.experiments.provenance import standalone, write_beside


def import_auto_circuit() -> Any:
    """The auto-circuit modules this benchmark uses, after aliasing the TransformerLens names it expects
    (see the module docstring). Raises ImportError when auto-circuit is not installed."""
    import transformer_lens

    if not hasattr(transformer_lens, "HookedTransformerKeyValueCache"):
        from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

        alias = types.ModuleType("transformer_lens.past_key_value_caching")
        alias.HookedTransformerKeyValueCache = TransformerLensKeyValueCache  # type: ignore[attr-defined]
        sys.modules.setdefault(alias.__name__, alias)
        transformer_lens.HookedTransformerKeyValueCache = TransformerLensKeyValueCache  # type: ignore[attr-defined]
    import auto_circuit.data as ac_data
    import auto_circuit.prune_algos.mask_gradient as ac_mask
    import auto_circuit.utils.ablation_activations as ac_abl
    import auto_circuit.utils.graph_utils as ac_graph
    from auto_circuit.types import AblationType

    return types.SimpleNamespace(data=ac_data, mask=ac_mask, abl=ac_abl, graph=ac_graph, ablation=AblationType)


def to_transformer_lens(model: Any) -> Any:
    """A TransformerLens ``HookedTransformer`` with ``model``'s GPT-2 weights (unfolded, uncentred) and
    the split inputs on that edge patching needs."""
    import transformer_lens as tl
    from transformer_lens.loading_from_pretrained import convert_gpt2_weights

    c = model.cfg
    cfg = tl.HookedTransformerConfig(
        n_layers=c.n_layer,
        d_model=c.d_model,
        n_heads=c.n_head,
        d_head=c.d_model // c.n_head,
        d_mlp=c.d_mlp,
        n_ctx=c.n_ctx,
        d_vocab=c.d_vocab,
        act_fn="gelu_new" if c.mlp == "gelu" else c.mlp,
        normalization_type="LN",
        eps=c.layer_norm_eps,
        positional_embedding_type="standard",
        default_prepend_bos=False,
    )
    with warnings.catch_warnings():  # TransformerLens 3.9 deprecates HookedTransformer, auto-circuit's model class
        warnings.simplefilter("ignore", DeprecationWarning)
        ref = tl.HookedTransformer(cfg)
    ref.load_state_dict(convert_gpt2_weights(gi.to_transformers(model), cfg), strict=False)
    ref.set_use_split_qkv_input(True)
    ref.set_use_attn_result(True)
    ref.set_use_hook_mlp_in(True)
    return ref.eval()


def aligned_pairs(task: Task) -> Task:
    """The task's pairs of its most common prompt length, with no padding (auto-circuit takes no mask)."""
    if task.attention_mask is None:
        return task
    lengths = task.attention_mask.sum(1).tolist()
    common = Counter(lengths).most_common(1)[0][0]
    return task.subset([i for i, n in enumerate(lengths) if n == common])


def edge_name(edge: Any) -> str:
    """auto-circuit's edge (``A0.3->A2.1.Q``, ``MLP 1->Resid End``) as our edge name (``a0.h3->a2.h1<q>``)."""

    def node(n: Any, dest: bool) -> str:
        name = n.name
        if name == "Resid Start":
            return "input"
        if name == "Resid End":
            return "logits"
        if name.startswith("MLP "):
            return f"m{int(name.split()[1])}"
        parts = name[1:].split(".")  # "A{layer}.{head}[.Q|K|V]"
        head = f"a{parts[0]}.h{parts[1]}"
        return f"{head}<{parts[2].lower()}>" if dest else head

    return f"{node(edge.src, False)}->{node(edge.dest, True)}"


class AutoCircuit:
    """auto-circuit on a TransformerLens model ``ref`` (:func:`to_transformer_lens`), for prompt pairs
    ``clean``/``corrupted`` ``[n, pos]`` (no padding) and the metric ``logit[answers] − logit[wrongs]``
    (``[n]`` ids each) at the last position: its scores come back in the order of ``graph``'s edges
    (ours), every one of its edges matched to ours by name (:func:`edge_name`)."""

    def __init__(
        self,
        ac: Any,
        ref: Any,
        graph: Any,
        clean: torch.Tensor,
        corrupted: torch.Tensor,
        answers: torch.Tensor,
        wrongs: torch.Tensor,
    ) -> None:
        self.ac, self.n = ac, len(clean)
        self.answers, self.wrongs = answers, wrongs
        self.model = ac.graph.patchable_model(
            ref, factorized=True, slice_output="last_seq", separate_qkv=True, device=torch.device("cpu")
        )
        dataset = ac.data.PromptDataset(
            clean, corrupted, [x.reshape(1) for x in answers], [x.reshape(1) for x in wrongs]
        )
        self.loader = ac.data.PromptDataLoader(dataset, seq_len=None, diverge_idx=0, batch_size=self.n, shuffle=False)
        index = {e: i for i, e in enumerate(graph.edges)}
        self.edges: dict[int, Any] = {index[edge_name(e)]: e for e in self.model.edges}
        assert len(self.edges) == graph.n_edges == len(self.model.edges), "every edge matched once"

    def eap(self) -> torch.Tensor:
        """``[n_edges]``: auto-circuit's mask gradient at mask 0 (its EAP), of the metric's pair mean
        (its loss is the negated metric: the gradient is negated back)."""
        prune = self.ac.mask.mask_gradient_prune_scores(
            self.model, self.loader, None, grad_function="logit", answer_function="avg_diff", mask_val=0.0
        )
        out = torch.empty(len(self.edges))
        for i, e in self.edges.items():
            out[i] = -float(prune[e.dest.module_name][e.patch_idx])
        return out

    def _metric(self, logits: torch.Tensor) -> torch.Tensor:
        last = logits[self.model.out_slice]
        rows = torch.arange(self.n)
        return (last[rows, self.answers] - last[rows, self.wrongs]).mean()

    @torch.no_grad()
    def exact(self, edges: torch.Tensor) -> torch.Tensor:
        """``[len(edges)]``: the metric's pair-mean change when each edge (our indices) alone carries its
        sender's corrupted output, by auto-circuit's ``patch_mode`` (one forward pass per edge)."""
        batch = next(iter(self.loader))
        src = self.ac.abl.src_ablations(self.model, batch.corrupt, self.ac.ablation.RESAMPLE)
        base = self._metric(self.model(batch.clean))
        out = []
        for i in edges.tolist():
            with self.ac.graph.patch_mode(self.model, src, edges=[self.edges[i]]):
                out.append(self._metric(self.model(batch.clean)) - base)
        return torch.stack(out)


def edge_sample(scores: torch.Tensor, k: int, seed: int) -> torch.Tensor:
    """``k`` edge indices: the top third by ``|scores|``, then a seeded random draw of the others."""
    top = scores.abs().argsort(descending=True)[: k // 3]
    taken = set(top.tolist())
    g = torch.Generator().manual_seed(seed)
    rest = [i for i in torch.randperm(len(scores), generator=g).tolist() if i not in taken]
    return torch.cat([top, torch.tensor(rest[: k - len(top)], dtype=torch.long)])


def gqa_check(ac: Any) -> str:
    """What auto-circuit does with grouped-query attention (SmolLM2's): on a random 2-layer TransformerLens
    model with 4 query heads and 2 key/value heads, the number of key receivers it makes per layer and the
    outcome of patching one edge into a key input (its error, or ``"ran"``)."""
    import transformer_lens as tl

    cfg = tl.HookedTransformerConfig(
        n_layers=2,
        d_model=64,
        n_heads=4,
        n_key_value_heads=2,
        d_head=16,
        d_mlp=128,
        n_ctx=32,
        d_vocab=100,
        act_fn="silu",
        normalization_type="RMS",
        positional_embedding_type="rotary",
        gated_mlp=True,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        m = tl.HookedTransformer(cfg)
    m.set_use_split_qkv_input(True)
    m.set_use_attn_result(True)
    m.set_use_hook_mlp_in(True)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 100, (2, 6), generator=g), torch.randint(0, 100, (2, 6), generator=g)
    pm = ac.graph.patchable_model(
        m, factorized=True, slice_output="last_seq", separate_qkv=True, device=torch.device("cpu")
    )
    keys = {e.dest.name for e in pm.edges if e.dest.name.startswith("A1.") and e.dest.name.endswith(".K")}
    edge = next(e for e in pm.edges if e.name == "A0.1->A1.1.K")
    src = ac.abl.src_ablations(pm, y, ac.ablation.RESAMPLE)
    try:
        with torch.no_grad(), ac.graph.patch_mode(pm, src, edges=[edge]):
            pm(x)
        outcome = "ran"
    except RuntimeError as e:
        outcome = f"RuntimeError: {str(e).splitlines()[0]}"
    return f"{len(keys)} key receivers per layer for 2 key/value heads; patching A0.1->A1.1.K: {outcome}"


def spearman(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's rank correlation of two score vectors (average ranks for ties)."""
    from scipy.stats import spearmanr

    return float(spearmanr(a.double().numpy(), b.double().numpy()).statistic)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--pairs", type=int, default=64, help="fact-recall pairs drawn (those of the commonest length kept)"
    )
    ap.add_argument("--exact-edges", type=int, default=200, help="edges patched exactly by both (top EAP + random)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None, help="write a markdown report here (and its provenance beside)")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    load0 = os.getloadavg()[0]
    ac = import_auto_circuit()

    model = gi.load("gpt2-facts").eval()
    task = aligned_pairs(fact_recall(model, n=a.pairs, seed=a.seed))
    clean, corrupted = task.clean_tokens, task.corrupted_tokens
    n, pos = clean.shape
    graph = graph_of(model)
    ref = to_transformer_lens(model)
    with torch.no_grad():
        logit_gap = float((ref(clean)[:, -1] - model(clean)[:, -1]).abs().max())

    # --- ours
    t_eap, ours = timed(lambda: edge_scores(model, clean, corrupted, task.metric, method="eap", progress=False))
    ours_eap = ours.scores

    # --- auto-circuit
    t_wrap, peer = timed(lambda: AutoCircuit(ac, ref, graph, clean, corrupted, task.answers, task.wrongs))
    t_ac_eap, theirs_eap = timed(peer.eap)
    rho = spearman(ours_eap, theirs_eap)
    rho_abs = spearman(ours_eap.abs(), theirs_eap.abs())
    eap_gap = float((ours_eap - theirs_eap).abs().max())

    # --- exact edge patching on a sample: the top of our EAP ranking and a random draw
    sample = edge_sample(ours_eap, a.exact_edges, a.seed)
    pairs = pairs_of(model, clean, corrupted, task.metric)
    t_exact, delta = timed(lambda: edge_patch(model, graph, pairs, edges=sample, progress=False))
    ours_exact = delta.mean(1)
    t_ac_exact, theirs_exact = timed(lambda: peer.exact(sample))
    exact_gap = float((ours_exact - theirs_exact).abs().max())
    rho_exact = spearman(ours_exact, theirs_exact)
    eap_vs_exact = spearman(ours_eap[sample], ours_exact)

    gqa = gqa_check(ac)
    from importlib.metadata import version

    r = {
        "pairs": n,
        "positions": pos,
        "edges": graph.n_edges,
        "exact_edges": len(sample),
        "logit_gap_tl": logit_gap,
        "eap_spearman": rho,
        "eap_spearman_abs": rho_abs,
        "eap_max_abs_diff": eap_gap,
        "exact_max_abs_diff": exact_gap,
        "exact_spearman": rho_exact,
        "eap_vs_exact_spearman_on_sample": eap_vs_exact,
        "gqa": gqa,
        "seconds": {
            "ours_eap": t_eap,
            "auto_circuit_eap": t_ac_eap,
            "auto_circuit_wrap": t_wrap,
            "ours_exact": t_exact,
            "auto_circuit_exact": t_ac_exact,
        },
        "load_at_start": load0,
        "load_at_end": os.getloadavg()[0],
        "threads": torch.get_num_threads(),
        "versions": {
            "auto_circuit": version("auto-circuit"),
            "transformer_lens": version("transformer-lens"),
            "torch": torch.__version__,
        },
    }
    report = render(r)
    print(report)
    if a.out is not None:
        a.out.write_text(report + "\n")
        args = sys.argv[1:] if argv is None else argv
        write_beside(a.out, standalone(["benchmarks/bench_circuits.py", *args], [model]))
    return r


def render(r: dict) -> str:
    s = r["seconds"]
    rows = [
        ("EAP, every edge", s["ours_eap"], s["auto_circuit_eap"]),
        (f"exact edge patching, {r['exact_edges']} edges", s["ours_exact"], s["auto_circuit_exact"]),
    ]
    v = r["versions"]
    return "\n".join(
        [
            "# Edge scores: gpt2-interp vs auto-circuit",
            "",
            f"gpt2-facts, {r['edges']} edges, {r['pairs']} fact-recall pairs of {r['positions']} tokens, metric "
            f"logit[answer] − logit[other answer]; auto-circuit {v['auto_circuit']} on TransformerLens "
            f"{v['transformer_lens']} (same weights: largest logit difference {r['logit_gap_tl']:.1e}), torch "
            f"{v['torch']}, {r['threads']} thread(s), {datetime.now(timezone.utc):%Y-%m-%d}, {platform.machine()}.",
            "",
            "| agreement | value | goal |",
            "|---|---|---|",
            f"| EAP: Spearman ρ, ours vs auto-circuit's mask gradient, all edges (signed) | {r['eap_spearman']:.6f} "
            "| ≥ 0.99 |",
            f"| EAP: Spearman ρ of \\|score\\| | {r['eap_spearman_abs']:.6f} | ≥ 0.99 |",
            f"| EAP: largest difference | {r['eap_max_abs_diff']:.2e} | |",
            f"| exact edge patching: largest difference over {r['exact_edges']} edges | {r['exact_max_abs_diff']:.2e} "
            "| ≤ 1e-4 |",
            f"| exact edge patching: Spearman ρ | {r['exact_spearman']:.6f} | |",
            f"| our EAP vs our exact on those edges: Spearman ρ | {r['eap_vs_exact_spearman_on_sample']:.3f} | |",
            "",
            "| wall time (s) | gpt2-interp | auto-circuit | ratio |",
            "|---|---|---|---|",
            *(f"| {name} | {ours:.2f} | {theirs:.2f} | {theirs / ours:.1f}× |" for name, ours, theirs in rows),
            "",
            "auto-circuit's one-off set-up (``patchable_model``, its data loader, the edge matching) took "
            f"{s['auto_circuit_wrap']:.2f} s, not "
            "counted above. Scores are means over pairs of the metric's change (patched − clean); auto-circuit's "
            "mask gradient is of its loss, the negated metric, and is negated back. Load average "
            f"{r['load_at_start']:.1f} at the start, {r['load_at_end']:.1f} at the end (a 2-core machine shared "
            "with other jobs: ratios are steadier than seconds).",
            "",
            "Grouped-query attention (SmolLM2's 9 query heads share 3 key/value heads): auto-circuit gives every query "
            "head its own key and value receivers, so it has not got the edges of such a model, and it cannot patch "
            f"them. On a random 2-layer TransformerLens model with 4 query and 2 key/value heads it makes {r['gqa']}. "
            "The comparison with auto-circuit is therefore on GPT-2 (gpt2-facts) only.",
        ]
    )


if __name__ == "__main__":
    main()
