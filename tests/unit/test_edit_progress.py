"""Long editing work shows its progress: the δ steps with the current loss and P(target), the requests
done out of a batch, the layer updates, the key statistics with the corpus they read; ``progress=False``,
the runner's ``enabled(False)`` and the CLI's ``--quiet`` silence all of it."""

from __future__ import annotations

from typing import ClassVar

import pytest

from gpt2_interp.cli import main
from gpt2_interp.core import progress
from gpt2_interp.editing import memit, rome, targets
from gpt2_interp.editing.memit import compute_edits
from gpt2_interp.editing.rome import compute_edit
from gpt2_interp.editing.stats import DEFAULT_CORPUS_RULE, clear_memory_cache, key_second_moment

FAST = dict(prefix_lengths=(3,), prefixes_per_length=1)
REQ = {"prompt": "{} is located in the city of", "subject": "Eiffel Tower", "target": " Rome"}
REQS = [
    REQ,
    {"prompt": "The capital of {} is", "subject": "France", "target": " Berlin"},
    {"prompt": "{} speaks the language", "subject": "Brazil", "target": " German"},
]


class FakeBar:
    """Records what a progress bar is asked to show."""

    made: ClassVar[list[FakeBar]] = []

    def __init__(self, iterable=None, *, enabled=True, **kwargs):
        self.kwargs, self.enabled, self.disable = kwargs, enabled, enabled is False
        self.n, self.postfixes, self.closed = 0, [], False
        self.iterable = iterable
        FakeBar.made.append(self)

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.n += 1

    def update(self, k=1):
        self.n += k

    def set_postfix_str(self, s, refresh=True):
        self.postfixes.append(s)

    def close(self):
        self.closed = True

    @classmethod
    def named(cls, start: str) -> FakeBar:
        (bar,) = [b for b in cls.made if b.kwargs.get("desc", "").startswith(start)]
        return bar


@pytest.fixture
def bars(monkeypatch):
    FakeBar.made = []
    monkeypatch.setattr(rome, "progress_bar", FakeBar)
    monkeypatch.setattr(targets, "progress_bar", FakeBar)
    monkeypatch.setattr(memit, "progress_bar", FakeBar)
    return FakeBar


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "c.txt"
    path.write_text("\n\n".join(f"The tower stands in Paris, and {i} people saw it." for i in range(80)))
    return path


@pytest.fixture
def stats(tiny, corpus, tmp_path):
    return key_second_moment(tiny, [0, 1], corpus=str(corpus), n_samples=1500, cache_dir=tmp_path, progress=False)


def _fmt(entry: dict) -> str:
    return f"loss {entry['loss']:.3g}, p(target) {entry['p_target']:.3g}"


def test_rome_delta_bar_counts_the_steps_and_shows_the_loss_and_p_target(tiny, stats, bars):
    edit = compute_edit(tiny, REQ, layer=0, stats=stats[0], v_steps=4, progress=True, **FAST)
    bar = bars.named("δ at layer 0")
    assert bar.enabled is True and bar.kwargs["total"] == 4 and bar.n == 4 and bar.closed
    assert bar.postfixes[0] == _fmt(edit.metrics["initial_loss"])  # before any step
    assert bar.postfixes[-1] == _fmt(edit.metrics["final_loss"])  # the values the edit ended with
    assert len(bar.postfixes) == edit.metrics["steps"] + 1


def test_a_delta_optimisation_that_stops_early_completes_its_bar(tiny, stats, bars):
    edit = compute_edit(tiny, REQ, layer=0, stats=stats[0], v_steps=5, early_stop=1e9, progress=True, **FAST)
    assert edit.metrics["steps"] == 0  # stopped at once
    bar = bars.named("δ at layer 0")
    assert bar.kwargs["total"] == 5 and bar.n == 5


def test_memit_bars_count_requests_done_and_layer_updates(tiny, stats, bars):
    compute_edits(tiny, REQS, layers=[0, 1], stats=stats, hparams={**FAST, "v_steps": 2, "chunk": 1}, progress=True)
    bar = bars.named("memit: δ at layer 1")
    assert bar.kwargs["total"] == 2 * 3 and bar.n == 6  # two steps for each of three one-request chunks
    done = [p.split(",")[0] for p in bar.postfixes]
    assert done[0] == "requests 0/3" and done[-1] == "requests 3/3"
    assert {"requests 1/3", "requests 2/3"} <= set(done)
    layers = bars.named("memit: updates")
    assert layers.kwargs["total"] == 2 and layers.n == 2 and layers.closed


def test_sequential_memit_batches_show_requests_done_out_of_all(tiny, stats, bars):
    memit.apply_memit(tiny, REQS, batch_size=2, layers=[0], stats=stats, hparams={**FAST, "v_steps": 1}, progress=True)
    bar = bars.named("memit batches")
    assert bar.kwargs["total"] == 3 and bar.n == 3 and bar.enabled is True
    bars.made = []
    memit.apply_memit(tiny, REQS[:1], layers=[0], stats=stats, hparams={**FAST, "v_steps": 1}, progress=True)
    assert bars.named("memit batches").enabled is False  # one batch: its own bars suffice


def test_progress_false_and_the_runners_quiet_silence_the_bars(tiny, stats, capsys):
    compute_edit(tiny, REQ, layer=0, stats=stats[0], v_steps=2, progress=True, **FAST)
    assert "δ at layer 0" in capsys.readouterr().err
    compute_edit(tiny, REQ, layer=0, stats=stats[0], v_steps=2, progress=False, **FAST)
    assert "δ at layer" not in capsys.readouterr().err
    with progress.enabled(False):
        compute_edit(tiny, REQ, layer=0, stats=stats[0], v_steps=2, progress=True, **FAST)
    assert capsys.readouterr().err == ""


def test_computing_statistics_names_the_corpus_and_reading_the_cache_does_not(
    tiny, facts_model, corpus, tmp_path, capsys
):
    key_second_moment(tiny, 0, corpus=str(corpus), n_samples=300, cache_dir=tmp_path, progress=True)
    err = capsys.readouterr().err
    assert "key statistics of layer(s) 0 from 300 tokens of corpus file:" in err and "(as given)" in err
    key_second_moment(tiny, 0, corpus=str(corpus), n_samples=300, cache_dir=tmp_path, progress=True)
    assert "key statistics" not in capsys.readouterr().err  # cached: nothing computed
    key_second_moment(tiny, 1, corpus=str(corpus), n_samples=300, cache_dir=False, progress=False)
    assert capsys.readouterr().err == ""
    key_second_moment(facts_model, 0, n_samples=300, cache_dir=False, progress=True)
    err = capsys.readouterr().err
    assert "tokens of corpus facts:" in err and f"(the default — {DEFAULT_CORPUS_RULE})" in err


def test_cli_quiet_silences_the_statistics_note_and_bar(tiny, corpus, tmp_path, capsys):
    tiny.save(tmp_path / "tiny")
    clear_memory_cache()  # statistics are computed, not found in memory
    common = ["stats", "--model", str(tmp_path / "tiny"), "--layer", "0", "--corpus", str(corpus)]
    assert main([*common, "--n-samples", "300", "--cache-dir", str(tmp_path / "a")]) == 0
    assert "from 300 tokens of corpus file:" in capsys.readouterr().err
    assert main([*common, "--n-samples", "310", "--cache-dir", str(tmp_path / "b"), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "310 keys" in out and err == ""  # computed, silently


def test_memit_auto_layers_counts_the_traced_requests(tiny, bars):
    """``layers="auto"`` traces up to ``n_trace`` requests before any edit work: one bar step per request."""
    chosen = memit.choose_layers(tiny, REQS, n_trace=2, progress=True)
    bar = bars.named("layers='auto'")
    assert bar.n == 2 and bar.enabled is True
    assert chosen and all(0 <= l < tiny.cfg.n_layer for l in chosen)
