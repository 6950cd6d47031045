"""The views in a real browser: headless Chromium (Debian's ``chromium`` and ``chromedriver``, installed by
scripts/setup.sh) driven by Selenium, one browser for the module. The pages open from files with no console
errors, hold the expected panels and cells, show values and tokens on hover, draw something (a screenshot is
not blank), and carry the model's ``hook_pattern`` values exactly. (The demo's ``index.html`` is opened by
tests/integration/test_demo.py, on the report its fixture writes.)"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from .browser import chromium, hover_cell, not_blank, open_page, skip_without_browser

skip_without_browser()

from selenium.webdriver.common.by import By  # noqa: E402

from gpt2_interp.model import HookedGPT2, llama_config  # noqa: E402
from gpt2_interp.views import AttentionPatterns, attention_patterns, view, view_attention  # noqa: E402
from gpt2_interp.views import page as page_module  # noqa: E402

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def gqa_patterns():
    """A 9-head model with 3 key/value heads (SmolLM2's shape, tiny) and its patterns on PROMPT."""
    cfg = llama_config(n_layer=4, d_model=72, n_head=9, n_kv_heads=3, d_mlp=96, n_ctx=64, d_vocab=50257)
    model = HookedGPT2(cfg, seed=0).eval()
    seen: dict[str, torch.Tensor] = {}
    hooks = [
        (f"blocks.{l}.attn.hook_pattern", lambda x, hook: seen.setdefault(hook.name, x.detach().clone()))
        for l in range(4)
    ]
    model.run_with_hooks(PROMPT, fwd_hooks=hooks)  # the reference: what passes through the hook points
    return attention_patterns(model, PROMPT), seen


def test_attention_page_shows_nine_heads_with_kv_groups_hook_pattern_exactly_and_the_token_view(
    browser, gqa_patterns, tmp_path
):
    result, seen = gqa_patterns
    path = view_attention(result, layer=3).save(tmp_path / "attention.html")
    assert open_page(browser, path) == []
    fig = browser.find_element(By.CSS_SELECTOR, ".g2v-attn .g2v-fig")
    titles = browser.execute_script("return arguments[0].layout.annotations.map(a => a.text)", fig)
    assert titles == [f"head {h} · KV group {h // 3}" for h in range(9)]  # 9 panels, GQA groups marked
    for layer in (3, 1):  # the first layer shown, then another chosen in the layer menu
        if layer != 3:
            browser.execute_script(
                "var s = arguments[0]; s.value = arguments[1]; s.onchange()",
                browser.find_element(By.CSS_SELECTOR, "select[aria-label=layer]"),
                layer,
            )
        z = browser.execute_script("return arguments[0].data.map(t => t.z)", fig)  # [head][dst][src], as drawn
        ref = seen[f"blocks.{layer}.attn.hook_pattern"][0].double().tolist()
        assert z == ref  # every value equal, bit for bit (float32 read as float64 on both sides)
    text = hover_cell(browser, fig, row=5, col=2, n_rows=6, n_cols=6, top_down=True)
    value = float(seen["blocks.1.attn.hook_pattern"][0, 0, 5, 2])
    assert "destination 5:␣is" in text and "source 2:␣capital" in text and f"{value:.4f}" in text, text
    assert not_blank(browser) > 10
    # the token view: head 4 of the layer shown (1), attention from the clicked token ' of' (position 3)
    browser.execute_script(
        "arguments[0].value = 4; arguments[0].onchange()",
        browser.find_element(By.CSS_SELECTOR, "select[aria-label=head]"),
    )
    browser.find_elements(By.CSS_SELECTOR, ".g2v-tok")[3].click()
    shades = browser.execute_script(
        "return Array.from(document.querySelectorAll('.g2v-tok')).map(s => s.style.background)"
    )
    expected = seen["blocks.1.attn.hook_pattern"][0, 4, 3]
    alphas = [float(s.rsplit(",", 1)[1].rstrip(")")) if s.startswith("rgba") else 1.0 for s in shades]
    assert np.allclose(alphas, expected.numpy(), atol=6e-3)  # as the browser keeps alpha (8 bits, 2-3 decimals)
    assert alphas[4:] == [0.0, 0.0]  # nothing after the destination
    assert "g2v-sel" in browser.find_elements(By.CSS_SELECTOR, ".g2v-tok")[3].get_attribute("class")


def _big_lens(n_layers: int = 30, n_pos: int = 64, k: int = 3) -> dict:
    """A lens result's dict of the size the issue names: 30 layer boundaries × 64 positions."""
    g = np.random.default_rng(0)
    probs = np.sort(g.random((n_layers, 1, n_pos, k)), axis=-1)[..., ::-1] / k
    toks = [f" t{i}" for i in range(n_pos)]
    return {
        "prompts": ["".join(toks)],
        "layers": [f"L{i}" for i in range(n_layers)],
        "str_tokens": [toks],
        "positions": [list(range(n_pos))],
        "valid": [[True] * n_pos],
        "top_ids": np.zeros((n_layers, 1, n_pos, k), dtype=int).tolist(),
        "top_tokens": [[[[f" w{l}_{j}_{r}" for r in range(k)] for j in range(n_pos)]] for l in range(n_layers)],
        "top_probs": probs.tolist(),
        "targets": [" t0"],
        "target_prob": probs[..., 0].tolist(),
        "target_rank": np.ones((n_layers, 1, n_pos), dtype=int).tolist(),
        "lens": "logit lens",
    }


def _views_ms(driver) -> float:
    return driver.execute_script(
        "performance.measure('g2v', 'g2v-views-start', 'g2v-views-end');"
        "return performance.getEntriesByName('g2v')[0].duration"
    )


@pytest.mark.slow  # two pages of 5 and 11 MB
def test_a_30_layer_by_64_position_map_and_a_30_by_9_attention_grid(browser, tmp_path, record_property):
    lens = view(_big_lens())
    path = lens.save(tmp_path / "lens.html")
    assert open_page(browser, path) == []
    fig = browser.find_element(By.CSS_SELECTOR, ".g2v-fig")
    shape = browser.execute_script("var z = arguments[0].data[0].z; return [z.length, z[0].length]", fig)
    assert shape == [30, 64]  # 30 × 64 heatmap cells
    lens_ms = _views_ms(browser)
    text = hover_cell(browser, fig, row=29, col=63, n_rows=30, n_cols=64, top_down=False)
    assert "L29" in text and "63:␣t63" in text and "␣w29_63_0" in text and "rank 1" in text, text
    g = torch.Generator().manual_seed(0)
    pattern = torch.rand(30, 9, 64, 64, generator=g).tril()
    pattern = pattern / pattern.sum(-1, keepdim=True)
    att = AttentionPatterns("x" * 64, [f" t{i}" for i in range(64)], list(range(30)), pattern, n_kv_heads=3)
    assert open_page(browser, view_attention(att).save(tmp_path / "attn.html")) == []
    n_panels = browser.execute_script("return document.querySelector('.g2v-attn .g2v-fig').data.length")
    attn_ms = _views_ms(browser)
    assert n_panels == 9
    record_property("lens_30x64_ms", lens_ms)  # measured, reported in docs/guide/views.md; not asserted (load)
    record_property("attention_30x9x64_ms", attn_ms)
    print(f"\nviews drawn in {lens_ms:.0f} ms (lens 30 × 64), {attn_ms:.0f} ms (attention 30 × 9 × 64²)")


def test_two_notebook_outputs_share_one_plotly_and_both_draw(browser, gqa_patterns, tmp_path, monkeypatch):
    monkeypatch.setattr(page_module, "_notebook_loaded", False)
    result, _ = gqa_patterns
    cells = [view_attention(result)._repr_html_(), view_attention(result, layer=2)._repr_html_()]
    path = tmp_path / "notebook.html"
    path.write_text(
        "<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>" + "".join(cells) + "</body></html>"
    )
    assert open_page(browser, path) == []
    counts = browser.execute_script(
        "return Array.from(document.querySelectorAll('.g2v-attn .g2v-fig')).map(g => g.data.length)"
    )
    assert counts == [9, 9]
    # a later output alone (the first one's cleared): the view says how to reload plotly.js, and nothing fails
    path.write_text("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>" + cells[1] + "</body></html>")
    assert open_page(browser, path) == []
    assert "reset_notebook()" in browser.find_element(By.CSS_SELECTOR, ".g2v-view").text


def _hover_point(driver, fig, trace_name: str, point: int) -> str:
    """Plotly's hover label for point ``point`` of the trace named ``trace_name`` (Plotly.Fx.hover, as a mouse does;
    Plotly ignores a hover within 50 ms of the last)."""
    time.sleep(0.1)
    return driver.execute_script(
        "var gd = arguments[0], i = gd.data.findIndex(t => t.name === arguments[1]);"
        "Plotly.Fx.hover(gd, [{curveNumber: i, pointNumber: arguments[2]}]);"
        "var h = gd.querySelector('.hoverlayer'); return h && h.textContent",
        fig,
        trace_name,
        point,
    )


def test_circuit_page_draws_every_edge_and_node_with_scores_and_exact_effects_on_hover(browser, tmp_path):
    from .view_results import small_circuit, small_curve

    c = small_circuit()
    page = view(c, exact={"input->a0.h1<q>": 2.75}) + view(small_curve())
    assert open_page(browser, page.save(tmp_path / "circuit.html")) == []
    graph, curve = browser.find_elements(By.CSS_SELECTOR, ".g2v-fig")
    names = browser.execute_script("return arguments[0].data.map(t => t.name)", graph)
    assert [n[5:] for n in names if n.startswith("edge:")] == c.edges  # one line per edge, as drawn
    nodes = browser.execute_script("return arguments[0].data.find(t => t.name === 'nodes').text", graph)
    assert sorted(nodes) == sorted(c.nodes())  # the circuit's own node list (input and logits among them)
    ports = browser.execute_script("return arguments[0].data.find(t => t.name === 'ports').text", graph)
    assert sorted(ports) == ["q", "q", "v"]  # a0.h1 and a1.h3 queries, KV head 1's value input of layer 1
    text = _hover_point(browser, graph, "edges", 0)
    assert "input->a0.h1<q>" in text and "eap score +3" in text and "exact effect +2.75" in text, text
    assert "a1.h2->logits" in _hover_point(browser, graph, "edges", 1)
    methods = browser.execute_script("return arguments[0].data.map(t => [t.name, t.x.length])", curve)
    assert methods == [["eap", 3], ["eap-ig", 3]]  # the size that kept no edge is left off the log axis
    assert "eap-ig: top 40 edges, 37 kept" in _hover_point(browser, curve, "eap-ig", 1)
    assert not_blank(browser) > 10


def test_feature_page_colours_tokens_by_activation_as_the_data_say(browser, tmp_path):
    from .view_results import small_feature

    f = small_feature()
    assert open_page(browser, view(f).save(tmp_path / "feature.html")) == []
    shades = browser.execute_script(
        "return Array.from(document.querySelectorAll('.g2v-context .g2v-tok')).map(s => s.style.background)"
    )
    alphas = [float(s.rsplit(",", 1)[1].rstrip(")")) if s.count(",") == 3 else 1.0 for s in shades]
    acts = [a for c in f.contexts for a in c["acts"]]
    assert np.allclose(alphas, np.array(acts) / max(acts), atol=6e-3)  # as the browser keeps alpha (8 bits)
    figs = browser.find_elements(By.CSS_SELECTOR, ".g2v-fig")
    bars = browser.execute_script("return arguments[0].data.map(t => t.x)", figs[0])
    assert bars == [[v for _, v in f.promoted], [v for _, v in f.suppressed]]
    counts = browser.execute_script("return Array.from(arguments[0].data[0].y)", figs[1])
    assert counts == f.histogram["counts"]
    assert not_blank(browser) > 10


def _closure(kept: np.ndarray) -> np.ndarray:
    """``R[t, s]``: a path of kept edges leads from ``s`` to ``t`` (``kept[t, s]``: the edge ``s → t``)."""
    r = kept.copy()
    while True:
        nxt = r | ((r.astype(int) @ r.astype(int)) > 0)
        if (nxt == r).all():
            return r
        r = nxt


def test_graph_page_draws_each_node_and_edge_shows_a_feature_on_hover_and_pins_its_paths(browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains

    from .view_results import small_graph

    g = small_graph()
    assert open_page(browser, g.view().save(tmp_path / "graph.html")) == []
    nodes = browser.execute_script(
        "return Array.from(document.querySelectorAll('.g2v-gnode')).map(n => [+n.dataset.node, n.dataset.kind])"
    )
    kinds = ["feature"] * 3 + ["error"] * 6 + ["token"] * 3 + ["logit"] * 2
    assert sorted(nodes) == sorted([i, kinds[i]] for i in g.node_mask.nonzero()[:, 0].tolist())  # one per kept node
    edges = browser.execute_script(
        "return Array.from(document.querySelectorAll('.g2v-gedge'))"
        ".map(e => [+e.dataset.s, +e.dataset.t, +e.dataset.w])"
    )
    kept = g.edge_mask.numpy()
    assert sorted(edges) == sorted([s, t, float(g.adjacency[t, s])] for t, s in zip(*np.nonzero(kept)))
    assert len(edges) == 11  # GRAPH_EDGES but the pruned one
    y = {i: browser.execute_script(
        "return document.querySelector('.g2v-gnode[data-node=\"' + arguments[0] + '\"]').getBoundingClientRect().top", i
    ) for i in (9, 0, 2, 12)}  # fmt: skip
    assert y[12] < y[2] < y[0] < y[9]  # logits at the top, then layer 1, layer 0, tokens at the bottom

    def node(i: int):
        return browser.find_element(By.CSS_SELECTOR, f'.g2v-gnode[data-node="{i}"]')

    ActionChains(browser).move_to_element(node(2)).perform()
    tip = browser.find_element(By.CSS_SELECTOR, ".g2v-gtip")
    text = tip.text
    assert tip.is_displayed() and "says Paris (L1 F3) · position 2 '␣b'" in text and "activation 2.0000" in text, text
    assert "promotes ␣Paris +1.500" in text and "suppresses ␣Rome -0.8750" in text  # its top logit effects
    assert "direct effect on the logits: ␣x +2.000, ␣y -0.7000" in text and "the capital" in text  # and a context

    def highlighted() -> list[list[int]]:
        return sorted(browser.execute_script(
            "return Array.from(document.querySelectorAll('.g2v-gedge.g2v-hl')).map(e => [+e.dataset.s, +e.dataset.t])"
        ))  # fmt: skip

    reach = _closure(kept)
    for pinned in (0, 2):  # a layer-0 feature, then the layer-1 one: every edge on a path through it
        ActionChains(browser).click(node(pinned)).perform()
        up = reach[pinned] | (np.arange(len(kept)) == pinned)  # nodes with a path into it, and itself
        down = reach[:, pinned] | (np.arange(len(kept)) == pinned)  # nodes it reaches, and itself
        ref = [[s, t] for t, s in zip(*np.nonzero(kept)) if (up[t] and up[s]) or (down[s] and down[t])]
        assert highlighted() == sorted(ref) and len(ref) >= 4
        assert "g2v-pinned" in node(pinned).get_attribute("class")
        assert "pinned: " in browser.find_element(By.CSS_SELECTOR, ".g2v-ginfo").text
        if pinned == 0:  # its source's edge and its target's edges count; its sibling's (feature 1's) do not
            assert [10, 0] in highlighted() and [2, 12] in highlighted() and [1, 2] not in highlighted()
    browser.execute_script(
        "var s = document.querySelector('select[aria-label=highlight]'); s.value = 'direct'; s.onchange()"
    )
    assert highlighted() == sorted([s, t] for t, s in zip(*np.nonzero(kept)) if 2 in (s, t))  # its own edges only
    ActionChains(browser).click(node(2)).perform()  # clicking it again unpins it
    assert highlighted() == [] and not browser.find_elements(By.CSS_SELECTOR, ".g2v-pinned, .g2v-pinmode")
    browser.execute_script(
        "var r = document.querySelector('input[aria-label=\"edge threshold\"]'); r.value = 0.3; r.oninput()"
    )
    hidden = browser.execute_script("return document.querySelectorAll('.g2v-gedge.g2v-ghide').length")
    assert hidden == sum(abs(w) < 0.3 * 2.0 for s, t, w in edges)  # below 30% of the largest |weight| (2.0)
    assert not_blank(browser) > 10


def test_intervention_page_draws_the_results_changes_with_gaps_where_the_graph_predicts_nothing(browser, tmp_path):
    from .view_results import small_intervention

    r = small_intervention()
    assert open_page(browser, r.view().save(tmp_path / "intervention.html")) == []
    fig = browser.find_elements(By.CSS_SELECTOR, ".g2v-fig")[0]
    drawn = browser.execute_script(
        "return arguments[0].data.filter(t => t.type === 'bar').map(t => [t.name, Array.from(t.y)])", fig
    )
    want = {"graph, direct": r.graph_direct, "graph, direct + indirect": r.graph_total, "real model": r.real}
    got = dict(drawn)
    for name, values in want.items():
        assert got[name] == [None if v != v else v for v in values.tolist()]  # NaN: no bar
    assert browser.execute_script("return arguments[0].querySelectorAll('.bars .point path').length", fig) > 10
    assert not_blank(browser) > 10
