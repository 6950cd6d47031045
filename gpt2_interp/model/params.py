"""The parameter table of a GPT-2, computed from the actual weights (per block, per kind)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..core.result import Result

if TYPE_CHECKING:
    import torch


@dataclass
class ParameterTable(Result):
    """Rows ``(part, shape, count)``; ``total`` counts W_U = W_Eᵀ once (HF's accounting)."""

    result_kind = "parameter table"

    rows: list[tuple[str, str, int]]
    per_block: int
    total: int
    notes: list[str] = field(default_factory=list)

    def table(self) -> str:
        w = max(len(r[0]) for r in self.rows)
        lines = [f"{'part':<{w}}  {'shape':<22} {'parameters':>13}"]
        lines += [f"{p:<{w}}  {s:<22} {n:>13,}" for p, s, n in self.rows]
        lines.append(f"{'total':<{w}}  {'':<22} {self.total:>13,}")
        return "\n".join(lines + self.notes)


def parameter_table(model) -> ParameterTable:
    """Per-part counts: embeddings, one block broken down (×n_layer), final norm, the unembedding
    (tied: counted in W_E). Parts a config lacks (biases, W_pos, W_gate) are left out."""
    c = model.cfg
    b0 = model.blocks[0]

    def part(label: str, *params) -> tuple[str, list]:
        ps = [p for p in params if p is not None]
        names = [n for n, p in zip(label.split("+"), params) if p is not None]
        return " + ".join(n.strip() for n in names), ps

    def norm_part(name: str) -> list[tuple[str, list]]:
        try:
            n = b0.get_submodule(name)
        except AttributeError:  # a norm the config lacks (q/k norms, post-norms)
            return []
        if not hasattr(n, "w"):  # no norm there (OLMo 2 has no ln1/ln2)
            return []
        return [(f"{name} ({'w, b' if n.b is not None else 'w'})", [p for p in (n.w, n.b) if p is not None])]

    block_parts = dict(
        [
            *norm_part("ln1"),
            part("attn W_QKV + b_QKV", b0.attn.W_QKV, b0.attn.b_QKV),
            *norm_part("attn.q_norm"),
            *norm_part("attn.k_norm"),
            part("attn W_O + b_O", b0.attn.W_O, b0.attn.b_O),
            *norm_part("ln1_post"),
            *norm_part("ln2"),
            *([part("mlp W_gate", b0.mlp.W_gate)] if b0.mlp.gated else []),
            part("mlp W_in + b_in", b0.mlp.W_in, b0.mlp.b_in),
            part("mlp W_out + b_out", b0.mlp.W_out, b0.mlp.b_out),
            *norm_part("ln2_post"),
        ]
    )

    def shape(ps: list[torch.Tensor]) -> str:
        return " + ".join("×".join(map(str, p.shape)) for p in ps)

    rows = [("W_E (token embedding)", shape([model.W_E]), model.W_E.numel())]
    if model.W_pos is not None:
        rows.append(("W_pos (position embedding)", shape([model.W_pos]), model.W_pos.numel()))
    per_block = 0
    for name, ps in block_parts.items():
        n = sum(p.numel() for p in ps)
        per_block += n
        rows.append((f"block: {name}", shape(ps), n))
    rows.append((f"blocks × {c.n_layer}", f"{per_block:,} each", per_block * c.n_layer))
    final = [p for p in (model.ln_final.w, model.ln_final.b) if p is not None]
    rows.append((f"ln_final ({'w, b' if len(final) == 2 else 'w'})", shape(final), sum(p.numel() for p in final)))
    if c.tied_embeddings:
        rows.append(("W_U = W_Eᵀ (tied)", f"{c.d_model}×{c.d_vocab}", 0))
    else:
        rows.append(("W_U (unembedding)", shape([model.W_U]), model.W_U.numel()))
    if c.unembed_bias:
        rows.append(("b_U (unembedding bias)", shape([model.unembed.b_U]), model.unembed.b_U.numel()))
    total = model.n_params()
    assert total == sum(r[2] for r in rows) - per_block  # the block rows break down one block of the "blocks ×" row
    notes = (
        [f"(untied, W_U would add {model.W_E.numel():,}: {total + model.W_E.numel():,})"] if c.tied_embeddings else []
    )
    return ParameterTable(rows, per_block, total, notes)
