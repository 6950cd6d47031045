"""Derived data on disk is keyed by the content it was computed from, never by a name: key statistics of
a Brown folder whose files were replaced are not filed under the published corpus, and a later run
on other files never gets them back; the genuine corpus is recognised by its manifest digest."""

from __future__ import annotations

import warnings

import pytest
import torch

from gpt2_interp.editing.stats import clear_memory_cache, key_second_moment, resolve_corpus
from gpt2_interp.io import corpora
from gpt2_interp.model import HookedGPT2

from ..conftest import TINY


@pytest.fixture(scope="module")
def tiny():
    return HookedGPT2(TINY, seed=0)


def _write_brown(folder, word: str) -> None:
    """500 tagged sample files ca01 … (a stand-in for the corpus, every sample saying ``word``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(500):
        name = f"c{'abcdefghjklmnpr'[i % 15]}{i // 15 + 1:02d}"
        (folder / name).write_text(f"\n\n\tThe/at {word}/nn {i}/cd sat/vbd ./.\n")


def test_brown_id_is_the_digest_of_the_files_read_and_a_replaced_folder_warns(tmp_path, monkeypatch, tiny):
    monkeypatch.setenv(corpora.ENV_BROWN, str(tmp_path / "brown"))
    _write_brown(tmp_path / "brown", "cat")
    with pytest.warns(UserWarning, match=r"brown does not hold the published corpus"):
        a = resolve_corpus(tiny, "brown")
    files, digest = corpora.read_brown()
    assert a.id == f"brown:{digest[:16]}:s0" and digest == corpora.files_digest(files)
    (tmp_path / "brown" / "ca01").write_text("\n\n\tThe/at dog/nn sat/vbd ./.\n")
    with pytest.warns(UserWarning, match="published corpus"):
        b = resolve_corpus(tiny, "brown")
    assert b.id != a.id


def test_statistics_of_replaced_files_are_never_served_for_other_files(tmp_path, monkeypatch, tiny):
    monkeypatch.setenv(corpora.ENV_BROWN, str(tmp_path / "brown"))
    kw = dict(corpus="brown", n_samples=300, cache_dir=tmp_path / "stats", progress=False)
    warnings.simplefilter("ignore", UserWarning)
    _write_brown(tmp_path / "brown", "cat")
    first = key_second_moment(tiny, 0, **kw)
    _write_brown(tmp_path / "brown", "ocean")  # the same names, other contents
    clear_memory_cache()
    second = key_second_moment(tiny, 0, **kw)
    assert second.key["corpus"] != first.key["corpus"] and not torch.equal(second.C, first.C)
    assert len(list((tmp_path / "stats").iterdir())) == 2
    _write_brown(tmp_path / "brown", "cat")  # back to the first contents: its cached statistics are valid again
    clear_memory_cache()
    again = key_second_moment(tiny, 0, **kw)
    assert torch.equal(again.C, first.C) and again.path == first.path


def test_file_corpus_id_follows_content_not_names(tmp_path, tiny):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.txt").write_text("one text\n\nanother")
    before = resolve_corpus(tiny, tmp_path / "a").id
    (tmp_path / "a" / "x.txt").write_text("one text\n\nchanged")
    assert resolve_corpus(tiny, tmp_path / "a").id != before


@pytest.mark.skipif(not corpora.brown_available(), reason="the Brown Corpus is not on disk")
def test_the_published_brown_corpus_matches_its_manifest_digest():
    assert corpora.read_brown()[1] == corpora.BROWN_FILES_SHA256


def test_statistics_file_with_tensors_it_should_not_hold_is_refused(tmp_path, tiny):
    from gpt2_interp.editing.stats import KeyStats
    from gpt2_interp.io.integrity import load_checked, save_checked

    stats = key_second_moment(tiny, 0, corpus="generated", n_samples=64, cache_dir=False, progress=False)
    good = stats.save(tmp_path / "good.safetensors")
    assert torch.equal(KeyStats.load(good).C, stats.C)
    tensors, meta, _ = load_checked(good, kind="key-statistics")
    meta = {k: v for k, v in meta.items() if k in ("format", "count", "key")}
    bad = save_checked(tmp_path / "extra.safetensors", {**tensors, "D": torch.zeros(2)}, meta)
    with pytest.raises(
        ValueError, match=r"extra\.safetensors is not a valid key-statistics file: it holds the tensors \['C', 'D'\]"
    ):
        KeyStats.load(bad)
