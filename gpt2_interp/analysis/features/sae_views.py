"""What one SAE latent means, as data: where it fires, what it writes, how often.

- :func:`feature_view`: a latent's top-activating contexts from token windows, with the activation at
  every token of each context; its logit effect (the decoder row times the final norm's gain, through
  the unembedding: the direct effect on the logits of writing the latent, before the norm's scaling);
  the histogram of its non-zero activations and its density (firing rate).
- :func:`latents_promoting`: latents ranked by their logit effect on a token.
- :func:`latents_firing`: latents ranked by their activation on a prompt.

Each latent a search returns comes with the tokens it promotes most (:func:`top_tokens`), so a list of ids
says what each latent writes.

Results are data (:class:`~gpt2_interp.core.result.Result` objects with ``table()``, ``plot()`` and
JSON); an interactive page renders them elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ...core.boundary import boundary
from ...core.checks import check_count, check_index, check_index_list, check_str, check_token_windows
from ...core.result import Result
from ...core.tables import format_table
from .sae import SAE
from .sae_train import run_to_hook

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from ...model.hooked_gpt2 import HookedGPT2

#: Tokens shown for each latent a search returns (what its decoder row promotes most).
PROMOTED_TOKENS = 5


@boundary
def logit_effect(model: HookedGPT2, sae: SAE, latents: list[int] | None = None) -> torch.Tensor:
    """``[d_sae, d_vocab]``: each decoder row, scaled by the final norm's gain where the model has one,
    through the unembedding (no norm bias, no unembedding bias: the latent's own direction). With
    ``latents`` (a non-empty list of indices, not a boolean mask), only their rows (``[len(latents), d_vocab]``)."""
    sae.check_model(model)
    if latents is not None:
        latents = check_index_list(latents, sae.cfg.d_sae, "latent", "latents", f"this SAE has {sae.cfg.d_sae} latents")
    w_dec = sae.W_dec.detach() if latents is None else sae.W_dec.detach()[latents]
    w_dec = w_dec.to(model.dtype)
    gain = getattr(model.ln_final, "w", None)
    if gain is not None:
        w_dec = w_dec * gain.detach()
    return w_dec @ model.W_U.detach()


@boundary
@dataclass
class FeatureView(Result):
    """One latent of an SAE: ``latent``, ``hook_name``; ``contexts`` (top first: each a dict with
    ``tokens`` (strings), ``acts`` (the latent's activation at each), ``max_act``, ``window``,
    ``position``: where its maximum is); ``promoted``/``suppressed``: ``(token, logit effect)`` pairs;
    ``histogram`` (``counts`` and bin ``edges`` of the non-zero activations); ``density`` (the
    fraction of ``tokens`` evaluated on which it fires)."""

    result_kind = "feature"

    latent: int
    hook_name: str
    contexts: list[dict[str, Any]]
    promoted: list[tuple[str, float]]
    suppressed: list[tuple[str, float]]
    histogram: dict[str, list[float]]
    density: float
    tokens: int = 0

    def table(self) -> str:
        """The top contexts (the firing token in ``[[ ]]``) and the promoted and suppressed tokens."""
        rows = []
        for c in self.contexts:
            text = "".join(f"[[{t}]]" if i == c["position"] else t for i, t in enumerate(c["tokens"]))
            rows.append([f"{c['max_act']:.3f}", repr(text.replace("\n", " "))])
        lines = [f"latent {self.latent} at {self.hook_name}: density {self.density:.4f} over {self.tokens} tokens"]
        lines += format_table(["act", "context"], rows, right=[True, False])
        pro = "  ".join(f"{t!r} {v:+.2f}" for t, v in self.promoted)
        sup = "  ".join(f"{t!r} {v:+.2f}" for t, v in self.suppressed)
        return "\n".join([*lines, f"promotes: {pro}", f"suppresses: {sup}"])

    def plot(self, **kwargs: Any) -> Figure:
        """The histogram of the latent's non-zero activations (``kwargs`` go to ``Axes.stairs``)."""
        from ...plots.features import plot_feature_histogram

        return plot_feature_histogram(self, **kwargs)


def _tokens(model: HookedGPT2, ids: list[int]) -> list[str]:
    return [model.tokenizer.decode([i]) for i in ids]


@boundary
@torch.no_grad()
def feature_view(
    model: HookedGPT2,
    sae: SAE,
    latent: int,
    windows: torch.Tensor,
    top: int = 10,
    context: int = 12,
    n_tokens: int = 10,
    bins: int = 30,
    batch: int = 32,
) -> FeatureView:
    """The view of ``latent`` of ``sae`` over token ``windows`` ``[n, pos]`` (see :func:`.sae_train.token_windows`):
    its ``top`` contexts (up to ``context`` tokens before the firing token, and the token), its
    ``n_tokens`` most promoted and suppressed tokens, a ``bins``-bin histogram and its density.
    ``batch`` windows per forward pass. A latent out of range raises IndexError."""
    latent = check_index(latent, sae.cfg.d_sae, "latent", f"the SAE has {sae.cfg.d_sae} latents")
    top, context = check_count(top, "top"), check_count(context, "context", 0)
    n_tokens, bins, batch = check_count(n_tokens, "n_tokens"), check_count(bins, "bins"), check_count(batch, "batch")
    windows = check_token_windows(windows, "windows")
    sae.check_model(model)
    skip = int(model.tokenizer.bos_id is not None)
    acts = []
    for i in range(0, len(windows), batch):
        x = run_to_hook(model, windows[i : i + batch], sae.cfg.hook_name)
        z = sae.encode(x.reshape(*x.shape[:2], -1))[..., latent]
        z[:, :skip] = 0
        acts.append(z.float().cpu())
    a = torch.cat(acts)  # [n, pos]
    flat = a.flatten()
    order = flat.argsort(descending=True)[:top]
    contexts = []
    for j in order.tolist():
        if flat[j] <= 0:
            break
        w, p = divmod(j, a.shape[1])
        lo = max(skip, p - context)
        contexts.append(
            {
                "tokens": _tokens(model, windows[w, lo : p + 1].tolist()),
                "acts": a[w, lo : p + 1].tolist(),
                "max_act": float(flat[j]),
                "window": w,
                "position": p - lo,
            }
        )
    effect = logit_effect(model, sae)[latent].float()
    up, down = effect.topk(n_tokens), (-effect).topk(n_tokens)
    fired = flat[flat > 0]
    counts, edges = (
        torch.histogram(fired, bins=bins) if fired.numel() else (torch.zeros(bins), torch.linspace(0, 1, bins + 1))
    )
    n = a[:, skip:].numel()
    return FeatureView(
        latent=latent,
        hook_name=sae.cfg.hook_name,
        contexts=contexts,
        promoted=[(model.tokenizer.decode([i]), float(v)) for v, i in zip(up.values, up.indices.tolist())],
        suppressed=[(model.tokenizer.decode([i]), -float(v)) for v, i in zip(down.values, down.indices.tolist())],
        histogram={"counts": counts.tolist(), "edges": edges.tolist()},
        density=float(fired.numel() / n) if n else 0.0,
        tokens=n,
    )


@boundary
@dataclass
class LatentSearch(Result):
    """Latents ranked for a query: ``query`` (what was searched), ``by`` (``"logit effect"`` or
    ``"activation"``), ``latents`` and their ``scores`` (best first); ``promotes``: for each latent, the
    tokens its decoder row promotes most (:func:`logit_effect`, largest first), what the latent writes."""

    result_kind = "latent search"

    query: str
    by: str
    latents: list[int]
    scores: list[float]
    promotes: list[list[str]] = field(default_factory=list)

    def table(self) -> str:
        """One row per latent: its index, score and (where known) the tokens it promotes most."""
        rows = [[str(i), f"{s:.4f}"] for i, s in zip(self.latents, self.scores)]
        head, right = ["latent", self.by], [True, True]
        if self.promotes:
            rows = [[*r, "  ".join(repr(t) for t in toks)] for r, toks in zip(rows, self.promotes)]
            head, right = [*head, "promotes (decoder row through the unembedding)"], [*right, False]
        title = f"latents by {self.by} for {self.query!r}"
        return "\n".join([title, *format_table(head, rows, right=right)])


@boundary
def top_tokens(model: HookedGPT2, sae: SAE, latents: list[int], n: int = PROMOTED_TOKENS) -> list[list[str]]:
    """For each of ``latents`` (a non-empty list of indices), the ``n`` tokens its decoder row promotes most
    (:func:`logit_effect`, largest first): what writing the latent does to the logits."""
    effect = logit_effect(model, sae, latents).float()
    ids = effect.topk(min(check_count(n, "n"), effect.shape[-1]), dim=-1).indices.tolist()
    return [_tokens(model, row) for row in ids]


@boundary
def latents_promoting(model: HookedGPT2, sae: SAE, token: str, top: int = 10) -> LatentSearch:
    """The ``top`` latents of ``sae`` whose logit effect (:func:`logit_effect`) on ``token`` (a string that is one
    token, e.g. ``" Paris"``) is largest. A string of several tokens raises ValueError."""
    sae.check_model(model)
    check_str(token, "token", " Paris")
    ids = model.tokenizer.encode_ids(token)
    if len(ids) != 1:
        raise ValueError(f"token {token!r} is {len(ids)} tokens for this tokenizer; give one token")
    scores = logit_effect(model, sae)[:, ids[0]].float()
    best = scores.topk(min(check_count(top, "top"), sae.cfg.d_sae))
    latents = best.indices.tolist()
    return LatentSearch(token, "logit effect", latents, best.values.tolist(), top_tokens(model, sae, latents))


@boundary
@torch.no_grad()
def latents_firing(model: HookedGPT2, sae: SAE, prompt: str, top: int = 10, position: int | None = -1) -> LatentSearch:
    """The ``top`` latents of ``sae`` most active on ``prompt`` at token ``position`` (default the last; None: the
    maximum over the prompt's tokens, BOS excluded)."""
    sae.check_model(model)
    check_str(prompt, "prompt", "The capital of France is")
    tokens = model.to_tokens(prompt)
    z = sae.encode(run_to_hook(model, tokens, sae.cfg.hook_name)[0].reshape(tokens.shape[1], -1))
    skip = int(model.tokenizer.bos_id is not None)
    if position is None:
        z = z[skip:].max(0).values if tokens.shape[1] > skip else z.max(0).values
    else:
        z = z[check_index(position, tokens.shape[1], "position", f"the prompt has {tokens.shape[1]} tokens")]
    best = z.float().topk(min(check_count(top, "top"), sae.cfg.d_sae))
    latents = best.indices.tolist()
    return LatentSearch(prompt, "activation", latents, best.values.tolist(), top_tokens(model, sae, latents))


__all__ = [
    "FeatureView",
    "LatentSearch",
    "feature_view",
    "latents_firing",
    "latents_promoting",
    "logit_effect",
    "top_tokens",
]
