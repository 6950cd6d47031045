"""Attribution graphs: the replacement model reproduces the model and is linear in its sources; the
graph's edges sum to each target's value and equal interventions on the replacement model; transcoders
train, save and load; pruning keeps what carries the logits and the graph round-trips through JSON."""

from __future__ import annotations

import re

import pytest
import torch

from gpt2_interp.graphs.attribution import AttributionConfig, AttributionGraph, attribute
from gpt2_interp.graphs.prune import graph_scores, influence, normalise_rows, prune_graph
from gpt2_interp.graphs.replacement import ReplacementModel
from gpt2_interp.graphs.transcoder import (
    TranscoderSet,
    TranscoderTrainConfig,
    evaluate_transcoders,
    new_transcoders,
    train_transcoders,
)
from gpt2_interp.io.integrity import IntegrityError
from gpt2_interp.model import HookedGPT2, llama_config
from tests.unit.transcoder_cases import facts_with_transcoders, random_transcoders


@pytest.fixture(scope="module")
def facts():
    return facts_with_transcoders()


@pytest.fixture(scope="module")
def llama():
    cfg = llama_config(n_layer=2, d_model=32, n_head=4, n_kv_heads=2, d_mlp=48, n_ctx=16, d_vocab=64)
    model = HookedGPT2(cfg, seed=0).eval()
    return model, random_transcoders(model), torch.tensor([1, 5, 9, 33, 7, 2])


@pytest.fixture(scope="module")
def facts_graph(facts):
    model, ts, tokens = facts
    return attribute(model, ts, tokens, AttributionConfig(batch_size=48, max_n_logits=3, desired_logit_prob=0.9999))


def _zero_sources(rm: ReplacementModel, first: int = 1) -> dict:
    """Every source set to zero: token embeddings, and features and errors from position ``first`` on (those
    at earlier positions are not sources: they stay, part of the constant)."""

    def zero_from(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[:first], torch.zeros_like(x[first:])])

    return dict(
        activations=[zero_from(a) for a in rm.activations],
        errors=[zero_from(e) for e in rm.errors],
        embed=torch.zeros_like(rm.embed),
    )


@pytest.mark.parametrize("which", ["facts", "llama"])
def test_replacement_model_with_errors_gives_the_models_logits(which, request):
    model, ts, tokens = request.getfixturevalue(which)
    rm = ReplacementModel(model, ts, tokens)
    with torch.no_grad():
        clean = model(tokens[None])[0]
        run = rm.run(batch=2, grad=False)
    assert (run.logits[0] - clean).abs().max() <= 1e-4
    assert (run.logits[1] - clean).abs().max() <= 1e-4
    # the error terms carry what the (untrained) transcoders miss: without them the logits move
    with torch.no_grad():
        no_err = rm.run(grad=False, errors=[torch.zeros_like(e) for e in rm.errors])
    assert (no_err.logits[0] - clean).abs().max() > 1e-2


@pytest.mark.parametrize("which", ["facts", "llama"])
def test_replacement_model_is_affine_in_one_features_activation(which, request):
    model, ts, tokens = request.getfixturevalue(which)
    rm = ReplacementModel(model, ts, tokens)
    pos, f = 1, int(rm.activations[0][1].nonzero()[0, 0])  # an active layer-0 feature at position 1

    def scaled(c: float) -> list[torch.Tensor]:
        acts = [a.clone() for a in rm.activations]
        acts[0][pos, f] *= c
        return acts

    with torch.no_grad():
        outs = [rm.run(grad=False, activations=scaled(c)) for c in (1.0, 2.0, 3.0)]
    pre = [o.pre_acts(ts)[-1][0] for o in outs]
    logits = [o.logits[0] for o in outs]
    for x in (pre, logits):
        step = x[1] - x[0]
        assert step.abs().max() > 1e-4  # the feature reaches this quantity
        torch.testing.assert_close(x[2] - x[1], step, atol=2e-5, rtol=1e-4)  # equal steps: affine
    # nothing upstream of the write moves (the residual before its layer's MLP output)
    torch.testing.assert_close(outs[1].mlp_inputs[0], outs[0].mlp_inputs[0])


@pytest.mark.parametrize("which", ["facts", "llama", "llama-first-position"])
def test_feature_and_logit_edges_sum_to_their_values(which, request):
    model, ts, tokens = request.getfixturevalue(which.split("-")[0])
    first = 0 if which.endswith("first-position") else 1
    cfg = AttributionConfig(batch_size=16, max_n_logits=4, desired_logit_prob=0.9999, first_position_features=not first)
    graph = request.getfixturevalue("facts_graph") if which == "facts" else attribute(model, ts, tokens, cfg)
    assert (graph.features[:, 1] >= first).all() and (graph.features[:, 1] == 0).any() == (first == 0)
    rm = ReplacementModel(model, ts, tokens)
    with torch.no_grad():
        run, zero = rm.run(grad=False), rm.run(grad=False, **_zero_sources(rm, first))
    pre, bias = run.pre_acts(ts), zero.pre_acts(ts)
    value = torch.stack([pre[L][0, p, f] for L, p, f in graph.features.tolist()])
    const = torch.stack([bias[L][0, p, f] for L, p, f in graph.features.tolist()])
    total = graph.adjacency[: graph.n_features].sum(1) + const
    assert ((total - value).abs() / value.abs().clamp_min(1e-2)).max() <= 1e-4
    # each feature's value is its clean pre-activation (the replacement model reads what the model reads)
    clean_pre = torch.stack([ts[L].pre_acts(rm.mlp_inputs[L])[p, f] for L, p, f in graph.features.tolist()])
    torch.testing.assert_close(value, clean_pre, atol=1e-4, rtol=1e-4)
    demean = run.logits[0, -1] - run.logits[0, -1].mean()
    demean0 = zero.logits[0, -1] - zero.logits[0, -1].mean()
    for i, tok in enumerate(graph.logit_tokens.tolist()):
        got = graph.adjacency[graph.logit_index(i)].sum() + demean0[tok]
        assert abs(float(got - demean[tok])) <= 1e-4 * max(1.0, abs(float(demean[tok])))


def test_an_edge_is_the_effect_of_an_intervention_on_its_source(facts, facts_graph):
    model, ts, tokens = facts
    g = facts_graph
    rm = ReplacementModel(model, ts, tokens)
    rows = g.adjacency[: g.n_features, : g.n_features]
    checked = 0
    for t, s in (divmod(i, g.n_features) for i in rows.abs().flatten().topk(5).indices.tolist()):
        (Ls, ps, fs), (Lt, pt, ft) = g.features[s].tolist(), g.features[t].tolist()
        acts = [a.clone() for a in rm.activations]
        acts[Ls][ps, fs] *= 2  # adds the source's activation once more
        with torch.no_grad():
            before = rm.run(grad=False).pre_acts(ts)[Lt][0, pt, ft]
            after = rm.run(grad=False, activations=acts).pre_acts(ts)[Lt][0, pt, ft]
        torch.testing.assert_close(after - before, g.adjacency[t, s], atol=1e-5, rtol=1e-4)
        checked += 1
    assert checked == 5
    # a source cannot reach a target in its own or an earlier layer
    layers = g.features[:, 0]
    assert (rows[layers[:, None] <= layers[None, :]] == 0).all()


def test_token_and_error_edges_match_interventions(facts, facts_graph):
    model, ts, tokens = facts
    g = facts_graph
    rm = ReplacementModel(model, ts, tokens)
    t = g.logit_index(0)
    tok = int(g.logit_tokens[0])

    def demeaned(run) -> torch.Tensor:
        return run.logits[0, -1, tok] - run.logits[0, -1].mean()

    with torch.no_grad():
        base = demeaned(rm.run(grad=False))
        emb = rm.embed.clone()
        emb[2] = 0
        no_tok = demeaned(rm.run(grad=False, embed=emb))
        errs = [e.clone() for e in rm.errors]
        errs[3][-1] = 0
        no_err = demeaned(rm.run(grad=False, errors=errs))
    torch.testing.assert_close(base - no_tok, g.adjacency[t, g.token_index(2)], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(base - no_err, g.adjacency[t, g.error_index(3, len(tokens) - 1)], atol=1e-4, rtol=1e-4)


def test_influence_is_the_matrix_power_series():
    # a chain logit <- b <- a with a side edge logit <- a: Â rows normalised by hand
    A = torch.tensor([[0.0, 0, 0], [2.0, 0, 0], [-1.0, 3.0, 0]])  # nodes a, b, logit; row = target
    w = torch.tensor([0.0, 0.0, 1.0])
    a = normalise_rows(A)
    torch.testing.assert_close(a[2], torch.tensor([0.25, 0.75, 0.0]))
    # I = wÂ + wÂ² = (0.25, 0.75, 0) + (0.75, 0, 0)
    torch.testing.assert_close(influence(a, w), torch.tensor([1.0, 0.75, 0.0]))
    exact = w @ (torch.linalg.inv(torch.eye(3) - a) - torch.eye(3))
    torch.testing.assert_close(influence(a, w), exact)


def test_pruning_keeps_the_influential_part_and_saves_to_json(facts_graph, tmp_path):
    g = facts_graph
    full_replacement, full_completeness = graph_scores(g)
    # untrained transcoders: errors carry most of the influence (features ~7 %), so keep 99 % of it
    pruned = prune_graph(g, node_threshold=0.99)
    assert pruned.node_mask is not None and pruned.edge_mask is not None
    kept = int(pruned.node_mask[: g.n_features].sum())
    assert 0 < kept < g.n_features
    assert pruned.node_mask[g.logit_index(0) :].all()
    # kept edges join kept nodes only, and every kept feature has a kept edge in and out
    em, nm = pruned.edge_mask, pruned.node_mask
    assert not em[~nm].any() and not em[:, ~nm].any()
    feats = torch.arange(g.n_features)[nm[: g.n_features]]
    assert em[feats].any(1).all() and em[:, feats].any(0).all()
    # kept features and errors are among the most influential nodes that make up 99% of all nodes' influence
    inf = influence(normalise_rows(g.adjacency), torch.cat([torch.zeros(g.logit_index(0)), g.logit_probabilities]))
    order, total, top = inf.argsort(descending=True).tolist(), 0.0, set()
    for i in order:
        top.add(i)
        total += float(inf[i])
        if total >= 0.99 * float(inf.sum()):
            break
    assert set(nm[: g.token_index(0)].nonzero().flatten().tolist()) <= top
    for score in (pruned.replacement_score, pruned.completeness_score, full_replacement, full_completeness):
        assert score is not None and 0.0 <= score <= 1.0
    path = pruned.save(tmp_path / "graph.json")
    back = AttributionGraph.load(path)
    for name in ("tokens", "features", "activations", "logit_tokens", "logit_probabilities", "adjacency"):
        assert torch.equal(getattr(back, name), getattr(pruned, name)), name
    assert torch.equal(back.node_mask, pruned.node_mask) and torch.equal(back.edge_mask, pruned.edge_mask)
    assert back.replacement_score == pruned.replacement_score and back.n_layers == pruned.n_layers
    text = path.read_text().replace('"n_layers": 6', '"n_layers": 5')
    path.write_text(text)
    with pytest.raises(IntegrityError):
        AttributionGraph.load(path)


def test_transcoders_train_on_all_layers_and_load_back_checked(facts, tmp_path):
    model = facts[0]
    docs = [f"The capital of {c} is a city." for c in ("France", "Spain", "Italy", "Japan", "Peru", "Chile")] * 6
    ids = torch.cat([model.to_tokens(d)[0] for d in docs])
    windows = ids[: len(ids) // 16 * 16].view(-1, 16)
    cfg = TranscoderTrainConfig(
        d_sae=96, k=8, skip=True, tokens=64 * 15, batch_size=64, buffer_tokens=512, forward_batch=8, lr=8e-3, epochs=4
    )
    before = evaluate_transcoders(model, new_transcoders(model, cfg), windows)
    ts = train_transcoders(model, cfg, windows)
    after = evaluate_transcoders(model, ts, windows)
    assert len(after.variance_explained) == model.cfg.n_layer
    assert all(b < 0 for b in before.variance_explained)  # random dictionaries explain nothing
    assert all(a > 0.3 for a in after.variance_explained)  # every layer learned its MLP (on the windows it read)
    assert all(0 < l0 <= 8 for l0 in after.l0) and all(0 <= d <= 1 for d in after.dead)
    with torch.no_grad():  # the whole set: the clean loss as the model computes it, the error terms restoring it
        clean = float(model.loss(model(windows), windows))
    assert after.clean_loss == pytest.approx(clean, abs=1e-5) and before.clean_loss == after.clean_loss
    assert abs(after.replaced_with_errors_loss - clean) < 1e-4 and abs(before.replaced_with_errors_loss - clean) < 1e-4
    # trained dictionaries move the loss less than random ones (on these odd windows either way)
    assert abs(after.replaced_loss - clean) < abs(before.replaced_loss - clean)
    folder = ts.save(tmp_path / "tc")
    assert sorted(p.name for p in folder.iterdir()) == ["config.yaml"] + [f"layer_{i}.safetensors" for i in range(6)]
    back = TranscoderSet.load(folder, model)
    x = torch.randn(3, model.cfg.d_model)
    for a, b in zip(ts, back):
        assert torch.equal(a(x), b(x))
    other = HookedGPT2(model.cfg, seed=3)
    with pytest.raises(ValueError, match="weights"):
        TranscoderSet.load(folder, other)
    raw = (folder / "layer_2.safetensors").read_bytes()
    (folder / "layer_2.safetensors").write_bytes(raw[:-8] + bytes(8))
    with pytest.raises(IntegrityError):
        TranscoderSet.load(folder)


@pytest.mark.parametrize("architecture", ["relu", "batchtopk", "topk"])
def test_transcoder_files_hold_circuit_tracers_tensors(llama, tmp_path, architecture):
    import json

    from safetensors.torch import load_file

    model = llama[0]
    cfg = TranscoderTrainConfig(d_sae=24, k=None if architecture == "relu" else 4, architecture=architecture, skip=True)
    ts = new_transcoders(model, cfg)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for t in ts:
            t.b_enc.copy_(torch.randn(t.b_enc.shape, generator=g))
            t.b_dec.copy_(torch.randn(t.b_dec.shape, generator=g))
            t.W_skip.copy_(0.1 * torch.randn(t.W_skip.shape, generator=g))
            if t.threshold is not None:
                t.threshold.copy_(torch.rand(t.threshold.shape, generator=g) - 0.3)  # some below zero
    folder = ts.save(tmp_path / "tc")
    config = json.loads((folder / "config.yaml").read_text())
    assert config["feature_input_hook"] == "ln2.hook_normalized" and config["feature_output_hook"] == "hook_mlp_out"
    # circuit-tracer's loader knows ReLU and JumpReLU only: a TopK set names a kind it refuses
    assert config["model_kind"] == ("topk_transcoder_set" if architecture == "topk" else "transcoder_set")
    x = torch.randn(7, model.cfg.d_model, generator=g)
    for t in ts:
        f = load_file(folder / f"layer_{t.layer}.safetensors")
        # circuit-tracer's SingleLayerTranscoder: pre = F.linear(x, W_enc, b_enc), JumpReLU x·[x > θ] or ReLU,
        # out = a W_dec + b_dec + x W_skipᵀ
        pre = torch.nn.functional.linear(x, f["W_enc"], f["b_enc"])
        if architecture == "batchtopk":
            a = pre * (pre > f["activation_function.threshold"])
        else:
            a = pre.relu()
        expected = a @ f["W_dec"] + f["b_dec"] + x @ f["W_skip"].T
        torch.testing.assert_close(pre, t.pre_acts(x), atol=1e-5, rtol=1e-5)
        if architecture != "topk":
            torch.testing.assert_close(expected, t(x), atol=1e-5, rtol=1e-5)
    back = TranscoderSet.load(folder, model)
    for a, b in zip(ts, back):
        assert torch.equal(a(x), b(x))


def test_transcoder_folders_of_the_first_layout_still_load(llama, tmp_path):
    import json

    from gpt2_interp.io.files import write_json
    from gpt2_interp.io.integrity import save_checked

    model = llama[0]
    ts = new_transcoders(model, TranscoderTrainConfig(d_sae=24, k=4, architecture="batchtopk", skip=True, seed=4))
    with torch.no_grad():
        for t in ts:
            t.threshold.uniform_(0.0, 0.5)
    # the gpt2-interp-transcoders/1 layout: config.json, W_enc [d_model, d_tc], the threshold as "threshold"
    cfg = {
        "format": "gpt2-interp-transcoders/1",
        "n_layers": len(ts),
        "feature_input_hook": "ln2.hook_normalized",
        "feature_output_hook": "hook_mlp_out",
        "layers": [t.cfg.__dict__ | {"target_hook": t.target_hook, "skip": True} for t in ts],
    }
    cfg = json.loads(json.dumps(cfg))
    for t in ts:
        tensors = {"W_enc": t.W_enc, "W_dec": t.W_dec, "b_enc": t.b_enc, "b_dec": t.b_dec}
        tensors |= {"threshold": t.threshold, "W_skip": t.W_skip}
        meta = {"format": cfg["format"], "config": json.dumps(cfg, sort_keys=True)}
        save_checked(tmp_path / f"layer_{t.layer}.safetensors", {k: v.detach() for k, v in tensors.items()}, meta)
    write_json(tmp_path / "config.json", cfg)
    back = TranscoderSet.load(tmp_path, model)
    x = torch.randn(5, model.cfg.d_model)
    for a, b in zip(ts, back):
        assert torch.equal(a(x), b(x))


def test_bad_inputs_are_refused_naming_the_argument(llama):
    model, ts, tokens = llama
    with pytest.raises(ValueError, match=r"tokens must be one prompt's token ids \[pos\], got shape \(1, 6\)"):
        ReplacementModel(model, ts, tokens[None])
    with pytest.raises(ValueError, match="desired_logit_prob"):
        AttributionConfig(desired_logit_prob=0.0)
    with pytest.raises(ValueError, match="transcoders must cover layers 0, 1"):
        TranscoderSet([ts[1]])
    other = HookedGPT2(llama_config(n_layer=3, d_model=32, n_head=4, n_kv_heads=2, d_mlp=48, n_ctx=16, d_vocab=64))
    with pytest.raises(ValueError, match="2 layers for a model of n_layer=3"):
        ReplacementModel(other, ts, tokens)


def test_transcoder_training_resumes_from_its_checkpoint_as_if_never_stopped(llama, tmp_path, monkeypatch):
    from gpt2_interp.analysis.features.sae_train import SAETrainer

    model = llama[0]
    windows = torch.randint(0, 64, (24, 8), generator=torch.Generator().manual_seed(0))
    cfg = TranscoderTrainConfig(
        d_sae=32,
        k=4,
        skip=True,
        tokens=32 * 12,
        batch_size=32,
        buffer_tokens=64,
        forward_batch=4,
        checkpoint_every=3,
        epochs=3,
    )
    whole = train_transcoders(model, cfg, windows)
    real_step, calls = SAETrainer.step, {"n": 0}

    def failing_step(self, x, target=None):
        calls["n"] += 1
        if calls["n"] > 13:  # 2 layers × 2 batches a store: stops inside the 4th store, after the checkpoint at step 4
            raise RuntimeError("stopped")
        return real_step(self, x, target)

    monkeypatch.setattr(SAETrainer, "step", failing_step)
    with pytest.raises(RuntimeError, match="stopped"):
        train_transcoders(model, cfg, windows, checkpoint=tmp_path)
    resumed_calls = {"n": 0}

    def counted_step(self, x, target=None):
        resumed_calls["n"] += 1
        return real_step(self, x, target)

    monkeypatch.setattr(SAETrainer, "step", counted_step)
    resumed = train_transcoders(model, cfg, windows, checkpoint=tmp_path)
    assert resumed_calls["n"] == 2 * (12 - 4)  # only the steps after the checkpoint ran again, in both layers
    for a, b in zip(whole, resumed):
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            assert torch.equal(p, q), name
    with pytest.raises(ValueError, match="other settings"):
        train_transcoders(model, TranscoderTrainConfig(**{**cfg.__dict__, "seed": 5}), windows, checkpoint=tmp_path)


def test_batching_targets_does_not_change_the_graph(llama):
    model, ts, tokens = llama
    cfg = AttributionConfig(max_n_logits=4, desired_logit_prob=0.9999, first_position_features=True)
    one = attribute(model, ts, tokens, AttributionConfig(**{**cfg.__dict__, "batch_size": 1000}))
    sevens = attribute(model, ts, tokens, AttributionConfig(**{**cfg.__dict__, "batch_size": 7}))
    assert one.n_features > 7 and len(one.logit_tokens) > 1  # chunks mix layers, and features with logits
    torch.testing.assert_close(sevens.adjacency, one.adjacency, atol=1e-6, rtol=1e-5)


def test_transcoder_training_settings_it_would_not_apply_are_refused():
    with pytest.raises(ValueError, match="hook_name is each layer's MLP input"):
        TranscoderTrainConfig(hook_name="blocks.0.hook_resid_post")
    with pytest.raises(ValueError, match=r"outlier_ratio=3\.0 is not applied"):
        TranscoderTrainConfig(outlier_ratio=3.0)


def test_transcoder_training_reports_its_forward_passes_and_the_layers_fvu(llama, capsys, monkeypatch):
    import gpt2_interp.graphs.transcoder as transcoder
    from gpt2_interp.analysis.features.sae_train import SAETrainer
    from gpt2_interp.core import progress

    monkeypatch.setattr(progress, "_live", lambda: False)  # plain lines, as in a log file
    model = llama[0]
    windows = torch.randint(0, 64, (24, 8), generator=torch.Generator().manual_seed(0))
    cfg = TranscoderTrainConfig(
        d_sae=32, k=4, tokens=32 * 12, batch_size=32, buffer_tokens=64, forward_batch=4, epochs=3
    )
    passes, last_fvu = {"n": 0}, {}
    real_cache, real_step = transcoder._cache_layers, SAETrainer.step

    def counted(*args):
        passes["n"] += 1
        return real_cache(*args)

    def step(self, x, target=None):
        out = real_step(self, x, target)
        last_fvu[id(self)] = float(out[0])
        return out

    monkeypatch.setattr(transcoder, "_cache_layers", counted)
    monkeypatch.setattr(SAETrainer, "step", step)
    train_transcoders(model, cfg, windows)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == f"transcoders (forward passes): 0/{passes['n']} passes, started", lines
    done = re.fullmatch(
        rf"transcoders \(forward passes\): {passes['n']}/{passes['n']} passes, done in \d+s "
        r"\(fvu=([\d.]+), step=12/12, worst=([\d.]+)\)",
        lines[-1],
    )
    assert done, lines[-1]
    fvus = list(last_fvu.values())  # each layer's trainer's FVU at its last step
    assert len(fvus) == model.cfg.n_layer
    assert abs(float(done[1]) - sum(fvus) / len(fvus)) < 1e-3 and abs(float(done[2]) - max(fvus)) < 1e-3
