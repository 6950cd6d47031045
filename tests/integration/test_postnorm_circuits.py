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
from functools import partial

import pytest
import torch

from gpt2_interp.analysis.circuits import Graph, graph_of, run_with_edges

transformers = pytest.importorskip("transformers")

from tests.families_cases import family_pair  # noqa: E402
from tests.integration import circuit_refs as refs  # noqa: E402

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
    family, hf, ours, clean, corrupted = refs.circuit_case(request.param)
    assert ours.cfg.norm_position in ("post", "sandwich"), family
    return family, hf, ours, clean, corrupted


def _hf_layer(hf, l: int):
    return hf.base_model.layers[l]


def _gain(hf, l: int) -> torch.Tensor:
    """Transformers' post-attention norm gain of layer ``l``: Gemma's ``1 + w``, OLMo 2's ``w``."""
    w = _hf_layer(hf, l).post_attention_layernorm.weight
    return 1 + w if "Gemma" in type(hf).__name__ else w


def _out(hf, ours):
    """``out(cache, sender)``: a head's share ``g ⊙ z_h W_O[h] / σ`` of its layer's normalised attention output."""
    return partial(refs.sender_output, ours, gain=partial(_gain, hf))


@torch.no_grad()
def test_the_senders_outputs_sum_to_the_residual_stream_of_each_run(case):
    family, hf, ours, clean, corrupted = case
    c = ours.cfg
    graph = graph_of(ours)
    # the same edges as a pre-norm model of these sizes
    assert graph.edges == Graph(c.n_layer, c.n_head, c.n_kv).edges, family
    out = _out(hf, ours)
    for tokens in (clean, corrupted):
        _, cache = ours.run_with_cache(tokens)
        for l in range(c.n_layer):
            before = [
                s
                for s in refs.senders(c.n_layer, c.n_head)
                if s == "input" or int(re.match(r"[am](\d+)", s).group(1)) < l
            ]
            total = sum(out(cache, s) for s in before)
            assert torch.allclose(total, cache[f"blocks.{l}.hook_resid_pre"], atol=1e-4), (family, l)


def _metric_by_hand(hf, ours, tokens, receiver=None, add=None, start=None, reads=None) -> torch.Tensor:
    """The pair-mean metric of ``ours`` on ``tokens`` with ``add`` added to the input of ``receiver`` alone. An
    MLP receiver's output is transformers' layer: its post-feedforward norm of its MLP of (Gemma: its
    pre-feedforward norm of) ``resid_mid + add``; a head's q/k/v input is the model's per-head input copy; the
    logits read the final residual. ``start``: the residual entering block 0 (an input path); ``reads(stage, x)``:
    what the receivers of ``stage`` (``("qkv", l)``, ``("mlp", l)``, ``("logits", n_layer)``) read instead of the
    residual ``x`` there, the residual stream itself unchanged (an activation path)."""
    receiver = receiver or ""
    mid: dict[int, torch.Tensor] = {}

    def keep_mid(act, hook, l):
        mid[l] = act

    def mlp_out(act, hook, l):
        if receiver != f"m{l}" and reads is None:
            return None
        layer = _hf_layer(hf, l)
        x = refs.read(reads, ("mlp", l), mid[l], add, receiver == f"m{l}")
        if hasattr(layer, "pre_feedforward_layernorm"):
            x = layer.pre_feedforward_layernorm(x)
        return layer.post_feedforward_layernorm(layer.mlp(x))

    def first(act, hook):
        return start

    hooks = [("blocks.0.hook_resid_pre", first)] if start is not None else []
    for l in range(ours.cfg.n_layer):
        hooks += [
            (f"blocks.{l}.hook_resid_mid", lambda a, hook, l=l: keep_mid(a, hook, l)),
            (f"blocks.{l}.hook_mlp_out", lambda a, hook, l=l: mlp_out(a, hook, l)),
        ]
    return refs.run_by_hand(ours, tokens, receiver, add, reads, lambda stage, l: (stage, l), hooks, [])


def _edges(ours) -> list[str]:
    return [e for e in EDGES if e in graph_of(ours).edges]


def _refs(case) -> refs.Refs:
    family, hf, ours, clean, corrupted = case
    return refs.Refs(family, ours, clean, corrupted, _edges(ours), _out(hf, ours), partial(_metric_by_hand, hf, ours))


@torch.no_grad()
def test_post_norm_edge_patching_equals_a_hand_written_patch_through_transformers_layers(case):
    family, _, ours, clean, _ = case
    r = _refs(case)
    assert len(r.edges) == len(EDGES), family
    base = r.by_hand(clean)
    graph, pairs, rows, _ = refs.check_edge_patching(r, base)
    assert abs(float(base) - float(pairs.clean_metric.mean())) < 2e-5, family
    # every edge patched is the corrupted run; none patched the clean one; several at once compose in one run
    masks = torch.stack([torch.ones(graph.n_edges), torch.zeros(graph.n_edges), rows.sum(0)])
    every = run_with_edges(ours, graph, pairs, masks)
    assert torch.allclose(every[0], pairs.corrupted_metric, atol=2e-5), family
    assert torch.allclose(every[1], pairs.clean_metric, atol=2e-5), family
    assert float((every[2] - every[1]).abs().max()) > 1e-3, family


def _point(receiver: str, n_layer: int) -> tuple[tuple[str, int], str]:
    """The activation path's ``(stage, hook)`` of a receiver: a head's q/k/v reads its block's input, an MLP the
    residual after attention, the logits the last block's output."""
    if receiver == "logits":
        return ("logits", n_layer), f"blocks.{n_layer - 1}.hook_resid_post"
    if receiver.startswith("m"):
        l = int(receiver[1:])
        return ("mlp", l), f"blocks.{l}.hook_resid_mid"
    l = int(re.match(r"a(\d+)", receiver).group(1))
    return ("qkv", l), f"blocks.{l}.hook_resid_pre"


def test_post_norm_eap_and_eap_ig_are_the_autograd_derivative_of_the_hand_written_patch(case):
    refs.check_eap_against_derivatives(_refs(case), partial(_point, n_layer=case[2].cfg.n_layer))


def test_a_post_norm_circuit_keeps_its_graph_through_a_file_and_is_faithful_on_the_whole_graph(case, tmp_path):
    family, _, ours, clean, corrupted = case
    refs.check_circuit_file_and_whole_graph(family, ours, clean, corrupted, tmp_path)


def test_a_post_norm_block_with_an_attention_output_bias_is_refused_by_name():
    _, _, ours = family_pair("olmo2")
    ours.cfg = dataclasses.replace(ours.cfg, attn_out_bias=True)
    with pytest.raises(ValueError, match=r"has_attn_out_bias=True"):
        graph_of(ours)
