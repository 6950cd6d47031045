"""Edge circuits on blocks that normalise each attention and MLP output before adding it (OLMo 2: post-norms
only; Gemma 2 and 3: sandwich norms), each against a reference built without the circuits code.

A head's output there is its share of the normalised attention output at the scale of the run it is read from,
``g ⊙ z_h W_O[h] / σ``, with ``σ`` computed in this file from the heads' summed output (not read from a hook) and
``g`` transformers' post-attention norm weight (Gemma's ``1 + w``). Checked: the senders' outputs sum to each
run's residual stream; exact edge patching and :func:`run_with_edges` equal hand-written hooks that add one
sender's corrupted − clean output to one receiver's input (an MLP receiver rebuilt from transformers' own norms
and MLP of that layer); every edge patched is the corrupted run; EAP and EAP-IG (both paths) equal the autograd
derivative of that hand-written patch; a circuit keeps its graph through a file with faithfulness 1 on the whole
graph; a post-norm block with an attention output bias is refused.

Run: ``pytest -p no:cacheprovider -q tests/integration/test_postnorm_circuits.py``."""

from __future__ import annotations

import dataclasses
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
EDGES = [
    "input->m0",
    "a0.h1->m0",
    "a0.h3->m1",
    "m0->m1",
    "input->a0.h1<q>",
    "a0.h2->a1.h1<k>",
    "a0.h0->a1.h2<q>",
    "m0->a1.h1<v>",
    "a1.h0->logits",
    "m1->logits",
]


@pytest.fixture(scope="module", params=["olmo2", "gemma2", "gemma3"])
def case(request):
    """``(family, transformers model, our model, clean tokens, corrupted tokens)``: three pairs of 7 tokens
    that differ at positions 2 and 4."""
    family, hf, ours = family_pair(request.param)
    assert ours.cfg.norm_position in ("post", "sandwich"), family
    clean = torch.randint(1, VOCAB, (3, 7), generator=torch.Generator().manual_seed(1))
    corrupted = clean.clone()
    corrupted[:, 2], corrupted[:, 4] = 9, 11
    return family, hf, ours, clean, corrupted


def _hf_layer(hf, l: int):
    return hf.base_model.layers[l]


def _gain(hf, l: int) -> torch.Tensor:
    """Transformers' post-attention norm gain of layer ``l``: Gemma's ``1 + w``, OLMo 2's ``w``."""
    w = _hf_layer(hf, l).post_attention_layernorm.weight
    return 1 + w if "Gemma" in type(hf).__name__ else w


def _sender_output(hf, ours, cache, sender: str) -> torch.Tensor:
    """``[batch, pos, d_model]``: the input embedding, an MLP's (normalised) output, or one head's share
    ``g ⊙ z_h W_O[h] / σ`` of its layer's normalised attention output in the run of ``cache``."""
    if sender == "input":
        return cache["blocks.0.hook_resid_pre"]
    if sender.startswith("m"):
        return cache[f"blocks.{int(sender[1:])}.hook_mlp_out"]
    l, h = map(int, re.fullmatch(r"a(\d+)\.h(\d+)", sender).groups())
    z, w_o = cache[f"blocks.{l}.attn.hook_z"], ours.blocks[l].attn.W_O
    total = torch.einsum("bphe,hed->bpd", z, w_o)
    sigma = (total.pow(2).mean(-1, keepdim=True) + ours.cfg.layer_norm_eps).sqrt()
    return _gain(hf, l) * (z[:, :, h] @ w_o[h]) / sigma


def _senders(n_layer: int, n_head: int) -> list[str]:
    return ["input"] + [x for l in range(n_layer) for x in [*(f"a{l}.h{h}" for h in range(n_head)), f"m{l}"]]


@torch.no_grad()
def test_the_senders_outputs_sum_to_the_residual_stream_of_each_run(case):
    family, hf, ours, clean, corrupted = case
    c = ours.cfg
    graph = graph_of(ours)
    # the same edges as a pre-norm model of these sizes
    assert graph.edges == Graph(c.n_layer, c.n_head, c.n_kv).edges, family
    senders = _senders(c.n_layer, c.n_head)
    for tokens in (clean, corrupted):
        _, cache = ours.run_with_cache(tokens)
        for l in range(c.n_layer):
            before = [s for s in senders if s == "input" or int(re.match(r"[am](\d+)", s).group(1)) < l]
            total = sum(_sender_output(hf, ours, cache, s) for s in before)
            assert torch.allclose(total, cache[f"blocks.{l}.hook_resid_pre"], atol=1e-4), (family, l)


def _metric_by_hand(hf, ours, tokens, receiver=None, add=None, start=None, reads=None) -> torch.Tensor:
    """The pair-mean metric of ``ours`` on ``tokens`` with ``add`` added to the input of ``receiver`` alone. An
    MLP receiver's output is transformers' layer: its post-feedforward norm of its MLP of (Gemma: its
    pre-feedforward norm of) ``resid_mid + add``; a head's q/k/v input is the model's per-head input copy; the
    logits read the final residual. ``start``: the residual entering block 0 (an input path); ``reads(stage, x)``:
    what the receivers of ``stage`` (``("qkv", l)``, ``("mlp", l)``, ``("logits", n_layer)``) read instead of the
    residual ``x`` there, the residual stream itself unchanged (an activation path)."""
    n = ours.cfg.n_layer
    receiver = receiver or ""
    head = re.fullmatch(r"a(\d+)\.h(\d+)<([qkv])>", receiver)
    mid: dict[int, torch.Tensor] = {}

    def read(stage, x, here: bool):
        return (x if reads is None else reads(stage, x)) + (add if here else 0)

    def keep_mid(act, hook, l):
        mid[l] = act

    def mlp_out(act, hook, l):
        if receiver != f"m{l}" and reads is None:
            return None
        layer = _hf_layer(hf, l)
        x = read(("mlp", l), mid[l], receiver == f"m{l}")
        if hasattr(layer, "pre_feedforward_layernorm"):
            x = layer.pre_feedforward_layernorm(x)
        return layer.post_feedforward_layernorm(layer.mlp(x))

    def qkv_in(act, hook, l, kind):
        act = read(("qkv", l), act[:, :, 0], False)[:, :, None].expand_as(act).clone()
        if head is not None and (int(head.group(1)), head.group(3)) == (l, kind):
            act[:, :, int(head.group(2))] += add
        return act

    def first(act, hook):
        return start

    hooks = [("blocks.0.hook_resid_pre", first)] if start is not None else []
    for l in range(n):
        hooks += [
            (f"blocks.{l}.hook_resid_mid", lambda a, hook, l=l: keep_mid(a, hook, l)),
            (f"blocks.{l}.hook_mlp_out", lambda a, hook, l=l: mlp_out(a, hook, l)),
        ]
    handles = []
    if receiver == "logits" or reads is not None:
        handles.append(
            ours.ln_final.register_forward_pre_hook(lambda m, a: (read(("logits", n), a[0], receiver == "logits"),))
        )
    split = head is not None or reads is not None
    hooks += [
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


def _edges(ours) -> list[str]:
    return [e for e in EDGES if e in graph_of(ours).edges]


@torch.no_grad()
def test_post_norm_edge_patching_equals_a_hand_written_patch_through_transformers_layers(case):
    family, hf, ours, clean, corrupted = case
    graph = graph_of(ours)
    pairs = pairs_of(ours, clean, corrupted, METRIC)
    edges = _edges(ours)
    assert len(edges) == len(EDGES), family
    ids = [graph.edge(e) for e in edges]
    exact = edge_patch(ours, graph, pairs, edges=ids, progress=False).mean(-1)
    rows = torch.zeros(len(ids), graph.n_edges)
    rows[torch.arange(len(ids)), ids] = 1
    run = run_with_edges(ours, graph, pairs, rows).mean(-1) - pairs.clean_metric.mean()
    _, c = ours.run_with_cache(clean)
    _, k = ours.run_with_cache(corrupted)
    base = _metric_by_hand(hf, ours, clean)
    assert abs(float(base) - float(pairs.clean_metric.mean())) < 2e-5, family
    want = torch.stack(
        [
            _metric_by_hand(
                hf, ours, clean, e.split("->")[1], _sender_output(hf, ours, k, s) - _sender_output(hf, ours, c, s)
            )
            - base
            for e in edges
            for s in [e.split("->")[0]]
        ]
    )
    assert float(want.abs().max()) > 1e-3, family  # the edges do something
    assert torch.allclose(exact, want, atol=2e-5), (family, exact, want)
    assert torch.allclose(run, want, atol=2e-5), (family, run, want)
    # every edge patched is the corrupted run; none patched the clean one; several at once compose in one run
    masks = torch.stack([torch.ones(graph.n_edges), torch.zeros(graph.n_edges), rows.sum(0)])
    every = run_with_edges(ours, graph, pairs, masks)
    assert torch.allclose(every[0], pairs.corrupted_metric, atol=2e-5), family
    assert torch.allclose(every[1], pairs.clean_metric, atol=2e-5), family
    assert float((every[2] - every[1]).abs().max()) > 1e-3, family


def _derivative(hf, ours, tokens, receiver, delta, **kw) -> float:
    """d/dε at ε = 0 of the pair-mean metric with ``ε · delta`` added to ``receiver``'s input (by hand)."""
    eps = torch.zeros((), requires_grad=True)
    (g,) = torch.autograd.grad(_metric_by_hand(hf, ours, tokens, receiver, eps * delta, **kw), [eps])
    return float(g)


def _stage(receiver: str, n_layer: int) -> tuple[str, int]:
    if receiver == "logits":
        return ("logits", n_layer)
    if receiver.startswith("m"):
        return ("mlp", int(receiver[1:]))
    return ("qkv", int(re.match(r"a(\d+)", receiver).group(1)))


def test_post_norm_eap_and_eap_ig_are_the_autograd_derivative_of_the_hand_written_patch(case):
    family, hf, ours, clean, corrupted = case
    n = ours.cfg.n_layer
    with torch.no_grad():
        _, c = ours.run_with_cache(clean)
        _, k = ours.run_with_cache(corrupted)
    alphas = (0.25, 0.75)
    at = {("qkv", l): f"blocks.{l}.hook_resid_pre" for l in range(n)}
    at |= {("mlp", l): f"blocks.{l}.hook_resid_mid" for l in range(n)}
    at[("logits", n)] = f"blocks.{n - 1}.hook_resid_post"
    edges = _edges(ours)
    ids = [graph_of(ours).edge(e) for e in edges]
    got = {
        (m, p): edge_scores(ours, clean, corrupted, METRIC, method=m, ig_steps=2, ig_path=p, progress=False).scores[ids]
        for m, p in (("eap", "inputs"), ("eap-ig", "inputs"), ("eap-ig", "activations"))
    }
    for i, e in enumerate(edges):
        s, r = e.split("->")
        delta = _sender_output(hf, ours, k, s) - _sender_output(hf, ours, c, s)
        eap = _derivative(hf, ours, clean, r, delta)
        e0, e1 = c["blocks.0.hook_resid_pre"], k["blocks.0.hook_resid_pre"]
        ig_in = sum(_derivative(hf, ours, clean, r, delta, start=e0 + a * (e1 - e0)) for a in alphas) / 2
        stage = _stage(r, n)
        a0, a1 = c[at[stage]], k[at[stage]]
        ig_act = (
            sum(
                _derivative(
                    hf,
                    ours,
                    clean,
                    r,
                    delta,
                    reads=lambda st, x, a=a, a0=a0, a1=a1, stage=stage: a0 + a * (a1 - a0) if st == stage else x,
                )
                for a in alphas
            )
            / 2
        )
        for key, want in ((("eap", "inputs"), eap), (("eap-ig", "inputs"), ig_in), (("eap-ig", "activations"), ig_act)):
            assert abs(float(got[key][i]) - want) < 2e-5 + 1e-4 * abs(want), (family, key, e, float(got[key][i]), want)
    assert max(abs(float(v)) for v in got["eap", "inputs"]) > 1e-3, family


def test_a_post_norm_circuit_keeps_its_graph_through_a_file_and_is_faithful_on_the_whole_graph(case, tmp_path):
    family, _, ours, clean, corrupted = case
    scores = edge_scores(ours, clean, corrupted, METRIC, method="eap", progress=False)
    circ = evaluate(ours, circuit(scores, top=20), clean, corrupted, METRIC, completeness=False)
    back = Circuit.load(circ.save(tmp_path / "c.json"))
    assert back.graph.edges == graph_of(ours).edges, family
    whole = evaluate(ours, circuit(scores, fraction=1.0, prune_dangling=False), clean, corrupted, METRIC)
    assert abs(whole.faithfulness - 1) < 1e-4 and abs(whole.completeness) < 1e-4, family


def test_a_post_norm_block_with_an_attention_output_bias_is_refused_by_name():
    _, _, ours = family_pair("olmo2")
    ours.cfg = dataclasses.replace(ours.cfg, attn_out_bias=True)
    with pytest.raises(ValueError, match=r"has_attn_out_bias=True"):
        graph_of(ours)
