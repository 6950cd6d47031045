"""Cross-layer transcoders: the prediction is the sum of every earlier layer's decoders (checked against an
explicit loop), the replacement model with a CLT reproduces the model's logits, every edge of a CLT graph equals
the brute-force effect of removing its source from the frozen replacement model, a CLT with zero cross-layer
decoders gives the per-layer transcoders' graph bit for bit, training lowers the paper's loss (its value
checked by hand), and the files are circuit-tracer's CLT layout."""

from __future__ import annotations

import copy
import dataclasses
import json
import math

import pytest
import torch

import gpt2_interp as gi
import gpt2_interp.graphs.clt as clt_module
from gpt2_interp.graphs.attribution import AttributionConfig, attribute
from gpt2_interp.graphs.clt import (
    CLTTrainConfig,
    CrossLayerTranscoder,
    clt_loss,
    load_transcoders,
    new_cross_layer_transcoder,
    train_cross_layer_transcoder,
)
from gpt2_interp.graphs.replacement import ReplacementModel
from gpt2_interp.graphs.transcoder import TranscoderTrainConfig, evaluate_transcoders, new_transcoders
from gpt2_interp.io.files import FileFormatError
from gpt2_interp.io.integrity import IntegrityError
from gpt2_interp.model import GPT2Config, HookedGPT2, llama_config

TOKENS = torch.tensor([1, 5, 9, 33, 7, 2])


def _model(family: str, dtype: torch.dtype = torch.float64) -> HookedGPT2:
    sizes = dict(n_layer=3, d_model=32, n_head=4, d_mlp=48, n_ctx=16, d_vocab=64)
    cfg = llama_config(n_kv_heads=2, **sizes) if family == "llama" else GPT2Config(**sizes)
    return HookedGPT2(cfg, seed=0).eval().to(dtype)


def _random_clt(model: HookedGPT2, architecture: str = "topk", seed: int = 1) -> CrossLayerTranscoder:
    """An untrained CLT with non-zero biases, skips and cross-layer decoders (every term of the maths exercised)."""
    k = None if architecture == "relu" else 4
    cfg = CLTTrainConfig(d_sae=24, k=k, architecture=architecture, skip=True, seed=seed)
    clt = new_cross_layer_transcoder(model, cfg)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        clt.b_enc.copy_(0.1 * torch.randn(clt.b_enc.shape, generator=g) - (0.3 if architecture == "relu" else 0))
        clt.b_dec.copy_(0.1 * torch.randn(clt.b_dec.shape, generator=g))
        assert clt.W_skip is not None
        clt.W_skip.copy_(0.05 * torch.randn(clt.W_skip.shape, generator=g))
        if clt.threshold is not None:
            clt.threshold.copy_(torch.rand(clt.threshold.shape, generator=g) - 0.3)
    return clt.to(model.dtype)


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def setup(request):
    model = _model(request.param)
    return model, _random_clt(model)


def test_a_layers_prediction_sums_the_decoders_of_every_layer_up_to_it(setup):
    model, clt = setup
    g = torch.Generator().manual_seed(5)
    xs = [torch.randn(7, model.cfg.d_model, generator=g, dtype=torch.float64) for _ in range(3)]
    acts = [clt.encode(L, x) for L, x in enumerate(xs)]
    assert all(0 < int((a > 0).sum(-1).max()) <= 4 for a in acts)
    decoded = clt.decode(acts, xs)
    for target in range(3):  # the formula as written, one feature and one source layer at a time
        expected = clt.b_dec[target].detach().expand(7, -1).clone() + xs[target] @ clt.W_skip[target].detach().T
        for source in range(target + 1):
            for i in range(clt.cfg.d_sae):
                expected += acts[source][:, i : i + 1] * clt.W_dec[source][i, target - source].detach()
        torch.testing.assert_close(clt.reconstruct(target, acts, xs[target]), expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(decoded[target], expected, rtol=1e-12, atol=1e-12)
        # a later layer's features are not read
        later = [a if target >= L else torch.full_like(a, 9.0) for L, a in enumerate(acts)]
        assert torch.equal(clt.reconstruct(target, later, xs[target]), clt.reconstruct(target, acts, xs[target]))


def test_replacement_model_with_a_clt_and_its_errors_gives_the_models_logits(setup):
    model, clt = setup
    rm = ReplacementModel(model, clt, TOKENS)
    with torch.no_grad():
        clean = model(TOKENS[None])[0]
        run = rm.run(batch=2, grad=False)
        no_err = rm.run(grad=False, errors=[torch.zeros_like(e) for e in rm.errors])
        # zeroing every cross-layer decoder changes the logits without error terms: they are used
        flat = copy.deepcopy(clt)
        for L in range(3):
            flat.W_dec[L][:, 1:] = 0
        rm_flat = ReplacementModel(model, flat, TOKENS)
        no_err_flat = rm_flat.run(grad=False, errors=[torch.zeros_like(e) for e in rm.errors])
    assert run.logits.dtype == torch.float64
    assert (run.logits[0] - clean).abs().max() <= 1e-10 and (run.logits[1] - clean).abs().max() <= 1e-10
    assert (no_err.logits[0] - clean).abs().max() > 1e-2
    assert (no_err.logits - no_err_flat.logits).abs().max() > 1e-3
    # each error is the MLP output minus the summed reconstruction of every layer up to it
    _, cache = model.run_with_cache(TOKENS[None], names_filter=lambda n: n.endswith("hook_mlp_out"))
    for L in range(3):
        recon = sum(rm.activations[s] @ clt.W_dec[s][:, L - s].detach() for s in range(L + 1))
        recon = recon + clt.b_dec[L].detach() + rm.mlp_inputs[L] @ clt.W_skip[L].detach().T
        torch.testing.assert_close(rm.errors[L], cache[f"blocks.{L}.hook_mlp_out"][0] - recon, rtol=1e-12, atol=1e-12)


def test_every_edge_of_a_clt_graph_is_the_effect_of_removing_its_source(setup):
    """Brute force: one copy of the frozen replacement model per source node, that source set to zero; an
    edge is the change of its target (a feature's pre-activation, a logit's de-meaned value)."""
    model, clt = setup
    cfg = AttributionConfig(batch_size=16, max_n_logits=3, desired_logit_prob=0.9999, first_position_features=True)
    graph = attribute(model, clt, TOKENS, cfg)
    rm = ReplacementModel(model, clt, TOKENS)
    n_f, n_layers, pos = graph.n_features, 3, len(TOKENS)
    sources = graph.logit_index(0)  # features, errors, tokens
    batch = sources + 1  # the last copy is the clean run
    acts = [a.expand(batch, -1, -1).clone() for a in rm.activations]
    errs = [e.expand(batch, -1, -1).clone() for e in rm.errors]
    embed = rm.embed.expand(batch, -1, -1).clone()
    for s, (L, p, f) in enumerate(graph.features.tolist()):
        acts[L][s, p, f] = 0
    for L in range(n_layers):
        for p in range(pos):
            errs[L][graph.error_index(L, p), p] = 0
    for p in range(pos):
        embed[graph.token_index(p), p] = 0
    with torch.no_grad():
        run = rm.run(batch=batch, activations=acts, errors=errs, embed=embed, grad=False)
    pre = run.pre_acts(clt)
    values = torch.stack([pre[L][:, p, f] for L, p, f in graph.features.tolist()], 1)  # [batch, n_f]
    last = run.logits[:, -1]
    demeaned = last[:, graph.logit_tokens] - last.mean(-1, keepdim=True)  # [batch, n_logits]
    targets = torch.cat([values, demeaned], 1)  # [batch, n_f + n_logits]
    expected = (targets[-1] - targets[:-1]).T  # [targets, sources]
    rows = torch.cat([torch.arange(n_f), torch.arange(graph.logit_index(0), len(graph.adjacency))])
    got = graph.adjacency[rows][:, :sources].double()
    assert got.abs().max() > 0.1 and (got != 0).sum() > 100
    # cross-layer writes carry edges: a layer-0 feature reaches layer-2 features through MLP outputs 0, 1 and 2
    layers = graph.features[:, 0]
    assert got[:n_f][layers == 2][:, torch.nonzero(layers == 0).flatten()].abs().max() > 1e-3
    scale = expected.abs().max()
    assert (got - expected).abs().max() <= 1e-6 * scale  # float32 storage of float64 edges
    assert n_f > 20 and sources == n_f + (n_layers + 1) * pos


def test_a_clt_with_zero_cross_layer_decoders_gives_the_per_layer_graph(setup):
    model, _ = setup
    ts = new_transcoders(model, TranscoderTrainConfig(d_sae=24, k=4, skip=True, seed=3))
    g = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for t in ts:
            t.b_enc.copy_(0.1 * torch.randn(t.b_enc.shape, generator=g))
            t.b_dec.copy_(0.1 * torch.randn(t.b_dec.shape, generator=g))
            t.W_skip.copy_(0.05 * torch.randn(t.W_skip.shape, generator=g))
    ts.to(torch.float64)
    clt = CrossLayerTranscoder.from_transcoders(ts)
    assert all(not clt.W_dec[L][:, 1:].any() for L in range(3)) and clt.W_dec[0].shape == (24, 3, 32)
    cfg = AttributionConfig(batch_size=16, max_n_logits=3, desired_logit_prob=0.9999)
    per_layer, cross = attribute(model, ts, TOKENS, cfg), attribute(model, clt, TOKENS, cfg)
    for name in ("features", "activations", "logit_tokens", "logit_probabilities", "adjacency"):
        assert torch.equal(getattr(per_layer, name), getattr(cross, name)), name
    assert per_layer.n_features > 10


def test_clt_training_lowers_the_papers_loss_whose_value_is_the_formula(monkeypatch):
    model = gi.load("gpt2-facts")  # a trained model: MLP outputs of a realistic scale
    n = model.cfg.n_layer
    docs = [f"The capital of {c} is a city." for c in ("France", "Spain", "Italy", "Japan", "Peru", "Chile")] * 4
    ids = torch.cat([model.to_tokens(d)[0] for d in docs])
    windows = ids[: len(ids) // 16 * 16].view(-1, 16)
    cfg = CLTTrainConfig(
        d_sae=32,
        architecture="relu",
        l1_coefficient=0.02,
        tanh_scale=3.0,
        skip=True,
        tokens=32 * 16,
        batch_size=32,
        buffer_tokens=128,
        forward_batch=8,
        lr=4e-3,
        epochs=4,
    )
    seen = []
    real = clt_module.clt_loss

    def recorded(clt, xs, ys, c):
        before = copy.deepcopy(clt)
        out = real(clt, xs, ys, c)
        seen.append((before, [x.clone() for x in xs], [y.clone() for y in ys], float(out[0].detach())))
        return out

    monkeypatch.setattr(clt_module, "clt_loss", recorded)
    clt = train_cross_layer_transcoder(model, cfg, windows, progress=False)
    losses = [s[3] for s in seen]
    assert len(losses) == 16
    assert sum(losses[-4:]) / 4 < 0.7 * sum(losses[:4]) / 4, losses
    # the first and the last step's loss, by hand:
    # Σ_ℓ' ‖y − ŷ‖² / Σ‖y − ȳ‖² + λ · mean_rows Σ_ℓ Σ_i tanh(c ‖W_dec,i^ℓ‖ a_i)
    for before, xs, ys, loss in (seen[0], seen[-1]):
        xs64, ys64 = [x.double() for x in xs], [y.double() for y in ys]
        W_enc, b_enc = before.W_enc.detach().double(), before.b_enc.detach().double()
        W_dec = [w.detach().double() for w in before.W_dec]
        b_dec, W_skip = before.b_dec.detach().double(), before.W_skip.detach().double()
        a = [torch.relu(x @ W_enc[L] + b_enc[L]) for L, x in enumerate(xs64)]
        mse = 0.0
        for t in range(n):
            y_hat = b_dec[t] + xs64[t] @ W_skip[t].T + sum(a[s] @ W_dec[s][:, t - s] for s in range(t + 1))
            mse += float(((ys64[t] - y_hat) ** 2).sum() / ((ys64[t] - ys64[t].mean(0)) ** 2).sum())
        sparsity = 0.0
        for L in range(n):
            norms = [math.sqrt(float((W_dec[L][i] ** 2).sum())) for i in range(32)]  # concatenated over ℓ' ≥ L
            for row in range(32):
                sparsity += sum(math.tanh(3.0 * norms[i] * float(a[L][row, i])) for i in range(32)) / 32
        assert loss == pytest.approx(mse + 0.02 * sparsity, rel=2e-5)
    # held-out-style metrics read the CLT through the same face: error terms give the clean loss back
    m = evaluate_transcoders(model, clt, windows[:8])
    assert abs(m.replaced_with_errors_loss - m.clean_loss) < 1e-4
    assert all(v > 0.0 for v in m.variance_explained), m.variance_explained


def test_clt_loss_counts_each_output_layers_fvu():
    model = _model("llama", torch.float32)
    clt = _random_clt(model, "topk").float()
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(16, 32, generator=g) for _ in range(3)]
    ys = [torch.randn(16, 32, generator=g) * (L + 1) for L in range(3)]
    cfg = CLTTrainConfig(d_sae=24, k=4)
    loss, fvus, acts = clt_loss(clt, xs, ys, cfg)
    with torch.no_grad():
        preds = clt(xs)
    for y, p, f in zip(ys, preds, fvus):
        assert float(f) == pytest.approx(float(((y - p) ** 2).sum() / ((y - y.mean(0)) ** 2).sum()), rel=1e-5)
    assert float(loss) == pytest.approx(sum(float(f) for f in fvus), rel=1e-6)  # top-k: no penalty
    assert all(int((a > 0).sum(-1).max()) <= 4 for a in acts)


@pytest.mark.parametrize("architecture", ["relu", "batchtopk", "topk"])
def test_clt_files_are_circuit_tracers_layout_and_load_back_checked(tmp_path, architecture):
    from safetensors.torch import load_file

    model = _model("llama", torch.float32)
    clt = _random_clt(model, architecture).float()
    folder = clt.save(tmp_path / "clt")
    names = sorted(p.name for p in folder.iterdir())
    assert names == [f"W_{w}_{i}.safetensors" for w in ("dec", "enc") for i in range(3)] + ["config.yaml"]
    config = json.loads((folder / "config.yaml").read_text())
    # a TopK CLT, or one with skips (circuit-tracer's loader drops W_skip_{i}), under a kind circuit-tracer refuses
    kind = "topk_cross_layer_transcoder" if architecture == "topk" else "skip_cross_layer_transcoder"
    assert config["model_kind"] == kind and config["feature_output_hook"] == "hook_mlp_out"
    no_skip = CrossLayerTranscoder(dataclasses.replace(clt.cfg, skip=False)).save(tmp_path / "no_skip")
    kind = "topk_cross_layer_transcoder" if architecture == "topk" else "cross_layer_transcoder"
    assert json.loads((no_skip / "config.yaml").read_text())["model_kind"] == kind
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(5, 32, generator=g) for _ in range(3)]
    # circuit-tracer's CrossLayerTranscoder from these files: pre = x W_enc_iᵀ + b_enc_i, ReLU or JumpReLU
    # h·[h > θ_i], layer t's output Σ_{i ≤ t} a_i W_dec_i[:, t − i] + b_dec_t + x_t @ W_skip_t
    enc = [load_file(folder / f"W_enc_{i}.safetensors") for i in range(3)]
    dec = [load_file(folder / f"W_dec_{i}.safetensors")[f"W_dec_{i}"] for i in range(3)]
    assert [tuple(d.shape) for d in dec] == [(24, 3, 32), (24, 2, 32), (24, 1, 32)]
    pre = [xs[i] @ enc[i][f"W_enc_{i}"].T + enc[i][f"b_enc_{i}"] for i in range(3)]
    if architecture == "batchtopk":
        a = [p * (p > enc[i][f"threshold_{i}"]) for i, p in enumerate(pre)]
    else:
        a = [p.relu() for p in pre]
    for t in range(3):
        torch.testing.assert_close(pre[t], clt.pre_acts(t, xs[t]), atol=1e-5, rtol=1e-5)
        if architecture != "topk":
            out = sum(a[i] @ dec[i][:, t - i] for i in range(t + 1)) + enc[t][f"b_dec_{t}"]
            out = out + xs[t] @ enc[t][f"W_skip_{t}"]
            torch.testing.assert_close(out, clt(xs)[t], atol=1e-5, rtol=1e-5)
    back = load_transcoders(folder, model)
    assert isinstance(back, CrossLayerTranscoder)
    for p, q in zip(clt(xs), back(xs)):
        assert torch.equal(p, q)
    with pytest.raises(ValueError, match="weights"):
        CrossLayerTranscoder.load(folder, HookedGPT2(model.cfg, seed=3))
    raw = (folder / "W_dec_1.safetensors").read_bytes()
    (folder / "W_dec_1.safetensors").write_bytes(raw[:-8] + bytes(8))
    with pytest.raises(IntegrityError):
        CrossLayerTranscoder.load(folder)


def test_graph_train_cross_layer_saves_a_clt_and_reports_each_layer(tmp_path, capsys):
    from gpt2_interp.cli import main

    folder = tmp_path / "clt"
    argv = ["graph", "train", "--cross-layer", "--out", str(folder), "--steps", "3", "--batch-size", "64"]
    argv += ["--d-sae", "32", "--k", "4", "--context", "16", "--buffer-tokens", "256", "--forward-batch", "8"]
    assert main([*argv, "--eval-windows", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(
        f"topk cross-layer transcoder of 6 layers (32 features per layer) of gpt2-facts saved to {folder}"
    )
    assert len(lines) == 2 + 6  # a row per layer: variance explained, L0, dead share
    clt = load_transcoders(folder)
    assert isinstance(clt, CrossLayerTranscoder) and clt.cfg.training is not None
    assert clt.cfg.training["texts"] == "facts" and clt.W_dec[0].shape == (32, 6, clt.cfg.d_model)


def _circuit_tracer_folder(folder, n=3, d_tc=24, d_model=32, threshold=True, seed=5):
    """The files circuit-tracer's ``CrossLayerTranscoder.to_safetensors`` writes (plain safetensors, no
    metadata): per layer ``W_enc_{i}`` ``[d_tc, d_model]``, ``b_enc_{i}``, ``b_dec_{i}``, ``threshold_{i}``
    ``[d_tc]`` in ``W_enc_{i}.safetensors`` and ``W_dec_{i}`` ``[d_tc, n − i, d_model]``; the raw tensors."""
    from safetensors.torch import save_file

    folder.mkdir()
    g = torch.Generator().manual_seed(seed)
    raw = {}
    for i in range(n):
        enc = {
            f"W_enc_{i}": torch.randn(d_tc, d_model, generator=g) / math.sqrt(d_model),
            f"b_enc_{i}": 0.3 * torch.randn(d_tc, generator=g),
            f"b_dec_{i}": 0.1 * torch.randn(d_model, generator=g),
        }
        if threshold:
            enc[f"threshold_{i}"] = 0.5 * torch.rand(d_tc, generator=g)
        dec = {f"W_dec_{i}": torch.randn(d_tc, n - i, d_model, generator=g) / math.sqrt(d_model)}
        save_file(enc, str(folder / f"W_enc_{i}.safetensors"))
        save_file(dec, str(folder / f"W_dec_{i}.safetensors"))
        raw |= enc | dec
    return raw


@pytest.mark.parametrize("threshold", [True, False])
def test_a_clt_folder_in_circuit_tracers_own_form_loads_and_computes_its_maths(tmp_path, threshold):
    model = _model("gpt2", torch.float32)
    folder = tmp_path / "ct"
    raw = _circuit_tracer_folder(folder, threshold=threshold)
    # circuit-tracer's published config.yaml (YAML, its keys only)
    hooks = "model_kind: cross_layer_transcoder\nfeature_input_hook: {}\nfeature_output_hook: hook_mlp_out\n"
    (folder / "config.yaml").write_text("# a CLT\n" + hooks.format("ln2.hook_normalized") + "scan: 'some/scan'\n")
    clt = load_transcoders(folder, model)
    assert isinstance(clt, CrossLayerTranscoder)
    assert clt.cfg.architecture == ("batchtopk" if threshold else "relu") and clt.cfg.base_fingerprint == ""
    g = torch.Generator().manual_seed(6)
    xs = [torch.randn(7, 32, generator=g) for _ in range(3)]
    # circuit-tracer's maths on the raw tensors: h = x W_encᵀ + b_enc, JumpReLU h·[h > θ] (or ReLU), output t
    # Σ_{i ≤ t} a_i W_dec_i[:, t − i] + b_dec_t
    pre = [xs[i] @ raw[f"W_enc_{i}"].T + raw[f"b_enc_{i}"] for i in range(3)]
    acts = [p * (p > raw[f"threshold_{i}"]) if threshold else p.relu() for i, p in enumerate(pre)]
    assert 0 < sum(int((a > 0).sum()) for a in acts) < 3 * 7 * 24
    for t, out in enumerate(clt(xs)):
        want = sum(acts[i] @ raw[f"W_dec_{i}"][:, t - i] for i in range(t + 1)) + raw[f"b_dec_{t}"]
        torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    (folder / "config.yaml").unlink()  # to_safetensors writes no config: the hooks are assumed
    for p, q in zip(clt(xs), CrossLayerTranscoder.load(folder)(xs)):
        assert torch.equal(p, q)


def test_a_foreign_clt_folder_is_checked_for_hooks_shapes_and_values(tmp_path):
    from safetensors.torch import save_file

    def folder_with(name, **change):
        folder = tmp_path / name
        raw = _circuit_tracer_folder(folder)
        for key, value in change.items():
            i = key.rsplit("_", 1)[1]
            file = folder / f"W_{'dec' if key.startswith('W_dec') else 'enc'}_{i}.safetensors"
            dec = key.startswith("W_dec")
            tensors = {k: v for k, v in raw.items() if k.endswith(f"_{i}") and k.startswith("W_dec") == dec}
            save_file(tensors | {key: value}, str(file))
        return folder

    resid = folder_with("resid")
    (resid / "config.yaml").write_text(
        "model_kind: cross_layer_transcoder\nfeature_input_hook: hook_resid_mid\nfeature_output_hook: hook_mlp_out\n"
    )
    with pytest.raises(FileFormatError, match="hook_resid_mid"):
        CrossLayerTranscoder.load(resid)
    with pytest.raises(FileFormatError, match="shape"):
        CrossLayerTranscoder.load(folder_with("shape", W_dec_1=torch.zeros(24, 3, 32)))
    with pytest.raises(ValueError, match="non-finite"):
        CrossLayerTranscoder.load(folder_with("nan", b_enc_2=torch.full((24,), float("nan"))))
    with pytest.raises(FileFormatError, match="negative threshold"):
        CrossLayerTranscoder.load(folder_with("negative", threshold_0=torch.full((24,), -0.1)))
    with pytest.raises(FileFormatError, match="holds"):
        CrossLayerTranscoder.load(folder_with("extra", W_skip_1=torch.zeros(32, 32)))
