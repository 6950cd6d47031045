"""Interactive views without a browser: the page's data are the result's (attention equals hook_pattern bit for
bit), plotly.js is inside each page once, saved results view the same as live ones, ``gpt2-interp view``."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest
import torch

pytest.importorskip("plotly", reason="the views need Plotly: pip install gpt2-interp[views]")

from gpt2_interp.analysis.tracing import TraceResult, TraceSet
from gpt2_interp.cli import main
from gpt2_interp.model import HookedGPT2, llama_config
from gpt2_interp.views import (
    View,
    attention_patterns,
    html_page,
    kind_of,
    load_result,
    markdown_html,
    view,
    view_attention,
)
from gpt2_interp.views import page as page_module

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def gqa_model():
    """9 query heads sharing 3 key/value heads (SmolLM2's shape, tiny)."""
    cfg = llama_config(n_layer=4, d_model=72, n_head=9, n_kv_heads=3, d_mlp=96, n_ctx=64, d_vocab=50257)
    return HookedGPT2(cfg, seed=0).eval()


def _page_data(html: str) -> dict:
    """The attention widget's data object, read back out of the page text."""
    m = re.search(r"var D = (\{.*?\});\n", html)
    assert m, "the attention page carries its data object"
    return json.loads(m.group(1))


def test_attention_patterns_equal_the_models_hook_pattern(gqa_model):
    r = attention_patterns(gqa_model, PROMPT, layers=[1, 3])
    # the independent read: a forward hook on the same hook points records what passes through them (the same
    # points, because a layer whose pattern nobody reads runs the fused kernel, a few ulps from the explicit one)
    seen = {}
    hooks = [(f"blocks.{l}.attn.hook_pattern", lambda x, hook: seen.setdefault(hook.name, x.clone())) for l in (1, 3)]
    gqa_model.run_with_hooks(PROMPT, fwd_hooks=hooks)
    assert r.pattern.shape == (2, 9, 6, 6) and r.str_tokens[1:] == ["The", " capital", " of", " France", " is"]
    for i, l in enumerate([1, 3]):
        assert torch.equal(r.pattern[i], seen[f"blocks.{l}.attn.hook_pattern"][0])
    assert r.n_kv_heads == 3 and [r.kv_group(h) for h in (0, 2, 3, 8)] == [0, 0, 1, 2]


def test_attention_page_data_decode_to_hook_pattern_exactly(gqa_model):
    r = attention_patterns(gqa_model, PROMPT)
    d = _page_data(view_attention(r, layer=3).html())
    decoded = np.frombuffer(base64.b64decode(d["b64"]), dtype="<f4").reshape(d["shape"])
    assert d["shape"] == [4, 9, 6, 6] and d["first"] == 3 and d["kv"] == 3
    assert np.array_equal(decoded, r.pattern.numpy())  # bit for bit, not rounded
    assert d["tokens"] == r.str_tokens


def test_a_page_embeds_plotly_js_once_and_loads_nothing_from_the_network(facts_model):
    from gpt2_interp.analysis.lens import logit_lens

    lens = logit_lens(facts_model, [PROMPT], targets=[" Paris"], positions="all")
    html = html_page([view(lens), "<p>between</p>", view(attention_patterns(facts_model, PROMPT))], "two views")
    lib = page_module.plotly_js()
    assert html.count(lib[:200]) == 1 and len(html) > len(lib)
    assert not re.search(r"<script[^>]+src=", html) and "<link" not in html  # every script is inside the page


def test_notebook_display_sends_the_library_with_the_first_view_only(facts_model, monkeypatch):
    monkeypatch.setattr(page_module, "_notebook_loaded", False)
    v = view_attention(attention_patterns(facts_model, PROMPT))
    lib = page_module.plotly_js()[:200]
    first, second = v._repr_html_(), v._repr_html_()
    assert lib in first and lib not in second and "Plotly.react" in second


def _trace(kind: str, scores: torch.Tensor) -> TraceResult:
    """A hand-made trace: 4 tokens (the subject "Mun ich"), 3 layers."""
    return TraceResult(
        prompt="Munich is in",
        subject="Munich",
        kind=kind,
        tokens=["Mun", "ich", " is", " in"],
        subject_range=(0, 2),
        layer_labels=["L0", "L1", "L2"],
        target=" Germany",
        target_id=4486,
        scores=scores,
        indirect_effect=scores - 0.125,
        clean_score=0.75,
        corrupted_score=0.125,
        noise_std=0.5,
        samples=2,
        window=1,
        seed=0,
    )


def test_saved_results_view_as_the_live_ones(tmp_path):
    grid = torch.arange(12, dtype=torch.float32).reshape(4, 3) / 16
    traces = TraceSet([_trace("hidden", grid), _trace("mlp", grid.flip(0))])
    path = tmp_path / "traces.json"
    traces.to_json(path)
    saved = load_result(path)
    assert kind_of(saved) == "trace set" and kind_of(traces.to_dict()) == "trace set"
    live, back = view(traces), view(saved)
    assert live.title == back.title == "Causal trace: 'Munich is in' → ' Germany'"
    # the hover carries the token, the layer, the restored probability, the effect and both baselines
    fig = json.loads(re.search(r"var s=(\{.*?\});Plotly", back.html()).group(1))
    cell = fig["data"][1]["customdata"][1][2]  # mlp panel, token 1 (' ich', subject), layer 2: (3 - 1) * 3 + 2 = 8
    assert cell == (
        "<b>1:ich*</b> · L2 (mlp)<br>p(␣Germany) restored = 0.5000<br>indirect effect = +0.3750"
        "<br>clean p = 0.7500 · corrupted p = 0.1250"
    )


def test_an_unknown_result_says_which_kinds_have_views():
    with pytest.raises(ValueError, match=r"no view for a result with fields \['a'\]; views exist for: attention"):
        view({"a": 1})
    with pytest.raises(TypeError, match="result must be Result or a dict"):
        view(3)


def test_cli_view_writes_the_page_of_a_saved_result(facts_model, tmp_path, capsys):
    from gpt2_interp.analysis.lens import logit_lens

    path = tmp_path / "lens.json"
    logit_lens(facts_model, [PROMPT], targets=[" Paris"]).to_json(path)
    assert main(["view", str(path), "-o", str(tmp_path / "lens.html")]) == 0
    html = (tmp_path / "lens.html").read_text()
    assert "logit lens: &#x27;The capital of France is&#x27;" in html and "Plotly.newPlot" in html
    assert main(["view", str(tmp_path / "missing.json")]) == 2
    assert "missing.json does not exist" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{not json")
    assert main(["view", str(tmp_path / "bad.json")]) == 2
    assert "bad.json is not JSON" in capsys.readouterr().err
    (tmp_path / "other.json").write_text('{"x": 1}')
    assert main(["view", str(tmp_path / "other.json")]) == 2
    err = capsys.readouterr().err
    assert "no view for a result with fields ['x']" in err and len(err.strip().splitlines()) == 1


def test_markdown_html_renders_the_report_markdown():
    html = markdown_html(["# Title", "", "| a | b |", "|---|---:|", "| `x` | **2** |", "", "- one", "![fig](f.png)"])
    assert html == (
        "<h1>Title</h1>\n"
        '<table class="g2v-table"><tr><th>a</th><th>b</th></tr><tr><td><code>x</code></td>'
        "<td><strong>2</strong></td></tr></table>\n<ul><li>one</li></ul>"
    )


def test_views_add_up_to_one_page():
    a, b = View("a", [page_module.text_part("first")]), View("b", [page_module.text_part("second")])
    html = (a + b).html()
    assert html.index('"g2v-note">first') < html.index('<h2 class="g2v-title">b</h2>') < html.index('"g2v-note">second')


def test_circuit_and_feature_results_find_their_views_and_saved_ones_view_the_same(tmp_path):
    from gpt2_interp.views.circuits import circuit_figure

    from .view_results import edge_scores_2x4x2, small_circuit, small_curve, small_feature

    c, scores = small_circuit(), edge_scores_2x4x2()
    kinds = [kind_of(r.to_dict()) for r in (c, scores, small_curve(), small_feature())]
    assert kinds == ["circuit", "edge scores", "faithfulness curve", "feature"]
    back = load_result(c.save(tmp_path / "c.json"))
    live, saved = circuit_figure(c.to_dict()), circuit_figure(back)
    assert live.to_plotly_json() == saved.to_plotly_json()
    drawn = [t.name[5:] for t in live.data if (t.name or "").startswith("edge:")]
    assert drawn == c.edges  # every edge of the circuit, largest |score| first
    exact = {"input->a0.h1<q>": 2.75}
    hover = list(next(t for t in circuit_figure(c.to_dict(), exact=exact).data if t.name == "edges").customdata)
    assert hover[0] == "<b>input->a0.h1<q></b><br>eap score +3<br>exact effect +2.75"
    assert hover[1].endswith("exact effect: not measured")
    # edge scores: the largest |score| edges; a sign shows as a dashed line
    fig = circuit_figure(scores.to_dict(), max_edges=3)
    lines = [t for t in fig.data if (t.name or "").startswith("edge:")]
    assert [t.name for t in lines] == ["edge:input->a0.h1<q>", "edge:input->a0.h1<k>", "edge:a1.h2->logits"]
    assert [t.line.dash for t in lines] == ["solid", "dash", "solid"]
    with pytest.raises(ValueError, match="one score per edge"):
        view({"edges": ["input->logits"], "scores": [1.0, 2.0], "method": "eap", "n_pairs": 1, "clean_metric": 0})


def test_feature_page_colours_each_token_by_its_activation_over_the_largest():
    from gpt2_interp.views import view_feature

    from .view_results import small_feature

    html = view(small_feature()).html()
    spans = re.findall(r'data-act="([^"]+)" style="background:rgba\(214,39,40,([0-9.]+)\)', html)
    acts = [a for c in small_feature().contexts for a in c["acts"]]
    assert [float(a) for a, _ in spans] == acts
    assert [float(alpha) for _, alpha in spans] == pytest.approx([a / 4.0 for a in acts], abs=5.1e-4)  # 3 decimals
    assert html.count("g2v-tok g2v-sel") == 3  # each context's firing token outlined
    with pytest.raises(ValueError, match="needs contexts"):
        view_feature({k: v for k, v in small_feature().to_dict().items() if k != "contexts"})


def test_steering_curve_view_draws_the_curve_and_names_the_best_scale_within_the_loss_budget(tmp_path):
    from gpt2_interp.analysis.features import SteeringCurve

    t = torch.tensor
    curve = SteeringCurve(
        model_name="m", at="blocks.1.hook_resid_post", method="mean difference at last token",
        scales=t([0.0, 1.0, 2.0, 4.0]), target=[" good"], target_prob=t([0.10, 0.20, 0.30, 0.50]),
        target_sem=t([0.01, 0.01, 0.02, 0.02]), shift_sem=t([0.0, 0.01, 0.01, 0.02]),
        loss=t([2.0, 2.02, 2.08, 2.5]), kl=t([0.0, 0.01, 0.05, 0.4]), baseline_prob=0.10, baseline_loss=2.0,
        direction_norm=1.0, n_prompts=4, n_unrelated=2, n_tokens=10,
    )  # fmt: skip
    assert kind_of(curve.to_dict()) == "steering curve"
    page = view(curve)
    # loss changes +0%, +1%, +4%, +25%: within 5% the steered scale with the highest P(target) is 2
    assert "best scale within a 5% loss rise is 2: P(target) 0.1000 → 0.3000 (loss +4.0%)" in page.html()
    curve.to_json(tmp_path / "curve.json")
    back = view(load_result(tmp_path / "curve.json"))
    data = [json.loads(m) for m in re.findall(r"var s=(\{.*?\});Plotly", back.html())]
    ys = [tr["y"] for tr in data[0]["data"]]
    np.testing.assert_allclose(ys[0], [0.10, 0.20, 0.30, 0.50], atol=1e-7)
    np.testing.assert_allclose(ys[1], [0.0, 0.01, 0.04, 0.25], atol=1e-6)
    np.testing.assert_allclose(ys[2], [0.0, 0.01, 0.05, 0.4], atol=1e-7)


def test_a_per_position_circuit_is_drawn_by_its_edges_with_scores_summed_over_positions(tmp_path):
    from gpt2_interp.analysis.circuits import Circuit
    from gpt2_interp.views.circuits import view_circuit

    graph_edges = 116  # the 2-layer, 4-head, 2-KV-head graph of the small results
    c = Circuit(
        ["input->a0.h1<q>", "a1.h2->logits", "input->a0.h1<q>", "input->logits"],
        [2.0, -1.5, 0.5, 0.25],
        "eap",
        "logit_diff",
        2,
        4,
        2,
        3 * graph_edges,
        positions=[1, 2, 2, 0],
        n_pos=3,
    )
    page = view_circuit(load_result(c.save(tmp_path / "c.json")))
    assert page.title == "Circuit (eap, per position): 4 of 348 (position, edge) items on 3 edges"
    from gpt2_interp.views.circuits import _collapsed

    d = _collapsed(c.to_dict())
    assert d["edges"] == ["input->a0.h1<q>", "a1.h2->logits", "input->logits"]
    assert d["scores"] == [2.5, -1.5, 0.25] and d["total_edges"] == graph_edges


def test_a_saved_graph_views_as_the_live_one_and_an_unpruned_one_draws_its_largest_edges(tmp_path):
    from dataclasses import replace

    from gpt2_interp.views.graphs import graph_page_data

    from .view_results import GRAPH_EDGES, small_graph

    g = small_graph()
    saved = load_result(g.save(tmp_path / "graph.json"))
    assert kind_of(saved) == "attribution_graph"
    del saved["result"]
    assert kind_of(saved) == "attribution_graph"  # known by its fields too
    live = graph_page_data(g)
    assert graph_page_data(saved) == live  # the JSON's {"dtype", "data"} tensors draw what the tensors draw
    assert view(saved).title == g.view().title == "Attribution graph: '<|endoftext|> a b' → ' x' (p = 0.750)"
    # the layout: each row's nodes left to right by position, rows top to bottom logits, L1, L0, tokens
    nodes = live["nodes"]
    for row in {n["y"] for n in nodes}:
        xs = sorted((n["x"], n["pos"]) for n in nodes if n["y"] == row)
        assert [p for _, p in xs] == sorted(p for _, p in xs) and len({x for x, _ in xs}) == len(xs)
    assert [sorted({n["y"] for n in nodes if n["kind"] == k}) for k in ("logit", "token")] == [[96], [96 + 3 * 62]]
    # unpruned: the 5 largest |weight| edges of the whole adjacency, their nodes, every token and logit
    data = graph_page_data(replace(g, node_mask=None, edge_mask=None), max_edges=5)
    top5 = sorted(GRAPH_EDGES, key=lambda e: -abs(e[2]))[:5]
    ids = [n["id"] for n in data["nodes"]]
    drawn = [(ids[s], ids[t], w) for s, t, w in data["edges"]]
    assert sorted(drawn) == sorted((s, t, pytest.approx(w)) for s, t, w in top5)
    ends = {i for s, t, _ in top5 for i in (s, t)} | {9, 10, 11, 12, 13}
    assert sorted(ids) == sorted(ends) and data["total_edges"] == len(GRAPH_EDGES)


def test_a_graph_dict_of_the_wrong_shape_is_refused_naming_the_field():
    from .view_results import small_graph

    d = small_graph().to_dict()
    d["adjacency"] = {"dtype": "float32", "data": [[0.0] * 13] * 13}
    with pytest.raises(ValueError, match=r"'adjacency' has shape \(13, 13\); .* make 14 nodes: \(14, 14\) expected"):
        view(d)
    del d["logit_tokens"]
    with pytest.raises(
        ValueError, match=r"an attribution graph view needs logit_tokens; the result has fields \['activations'"
    ):
        view(d)
    with pytest.raises(ValueError, match="highlight must be 'paths' or 'direct', got 'all'"):
        small_graph().view(highlight="all")
