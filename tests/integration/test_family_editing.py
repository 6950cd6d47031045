"""ROME, MEMIT, AlphaEdit, SAEs and steering on a tiny random-weight model of every family (those of
``tests.families_cases.CASES`` plus GPT-2 and a plain Llama), each checked against transformers, the edit's closed
form or a hook written by hand:

- ROME: the key k* is the input of the transformers matrix the edit rewrites (``down_proj``,
  ``dense_4h_to_h``, ``fc_out``, ``c_proj``) at the subject's last token; ``k*·(W_out + ΔW) + b_out = v*``;
  the δ optimisation's final loss is the edited transformers model's loss (so v* is the output of
  ``W_out`` before OLMo 2's and Gemma's post-MLP norm); the edited model written back with
  ``to_transformers`` changes that one matrix and gives our logits; undo restores every weight bit for bit;
  the target's probability rises in transformers;
- MEMIT and AlphaEdit: each layer's keys are the edited transformers model's inputs of the rewritten matrix,
  each layer's update solves its normal equations (MEMIT's ``(λC + KᵀK) ΔW = Kᵀ R``, AlphaEdit's projected
  ones with ``ΔW`` in the null space's range), the top layer's residual target is ``z − h`` read from
  transformers (blocks without a post-MLP norm), the residual leaving the top block reaches z (after a post-MLP
  norm, whose output has a fixed RMS, the normalised MLP output points at it), and the transformers, undo and
  target checks as for ROME;
- the authors' GPT-J 6B settings (``preset="paper"``) against copies of their hparams files
  (``tests/data/authors_hparams``);
- an SAE trained for a few steps on each family's residual stream; spliced in with its error term the
  logits are the model's; without it, the reconstruction flows on as a replacing hook makes it;
  SAELens loads a Gemma 2 SAE to the same latents;
- steering at ``hook_resid_pre`` (blocks 0 and 1: after Gemma's embedding scale), ``hook_attn_out`` and
  ``hook_mlp_out`` equals adding the vector in transformers at the block's input and at the attention's and the
  MLP's output after their post norms where the block has them (TransformerLens's names).

Run: ``pytest -p no:cacheprovider -q tests/integration/test_family_editing.py``."""

from __future__ import annotations

import copy
import json
import operator
from pathlib import Path

import pytest
import torch

import gpt2_interp as gi
from gpt2_interp.analysis.features.sae import SAE
from gpt2_interp.analysis.features.sae_train import SAETrainConfig, train_sae
from gpt2_interp.editing import NullSpace, compute_edit, compute_edits, key_second_moment
from gpt2_interp.editing.memit import MemitHparams
from gpt2_interp.editing.settings import hparams_for
from gpt2_interp.io.tokenizer import HFTokenizer, bytes_to_unicode
from gpt2_interp.model import KNOWN_CONFIGS, HookedGPT2, Steer
from gpt2_interp.model.steer import steering
from tests.families_cases import CASES, LLAMA_LIKE, VOCAB, hf_model

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

AUTHORS = Path(__file__).parent.parent / "data" / "authors_hparams"

# the reference families beside CASES: GPT-2 and Llama without rope scaling
REFERENCE = {
    "gpt2": (
        "GPT2Config",
        "GPT2LMHeadModel",
        dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128, bos_token_id=0, eos_token_id=0),
    ),
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(LLAMA_LIKE)),
}
FAMILIES = sorted(CASES) + sorted(REFERENCE)

# the transformers module each family's ROME/MEMIT rewrites (the authors' ``rewrite_module_tmp``)
REWRITE = {
    "gpt2": "transformer.h.{}.mlp.c_proj",
    "gptj": "transformer.h.{}.mlp.fc_out",
    "gpt_neox": "gpt_neox.layers.{}.mlp.dense_4h_to_h",
}
LAYERS = {"gpt2": "transformer.h", "gptj": "transformer.h", "gpt_neox": "gpt_neox.layers"}

REQUESTS = [
    {"prompt": "I live in {}", "subject": "Paris", "target": " R"},
    {"prompt": "The home of {}", "subject": "Berlin", "target": " O"},
]
# few steps, no context prefixes (k* is then the bare prompt's key), tiny key statistics
FAST = dict(v_steps=10, v_lr=0.1, weight_decay=0.05, prefixes_per_length=0, n_samples=300)


def _byte_tokenizer() -> HFTokenizer:
    """One token per byte (ids 0-255, the model's vocabulary); id 0 (the NUL byte) is BOS, EOS and padding."""
    alphabet = tokenizers.pre_tokenizers.ByteLevel.alphabet()
    chars = bytes_to_unicode()
    assert set(chars.values()) == set(alphabet)
    vocab = {chars[b]: b for b in range(256)}
    backend = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, []))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = tokenizers.decoders.ByteLevel()
    return HFTokenizer(backend, "bytes", bos_id=0, eos_id=0, pad_id=0)


def _hf(family: str):
    if family in CASES:
        return hf_model(family)
    config_class, model_class, kw = REFERENCE[family]
    torch.manual_seed(0)
    cfg = getattr(transformers, config_class)(**kw)
    cfg._attn_implementation = "eager"
    model = getattr(transformers, model_class)(cfg).eval()
    with torch.no_grad():
        for _name, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.ndim == 1 else 0.05))
    return model


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    docs = [f"Paris is in France and Rome in Italy; item {i} of the list." for i in range(40)]
    docs += [f"Berlin has {i} museums and Oslo {2 * i} parks, says the guide." for i in range(40)]
    path.write_text("\n\n".join(docs))
    return str(path)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    hf = _hf(request.param)
    ours = gi.from_transformers(hf, tokenizer=_byte_tokenizer()).eval()
    return request.param, hf, ours


def _model_type(hf) -> str:
    return hf.config.model_type


def _hf_layers(hf) -> list:
    return list(operator.attrgetter(LAYERS.get(_model_type(hf), "model.layers"))(hf))


def _rewritten(hf, layer: int) -> str:
    """The transformers name of the matrix the edit of ``layer`` rewrites."""
    return REWRITE.get(_model_type(hf), "model.layers.{}.mlp.down_proj").format(layer)


def _ids(text: str) -> list[int]:
    return [0, *text.encode()]  # BOS, then one token per byte


def _subject_last(req: dict) -> int:
    """The position of the subject's last token in ``_ids(prompt filled)``."""
    return len(req["prompt"].split("{}")[0].encode()) + len(req["subject"].encode())


def _keys_in_transformers(hf, req: dict, layers: list[int]) -> dict[int, torch.Tensor]:
    """The input of each layer's rewritten matrix at the subject's last token, in transformers."""
    got: dict[int, torch.Tensor] = {}
    hooks = [
        operator.attrgetter(_rewritten(hf, l))(hf).register_forward_pre_hook(
            lambda m, args, l=l: got.__setitem__(l, args[0][0, _subject_last(req)].detach().double())
        )
        for l in layers
    ]
    try:
        with torch.no_grad():
            hf(torch.tensor([_ids(req["prompt"].format(req["subject"]))]))
    finally:
        for h in hooks:
            h.remove()
    return got


def _target_nll(hf, req: dict) -> tuple[float, float]:
    """(mean NLL per target token, log P(target)) after BOS + the prompt, in transformers."""
    text = req["prompt"].format(req["subject"])
    target = list(req["target"].encode())
    ids = _ids(text) + target[:-1]
    with torch.no_grad():
        lp = hf(torch.tensor([ids])).logits[0].float().log_softmax(-1)
    n = len(_ids(text))
    logp = float(sum(lp[n - 1 + t, tok] for t, tok in enumerate(target)))
    return -logp / len(target), logp


def _block_output(hf, layer: int, req: dict, part: str | None = None) -> torch.Tensor:
    """The output of transformers block ``layer`` (or of its submodule ``part``) at the subject's last token."""
    grab: dict[str, torch.Tensor] = {}

    def keep(module, args, out):
        grab["h"] = (out[0] if isinstance(out, tuple) else out)[0, _subject_last(req)].detach().double()

    module = _hf_layers(hf)[layer]
    handle = (module if part is None else getattr(module, part)).register_forward_hook(keep)
    try:
        with torch.no_grad():
            hf(torch.tensor([_ids(req["prompt"].format(req["subject"]))]))
    finally:
        handle.remove()
    return grab["h"]


def _snapshot(model: HookedGPT2) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _check_written_back(family, hf, ours, edit, tokens) -> object:
    """The edited model written with ``to_transformers``: only the rewritten matrices differ from ``hf`` (by
    ΔWᵀ, or ΔW for GPT-2's Conv1D) and its logits are ours. Returns it."""
    back = ours.to_transformers().eval()
    before, after = hf.state_dict(), back.state_dict()
    changed = sorted(k for k in before if not torch.equal(before[k], after[k]))
    assert changed == sorted(f"{_rewritten(hf, l)}.weight" for l in edit.layers), family
    for l in edit.layers:
        d = after[f"{_rewritten(hf, l)}.weight"].double() - before[f"{_rewritten(hf, l)}.weight"].double()
        want = edit.delta(l).double()
        assert torch.allclose(d, want if _model_type(hf) == "gpt2" else want.T, atol=1e-6), family
    with torch.no_grad():
        logits = ours(tokens)
        delta = (back(tokens).logits - logits).abs().max().item()
    # two float32 implementations of the same weights: rounding on the logits' own scale
    scale = max(1.0, logits.abs().max().item())
    assert delta < 1e-5 * scale, (
        f"{family}: max |Δlogit| {delta:.2e} between the edited model and its transformers copy "
        f"(logits up to {scale:.1f})"
    )
    return back


def _check_undo(family, ours, edit, saved) -> None:
    edit.undo(ours)
    now = ours.state_dict()
    assert all(torch.equal(now[k], v) for k, v in saved.items()), f"{family}: undo is not bit-exact"


def test_rome_edits_the_matrix_transformers_calls_w_out_exactly(family, corpus):
    name, hf, ours = family
    req = REQUESTS[0]
    stats = key_second_moment(ours, 0, corpus=corpus, n_samples=300, cache_dir=False, progress=False)
    edit = compute_edit(ours, req, layer=0, stats=stats, progress=False, **FAST)
    # the key: the input of the rewritten transformers matrix at the subject's last token
    (k_hf,) = _keys_in_transformers(hf, req, [0]).values()
    assert torch.allclose(edit.k.double(), k_hf, rtol=1e-5, atol=1e-6), name
    # the closed form: k*·(W_out + ΔW) + b_out = v*
    mlp = ours.blocks[0].mlp
    b = 0.0 if mlp.b_out is None else mlp.b_out.double()
    got = edit.k.double() @ (mlp.W_out.double() + edit.delta(0).double()) + b
    assert (got - edit.v_star.double()).norm() <= 1e-5 * edit.v_star.double().norm(), name
    _, logp0 = _target_nll(hf, req)
    saved = _snapshot(ours)
    edit.apply(ours)
    try:
        tokens = torch.tensor([_ids("Paris is located in Rome")])
        back = _check_written_back(name, hf, ours, edit, tokens)
        nll1, logp1 = _target_nll(back, req)
        # the δ optimisation's final loss is the edited transformers model's loss (exact_edit)
        assert abs(edit.metrics["final_loss"]["bare_nll"] - nll1) < 1e-4, (name, edit.metrics["final_loss"], nll1)
        assert logp1 > logp0 + 0.5, f"{name}: log P(target) {logp0:.3f} → {logp1:.3f}"
    finally:  # undone also when a check fails, so the next test gets the unedited model
        _check_undo(name, ours, edit, saved)


@pytest.mark.parametrize("method", ["memit", "alphaedit"])
def test_memit_and_alphaedit_solve_their_normal_equations_on_the_keys_transformers_reads(family, corpus, method):
    name, hf, ours = family
    layers = [0, 1]
    stats = key_second_moment(ours, layers, corpus=corpus, n_samples=300, cache_dir=False, progress=False)
    preserve = NullSpace.from_stats(stats, 0.2, "energy") if method == "alphaedit" else None
    hp = dict(FAST, v_steps=8, mom2_weight=10.0, alpha=0.01)
    edit = compute_edits(ours, REQUESTS, layers=layers, stats=stats, preserve=preserve, hparams=hp, progress=False)
    assert edit.method == method
    saved = _snapshot(ours)
    before = [_target_nll(hf, r)[1] for r in REQUESTS]
    edit.apply(ours)
    try:
        back = _check_written_back(name, hf, ours, edit, torch.tensor([_ids("Berlin is located in Oslo")]))
        for j, req in enumerate(REQUESTS):  # the keys: inputs of the rewritten matrices in the edited model
            for l, k in _keys_in_transformers(back, req, layers).items():
                assert torch.allclose(edit.keys[l][j].double(), k, rtol=1e-4, atol=1e-5), (name, l, j)
        for l in layers:
            _, R = edit.factors[l]
            assert R is not None
            K, dW = edit.keys[l].double(), edit.delta(l).double()
            if preserve is None:  # (λC + KᵀK) ΔW = Kᵀ R
                lhs = (10.0 * stats[l].C.double() + K.T @ K) @ dW
            else:  # ΔW = P X in P's range, (P KᵀK P + αI) X = P Kᵀ R
                P = preserve.P[l].double()
                assert torch.allclose(P @ dW, dW, atol=1e-6 * float(dW.abs().max())), (name, l)
                ridge = 0.01 * float(stats[l].C.double().diagonal().mean())
                lhs = (P @ K.T @ K @ P + ridge * torch.eye(P.shape[0], dtype=torch.float64)) @ dW
            rhs = (K.T if preserve is None else preserve.P[l].double() @ K.T) @ R.double()
            err = float((lhs - rhs).norm() / rhs.norm())
            assert err < 1e-4, (name, l, err)
        if getattr(ours.blocks[1], "ln2_post", None) is None:  # the top layer carries z − h, h read in transformers
            lower = copy.deepcopy(hf)  # with layer 0's update only: the residual the top layer's update adds to
            key0 = f"{_rewritten(hf, 0)}.weight"
            operator.attrgetter(_rewritten(hf, 0))(lower).weight.data.copy_(back.state_dict()[key0])
            for j, req in enumerate(REQUESTS):
                h = _block_output(lower, 1, req)
                R_top = edit.factors[1][1]
                assert R_top is not None
                assert torch.allclose(R_top[j].double(), edit.v_star[j].double() - h, rtol=1e-4, atol=1e-4), (name, j)
        # the residual leaving the top block reaches z; after a post-MLP norm (OLMo 2, Gemma), whose output has a
        # fixed RMS, the MLP's output points to z (its part that a normalised output can reach: the direction)
        post_norm = getattr(ours.blocks[1], "ln2_post", None)
        for j, req in enumerate(REQUESTS):
            z, h0, h1 = edit.v_star[j].double(), _block_output(hf, 1, req), _block_output(back, 1, req)
            if post_norm is None:
                assert (h1 - z).norm() <= 1e-3 * (z - h0).norm(), (name, j)
            else:
                y1 = _block_output(back, 1, req, "post_feedforward_layernorm")  # the MLP's normalised output
                gain = post_norm.gain.detach().double()
                cos = torch.cosine_similarity(y1 / gain, (z - (h1 - y1)) / gain, dim=0)
                assert cos > 1 - 1e-4, (name, j, float(cos))
        # the targets' log-probability rises on average: the top layer reaches z exactly (checked above), but a
        # batch update of a random two-layer model also moves the keys of the positions after the subject, so
        # one request's target may fall while the batch's rises
        after = [_target_nll(back, r)[1] for r in REQUESTS]
        assert sum(after) > sum(before), f"{name} {method}: log P(target) {before} → {after}"
    finally:  # undone also when a check fails, so the next test gets the unedited model
        _check_undo(name, ours, edit, saved)


def _authors(method: str) -> dict:
    return json.loads((AUTHORS / f"{method}_gpt-j-6b.json").read_text())["hparams"]


@pytest.fixture(scope="module")
def gptj_6b():
    """GPT-J 6B's shape on the meta device (no weights): what the settings read."""
    with torch.device("meta"):
        return HookedGPT2(KNOWN_CONFIGS["gpt-j-6b"])


def test_gpt_j_paper_preset_is_the_authors_rome_settings(gptj_6b):
    a = _authors("rome")
    hp = hparams_for(gptj_6b, preset="paper")
    with torch.device("meta"):  # the authors' spelling of the hub id names the same model
        assert hparams_for(HookedGPT2(gptj_6b.cfg.replace(name="gpt-j-6B")), preset="paper") == hp
    assert [hp.layer] == a["layers"]
    assert hp.v_steps == a["v_num_grad_steps"] and hp.step_count == "evaluations"  # ROME's loop passes
    assert (hp.v_lr, hp.weight_decay, hp.kl_factor) == (a["v_lr"], a["v_weight_decay"], a["kl_factor"])
    assert hp.clamp_factor == a["clamp_norm_factor"] and hp.n_samples == a["mom2_n_samples"]
    lengths = [[n, hp.prefixes_per_length] for n in hp.prefix_lengths]  # [[length, texts of it], …]
    assert hp.prefix_style == "rome" and lengths == a["context_template_length_params"]
    assert a["fact_token"] == "subject_last" and a["mom2_adjustment"] is True and a["mom2_dtype"] == "float32"
    assert a["v_loss_layer"] == gptj_6b.cfg.n_layer - 1  # the loss at the last layer's output, as ours
    assert a["rewrite_module_tmp"] == REWRITE["gptj"]


@pytest.mark.parametrize("method", ["memit", "alphaedit"])
def test_gpt_j_paper_preset_is_the_authors_memit_and_alphaedit_settings(gptj_6b, method):
    a = _authors(method)
    hp = MemitHparams.of(gptj_6b, preset="paper")
    assert list(hp.layers or ()) == a["layers"] and a["layer_selection"] == "all"
    assert hp.mom2_weight == a["mom2_update_weight"] and hp.rome.clamp_factor == a["clamp_norm_factor"]
    assert hp.rome.v_steps == a["v_num_grad_steps"] and hp.rome.step_count == "evaluations"
    assert (hp.rome.v_lr, hp.rome.weight_decay, hp.rome.kl_factor) == (a["v_lr"], a["v_weight_decay"], a["kl_factor"])
    assert hp.rome.n_samples == a["mom2_n_samples"] and hp.delta_norm == "resid"
    assert a["fact_token"] == "subject_last" and a["v_loss_layer"] == gptj_6b.cfg.n_layer - 1
    assert a["rewrite_module_tmp"] == REWRITE["gptj"]
    if method == "alphaedit":
        assert (hp.nullspace_threshold, hp.alpha) == (a["nullspace_threshold"], a["L2"])
        assert hp.nullspace_rule == "alphaedit" and hp.alpha_scale == "absolute"


def _windows(n: int = 24, width: int = 16) -> torch.Tensor:
    return torch.randint(1, VOCAB, (n, width), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def trained_sae(family):
    _, _, ours = family
    cfg = SAETrainConfig(
        hook_name="blocks.0.hook_resid_post",
        expansion=2,
        k=8,
        tokens=300,
        batch_size=50,
        buffer_tokens=150,
        lr=3e-3,
        context_size=16,
    )
    return train_sae(ours, cfg, windows=_windows(), progress=False)


def test_sae_trains_on_each_family_and_splices_in_exactly(family, trained_sae):
    name, _, ours = family
    sae, log = trained_sae
    assert log.fvu[-1] < log.fvu[0], name
    tokens = _windows(3)[:, :10]
    with torch.no_grad():
        clean = ours(tokens)
        with ours.splice(sae, use_error_term=True):
            spliced = ours(tokens)
        assert (spliced - clean).abs().max().item() <= 1e-5, name
        by_hand = ours.run_with_hooks(tokens, fwd_hooks=[(sae.cfg.hook_name, lambda x, hook: sae(x))])
        with ours.splice(sae):
            assert torch.allclose(ours(tokens), by_hand, atol=1e-5), name
        assert not torch.allclose(by_hand, clean, atol=1e-3), f"{name}: the reconstruction is not exact"


def test_saelens_reads_an_sae_of_a_gemma_model_to_the_same_latents(tmp_path):
    sae_lens = pytest.importorskip("sae_lens")
    ours = gi.from_transformers(_hf("gemma2"), tokenizer=_byte_tokenizer()).eval()
    cfg = SAETrainConfig(hook_name="blocks.1.hook_resid_pre", expansion=2, k=6, tokens=200, batch_size=50, lr=3e-3)
    sae, _ = train_sae(ours, cfg, windows=_windows(), progress=False)
    folder = sae.save(tmp_path / "gemma2-sae")
    theirs = sae_lens.SAE.load_from_disk(folder)
    again = SAE.load(folder, model=ours)  # checks the base model's fingerprint
    _, cache = ours.run_with_cache(_windows(2), names_filter=[cfg.hook_name])
    x = cache[cfg.hook_name].reshape(-1, 64)
    with torch.no_grad():
        z = sae.encode(x)
        assert (theirs.encode(x) - z).abs().max() <= 1e-5
        assert (again.encode(x) - z).abs().max() == 0
    assert int((z > 0).sum()) > 0


def _add_in_transformers(hf, ours: HookedGPT2, at: str, vec: torch.Tensor):
    """A transformers hook adding ``vec`` where our hook point ``at`` is: a block's input (``hook_resid_pre``,
    after Gemma's embedding scale), its attention's output after the post-attention norm when the block has one
    (``hook_attn_out``), its MLP's output after the post-MLP norm when the block has one (``hook_mlp_out``)."""
    block, leaf = int(at.split(".")[1]), at.rsplit(".", 1)[1]
    layer = _hf_layers(hf)[block]
    if leaf == "hook_resid_pre":

        def pre(module, args, kwargs):
            if args:
                return (args[0] + vec, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": kwargs["hidden_states"] + vec}

        return layer.register_forward_pre_hook(pre, with_kwargs=True)
    if leaf == "hook_attn_out":  # OLMo 2's and Gemma's post_attention_layernorm normalises the attention's output
        has_post = getattr(ours.blocks[block], "ln1_post", None) is not None
        module = layer.post_attention_layernorm if has_post else _hf_attention(layer)
    else:
        module = getattr(layer, "post_feedforward_layernorm", None) or layer.mlp

    def add(m, a, out):
        return (out[0] + vec, *out[1:]) if isinstance(out, tuple) else out + vec

    return module.register_forward_hook(add)


def _hf_attention(layer):
    for name in ("self_attn", "attention", "attn"):
        if hasattr(layer, name):
            return getattr(layer, name)
    raise AttributeError(f"no attention module in {type(layer).__name__}")


@pytest.mark.parametrize(
    "at", ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre", "blocks.0.hook_attn_out", "blocks.1.hook_mlp_out"]
)
def test_steering_adds_at_the_point_transformers_names_by_hand(family, at):
    name, hf, ours = family
    vec = torch.randn(64, generator=torch.Generator().manual_seed(3))
    tokens = _windows(2)[:, :12]
    with torch.no_grad():
        plain = ours(tokens)
        with steering(ours, Steer(vec, at, scale=2.0)):
            steered = ours(tokens)
        by_hand = ours.run_with_hooks(tokens, fwd_hooks=[(at, lambda x, hook: x + 2.0 * vec)])
        handle = _add_in_transformers(hf, ours, at, 2.0 * vec)
        try:
            theirs = hf(tokens).logits
        finally:
            handle.remove()
    assert torch.equal(steered, by_hand), name
    assert (steered - theirs).abs().max().item() < 1e-4, (name, (steered - theirs).abs().max().item())
    assert (steered - plain).abs().max().item() > 1e-2, name
