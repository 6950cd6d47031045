"""The local replacement model of one prompt: every MLP replaced by its transcoder plus an error term,
attention patterns and norm scales frozen from the clean run.

For a prompt of ``pos`` tokens the clean run fixes, per layer ``L``: the attention patterns, every norm's
scale (``hook_scale``: ``ln1``, ``ln2``, ``ln_final`` and any post-norms), the transcoder features
``a_L = σ(x_L W_enc + b_enc)`` ``[pos, d_tc]`` and the error ``e_L = mlp_out_L − T_L(x_L)`` ``[pos, d_model]``.
The replacement model then runs the model with

- each norm's scale and each attention pattern replaced by the clean one (so a norm is ``(x − x̄)/s · w + b``
  with ``s`` a constant, and attention is ``pattern · V(x)`` with the pattern a constant),
- each ``hook_mlp_out`` replaced by ``a_L W_dec + b_dec + x_L W_skipᵀ + e_L`` with ``a_L`` and ``e_L`` inputs
  (with a cross-layer transcoder, :mod:`gpt2_interp.graphs.clt`, the sum ``Σ_{ℓ ≤ L} a_ℓ W_dec[ℓ][:, L − ℓ]`` of
  every layer's features up to ``L`` instead of ``a_L W_dec``, and ``e_L`` the MLP output minus that sum's
  prediction; both kinds are read through their shared layer-wise face).

Every quantity downstream is then an affine function of the sources: the token embeddings, the feature
activations and the error terms (biases, positional embeddings and the transcoders' ``b_dec`` are the
constant part). With the clean inputs it reproduces the model's logits on that prompt exactly (up to
float rounding). Gradients of a read-out with respect to a writer's output, taken through this model, are
the direct effects of :mod:`gpt2_interp.graphs.attribution`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ..core.boundary import boundary
from .clt import CrossLayerTranscoder
from .transcoder import INPUT_HOOK, TARGET_HOOK, TranscoderSet

if TYPE_CHECKING:
    from ..model.hooked_gpt2 import HookedGPT2


@boundary
@dataclass
class ReplacementRun:
    """One forward pass of the replacement model, its graph kept for gradients: ``logits``
    ``[batch, pos, d_vocab]`` (None when run without the unembedding); ``final`` ``[batch, pos, d_model]``
    the unembedding's input (``ln_final``'s output, its scale frozen); ``mlp_inputs[L]``
    ``[batch, pos, d_model]`` (``blocks.L.ln2.hook_normalized``,
    where layer ``L``'s features read: pre-activations are ``mlp_inputs[L] W_enc + b_enc``);
    ``mlp_probes[L]`` and ``embed_probe`` ``[batch, pos, d_model]``: zero leaves added to each layer's
    MLP output and to the token embeddings, whose gradients are those with respect to what the writers add."""

    logits: torch.Tensor | None
    final: torch.Tensor
    mlp_inputs: list[torch.Tensor]
    mlp_probes: list[torch.Tensor]
    embed_probe: torch.Tensor

    def pre_acts(self, transcoders: TranscoderSet | CrossLayerTranscoder) -> list[torch.Tensor]:
        """Each layer's feature pre-activations ``[batch, pos, d_tc]`` in this run."""
        return [transcoders.pre_acts(L, x) for L, x in enumerate(self.mlp_inputs)]


@boundary
class ReplacementModel:
    """The replacement model of ``model`` with ``transcoders`` on the prompt ``tokens`` ``[pos]`` (see the
    module's docstring). Attributes from the clean run: ``logits`` ``[pos, d_vocab]``, ``activations[L]``
    ``[pos, d_tc]`` (features), ``errors[L]`` ``[pos, d_model]``, ``embed`` ``[pos, d_model]`` (what
    ``hook_embed`` writes), ``mlp_inputs[L]`` ``[pos, d_model]``. Models whose blocks read their MLP from a
    hook other than ``blocks.L.ln2.hook_normalized`` (parallel one-norm, post-norm-only) are refused."""

    def __init__(
        self, model: HookedGPT2, transcoders: TranscoderSet | CrossLayerTranscoder, tokens: torch.Tensor
    ) -> None:
        if tokens.dim() != 1 or tokens.numel() < 1 or tokens.is_floating_point():
            raise ValueError(f"tokens must be one prompt's token ids [pos], got shape {tuple(tokens.shape)}")
        transcoders.check_model(model)
        if model.cfg.final_softcap is not None:
            raise ValueError(f"{model.cfg.name} caps its logits with tanh: its replacement model is not linear")
        self.model, self.transcoders = model, transcoders
        self.tokens = tokens.to(model.device)
        n = model.cfg.n_layer
        ins, outs = [INPUT_HOOK.format(layer=L) for L in range(n)], [TARGET_HOOK.format(layer=L) for L in range(n)]
        self.frozen = [h for h in model.hook_dict if h.endswith(("hook_scale", "attn.hook_pattern"))]

        def wanted(name: str) -> bool:
            return name in self.frozen or name in ins or name in outs or name == "hook_embed"

        with torch.no_grad():
            logits, cache = model.run_with_cache(self.tokens[None], names_filter=wanted)
        self.cache = {h: cache[h] for h in self.frozen}
        self.logits = logits[0].to(torch.promote_types(logits.dtype, torch.float32))  # float32 or finer
        self.embed = cache["hook_embed"][0]
        self.mlp_inputs = [cache[h][0] for h in ins]
        with torch.no_grad():
            self.activations = [transcoders.encode(L, x) for L, x in enumerate(self.mlp_inputs)]
            self.errors = [
                cache[o][0] - transcoders.reconstruct(L, self.activations, x)
                for L, (x, o) in enumerate(zip(self.mlp_inputs, outs))
            ]

    @property
    def n_pos(self) -> int:
        """The prompt's length."""
        return int(self.tokens.numel())

    def run(
        self,
        batch: int = 1,
        activations: list[torch.Tensor] | None = None,
        errors: list[torch.Tensor] | None = None,
        embed: torch.Tensor | None = None,
        grad: bool = True,
        unembed: bool = True,
        live: Callable[[int, torch.Tensor], torch.Tensor] | None = None,
    ) -> ReplacementRun:
        """The replacement model's forward pass on ``batch`` copies of the prompt: a :class:`ReplacementRun`.
        ``activations[L]`` ``[pos, d_tc]`` or ``[batch, pos, d_tc]``, ``errors[L]`` ``[(batch,) pos, d_model]``
        and ``embed`` ``[(batch,) pos, d_model]`` replace the clean sources (None: the clean ones); ``grad``:
        keep the graph and make the probes require gradients; ``unembed``: compute the logits (False: stop at
        the unembedding's input, ``final``). ``live``: each layer's features are computed in this run from its
        own MLP input (the transcoder's nonlinearity live, as in the model; attention and norms stay frozen)
        and ``live(layer, a)`` (``a`` ``[batch, pos, d_tc]``) returns the ones used, e.g. with some set to other
        values; ``activations`` is then not read."""
        tc = self.transcoders
        acts = self.activations if activations is None else activations
        errs = self.errors if errors is None else errors
        emb = self.embed if embed is None else embed
        n, shape = self.model.cfg.n_layer, (batch, self.n_pos, self.model.cfg.d_model)
        dev = self.model.device
        probes = [torch.zeros(shape, device=dev, dtype=self.model.dtype, requires_grad=grad) for _ in range(n)]
        embed_probe = torch.zeros(shape, device=dev, dtype=self.model.dtype, requires_grad=grad)
        inputs: list[torch.Tensor] = []

        def frozen(x: torch.Tensor, hook: Any) -> torch.Tensor:
            c = self.cache[hook.name]
            return c.expand(x.shape[0], *c.shape[1:]).to(x.dtype)

        def embed_hook(x: torch.Tensor, hook: Any) -> torch.Tensor:
            return (emb.expand(x.shape).to(x.dtype) + embed_probe).to(x.dtype)

        def read_input(x: torch.Tensor, hook: Any) -> torch.Tensor:
            inputs.append(x)
            return x

        used: list[torch.Tensor] = []  # each layer's features in this run, in layer order

        def mlp_out(layer: int) -> Any:
            def hook(x: torch.Tensor, hook: Any) -> torch.Tensor:
                xin = inputs[layer]
                used.append(acts[layer] if live is None else live(layer, tc.encode(layer, xin)))
                out = tc.reconstruct(layer, used, xin, errs[layer])
                return (out.expand(x.shape) + probes[layer]).to(x.dtype)

            return hook

        hooks: list[tuple[str, Any]] = [(h, frozen) for h in self.frozen]
        hooks += [("hook_embed", embed_hook)]
        hooks += [(INPUT_HOOK.format(layer=L), read_input) for L in range(n)]
        hooks += [(TARGET_HOOK.format(layer=L), mlp_out(L)) for L in range(n)]
        tokens = self.tokens[None].expand(batch, -1)
        with torch.set_grad_enabled(grad), self.model.hooks(hooks):
            final = self.model.ln_final(self.model(tokens, stop_at_layer=n))
            logits = self.model.unembed(final) if unembed else None
            if logits is not None:  # float32 or finer
                logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        return ReplacementRun(logits, final, inputs, probes, embed_probe)


__all__ = ["ReplacementModel", "ReplacementRun"]
