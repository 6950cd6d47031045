"""Figure geometry, measured on the rendered figures: every text inside the figure, no two texts on top of each
other, scatter labels inside their axes, colour-bar ticks apart, sizes that follow the data; and summaries that
never name a cell that is the clean run by construction."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.text import Text
from matplotlib.transforms import Bbox

from gpt2_interp.analysis.tracing import TraceResult, causal_trace, causal_trace_all

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "analyses" / "results"
FACT = ("Munich is a city in the country of", "Munich")


# ------------------------------------------------------------------ measuring what is drawn
def drawn_texts(fig, monkeypatch, dpi: float = 130) -> list[tuple[Text, Bbox]]:
    """Every non-empty text the renderer actually draws at ``dpi`` (default: the one ``save_plot`` writes),
    with its box in pixels (an annotation's text alone, without its leader line)."""
    fig.set_dpi(dpi)
    canvas = FigureCanvasAgg(fig)
    renderer = canvas.get_renderer()
    seen: list[tuple[Text, Bbox]] = []
    draw = Text.draw

    def recording(self, r):
        draw(self, r)
        if self.get_visible() and self.get_text().strip():
            seen.append((self, Text.get_window_extent(self, renderer)))

    with monkeypatch.context() as m:
        m.setattr(Text, "draw", recording)
        canvas.draw()
    return seen


def overlap(a: Bbox, b: Bbox, tol: float = 0.5) -> bool:
    return min(a.x1, b.x1) - max(a.x0, b.x0) > tol and min(a.y1, b.y1) - max(a.y0, b.y0) > tol


def assert_legible(fig, monkeypatch, dpi: float = 130) -> list[tuple[Text, Bbox]]:
    """All texts drawn at ``dpi`` inside the figure and no two of them overlapping; returns them."""
    texts = drawn_texts(fig, monkeypatch, dpi)
    assert texts
    frame = fig.bbox
    outside = [
        t.get_text() for t, b in texts if b.x0 < -0.5 or b.y0 < -0.5 or b.x1 > frame.x1 + 0.5 or b.y1 > frame.y1 + 0.5
    ]
    assert not outside, f"texts run past the figure: {outside}"
    clashes = [
        (texts[i][0].get_text(), texts[j][0].get_text())
        for i in range(len(texts))
        for j in range(i + 1, len(texts))
        if overlap(texts[i][1], texts[j][1])
    ]
    assert not clashes, f"texts overprint each other: {clashes[:5]}"
    return texts


# ------------------------------------------------------------------ the figures
@pytest.fixture(scope="module")
def traces(facts_model):
    return causal_trace_all(facts_model, *FACT, samples=2)


def synthetic_trace(n_tokens: int, n_layers: int, subject=(1, 3), kind="hidden", clean=0.8, corrupted=0.02):
    g = torch.Generator().manual_seed(0)
    scores = corrupted + (clean - corrupted) * torch.rand(n_tokens, n_layers, generator=g) * 0.5
    scores[-1, -1] = clean  # what restoring the final state at the last token gives
    return TraceResult(
        prompt=" ".join(f"w{i}" for i in range(n_tokens)),
        subject="w1 w2",
        kind=kind,
        tokens=[f" w{i}" for i in range(n_tokens)],
        subject_range=subject,
        layer_labels=[f"L{i}" for i in range(n_layers)],
        target=" x",
        target_id=0,
        scores=scores,
        indirect_effect=scores - corrupted,
        clean_score=clean,
        corrupted_score=corrupted,
        noise_std=0.1,
        samples=2,
        window=1,
        seed=0,
    )


def clustered_scatter(n: int = 40):
    """Random controls near 0 and a tight cluster of large effects in one corner (labels compete for room)."""
    rng = np.random.default_rng(0)
    exact = np.concatenate([rng.normal(0, 0.05, n), [0.90, 0.89, 0.88, 0.87, 0.86, -0.85]])
    estimate = exact + rng.normal(0, 0.01, len(exact))
    top = [i >= n for i in range(len(exact))]
    labels = [f"L{i % 6}.H{i % 12} · pos {i} (a long cell label)" for i in range(len(exact))]
    return estimate, exact, top, labels


def model_figures(facts_model, tiny, traces):
    from gpt2_interp.analysis.lens import logit_attribution, logit_lens
    from gpt2_interp.analysis.metrics import logit_diff
    from gpt2_interp.analysis.patching import patch
    from gpt2_interp.analysis.probes import probe
    from gpt2_interp.analysis.vocab import find_neurons, neuron_vocab, top_subupdates

    p = "The capital of France is"
    metric = logit_diff(" Paris", " Rome")
    yield "lens last", logit_lens(facts_model, [p], targets=[" Paris"]).plot()
    yield "lens all", logit_lens(facts_model, [p], targets=[" Paris"], positions="all").plot()
    long = "In the early morning light the capital city of the Federal Republic of Germany, as everyone knows, is"
    yield "lens long mid", logit_lens(facts_model, [long], positions="all", include_mid=True).plot()
    yield "dla", logit_attribution(facts_model, p, " Paris").plot()
    yield "subupdates", top_subupdates(facts_model, p, target=" Paris").plot()
    yield "neurons", find_neurons(facts_model, " Paris").plot()
    yield "vocab", neuron_vocab(facts_model, 2, [0, 1, 2]).plot()
    yield "patch", patch(facts_model, p, "The capital of Italy is", metric=metric).plot()
    yield "patch heads", patch(facts_model, p, "The capital of Italy is", metric=metric, hook="z", heads="all").plot()
    yield "trace", traces["hidden"].plot()
    yield "traces", traces.plot()
    yield "trace 30 layers", synthetic_trace(9, 30).plot()
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
    yield "probe", probe(tiny, words, labels=[i % 2 for i in range(10)], n_folds=2, control=None).plot()


def plain_figures():
    from gpt2_interp.editing.compare import TopKComparison
    from gpt2_interp.plots.attribution import plot_agreement_grid, plot_estimate_vs_exact, plot_verification
    from gpt2_interp.plots.editing import plot_decay
    from gpt2_interp.plots.lens import plot_lens_divergence
    from gpt2_interp.plots.probes import plot_probe_summary

    est, ex, top, labels = clustered_scatter()
    title = "atp estimate vs exact patching, blocks.0.attn.hook_z: ρ = 0.912, top-20 recall 75%, and more"
    yield "verification", plot_verification(est, ex, top, labels, title=title)
    yield "estimate vs exact", plot_estimate_vs_exact(est, ex, title=title)
    caption = "ρ = 0.926, top-20 recall 75% (no stored effects: see the table)"
    yield (
        "agreement grid",
        plot_agreement_grid(
            [[(est, ex, caption)] * 3, [(est, ex, caption)] * 3],
            ["residual (resid_pre)", "heads (z)"],
            ["atp", "atp*", "ig"],
            title="Attribution estimates vs exact patching on a model, 50 fact prompt pairs " * 2,
        ),
    )
    layers = ["embed"] + [f"L{i}" for i in range(30)]
    yield (
        "lens divergence",
        plot_lens_divergence(
            layers, {"logit lens": np.linspace(8, 0, 31)}, {"logit lens": np.linspace(0, 1, 31)}, title="a title " * 12
        ),
    )
    yield "probe summary", plot_probe_summary(layers, {"country": np.linspace(0, 1, 31)}, {"mlp": np.zeros(31)})
    yield "decay", plot_decay({"memit": [1, 10, 100]}, {"ES": {"memit": [1, 0.9, 0.5]}}, title="t " * 40)
    yield (
        "topk",
        TopKComparison(
            prompts=["The mother tongue of Danielle Darrieux, the French actress born in Bordeaux, is"] * 2,
            before=[[(" French", 0.9), (" English", 0.05)]] * 2,
            after=[[(" English", 0.8), (" French", 0.1)]] * 2,
            target=" English",
            target_token=" English",
            p_target_before=[0.05, 0.05],
            p_target_after=[0.8, 0.8],
        ).plot(),
    )


def experiment_figures():
    """Each experiment's figures, drawn from its stored results (every model it was run on)."""
    from gpt2_interp.experiments import load_all

    registry = load_all()
    for path in sorted(RESULTS.glob("*/*/result.json")) + sorted(RESULTS.glob("*/*/*/result.json")):
        stored = json.loads(path.read_text())
        for name, fig in registry[stored["experiment"]].render_figures(stored["data"]).items():
            yield f"{path.parent.relative_to(RESULTS)}:{name}", fig


def test_model_figures_are_legible(facts_model, tiny, traces, monkeypatch):
    for name, fig in model_figures(facts_model, tiny, traces):
        try:
            assert_legible(fig, monkeypatch)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None


def test_plain_figures_are_legible(monkeypatch):
    for name, fig in plain_figures():
        try:
            for dpi in (72, 130):  # a screen's and a saved file's: the geometry holds at both
                assert_legible(fig, monkeypatch, dpi)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None


def test_experiment_figures_are_legible(monkeypatch):
    names = []
    for name, fig in experiment_figures():
        names.append(name)
        try:
            assert_legible(fig, monkeypatch)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None
    assert any(n.startswith("causal_trace/") for n in names) and any(n.startswith("attribution/") for n in names)


# ------------------------------------------------------------------ labels, ticks, sizes
def test_scatter_labels_sit_inside_the_axes_apart_and_name_the_largest_effects(monkeypatch):
    from gpt2_interp.plots.attribution import plot_verification

    est, ex, top, labels = clustered_scatter()
    fig = plot_verification(est, ex, top, labels)  # the 5 largest exact effects are labelled
    texts = drawn_texts(fig, monkeypatch)
    ax = fig.axes[0]
    frame = ax.get_window_extent()
    legend = [b for t, b in texts if t in ax.get_legend().get_texts()]
    placed = [(t, b) for t, b in texts if t.get_text() in labels]
    assert len(placed) >= 3  # a crowded corner still gets most of its labels
    largest = {labels[i] for i in np.argsort(-np.abs(ex))[:5]}
    assert {t.get_text() for t, _ in placed} <= largest
    for t, b in placed:
        assert frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1, t.get_text()
        assert not any(overlap(b, lb) for lb in legend), t.get_text()
    for i in range(len(placed)):
        for j in range(i + 1, len(placed)):
            assert not overlap(placed[i][1], placed[j][1]), (placed[i][0].get_text(), placed[j][0].get_text())


def test_trace_colour_bar_keeps_clean_and_corrupted_ticks_apart_from_zero(monkeypatch):
    fig = synthetic_trace(6, 6, corrupted=0.02).plot()
    cbar_ax = fig.axes[-1]
    texts = drawn_texts(fig, monkeypatch)
    ticks = [(t, b) for t, b in texts if t in cbar_ax.get_yticklabels()]
    shown = [t.get_text() for t, _ in ticks]
    assert "clean 0.80" in shown and "corrupted 0.02" in shown and "0" not in shown  # 0 would overprint
    for i in range(len(ticks)):
        for j in range(i + 1, len(ticks)):
            assert not overlap(ticks[i][1], ticks[j][1])
    far = synthetic_trace(6, 6, corrupted=0.3).plot()  # with room, the scale's 0 is labelled too
    assert "0" in [t.get_text() for t, _ in drawn_texts(far, monkeypatch) if t in far.axes[-1].get_yticklabels()]


def test_lens_figure_is_sized_to_its_positions_and_layers(facts_model, monkeypatch):
    from gpt2_interp.analysis.lens import logit_lens

    p = "The capital of France is"
    one = logit_lens(facts_model, [p], targets=[" Paris"])
    every = logit_lens(facts_model, [p], targets=[" Paris"], positions="all")
    mid = logit_lens(facts_model, [p], targets=[" Paris"], positions="all", include_mid=True)
    f_one, f_all, f_mid = one.plot(), every.plot(), mid.plot()
    n_all = int(every.valid[0].sum())

    def cell(fig, n_cols, n_rows):
        box = fig.axes[0].get_window_extent()
        return box.width / fig.dpi / n_cols, box.height / fig.dpi / n_rows

    for fig, n_cols, n_rows in (
        (f_one, 1, len(one.layers)),
        (f_all, n_all, len(every.layers)),
        (f_mid, n_all, len(mid.layers)),
    ):
        w, h = cell(fig, n_cols, n_rows)
        assert 0.4 <= w <= 1.0 and 0.15 <= h <= 0.45, (n_cols, n_rows, w, h)  # a column per position, not a wide block
    assert f_all.get_size_inches()[0] > f_one.get_size_inches()[0] + 0.5 * (n_all - 1)
    assert f_mid.get_size_inches()[1] > f_all.get_size_inches()[1] + 0.2 * (len(mid.layers) - len(every.layers))
    huge = logit_lens(facts_model, [" ".join(["word"] * 60)], positions="all").plot()
    assert huge.get_size_inches()[0] <= 24 and huge.get_size_inches()[1] <= 20
    assert_legible(huge, monkeypatch)  # bounded, and the shortened cell texts and ticks still fit


def test_trace_figures_grow_with_layers_and_tokens_within_bounds():
    small, deep, long = synthetic_trace(6, 6).plot(), synthetic_trace(6, 30).plot(), synthetic_trace(24, 6).plot()
    assert deep.get_size_inches()[0] > small.get_size_inches()[0] + 1
    assert long.get_size_inches()[1] > small.get_size_inches()[1] + 3
    huge = synthetic_trace(200, 96).plot()
    assert huge.get_size_inches()[0] <= 8 and huge.get_size_inches()[1] <= 17


def test_cli_lens_shows_every_position_by_default(capsys):
    from gpt2_interp.cli import main

    assert main(["lens", "The capital of France is", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    n_tokens = len(data["str_tokens"][0])
    assert len(data["positions"][0]) == n_tokens and data["positions"][0] == list(range(n_tokens))


# ------------------------------------------------------------------ summaries that name informative cells
@pytest.mark.filterwarnings(
    "ignore:weak corruption"
)  # the subject's own token is the last: noise there may barely matter
def test_clean_by_construction_cells_reproduce_the_clean_run(facts_model, traces):
    from gpt2_interp.analysis.tracing import clean_by_construction

    h = traces["hidden"]
    mask = h.clean_cells()
    assert mask.sum() == 1 and bool(mask[-1, -1])
    assert float(h.scores[-1, -1]) == pytest.approx(h.clean_score, rel=1e-4)  # the trace itself agrees
    # a subject that ends the prompt: the last token's state at any layer is the clean run
    end = causal_trace(facts_model, "The capital of France is Paris", " Paris", samples=2)
    assert bool(end.clean_cells()[-1].all())
    torch.testing.assert_close(end.scores[-1], torch.full_like(end.scores[-1], end.clean_score), rtol=1e-4, atol=1e-6)
    assert not clean_by_construction("mlp", 5, (1, 2), 6, 12).any()
    assert clean_by_construction("attn", 5, (1, 2), 6, 12)[-1].all()  # a window over every layer
    assert not clean_by_construction("attn", 5, (1, 2), 6, 1).any()


def test_trace_summary_names_the_subject_and_late_peaks_never_a_clean_cell(traces):
    for t in traces.traces:
        line = t.peak_line()
        last, final = t.tokens[-1], t.layer_labels[-1]
        for tok, layer in [(t.tokens[i], t.layer_labels[j]) for i, j in t.clean_cells().nonzero().tolist()]:
            assert f"restoring {tok!r} at {layer} gives" not in line
        s, e = t.subject_range
        sub = t.scores[s:e]
        i, j = divmod(int(sub.argmax()), sub.shape[1])  # independent: the subject rows' best cell
        assert (
            f"subject peak: restoring {t.tokens[s + i]!r} at {t.layer_labels[j]} gives p = {float(sub[i, j]):.4f}"
            in line
        )
        keep = torch.ones(len(t.layer_labels), dtype=torch.bool)
        keep[-1] = t.kind != "hidden"
        row = t.scores[-1].masked_fill(~keep, -1)
        assert f"last-token peak: restoring {last!r} at {t.layer_labels[int(row.argmax())]}" in line
        assert t.peak() != (last, final, float(t.scores[-1, -1])) or t.kind != "hidden"


def test_synthetic_trace_peak_is_never_the_clean_final_state():
    t = synthetic_trace(6, 6)  # the clean cell is the largest by construction
    assert int(t.scores.argmax()) == t.scores.numel() - 1
    assert t.peak()[:2] != (" w5", "L5") and t.late_peak()[:2] != (" w5", "L5")
    assert "(' w5' at L5 left out: the clean run by construction)" in t.peak_line()


def test_average_trace_peak_leaves_out_the_clean_final_layer():
    from analyses.causal_trace import average_from_data

    avg = average_from_data(json.loads((RESULTS / "causal_trace" / "gpt2-facts" / "result.json").read_text())["data"])
    row = avg.indirect_effect[avg.kinds.index("hidden"), avg.buckets.index("last token")]
    assert int(row.argmax()) == len(row) - 1  # the clean run by construction is the largest
    layer, value = avg.peak("hidden", "last token")
    assert layer == int(row[:-1].argmax()) and value == pytest.approx(float(row[:-1].max()))
    assert "L5 left out: the clean run by construction" in avg.table()


def test_demo_report_describes_the_attention_peak_beside_the_mlp(traces):
    from gpt2_interp.demo import trace_reading

    mlp, attn = traces["mlp"], traces["attn"]
    last_subject = mlp.subject_range[1] - 1
    layer = int(mlp.indirect_effect[last_subject].argmax())
    text = "\n".join(trace_reading(traces, layer, float(mlp.indirect_effect[last_subject, layer])))
    s, e = attn.subject_range
    sub = attn.indirect_effect[s:e]
    i, j = divmod(int(sub.argmax()), sub.shape[1])  # independent: the attention trace's best subject cell
    assert f"recovers {float(sub[i, j]):+.3f} at {attn.tokens[s + i]!r} at {attn.layer_labels[j]}" in text
    assert "Attention" in text and "MLP" in text
    h = traces["hidden"]
    assert f"{h.tokens[-1]!r} at {h.layer_labels[-1]} (indirect" not in text
