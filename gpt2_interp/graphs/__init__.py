"""Attribution graphs (Ameisen et al. 2025, "Circuit Tracing"), as circuit-tracer computes them.

- ``transcoder``: per-layer transcoders (MLP input → MLP output), trained by the SAE trainer from one
  stream of forward passes, their metrics, and their files (circuit-tracer's ``layer_{i}.safetensors`` layout)
- ``clt``: cross-layer transcoders (features that read one layer's MLP input and write to the MLP output of
  every later layer), their training with the paper's loss, and their files (circuit-tracer's CLT layout)
- ``replacement``: the replacement model of one prompt (transcoders plus error terms, attention patterns
  and norm scales frozen), affine in its sources
- ``attribution``: the graph of direct effects between features, errors, tokens and logits
- ``prune``: pruning by influence on the logits; replacement and completeness scores
- ``annotate``: what a graph's page shows about each feature (top logit effects, top-activating contexts);
  ``AttributionGraph.view()`` is the page (:func:`gpt2_interp.views.graphs.view_graph`)
- ``interventions``: setting or scaling features (one, or a group) in the real model and in the frozen
  replacement model, beside what the graph predicts; the two-hop check of a fact prompt's graph

Each submodule is imported on first use of one of its names.
"""

from __future__ import annotations

from ..core.lazy import lazy_face

_FACE: dict[str, tuple[str, ...]] = {
    "transcoder": (
        "Transcoder",
        "TranscoderSet",
        "TranscoderTrainConfig",
        "TranscoderMetrics",
        "new_transcoders",
        "train_transcoders",
        "evaluate_transcoders",
    ),
    "clt": (
        "CLTConfig",
        "CLTTrainConfig",
        "CrossLayerTranscoder",
        "clt_loss",
        "load_transcoders",
        "new_cross_layer_transcoder",
        "train_cross_layer_transcoder",
    ),
    "replacement": ("ReplacementModel", "ReplacementRun"),
    "attribution": ("AttributionConfig", "AttributionGraph", "attribute"),
    "prune": ("prune_graph", "graph_scores", "influence", "normalise_rows"),
    "annotate": ("annotate_graph",),
    "interventions": ("InterventionResult", "TwoHopCheck", "intervene", "two_hop_check"),
}
__all__, __getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
