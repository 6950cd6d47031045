"""Run the authors' ROME code (kmeng01/rome: rome/compute_u.py, rome/compute_v.py, rome/repr_tools.py,
util/nethook.py), MEMIT's (kmeng01/memit: memit/memit_main.py) or AlphaEdit's (jianghoucheng/AlphaEdit:
AlphaEdit/AlphaEdit_main.py, experiments/evaluate.py get_project) on gpt2-facts and store what it computes, for
tests/unit/test_paper_golden.py.

Their code is read from the checkout given on the command line and run as it is; the shims it needs to
run here on a CPU live in this script (see README.md beside it), never in their tree or in the package:

    python tests/data/paper_golden/make_golden.py --rome /path/to/rome-checkout --out tests/data/paper_golden
    (--memit /path/to/memit-checkout, --alphaedit /path/to/alphaedit-checkout)

Fixed inputs of the ROME run (the test rebuilds them the same way; MEMIT's and AlphaEdit's: README.md):
gpt2-facts saved as a Hugging Face GPT-2 directory; its layer-0 key statistics
``key_second_moment(model, [0], n_samples=N_SAMPLES)`` (ROME gets C⁻¹ of them in place of its Wikipedia
statistics); the context templates ``["{}"] + [p + ". {}"]`` for the prefixes of
``context_prefix_groups(model, (5, 10), 10, seed=0, style="rome")`` (ROME's [[5, 10], [10, 10]]; stored in
the JSON file); ROME's gpt2-xl hyperparameters with the layer 0 and the loss layer the model's last.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
import tempfile
import types
from pathlib import Path

import torch

N_SAMPLES = 20_000
LAYER = 0
REQUESTS = [
    {"prompt": "{} is located in the country of", "subject": "Paris", "target_new": {"str": " Japan"}},
    {"prompt": "The official language of {} is", "subject": "Germany", "target_new": {"str": " French"}},
]


def hf_tokenizer(folder: Path):
    """A transformers GPT2TokenizerFast from the library's GPT-2 ranks (gpt2_interp/io/data/gpt2.tiktoken):
    byte-level vocab.json and the merges recovered from the ranks."""
    from transformers import GPT2TokenizerFast

    import gpt2_interp.io as gio

    ranks = {}
    for line in (Path(gio.__file__).parent / "data" / "gpt2.tiktoken").read_text().splitlines():
        if line.strip():
            tok, rank = line.split()
            ranks[base64.b64decode(tok)] = int(rank)

    def bpe(token: bytes, max_rank: int) -> list[bytes]:
        parts = [bytes([b]) for b in token]
        while True:
            best = None
            for i in range(len(parts) - 1):
                r = ranks.get(parts[i] + parts[i + 1])
                if r is not None and r < max_rank and (best is None or r < best[1]):
                    best = (i, r)
            if best is None:
                return parts
            i = best[0]
            parts = [*parts[:i], parts[i] + parts[i + 1], *parts[i + 2 :]]

    enc = _bytes_to_unicode()
    show = lambda b: "".join(enc[x] for x in b)  # noqa: E731
    vocab = {show(t): r for t, r in ranks.items()}
    vocab["<|endoftext|>"] = 50256
    merges = []
    for t, r in sorted(ranks.items(), key=lambda x: x[1]):
        if len(t) > 1:
            a, b = bpe(t, r)
            merges.append(f"{show(a)} {show(b)}")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    bpe_model = models.BPE(vocab, [tuple(m.split(" ")) for m in merges])
    backend = Tokenizer(bpe_model)
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.save(str(folder / "tokenizer.json"))
    tok = GPT2TokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"),
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    tok.pad_token = tok.eos_token  # as ROME's experiments set it
    return tok


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character table (openai/gpt-2 encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def rome_hparams(model, layer: int = LAYER) -> types.SimpleNamespace:
    """ROME's hparams/ROME/gpt2-xl.json with the edit layer ``layer`` and the loss layer the model's last."""
    return types.SimpleNamespace(
        layers=[layer],
        fact_token="subject_last",
        v_num_grad_steps=20,
        v_lr=5e-1,
        v_loss_layer=model.cfg.n_layer - 1,
        v_weight_decay=0.5,
        clamp_norm_factor=4,
        kl_factor=0.0625,
        mom2_adjustment=True,
        context_template_length_params=[[5, 10], [10, 10]],
        rewrite_module_tmp="transformer.h.{}.mlp.c_proj",
        layer_module_tmp="transformer.h.{}",
        mlp_module_tmp="transformer.h.{}.mlp",
        attn_module_tmp="transformer.h.{}.attn",
        ln_f_module="transformer.ln_f",
        lm_head_module="transformer.wte",
        mom2_dataset="wikipedia",
        mom2_n_samples=N_SAMPLES,
        mom2_dtype="float32",
    )


class _CpuTorch(types.ModuleType):
    """``torch`` for their module namespace: ``device="cuda"`` becomes the CPU (their code hard-codes CUDA)."""

    def __getattr__(self, name):
        obj = getattr(torch, name)
        if name in ("tensor", "zeros"):

            def on_cpu(*a, **k):
                if k.get("device") == "cuda":
                    k["device"] = "cpu"
                return obj(*a, **k)

            return on_cpu
        return obj


def main() -> None:
    ap = argparse.ArgumentParser()
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--rome", type=Path, help="a checkout of github.com/kmeng01/rome")
    which.add_argument("--memit", type=Path, help="a checkout of github.com/kmeng01/memit")
    which.add_argument("--alphaedit", type=Path, help="a checkout of github.com/jianghoucheng/AlphaEdit")
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    if args.memit is not None:
        return run_memit(args.memit, args.out)
    if args.alphaedit is not None:
        return run_alphaedit(args.alphaedit, args.out)

    import gpt2_interp
    from gpt2_interp.editing.stats import key_second_moment
    from gpt2_interp.editing.targets import context_prefix_groups

    model = gpt2_interp.load("gpt2-facts")
    stats = key_second_moment(model, [LAYER], n_samples=N_SAMPLES, progress=False)[LAYER]
    groups = context_prefix_groups(model, (5, 10), 10, seed=0, style="rome")
    prefixes = [p for g in groups for p in g]
    templates = ["{}"] + [p + ". {}" for p in prefixes]

    tmp = Path(tempfile.mkdtemp())
    model.save(tmp)
    tok = hf_tokenizer(tmp)
    for text in ("Paris is located in", " Japan", prefixes[0], prefixes[-1]):
        assert tok(text)["input_ids"] == model.tokenizer.encode_ids(text), text

    from transformers import GPT2LMHeadModel
    from transformers.tokenization_utils_base import BatchEncoding

    hf = GPT2LMHeadModel.from_pretrained(tmp, attn_implementation="eager").eval().float()

    # shims: CUDA → CPU; no globals.yml; their inverse covariance is that of the fixed statistics
    to = BatchEncoding.to
    BatchEncoding.to = lambda self, device: to(self, "cpu" if device == "cuda" else device)
    sys.path.insert(0, str(args.rome))
    globs = types.ModuleType("util.globals")
    for name in ("RESULTS_DIR", "DATA_DIR", "STATS_DIR", "HPARAMS_DIR"):
        setattr(globs, name, tmp)
    globs.REMOTE_ROOT_URL = ""
    import util

    sys.modules["util.globals"] = globs
    util.globals = globs
    import rome.compute_u as cu
    import rome.compute_v as cv
    from rome import repr_tools

    C_inv = torch.inverse(stats.C.double()).float()
    cu.get_inv_cov = lambda *a, **k: C_inv
    cv.torch = _CpuTorch("torch")

    hp = rome_hparams(model)
    out: dict[str, torch.Tensor] = {}
    for i, req in enumerate(REQUESTS):
        k_star = repr_tools.get_reprs_at_word_tokens(
            model=hf,
            tok=tok,
            layer=LAYER,
            module_template=hp.rewrite_module_tmp,
            track="in",
            context_templates=[t.format(req["prompt"]) for t in templates],
            words=[req["subject"]] * len(templates),
            subtoken="last",
        ).mean(0)
        u = cu.compute_u(hf, tok, req, hp, LAYER, templates)
        v = cv.compute_v(hf, tok, req, hp, LAYER, u, templates)
        out[f"k_star.{i}"], out[f"u.{i}"], out[f"v.{i}"] = k_star.detach(), u.detach(), v.detach()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(out, args.out / "rome_gpt2-facts_layer0.pt")
    meta = {
        "requests": REQUESTS,
        "layer": LAYER,
        "n_samples": N_SAMPLES,
        "prefixes": prefixes,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
    }
    (args.out / "rome_gpt2-facts_layer0.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")


MEMIT_LAYERS = [0, 4]
PROBES = 32  # Gaussian probe vectors that sketch AlphaEdit's projections
MEMIT_REQUESTS = [
    {"prompt": "{} is located in the country of", "subject": "Paris", "target_new": {"str": " Japan"}},
    {"prompt": "The official language of {} is", "subject": "Germany", "target_new": {"str": " French"}},
    {"prompt": "{} is located in the country of", "subject": "Berlin", "target_new": {"str": " Italy"}},
]


def memit_hparams(model, layers: list[int] = MEMIT_LAYERS) -> types.SimpleNamespace:
    """MEMIT's hparams/MEMIT/gpt2-xl.json with the edit layers ``layers`` and the loss layer the model's last."""
    return types.SimpleNamespace(
        layers=list(layers),
        layer_selection="all",
        fact_token="subject_last",
        v_num_grad_steps=20,
        v_lr=5e-1,
        v_loss_layer=model.cfg.n_layer - 1,
        v_weight_decay=0.5,
        clamp_norm_factor=0.75,
        kl_factor=0.0625,
        mom2_adjustment=True,
        mom2_update_weight=20000,
        rewrite_module_tmp="transformer.h.{}.mlp.c_proj",
        layer_module_tmp="transformer.h.{}",
        mlp_module_tmp="transformer.h.{}.mlp",
        attn_module_tmp="transformer.h.{}.attn",
        ln_f_module="transformer.ln_f",
        lm_head_module="transformer.wte",
        mom2_dataset="wikipedia",
        mom2_n_samples=N_SAMPLES,
        mom2_dtype="float32",
    )


def _setup(repo: Path, model):
    """The HF copy of ``model``, its tokenizer, and the shims shared by both runs (see README.md)."""
    tmp = Path(tempfile.mkdtemp())
    model.save(tmp)
    tok = hf_tokenizer(tmp)
    from transformers import GPT2LMHeadModel
    from transformers.tokenization_utils_base import BatchEncoding

    hf = GPT2LMHeadModel.from_pretrained(tmp, attn_implementation="eager").eval().float()
    to = BatchEncoding.to
    BatchEncoding.to = lambda self, device: to(self, "cpu" if device == "cuda" else device)
    sys.path.insert(0, str(repo))
    globs = types.ModuleType("util.globals")
    for name in ("RESULTS_DIR", "DATA_DIR", "STATS_DIR", "HPARAMS_DIR"):
        setattr(globs, name, tmp)
    globs.REMOTE_ROOT_URL = ""
    import util

    sys.modules["util.globals"] = globs
    util.globals = globs
    return hf, tok


def _block_output_as_tuple(nethook) -> type:
    """Their TraceDict, for transformers versions whose GPT2Block returns a tensor where their code expects
    the tuple ``(hidden_states, …)``: a block's output is handed to ``edit_output`` and read back as a 1-tuple."""
    import re

    block = re.compile(r"transformer\.h\.\d+")

    class TraceDict(nethook.TraceDict):
        def __init__(self, module, layers=None, *a, edit_output=None, **k):
            def edit(output, layer):
                if isinstance(output, torch.Tensor) and block.fullmatch(layer):
                    return edit_output((output,), layer)[0]
                return edit_output(output, layer)

            super().__init__(module, layers, *a, edit_output=None if edit_output is None else edit, **k)

        def __getitem__(self, key):
            t = super().__getitem__(key)
            if block.fullmatch(key) and isinstance(getattr(t, "output", None), torch.Tensor):
                t.output = (t.output,)
            return t

    return TraceDict


def run_memit(repo: Path, out_dir: Path) -> None:
    """MEMIT's execute_memit (memit/memit_main.py with compute_ks.py and compute_z.py) on MEMIT_REQUESTS at
    MEMIT_LAYERS: per layer the keys and ΔW, and the target residuals z."""
    import gpt2_interp
    from gpt2_interp.editing.stats import key_second_moment
    from gpt2_interp.editing.targets import context_prefix_groups

    model = gpt2_interp.load("gpt2-facts")
    stats = key_second_moment(model, MEMIT_LAYERS, n_samples=N_SAMPLES, progress=False)
    (prefixes,) = context_prefix_groups(model, (10,), 5, seed=0, style="memit")
    templates = [["{}"], [p + ". {}" for p in prefixes]]
    hf, tok = _setup(repo, model)
    for text in prefixes:
        assert tok(text)["input_ids"] == model.tokenizer.encode_ids(text), text

    import memit.compute_z as cz
    import memit.memit_main as mm
    from util import nethook

    cz.torch = _CpuTorch("torch")
    cz.nethook = types.SimpleNamespace(
        TraceDict=_block_output_as_tuple(nethook),
        set_requires_grad=nethook.set_requires_grad,
        get_parameter=nethook.get_parameter,
        get_module=nethook.get_module,
    )
    mm.get_context_templates = lambda *a, **k: templates
    C = {f"transformer.h.{l}.mlp.c_proj": stats[l].C.float() for l in MEMIT_LAYERS}
    mm.get_cov = lambda model, tok, layer_name, *a, **k: C[layer_name]
    seen: dict[str, list[torch.Tensor]] = {"ks": [], "z": []}
    ks, z = mm.compute_ks, mm.compute_z

    def record_ks(*a, **k):
        seen["ks"].append(ks(*a, **k).detach().clone())
        return seen["ks"][-1]

    def record_z(*a, **k):
        seen["z"].append(z(*a, **k).detach().clone())
        return seen["z"][-1]

    mm.compute_ks, mm.compute_z = record_ks, record_z
    hp = memit_hparams(model)
    deltas = mm.execute_memit(hf, tok, MEMIT_REQUESTS, hp)
    out: dict[str, torch.Tensor] = {"z": torch.stack(seen["z"])}  # [n, d_model]
    for l, K in zip(MEMIT_LAYERS, seen["ks"]):
        adj_k, resid = deltas[f"transformer.h.{l}.mlp.c_proj.weight"]
        out[f"keys.{l}"] = K  # [n, d_mlp]
        # ΔW = adj_k @ resid.T [d_mlp, d_model], as apply_memit_to_model applies it; kept as its two factors
        out[f"adj_k.{l}"], out[f"resid.{l}"] = adj_k.float(), resid.float()  # [d_mlp, n], [d_model, n]
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.save(out, out_dir / "memit_gpt2-facts_layers0-4.pt")
    meta = {
        "requests": MEMIT_REQUESTS,
        "layers": MEMIT_LAYERS,
        "n_samples": N_SAMPLES,
        "prefixes": prefixes,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
    }
    (out_dir / "memit_gpt2-facts_layers0-4.json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")


class _CpuTensorTorch(_CpuTorch):
    """``torch`` for AlphaEdit's solve: also ``torch.eye(…, device="cuda")`` on the CPU."""

    def __getattr__(self, name):
        if name == "eye":

            def eye(*a, **k):
                if k.get("device") == "cuda":
                    k["device"] = "cpu"
                return torch.eye(*a, **k)

            return eye
        return super().__getattr__(name)


def _their_function(path: Path, name: str, namespace: dict):
    """The top-level function ``name`` of the source file ``path``, compiled from their text alone (the file's
    own imports pull in every baseline of their repository) in ``namespace``."""
    import ast

    src = path.read_text(encoding="utf-8")
    (fn,) = [n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == name]
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


def run_alphaedit(repo: Path, out_dir: Path) -> None:
    """AlphaEdit's apply_AlphaEdit_to_model (AlphaEdit/AlphaEdit_main.py with its compute_ks.py and
    compute_z.py) on MEMIT_REQUESTS at MEMIT_LAYERS, with the projections of experiments/evaluate.py
    get_project and an empty cache of earlier keys (the first batch): per layer P, the keys and ΔW, and z."""
    import gpt2_interp
    from gpt2_interp.editing.stats import key_second_moment
    from gpt2_interp.editing.targets import context_prefix_groups

    model = gpt2_interp.load("gpt2-facts")
    stats = key_second_moment(model, MEMIT_LAYERS, n_samples=N_SAMPLES, progress=False)
    (prefixes,) = context_prefix_groups(model, (10,), 5, seed=0, style="memit")
    templates = [["{}"], [p + ". {}" for p in prefixes]]
    hf, tok = _setup(repo, model)
    for text in prefixes:
        assert tok(text)["input_ids"] == model.tokenizer.encode_ids(text), text

    import AlphaEdit.AlphaEdit_main as am
    import AlphaEdit.compute_z as cz
    from util import nethook

    torch.Tensor.cuda = lambda self, *a, **k: self  # their solve moves P and the cache to "cuda"
    cz.torch = _CpuTorch("torch")
    am.torch = _CpuTensorTorch("torch")
    cz.nethook = types.SimpleNamespace(
        TraceDict=_block_output_as_tuple(nethook),
        set_requires_grad=nethook.set_requires_grad,
        get_parameter=nethook.get_parameter,
        get_module=nethook.get_module,
    )
    am.get_context_templates = lambda *a, **k: templates
    # the statistics in float64: get_project's SVD of float32 statistics is noise at τ (see README.md)
    C = {f"transformer.h.{l}.mlp.c_proj": stats[l].C.double() for l in MEMIT_LAYERS}
    get_project = _their_function(
        repo / "experiments" / "evaluate.py",
        "get_project",
        {"torch": torch, "get_cov": lambda model, tok, layer_name, *a, **k: C[layer_name]},
    )
    seen: dict[str, list[torch.Tensor]] = {"ks": [], "z": []}
    ks, z = am.compute_ks, am.compute_z

    def record_ks(*a, **k):
        seen["ks"].append(ks(*a, **k).detach().clone())
        return seen["ks"][-1]

    def record_z(*a, **k):
        seen["z"].append(z(*a, **k).detach().clone())
        return seen["z"][-1]

    am.compute_ks, am.compute_z = record_ks, record_z
    hp = types.SimpleNamespace(
        layers=MEMIT_LAYERS,
        layer_selection="all",
        fact_token="subject_last",
        v_num_grad_steps=20,
        v_lr=5e-1,
        v_loss_layer=model.cfg.n_layer - 1,
        v_weight_decay=0.5,
        clamp_norm_factor=0.75,
        kl_factor=0.0625,
        mom2_adjustment=True,
        mom2_update_weight=20000,
        rewrite_module_tmp="transformer.h.{}.mlp.c_proj",
        layer_module_tmp="transformer.h.{}",
        mlp_module_tmp="transformer.h.{}.mlp",
        attn_module_tmp="transformer.h.{}.attn",
        ln_f_module="transformer.ln_f",
        lm_head_module="lm_head",
        mom2_dataset="wikipedia",
        mom2_n_samples=N_SAMPLES,
        mom2_dtype="float32",
        nullspace_threshold=2e-2,
        L2=10,
    )
    d_mlp = model.cfg.d_mlp
    P = torch.zeros(len(MEMIT_LAYERS), d_mlp, d_mlp)
    for i, layer in enumerate(MEMIT_LAYERS):  # as experiments/evaluate.py main fills it
        P[i] = get_project(hf, tok, layer, hp)
    cache_c = torch.zeros(len(MEMIT_LAYERS), d_mlp, d_mlp)  # no earlier edits
    W0 = {l: hf.transformer.h[l].mlp.c_proj.weight.detach().clone() for l in MEMIT_LAYERS}
    am.apply_AlphaEdit_to_model(hf, tok, MEMIT_REQUESTS, hp, cache_c=cache_c, P=P)
    out: dict[str, torch.Tensor] = {"z": torch.stack(seen["z"])}  # [n, d_model]
    n = len(MEMIT_REQUESTS)
    probe = torch.randn(d_mlp, PROBES, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for i, (l, K) in enumerate(zip(MEMIT_LAYERS, seen["ks"])):
        # P [d_mlp, d_mlp] kept as its dimension and its product with fixed Gaussian probes (a sketch that
        # carries P's Frobenius distances); ΔW and the cache have rank n and are kept as rank-n factors
        out[f"null_dim.{l}"] = P[i].double().trace().round()
        out[f"P_probe.{l}"] = (P[i].double() @ probe).float()  # [d_mlp, PROBES]
        out[f"keys.{l}"] = K  # [n, d_mlp]
        dW = (hf.transformer.h[l].mlp.c_proj.weight.detach() - W0[l]).double()  # [d_mlp, d_model]
        U, S, Vh = torch.linalg.svd(dW, full_matrices=False)
        out[f"delta_u.{l}"], out[f"delta_v.{l}"] = (U[:, :n] * S[:n]).float(), Vh[:n].T.float()
        assert float((out[f"delta_u.{l}"].double() @ out[f"delta_v.{l}"].double().T - dW).norm() / dW.norm()) < 1e-6
        evals, evecs = torch.linalg.eigh(cache_c[i].double())  # their cache after the batch: Σ K Kᵀ
        out[f"cache_f.{l}"] = (evecs[:, -n:] * evals[-n:].clamp(min=0).sqrt()).float()  # cache = F Fᵀ
    out["probe_seed"] = torch.tensor(0)
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.save(out, out_dir / "alphaedit_gpt2-facts_layers0-4.pt")
    meta = {
        "requests": MEMIT_REQUESTS,
        "layers": MEMIT_LAYERS,
        "n_samples": N_SAMPLES,
        "prefixes": prefixes,
        "nullspace_threshold": hp.nullspace_threshold,
        "L2": hp.L2,
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
    }
    out_path = out_dir / "alphaedit_gpt2-facts_layers0-4.json"
    out_path.write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
