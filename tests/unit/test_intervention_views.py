"""The figure and the interactive view of an intervention on an attribution graph and of a two-hop check: each
draws the result's own numbers (read back from the matplotlib artists and the Plotly traces), the kind a result
records finds its view, and a result read back from its dict (or its JSON) draws what the live one draws."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace

import numpy as np
import pytest
import torch
from matplotlib.collections import PathCollection

from gpt2_interp.facts import Fact, FactBase, two_hop_cases
from gpt2_interp.graphs import AttributionConfig, attribute, intervene, prune_graph, two_hop_check
from gpt2_interp.graphs.interventions import InterventionResult, TwoHopCheck
from gpt2_interp.graphs.transcoder import TranscoderTrainConfig, new_transcoders
from gpt2_interp.model import GPT2Config, HookedGPT2

from .test_figures_layout import assert_legible

pytest.importorskip("plotly", reason="the views need Plotly: pip install gpt2-interp[views]")

from gpt2_interp.views import kind_of, load_result, view
from gpt2_interp.views.dispatch import VIEWS
from gpt2_interp.views.interventions import intervention_figure, view_intervention, view_two_hop_check

TINY = GPT2Config(n_layer=2, d_model=64, n_head=4, d_mlp=256, n_ctx=64, name="tiny")
LABELS = {
    "graph_direct": "graph, direct",
    "graph_total": "graph, direct + indirect",
    "graph_pruned": "pruned graph, direct + indirect",
    "frozen_held": "frozen model, features held",
    "frozen_free": "frozen model, features free",
    "real": "real model",
}


@pytest.fixture(scope="module")
def tiny_tc():
    """A random 2-layer model and untrained transcoders with skips (as tests/unit/test_graph_interventions.py
    builds them, smaller): a graph and an intervention in well under a second."""
    model = HookedGPT2(TINY, seed=0).eval()
    return model, new_transcoders(model, TranscoderTrainConfig(d_sae=32, k=4, skip=True, seed=1))


@pytest.fixture(scope="module")
def result(tiny_tc) -> InterventionResult:
    """Two kept features of a pruned graph set to zero, tracking the graph's logits and one token that is no
    logit node (its graph prediction NaN)."""
    model, ts = tiny_tc
    g = attribute(
        model,
        ts,
        model.to_tokens("The capital of France is")[0],
        AttributionConfig(batch_size=64, max_n_logits=4, desired_logit_prob=0.9999),
    )
    g = prune_graph(g, 0.9, 0.98)
    kept = g.node_mask[: g.n_features].nonzero()[:, 0].tolist()
    keys = [tuple(g.features[i].tolist()) for i in kept[:2]]
    other = next(t for t in range(100) if t not in g.logit_tokens.tolist())
    return intervene(model, ts, g, keys, value=0.0, tokens=[*g.logit_tokens.tolist(), other])


@pytest.fixture(scope="module")
def check(tiny_tc) -> TwoHopCheck:
    model, ts = tiny_tc
    facts = [Fact("city_country", "Aalborg", "Denmark"), Fact("country_capital", "Denmark", "Copenhagen")]
    (case,) = two_hop_cases(FactBase(facts))
    g = attribute(model, ts, model.to_tokens(case.prompt)[0], AttributionConfig(batch_size=64, max_n_logits=3))
    return two_hop_check(model, ts, g, case, rank=3000)  # a random model: a wide rank finds bridge features


def _np(x: torch.Tensor) -> np.ndarray:
    return x.double().numpy()


def _features(r: InterventionResult) -> str:
    """The features changed as the figure's title names them, written out here from the result's fields."""
    return ", ".join(
        f"L{L} p{p} F{f} {o:.3f} → {n:.3f}"
        for (L, p, f), o, n in zip(r.features.tolist(), r.old.tolist(), r.new.tolist())
    )


def _bars(fig) -> dict[str, np.ndarray]:
    """The grouped bar panel's values per legend label."""
    ax = next(a for a in fig.axes if len(a.containers) > 1)
    return {c.get_label(): np.asarray(c.datavalues, dtype=float) for c in ax.containers}


def _barh_widths(ax) -> tuple[list[str], list[float]]:
    """A horizontal bar panel's labels and widths, top bar first."""
    return [t.get_text() for t in ax.get_yticklabels()][::-1], [p.get_width() for p in ax.patches][::-1]


def test_the_figure_draws_each_measure_of_each_tracked_token_and_the_top_tokens(result, monkeypatch):
    r = result
    assert r.graph_pruned is not None and torch.isnan(r.graph_total[-1]) and not torch.isnan(r.graph_total[0])
    fig = r.plot()
    bars = _bars(fig)
    assert list(bars) == list(LABELS.values())  # the pruned graph's bars too: the result holds them
    for field, label in LABELS.items():
        np.testing.assert_array_equal(bars[label], _np(getattr(r, field)))  # NaN where no logit node
    ax = next(a for a in fig.axes if len(a.containers) > 1)
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks[:-1] == [repr(t) for t in r.token_strs[:-1]] and ticks[-1] == f"{r.token_strs[-1]!r}\n(no logit node)"
    # the scatter: graph total (x) against the real and the frozen model (y), for the tokens that are logit nodes
    scatter = next(a for a in fig.axes if any(isinstance(c, PathCollection) for c in a.collections))
    points = {c.get_label(): np.asarray(c.get_offsets()) for c in scatter.collections}
    node = ~torch.isnan(r.graph_total)
    np.testing.assert_allclose(points["logits, real model"], np.stack([_np(r.graph_total[node]), _np(r.real[node])], 1))
    np.testing.assert_allclose(
        points["logits, frozen model (free)"], np.stack([_np(r.graph_total[node]), _np(r.frozen_free[node])], 1)
    )
    np.testing.assert_allclose(
        points["feature nodes, frozen model (free)"], np.stack([_np(r.node_total), _np(r.node_free)], 1)
    )
    (diagonal,) = [ln for ln in scatter.get_lines() if ln.get_label() == "y = x"]
    assert np.array_equal(diagonal.get_xdata(), diagonal.get_ydata())
    # the real model's top tokens before and after, most probable on top
    before, after = (next(a for a in fig.axes if a.get_title().endswith(side)) for side in ("before", "after"))
    assert _barh_widths(before) == ([repr(t) for t, _ in r.top_before], [p for _, p in r.top_before])
    assert _barh_widths(after) == ([repr(t) for t, _ in r.top_after], [p for _, p in r.top_after])
    assert fig._suptitle.get_text() == f"intervention: {_features(result)}"
    assert_legible(fig, monkeypatch)


def test_a_result_read_back_from_its_dict_or_json_draws_the_same_figure(result):
    d = result.to_dict()
    back = InterventionResult.from_dict(json.loads(result.to_json()))
    assert back.to_dict() == d  # the JSON form is a fixed point: nothing lost, nothing added
    assert back.direct_error == float(f"{result.direct_error:.6g}") > 0  # stored, not recomputed from rounded values
    fig = back.plot()
    bars = _bars(fig)
    assert list(bars) == list(LABELS.values())
    for field, label in LABELS.items():  # the dict holds 6 significant digits
        np.testing.assert_allclose(bars[label], _np(getattr(result, field)), rtol=1e-5, atol=1e-12)
    assert d["graph_total"][-1] is None and math.isnan(bars["graph, direct + indirect"][-1])
    panel = next(a for a in fig.axes if len(a.containers) > 1)
    assert f"largest difference {result.direct_error:.1e} of the largest change" in panel.get_title()
    assert fig._suptitle.get_text() == f"intervention: {_features(result)}"


def test_the_kind_finds_the_view_which_plots_the_results_numbers(result, tmp_path):
    d = result.to_dict()
    assert kind_of(d) == "graph_intervention" and VIEWS["graph_intervention"] is view_intervention
    assert kind_of({k: v for k, v in d.items() if k != "result"}) == "graph_intervention"  # by its fields too
    result.to_json(tmp_path / "r.json")
    saved = load_result(tmp_path / "r.json")
    fig = intervention_figure(saved)
    assert fig.to_plotly_json() == intervention_figure(result).to_plotly_json()  # saved views as live
    bars = {t.name: t.y for t in fig.data if t.type == "bar"}
    assert list(bars) == list(LABELS.values())
    for field, label in LABELS.items():
        assert list(bars[label]) == d[field]  # None (a gap) where the token is no logit node
    real = next(t for t in fig.data if t.name == "logits, real model")
    at = [i for i, v in enumerate(d["graph_total"]) if v is not None]
    assert list(real.x) == [d["graph_total"][i] for i in at] and list(real.y) == [d["real"][i] for i in at]
    page = view(saved)
    assert page.title == result.view().title == f"Intervention: {_features(result)}"
    html = page.html()
    assert f"{result.direct_error:.1e} of the largest change" in html
    for t, p in result.top_after:
        assert f"<td>{repr(t).replace(chr(39), '&#x27;')}</td><td>{p:.4f}</td>" in html


def test_the_two_hop_figure_shows_the_hops_the_suppression_and_the_bridge_features(check, monkeypatch):
    c = check
    assert c.present and c.suppressed is not None
    fig = c.plot()
    probs, sup_bars, feats = fig.axes[:3]
    labels, widths = _barh_widths(probs)
    assert widths == [c.answer_prob, float(c.suppressed.prob_after[0]), c.first_hop_prob, c.second_hop_prob]
    assert labels[1] == f"p({c.answer!r}), bridge features at 0"
    bars = {ct.get_label(): np.asarray(ct.datavalues, dtype=float) for ct in sup_bars.containers}
    assert list(bars) == [v for k, v in LABELS.items() if k != "graph_pruned"]  # an unpruned graph
    for field, label in LABELS.items():
        if field != "graph_pruned":
            np.testing.assert_array_equal(bars[label], _np(getattr(c.suppressed, field)))
    names, acts = _barh_widths(feats)
    order = sorted(range(len(c.bridge_activations)), key=lambda i: -float(c.bridge_activations[i]))[:20]
    assert acts == [float(c.bridge_activations[i]) for i in order]
    L, p, f = c.bridge_features[order[0]].tolist()
    assert names[0] == f"L{L} p{p} F{f} (rank {int(c.bridge_ranks[order[0]])})"
    assert_legible(fig, monkeypatch)
    back = TwoHopCheck.from_dict(json.loads(c.to_json()))
    assert back.to_dict() == c.to_dict()
    np.testing.assert_allclose(_barh_widths(back.plot().axes[0])[1], widths, rtol=1e-5)


def test_the_two_hop_view_is_found_by_its_kind_and_holds_the_suppressions_page(check):
    d = check.to_dict()
    assert kind_of(d) == "two_hop_check" and VIEWS["two_hop_check"] is view_two_hop_check
    assert kind_of({k: v for k, v in d.items() if k != "result"}) == "two_hop_check"
    page = view(d)
    assert page.title == check.view().title == f"Two-hop check: {check.prompt!r} → {check.answer!r}"
    html = page.html()
    assert "Bridge features set to 0" in html and html.count('class="g2v-fig"') == 2
    payloads = [json.loads(m) for m in re.findall(r"var s=(\{.*?\});Plotly", html)]
    probs, acts = payloads[0]["data"]
    assert probs["x"][0] == d["answer_prob"] and probs["x"][2:] == [d["first_hop_prob"], d["second_hop_prob"]]
    assert acts["x"] == d["bridge_activations"] and acts["customdata"] == d["bridge_ranks"]


def test_a_check_without_bridge_features_draws_and_views_the_probabilities_alone(check):
    empty = replace(
        check,
        bridge_features=torch.zeros(0, 3, dtype=torch.long),
        bridge_activations=torch.zeros(0),
        bridge_ranks=torch.zeros(0, dtype=torch.long),
        suppressed=None,
    )
    fig = empty.plot()
    assert len(fig.axes) == 1 and _barh_widths(fig.axes[0])[1] == [
        check.answer_prob,
        check.first_hop_prob,
        check.second_hop_prob,
    ]
    assert fig._suptitle.get_text().endswith("no bridge features in the graph")
    html = view(TwoHopCheck.from_dict(empty.to_dict())).html()
    assert "nothing to suppress" in html and html.count('class="g2v-fig"') == 1
