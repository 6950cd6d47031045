"""What a graph's page shows about each feature, read from the model and the transcoders.

- the top logit effects: the feature's decoder row through the final norm's gain and the unembedding
  (:func:`~gpt2_interp.analysis.features.sae_views.logit_effect`, as a feature view's), its most promoted
  and most suppressed tokens;
- the top-activating contexts over token windows: each context the tokens up to the one where the feature is
  largest, with its activation at each (a feature view's context format), from one forward pass per batch of
  windows for all layers.

Only the features drawn are annotated: a pruned graph's kept ones (all features of an unpruned graph).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from ..analysis.features.sae_views import logit_effect
from ..core.boundary import boundary
from ..core.checks import check_count, check_token_windows
from .attribution import AttributionGraph
from .transcoder import INPUT_HOOK, TranscoderSet

if TYPE_CHECKING:
    from ..model.hooked_gpt2 import HookedGPT2

#: Features whose logit effects ``[chunk, d_vocab]`` are computed at once.
LOGIT_CHUNK = 256


def _decode(model: HookedGPT2, ids: list[int]) -> list[str]:
    return [model.tokenizer.decode([i]) for i in ids]


@torch.no_grad()
def _top_logits(
    model: HookedGPT2, transcoders: TranscoderSet, feats: torch.Tensor, k: int
) -> list[dict[str, list[list[Any]]]]:
    """``{"promoted": [[token, effect], …], "suppressed": […]}`` (``k`` each) of features ``feats``
    ``[n, 3]`` (layer, position, index), computed per layer in chunks of :data:`LOGIT_CHUNK`."""
    out: list[dict[str, list[list[Any]]]] = [{} for _ in range(len(feats))]
    for L in sorted({int(L) for L in feats[:, 0].tolist()}):
        rows = (feats[:, 0] == L).nonzero()[:, 0].tolist()
        for start in range(0, len(rows), LOGIT_CHUNK):
            chunk = rows[start : start + LOGIT_CHUNK]
            effects = logit_effect(model, transcoders[L], feats[chunk, 2].tolist()).float().cpu()
            up, down = effects.topk(k), effects.topk(k, largest=False)
            for i, r in enumerate(chunk):
                out[r] = {
                    name: [[t, v] for t, v in zip(_decode(model, top.indices[i].tolist()), top.values[i].tolist())]
                    for name, top in (("promoted", up), ("suppressed", down))
                }
    return out


@torch.no_grad()
def _top_contexts(
    model: HookedGPT2,
    transcoders: TranscoderSet,
    feats: torch.Tensor,
    windows: torch.Tensor,
    top: int,
    context: int,
    batch: int,
) -> list[list[dict[str, Any]]]:
    """Each feature's ``top`` contexts over ``windows`` ``[n, pos]`` (BOS left out), largest first."""
    skip = int(model.tokenizer.bos_id is not None)
    layers = sorted({int(L) for L in feats[:, 0].tolist()})
    names = [INPUT_HOOK.format(layer=L) for L in layers]
    acts: list[torch.Tensor] = []  # per batch [b, pos, n_feats]
    for i in range(0, len(windows), batch):
        rows = windows[i : i + batch].to(model.device)
        _, cache = model.run_with_cache(rows, names_filter=names, return_type=None)
        a = torch.zeros(*rows.shape, len(feats))
        for L in layers:
            sel = (feats[:, 0] == L).nonzero()[:, 0]
            z = transcoders[L].encode(cache[INPUT_HOOK.format(layer=L)])[..., feats[sel, 2].to(model.device)]
            a[..., sel] = z.float().cpu()
        a[:, :skip] = 0
        acts.append(a)
    every = torch.cat(acts)  # [n, pos, n_feats]
    flat = every.flatten(0, 1)  # [n·pos, n_feats]
    values, where = flat.topk(min(top, len(flat)), dim=0)
    out: list[list[dict[str, Any]]] = []
    for j in range(len(feats)):
        found = []
        for v, ix in zip(values[:, j].tolist(), where[:, j].tolist()):
            if v <= 0:
                break
            w, p = divmod(ix, every.shape[1])
            lo = max(skip, p - context)
            found.append(
                {
                    "tokens": _decode(model, windows[w, lo : p + 1].tolist()),
                    "acts": every[w, lo : p + 1, j].tolist(),
                    "max_act": v,
                    "window": w,
                    "position": p - lo,
                }
            )
        out.append(found)
    return out


@boundary
def annotate_graph(
    graph: AttributionGraph,
    model: HookedGPT2,
    transcoders: TranscoderSet,
    windows: torch.Tensor | None = None,
    n_logits: int = 5,
    n_contexts: int = 3,
    context: int = 8,
    batch: int = 32,
) -> AttributionGraph:
    """A copy of ``graph`` with ``feature_logits`` (each drawn feature's ``n_logits`` most promoted and
    suppressed tokens) and, given token ``windows`` ``[n, pos]``, ``feature_contexts`` (its ``n_contexts``
    top-activating contexts, up to ``context`` tokens before the one where it is largest; ``batch`` windows
    a forward pass); ``str_tokens`` and ``logit_strs`` filled where missing. Features not drawn (outside a
    pruned graph's ``node_mask``) get None. ``transcoders`` must be the graph's (checked against ``model``)."""
    n_logits, n_contexts = check_count(n_logits, "n_logits"), check_count(n_contexts, "n_contexts")
    context, batch = check_count(context, "context", 0), check_count(batch, "batch")
    transcoders.check_model(model)
    if len(transcoders) != graph.n_layers:
        raise ValueError(f"transcoders: {len(transcoders)} layers for a graph of n_layers={graph.n_layers}")
    if windows is not None:
        windows = check_token_windows(windows, "windows")
    drawn = (
        torch.ones(graph.n_features, dtype=torch.bool)
        if graph.node_mask is None
        else graph.node_mask[: graph.n_features]
    )
    idx = drawn.nonzero()[:, 0].tolist()
    feats = graph.features[idx]
    logits: list[dict[str, Any] | None] = [None] * graph.n_features
    for i, v in zip(idx, _top_logits(model, transcoders, feats, n_logits) if idx else []):
        logits[i] = v
    contexts: list[list[dict[str, Any]] | None] | None = None
    if windows is not None:
        contexts = [None] * graph.n_features
        found = _top_contexts(model, transcoders, feats, windows, n_contexts, context, batch) if idx else []
        for i, c in zip(idx, found):
            contexts[i] = c
    return replace(
        graph,
        str_tokens=graph.str_tokens if graph.str_tokens is not None else _decode(model, graph.tokens.tolist()),
        logit_strs=graph.logit_strs if graph.logit_strs is not None else _decode(model, graph.logit_tokens.tolist()),
        feature_logits=logits,
        feature_contexts=contexts if contexts is not None else graph.feature_contexts,
    )


__all__ = ["annotate_graph"]
