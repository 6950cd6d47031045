"""Edge circuits on parallel blocks (GPT-NeoX with ``use_parallel_residual``, GPT-J with its shared ``ln_1``),
each against a reference built without the circuits code: the edge list against the rule "a sender feeds every
receiver of a later layer" (and the sequential graph's extra head → own-MLP edges); exact edge patching and
:func:`run_with_edges` against hand-written hooks that add one sender's corrupted − clean output to one
receiver's input — an MLP's input rebuilt from transformers' own norm and MLP modules of that layer applied to
the block's input; EAP and EAP-IG (both paths) against the derivative of that hand-written patch, scaled by
ε, taken by ``torch.autograd`` at the clean run (EAP) or at the path's midpoints (EAP-IG); a circuit's file keeping
its parallel graph, the whole graph's faithfulness 1, and a model with sequential blocks refused.

Run: ``pytest -p no:cacheprovider -q tests/integration/test_parallel_circuits.py``."""

from __future__ import annotations

import re

import pytest
import torch

from gpt2_interp.analysis.circuits import (
    Circuit,
    Graph,
    circuit,
    edge_patch,
    edge_scores,
    evaluate,
    graph_of,
    pairs_of,
    run_with_edges,
)
from gpt2_interp.analysis.metrics import logit_diff

transformers = pytest.importorskip("transformers")

from tests.families_cases import VOCAB, family_pair  # noqa: E402

METRIC = logit_diff(5, 6)
# edges into every MLP (from the input, a head and an MLP of an earlier layer), into q/k/v inputs and the logits
EDGES = [
    "input->m0",
    "input->m1",
    "a0.h1->m1",
    "a0.h3->m1",
    "m0->m1",
    "input->a0.h1<q>",
    "a0.h2->a1.h1<k>",
    "m0->a1.h3<v>",
    "a1.h0->logits",
    "m1->logits",
]


@pytest.fixture(scope="module", params=["gpt_neox", "gptj"])
def case(request):
    """``(family, transformers model, our model, clean tokens, corrupted tokens)``: three pairs of 7 tokens
    that differ at positions 2 and 4."""
    family, hf, ours = family_pair(request.param)
    clean = torch.randint(1, VOCAB, (3, 7), generator=torch.Generator().manual_seed(1))
    corrupted = clean.clone()
    corrupted[:, 2], corrupted[:, 4] = 9, 11
    return family, hf, ours, clean, corrupted


def _layer(node: str, n_layer: int) -> int:
    """The layer a node writes after or reads at: the input −1, the logits ``n_layer``."""
    if node == "input":
        return -1
    if node == "logits":
        return n_layer
    return int(re.match(r"[am](\d+)", node).group(1))


def _nodes(n_layer: int, n_head: int, n_kv: int) -> tuple[list[str], list[str]]:
    senders = ["input"] + [x for l in range(n_layer) for x in [*(f"a{l}.h{h}" for h in range(n_head)), f"m{l}"]]
    receivers = [
        x
        for l in range(n_layer)
        for x in [
            *(f"a{l}.h{h}<q>" for h in range(n_head)),
            *(f"a{l}.h{g}<{k}>" for k in "kv" for g in range(n_kv)),
            f"m{l}",
        ]
    ] + ["logits"]
    return senders, receivers


def test_parallel_graph_has_every_edge_into_a_later_layer_and_none_from_a_layers_heads_to_its_mlp(case):
    family, _, ours, _, _ = case
    c = ours.cfg
    graph = graph_of(ours)
    senders, receivers = _nodes(c.n_layer, c.n_head, c.n_kv)
    later = {f"{s}->{r}" for s in senders for r in receivers if _layer(s, c.n_layer) < _layer(r, c.n_layer)}
    assert graph.parallel and len(graph.edges) == len(set(graph.edges)), family
    assert set(graph.edges) == later, family
    assert not any(re.fullmatch(rf"a{l}\.h\d+->m{l}", e) for e in graph.edges for l in range(c.n_layer))
    # the same sizes with sequential blocks: exactly the edges from each layer's heads to its own MLP more
    own = {f"a{l}.h{h}->m{l}" for l in range(c.n_layer) for h in range(c.n_head)}
    assert set(Graph(c.n_layer, c.n_head, c.n_kv).edges) == later | own, family


def _sender_output(ours, cache, sender: str) -> torch.Tensor:
    """``[batch, pos, d_model]``: the input embedding, an MLP's output or one head's ``z_h @ W_O[h]``."""
    if sender == "input":
        return cache["blocks.0.hook_resid_pre"]
    if sender.startswith("m"):
        return cache[f"blocks.{int(sender[1:])}.hook_mlp_out"]
    l, h = map(int, re.fullmatch(r"a(\d+)\.h(\d+)", sender).groups())
    return cache[f"blocks.{l}.attn.hook_z"][:, :, h] @ ours.blocks[l].attn.W_O[h]


def _hf_layer(hf, l: int):
    """Transformers' layer ``l`` as ``(the norm its MLP reads, its MLP)``: GPT-NeoX's post-attention norm,
    GPT-J's one ``ln_1``."""
    base = hf.base_model
    if hasattr(base, "layers"):
        return base.layers[l].post_attention_layernorm, base.layers[l].mlp
    return base.h[l].ln_1, base.h[l].mlp


def _metric_by_hand(hf, ours, tokens, receiver=None, add=None, start=None, reads=None) -> torch.Tensor:
    """The pair-mean metric of ``ours`` on ``tokens`` with ``add`` ``[batch, pos, d_model]`` added to the input
    of ``receiver`` alone (None: no receiver). An MLP receiver's output is transformers' MLP of its norm of
    (block input + add); a head's q/k/v input is the model's per-head input copy; the logits read the final
    residual. ``start``: the residual entering block 0 instead of the tokens' (an input path); ``reads(layer,
    x)``: what every receiver of block ``layer`` (the logits: ``n_layer``) reads instead of the residual ``x``
    there, the residual stream itself unchanged (an activation path)."""
    n = ours.cfg.n_layer
    receiver = receiver or ""
    head = re.fullmatch(r"a(\d+)\.h(\d+)<([qkv])>", receiver)
    block_in: dict[int, torch.Tensor] = {}  # each block's input in this run
    handles = []

    def read(l: int, x: torch.Tensor, here: bool) -> torch.Tensor:
        return (x if reads is None else reads(l, x)) + (add if here else 0)

    def block_pre(args, l):
        if l == 0 and start is not None:
            args = (start, *args[1:])
        block_in[l] = args[0]
        return args

    def mlp_out(module, args, out, l):
        if receiver != f"m{l}" and reads is None:
            return None
        norm, mlp = _hf_layer(hf, l)
        return mlp(norm(read(l, block_in[l], receiver == f"m{l}")))

    def qkv_in(act, hook, l, kind):
        act = read(l, act[:, :, 0], False)[:, :, None].expand_as(act).clone()
        if head is not None and (int(head.group(1)), head.group(3)) == (l, kind):
            act[:, :, int(head.group(2))] += add
        return act

    for l in range(n):
        handles.append(ours.blocks[l].register_forward_pre_hook(lambda m, a, l=l: block_pre(a, l)))
        handles.append(ours.blocks[l].mlp.register_forward_hook(lambda m, a, o, l=l: mlp_out(m, a, o, l)))
    if receiver == "logits" or reads is not None:
        handles.append(ours.ln_final.register_forward_pre_hook(lambda m, a: (read(n, a[0], receiver == "logits"),)))
    split = head is not None or reads is not None
    hooks = [
        (f"blocks.{l}.hook_{kind}_input", lambda act, hook, l=l, kind=kind: qkv_in(act, hook, l, kind))
        for l in (range(n) if split else ())
        for kind in "qkv"
    ]
    ours.set_use_split_qkv_input(split)
    try:
        logits = ours.run_with_hooks(tokens, fwd_hooks=hooks)
    finally:
        ours.set_use_split_qkv_input(False)
        for h in handles:
            h.remove()
    return METRIC(logits[:, -1]).mean()


@torch.no_grad()
def test_parallel_edge_patching_equals_a_hand_written_patch_through_transformers_mlp(case):
    family, hf, ours, clean, corrupted = case
    graph = graph_of(ours)
    pairs = pairs_of(ours, clean, corrupted, METRIC)
    ids = [graph.edge(e) for e in EDGES]
    exact = edge_patch(ours, graph, pairs, edges=ids, progress=False).mean(-1)
    rows = torch.zeros(len(ids), graph.n_edges)
    rows[torch.arange(len(ids)), ids] = 1
    run = run_with_edges(ours, graph, pairs, rows).mean(-1) - pairs.clean_metric.mean()
    _, c = ours.run_with_cache(clean)
    _, k = ours.run_with_cache(corrupted)
    base = METRIC(ours(clean)[:, -1]).mean()
    want = torch.stack(
        [
            _metric_by_hand(hf, ours, clean, e.split("->")[1], _sender_output(ours, k, s) - _sender_output(ours, c, s))
            - base
            for e in EDGES
            for s in [e.split("->")[0]]
        ]
    )
    assert float(want.abs().max()) > 1e-3, family  # the edges do something
    assert torch.allclose(exact, want, atol=2e-5), (family, exact, want)
    assert torch.allclose(run, want, atol=2e-5), (family, run, want)
    # every edge patched at once is the corrupted run; every edge half patched: each receiver reads the midpoint
    # of its block's input and the corrupted run's (no edge missing, none from a layer's heads to its MLP)
    every = run_with_edges(ours, graph, pairs, torch.tensor([[1.0], [0.5]]).expand(2, graph.n_edges))
    assert torch.allclose(every[0], pairs.corrupted_metric, atol=2e-5), family
    n = ours.cfg.n_layer
    corr = [k[f"blocks.{l}.hook_resid_pre"] for l in range(n)] + [k[f"blocks.{n - 1}.hook_resid_post"]]
    half = _metric_by_hand(hf, ours, clean, reads=lambda l, x: (x + corr[l]) / 2)
    assert abs(float(every[1].mean()) - float(half)) < 2e-5, (family, float(every[1].mean()), float(half))
    assert abs(float(half) - float(base)) > 1e-3 and float((every[1] - every[0]).abs().max()) > 1e-3, family


def _derivative(hf, ours, tokens, receiver, delta, **kw) -> float:
    """d/dε at ε = 0 of the pair-mean metric with ``ε · delta`` added to ``receiver``'s input (by hand)."""
    eps = torch.zeros((), requires_grad=True)
    (g,) = torch.autograd.grad(_metric_by_hand(hf, ours, tokens, receiver, eps * delta, **kw), [eps])
    return float(g)


def test_parallel_eap_and_eap_ig_are_the_autograd_derivative_of_the_hand_written_patch(case):
    family, hf, ours, clean, corrupted = case
    n = ours.cfg.n_layer
    with torch.no_grad():
        _, c = ours.run_with_cache(clean)
        _, k = ours.run_with_cache(corrupted)
    alphas = (0.25, 0.75)
    resid = [f"blocks.{l}.hook_resid_pre" for l in range(n)] + [f"blocks.{n - 1}.hook_resid_post"]
    ids = [graph_of(ours).edge(e) for e in EDGES]
    got = {
        (m, p): edge_scores(ours, clean, corrupted, METRIC, method=m, ig_steps=2, ig_path=p, progress=False).scores[ids]
        for m, p in (("eap", "inputs"), ("eap-ig", "inputs"), ("eap-ig", "activations"))
    }
    for i, e in enumerate(EDGES):
        s, r = e.split("->")
        delta = _sender_output(ours, k, s) - _sender_output(ours, c, s)
        eap = _derivative(hf, ours, clean, r, delta)
        e0, e1 = c[resid[0]], k[resid[0]]
        ig_in = sum(_derivative(hf, ours, clean, r, delta, start=e0 + a * (e1 - e0)) for a in alphas) / 2
        l = _layer(r, n)
        a0, a1 = c[resid[l]], k[resid[l]]  # the layer's q/k/v and MLP inputs alike: its block input
        ig_act = (
            sum(
                _derivative(
                    hf,
                    ours,
                    clean,
                    r,
                    delta,
                    reads=lambda j, x, a=a, l=l, a0=a0, a1=a1: a0 + a * (a1 - a0) if j == l else x,
                )
                for a in alphas
            )
            / 2
        )
        for (m, p), want in (
            (("eap", "inputs"), eap),
            (("eap-ig", "inputs"), ig_in),
            (("eap-ig", "activations"), ig_act),
        ):
            assert abs(float(got[m, p][i]) - want) < 2e-5 + 1e-4 * abs(want), (
                family,
                m,
                p,
                e,
                float(got[m, p][i]),
                want,
            )
    assert max(abs(float(v)) for v in got["eap", "inputs"]) > 1e-3, family


def test_a_parallel_circuit_keeps_its_graph_through_a_file_and_refuses_sequential_blocks(case, tmp_path):
    family, _, ours, clean, corrupted = case
    scores = edge_scores(ours, clean, corrupted, METRIC, method="eap", progress=False)
    circ = evaluate(ours, circuit(scores, top=20), clean, corrupted, METRIC, completeness=False)
    back = Circuit.load(circ.save(tmp_path / "c.json"))
    assert back.parallel and back.graph.edges == graph_of(ours).edges, family
    # the whole graph as a circuit reproduces the clean run: faithfulness 1
    whole = evaluate(ours, circuit(scores, fraction=1.0, prune_dangling=False), clean, corrupted, METRIC)
    assert abs(whole.faithfulness - 1) < 1e-4 and abs(whole.completeness) < 1e-4, family
    _, _, sequential = family_pair("gpt_neox-sequential")  # the same sizes, sequential blocks: another graph
    with pytest.raises(ValueError, match=r"parallel blocks.*sequential blocks"):
        back.check_model(sequential)
