"""Interactive views of gpt2-interp's results: self-contained HTML pages (plotly.js inside, once per
page, no network when viewed) that also display themselves in Jupyter. One module per area (``attention``,
``lens``, ``causal``, ``attribution``, ``editing``, ``circuits``, ``features``, ``steering``, ``graphs``,
``interventions``); ``page`` holds the :class:`View` they all return, ``dispatch`` the :func:`view` that
finds the right one for any result or saved result file.

Requires Plotly (``pip install gpt2-interp[views]``); importing the library loads none of it."""

from ..core.lazy import lazy_face

_FACE = {
    "page": ("View", "html_page", "markdown_html", "plotly_js", "reset_notebook"),
    "dispatch": ("view", "view_experiment", "load_result", "kind_of"),
    "attention": ("AttentionPatterns", "attention_patterns", "view_attention"),
    "lens": ("view_lens", "view_dla", "view_vocab", "view_neuron_search", "view_subupdates"),
    "causal": ("view_patch", "view_traces", "view_average_trace"),
    "attribution": ("view_attribution", "view_verification", "view_agreement"),
    "editing": ("view_topk", "view_edit_evaluation", "view_probe"),
    "circuits": ("view_circuit", "view_faithfulness"),
    "features": ("view_feature",),
    "steering": ("view_steering",),
    "graphs": ("view_graph", "graph_page_data"),
    "interventions": ("view_intervention", "view_two_hop_check", "intervention_figure"),
}
__all__, __getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
