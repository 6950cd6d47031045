"""Every figure of gpt2-interp, one module per area (``lens``, ``causal``, ``attribution``, ``editing``, ``probes``; ``figure`` holds
the common finishing touches), each building
``matplotlib.figure.Figure`` objects from result objects — never pyplot state, never a backend
switch, so a notebook's backend is left alone. Results call these through their ``.plot()``."""
