"""Cross-layer transcoders (CLTs, Ameisen et al. 2025, "Circuit Tracing"): features that read one layer's MLP
input and write to the MLP output of that layer and of every later one.

A CLT of a model with ``n`` layers has, for each layer ``ℓ``, ``d_tc`` features reading
``x_ℓ = blocks.ℓ.ln2.hook_normalized`` ``[..., d_model]`` (the per-layer transcoders' input):

- pre-activations ``h_ℓ = x_ℓ W_enc[ℓ] + b_enc[ℓ]`` ``[..., d_tc]``, features ``a_ℓ = σ(h_ℓ)`` (TopK by
  default, BatchTopK or ReLU, as :class:`~gpt2_interp.analysis.features.sae.SAE`),
- decoders ``W_dec[ℓ]`` ``[d_tc, n − ℓ, d_model]``: ``W_dec[ℓ][:, ℓ' − ℓ]`` writes into layer ``ℓ'``'s MLP output,
- the prediction of layer ``ℓ'``'s MLP output ``ŷ_ℓ' = Σ_{ℓ ≤ ℓ'} a_ℓ W_dec[ℓ][:, ℓ' − ℓ] + b_dec[ℓ']
  (+ x_ℓ' W_skip[ℓ']ᵀ)``.

A set of per-layer transcoders is the CLT whose cross-layer decoders (``ℓ' > ℓ``) are zero
(:meth:`CrossLayerTranscoder.from_transcoders`). Both share one layer-wise face (``n_layers``, ``d_sae(ℓ)``,
``pre_acts``, ``encode``, ``encoder_weight``, ``decoder_weight``, ``reconstruct``, ``check_model``), which the
replacement model (:mod:`gpt2_interp.graphs.replacement`), the attribution graph
(:mod:`gpt2_interp.graphs.attribution`) and :func:`~gpt2_interp.graphs.transcoder.evaluate_transcoders` read:
in a graph, a CLT feature's edge to a target sums its effect through every MLP output it writes.

Training (:func:`train_cross_layer_transcoder`) reads the activation stream of
:func:`~gpt2_interp.graphs.transcoder.train_transcoders` (one forward pass caches every layer's MLP input and
output; its stores, checkpoints and progress bar) and minimises the paper's loss on each batch,

    L = Σ_ℓ' ‖y_ℓ' − ŷ_ℓ'‖² / Σ‖y_ℓ' − ȳ_ℓ'‖²  +  λ · mean_rows Σ_ℓ Σ_i tanh(c · ‖W_dec,i^ℓ‖ · a_i^ℓ),

the squared error summed over the output layers (each in units of its batch's variance, so that no layer's
scale dominates: each term is that layer's fraction of variance unexplained) and, for a ReLU CLT, the
paper's sparsity penalty, where ``‖W_dec,i^ℓ‖`` is the norm of feature ``i``'s decoders concatenated over the
output layers ``ℓ' ≥ ℓ``, ``λ`` is ``l1_coefficient`` and ``c`` is ``tanh_scale``. TopK and BatchTopK CLTs are
sparse by their ``k`` (per layer) and have no penalty. Adam with the SAE trainer's learning-rate schedule;
decoders are not renormalised (the penalty carries their norm); no auxiliary dead-feature loss.

Files are circuit-tracer's (0.5) CLT layout, which its loader
(``circuit_tracer.transcoder.cross_layer_transcoder.load_clt``, or ``load_transcoder_from_hub`` given the
folder's absolute path) reads as they are: for each layer ``i``

- ``W_enc_{i}.safetensors``: ``W_enc_{i}`` ``[d_tc, d_model]`` (the transpose of ``W_enc[i]``), ``b_enc_{i}``
  ``[d_tc]``, ``b_dec_{i}`` ``[d_model]``, a BatchTopK CLT's ``threshold_{i}`` ``[d_tc]`` (written as
  ``max(θ, 0)``, a JumpReLU ``h · [h > θ]`` giving the same features as ``relu(h) · [h > θ]``), and with skips
  ``W_skip_{i}`` ``[d_model, d_model]`` in circuit-tracer's orientation (``x @ W_skip_{i}``);
- ``W_dec_{i}.safetensors``: ``W_dec_{i}`` ``[d_tc, n − i, d_model]``;
- ``config.yaml`` (JSON text, which YAML reads): ``model_kind``, the hooks, ``model_name``, ``scan``, and
  this library's :class:`CLTConfig` with the base model's weights fingerprint; every file's metadata carries the
  config and a sha256 digest.

What circuit-tracer cannot represent is written under a ``model_kind`` it refuses by name, so that it never
reads such a CLT as a different one: a ReLU or BatchTopK CLT without skips is ``cross_layer_transcoder``
(circuit-tracer builds the same CLT: ReLU, or JumpReLU with the threshold); a TopK CLT is
``topk_cross_layer_transcoder`` (circuit-tracer's CLT has no TopK); a CLT with skips is
``skip_cross_layer_transcoder`` (circuit-tracer's CLT module has ``W_skip``, but its file loader never reads
``W_skip_{i}``: it would build the CLT without its skips).

:meth:`CrossLayerTranscoder.load` also reads the folders circuit-tracer writes
(``CrossLayerTranscoder.to_safetensors``) and publishes: ``W_enc_{i}`` / ``W_dec_{i}`` files without this
library's config or digests, with or without circuit-tracer's ``config.yaml`` (YAML; its ``model_kind`` must be
``cross_layer_transcoder`` and its hooks the ones this library's CLT reads and writes, ``ln2.hook_normalized``
and ``hook_mlp_out``; without a config these hooks are assumed). Such a CLT is ReLU, or BatchTopK with the file's
threshold when it has one (JumpReLU thresholds must be ``≥ 0``, where ``h · [h > θ] = relu(h) · [h > θ]``), with
skips when every layer has ``W_skip_{i}``, and of unknown base model (no fingerprint to check); its tensors are
checked for names, shapes and finite values, and a digest, where a file has one, is verified.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..analysis.features.sae import ARCHITECTURES, Architecture
from ..analysis.features.sae_train import geometric_median
from ..core.boundary import boundary
from ..core.checks import check_choice, check_count, check_number, check_token_windows
from ..io.files import FileFormatError, check_finite, read_json, write_json
from ..io.integrity import IntegrityError, UnverifiedFileWarning, load_checked, save_checked
from ..model.fingerprint import weights_fingerprint
from .transcoder import (
    CONFIG_FILE,
    INPUT_HOOK,
    INPUT_SITE,
    OUTPUT_SITE,
    TARGET_HOOK,
    TranscoderSet,
    TranscoderTrainConfig,
    train_loop,
)

if TYPE_CHECKING:
    from ..model.hooked_gpt2 import HookedGPT2

FORMAT = "gpt2-interp-clt/1"
CT_KIND = "cross_layer_transcoder"  # the one model_kind circuit-tracer's loaders read as a CLT


def _model_kind(cfg: CLTConfig) -> str:
    """The ``model_kind`` a CLT of config ``cfg`` is saved under: circuit-tracer's ``cross_layer_transcoder``
    when circuit-tracer's loader builds the same CLT from its files (ReLU or BatchTopK, no skips), else a kind
    circuit-tracer refuses by name (``topk_cross_layer_transcoder``, ``skip_cross_layer_transcoder``)."""
    if cfg.architecture == "topk":
        return "topk_" + CT_KIND
    return "skip_" + CT_KIND if cfg.skip else CT_KIND


@boundary
@dataclass
class CLTConfig:
    """What a cross-layer transcoder is: ``n_layers`` and ``d_model`` (the model's), ``d_sae`` (features per
    layer), ``architecture`` (``"topk"``, ``"batchtopk"`` or ``"relu"``), ``k`` (active features per token and
    layer, top-k kinds), ``skip`` (a linear skip ``W_skip[ℓ]`` per layer), ``model_name`` and
    ``base_fingerprint`` (the base model's weights fingerprint; empty: unknown), ``training`` (the training
    text's record, as the per-layer transcoders keep it; None: unknown)."""

    n_layers: int
    d_model: int
    d_sae: int
    architecture: Architecture = "topk"
    k: int = 32
    skip: bool = False
    model_name: str = ""
    base_fingerprint: str = ""
    training: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "d_sae", "k"):
            check_count(getattr(self, name), name)
        check_choice(self.architecture, "architecture", ARCHITECTURES)
        if self.architecture != "relu" and self.k > self.d_sae:
            raise ValueError(f"k={self.k} exceeds d_sae={self.d_sae}: a {self.architecture} CLT keeps k of them")


@boundary
class CrossLayerTranscoder(nn.Module):
    """A cross-layer transcoder (see the module's docstring for the maths): ``W_enc`` ``[n_layers, d_model,
    d_tc]``, ``b_enc`` ``[n_layers, d_tc]``, ``W_dec[ℓ]`` ``[d_tc, n_layers − ℓ, d_model]``, ``b_dec``
    ``[n_layers, d_model]``, ``W_skip`` ``[n_layers, d_model, d_model]`` (with ``cfg.skip``; zero-initialised)
    and, for BatchTopK, a ``threshold`` ``[n_layers, d_tc]`` buffer. ``seed`` seeds the initialisation, the paper's:
    ``W_enc`` uniform in ``±1/√d_tc``, ``W_dec`` uniform in ``±1/√(n_layers · d_model)``, biases zero."""

    threshold: torch.Tensor | None
    W_skip: nn.Parameter | None

    def __init__(self, cfg: CLTConfig, seed: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        n, d, f = cfg.n_layers, cfg.d_model, cfg.d_sae
        g = torch.Generator().manual_seed(seed) if seed is not None else None

        def uniform(bound: float, *shape: int) -> torch.Tensor:
            return (2 * torch.rand(*shape, generator=g) - 1) * bound

        self.W_enc = nn.Parameter(uniform(1 / math.sqrt(f), n, d, f))
        self.W_dec = nn.ParameterList([nn.Parameter(uniform(1 / math.sqrt(n * d), f, n - L, d)) for L in range(n)])
        self.b_enc = nn.Parameter(torch.zeros(n, f))
        self.b_dec = nn.Parameter(torch.zeros(n, d))
        self.W_skip = nn.Parameter(torch.zeros(n, d, d)) if cfg.skip else None
        self.register_buffer("threshold", torch.zeros(n, f) if cfg.architecture == "batchtopk" else None)

    # ------------------------------------------------------------------ the layer-wise face
    @property
    def n_layers(self) -> int:
        """The number of layers it reads and writes."""
        return self.cfg.n_layers

    def d_sae(self, layer: int) -> int:
        """The number of features of layer ``layer`` (every layer's is ``cfg.d_sae``)."""
        return self.cfg.d_sae

    def pre_acts(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Layer ``layer``'s pre-activations ``x W_enc[layer] + b_enc[layer]`` ``[..., d_tc]`` of its MLP
        inputs ``x`` ``[..., d_model]``."""
        if x.shape[-1] != self.cfg.d_model:
            raise ValueError(f"this CLT reads d_model={self.cfg.d_model}; got an input of shape {tuple(x.shape)}")
        return x.to(self.W_enc.dtype) @ self.W_enc[layer] + self.b_enc[layer]

    def activate(self, layer: int, pre: torch.Tensor, batch: bool = False) -> torch.Tensor:
        """Layer ``layer``'s features from pre-activations ``[..., d_tc]``: TopK keeps each row's ``k``
        largest (ReLU'd); BatchTopK the ``k × rows`` largest of the batch when ``batch`` (training), else every
        ``h > threshold[layer]``; ReLU."""
        arch, k = self.cfg.architecture, self.cfg.k
        if arch == "relu":
            return pre.relu()
        if arch == "batchtopk":
            if not batch:
                assert self.threshold is not None, "a BatchTopK CLT has a threshold buffer"
                return pre.relu() * (pre > self.threshold[layer])
            flat = pre.reshape(-1)
            vals, idx = flat.topk(min(k * (flat.numel() // self.cfg.d_sae), flat.numel()), sorted=False)
            return torch.zeros_like(flat).scatter(0, idx, vals.relu()).view_as(pre)
        vals, idx = pre.topk(k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter(-1, idx, vals.relu())

    def encode(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Layer ``layer``'s features ``[..., d_tc]`` of its MLP inputs ``x`` ``[..., d_model]``."""
        return self.activate(layer, self.pre_acts(layer, x))

    def encoder_weight(self, layer: int) -> torch.Tensor:
        """What layer ``layer``'s features read, ``W_enc[layer]`` ``[d_model, d_tc]``."""
        return self.W_enc[layer]

    def decoder_weight(self, layer: int) -> torch.Tensor:
        """What layer ``layer``'s features write, ``W_dec[layer]`` ``[d_tc, n_layers − layer, d_model]``: into
        the MLP outputs of layers ``layer, layer + 1, …``."""
        return self.W_dec[layer]

    def skip(self, layer: int, x: torch.Tensor) -> torch.Tensor | None:
        """Layer ``layer``'s linear skip ``x W_skip[layer]ᵀ`` ``[..., d_model]`` (None without skips)."""
        return None if self.W_skip is None else x.to(self.W_skip.dtype) @ self.W_skip[layer].T

    def reconstruct(
        self, layer: int, acts: Sequence[torch.Tensor], x: torch.Tensor, error: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Layer ``layer``'s predicted MLP output ``Σ_{ℓ ≤ layer} acts[ℓ] W_dec[ℓ][:, layer − ℓ] + b_dec[layer]
        (+ error) (+ x W_skip[layer]ᵀ)`` ``[..., d_model]`` from the features ``acts[ℓ]`` ``[..., d_tc]`` of
        layers ``0 … layer`` (later ones are not read) and the layer's MLP input ``x`` ``[..., d_model]``."""
        dt = self.b_dec.dtype
        out = acts[layer].to(dt) @ self.W_dec[layer][:, 0] + self.b_dec[layer]
        for L in range(layer):
            out = out + acts[L].to(dt) @ self.W_dec[L][:, layer - L]
        if error is not None:
            out = out + error.to(dt)
        skip = self.skip(layer, x)
        return out if skip is None else out + skip

    def decode(self, acts: Sequence[torch.Tensor], xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Every layer's predicted MLP output ``[..., d_model]`` from every layer's features ``acts[ℓ]``
        ``[..., d_tc]`` and MLP inputs ``xs[ℓ]`` ``[..., d_model]`` (one product per source layer)."""
        n, d = self.n_layers, self.cfg.d_model
        outs: list[torch.Tensor] = [self.b_dec[L].expand(*acts[0].shape[:-1], d) for L in range(n)]
        for L in range(n):
            w = self.W_dec[L]
            part = (acts[L].to(w.dtype) @ w.flatten(1)).unflatten(-1, (n - L, d))
            for j in range(n - L):
                outs[L + j] = outs[L + j] + part[..., j, :]
        for L in range(n):
            skip = self.skip(L, xs[L])
            if skip is not None:
                outs[L] = outs[L] + skip
        return outs

    def forward(self, xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Every layer's predicted MLP output ``[..., d_model]`` from every layer's MLP input ``xs[ℓ]``
        ``[..., d_model]``."""
        return self.decode([self.encode(L, x) for L, x in enumerate(xs)], xs)

    def decoder_norms(self, layer: int) -> torch.Tensor:
        """``‖W_dec,i^layer‖`` ``[d_tc]``: each of layer ``layer``'s features' decoders concatenated over its
        output layers, their norm (the sparsity penalty's weight)."""
        return self.W_dec[layer].flatten(1).norm(dim=-1)

    def check_model(self, model: HookedGPT2) -> None:
        """Raise a ValueError when ``model`` is not the one this was trained on (layer count, width, the
        hooks it reads and writes, weights fingerprint)."""
        c, made_for = self.cfg, self.cfg.model_name or "another model"
        if c.n_layers != model.cfg.n_layer:
            raise ValueError(f"this CLT has {c.n_layers} layers; {model.cfg.name} has n_layer={model.cfg.n_layer}")
        if c.d_model != model.cfg.d_model:
            raise ValueError(f"this CLT reads d_model={c.d_model}; {model.cfg.name}'s is {model.cfg.d_model}")
        missing = [h.format(layer=L) for L in range(c.n_layers) for h in (INPUT_HOOK, TARGET_HOOK)]
        missing = [h for h in missing if h not in model.hook_dict]
        if missing:
            raise ValueError(f"this CLT was made for {made_for}; {model.cfg.name} has no hook point {missing[0]!r}")
        if c.base_fingerprint and weights_fingerprint(model) != c.base_fingerprint:
            raise ValueError(
                f"this CLT was trained on {made_for} with weights {c.base_fingerprint[:12]}…, not on this "
                f"{model.cfg.name} (weights {weights_fingerprint(model)[:12]}…); load it with that model"
            )

    @staticmethod
    def from_transcoders(transcoders: TranscoderSet) -> CrossLayerTranscoder:
        """The CLT equal to per-layer ``transcoders`` (one architecture, ``k``, width and skip choice for every
        layer): their encoders, biases, skips and thresholds, each layer's decoder into its own MLP output and
        zero cross-layer decoders."""
        first = transcoders[0]
        c = first.cfg
        if any(
            (t.cfg.architecture, t.cfg.k, t.d_sae, t.W_skip is None)
            != (c.architecture, c.k, c.d_sae, first.W_skip is None)
            for t in transcoders
        ):
            raise ValueError("from_transcoders needs one architecture, k, d_sae and skip choice for every layer")
        cfg = CLTConfig(
            n_layers=len(transcoders),
            d_model=c.d_in,
            d_sae=c.d_sae,
            architecture=c.architecture,
            k=c.k,
            skip=first.W_skip is not None,
            model_name=c.model_name,
            base_fingerprint=c.base_fingerprint,
            training=c.training,
        )
        clt = CrossLayerTranscoder(cfg).to(device=first.W_dec.device, dtype=first.W_dec.dtype)
        with torch.no_grad():
            for L, t in enumerate(transcoders):
                clt.W_enc[L].copy_(t.W_enc)
                clt.b_enc[L].copy_(t.b_enc)
                clt.W_dec[L].zero_()
                clt.W_dec[L][:, 0].copy_(t.W_dec)
                clt.b_dec[L].copy_(t.b_dec)
                if clt.W_skip is not None and t.W_skip is not None:
                    clt.W_skip[L].copy_(t.W_skip)
                if clt.threshold is not None and t.threshold is not None:
                    clt.threshold[L].copy_(t.threshold)
        return clt.eval()

    # ------------------------------------------------------------------ files
    def _config_dict(self) -> dict[str, Any]:
        c = self.cfg
        cfg = {
            "format": FORMAT,
            "model_kind": _model_kind(c),
            "model_name": c.model_name,
            "scan": f"gpt2-interp/{c.model_name}/{c.base_fingerprint[:16]}",
            "feature_input_hook": INPUT_SITE,
            "feature_output_hook": OUTPUT_SITE,
            "n_layers": c.n_layers,
            "clt": asdict(c),
        }
        return json.loads(json.dumps(cfg))  # what a reader parses back

    def _files(self) -> dict[str, dict[str, torch.Tensor]]:
        """The tensors of each file (see the module's docstring), by file name."""
        out = {}
        for i in range(self.n_layers):
            enc = {f"W_enc_{i}": self.W_enc[i].detach().T, f"b_enc_{i}": self.b_enc[i].detach()}
            enc[f"b_dec_{i}"] = self.b_dec[i].detach()
            if self.threshold is not None:
                enc[f"threshold_{i}"] = self.threshold[i].detach().clamp_min(0)
            if self.W_skip is not None:
                enc[f"W_skip_{i}"] = self.W_skip[i].detach().T
            out[f"W_enc_{i}.safetensors"] = enc
            out[f"W_dec_{i}.safetensors"] = {f"W_dec_{i}": self.W_dec[i].detach()}
        return out

    def save(self, path: str | Path) -> Path:
        """A folder in circuit-tracer's CLT layout (``W_enc_{i}.safetensors``, ``W_dec_{i}.safetensors``,
        ``config.yaml``; see the module's docstring); returns the folder."""
        folder = Path(path)
        cfg = self._config_dict()
        cfg_text = json.dumps(cfg, sort_keys=True)
        for name, tensors in self._files().items():
            check_finite(tensors, folder, "cross-layer transcoder")
            save_checked(folder / name, tensors, {"format": FORMAT, "config": cfg_text})
        write_json(folder / CONFIG_FILE, cfg)
        return folder

    def _fill(self, folder: Path, name: str, tensors: dict[str, torch.Tensor]) -> None:
        """Copy file ``name``'s ``tensors`` into this CLT: refused (FileFormatError) for other tensor names or
        shapes than :meth:`_files` writes, (ValueError) for NaN or ±inf."""
        want = self._files()[name]
        if set(tensors) != set(want):
            raise FileFormatError(f"{folder / name} holds {sorted(tensors)}, expected {sorted(want)}")
        check_finite(tensors, folder / name, "cross-layer transcoder")
        with torch.no_grad():
            for key, value in tensors.items():
                if value.shape != want[key].shape:
                    raise FileFormatError(
                        f"{folder / name}: {key} has shape {tuple(value.shape)}, expected {tuple(want[key].shape)}"
                    )
                i, kind = int(key.rsplit("_", 1)[1]), key.rsplit("_", 1)[0]
                if kind == "W_enc":
                    self.W_enc[i].copy_(value.T)
                elif kind == "W_skip":
                    assert self.W_skip is not None
                    self.W_skip[i].copy_(value.T)
                elif kind == "W_dec":
                    self.W_dec[i].copy_(value)
                elif kind == "threshold":
                    assert self.threshold is not None
                    self.threshold[i].copy_(value)
                else:
                    getattr(self, kind)[i].copy_(value)

    @staticmethod
    def load(path: str | Path, model: HookedGPT2 | None = None) -> CrossLayerTranscoder:
        """The CLT in folder ``path``. One :meth:`save` wrote (its ``config.yaml`` has this library's
        ``format``): each file's digest verified (IntegrityError when damaged or when its config was changed).
        One circuit-tracer wrote or publishes (no config, or circuit-tracer's): read as the module's docstring
        says (a config for other hooks or another ``model_kind``: FileFormatError). FileFormatError for missing,
        extra or misshapen tensors, ValueError for NaN or ±inf; with ``model``, refused (ValueError) for
        another model and otherwise moved to its device."""
        folder = Path(path)
        config_path = folder / CONFIG_FILE
        cfg = _read_config(config_path) if config_path.is_file() else None
        if cfg is None or "format" not in cfg:
            clt = _load_foreign(folder, cfg)
        else:
            if cfg["format"] != FORMAT:
                raise FileFormatError(f"{config_path}: format {cfg['format']!r}, expected {FORMAT!r}")
            if "clt" not in cfg:
                raise FileFormatError(f"{config_path} lacks the field 'clt' (this library's CLT config)")
            cfg_text = json.dumps(cfg, sort_keys=True)
            clt = CrossLayerTranscoder(CLTConfig(**cfg["clt"]))
            for name in clt._files():
                tensors, meta, _ = load_checked(folder / name, kind="cross-layer transcoder", allow_unverified=False)
                if meta.get("config") != cfg_text:
                    raise IntegrityError(f"{config_path} differs from the config {name} was saved with")
                clt._fill(folder, name, tensors)
        clt.eval()
        if model is not None:
            clt.check_model(model)
            clt.to(model.device)
        return clt


def _read_config(path: Path) -> dict[str, Any]:
    """A CLT folder's ``config.yaml``: this library's (JSON text, its digest checked) or circuit-tracer's (YAML:
    its top-level ``key: value`` lines, the only ones read)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if text.lstrip().startswith("{"):
        return read_json(path, "cross-layer transcoder config")
    cfg: dict[str, Any] = {}
    for line in text.splitlines():
        if line[:1] in ("", " ", "\t", "#", "-") or ":" not in line:
            continue
        key, _, value = line.partition(":")
        cfg[key.strip()] = value.split(" #")[0].strip().strip("'\"")
    return cfg


def _load_foreign(folder: Path, cfg: dict[str, Any] | None) -> CrossLayerTranscoder:
    """A CLT folder in circuit-tracer's own form (see the module's docstring), its sizes read from its files."""
    from safetensors import safe_open

    if cfg is not None:
        if cfg.get("model_kind") != CT_KIND:
            raise FileFormatError(
                f"{folder / CONFIG_FILE}: model_kind {cfg.get('model_kind')!r}; a cross-layer transcoder folder "
                f"of circuit-tracer's is {CT_KIND!r}"
            )
        hooks = (cfg.get("feature_input_hook"), cfg.get("feature_output_hook"))
        if hooks != (INPUT_SITE, OUTPUT_SITE):
            raise FileFormatError(
                f"{folder / CONFIG_FILE}: this CLT reads {hooks[0]!r} and writes {hooks[1]!r}; this library's CLT "
                f"reads each block's {INPUT_SITE!r} and writes its {OUTPUT_SITE!r}"
            )
    n = 0
    while (folder / f"W_enc_{n}.safetensors").is_file():
        n += 1
    if n == 0:
        raise FileNotFoundError(f"no cross-layer transcoder at {folder}: no W_enc_0.safetensors")
    layers = {str(i) for i in range(n)}
    extra = sorted(p.name for p in folder.glob("W_*_*.safetensors") if p.stem.rsplit("_", 1)[1] not in layers)
    if extra:
        raise FileFormatError(f"{folder}: {extra[0]} is beyond the layers W_enc_0 … W_enc_{n - 1}")
    try:
        with safe_open(str(folder / "W_enc_0.safetensors"), framework="pt") as f:
            keys = set(f.keys())
            d_sae, d_model = f.get_slice("W_enc_0").get_shape() if "W_enc_0" in keys else (0, 0)
    except Exception as e:  # safetensors raises its own error types
        raise FileFormatError(f"{folder / 'W_enc_0.safetensors'} is not a safetensors file ({e})") from None
    if not d_sae:
        raise FileFormatError(f"{folder / 'W_enc_0.safetensors'} holds {sorted(keys)}, no W_enc_0")
    arch: Architecture = "batchtopk" if "threshold_0" in keys else "relu"
    clt_cfg = CLTConfig(n, d_model, d_sae, architecture=arch, k=min(32, d_sae), skip="W_skip_0" in keys)
    clt = CrossLayerTranscoder(clt_cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnverifiedFileWarning)  # the foreign form has no digests
        for name in clt._files():
            tensors, _, _ = load_checked(folder / name, kind="cross-layer transcoder")
            clt._fill(folder, name, tensors)
            low = {k: float(v.min()) for k, v in tensors.items() if k.startswith("threshold_") and v.numel()}
            for key, value in low.items():
                if value < 0:
                    raise FileFormatError(
                        f"{folder / name}: {key} has a negative threshold ({value:.3g}); its JumpReLU lets "
                        "pre-activations in (θ, 0) through, which this library's CLT (relu(h) · [h > θ]) does not"
                    )
    return clt


@boundary
def load_transcoders(path: str | Path, model: HookedGPT2 | None = None) -> TranscoderSet | CrossLayerTranscoder:
    """The per-layer transcoders or the cross-layer transcoder saved in folder ``path``: a CLT where it has
    ``W_enc_0.safetensors`` (:meth:`CrossLayerTranscoder.load`: this library's CLT folders and circuit-tracer's),
    else per-layer transcoders (:meth:`TranscoderSet.load <gpt2_interp.graphs.transcoder.TranscoderSet.load>`)."""
    folder = Path(path)
    if (folder / "W_enc_0.safetensors").is_file():
        return CrossLayerTranscoder.load(folder, model)
    return TranscoderSet.load(folder, model)


# ---------------------------------------------------------------------- training
@boundary
@dataclass
class CLTTrainConfig(TranscoderTrainConfig):
    """How to train a cross-layer transcoder: :class:`~gpt2_interp.graphs.transcoder.TranscoderTrainConfig`'s
    settings (``d_sae`` or ``expansion``: features per layer; ``k`` per layer and token; ``skip``; the stream,
    schedule and checkpoints) plus ``tanh_scale``, the ``c`` of the ReLU CLT's sparsity penalty
    ``λ Σ tanh(c ‖W_dec,i‖ a_i)`` (``λ`` is ``l1_coefficient``; see the module's docstring). ``aux_k``,
    ``aux_coefficient`` and ``dead_after`` are not read (no auxiliary loss)."""

    tanh_scale: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_number(self.tanh_scale, "tanh_scale", 0, low_open=True)


@boundary
def new_cross_layer_transcoder(model: HookedGPT2, cfg: CLTTrainConfig) -> CrossLayerTranscoder:
    """A freshly initialised cross-layer transcoder for ``model`` (``cfg``'s sizes, seeded by ``cfg.seed``)."""
    d = model.cfg.d_model
    clt_cfg = CLTConfig(
        n_layers=model.cfg.n_layer,
        d_model=d,
        d_sae=cfg.d_sae if cfg.d_sae is not None else cfg.expansion * d,
        architecture=cfg.architecture,
        k=cfg.k if cfg.k is not None else 32,
        skip=cfg.skip,
        model_name=model.cfg.name,
        base_fingerprint=weights_fingerprint(model),
    )
    return CrossLayerTranscoder(clt_cfg, seed=cfg.seed).to(model.device)


@boundary
def clt_loss(
    clt: CrossLayerTranscoder, xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor], cfg: CLTTrainConfig
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """``(loss, fvus, acts)`` of ``clt`` trained with ``cfg`` (its architecture, ``l1_coefficient`` as ``λ``,
    ``tanh_scale`` as ``c``) on one batch: every layer's MLP inputs ``xs[ℓ]`` and outputs ``ys[ℓ]``
    ``[batch, d_model]``; ``fvus[ℓ']`` each output layer's fraction of variance unexplained (detached), ``acts[ℓ]``
    ``[batch, d_tc]`` the features (see the module's docstring for the loss)."""
    acts = [clt.activate(L, clt.pre_acts(L, x), batch=True) for L, x in enumerate(xs)]
    preds = clt.decode(acts, xs)
    fvus = [(y - p).pow(2).sum() / (y - y.mean(0)).pow(2).sum().clamp_min(1e-12) for y, p in zip(ys, preds)]
    loss = torch.stack(fvus).sum()
    if cfg.architecture == "relu":
        penalty = sum(torch.tanh(cfg.tanh_scale * clt.decoder_norms(L) * a).sum(-1).mean() for L, a in enumerate(acts))
        loss = loss + cfg.l1_coefficient * penalty
    return loss, [f.detach() for f in fvus], acts


class _CLTTrainer:
    """One cross-layer transcoder's optimisation, a step on every layer's batch at a time: Adam with the SAE
    trainer's learning-rate schedule over ``total`` steps and BatchTopK's per-layer threshold."""

    def __init__(self, clt: CrossLayerTranscoder, cfg: CLTTrainConfig, total: int) -> None:
        self.clt, self.cfg, self.total = clt, cfg, total
        self.lr = cfg.lr if cfg.lr is not None else 2e-4 / math.sqrt(clt.cfg.d_sae / 16384)
        self.opt = torch.optim.Adam(clt.parameters(), lr=self.lr, betas=(0.9, 0.999), eps=6.25e-10)
        self.steps = 0
        self.warm = max(1, int(cfg.lr_warmup * total))
        self.decay_from = int((1 - cfg.lr_decay) * total)
        self.last_loss = float("nan")

    @torch.no_grad()
    def init_b_dec(self, ys: list[torch.Tensor]) -> None:
        if self.cfg.b_dec_init != "zeros":
            for L, y in enumerate(ys):
                self.clt.b_dec[L].copy_(geometric_median(y) if self.cfg.b_dec_init == "geometric_median" else y.mean(0))

    def step(self, xs: list[torch.Tensor], ys: list[torch.Tensor]) -> list[torch.Tensor]:
        scale = min(1.0, (self.steps + 1) / self.warm)
        if self.steps >= self.decay_from:
            scale = min(scale, (self.total - self.steps) / max(1, self.total - self.decay_from))
        for group in self.opt.param_groups:
            group["lr"] = self.lr * scale
        loss, fvus, acts = clt_loss(self.clt, xs, ys, self.cfg)
        self.last_loss = float(loss.detach())
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        if self.clt.threshold is not None:
            with torch.no_grad():
                for L, a in enumerate(acts):
                    positive = a[a > 0]
                    if positive.numel():
                        self.clt.threshold[L].lerp_(positive.min().expand_as(self.clt.threshold[L]), 0.01)
        self.steps += 1
        return fvus

    def state(self) -> dict[str, Any]:
        return {"clt": self.clt.state_dict(), "optimizer": self.opt.state_dict()}

    def load_state(self, state: dict[str, Any], steps: int) -> None:
        self.clt.load_state_dict(state["clt"])
        self.opt.load_state_dict(state["optimizer"])
        self.steps = steps


@boundary
def train_cross_layer_transcoder(
    model: HookedGPT2,
    cfg: CLTTrainConfig,
    windows: torch.Tensor,
    checkpoint: str | Path | None = None,
    progress: bool | None = True,
) -> CrossLayerTranscoder:
    """Train a cross-layer transcoder on token ``windows`` ``[n, pos]`` from the activation stream of
    :func:`~gpt2_interp.graphs.transcoder.train_transcoders` (its stores, shuffling, ``b_dec`` initialisation
    from the first batch of each layer's targets, resumable ``checkpoint`` folder and ``progress`` bar, whose
    FVU is each output layer's), each step on one batch of every layer's MLP inputs and outputs with the loss
    of the module's docstring. Stops after ``cfg.tokens // cfg.batch_size`` steps or when the windows
    (× ``cfg.epochs``) run out."""
    windows = check_token_windows(windows, "windows")
    torch.manual_seed(cfg.seed)
    clt = new_cross_layer_transcoder(model, cfg)
    total = max(1, cfg.tokens // cfg.batch_size)
    train_loop(model, cfg, windows, _CLTTrainer(clt, cfg, total), total, checkpoint, progress, "cross-layer transcoder")
    return clt.eval()


__all__ = [
    "CLTConfig",
    "CLTTrainConfig",
    "CrossLayerTranscoder",
    "clt_loss",
    "load_transcoders",
    "new_cross_layer_transcoder",
    "train_cross_layer_transcoder",
]
