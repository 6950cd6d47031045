"""The references that the edge-circuit tests of blocks other than GPT-2's (parallel, post-norm) share, built
without the circuits code: a family's model with three clean/corrupted pairs, each sender's output read from a
cache, the skeleton of a metric computed with hand-written hooks, the ε-derivative of such a hand-written patch
(autograd at ε = 0), and the checks that compare edge patching, EAP and EAP-IG, and a circuit's file with them.

Each test module supplies what differs between block layouts: how an MLP receiver's output is rebuilt from
transformers' own modules (``metric_by_hand`` in the test module), and where an activation path reads."""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

import torch

from gpt2_interp.analysis.circuits import (
    Circuit,
    circuit,
    edge_patch,
    edge_scores,
    evaluate,
    graph_of,
    pairs_of,
    run_with_edges,
)
from gpt2_interp.analysis.metrics import logit_diff
from tests.families_cases import VOCAB, family_pair

METRIC = logit_diff(5, 6)
ALPHAS = (0.25, 0.75)  # EAP-IG with ig_steps=2: the path's midpoints
HEAD = r"a(\d+)\.h(\d+)"

# ``by_hand(tokens, receiver=None, add=None, start=None, reads=None)``: the pair-mean metric with hand-written hooks
ByHand = Callable[..., torch.Tensor]
# ``out(cache, sender)``: a sender's output ``[batch, pos, d_model]`` in the run of ``cache``
SenderOut = Callable[[Any, str], torch.Tensor]


@dataclass(frozen=True)
class Refs:
    """One case's model, clean and corrupted tokens and edges under test, with its references: ``out`` the
    senders' outputs and ``by_hand`` the metric with hand-written hooks."""

    family: str
    ours: Any
    clean: torch.Tensor
    corrupted: torch.Tensor
    edges: list[str]
    out: SenderOut
    by_hand: ByHand


def circuit_case(family: str) -> tuple[str, Any, Any, torch.Tensor, torch.Tensor]:
    """``(family, transformers model, our model, clean tokens, corrupted tokens)``: three pairs of 7 tokens
    that differ at positions 2 and 4."""
    family, hf, ours = family_pair(family)
    clean = torch.randint(1, VOCAB, (3, 7), generator=torch.Generator().manual_seed(1))
    corrupted = clean.clone()
    corrupted[:, 2], corrupted[:, 4] = 9, 11
    return family, hf, ours, clean, corrupted


def senders(n_layer: int, n_head: int) -> list[str]:
    """Every sender in the order of the forward: the input, then each layer's heads and its MLP."""
    return ["input"] + [x for l in range(n_layer) for x in [*(f"a{l}.h{h}" for h in range(n_head)), f"m{l}"]]


def sender_output(ours, cache, sender: str, gain: Callable[[int], torch.Tensor] | None = None) -> torch.Tensor:
    """``[batch, pos, d_model]``: the input embedding, an MLP's output, or one head's ``z_h W_O[h]``; with
    ``gain(layer)`` (a post-norm block), that head's share ``g ⊙ z_h W_O[h] / σ`` of its layer's normalised
    attention output, ``σ`` the RMS of the heads' summed output in the run of ``cache``."""
    if sender == "input":
        return cache["blocks.0.hook_resid_pre"]
    if sender.startswith("m"):
        return cache[f"blocks.{int(sender[1:])}.hook_mlp_out"]
    l, h = map(int, re.fullmatch(HEAD, sender).groups())
    z, w_o = cache[f"blocks.{l}.attn.hook_z"], ours.blocks[l].attn.W_O
    head = z[:, :, h] @ w_o[h]
    if gain is None:
        return head
    total = torch.einsum("bphe,hed->bpd", z, w_o)
    sigma = (total.pow(2).mean(-1, keepdim=True) + ours.cfg.layer_norm_eps).sqrt()
    return gain(l) * head / sigma


def read(reads, key: Hashable, x: torch.Tensor, add, here: bool) -> torch.Tensor:
    """What a receiver at ``key`` reads: ``reads(key, x)`` (or ``x``), plus ``add`` where it is the receiver."""
    return (x if reads is None else reads(key, x)) + (add if here else 0)


def run_by_hand(
    ours,
    tokens: torch.Tensor,
    receiver: str,
    add,
    reads,
    key: Callable[[str, int], Hashable],
    fwd_hooks: list,
    handles: list,
) -> torch.Tensor:
    """The pair-mean ``METRIC`` of ``ours`` on ``tokens`` under ``fwd_hooks`` (the MLP receivers' and the start's,
    from the test module) with ``add`` added to a head's q/k/v input copy or the logits' input when ``receiver``
    names one, and each of these reading ``reads(key(stage, l), x)`` instead of the residual ``x`` (stage
    ``"qkv"`` of layer ``l``, ``"logits"`` at ``l = n_layer``). ``handles`` (torch hooks the caller registered)
    are removed at the end."""
    n = ours.cfg.n_layer
    head = re.fullmatch(HEAD + r"<([qkv])>", receiver)

    def qkv_in(act, hook, l, kind):
        act = read(reads, key("qkv", l), act[:, :, 0], add, False)[:, :, None].expand_as(act).clone()
        if head is not None and (int(head.group(1)), head.group(3)) == (l, kind):
            act[:, :, int(head.group(2))] += add
        return act

    handles = list(handles)
    if receiver == "logits" or reads is not None:
        handles.append(
            ours.ln_final.register_forward_pre_hook(
                lambda m, a: (read(reads, key("logits", n), a[0], add, receiver == "logits"),)
            )
        )
    split = head is not None or reads is not None
    hooks = fwd_hooks + [
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


def derivative(by_hand: ByHand, tokens: torch.Tensor, receiver: str, delta: torch.Tensor, **kw) -> float:
    """d/dε at ε = 0 of the pair-mean metric with ``ε · delta`` added to ``receiver``'s input (by hand)."""
    eps = torch.zeros((), requires_grad=True)
    (g,) = torch.autograd.grad(by_hand(tokens, receiver, eps * delta, **kw), [eps])
    return float(g)


@torch.no_grad()
def check_edge_patching(refs: Refs, base: torch.Tensor):
    """Exact edge patching and :func:`run_with_edges` of each edge alone equal the hand-written patch adding the
    sender's corrupted − clean output to the receiver's input (metric − ``base``, to 2e-5), and the edges do
    something. Returns ``(graph, pairs, one-hot rows of the edges, the corrupted run's cache)``."""
    family, ours, clean, corrupted, edges, out, by_hand = _fields(refs)
    graph = graph_of(ours)
    pairs = pairs_of(ours, clean, corrupted, METRIC)
    ids = [graph.edge(e) for e in edges]
    exact = edge_patch(ours, graph, pairs, edges=ids, progress=False).mean(-1)
    rows = torch.zeros(len(ids), graph.n_edges)
    rows[torch.arange(len(ids)), ids] = 1
    run = run_with_edges(ours, graph, pairs, rows).mean(-1) - pairs.clean_metric.mean()
    _, c = ours.run_with_cache(clean)
    _, k = ours.run_with_cache(corrupted)
    want = torch.stack([by_hand(clean, r, out(k, s) - out(c, s)) - base for e in edges for s, r in [e.split("->")]])
    assert float(want.abs().max()) > 1e-3, family  # the edges do something
    assert torch.allclose(exact, want, atol=2e-5), (family, exact, want)
    assert torch.allclose(run, want, atol=2e-5), (family, run, want)
    return graph, pairs, rows, k


def check_eap_against_derivatives(refs: Refs, point: Callable[[str], tuple[Hashable, str]]) -> None:
    """EAP and EAP-IG (input and activation paths, 2 steps) of each edge equal the derivative of the hand-written
    patch: at the clean run (EAP), averaged over the input path's midpoints (the embedding moved from clean to
    corrupted), and over the activation path's midpoints: ``point(receiver)`` is ``(key, hook)``, the receiver's
    ``reads`` key and the hook whose clean → corrupted value it reads there. To 2e-5 + 1e-4 · |want|."""
    family, ours, clean, corrupted, edges, out, by_hand = _fields(refs)
    with torch.no_grad():
        _, c = ours.run_with_cache(clean)
        _, k = ours.run_with_cache(corrupted)
    ids = [graph_of(ours).edge(e) for e in edges]
    got = {
        (m, p): edge_scores(ours, clean, corrupted, METRIC, method=m, ig_steps=2, ig_path=p, progress=False).scores[ids]
        for m, p in (("eap", "inputs"), ("eap-ig", "inputs"), ("eap-ig", "activations"))
    }
    e0, e1 = c["blocks.0.hook_resid_pre"], k["blocks.0.hook_resid_pre"]
    for i, e in enumerate(edges):
        s, r = e.split("->")
        delta = out(k, s) - out(c, s)
        eap = derivative(by_hand, clean, r, delta)
        ig_in = _mean(derivative(by_hand, clean, r, delta, start=e0 + a * (e1 - e0)) for a in ALPHAS)
        at, hook = point(r)
        a0, a1 = c[hook], k[hook]
        ig_act = _mean(
            derivative(
                by_hand,
                clean,
                r,
                delta,
                reads=lambda key, x, a=a, at=at, a0=a0, a1=a1: a0 + a * (a1 - a0) if key == at else x,
            )
            for a in ALPHAS
        )
        for name, want in (
            (("eap", "inputs"), eap),
            (("eap-ig", "inputs"), ig_in),
            (("eap-ig", "activations"), ig_act),
        ):
            assert abs(float(got[name][i]) - want) < 2e-5 + 1e-4 * abs(want), (
                family,
                name,
                e,
                float(got[name][i]),
                want,
            )
    assert max(abs(float(v)) for v in got["eap", "inputs"]) > 1e-3, family


def _fields(refs: Refs) -> tuple[str, Any, torch.Tensor, torch.Tensor, list[str], SenderOut, ByHand]:
    return refs.family, refs.ours, refs.clean, refs.corrupted, refs.edges, refs.out, refs.by_hand


def _mean(xs: Iterable[float]) -> float:
    return sum(xs) / len(ALPHAS)


def check_circuit_file_and_whole_graph(family: str, ours, clean, corrupted, tmp_path) -> Circuit:
    """An EAP circuit of 20 edges saved and loaded back, keeping the model's graph; the whole graph as a circuit
    reproduces the clean run (faithfulness 1, completeness 0, to 1e-4). Returns the loaded circuit."""
    scores = edge_scores(ours, clean, corrupted, METRIC, method="eap", progress=False)
    circ = evaluate(ours, circuit(scores, top=20), clean, corrupted, METRIC, completeness=False)
    back = Circuit.load(circ.save(tmp_path / "c.json"))
    assert back.graph.edges == graph_of(ours).edges, family
    whole = evaluate(ours, circuit(scores, fraction=1.0, prune_dangling=False), clean, corrupted, METRIC)
    assert abs(whole.faithfulness - 1) < 1e-4 and abs(whole.completeness) < 1e-4, family
    return back
