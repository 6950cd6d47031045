"""Every figure of gpt2-interp, one module per area (``lens``, ``causal``, ``attribution``, ``editing``,
``probes``, ``circuits``, ``steering``, ``interventions``; ``figure`` holds the common finishing touches,
``layout`` the geometry that keeps text legible: sizes from the data's shape, labels placed apart, titles
fitted), each building ``matplotlib.figure.Figure`` objects from result objects — never pyplot state, never a
backend switch, so a notebook's backend is left alone. Results call these through their ``.plot()``."""

from ..core.lazy import lazy_face

_FACE = {
    "lens": (
        "plot_lens",
        "plot_attribution",
        "plot_vocab",
        "plot_neuron_search",
        "plot_subupdates",
        "plot_lens_divergence",
    ),
    "causal": ("plot_patch", "plot_trace", "plot_traces", "plot_average_trace"),
    "attribution": ("plot_estimate_vs_exact", "plot_verification", "plot_agreement_grid"),
    "editing": ("plot_edit_evaluation", "plot_decay", "plot_topk_comparison"),
    "probes": ("plot_probe", "plot_probe_summary"),
    "circuits": ("plot_circuit", "plot_faithfulness", "plot_edge_scores"),
    "steering": ("plot_steering_curve",),
    "interventions": ("plot_intervention", "plot_two_hop_check"),
}
__all__, __getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
