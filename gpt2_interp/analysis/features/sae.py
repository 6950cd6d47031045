"""Sparse autoencoders (SAEs) over one hook point's activations: the module, its hook points, its files.

An SAE with ``d_sae`` latents reads an activation ``x`` ``[..., d_in]`` at ``hook_name``:

- pre-activations ``h = (x − b_dec) W_enc + b_enc`` ``[..., d_sae]`` (hook ``hook_sae_acts_pre``),
- latents ``z = σ(h)`` (hook ``hook_sae_acts_post``), where σ is the architecture's:
  ``"topk"`` keeps the ``k`` largest of each row, ReLU'd (Gao et al. 2024); ``"batchtopk"`` keeps the
  ``k × rows`` largest of a training batch and, in use, every ``h > threshold`` (a JumpReLU, as
  SAELens saves BatchTopK SAEs); ``"relu"`` is ReLU, trained with an L1 penalty (the classic baseline),
- reconstruction ``x̂ = z W_dec + b_dec`` (hook ``hook_sae_recons``), decoder rows of unit norm,
- and, spliced with the error term, ``x̂ + (x − x̂)`` (hook ``hook_sae_error`` on ``x − x̂``; its
  gradient bypasses the latents, so attribution to ``hook_sae_acts_post`` is the latents' own).

Parameter names, hook names and the file layout (a folder with ``cfg.json`` and
``sae_weights.safetensors``) are SAELens's, so its ``SAE.load_from_disk`` reads our files and
:meth:`SAE.load` reads its. Our files also carry a sha256 digest over weights and config and the base
model's weights fingerprint: a damaged file, or one meant for other weights, is refused.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from torch import nn

from ...core.boundary import boundary
from ...core.checks import check_choice, check_count
from ...io.files import FileFormatError, check_finite, read_json
from ...io.integrity import IntegrityError, load_checked
from ...model.fingerprint import weights_fingerprint
from ...model.hooks import HookPoint
from .activations import hook_width

if TYPE_CHECKING:
    from ...model.hooked_gpt2 import HookedGPT2

Architecture = Literal["topk", "batchtopk", "relu"]
ARCHITECTURES: tuple[str, ...] = ("topk", "batchtopk", "relu")
CFG_FILE, WEIGHTS_FILE = "cfg.json", "sae_weights.safetensors"
FORMAT = "gpt2-interp-sae/1"
SAELENS_FORMAT = "6.0.0"  # the SAELens version whose cfg.json layout SAE.save writes


@boundary
@dataclass
class SAEConfig:
    """What an SAE is: ``d_in`` (the activation's width), ``d_sae`` (the number of latents),
    ``hook_name`` (where it reads, e.g. ``blocks.3.hook_resid_post``), ``architecture`` (``"topk"``,
    ``"batchtopk"`` or ``"relu"``), ``k`` (active latents per token for the top-k kinds), and
    ``model_name`` (the base model, for messages). ``base_fingerprint``: the base model's weights
    fingerprint (empty: unknown, e.g. a file from SAELens). ``training``: what it was trained on, as
    :func:`~gpt2_interp.analysis.features.sae_train.train_sae` records it (the text source, the windows
    read and the ones held out, the positions left out; None: unknown)."""

    d_in: int
    d_sae: int
    hook_name: str
    architecture: Architecture = "topk"
    k: int = 32
    model_name: str = ""
    base_fingerprint: str = ""
    training: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        check_count(self.d_in, "d_in")
        check_count(self.d_sae, "d_sae")
        check_choice(self.architecture, "architecture", ARCHITECTURES)
        check_count(self.k, "k")
        if self.architecture != "relu" and not 1 <= self.k <= self.d_sae:
            raise ValueError(f"k must be in [1, d_sae={self.d_sae}] for a {self.architecture} SAE, got {self.k}")


@boundary
class SAE(nn.Module):
    """A sparse autoencoder (see the module's docstring for the maths) with SAELens's parameters
    ``W_enc [d_in, d_sae]``, ``b_enc [d_sae]``, ``W_dec [d_sae, d_in]``, ``b_dec [d_in]`` (and a
    ``threshold [d_sae]`` buffer for BatchTopK) and hook points ``hook_sae_input``,
    ``hook_sae_acts_pre``, ``hook_sae_acts_post``, ``hook_sae_recons``, ``hook_sae_error``,
    ``hook_sae_output``. ``cfg``: its :class:`SAEConfig`; ``seed`` seeds the initialisation (decoder
    rows random unit vectors, encoder their transpose, biases zero, as Gao et al.).

    Spliced into a model (``model.splice(sae)`` or :func:`gpt2_interp.model.splice.spliced`) its hook
    points join the model's as ``{hook_name}.hook_sae_acts_post`` etc."""

    threshold: torch.Tensor | None  # a registered buffer (BatchTopK only)

    def __init__(self, cfg: SAEConfig, seed: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        w_dec = torch.randn(cfg.d_sae, cfg.d_in, generator=g)
        w_dec /= w_dec.norm(dim=-1, keepdim=True)
        self.W_dec = nn.Parameter(w_dec)
        self.W_enc = nn.Parameter(w_dec.T.clone())
        self.b_enc = nn.Parameter(torch.zeros(cfg.d_sae))
        self.b_dec = nn.Parameter(torch.zeros(cfg.d_in))
        self.register_buffer("threshold", torch.zeros(cfg.d_sae) if cfg.architecture == "batchtopk" else None)
        self.hook_sae_input = HookPoint("hook_sae_input")
        self.hook_sae_acts_pre = HookPoint("hook_sae_acts_pre")
        self.hook_sae_acts_post = HookPoint("hook_sae_acts_post")
        self.hook_sae_recons = HookPoint("hook_sae_recons")
        self.hook_sae_error = HookPoint("hook_sae_error")
        self.hook_sae_output = HookPoint("hook_sae_output")

    # ------------------------------------------------------------------ the maths
    @property
    def hook_name(self) -> str:
        """The hook point the SAE reads (and, spliced, replaces)."""
        return self.cfg.hook_name

    @property
    def d_sae(self) -> int:
        """The number of latents."""
        return self.cfg.d_sae

    def pre_acts(self, x: torch.Tensor) -> torch.Tensor:
        """Pre-activations ``(x − b_dec) W_enc + b_enc`` ``[..., d_sae]`` of activations ``x`` ``[..., d_in]``."""
        self._check_input(x)
        x = self.hook_sae_input(x.to(self.W_enc.dtype))
        return self.hook_sae_acts_pre((x - self.b_dec) @ self.W_enc + self.b_enc)

    def activate(self, pre: torch.Tensor, batch: bool = False) -> torch.Tensor:
        """Latents from pre-activations ``[..., d_sae]``. ``batch``: a BatchTopK SAE keeps the
        ``k × rows`` largest over the whole batch (training); otherwise its threshold applies."""
        arch = self.cfg.architecture
        if arch == "relu":
            return pre.relu()
        if arch == "batchtopk":
            if not batch:
                assert self.threshold is not None, "a BatchTopK SAE has a threshold buffer"
                return pre.relu() * (pre > self.threshold)
            flat = pre.reshape(-1)
            n = min(self.cfg.k * (flat.numel() // self.cfg.d_sae), flat.numel())
            vals, idx = flat.topk(n, sorted=False)
            return torch.zeros_like(flat).scatter(0, idx, vals.relu()).view_as(pre)
        vals, idx = pre.topk(self.cfg.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter(-1, idx, vals.relu())

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Latents ``[..., d_sae]`` of activations ``x`` ``[..., d_in]`` (through ``hook_sae_acts_post``)."""
        return self.hook_sae_acts_post(self.activate(self.pre_acts(x)))

    def skip(self, x: torch.Tensor) -> torch.Tensor | None:
        """A linear term of the input added to the reconstruction (None for an SAE; a transcoder's
        optional ``x W_skipᵀ``)."""
        return None

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Reconstruction ``z W_dec + b_dec`` ``[..., d_in]`` of latents ``z`` ``[..., d_sae]``
        (through ``hook_sae_recons``)."""
        return self.hook_sae_recons(z @ self.W_dec + self.b_dec)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The reconstruction ``[..., d_in]`` of ``x`` ``[..., d_in]``."""
        return self.decode(self.encode(x))

    def splice_hook_points(self) -> dict[str, HookPoint]:
        """The hook points by local name in forward order (the splice protocol of :mod:`gpt2_interp.model.splice`)."""
        names = ("input", "acts_pre", "acts_post", "recons", "error", "output")
        return {f"hook_sae_{n}": getattr(self, f"hook_sae_{n}") for n in names}

    def splice_forward(self, x: torch.Tensor, use_error_term: bool) -> torch.Tensor:
        """What flows on when spliced in: the reconstruction, plus the error term ``x − x̂`` (computed
        without the SAE's hooks, gradient passing to ``x`` only) when ``use_error_term``. In the
        activation's dtype; ``[..., d_in]`` like ``x``."""
        out = self(x)
        if use_error_term:
            with torch.no_grad():
                clean = self._clean_recons(x)
            out = out + self.hook_sae_error(x.to(clean.dtype) - clean)
        return self.hook_sae_output(out).to(x.dtype)

    def _clean_recons(self, x: torch.Tensor) -> torch.Tensor:
        z = self.activate((x.to(self.W_enc.dtype) - self.b_dec) @ self.W_enc + self.b_enc)
        return z @ self.W_dec + self.b_dec

    def _check_input(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.cfg.d_in:
            raise ValueError(
                f"this SAE reads {self.cfg.hook_name} of width d_in={self.cfg.d_in}; got an activation of shape "
                f"{tuple(x.shape)}"
            )

    @torch.no_grad()
    def normalize_decoder(self) -> None:
        """Scale every decoder row to unit norm (in place)."""
        self.W_dec.div_(self.W_dec.norm(dim=-1, keepdim=True).clamp_min(1e-12))

    def check_model(self, model: HookedGPT2) -> None:
        """Raise a ValueError when ``model`` cannot host this SAE: no hook point ``hook_name``, an
        activation width that is not ``d_in``, or (for an SAE saved with one) weights whose
        fingerprint differs from the base model's."""
        made_for = self.cfg.model_name or "another model"
        if self.cfg.hook_name not in model.hook_dict:
            raise ValueError(
                f"this SAE was made for {made_for} at {self.cfg.hook_name!r}; {model.cfg.name} has no hook point of "
                "that name"
            )
        width = hook_width(model, self.cfg.hook_name)
        if width is not None and width != self.cfg.d_in:
            raise ValueError(
                f"this SAE was made for {made_for}, whose {self.cfg.hook_name} is {self.cfg.d_in} wide; "
                f"{model.cfg.name}'s is {width}: load it with the model it was trained on"
            )
        fp = self.cfg.base_fingerprint
        if fp and weights_fingerprint(model) != fp:
            raise ValueError(
                f"this SAE was trained on {self.cfg.model_name or 'another model'} with weights {fp[:12]}…, not on "
                f"this {model.cfg.name} (weights {weights_fingerprint(model)[:12]}…); load it with that model"
            )

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        """A folder in SAELens's layout (``cfg.json``, ``sae_weights.safetensors``) that SAELens's
        ``SAE.load_from_disk`` reads; the weights file's header holds a sha256 digest over the weights
        and the config, which states the base model's fingerprint. Returns the folder."""
        from ...io.integrity import save_checked

        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        cfg_text = json.dumps(self.saelens_config(), indent=1, sort_keys=True)
        tensors = self.saelens_state_dict()
        check_finite(tensors, folder, "SAE")
        save_checked(folder / WEIGHTS_FILE, tensors, {"format": FORMAT, "cfg": cfg_text})
        (folder / CFG_FILE).write_text(cfg_text + "\n")
        return folder

    def saelens_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights by SAELens's names (a BatchTopK SAE's threshold as a JumpReLU ``threshold``)."""
        sd = {n: p.detach() for n, p in (("W_enc", self.W_enc), ("b_enc", self.b_enc))}
        sd |= {"W_dec": self.W_dec.detach(), "b_dec": self.b_dec.detach()}
        if self.threshold is not None:
            sd["threshold"] = self.threshold.detach()
        return sd

    def saelens_config(self) -> dict[str, Any]:
        """The ``cfg.json`` SAELens reads: its architecture (``topk``, ``jumprelu`` for BatchTopK,
        ``standard`` for ReLU), sizes, and ``metadata`` with the hook name, model name and our config."""
        arch = {"topk": "topk", "batchtopk": "jumprelu", "relu": "standard"}[self.cfg.architecture]
        cfg: dict[str, Any] = {
            "architecture": arch,
            "d_in": self.cfg.d_in,
            "d_sae": self.cfg.d_sae,
            "dtype": str(self.W_enc.dtype).removeprefix("torch."),
            "device": "cpu",
            "apply_b_dec_to_input": True,
            "normalize_activations": "none",
            "reshape_activations": "none",
            "metadata": {
                "sae_lens_version": SAELENS_FORMAT,  # the config layout written (SAELens ≥ 6 reads it as such)
                "hook_name": self.cfg.hook_name,
                "model_name": self.cfg.model_name,
                "gpt2_interp": asdict(self.cfg),
            },
        }
        if arch == "topk":
            cfg |= {"k": self.cfg.k, "rescale_acts_by_decoder_norm": False}
        return cfg

    @staticmethod
    def load(path: str | Path, model: HookedGPT2 | None = None) -> SAE:
        """An SAE from a folder of ``cfg.json`` + ``sae_weights.safetensors``: ours (digest verified,
        refused with :class:`~gpt2_interp.io.integrity.IntegrityError` when damaged or when its
        ``cfg.json`` was changed) or SAELens's (architectures ``topk``, ``standard``, ``jumprelu``
        without input normalisation; no digest to verify; a TopK SAE that rescales by the decoder norm has
        the norms folded in, so the latents are SAELens's). With ``model``, also refused (ValueError)
        when the model cannot host it (:meth:`check_model`: hook, width, base weights)."""
        folder = Path(path)
        cfg_path, w_path = folder / CFG_FILE, folder / WEIGHTS_FILE
        for p in (cfg_path, w_path):
            if not p.is_file():
                raise FileNotFoundError(
                    f"no SAE at {folder}: {p.name} is missing (an SAE folder holds {CFG_FILE} and {WEIGHTS_FILE})"
                )
        from safetensors import safe_open

        try:
            with safe_open(str(w_path), framework="pt") as f:
                ours = (f.metadata() or {}).get("format") == FORMAT
        except Exception as e:  # safetensors' own error types: not a safetensors file (a pickle, truncated, …)
            raise FileFormatError(f"{w_path} is not a safetensors file of SAE weights ({type(e).__name__})") from e
        cfg_json = read_json(cfg_path, "SAE config", digest=False)
        if ours:
            tensors, meta, _ = load_checked(w_path, kind="SAE", allow_unverified=False)
            if json.loads(meta["cfg"]) != cfg_json:
                raise IntegrityError(f"{cfg_path} differs from the config the SAE was saved with; restore it")
        else:
            try:
                from safetensors.torch import load_file

                tensors = load_file(str(w_path))
            except Exception as e:  # safetensors' own error types
                raise FileFormatError(f"{w_path} is not a safetensors file of SAE weights ({type(e).__name__})") from e
        sae = SAE(_config_from_saelens(cfg_json, cfg_path))
        expected = sae.saelens_state_dict()
        missing = [n for n in expected if n not in tensors]
        if missing:
            raise FileFormatError(f"{w_path} lacks the SAE weights {missing} ({sae.cfg.architecture} SAE)")
        extra = sorted(set(tensors) - set(expected))
        if extra:
            raise FileFormatError(
                f"{w_path} holds tensors a {sae.cfg.architecture} SAE does not have: {extra} "
                f"(expected {sorted(expected)}); the file is not this config's SAE"
            )
        check_finite(tensors, w_path, "SAE")
        with torch.no_grad():
            for n, t in sae.saelens_state_dict().items():
                if tensors[n].shape != t.shape:
                    raise ValueError(
                        f"{w_path}: {n} has shape {tuple(tensors[n].shape)}, the config says {tuple(t.shape)}"
                    )
                t.copy_(tensors[n].to(t.dtype))
            if not ours and cfg_json.get("rescale_acts_by_decoder_norm"):
                # SAELens selects and scales latents by h·‖W_dec row‖: fold the norms in (its fold_W_dec_norm)
                norm = sae.W_dec.norm(dim=-1).clamp_min(1e-8)
                sae.W_dec.div_(norm[:, None])
                sae.W_enc.mul_(norm)
                sae.b_enc.mul_(norm)
        if model is not None:
            sae.check_model(model)
        return sae


def _config_from_saelens(d: dict[str, Any], where: Path) -> SAEConfig:
    meta = d.get("metadata") or {}
    if isinstance(meta.get("gpt2_interp"), dict):
        ours = {f.name for f in fields(SAEConfig)}
        need = [f.name for f in fields(SAEConfig) if f.default is MISSING and f.default_factory is MISSING]
        missing = [k for k in need if k not in meta["gpt2_interp"]]
        if missing:
            raise FileFormatError(f"{where}: metadata.gpt2_interp lacks the field(s) {', '.join(missing)}")
        return SAEConfig(**{k: v for k, v in meta["gpt2_interp"].items() if k in ours})
    arch: Architecture | None = {"topk": "topk", "jumprelu": "batchtopk", "standard": "relu"}.get(  # type: ignore[assignment]
        d.get("architecture", "standard")
    )
    if arch is None:
        raise ValueError(
            f"{where}: SAE architecture {d.get('architecture')!r} is not read here (topk, jumprelu, standard are)"
        )
    if d.get("normalize_activations", "none") != "none" or d.get("reshape_activations", "none") != "none":
        raise ValueError(f"{where}: SAEs with input normalisation or reshaping are not read here")
    if not d.get("apply_b_dec_to_input", True):
        raise ValueError(f"{where}: SAEs with apply_b_dec_to_input=false are not read here")
    hook = meta.get("hook_name") or d.get("hook_name")
    if not hook:
        raise ValueError(f"{where}: the config names no hook point (metadata.hook_name)")
    missing = [f for f in ("d_in", "d_sae") if f not in d]
    if missing:
        raise FileFormatError(f"{where}: the SAE config lacks the field(s) {', '.join(missing)}")
    for f in ("d_in", "d_sae", *(("k",) if arch == "topk" and "k" in d else ())):
        if isinstance(d[f], bool) or not isinstance(d[f], int) or d[f] < 1:
            raise FileFormatError(f"{where}: the SAE config's {f} is {d[f]!r}; a positive integer is expected")
    k = int(d.get("k", 1)) if arch == "topk" else 1
    return SAEConfig(
        d_in=int(d["d_in"]),
        d_sae=int(d["d_sae"]),
        hook_name=hook,
        architecture=arch,
        k=k,
        model_name=meta.get("model_name") or "",
    )


@boundary
def load_sae(path: str | Path, model: HookedGPT2 | None = None) -> SAE:
    """:meth:`SAE.load`: an SAE from a folder (ours or SAELens's), checked against ``model`` when given."""
    return SAE.load(path, model)


__all__ = ["ARCHITECTURES", "SAE", "SAEConfig", "load_sae"]
