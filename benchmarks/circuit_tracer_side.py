"""circuit-tracer's half of ``compare_circuit_tracer.py``: run in a Python environment that has circuit-tracer
(0.5) and TransformerLens, never gpt2-interp.

    python benchmarks/circuit_tracer_side.py WORK_FOLDER [--batch-size 64] [--repeats 3] [--dtype float32]
        [--kind transcoders|clt]
    python benchmarks/circuit_tracer_side.py WORK_FOLDER --write-clt

``WORK_FOLDER`` holds what the gpt2-interp side wrote: ``model/`` (the model as a transformers GPT-2 folder),
``transcoders/`` (a transcoder set in circuit-tracer's layout) or ``clt/`` (a cross-layer transcoder in
circuit-tracer's CLT layout), ``job.json`` (the prompt's token ids and the attribution settings) and
``ours_{kind}_{dtype}.safetensors`` (gpt2-interp's adjacency, pruned here by circuit-tracer's ``prune_graph`` as
well). The model is a TransformerLens ``HookedTransformer`` of the transformers config, its
weights converted by TransformerLens's ``convert_gpt2_weights`` (unfolded, uncentred: circuit-tracer's own
``from_pretrained_and_transcoders`` loads with ``fold_ln=False, center_writing_weights=False,
center_unembed=False``), made a ``TransformerLensReplacementModel`` with the transcoders read by
circuit-tracer's ``load_transcoder_from_hub`` from the folder's absolute path, all in ``--dtype``. Writes
``theirs_{kind}_{dtype}.safetensors`` (the graph, its pruning and the pruning of ours) and
``theirs_{kind}_{dtype}.json`` (timings, scores, versions).

``--write-clt`` (see :func:`write_clt`) only writes a CLT of circuit-tracer's own into ``WORK_FOLDER/clt`` and
its inputs and outputs into ``WORK_FOLDER/clt_io.safetensors``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from importlib.metadata import version
from pathlib import Path


def ids_tokenizer(d_vocab: int, bos: int):
    """A transformers tokenizer whose token ``i`` is the text ``"i"`` and whose only special token is ``bos``:
    circuit-tracer and TransformerLens ask a model given token ids for special ids (the prompt starts with
    BOS, so none is prepended), padding side and ``decode`` (graph labels only)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(WordLevel({str(i): i for i in range(d_vocab)}, unk_token=str(bos)))
    backend.pre_tokenizer = WhitespaceSplit()
    special = str(bos)
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=special, eos_token=special, pad_token=special)


def write_clt(work: Path, n_layers: int = 4, d_tc: int = 64, d_model: int = 32, n_pos: int = 9) -> None:
    """circuit-tracer's own random JumpReLU ``CrossLayerTranscoder`` (seeded; thresholds uniform in [0, 0.5],
    so that about half the features fire), saved in float32 by its ``to_safetensors`` into ``work/clt`` with the
    ``config.yaml`` its cache writes (``model_kind``, the hooks, ``scan``), then cast to float64 and run
    (``encode``, ``forward``) on random MLP inputs ``x`` ``[n_layers, n_pos, d_model]``: ``x``, ``features`` and
    ``out`` into ``work/clt_io.safetensors``."""
    import torch
    import yaml
    from circuit_tracer.transcoder.cross_layer_transcoder import CrossLayerTranscoder
    from safetensors.torch import save_file

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    clt = CrossLayerTranscoder(
        n_layers, d_tc, d_model, activation_function="jump_relu", lazy_decoder=False,
        feature_input_hook="ln2.hook_normalized", feature_output_hook="hook_mlp_out",
        device=torch.device("cpu"), dtype=torch.float32,
    )  # fmt: skip
    with torch.no_grad():
        clt.W_enc.copy_(torch.randn(clt.W_enc.shape, generator=g) / d_model**0.5)
        clt.b_enc.copy_(0.3 * torch.randn(clt.b_enc.shape, generator=g))
        clt.b_dec.copy_(0.1 * torch.randn(clt.b_dec.shape, generator=g))
        for w in clt.W_dec:
            w.copy_(torch.randn(w.shape, generator=g) / d_model**0.5)
        threshold = clt.activation_function.threshold
        threshold.copy_(0.5 * torch.rand(threshold.shape, generator=g))
    clt.to_safetensors(str(work / "clt"))
    config = {"model_kind": "cross_layer_transcoder", "scan": "circuit-tracer-side/random-clt"}
    config |= {"feature_input_hook": clt.feature_input_hook, "feature_output_hook": clt.feature_output_hook}
    (work / "clt" / "config.yaml").write_text(yaml.dump(config))
    clt = clt.to(torch.float64)
    x = torch.randn(n_layers, n_pos, d_model, generator=g, dtype=torch.float64)
    with torch.no_grad():
        features, out = clt.encode(x), clt(x)
    save_file({"x": x, "features": features, "out": out}, str(work / "clt_io.safetensors"))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("work", type=Path)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--kind", choices=["transcoders", "clt"], default="transcoders")
    ap.add_argument("--write-clt", action="store_true", help="only write a CLT of circuit-tracer's (see write_clt)")
    a = ap.parse_args(argv)
    if a.write_clt:
        write_clt(a.work)
        return

    import torch
    import transformers
    from circuit_tracer import attribute
    from circuit_tracer.graph import Graph, compute_graph_scores, prune_graph
    from circuit_tracer.replacement_model.replacement_model_transformerlens import TransformerLensReplacementModel
    from circuit_tracer.utils.hf_utils import load_transcoder_from_hub
    from safetensors.torch import load_file, save_file
    from transformer_lens import HookedTransformerConfig
    from transformer_lens.pretrained.weight_conversions import convert_gpt2_weights

    torch.set_num_threads(1)
    job = json.loads((a.work / "job.json").read_text())
    cpu, dtype = torch.device("cpu"), getattr(torch, a.dtype)
    hf = transformers.GPT2LMHeadModel.from_pretrained(a.work / "model").eval()
    c = hf.config
    cfg = HookedTransformerConfig(
        n_layers=c.n_layer,
        d_model=c.n_embd,
        n_heads=c.n_head,
        d_head=c.n_embd // c.n_head,
        d_mlp=c.n_inner or 4 * c.n_embd,
        n_ctx=c.n_positions,
        d_vocab=c.vocab_size,
        act_fn=c.activation_function,
        eps=c.layer_norm_epsilon,
        normalization_type="LN",
        positional_embedding_type="standard",
        model_name=job["model_name"],
        device="cpu",
        dtype=dtype,
    )
    model = TransformerLensReplacementModel(cfg)
    model.load_state_dict(convert_gpt2_weights(hf, cfg), strict=False)
    del hf
    transcoders, _ = load_transcoder_from_hub(
        str((a.work / a.kind).resolve()), device=cpu, dtype=dtype, lazy_encoder=False, lazy_decoder=False
    )
    model._configure_replacement_model(transcoders)
    model.tokenizer = ids_tokenizer(cfg.d_vocab, job["tokens"][0])
    model.eval()
    tokens = torch.tensor(job["tokens"])

    def run() -> Graph:
        return attribute(
            tokens,
            model,
            max_n_logits=job["max_n_logits"],
            desired_logit_prob=job["desired_logit_prob"],
            batch_size=a.batch_size,
        )

    graph = run()  # warm-up (and the graph compared)
    seconds = []
    for _ in range(a.repeats):
        start = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - start)

    pruned = prune_graph(graph, job["node_threshold"], job["edge_threshold"])
    replacement, completeness = compute_graph_scores(graph)
    ours = load_file(a.work / f"ours_{a.kind}_{a.dtype}.safetensors")
    ours_graph = Graph(
        input_string="",
        input_tokens=tokens,
        active_features=ours["features"],
        adjacency_matrix=ours["adjacency"],
        cfg=model.cfg,
        selected_features=torch.arange(len(ours["features"])),
        activation_values=ours["activations"],
        logit_targets=graph.logit_targets,
        logit_probabilities=ours["logit_probabilities"],
        scan="ours",
    )
    ours_pruned = prune_graph(ours_graph, job["node_threshold"], job["edge_threshold"])
    ours_replacement, ours_completeness = compute_graph_scores(ours_graph)
    save_file(
        {
            "adjacency": graph.adjacency_matrix.contiguous(),
            "features": graph.active_features[graph.selected_features].contiguous(),
            "activations": graph.activation_values.contiguous(),
            "logit_tokens": graph.logit_token_ids.contiguous(),
            "logit_probabilities": graph.logit_probabilities.contiguous(),
            "tokens": graph.input_tokens.contiguous(),
            "node_mask": pruned.node_mask.contiguous(),
            "edge_mask": pruned.edge_mask.contiguous(),
            "ours_node_mask": ours_pruned.node_mask.contiguous(),
            "ours_edge_mask": ours_pruned.edge_mask.contiguous(),
        },
        str(a.work / f"theirs_{a.kind}_{a.dtype}.safetensors"),
    )
    info = {
        "seconds": seconds,
        "median_s": statistics.median(seconds) if seconds else None,
        "threads": torch.get_num_threads(),
        "scores": [replacement, completeness],
        "ours_scores": [ours_replacement, ours_completeness],
        "versions": {
            "python": sys.version.split()[0],
            **{p: version(p) for p in ("circuit-tracer", "transformer-lens", "torch", "transformers")},
        },
    }
    (a.work / f"theirs_{a.kind}_{a.dtype}.json").write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main()
