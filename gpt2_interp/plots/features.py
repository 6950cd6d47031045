"""Figures for SAE latents: the histogram of a latent's non-zero activations.

Figures are built as ``matplotlib.figure.Figure`` objects (no pyplot state, any backend).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from matplotlib.figure import Figure

if TYPE_CHECKING:
    from ..analysis.features.sae_views import FeatureView


def plot_feature_histogram(view: FeatureView, **kwargs: Any) -> Figure:
    """The histogram of ``view``'s non-zero activations (a :class:`FeatureView`), titled with its
    density; ``kwargs`` go to ``Axes.stairs``."""
    fig = Figure(figsize=(5, 3))
    ax = fig.subplots()
    ax.stairs(view.histogram["counts"], view.histogram["edges"], fill=True, **kwargs)
    ax.set_xlabel("activation (non-zero)")
    ax.set_ylabel("tokens")
    ax.set_title(f"latent {view.latent} at {view.hook_name}: density {view.density:.4f}", fontsize=10)
    return fig
