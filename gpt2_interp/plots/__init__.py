"""Every figure of gpt2-interp, one module per area (lens, causal, editing, model)."""
