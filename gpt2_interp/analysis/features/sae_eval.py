"""What the field reports about an SAE, measured on held-out token windows.

- **L0**: latents active per token (mean).
- **Variance explained**: ``1 − FVU``, FVU = Σ‖x − x̂‖² / Σ‖x − x̄‖² over all evaluated tokens
  (:func:`~gpt2_interp.analysis.features.sae_train.fvu`: the definition training logs per batch).
- **Cross-entropy loss recovered**: ``(CE_zero − CE_spliced) / (CE_zero − CE_clean)``, where
  ``CE_spliced`` runs the model with the reconstruction in place of the activation, ``CE_zero`` with
  the activation zeroed, ``CE_clean`` untouched (SAELens's and Gao et al.'s measure). BOS positions keep
  their clean activation in both ablations (an SAE is trained without them; see :mod:`.sae_train`).
- **Dead** and **dense** latents: the fractions that never fire on the evaluated tokens, and that fire on
  more than ``dense_above`` of them (default 10%).

The positions measured are those training keeps (:func:`~gpt2_interp.analysis.features.sae_train.kept_positions`):
BOS left out and, with ``outlier_ratio`` (an SAE trained without norm outliers), positions whose norm exceeds
that × their window's median — left out of every metric but the cross-entropies, and kept at their clean
activation in both ablations. ``bos`` and ``outliers`` count what was left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from ...core.boundary import boundary
from ...core.checks import check_count, check_number, check_token_windows
from ...core.progress import progress_bar
from ...core.result import Result
from ...core.tables import format_table
from .activations import check_precision
from .sae import SAE
from .sae_train import kept_positions

if TYPE_CHECKING:
    from ...model.hooked_gpt2 import HookedGPT2


@boundary
@dataclass
class SAEEvaluation(Result):
    """An SAE's quality on ``tokens`` held-out tokens (BOS positions excluded): ``l0``,
    ``variance_explained``, ``ce_clean``/``ce_spliced``/``ce_zero`` (mean next-token cross-entropy, nats)
    and ``ce_recovered``, ``dead_fraction``, ``dense_fraction`` (``dense_above``), ``frequency``
    ``[d_sae]`` (each latent's firing rate), ``hook_name`` and ``architecture``; ``bos`` and ``outliers``:
    the positions left out as BOS and as norm outliers (``outlier_ratio``: the rule, None for none);
    ``text``: what the windows were (e.g. held out from the SAE's training text; empty: not said)."""

    result_kind = "SAE evaluation"

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
    bos: int = 0
    outlier_ratio: float | None = None
    text: str = ""

    def summary(self) -> dict[str, Any]:
        """The scalar metrics by name (no per-latent frequencies)."""
        d = self.to_dict()
        d.pop("frequency")
        return d

    def table(self) -> str:
        """The metrics as a two-column text table (:func:`~gpt2_interp.core.tables.format_table`)."""
        rows = [[k, f"{v:.4g}" if isinstance(v, float) else str(v)] for k, v in self.summary().items()]
        return "\n".join(format_table(["metric", "value"], rows, right=[False, True]))


@boundary
@torch.no_grad()
def evaluate_sae(
    model: HookedGPT2,
    sae: SAE,
    windows: torch.Tensor,
    batch: int = 16,
    dense_above: float = 0.1,
    outlier_ratio: float | None = None,
    progress: bool | None = False,
) -> SAEEvaluation:
    """Measure ``sae`` on ``model`` over token ``windows`` ``[n, pos]`` (held out from training; see
    :func:`.sae_train.token_windows`), ``batch`` windows per forward pass; a latent firing on more than ``dense_above``
    of the tokens counts as dense; ``outlier_ratio``: positions whose norm exceeds this × their window's median
    are left out as BOS is (None: none), the rule of training (:func:`.sae_train.kept_positions`). See the
    module's docstring. ``progress``: a bar over the batches (None: on a terminal, else plain lines at a
    steady interval; :func:`~gpt2_interp.core.progress.progress_bar`)."""
    sae.check_model(model)
    windows = check_token_windows(windows, "windows")
    batch = check_count(batch, "batch")
    dense_above = check_number(dense_above, "dense_above", 0, 1)
    if outlier_ratio is not None:
        check_number(outlier_ratio, "outlier_ratio", 1)
    n_out = n_bos = 0
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
            flat = x.reshape(*x.shape[:2], sae.cfg.d_in)
            if mode == "clean":
                check_precision(x, site)
                keep = kept_positions(x, bool(skip), outlier_ratio)  # [batch, pos]: training's rule
                stats["keep"] = keep
                stats["x"] = flat[keep].float()
                return None
            keep = run.keep  # type: ignore[attr-defined]  # the clean run's, same tokens
            new = flat.clone()
            if mode == "zero":
                new[keep] = 0
            else:
                z = sae.encode(flat[keep])
                stats["z"] = z
                new[keep] = sae.decode(z).to(x.dtype)
            return new.reshape(x.shape)

        with model.hooks([(site, replace)]):
            loss = model(tokens, return_type="loss", loss_per_token=True)
        run.stats = stats  # type: ignore[attr-defined]
        if mode == "clean":
            run.keep = stats["keep"]  # type: ignore[attr-defined]
        return loss

    for i in progress_bar(range(0, len(windows), batch), enabled=progress, desc="SAE evaluation", unit="batch"):
        tokens = windows[i : i + batch].to(model.device)
        losses = {}
        for mode in ce:
            losses[mode] = run(tokens, mode)
            if mode == "clean":
                x = run.stats["x"]  # type: ignore[attr-defined]
                n_out += int((~run.stats["keep"]).sum()) - skip * len(tokens)  # type: ignore[attr-defined]
                n_bos += skip * len(tokens)
            elif mode == "spliced":
                z = run.stats["z"]  # type: ignore[attr-defined]
        # the first predicted position (from BOS) is not changed by the SAE: count from position `skip`
        for mode, lp in losses.items():
            ce[mode] += float(lp[:, skip:].sum())
        n_ce += losses["clean"][:, skip:].numel()
        recons = sae.decode(z).float()
        err_sum += float((x - recons).pow(2).sum())
        xd = x.double()  # sums in float64: the total variance below is a difference of two large sums
        x_sum = xd.sum(0) if x_sum is None else x_sum + xd.sum(0)
        x_sq = xd.pow(2).sum() if x_sq is None else x_sq + xd.pow(2).sum()
        active = z > 0
        l0_sum += float(active.sum())
        fired += active.sum(0)
        n_tok += len(x)
    if n_tok == 0:
        raise ValueError("no tokens to evaluate on: give at least one window")
    assert x_sum is not None and x_sq is not None, "at least one batch was evaluated"
    total_var = float(x_sq) - float(x_sum.pow(2).sum()) / n_tok  # Σ‖x − x̄‖² over every evaluated row (fvu's)
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
        bos=n_bos,
        outlier_ratio=outlier_ratio,
    )


__all__ = ["SAEEvaluation", "evaluate_sae"]
