"""Features: sparse autoencoders over a hook point's activations (train, evaluate, splice, view, save).

- ``sae``: the :class:`SAE` module and its files (SAELens's layout, integrity-checked)
- ``sae_train``: activations streamed from text through a shuffling buffer, and SAE training
- ``sae_eval``: L0, variance explained, cross-entropy loss recovered, dead and dense latents
- ``sae_views``: a latent's top contexts, logit effect and activation histogram; latent search
"""

from __future__ import annotations

from ...core.lazy import lazy_face

_FACE: dict[str, tuple[str, ...]] = {
    "sae": ("SAE", "SAEConfig", "load_sae"),
    "sae_train": ("train_sae", "SAETrainConfig", "TrainingLog", "ActivationBuffer", "token_windows", "text_source"),
    "sae_eval": ("evaluate_sae", "SAEEvaluation"),
    "sae_views": ("feature_view", "FeatureView", "latents_promoting", "latents_firing", "LatentSearch", "logit_effect"),
}
__all__, __getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
