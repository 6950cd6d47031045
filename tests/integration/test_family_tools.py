"""The reading and causal tools on every model family (and GPT-2), each against an oracle: the logit lens
at every layer against transformers' own final norm, head and soft-cap applied to its hidden states; the
identity tuned lens against the logit lens, and training lowering its KL; direct logit attribution per
component and per head summing to the logit and to each attention output; value vectors against the
family's MLP output weights read from transformers; activation patching per head and causal tracing
against hand-written hook loops; activation-path integrated gradients converging to exact patching (the
gradients flow through soft-caps, q/k norms and parallel blocks); edge patching against a hand-written
hook loop; probes on each family's residuals; and a view of a result of each family.

The models have GPT-2's vocabulary (50257) so that GPT-2's tokenizer reads text prompts.

Run: ``pytest -p no:cacheprovider -q tests/integration/test_family_tools.py``."""

from __future__ import annotations

import re

import pytest
import torch

from gpt2_interp.analysis import (
    causal_trace,
    logit_attribution,
    logit_lens,
    neuron_vocab,
    patch,
    probe,
)
from gpt2_interp.analysis.attribution import attribute
from gpt2_interp.analysis.circuits import edge_patch, graph_of, pairs_of, run_with_edges
from gpt2_interp.analysis.metrics import logit_diff
from gpt2_interp.analysis.tokens import subject_span
from gpt2_interp.analysis.tuned_lens import TunedLens, lens_divergence, train_tuned_lens

transformers = pytest.importorskip("transformers")

from tests.families_cases import CASES, REFERENCE_CASES, family_pair  # noqa: E402

FAMILIES = sorted(CASES) + sorted(REFERENCE_CASES)
N_VOCAB = 50257
PROMPT, SUBJECT = "The Eiffel Tower is located in the city of", "Eiffel Tower"
TEXTS = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "Germany is a country in Europe, and Kenya is a country in Africa.",
    "Iron has the chemical symbol Fe; gold has the symbol Au.",
    "People in Brazil mostly speak Portuguese, people in Peru Spanish.",
]


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request):
    """Each family's ``(family, transformers model, our model)`` with GPT-2's vocabulary."""
    return family_pair(request.param, N_VOCAB)


def _tokens(ours):
    return ours.to_tokens(PROMPT)


def _hf_final(hf):
    """transformers' final norm and head of ``hf``, and its final logit soft-cap (None without one)."""
    base = hf.base_model
    norm = next(getattr(base, n) for n in ("norm", "final_layer_norm", "ln_f") if hasattr(base, n))
    return norm, hf.get_output_embeddings(), getattr(hf.config, "final_logit_softcapping", None)


@torch.no_grad()
def test_logit_lens_at_every_layer_is_transformers_norm_and_head_on_its_hidden_states(pair):
    family, hf, ours = pair
    tokens = _tokens(ours)
    out = hf(tokens, output_hidden_states=True)
    norm, head, cap = _hf_final(hf)
    want = []
    for h in out.hidden_states[:-1]:  # the last hidden state is already normalised: the logits stand for it
        logits = head(norm(h))
        want.append(torch.tanh(logits / cap) * cap if cap else logits)
    want.append(out.logits)
    got = logit_lens(ours, tokens, positions="all", return_logits=True, progress=False).logits[:, 0]
    assert got.shape[0] == ours.cfg.n_layer + 1
    for i, w in enumerate(want):
        assert (got[i] - w[0]).abs().max().item() < 1e-4, (family, i)


def test_identity_tuned_lens_is_the_logit_lens_and_training_lowers_its_kl(pair):
    family, _, ours = pair
    tokens = _tokens(ours)
    plain = logit_lens(ours, tokens, positions="all", return_logits=True, progress=False)
    tuned = logit_lens(ours, tokens, positions="all", return_logits=True, lens=TunedLens.identity(ours))
    assert torch.equal(plain.logits, tuned.logits), family
    lens = train_tuned_lens(ours, TEXTS, steps=4, init="identity", batch_tokens=32, lr=1e-2, seq_len=16, progress=False)
    before = lens_divergence(ours, TEXTS[:2], None, seq_len=16)["kl_bits"]
    after = lens_divergence(ours, TEXTS[:2], lens, seq_len=16)["kl_bits"]
    assert after[-1] < 1e-4 and before[-1] < 1e-4, family  # the last boundary is the output
    assert sum(after[:-1]) < sum(before[:-1]), (family, before, after)


@torch.no_grad()
def test_dla_parts_sum_to_the_logit_and_heads_to_each_attention_output(pair):
    """Per component the parts sum to the logit difference; per head (grouped-query, parallel, and after
    the post-attention norm where the family has one) the heads plus the output bias sum to each layer's
    attention part. Soft-capped logits (Gemma 2) are split before the cap: the logit the parts sum to is the
    difference of transformers' head applied to its final hidden state, and capping it gives transformers' logits."""
    family, hf, ours = pair
    dla = logit_attribution(ours, PROMPT, " Paris", baseline=" Rome")
    assert abs(dla.total - dla.logit) < 1e-4, family
    out = hf(_tokens(ours), output_hidden_states=True)
    _, head, cap = _hf_final(hf)
    paris, rome = ours.to_single_token(" Paris"), ours.to_single_token(" Rome")
    readout = head(out.hidden_states[-1])[0, -1]  # transformers' last hidden state is already normalised
    assert abs(dla.logit - float(readout[paris] - readout[rome])) < 1e-4, family
    capped = torch.tanh(readout / cap) * cap if cap else readout
    assert (capped - out.logits[0, -1]).abs().max().item() < 1e-4, family
    attn = torch.stack([dla.parts[dla.labels.index(f"L{i}.attn")] for i in range(ours.cfg.n_layer)])
    heads = dla.head_parts.sum(-1) + dla.b_O_parts
    assert (heads - attn).abs().max().item() < 1e-4, (family, heads, attn)
    assert dla.head_parts.abs().max() > 1e-3


def _hf_value_vectors(hf, layer: int) -> torch.Tensor:
    """What neuron ``i`` of ``layer``'s MLP writes to the residual per unit activation, ``[d_mlp, d_model]``, from
    transformers' weights: the MLP's output matrix (``down_proj``, GPT-NeoX's ``dense_4h_to_h``, GPT-J's
    ``fc_out``, GPT-2's ``c_proj``) times the gain of the post-feedforward norm where there is one (up to that
    norm's positive 1/scale of the run)."""
    base = hf.base_model
    block = (base.layers if hasattr(base, "layers") else base.h)[layer]
    mlp = block.mlp
    if hasattr(mlp, "down_proj"):
        v = mlp.down_proj.weight.T
    elif hasattr(mlp, "dense_4h_to_h"):
        v = mlp.dense_4h_to_h.weight.T
    elif hasattr(mlp, "fc_out"):
        v = mlp.fc_out.weight.T
    else:
        v = mlp.c_proj.weight  # GPT-2's Conv1D: [d_mlp, d_model]
    post = getattr(block, "post_feedforward_layernorm", None)
    if post is not None:
        offset = 1.0 if "gemma" in type(hf).__name__.lower() else 0.0
        v = v * (offset + post.weight)
    return v


@torch.no_grad()
def test_value_vectors_project_as_the_weights_of_transformers_say(pair):
    family, hf, ours = pair
    neurons = [0, 5, 17]
    for layer in range(ours.cfg.n_layer):
        want = _hf_value_vectors(hf, layer)[neurons] @ hf.get_output_embeddings().weight.T  # raw v @ W_U
        got = neuron_vocab(ours, layer, neurons, k=5, apply_ln=False)
        top = want.topk(5, dim=-1)
        assert torch.equal(got.top_ids, top.indices), (family, layer)
        assert (got.top_scores - top.values).abs().max().item() < 1e-4, (family, layer)


def _sweep_by_hand(ours, clean, corr, metric, hook: str, layer: int, n: int):
    """Each head (or key/value head) of ``hook`` at ``layer`` patched from the clean run into the corrupted run
    at every position, one forward pass per head with one hook written out here."""
    name = f"blocks.{layer}.attn.hook_{hook}"
    _, cache = ours.run_with_cache(clean, names_filter=[name])
    out = []
    for h in range(n):

        def put(x, hook, h=h):
            x = x.clone()
            x[:, :, h] = cache[name][:, :, h]
            return x

        out.append(metric(ours.run_with_hooks(corr, fwd_hooks=[(name, put)])[:, -1]).item())
    return torch.tensor(out)


@torch.no_grad()
def test_per_head_patching_equals_naive_patching(pair):
    """Query-head outputs (``z``, last layer) and the key/value heads (``k``, first layer) patched one at a time."""
    family, _, ours = pair
    clean = ours.to_tokens(PROMPT)
    corr = clean.clone()
    corr[0, 2], corr[0, 5] = 9, 11

    def metric(logits):
        return logits[..., 5] - logits[..., 6]

    last = ours.cfg.n_layer - 1
    for hook, n, layer in (("z", ours.cfg.n_head, last), ("k", ours.cfg.n_kv, 0)):
        res = patch(ours, clean, corr, metric, hook=hook, layers=[layer], progress=False)
        ref = _sweep_by_hand(ours, clean, corr, metric, hook, layer, n)
        assert (res.values[0] - ref).abs().max().item() < 1e-4, (family, hook, layer)


@torch.no_grad()
def test_causal_trace_equals_romes_procedure_written_out(pair):
    family, _, ours = pair
    r = causal_trace(ours, PROMPT, SUBJECT, kind="hidden", samples=3, noise=0.5, seed=2)
    s, e = subject_span(ours, PROMPT, SUBJECT)
    noise = torch.randn(3, e - s, ours.cfg.d_model, generator=torch.Generator().manual_seed(2)) * 0.5
    target = r.target_id
    tokens = ours.to_tokens(PROMPT)
    _, clean = ours.run_with_cache(tokens)

    def add_noise(act, hook):
        act = act.clone()
        act[:, s:e] += noise
        return act

    for t in (e - 1, tokens.shape[1] - 2):  # the subject's last token, the prompt's last token
        for layer in range(ours.cfg.n_layer):
            name = f"blocks.{layer}.hook_resid_post"

            def restore(act, hook, t=t, name=name):
                act = act.clone()
                act[:, t + 1] = clean[name][0, t + 1]
                return act

            logits = ours.run_with_hooks(tokens.repeat(3, 1), fwd_hooks=[("hook_embed", add_noise), (name, restore)])
            want = torch.softmax(logits[:, -1].float(), -1)[:, target].mean().item()
            assert abs(r.scores[t, layer].item() - want) < 1e-5, (family, t, layer)


@pytest.mark.parametrize("hook, kw", [("resid_pre", dict(positions="all", layers=[0])), ("z", dict(heads="all"))])
def test_activation_path_ig_converges_to_exact_patching(pair, hook, kw):
    """With one cell per layer, the activation-path integral of the gradient is exactly that patch: its
    error falls with the steps to well below the effect. A gradient that skipped a soft-cap, a q/k norm or
    a parallel branch would integrate to another number."""
    family, _, ours = pair
    clean = ["The capital of France is", "Paris is a city in"]
    corrupt = ["The capital of Italy is", "London is a city in"]
    m = logit_diff([" Paris", " France"], [" Rome", " England"])
    ex = patch(ours, clean, corrupt, m, hook=hook, progress=False, **kw)
    exact = ex.pair_values - ex.corrupted_pair_metric.view((-1,) + (1,) * (ex.pair_values.ndim - 1))
    scale = float(exact.abs().max())
    assert scale > 1e-3, family
    err = {}
    for steps in (2, 16):
        est = attribute(ours, clean, corrupt, m, hook=hook, method="ig", ig_steps=steps, ig_path="activations", **kw)
        eff = est.pair_values - est.corrupted_pair_metric.view((-1,) + (1,) * (est.pair_values.ndim - 1))
        err[steps] = float((eff - exact).abs().max())
    assert err[16] <= 1e-2 * scale and err[16] <= err[2], (family, err, scale)


def _edge_by_hand(ours, clean, c, k, metric, edge: str) -> float:
    """One edge patched with one hook: the receiver's input gets the sender's corrupted minus clean output
    (an input embedding, an MLP output, or one head's ``z @ W_O``; ``c``/``k``: the clean/corrupted caches)."""
    n = ours.cfg.n_layer
    sender, receiver = edge.split("->")

    def out(cache):
        if sender == "input":
            return cache["blocks.0.hook_resid_pre"]
        if sender.startswith("m"):
            return cache[f"blocks.{int(sender[1:])}.hook_mlp_out"]
        l, h = map(int, re.fullmatch(r"a(\d+)\.h(\d+)", sender).groups())
        head = cache[f"blocks.{l}.attn.hook_z"][:, :, h] @ ours.blocks[l].attn.W_O[h]
        if ours.cfg.norm_position == "pre":
            return head
        # a post-norm block adds g ⊙ Σ_h head_h / σ: head h's share at that run's scale σ
        attn_out = cache[f"blocks.{l}.attn.hook_z"].flatten(-2) @ ours.blocks[l].attn.W_O.flatten(0, 1)
        sigma = (attn_out.pow(2).mean(-1, keepdim=True) + ours.cfg.layer_norm_eps).sqrt()
        return ours.blocks[l].ln1_post.gain * head / sigma

    delta = out(k) - out(c)
    if receiver == "logits":
        name, idx = f"blocks.{n - 1}.hook_resid_post", None
    elif receiver.startswith("m"):
        name, idx = f"blocks.{int(receiver[1:])}.hook_mlp_in", None
    else:
        l, h, kind = re.fullmatch(r"a(\d+)\.h(\d+)<([qkv])>", receiver).groups()
        name, idx = f"blocks.{l}.hook_{kind}_input", int(h)

    def fn(act, hook):
        act = act.clone()
        if idx is None:
            act += delta
        else:
            act[:, :, idx] += delta
        return act

    base = metric(ours(clean)[:, -1])
    ours.set_use_split_qkv_input(True)
    ours.set_use_hook_mlp_in(True)
    try:
        logits = ours.run_with_hooks(clean, fwd_hooks=[(name, fn)])
    finally:
        ours.set_use_split_qkv_input(False)
        ours.set_use_hook_mlp_in(False)
    return float(metric(logits[:, -1]) - base)


@torch.no_grad()
def test_edge_patching_equals_a_hand_written_hook_loop(pair):
    """Edges into a query head, a key/value head (grouped-query), an MLP and the logits; every edge patched
    gives the corrupted run. Parallel blocks (GPT-NeoX, GPT-J) feed their MLP from the block's input, so a
    layer's heads have no edge to its own MLP. A family that normalises each block output (Gemma, OLMo 2) has
    reads a head's output as its share of the normalised attention output at the run's scale."""
    family, _, ours = pair
    clean = ours.to_tokens(PROMPT)
    corr = clean.clone()
    corr[0, 2], corr[0, 5] = 9, 11
    metric = logit_diff(5, 6)
    graph = graph_of(ours)
    pairs = pairs_of(ours, clean, corr, metric)
    into_mlp = "a0.h0->m1" if ours.cfg.parallel != "none" else "a0.h0->m0"
    assert ("a0.h0->m0" in graph.edges) == (ours.cfg.parallel == "none"), family
    edges = ["input->a0.h1<q>", "a0.h2->a1.h1<k>", "a0.h3->a1.h0<v>", into_mlp, "m0->m1", "a1.h0->logits"]
    exact = edge_patch(ours, graph, pairs, edges=[graph.edges.index(e) for e in edges])
    _, c = ours.run_with_cache(clean)
    _, k = ours.run_with_cache(corr)
    for i, e in enumerate(edges):
        ref = _edge_by_hand(ours, clean, c, k, metric, e)
        assert abs(float(exact[i, 0]) - ref) < 1e-4, (family, e)
    # every edge patched is the corrupted run
    every = torch.ones(1, graph.n_edges)
    full = run_with_edges(ours, graph, pairs, every)[0, 0]
    assert abs(float(full) - float(pairs.corrupted_metric[0])) < 1e-4, family


def test_probes_train_on_each_familys_residuals(pair):
    family, _, ours = pair
    words = ["Paris", "Rome", "Berlin", "Madrid", "Tokyo", "Lima", "Cairo", "Oslo", "Dublin", "Vienna"]
    prompts = [f"The city of {w} is" for w in words] + [f"The number {i} is" for i in range(10)]
    labels = ["city"] * 10 + ["number"] * 10
    r = probe(ours, prompts, labels, layers=[0, ours.cfg.n_layer - 1], n_folds=2, progress=False)
    assert r.scores.shape == (2, 2) and torch.isfinite(torch.as_tensor(r.scores)).all(), family


def test_a_view_of_each_familys_results_renders(pair):
    from gpt2_interp.views import view

    family, _, ours = pair
    html = view(logit_lens(ours, PROMPT, progress=False)).html()
    assert "plotly" in html.lower(), family
    html = view(neuron_vocab(ours, 0, [0, 1], k=3)).html()
    assert len(html) > 1000, family
