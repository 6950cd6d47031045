"""Attribution graphs (Ameisen et al. 2025, "Circuit Tracing"): per-layer transcoders, the local
replacement model of a prompt, the graph of direct effects between its features, and its pruning."""
