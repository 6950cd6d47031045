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
- ``tokens``: targets, subject spans and prompt positions through the model's tokenizer

Submodules are imported on use (``from gpt2_interp.analysis.lens import logit_lens``), so importing
one does not pay for the others.
"""
