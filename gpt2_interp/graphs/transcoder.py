"""Per-layer transcoders: sparse dictionaries that read an MLP's input and predict its output.

A transcoder at layer ``L`` reads ``x = blocks.L.ln2.hook_normalized`` ``[..., d_model]`` (the MLP's
input before the norm's gain) and predicts ``y = blocks.L.hook_mlp_out`` ``[..., d_model]``:

- pre-activations ``h = x W_enc + b_enc`` ``[..., d_tc]`` (no input centring: ``b_dec`` is the output's bias),
- features ``a = σ(h)`` (TopK by default; ReLU or a BatchTopK threshold, as
  :class:`~gpt2_interp.analysis.features.sae.SAE`),
- prediction ``ŷ = a W_dec + b_dec + x W_skipᵀ`` (the linear skip ``W_skip`` ``[d_model, d_model]`` optional).

It is an :class:`~gpt2_interp.analysis.features.sae.SAE` whose target differs from its input, trained by
the SAE trainer (:class:`~gpt2_interp.analysis.features.sae_train.SAETrainer`, TopK, dead-latent
auxiliary loss, unit-norm decoder rows) on target batches; :func:`train_transcoders` trains every
layer's from one stream of forward passes (one pass caches each layer's input and output).

Files are circuit-tracer's (0.5) local transcoder-set layout, which its loaders read as they are
(``circuit_tracer.utils.hf_utils.load_transcoder_from_hub`` given the folder's absolute path, or
``ReplacementModel.from_pretrained(model_name, folder)``): a folder of

- ``layer_{i}.safetensors``: ``W_enc`` ``[d_tc, d_model]`` (circuit-tracer's orientation, the transpose of
  :attr:`Transcoder.W_enc`), ``W_dec`` ``[d_tc, d_model]``, ``b_enc`` ``[d_tc]``, ``b_dec`` ``[d_model]``,
  ``W_skip`` ``[d_model, d_model]`` when there is a skip, and for BatchTopK the threshold as
  ``activation_function.threshold`` ``[d_tc]`` (a JumpReLU ``h · [h > θ]``; written as ``max(θ, 0)``,
  which gives the same features as ``relu(h) · [h > θ]``); a ReLU transcoder has no threshold. Each file's
  safetensors metadata carries the set's config and a sha256 digest over its tensors and metadata.
- ``config.yaml``: circuit-tracer's keys (``model_kind``, ``feature_input_hook`` ``ln2.hook_normalized``,
  ``feature_output_hook`` ``hook_mlp_out``, ``scan``, ``model_name``) and this library's (``format``, each
  layer's :class:`~gpt2_interp.analysis.features.sae.SAEConfig` with the base model's weights
  fingerprint), written as JSON, which YAML reads, with a sha256 field.

circuit-tracer's file loader knows ReLU and JumpReLU only: a TopK set's ``model_kind`` is
``topk_transcoder_set``, which circuit-tracer refuses by name rather than read as ReLU. Folders of the
first layout, ``gpt2-interp-transcoders/1`` (``config.json``, ``W_enc`` ``[d_model, d_tc]``, ``threshold``)
still load.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from ..analysis.features.sae import SAE, SAEConfig
from ..analysis.features.sae_train import SAETrainConfig, SAETrainer
from ..core.boundary import boundary
from ..core.checks import check_token_windows
from ..core.progress import progress_bar
from ..core.result import Result
from ..io.files import FileFormatError, check_finite, load_tree, read_json, save_tree, write_json
from ..io.integrity import IntegrityError, load_checked, save_checked
from ..model.fingerprint import weights_fingerprint

if TYPE_CHECKING:
    from ..model.hooked_gpt2 import HookedGPT2
    from .clt import CrossLayerTranscoder

INPUT_HOOK, TARGET_HOOK = "blocks.{layer}.ln2.hook_normalized", "blocks.{layer}.hook_mlp_out"
CONFIG_FILE = "config.yaml"  # JSON text (YAML reads JSON): circuit-tracer's keys and ours
LEGACY_CONFIG_FILE, LEGACY_FORMAT = "config.json", "gpt2-interp-transcoders/1"
CHECKPOINT_FILE = "train_state.safetensors"  # written by save_tree: no pickle, digest-checked
FORMAT = "gpt2-interp-transcoders/2"
THRESHOLD = "activation_function.threshold"  # circuit-tracer's JumpReLU parameter name
INPUT_SITE, OUTPUT_SITE = INPUT_HOOK.split(".", 2)[2], TARGET_HOOK.split(".", 2)[2]  # within blocks.L


@boundary
class Transcoder(SAE):
    """One layer's transcoder (see the module's docstring for the maths). ``cfg.hook_name`` is the hook it
    reads (``blocks.L.ln2.hook_normalized``); ``target_hook`` the one it predicts
    (``blocks.L.hook_mlp_out``); ``layer`` its layer; ``skip``: with a linear skip ``W_skip``
    ``[d_model, d_model]`` (zero-initialised); ``seed`` seeds the initialisation."""

    W_skip: nn.Parameter | None

    def __init__(self, cfg: SAEConfig, layer: int, target_hook: str, skip: bool = False, seed: int | None = None):
        super().__init__(cfg, seed)
        self.layer, self.target_hook = layer, target_hook
        self.W_skip = nn.Parameter(torch.zeros(cfg.d_in, cfg.d_in)) if skip else None

    def pre_acts(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-activations ``x W_enc + b_enc`` ``[..., d_tc]`` of MLP inputs ``x`` ``[..., d_model]``."""
        self._check_input(x)
        x = self.hook_sae_input(x.to(self.W_enc.dtype))
        return self.hook_sae_acts_pre(x @ self.W_enc + self.b_enc)

    def skip(self, x: torch.Tensor) -> torch.Tensor | None:
        """The linear skip ``x W_skipᵀ`` ``[..., d_model]`` (None without one)."""
        return None if self.W_skip is None else x.to(self.W_skip.dtype) @ self.W_skip.T

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The predicted MLP output ``a W_dec + b_dec (+ x W_skipᵀ)`` ``[..., d_model]`` of ``x`` ``[..., d_model]``."""
        out = self.decode(self.encode(x))
        skip = self.skip(x)
        return out if skip is None else out + skip

    def _clean_recons(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self(x)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The weights as circuit-tracer's files hold them: ``W_enc`` ``[d_tc, d_model]`` (transposed),
        ``W_dec``, ``b_enc``, ``b_dec``, and ``W_skip`` and ``activation_function.threshold`` (``max(θ, 0)``)
        when present."""
        sd = {"W_enc": self.W_enc.detach().T, "W_dec": self.W_dec.detach()}
        sd |= {"b_enc": self.b_enc.detach(), "b_dec": self.b_dec.detach()}
        if self.threshold is not None:
            sd[THRESHOLD] = self.threshold.detach().clamp_min(0)
        if self.W_skip is not None:
            sd["W_skip"] = self.W_skip.detach()
        return sd

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], legacy: bool = False) -> None:
        """Copy weights named as :meth:`state_tensors` names them (``legacy``: the ``/1`` layout, ``W_enc``
        ``[d_model, d_tc]`` and ``threshold``) into this transcoder; a FileFormatError names missing or
        extra tensors and wrong shapes."""
        names = {"W_enc": "W_enc", "W_dec": "W_dec", "b_enc": "b_enc", "b_dec": "b_dec"}
        if self.threshold is not None:
            names["threshold" if legacy else THRESHOLD] = "threshold"
        if self.W_skip is not None:
            names["W_skip"] = "W_skip"
        if set(tensors) != set(names):
            raise FileFormatError(
                f"layer {self.layer}'s file holds {sorted(tensors)}, expected {sorted(names)} "
                f"(a {self.cfg.architecture} transcoder{' with a skip' if self.W_skip is not None else ''})"
            )
        with torch.no_grad():
            for file_name, attr in names.items():
                value = tensors[file_name].T if file_name == "W_enc" and not legacy else tensors[file_name]
                target = getattr(self, attr)
                if value.shape != target.shape:
                    raise FileFormatError(
                        f"layer {self.layer}'s {file_name} has shape {tuple(tensors[file_name].shape)}, "
                        f"expected {tuple((target.T if file_name == 'W_enc' and not legacy else target).shape)}"
                    )
                target.copy_(value)


@boundary
@dataclass
class TranscoderSet:
    """One transcoder per layer ``[0, n_layer)`` of a model: ``transcoders[L]`` reads layer ``L``'s MLP input."""

    transcoders: list[Transcoder]

    def __post_init__(self) -> None:
        if not isinstance(self.transcoders, (list, tuple)) or not all(
            isinstance(t, Transcoder) for t in self.transcoders
        ):
            raise TypeError(f"transcoders must be a list of Transcoder, got {self.transcoders!r}")
        got = [t.layer for t in self.transcoders]
        if got != list(range(len(got))) or not got:
            raise ValueError(f"transcoders must cover layers 0, 1, … in order, got layers {got}")

    def __len__(self) -> int:
        return len(self.transcoders)

    def __getitem__(self, layer: int) -> Transcoder:
        return self.transcoders[layer]

    def __iter__(self) -> Iterator[Transcoder]:
        return iter(self.transcoders)

    def to(self, device: torch.device | str) -> TranscoderSet:
        """This set with every transcoder moved to ``device`` (in place); returns it."""
        for t in self.transcoders:
            t.to(device)
        return self

    # the layer-wise face it shares with a cross-layer transcoder (gpt2_interp.graphs.clt), which the
    # replacement model, the attribution graph and the metrics read
    @property
    def n_layers(self) -> int:
        """The number of layers (one transcoder each)."""
        return len(self.transcoders)

    def d_sae(self, layer: int) -> int:
        """The number of features of layer ``layer``."""
        return self.transcoders[layer].d_sae

    def pre_acts(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Layer ``layer``'s feature pre-activations ``[..., d_tc]`` of its MLP inputs ``x`` ``[..., d_model]``."""
        return self.transcoders[layer].pre_acts(x)

    def encode(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Layer ``layer``'s features ``[..., d_tc]`` of its MLP inputs ``x`` ``[..., d_model]``."""
        return self.transcoders[layer].encode(x)

    def encoder_weight(self, layer: int) -> torch.Tensor:
        """What layer ``layer``'s features read, ``W_enc`` ``[d_model, d_tc]``."""
        return self.transcoders[layer].W_enc

    def decoder_weight(self, layer: int) -> torch.Tensor:
        """What layer ``layer``'s features write ``[d_tc, 1, d_model]``: into one MLP output, their own layer's
        (a cross-layer transcoder's is ``[d_tc, n_layers − layer, d_model]``, layers ``layer, layer + 1, …``)."""
        return self.transcoders[layer].W_dec[:, None]

    def reconstruct(
        self, layer: int, acts: list[torch.Tensor], x: torch.Tensor, error: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Layer ``layer``'s predicted MLP output ``a W_dec + b_dec (+ error) (+ x W_skipᵀ)`` ``[..., d_model]``
        from the features ``acts[layer]`` ``[..., d_tc]`` (the other layers' are not read) and its MLP input
        ``x`` ``[..., d_model]``; ``error`` ``[..., d_model]`` added before the skip."""
        t = self.transcoders[layer]
        out = acts[layer].to(t.W_dec.dtype) @ t.W_dec + t.b_dec
        if error is not None:
            out = out + error.to(t.W_dec.dtype)
        skip = t.skip(x)
        return out if skip is None else out + skip

    def check_model(self, model: HookedGPT2) -> None:
        """Raise a ValueError when ``model`` is not the one these were trained on (layer count, hooks,
        widths, weights fingerprint)."""
        if len(self) != model.cfg.n_layer:
            raise ValueError(f"transcoders: {len(self)} layers for a model of n_layer={model.cfg.n_layer}")
        for t in self.transcoders:
            t.check_model(model)

    def save(self, path: str | Path) -> Path:
        """A folder of ``layer_{i}.safetensors`` and ``config.yaml`` in circuit-tracer's layout (see the
        module's docstring); returns the folder."""
        folder = Path(path)
        first = self.transcoders[0].cfg
        topk = any(t.cfg.architecture == "topk" for t in self)
        cfg = {
            "format": FORMAT,
            "model_kind": "topk_transcoder_set" if topk else "transcoder_set",
            "model_name": first.model_name,
            "scan": f"gpt2-interp/{first.model_name}/{first.base_fingerprint[:16]}",
            "feature_input_hook": INPUT_SITE,
            "feature_output_hook": OUTPUT_SITE,
            "n_layers": len(self),
            "layers": [asdict(t.cfg) | {"target_hook": t.target_hook, "skip": t.W_skip is not None} for t in self],
        }
        cfg = json.loads(json.dumps(cfg))  # what a reader parses back (tuples as lists)
        cfg_text = json.dumps(cfg, sort_keys=True)
        for t in self.transcoders:
            tensors = t.state_tensors()
            check_finite(tensors, folder, "transcoder")
            save_checked(folder / f"layer_{t.layer}.safetensors", tensors, {"format": FORMAT, "config": cfg_text})
        write_json(folder / CONFIG_FILE, cfg)
        return folder

    @staticmethod
    def load(path: str | Path, model: HookedGPT2 | None = None) -> TranscoderSet:
        """The set saved in folder ``path`` by :meth:`save` (or in the ``/1`` layout), each file's digest
        verified (IntegrityError when damaged or when its config was changed); with ``model``, refused
        (ValueError) for other weights and otherwise moved to its device."""
        folder = Path(path)
        legacy = not (folder / CONFIG_FILE).is_file() and (folder / LEGACY_CONFIG_FILE).is_file()
        cfg_path = folder / (LEGACY_CONFIG_FILE if legacy else CONFIG_FILE)
        cfg = read_json(cfg_path, "transcoder config", required=("format", "n_layers", "layers"))
        expected_format = LEGACY_FORMAT if legacy else FORMAT
        if cfg["format"] != expected_format:
            raise FileFormatError(f"{cfg_path}: format {cfg['format']!r}, expected {expected_format!r}")
        cfg_text = json.dumps(cfg, sort_keys=True)
        out = []
        for i, layer_cfg in enumerate(cfg["layers"]):
            tensors, meta, _ = load_checked(
                folder / f"layer_{i}.safetensors", kind="transcoder", allow_unverified=False
            )
            if meta.get("config") != cfg_text:
                raise IntegrityError(f"{cfg_path} differs from the config layer {i} was saved with")
            layer_cfg = dict(layer_cfg)
            target, skip = layer_cfg.pop("target_hook"), layer_cfg.pop("skip")
            t = Transcoder(SAEConfig(**layer_cfg), i, target, skip)
            t.load_state_tensors(tensors, legacy=legacy)
            out.append(t.eval())
        ts = TranscoderSet(out)
        if model is not None:
            ts.check_model(model)
            ts.to(model.device)
        return ts


@boundary
@dataclass
class TranscoderTrainConfig(SAETrainConfig):
    """How to train every layer's transcoder: :class:`~gpt2_interp.analysis.features.sae_train.SAETrainConfig`'s
    settings plus ``skip`` (a linear skip ``W_skip``). ``tokens`` is the budget of each layer (every layer
    sees every token). ``hook_name`` is fixed: each layer's MLP input (``blocks.{layer}.ln2.hook_normalized``);
    ``context_size`` is unused (the windows are given) and ``outlier_ratio`` must stay None (BOS is the
    only position left out)."""

    hook_name: str = INPUT_HOOK
    b_dec_init: str = "mean"
    skip: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hook_name != INPUT_HOOK:
            raise ValueError(f"hook_name is each layer's MLP input {INPUT_HOOK!r}, got {self.hook_name!r}")
        if self.outlier_ratio is not None:
            raise ValueError(f"outlier_ratio={self.outlier_ratio} is not applied to transcoder training: leave it None")


def _layers_run(model: HookedGPT2, rows: torch.Tensor, logits: bool = False) -> tuple[torch.Tensor | None, Any]:
    """One forward pass of ``rows`` caching every layer's MLP input and output: ``(logits or None, cache)``."""
    names = [h.format(layer=L) for L in range(model.cfg.n_layer) for h in (INPUT_HOOK, TARGET_HOOK)]
    with torch.no_grad():
        return model.run_with_cache(rows.to(model.device), names_filter=names, return_type="logits" if logits else None)


def _layer_pairs(model: HookedGPT2, cache: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's ``(MLP input, MLP output)`` ``[rows·pos', d_model]`` from a :func:`_layers_run` cache (BOS
    left out)."""
    first = 1 if model.tokenizer.bos_id is not None else 0

    def flat(h: str, L: int) -> torch.Tensor:
        return cache[h.format(layer=L)][:, first:].reshape(-1, model.cfg.d_model).float()

    return [(flat(INPUT_HOOK, L), flat(TARGET_HOOK, L)) for L in range(model.cfg.n_layer)]


def _cache_layers(model: HookedGPT2, rows: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each layer's ``(MLP input, MLP output)`` ``[rows·pos', d_model]`` from one forward pass (BOS left out)."""
    return _layer_pairs(model, _layers_run(model, rows)[1])


@boundary
def new_transcoders(model: HookedGPT2, cfg: TranscoderTrainConfig) -> TranscoderSet:
    """Freshly initialised transcoders for every layer of ``model`` (``cfg``'s sizes, seeded by ``cfg.seed + L``)."""
    d, fp = model.cfg.d_model, weights_fingerprint(model)
    out = []
    for L in range(model.cfg.n_layer):
        sae_cfg = SAEConfig(
            d_in=d,
            d_sae=cfg.d_sae if cfg.d_sae is not None else cfg.expansion * d,
            hook_name=INPUT_HOOK.format(layer=L),
            architecture=cfg.architecture,
            k=cfg.k if cfg.k is not None else 32,
            model_name=model.cfg.name,
            base_fingerprint=fp,
        )
        out.append(Transcoder(sae_cfg, L, TARGET_HOOK.format(layer=L), cfg.skip, seed=cfg.seed + L).to(model.device))
    return TranscoderSet(out)


@boundary
def train_transcoders(
    model: HookedGPT2,
    cfg: TranscoderTrainConfig,
    windows: torch.Tensor,
    checkpoint: str | Path | None = None,
    progress: bool | None = True,
) -> TranscoderSet:
    """Train every layer's transcoder on token ``windows`` ``[n, pos]``: each forward pass of
    ``cfg.forward_batch`` windows caches all layers' MLP inputs and outputs, which fill one shuffling store
    per layer (``cfg.buffer_tokens``, shuffled with one permutation shared by input and output, seeded by
    ``cfg.seed`` and the step); each layer's :class:`~gpt2_interp.analysis.features.sae_train.SAETrainer`
    then steps on batches of ``cfg.batch_size`` (its ``b_dec`` initialised from the first batch of
    targets). Stops after ``cfg.tokens // cfg.batch_size`` steps or when the windows (× ``cfg.epochs``) run
    out. ``checkpoint``: a folder where the transcoders, optimizers and position in the windows are saved
    (through :func:`~gpt2_interp.io.files.save_tree`) after each store of at least ``cfg.checkpoint_every``
    new steps; a run given the same folder resumes from it, bit for bit as if never interrupted (a
    checkpoint of other settings or base weights is refused). ``progress``: a bar over the forward passes with
    the layers' mean and worst FVU of the last store (None: on a terminal, else plain lines at a steady
    interval, :mod:`gpt2_interp.core.progress`)."""
    windows = check_token_windows(windows, "windows")
    torch.manual_seed(cfg.seed)
    ts = new_transcoders(model, cfg)
    total = max(1, cfg.tokens // cfg.batch_size)
    train_loop(model, cfg, windows, _LayerTrainers(ts, cfg, total), total, checkpoint, progress, "transcoders")
    for t in ts:
        t.eval()
    return ts


class _LayerTrainers:
    """Each layer's :class:`~gpt2_interp.analysis.features.sae_train.SAETrainer`, each stepped on its own
    layer's batch (the layers are independent)."""

    def __init__(self, ts: TranscoderSet, cfg: TranscoderTrainConfig, total: int) -> None:
        self.trainers = [SAETrainer(t, cfg, total) for t in ts]

    def init_b_dec(self, ys: list[torch.Tensor]) -> None:
        for trainer, y in zip(self.trainers, ys):
            trainer.init_b_dec(y)

    def step(self, xs: list[torch.Tensor], ys: list[torch.Tensor]) -> list[torch.Tensor]:
        return [trainer.step(x, y)[0] for trainer, x, y in zip(self.trainers, xs, ys)]

    def state(self) -> dict[str, Any]:
        layers = [
            {"transcoder": tr.sae.state_dict(), "optimizer": tr.opt.state_dict(), "since_fired": tr.since_fired}
            for tr in self.trainers
        ]
        return {"layers": layers}

    def load_state(self, state: dict[str, Any], steps: int) -> None:
        for trainer, layer in zip(self.trainers, state["layers"]):
            trainer.sae.load_state_dict(layer["transcoder"])
            trainer.opt.load_state_dict(layer["optimizer"])
            trainer.since_fired, trainer.steps = layer["since_fired"], steps


class LayerStepper(Protocol):
    """What :func:`train_loop` steps: ``init_b_dec(ys)`` on the first batch of every layer's targets,
    ``step(xs, ys)`` on one batch of every layer's MLP inputs and outputs ``[batch, d_model]`` (returning
    each output layer's FVU before the step), and ``state()``/``load_state(state, steps)`` for checkpoints."""

    def init_b_dec(self, ys: list[torch.Tensor]) -> None: ...

    def step(self, xs: list[torch.Tensor], ys: list[torch.Tensor]) -> list[torch.Tensor]: ...

    def state(self) -> dict[str, Any]: ...

    def load_state(self, state: dict[str, Any], steps: int) -> None: ...


def train_loop(
    model: HookedGPT2,
    cfg: TranscoderTrainConfig,
    windows: torch.Tensor,
    stepper: LayerStepper,
    total: int,
    checkpoint: str | Path | None,
    progress: bool | None,
    desc: str,
) -> None:
    """The activation stream, checkpoints and progress of :func:`train_transcoders` (and of the cross-layer
    transcoder's training, :func:`gpt2_interp.graphs.clt.train_cross_layer_transcoder`): forward passes fill
    one store per layer, each store shuffled by one permutation shared by every layer's input and output,
    and ``stepper`` steps on every layer's batch at once, ``total`` steps in all."""
    order = [i for _ in range(cfg.epochs) for i in range(0, len(windows), cfg.forward_batch)]
    steps, first, saved = 0, 0, 0
    fingerprint = weights_fingerprint(model)
    ckpt = Path(checkpoint) / CHECKPOINT_FILE if checkpoint is not None else None
    if ckpt is not None and ckpt.is_file():
        state = load_tree(ckpt, kind="transcoder training checkpoint", map_location=model.device)
        if state["config"] != asdict(cfg) or state["weights"] != fingerprint:
            raise ValueError(f"{ckpt} was written by a run with other settings or base weights; use another folder")
        stepper.load_state(state, int(state["steps"]))
        steps = saved = int(state["steps"])
        first = int(state["chunks_read"])
    n_layers = model.cfg.n_layer
    stores: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(n_layers)]
    have = 0
    passes = min(len(order), first + _passes_needed(model, cfg, windows.shape[1], total - steps))
    bar = progress_bar(
        total=passes, initial=first, enabled=progress, desc=f"{desc} (forward passes)", unit="pass", smoothing=0
    )
    for n_read in range(first, len(order)):
        if steps >= total:
            break
        bar.update(1)
        start = order[n_read]
        for L, pair in enumerate(_cache_layers(model, windows[start : start + cfg.forward_batch])):
            stores[L].append(pair)
        have += len(stores[0][-1][0])
        if have < cfg.buffer_tokens and n_read < len(order) - 1:
            continue
        perm = torch.randperm(have, generator=torch.Generator().manual_seed(cfg.seed + steps)).to(model.device)
        n_batches = min(have // cfg.batch_size, total - steps)
        xs, ys = [], []
        for L in range(n_layers):  # each layer's store freed as it is shuffled: one copy at a time
            xs.append(torch.cat([p[0] for p in stores[L]])[perm])
            ys.append(torch.cat([p[1] for p in stores[L]])[perm])
            stores[L] = []
        if steps == 0 and n_batches:
            stepper.init_b_dec([y[: cfg.batch_size] for y in ys])
        fvus: list[torch.Tensor] = []
        for b in range(n_batches):
            sl = slice(b * cfg.batch_size, (b + 1) * cfg.batch_size)
            fvus = stepper.step([x[sl] for x in xs], [y[sl] for y in ys])
        steps += n_batches
        if fvus:
            last = [float(f) for f in fvus]
            bar.set_postfix(step=f"{steps}/{total}", fvu=f"{sum(last) / len(last):.3f}", worst=f"{max(last):.3f}")
        del xs, ys
        have = 0
        if ckpt is not None and (steps - saved >= cfg.checkpoint_every or steps >= total):
            state = {"steps": steps, "chunks_read": n_read + 1, "config": asdict(cfg), "weights": fingerprint}
            save_tree(ckpt, stepper.state() | state, kind="transcoder training checkpoint")
            saved = steps
    bar.total = bar.n  # the passes were an estimate: the work is done
    bar.close()


def _passes_needed(model: HookedGPT2, cfg: TranscoderTrainConfig, n_pos: int, steps: int) -> int:
    """Forward passes of ``cfg.forward_batch`` windows of ``n_pos`` tokens that ``steps`` more training steps
    read: each store takes the passes that fill ``cfg.buffer_tokens`` (BOS left out) and gives the whole
    batches they hold."""
    per_pass = cfg.forward_batch * (n_pos - (1 if model.tokenizer.bos_id is not None else 0))
    per_store = max(1, -(-cfg.buffer_tokens // per_pass))
    batches = max(1, per_store * per_pass // cfg.batch_size)
    return -(-steps // batches) * per_store


@boundary
@dataclass
class TranscoderMetrics(Result):
    """How well each layer's transcoder predicts its MLP's output on held-out windows: ``variance_explained``
    (``1 − Σ‖y − ŷ‖² / Σ‖y − ȳ‖²`` per layer), ``l0`` (mean active features per token), ``dead``
    (the fraction of features that never fired on these tokens), ``tokens`` evaluated; and for the whole set, the
    model's next-token loss (nats, BOS's prediction included) ``clean_loss``, ``replaced_loss`` with every MLP's
    output replaced by its transcoder's prediction at once (each layer reading the replaced stream), and
    ``replaced_with_errors_loss`` where each prediction carries its error term ``y − ŷ`` from the clean run (the
    model's own loss up to float error: a check that the replacement is exact)."""

    result_kind = "transcoder_metrics"
    variance_explained: list[float] = field(default_factory=list)
    l0: list[float] = field(default_factory=list)
    dead: list[float] = field(default_factory=list)
    tokens: int = 0
    clean_loss: float = float("nan")
    replaced_loss: float = float("nan")
    replaced_with_errors_loss: float = float("nan")


def _replaced_logits(
    model: HookedGPT2,
    transcoders: TranscoderSet | CrossLayerTranscoder,
    rows: torch.Tensor,
    errors: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Logits with every MLP output replaced by its transcoders' prediction from the MLP inputs of the same run
    (a cross-layer transcoder's from every layer up to it), plus ``errors[L]`` (``[rows, pos, d_model]``) where
    given."""
    inputs: dict[int, torch.Tensor] = {}
    acts: list[torch.Tensor] = []

    def read(x: torch.Tensor, hook: Any) -> None:
        L = int(hook.name.split(".")[1])
        inputs[L] = x.float()
        acts.append(transcoders.encode(L, inputs[L]))

    def replace(y: torch.Tensor, hook: Any) -> torch.Tensor:
        L = int(hook.name.split(".")[1])
        pred = transcoders.reconstruct(L, acts, inputs[L], None if errors is None else errors[L])
        return pred.to(y.dtype)

    hooks: list[tuple[str, Any]] = [(INPUT_HOOK.format(layer=L), read) for L in range(transcoders.n_layers)]
    hooks += [(TARGET_HOOK.format(layer=L), replace) for L in range(transcoders.n_layers)]
    return model.run_with_hooks(rows, fwd_hooks=hooks)


def _errors(transcoders: TranscoderSet | CrossLayerTranscoder, cache: Any) -> list[torch.Tensor]:
    """Each layer's error ``y − ŷ`` ``[rows, pos, d_model]`` from a clean :func:`_layers_run` cache."""
    n = transcoders.n_layers
    xs = [cache[INPUT_HOOK.format(layer=L)].float() for L in range(n)]
    acts = [transcoders.encode(L, x) for L, x in enumerate(xs)]
    return [cache[TARGET_HOOK.format(layer=L)].float() - transcoders.reconstruct(L, acts, xs[L]) for L in range(n)]


@boundary
@torch.no_grad()
def evaluate_transcoders(
    model: HookedGPT2, transcoders: TranscoderSet | CrossLayerTranscoder, windows: torch.Tensor
) -> TranscoderMetrics:
    """:class:`TranscoderMetrics` of ``transcoders`` (one per layer, or a cross-layer transcoder, whose
    prediction of layer ``L``'s MLP output sums the features of every layer up to ``L``) on token ``windows``
    ``[n, pos]`` (BOS left out)."""
    windows = check_token_windows(windows, "windows")
    n = transcoders.n_layers
    err, l0 = [0.0] * n, [0.0] * n
    var_parts: list[list[torch.Tensor]] = [[] for _ in range(n)]
    fired = [torch.zeros(transcoders.d_sae(L), dtype=torch.bool, device=model.device) for L in range(n)]
    tokens = 0
    losses = {"clean": 0.0, "replaced": 0.0, "errors": 0.0}
    for start in range(0, len(windows), 32):
        rows = windows[start : start + 32].to(model.device)
        clean, cache = _layers_run(model, rows, logits=True)  # one clean pass: the loss, the errors, the pairs
        assert clean is not None
        losses["clean"] += float(model.loss(clean, rows)) * len(rows)
        losses["replaced"] += float(model.loss(_replaced_logits(model, transcoders, rows), rows)) * len(rows)
        with_errors = _replaced_logits(model, transcoders, rows, _errors(transcoders, cache))
        losses["errors"] += float(model.loss(with_errors, rows)) * len(rows)
        pairs = _layer_pairs(model, cache)
        acts = [transcoders.encode(L, x) for L, (x, _) in enumerate(pairs)]
        for L, (x, y) in enumerate(pairs):
            a = acts[L]
            err[L] += float((y - transcoders.reconstruct(L, acts, x)).pow(2).sum())
            var_parts[L].append(y)
            l0[L] += float((a > 0).sum())
            fired[L] |= (a > 0).any(0)
            if L == 0:
                tokens += len(x)
    ve = []
    for L in range(n):
        y = torch.cat(var_parts[L])
        ve.append(1 - err[L] / float((y - y.mean(0)).pow(2).sum()))
    return TranscoderMetrics(
        variance_explained=ve,
        l0=[v / max(tokens, 1) for v in l0],
        dead=[1 - float(f.float().mean()) for f in fired],
        tokens=tokens,
        clean_loss=losses["clean"] / len(windows),
        replaced_loss=losses["replaced"] / len(windows),
        replaced_with_errors_loss=losses["errors"] / len(windows),
    )


__all__ = [
    "Transcoder",
    "TranscoderMetrics",
    "TranscoderSet",
    "TranscoderTrainConfig",
    "evaluate_transcoders",
    "new_transcoders",
    "train_transcoders",
]
