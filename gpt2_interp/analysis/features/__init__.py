"""Features: directions in a model's activations and what they do.

- ``steering``: steering directions (difference of means over contrast pairs, probe weights, SAE decoder
  rows, any vector) and their measured effect over a range of scales (``steering_curve``)

Each submodule is imported on first use of one of its names.
"""

from __future__ import annotations

from ...core.lazy import lazy_face

_FACE: dict[str, tuple[str, ...]] = {
    "steering": (
        "mean_difference",
        "probe_direction",
        "decoder_direction",
        "as_direction",
        "activations_at",
        "steering_curve",
        "SteeringCurve",
        "target_token_ids",
    ),
}
__all__, __getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
