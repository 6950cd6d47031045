"""Features: directions in a model's activations and what they do.

- ``sae``: the :class:`SAE` module and its files (SAELens's layout, integrity-checked)
- ``sae_train``: activations streamed from text through a shuffling buffer, and SAE training
- ``sae_eval``: L0, variance explained, cross-entropy loss recovered, dead and dense latents
- ``sae_views``: a latent's top contexts, logit effect and activation histogram; latent search
- ``latent_probes``: the latents that best detect each class of a labelled attribute (held-out AUROC) and a
  sparse probe on them, to set beside a linear probe
- ``steering``: steering directions (difference of means over contrast pairs, probe weights, SAE decoder
  rows, any vector) and their measured effect over a range of scales (``steering_curve``)

Each submodule is imported on first use of one of its names.
"""

from __future__ import annotations

from ...core.lazy import lazy_face

_FACE: dict[str, tuple[str, ...]] = {
    "sae": ("SAE", "SAEConfig", "load_sae"),
    "sae_train": ("train_sae", "SAETrainConfig", "TrainingLog", "ActivationBuffer", "token_windows", "text_source"),
    "sae_eval": ("evaluate_sae", "SAEEvaluation"),
    "sae_views": ("feature_view", "FeatureView", "latents_promoting", "latents_firing", "LatentSearch", "logit_effect"),
    "latent_probes": ("latent_probe", "latent_auroc", "LatentProbe"),
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
