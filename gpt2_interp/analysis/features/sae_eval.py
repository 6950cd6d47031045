"""What the field reports about an SAE, measured on held-out token windows.

- **L0**: latents active per token (mean).
- **Variance explained**: ``1 − FVU``, FVU = Σ‖x − x̂‖² / Σ‖x − x̄‖² over all evaluated tokens.
- **Cross-entropy loss recovered**: ``(CE_zero − CE_spliced) / (CE_zero − CE_clean)``, where
  ``CE_spliced`` runs the model with the reconstruction in place of the activation, ``CE_zero`` with
  the activation zeroed, ``CE_clean`` untouched (SAELens's and Gao et al.'s measure). BOS positions keep
  their clean activation in both ablations (an SAE is trained without them; see :mod:`.sae_train`).
- **Dead** and **dense** latents: the fractions that never fire on the evaluated tokens, and that fire on
  more than ``dense_above`` of them (default 10%).

With ``outlier_ratio`` (an SAE trained without norm outliers, see
:func:`~gpt2_interp.analysis.features.sae_train.norm_outliers`) those positions are treated as BOS is: left
out of every metric but the cross-entropies, and kept at their clean activation in both ablations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ...core.checks import check_number
from ...core.result import Result
from ...core.tables import format_table
from .sae import SAE
from .sae_train import norm_outliers

if TYPE_CHECKING:
    from ...model.hooked_gpt2 import HookedGPT2


@dataclass
class SAEEvaluation(Result):
    """An SAE's quality on ``tokens`` held-out tokens (BOS positions excluded): ``l0``,
    ``variance_explained``, ``ce_clean``/``ce_spliced``/``ce_zero`` (mean next-token cross-entropy, nats)
    and ``ce_recovered``, ``dead_fraction``, ``dense_fraction`` (``dense_above``), ``frequency``
    ``[d_sae]`` (each latent's firing rate), ``hook_name`` and ``architecture``; ``outliers``: positions
    left out as norm outliers (``outlier_ratio``)."""

    hook_name: str
    architecture: str
    d_sae: int
    tokens: int
    l0: float
    variance_explained: float
    ce_clean: float
    ce_spliced: float
    ce_zero: float
    ce_recovered: float
    dead_fraction: float
    dense_fraction: float
    dense_above: float
    frequency: torch.Tensor
    outliers: int = 0

    def summary(self) -> dict[str, Any]:
        """The scalar metrics by name (no per-latent frequencies)."""
        d = self.to_dict()
        d.pop("frequency")
        return d

    def table(self) -> str:
        """The metrics as a two-column text table (:func:`~gpt2_interp.core.tables.format_table`)."""
        rows = [[k, f"{v:.4g}" if isinstance(v, float) else str(v)] for k, v in self.summary().items()]
        return "\n".join(format_table(["metric", "value"], rows, right=[False, True]))


@torch.no_grad()
def evaluate_sae(
    model: HookedGPT2,
    sae: SAE,
    windows: torch.Tensor,
    batch: int = 16,
    dense_above: float = 0.1,
    outlier_ratio: float | None = None,
) -> SAEEvaluation:
    """Measure ``sae`` on ``model`` over token ``windows`` ``[n, pos]`` (held out from training; see
    :func:`.sae_train.token_windows`), ``batch`` windows per forward pass; a latent firing on more than ``dense_above``
    of the tokens counts as dense; ``outlier_ratio``: positions whose norm exceeds this × the batch's median are
    left out as BOS is (None: none). See the module's docstring."""
    sae.check_model(model)
    if outlier_ratio is not None:
        check_number(outlier_ratio, "outlier_ratio", 1)
    n_out = 0
    site = sae.cfg.hook_name
    skip = int(model.tokenizer.bos_id is not None)
    n_tok = 0
    l0_sum = err_sum = 0.0
    x_sum = x_sq = None
    fired = torch.zeros(sae.cfg.d_sae, dtype=torch.long, device=model.device)
    ce = {"clean": 0.0, "spliced": 0.0, "zero": 0.0}
    n_ce = 0

    def run(tokens: torch.Tensor, mode: str) -> torch.Tensor:
        stats: dict[str, Any] = {}

        def replace(x: torch.Tensor, hook: Any) -> torch.Tensor | None:
            body = x[:, skip:].reshape(-1, sae.cfg.d_in)
            if mode == "clean":
                keep = torch.ones(len(body), dtype=torch.bool, device=x.device)
                if outlier_ratio is not None:
                    keep = ~norm_outliers(body, outlier_ratio)
                stats["keep"] = keep
                stats["x"] = body[keep].float()
                return None
            keep = run.keep  # type: ignore[attr-defined]  # the clean run's, same tokens
            new = body.clone()
            if mode == "zero":
                new[keep] = 0
            else:
                z = sae.encode(body[keep])
                stats["z"] = z
                new[keep] = sae.decode(z).to(x.dtype)
            out = x.clone()
            out[:, skip:] = new.reshape(out[:, skip:].shape)
            return out

        with model.hooks([(site, replace)]):
            loss = model(tokens, return_type="loss", loss_per_token=True)
        run.stats = stats  # type: ignore[attr-defined]
        if mode == "clean":
            run.keep = stats["keep"]  # type: ignore[attr-defined]
        return loss

    for i in range(0, len(windows), batch):
        tokens = windows[i : i + batch].to(model.device)
        losses = {}
        for mode in ce:
            losses[mode] = run(tokens, mode)
            if mode == "clean":
                x = run.stats["x"]  # type: ignore[attr-defined]
                n_out += int((~run.stats["keep"]).sum())  # type: ignore[attr-defined]
            elif mode == "spliced":
                z = run.stats["z"]  # type: ignore[attr-defined]
        # the first predicted position (from BOS) is not changed by the SAE: count from position `skip`
        for mode, lp in losses.items():
            ce[mode] += float(lp[:, skip:].sum())
        n_ce += losses["clean"][:, skip:].numel()
        recons = sae.decode(z).float()
        err_sum += float((x - recons).pow(2).sum())
        x_sum = x.sum(0) if x_sum is None else x_sum + x.sum(0)
        x_sq = x.pow(2).sum() if x_sq is None else x_sq + x.pow(2).sum()
        active = z > 0
        l0_sum += float(active.sum())
        fired += active.sum(0)
        n_tok += len(x)
    if n_tok == 0:
        raise ValueError("no tokens to evaluate on: give at least one window")
    assert x_sum is not None and x_sq is not None, "at least one batch was evaluated"
    total_var = float(x_sq) - float(x_sum.pow(2).sum()) / n_tok
    clean, spliced, zero = (ce[m] / n_ce for m in ("clean", "spliced", "zero"))
    freq = fired.float().cpu() / n_tok
    return SAEEvaluation(
        hook_name=site,
        architecture=sae.cfg.architecture,
        d_sae=sae.cfg.d_sae,
        tokens=n_tok,
        l0=l0_sum / n_tok,
        variance_explained=1 - err_sum / total_var,
        ce_clean=clean,
        ce_spliced=spliced,
        ce_zero=zero,
        ce_recovered=(zero - spliced) / (zero - clean) if zero != clean else float("nan"),
        dead_fraction=float((freq == 0).float().mean()),
        dense_fraction=float((freq > dense_above).float().mean()),
        dense_above=dense_above,
        frequency=freq,
        outliers=n_out,
    )


__all__ = ["SAEEvaluation", "evaluate_sae"]
