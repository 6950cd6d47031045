"""Reading and localising: what the model computes, and where.

- ``lens``: logit lens, direct logit attribution (``logit_lens``, ``logit_attribution``)
- ``vocab``: MLP value vectors in vocabulary space, neuron search, sub-updates
- ``metrics``: ``logit_diff``, ``prob``, ``kl_to`` — functions of last-position logits
- ``engine``: the batched prefix-reuse engine (``Patch``, ``run_staircase``) behind patching and tracing
- ``hook_targets``: which hook points a sweep's ``hook=``/``layers=`` name (``resolve_hook``; patching and attribution)
- ``patching``: activation patching sweeps (``patch``)
- ``tracing``: ROME causal tracing (``causal_trace``, ``average_trace``)
- ``attribution``: gradient estimates of a patching sweep (AtP, AtP*, integrated gradients) and
  their exact verification (``attribute``, ``verify``, ``agreement``); a package, one module per job
- ``circuits``: edges scored by EAP, EAP-IG and exact edge patching, circuits and their faithfulness
  (``edge_scores``, ``circuit``, ``evaluate``, ``faithfulness_curve``); a package
- ``tokens``: targets, subject spans and prompt positions through the model's tokenizer

The public names below are this package's face (``from gpt2_interp.analysis import logit_lens,
causal_trace``); each submodule is imported on first use of one of its names, so importing the
package does not pay for scikit-learn, scipy or the attribution machinery until they are used.
"""

from __future__ import annotations

from ..core.lazy import lazy_face

_FACE: dict[str, tuple[str, ...]] = {
    "lens": (
        "logit_lens",
        "LensResult",
        "logit_attribution",
        "DLAResult",
        "decode_resid",
        "logit_direction",
        "direct_effect",
    ),
    "tuned_lens": ("TunedLens", "train_tuned_lens", "lens_divergence"),
    "vocab": (
        "neuron_vocab",
        "find_neurons",
        "top_subupdates",
        "project",
        "vocab_scores",
        "VocabProjection",
        "NeuronSearch",
        "SubupdateResult",
    ),
    "metrics": ("logit_diff", "prob", "kl_to", "Metric"),
    "patching": ("patch", "PatchResult"),
    "tracing": ("causal_trace", "causal_trace_all", "average_trace", "TraceResult", "TraceSet", "AverageTrace"),
    "attribution": (
        "attribute",
        "AttributionResult",
        "verify",
        "Verification",
        "agreement",
        "Agreement",
        "ATTRIBUTION_METHODS",
    ),
    "circuits": ("edge_scores", "EdgeScores", "circuit", "Circuit", "evaluate", "faithfulness_curve", "graph_of"),
    "probes": ("probe", "ProbeResult"),
    "known": ("knows", "known_facts", "informative", "whole_object"),
    "tokens": ("target_ids", "subject_span", "token_span", "prompt_position"),
}
__all__, __getattr__, __dir__ = lazy_face(__name__, _FACE, globals())
