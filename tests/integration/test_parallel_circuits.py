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
from functools import partial

import pytest
import torch

from gpt2_interp.analysis.circuits import Graph, graph_of, run_with_edges

transformers = pytest.importorskip("transformers")

from tests.families_cases import family_pair  # noqa: E402
from tests.integration import circuit_refs as refs  # noqa: E402

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
    return refs.circuit_case(request.param)


def _layer(node: str, n_layer: int) -> int:
    """The layer a node writes after or reads at: the input −1, the logits ``n_layer``."""
    if node == "input":
        return -1
    if node == "logits":
        return n_layer
    return int(re.match(r"[am](\d+)", node).group(1))


def _receivers(n_layer: int, n_head: int, n_kv: int) -> list[str]:
    return [
        x
        for l in range(n_layer)
        for x in [
            *(f"a{l}.h{h}<q>" for h in range(n_head)),
            *(f"a{l}.h{g}<{k}>" for k in "kv" for g in range(n_kv)),
            f"m{l}",
        ]
    ] + ["logits"]


def test_parallel_graph_has_every_edge_into_a_later_layer_and_none_from_a_layers_heads_to_its_mlp(case):
    family, _, ours, _, _ = case
    c = ours.cfg
    graph = graph_of(ours)
    receivers = _receivers(c.n_layer, c.n_head, c.n_kv)
    later = {
        f"{s}->{r}"
        for s in refs.senders(c.n_layer, c.n_head)
        for r in receivers
        if _layer(s, c.n_layer) < _layer(r, c.n_layer)
    }
    assert graph.parallel and len(graph.edges) == len(set(graph.edges)), family
    assert set(graph.edges) == later, family
    assert not any(re.fullmatch(rf"a{l}\.h\d+->m{l}", e) for e in graph.edges for l in range(c.n_layer))
    # the same sizes with sequential blocks: exactly the edges from each layer's heads to its own MLP more
    own = {f"a{l}.h{h}->m{l}" for l in range(c.n_layer) for h in range(c.n_head)}
    assert set(Graph(c.n_layer, c.n_head, c.n_kv).edges) == later | own, family


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
    receiver = receiver or ""
    block_in: dict[int, torch.Tensor] = {}  # each block's input in this run
    handles = []

    def block_pre(args, l):
        if l == 0 and start is not None:
            args = (start, *args[1:])
        block_in[l] = args[0]
        return args

    def mlp_out(module, args, out, l):
        if receiver != f"m{l}" and reads is None:
            return None
        norm, mlp = _hf_layer(hf, l)
        return mlp(norm(refs.read(reads, l, block_in[l], add, receiver == f"m{l}")))

    for l in range(ours.cfg.n_layer):
        handles.append(ours.blocks[l].register_forward_pre_hook(lambda m, a, l=l: block_pre(a, l)))
        handles.append(ours.blocks[l].mlp.register_forward_hook(lambda m, a, o, l=l: mlp_out(m, a, o, l)))
    return refs.run_by_hand(ours, tokens, receiver, add, reads, lambda stage, l: l, [], handles)


def _refs(case) -> refs.Refs:
    family, hf, ours, clean, corrupted = case
    return refs.Refs(
        family, ours, clean, corrupted, EDGES, partial(refs.sender_output, ours), partial(_metric_by_hand, hf, ours)
    )


@torch.no_grad()
def test_parallel_edge_patching_equals_a_hand_written_patch_through_transformers_mlp(case):
    family, _, ours, clean, _ = case
    r = _refs(case)
    base = refs.METRIC(ours(clean)[:, -1]).mean()
    graph, pairs, _, k = refs.check_edge_patching(r, base)
    # every edge patched at once is the corrupted run; every edge half patched: each receiver reads the midpoint
    # of its block's input and the corrupted run's (no edge missing, none from a layer's heads to its MLP)
    every = run_with_edges(ours, graph, pairs, torch.tensor([[1.0], [0.5]]).expand(2, graph.n_edges))
    assert torch.allclose(every[0], pairs.corrupted_metric, atol=2e-5), family
    n = ours.cfg.n_layer
    corr = [k[f"blocks.{l}.hook_resid_pre"] for l in range(n)] + [k[f"blocks.{n - 1}.hook_resid_post"]]
    half = r.by_hand(clean, reads=lambda l, x: (x + corr[l]) / 2)
    assert abs(float(every[1].mean()) - float(half)) < 2e-5, (family, float(every[1].mean()), float(half))
    assert abs(float(half) - float(base)) > 1e-3 and float((every[1] - every[0]).abs().max()) > 1e-3, family


def _point(receiver: str, n_layer: int) -> tuple[int, str]:
    """The activation path's ``(layer, hook)`` of a receiver: a layer's q/k/v and MLP inputs alike read its block
    input, the logits the last block's output."""
    l = _layer(receiver, n_layer)
    return l, f"blocks.{n_layer - 1}.hook_resid_post" if l == n_layer else f"blocks.{l}.hook_resid_pre"


def test_parallel_eap_and_eap_ig_are_the_autograd_derivative_of_the_hand_written_patch(case):
    refs.check_eap_against_derivatives(_refs(case), partial(_point, n_layer=case[2].cfg.n_layer))


def test_a_parallel_circuit_keeps_its_graph_through_a_file_and_refuses_sequential_blocks(case, tmp_path):
    family, _, ours, clean, corrupted = case
    # the whole graph as a circuit reproduces the clean run: faithfulness 1
    back = refs.check_circuit_file_and_whole_graph(family, ours, clean, corrupted, tmp_path)
    assert back.parallel, family
    _, _, sequential = family_pair("gpt_neox-sequential")  # the same sizes, sequential blocks: another graph
    with pytest.raises(ValueError, match=r"parallel blocks.*sequential blocks"):
        back.check_model(sequential)
