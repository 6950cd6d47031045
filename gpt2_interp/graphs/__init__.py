"""Attribution graphs (Ameisen et al. 2025, "Circuit Tracing"): per-layer transcoders
(:mod:`~gpt2_interp.graphs.transcoder`), the local replacement model of a prompt
(:mod:`~gpt2_interp.graphs.replacement`), the graph of direct effects between its features
(:mod:`~gpt2_interp.graphs.attribution`) and its pruning (:mod:`~gpt2_interp.graphs.prune`)."""

from .attribution import AttributionConfig, AttributionGraph, attribute
from .prune import graph_scores, influence, normalise_rows, prune_graph
from .replacement import ReplacementModel, ReplacementRun
from .transcoder import (
    Transcoder,
    TranscoderMetrics,
    TranscoderSet,
    TranscoderTrainConfig,
    evaluate_transcoders,
    new_transcoders,
    train_transcoders,
)

__all__ = [
    "AttributionConfig",
    "AttributionGraph",
    "ReplacementModel",
    "ReplacementRun",
    "Transcoder",
    "TranscoderMetrics",
    "TranscoderSet",
    "TranscoderTrainConfig",
    "attribute",
    "evaluate_transcoders",
    "graph_scores",
    "influence",
    "new_transcoders",
    "normalise_rows",
    "prune_graph",
    "train_transcoders",
]
