"""TransformerLens idioms, run unchanged against our model and against TransformerLens 3.9 built from
the same weights: each idiom below is ONE function ``idiom(model, utils)`` called with
``(HookedTransformer, transformer_lens.utils)`` and with ``(HookedGPT2, gpt2_interp.utils)``, so
"ports by changing the import" is what is measured, and the returned values must agree within 1e-4.

``IDIOMS`` is the list of everyday idioms counted in docs/porting.md; ``DELIBERATE`` are the lines
whose result differs on purpose (documented and warned about); the last tests check our own
exactness claims that TransformerLens does not make.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import gpt2_interp as gi
from gpt2_interp import utils as our_utils
from gpt2_interp.model import PortingWarning

TEXT = "The quick brown fox jumps over the lazy dog"
ATOL = 1e-4
MAX_DELTA: dict[str, float] = {}  # idiom -> max |Δ| against TransformerLens (printed by the summary test)


def _hf_gpt2_tokenizer():
    """transformers' GPT2TokenizerFast built offline from our shipped BPE ranks (for TransformerLens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from gpt2_interp.io.tokenizer import gpt2_encoding

    enc = gpt2_encoding()
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_char = {b: chr(c) for b, c in zip(bs, cs)}
    ranks = enc._mergeable_ranks

    def uni(t):
        return "".join(byte_char[b] for b in t)

    vocab = {uni(t): r for t, r in ranks.items()}
    vocab["<|endoftext|>"] = 50256
    merges = []
    for t, r in ranks.items():
        if len(t) < 2:
            continue
        for i in range(1, len(t)):
            a, b = t[:i], t[i:]
            if a in ranks and b in ranks and ranks[a] < r and ranks[b] < r:
                merges.append((r, ranks[a], ranks[b], uni(a), uni(b)))
    merges.sort()
    tk = Tokenizer(models.BPE(vocab, [(m[3], m[4]) for m in merges]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )


def _gpt2_tokenizer_fast():
    """transformers' GPT2TokenizerFast (the class Hugging Face and TransformerLens use for gpt2), from the same BPE."""
    import json

    from transformers import GPT2TokenizerFast

    backend = json.loads(_hf_gpt2_tokenizer().backend_tokenizer.to_str())["model"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in backend["merges"]]
    return GPT2TokenizerFast(vocab=backend["vocab"], merges=merges, pad_token="<|endoftext|>")  # pad: as TL sets it


VARIED = [
    "The quick brown fox",
    "  leading spaces",
    "naïve café — “quotes” 😀 日本語",
    "<|endoftext|>Hello<|endoftext|>",
    "a\n\nb\tc",
    "It's don't we'll 123 4567.89",
    "Hello , world . Isn't ?",
    "x",
]


@pytest.fixture(scope="module", autouse=True)
def _print_max_deltas():
    """Prints the max |Δ| against TransformerLens per idiom when the module ends (pytest -s)."""
    yield
    print("\nmax |Δ| vs TransformerLens:", {k: f"{v:.1e}" for k, v in MAX_DELTA.items()})


@pytest.fixture(scope="module")
def pair(tl_from_hf, tmp_path_factory):
    """(ours, TransformerLens, TL utils): a random 2-layer GPT-2 (vocab 50257, d_model 64) in both."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(1)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=64)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(torch.randn_like(p) * 0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from transformer_lens import utils as tl_utils
    ref = tl_from_hf(hf)
    path = tmp_path_factory.mktemp("gpt2_tokenizer")  # TL reloads the tokenizer by its path
    _hf_gpt2_tokenizer().save_pretrained(path)
    from transformers import AutoTokenizer

    ref.set_tokenizer(AutoTokenizer.from_pretrained(path))
    return gi.from_transformers(hf).eval(), ref, tl_utils


def _flat(x):
    """Every tensor/number in a nested result, as a flat list of float tensors (strings compared apart)."""
    if isinstance(x, torch.Tensor):
        return [x.detach().float()]
    if isinstance(x, (int, float, bool)):
        return [torch.tensor(float(x))]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _flat(v)]
    if isinstance(x, dict):
        return [t for k in sorted(x) for t in _flat(x[k])]
    if isinstance(x, str):
        return []
    raise TypeError(type(x))


def _strings(x):
    if isinstance(x, str):
        return [x]
    if isinstance(x, (list, tuple)):
        return [s for v in x for s in _strings(v)]
    if isinstance(x, dict):
        return [s for k in sorted(x) for s in _strings(x[k])]
    return []


# ---------------------------------------------------------------------------------------------------- idioms
def cfg_names(model, utils):
    c = model.cfg
    return [c.n_layers, c.n_heads, c.d_head, c.d_model, c.d_mlp, c.d_vocab, c.n_ctx]


def tokens_and_strings(model, utils):
    tokens = model.to_tokens(TEXT)
    return [
        tokens,
        model.to_str_tokens(TEXT),
        model.to_string(tokens[0, 1:]),
        model.to_string(int(tokens[0, 2])),
        model.to_single_token(" fox"),
        model.to_tokens(TEXT, prepend_bos=False),
    ]


def logits_and_loss(model, utils):
    tokens = model.to_tokens(TEXT)
    return [
        model(tokens),
        model(tokens, return_type="loss"),
        model(TEXT, return_type="loss", loss_per_token=True),
        model(TEXT, prepend_bos=False),
    ]


def cache_shorthands(model, utils):
    _, cache = model.run_with_cache(TEXT)
    return [
        cache["resid_post", -1],
        cache["embed"],
        cache["pos_embed"],
        cache[utils.get_act_name("k", 1)],
        cache["pattern", 1, "attn"],
        cache["scale", 1, "ln2"],
        cache["z", 0],
        cache["q", 0],
        cache["blocks.0.hook_mlp_out"],
        cache[utils.get_act_name("resid_pre", 1)],
        utils.get_act_name("scale", 1, "ln1"),
    ]


def cache_filter_and_keys(model, utils):
    _, cache = model.run_with_cache(TEXT, names_filter=lambda n: n.endswith("resid_post"))
    return [sorted(cache.keys()), [cache[k] for k in sorted(cache.keys())]]


def ablate_head_hook(model, utils):
    def ablate(z, hook):
        z[:, :, 1] = 0.0
        return z

    return model.run_with_hooks(TEXT, fwd_hooks=[(utils.get_act_name("z", 0), ablate)], return_type="loss")


def keyword_only_hook(model, utils):
    """TransformerLens calls a hook as ``fn(activation, hook=hook_point)``: a keyword-only ``hook`` works."""
    names = []

    def scale(act, *, hook):
        names.append(hook.name)
        return act * 0.5

    return [model.run_with_hooks(TEXT, fwd_hooks=[("blocks.0.hook_mlp_out", scale)]), names]


def hook_layer_and_filter(model, utils):
    seen = []

    def record(act, hook):
        seen.append(hook.layer())

    model.run_with_hooks(TEXT, fwd_hooks=[(lambda n: n.endswith("hook_attn_out"), record)])
    return seen


def hooks_context(model, utils):
    def double(act, hook):
        return act * 2

    with model.hooks(fwd_hooks=[("blocks.1.hook_mlp_out", double)]):
        hooked = model(TEXT)
    return [hooked, model(TEXT)]


def add_and_reset_hooks(model, utils):
    def zero(act, hook):
        return torch.zeros_like(act)

    model.add_hook(lambda n: n.endswith("hook_attn_out"), zero)
    n_fwd = len(model.hook_dict["blocks.0.hook_attn_out"].fwd_hooks)
    ablated = model(TEXT)
    model.reset_hooks()
    return [n_fwd, ablated, len(model.hook_dict["blocks.0.hook_attn_out"].fwd_hooks), model(TEXT)]


def permanent_and_prepend(model, utils):
    order = []
    model.add_hook("blocks.0.hook_resid_pre", lambda a, hook: order.append("perm"), is_permanent=True)
    model.add_hook("blocks.0.hook_resid_pre", lambda a, hook: order.append("first"), prepend=True)
    model(TEXT)
    model.reset_hooks()
    kept = len(model.hook_dict["blocks.0.hook_resid_pre"].fwd_hooks)
    model.reset_hooks(including_permanent=True)
    return [len(order), order == ["first", "perm"], kept, len(model.hook_dict["blocks.0.hook_resid_pre"].fwd_hooks)]


def backward_hooks(model, utils):
    grads = {}

    def save_grad(grad, hook):
        grads[hook.name] = grad.detach().clone()

    with model.hooks(bwd_hooks=[(utils.get_act_name("resid_mid", 1), save_grad), ("hook_embed", save_grad)]):
        model(TEXT, return_type="loss").backward()
    model.zero_grad()
    return grads


def add_hook_bwd(model, utils):
    grads = []
    model.add_hook(utils.get_act_name("resid_post", 0), lambda g, hook: grads.append(g.detach().clone()), dir="bwd")
    model(TEXT, return_type="loss").backward()
    model.reset_hooks()
    model.zero_grad()
    return grads


def accumulated_resid(model, utils):
    _, cache = model.run_with_cache(TEXT)
    return [
        cache.accumulated_resid(layer=-1, incl_mid=True, pos_slice=-1, return_labels=True),
        cache.accumulated_resid(layer=1, return_labels=True),
        cache.accumulated_resid(),
    ]


def decompose_resid(model, utils):
    _, cache = model.run_with_cache(TEXT)
    return [cache.decompose_resid(return_labels=True), cache.decompose_resid(layer=1, mode="attn", pos_slice=-1)]


def stack_head_results(model, utils):
    _, cache = model.run_with_cache(TEXT)
    return [cache.stack_head_results(layer=-1, return_labels=True), cache.stack_head_results(layer=1, pos_slice=-1)]


def stack_neuron_results(model, utils):
    _, cache = model.run_with_cache(TEXT)
    return cache.stack_neuron_results(layer=-1, pos_slice=-1, return_labels=True)


def full_decomposition_sums_to_resid(model, utils):
    _, cache = model.run_with_cache(TEXT)
    full = cache.get_full_resid_decomposition(expand_neurons=True)
    return [full.shape[0], full.sum(0), cache["resid_post", -1]]


def pos_slice_and_batch_dim(model, utils):
    _, sliced = model.run_with_cache(TEXT, pos_slice=-1, names_filter=lambda n: "resid" in n)
    _, single = model.run_with_cache(TEXT, remove_batch_dim=True)
    return [sliced["resid_post", 1], single["resid_post", 0], single["pattern", 0]]


def stacked_weights(model, utils):
    return [
        model.W_Q,
        model.W_K,
        model.W_V,
        model.W_O,
        model.b_Q,
        model.b_K,
        model.b_V,
        model.b_O,
        model.W_in,
        model.W_out,
        model.b_in,
        model.b_out,
        model.W_U,
        model.b_U,
        model.W_E,
        model.W_pos,
    ]


def factored_circuits(model, utils):
    return [model.OV.AB, model.QK.AB, model.OV[1, 2].AB, model.OV.shape[-1]]


def token_directions_and_positions(model, utils):
    return [
        model.tokens_to_residual_directions(" fox"),
        model.tokens_to_residual_directions(torch.tensor([5, 7])),
        model.get_token_position(" the", TEXT),
        model.get_token_position(" the", TEXT, mode="last"),
    ]


def logit_attrs_unscaled(model, utils):
    """TL's logit_attrs applies ln_final's scale (ours also its gain): compare the part both share,
    a stack that the norm maps to itself up to the gain, via tokens_to_residual_directions."""
    _, cache = model.run_with_cache(TEXT)
    stack = cache.decompose_resid(layer=-1, pos_slice=-1)
    direction = model.tokens_to_residual_directions(" dog") - model.tokens_to_residual_directions(" cat")
    return stack @ direction


def greedy_generate_tokens(model, utils):
    tokens = model.to_tokens("The quick brown")
    return model.generate(
        tokens, max_new_tokens=5, do_sample=False, use_past_kv_cache=True, verbose=False, stop_at_eos=False
    )


def own_hooked_module(model, utils):
    mod = model.__class__.__mro__  # the base class comes from the library under test
    base = next(c for c in mod if c.__name__ == "HookedRootModule")
    hp_cls = type(model.hook_dict["hook_embed"])

    class Tiny(base):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(3, 3)
            self.hook_mid = hp_cls()
            self.setup()

        def forward(self, x):
            return self.hook_mid(self.lin(x)).relu()

    torch.manual_seed(0)
    m = Tiny()
    x = torch.randn(2, 3)
    out, cache = m.run_with_cache(x)
    ablated = m.run_with_hooks(x, fwd_hooks=[("hook_mid", lambda a, hook: a * 0)])
    return [out, cache["hook_mid"], ablated]


def cfg_device_and_dtype(model, utils):
    x = torch.zeros(2, 3, device=model.cfg.device)
    return [str(model.cfg.device), str(x.device), str(model.cfg.dtype), x]


def tokenizer_object(model, utils):
    tok = model.tokenizer
    tokens = model.to_tokens(["Hello world", TEXT], padding_side="right")
    return [
        tok.decode(tokens[1]),
        tok.batch_decode(tokens),
        tok.decode(tokens[1, 1:], skip_special_tokens=True),
        tok.batch_decode(tokens, skip_special_tokens=True),
        tok.convert_ids_to_tokens(tokens[1].tolist()),
        tok.convert_ids_to_tokens(int(tokens[1, 3])),
        tok.decode(int(tokens[1, 2])),
        tok.bos_token_id,
        tok.eos_token_id,
        tok.pad_token_id,
        tok.bos_token,
        tok.eos_token,
        tok.padding_side,
        tok.vocab_size,
        len(tok),
    ]


def attn_result_opt_in(model, utils):
    def ablate(result, hook):
        result[:, :, 2] = 0.0
        return result

    model.set_use_attn_result(True)
    _, cache = model.run_with_cache(TEXT)
    loss = model.run_with_hooks(TEXT, fwd_hooks=[(utils.get_act_name("result", 0), ablate)], return_type="loss")
    heads = cache.stack_head_results(layer=-1, return_labels=True)
    model.set_use_attn_result(False)
    _, off = model.run_with_cache(TEXT)
    return [cache["result", 1], cache[utils.get_act_name("result", 0)], heads, loss, "blocks.0.attn.hook_result" in off]


def attn_result_via_cfg(model, utils):
    model.cfg.use_attn_result = True
    logits, cache = model.run_with_cache(TEXT, names_filter=lambda n: n.endswith("hook_result"))
    model.cfg.use_attn_result = False
    return [sorted(cache.keys()), [cache[k] for k in sorted(cache.keys())], logits]


def hook_point_add_hook_directly(model, utils):
    """Hooks added on a HookPoint itself: backward, prepended, permanent; TL's remove_hooks() defaults."""
    grads, order = [], []
    hp = model.blocks[0].hook_resid_post
    hp.add_hook(lambda g, hook: grads.append(g.detach().clone()), dir="bwd")
    hp.add_hook(lambda a, hook: order.append("perm"), is_permanent=True)
    hp.add_hook(lambda a, hook: order.append("first"), prepend=True)
    model(TEXT, return_type="loss").backward()
    model.zero_grad()
    counts = [len(hp.fwd_hooks), len(hp.bwd_hooks)]
    hp.remove_hooks()  # TL's defaults: forward hooks that are not permanent
    counts += [len(hp.fwd_hooks), len(hp.bwd_hooks)]
    hp.remove_hooks("both", including_permanent=True)
    counts += [len(hp.fwd_hooks), len(hp.bwd_hooks)]
    return [grads, order, counts]


def hook_ctx_and_reset(model, utils):
    """State kept in ``hook.ctx`` between calls, emptied by reset_hooks()."""

    def remember(act, hook):
        hook.ctx["norm"] = act.norm()

    model.add_hook(utils.get_act_name("resid_mid", 1), remember)
    model(TEXT)
    hp = model.hook_dict["blocks.1.hook_resid_mid"]
    kept = hp.ctx["norm"]
    model.reset_hooks()
    return [kept, len(hp.ctx)]


def unembed_hooks_and_module(model, utils):
    """``unembed.hook_in``/``hook_out`` in the cache and as hooks; ``model.unembed(x)`` as a function."""
    logits, cache = model.run_with_cache(TEXT, names_filter=lambda n: n.startswith("unembed"))
    halved = model.run_with_hooks(TEXT, fwd_hooks=[("unembed.hook_out", lambda a, hook: a / 2)])
    zeroed = model.run_with_hooks(TEXT, fwd_hooks=[("unembed.hook_in", lambda a, hook: a * 0)])
    return [
        sorted(cache.keys()),
        cache["unembed.hook_in"],
        cache["unembed.hook_out"] - logits,
        halved,
        zeroed,
        model.unembed(cache["unembed.hook_in"]),
        model.unembed.W_U,
        model.unembed.b_U,
    ]


def embed_modules_called(model, utils):
    """``model.embed(tokens)`` and ``model.pos_embed(tokens, past_kv_pos_offset=, attention_mask=)``."""
    tokens = model.to_tokens(["Hello world", TEXT], padding_side="right")
    mask = (tokens != model.tokenizer.pad_token_id).long()
    mask[:, 0] = 1
    return [
        model.embed(tokens),
        model.pos_embed(tokens),
        model.pos_embed(tokens[:, :3], past_kv_pos_offset=2),
        model.pos_embed(tokens, attention_mask=mask),
        model.embed(tokens) + model.pos_embed(tokens) - model.run_with_cache(tokens)[1]["resid_pre", 0],
    ]


def cache_helpers(model, utils):
    """get_neuron_results, compute_head_results, apply_slice_to_batch_dim, toggle_autodiff."""
    tokens = model.to_tokens([TEXT, "A lazy dog jumps over the quick brown fox"], padding_side="right")
    _, cache = model.run_with_cache(tokens)
    direction = model.W_U[:, model.to_single_token(" dog")]
    out = [
        cache.get_neuron_results(1),
        cache.get_neuron_results(0, neuron_slice=[0, 3, 7], pos_slice=-1),
        cache.get_neuron_results(-1, neuron_slice=(2, 10), pos_slice=(1, 4), project_output_onto=direction),
        cache.get_neuron_results(1, neuron_slice=5),
        cache.get_neuron_results(0, pos_slice=2, project_output_onto=model.W_U[:, :3]),
    ]
    cache.compute_head_results()
    out += [cache["result", 0], cache[utils.get_act_name("result", 1)]]
    first = cache.apply_slice_to_batch_dim(0)
    pair = cache.apply_slice_to_batch_dim((0, 2))
    out += [first["resid_post", 1], first.has_batch_dim, pair["pattern", 0], pair.has_batch_dim, len(first)]
    cache.toggle_autodiff(False)
    off = torch.is_grad_enabled()
    cache.toggle_autodiff(True)
    return [*out, off, torch.is_grad_enabled()]


def utils_helpers(model, utils):
    """utils.get_act_name, utils.to_numpy and the printed report of utils.test_prompt."""
    import contextlib
    import io

    _, cache = model.run_with_cache(TEXT)
    printed = []
    for args in (("The quick brown fox jumps over the lazy", "dog"), ("The quick brown", [" fox", "cat", " dog"])):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            utils.test_prompt(*args, model, top_k=5)
        printed.append(" ".join(out.getvalue().split()))  # TL prints through rich (which may wrap lines)
    return [
        utils.get_act_name("resid_post", 1),
        utils.get_act_name("scale", 0, "ln2"),
        torch.as_tensor(utils.to_numpy(cache["resid_post", 1])),
        torch.as_tensor(utils.to_numpy([1.0, 2.0])),
        torch.as_tensor(utils.to_numpy(model.W_E.bfloat16()[:3])),
        printed,
    ]


def state_dict_by_transformer_lens_names(model, utils):
    """TransformerLens's names read from ``model.state_dict()`` (unfused W_Q/W_K/W_V, unembed)."""
    sd = model.state_dict()
    names = [f"blocks.{i}.attn.{w}_{x}" for i in range(2) for w in "Wb" for x in "QKVO"]
    return [sd[n] for n in names] + [sd["unembed.W_U"], sd["unembed.b_U"], sd["embed.W_E"], sd["blocks.1.mlp.W_in"]]


IDIOMS = [
    cfg_names,
    tokens_and_strings,
    logits_and_loss,
    cache_shorthands,
    cache_filter_and_keys,
    ablate_head_hook,
    keyword_only_hook,
    hook_layer_and_filter,
    hooks_context,
    add_and_reset_hooks,
    permanent_and_prepend,
    backward_hooks,
    add_hook_bwd,
    accumulated_resid,
    decompose_resid,
    stack_head_results,
    stack_neuron_results,
    full_decomposition_sums_to_resid,
    pos_slice_and_batch_dim,
    stacked_weights,
    factored_circuits,
    token_directions_and_positions,
    logit_attrs_unscaled,
    greedy_generate_tokens,
    own_hooked_module,
    cfg_device_and_dtype,
    tokenizer_object,
    attn_result_opt_in,
    attn_result_via_cfg,
    hook_point_add_hook_directly,
    hook_ctx_and_reset,
    unembed_hooks_and_module,
    embed_modules_called,
    cache_helpers,
    utils_helpers,
    state_dict_by_transformer_lens_names,
]


@pytest.mark.parametrize("idiom", IDIOMS, ids=lambda f: f.__name__)
def test_idiom_ports_unchanged_and_matches_transformer_lens(pair, idiom):
    ours, ref, tl_utils = pair
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TL's deprecation notices and its hook_result recomputation
        want = idiom(ref, tl_utils)
    got = idiom(ours, our_utils)
    assert _strings(got) == _strings(want)
    a, b = _flat(got), _flat(want)
    assert len(a) == len(b)
    delta = 0.0
    for x, y in zip(a, b):
        assert x.shape == y.shape, (x.shape, y.shape)
        delta = max(delta, (x - y).abs().max().item() if x.numel() else 0.0)
    MAX_DELTA[idiom.__name__] = delta
    assert delta <= ATOL


# ---------------------------------------------------------------------------------------------------- exactness
def test_apply_ln_decomposition_sums_to_the_models_logits(pair):
    """Our apply_ln is the real ln_final linearised at the recorded scale (gain included), so the
    components' logits plus the one bias term equal the model's logits; TransformerLens's, on the same
    unfolded weights, leaves out the gain."""
    ours, ref, _ = pair
    logits, cache = ours.run_with_cache(TEXT)
    full = cache.get_full_resid_decomposition()
    total = (cache.apply_ln_to_stack(full) @ ours.W_U).sum(0) + cache.ln_bias_logits()
    assert (total - logits).abs().max().item() <= ATOL
    # the same line on TransformerLens (unfolded) is off
    _, tl_cache = ref.run_with_cache(TEXT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tl_full = tl_cache.get_full_resid_decomposition()
        tl_total = (tl_cache.apply_ln_to_stack(tl_full) @ ref.W_U).sum(0) + ref.b_U
    assert (tl_total - logits).abs().max().item() > 1e-2


def test_logit_attrs_are_transformer_lens_times_the_final_gain_and_sum_to_the_logit_difference(pair):
    ours, ref, _ = pair
    dog, cat = ours.to_single_token(" dog"), ours.to_single_token(" cat")
    logits, cache = ours.run_with_cache(TEXT)
    stack = cache.get_full_resid_decomposition(pos_slice=-1)
    attrs = cache.logit_attrs(stack, tokens=dog, incorrect_tokens=cat, pos_slice=-1)
    bias = cache.ln_bias_logits()
    assert (attrs.sum(0) + bias[dog] - bias[cat] - (logits[:, -1, dog] - logits[:, -1, cat])).abs().max() <= ATOL
    _, tl_cache = ref.run_with_cache(TEXT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tl_stack = tl_cache.decompose_resid(layer=-1, pos_slice=-1)
        tl_scaled = tl_cache.apply_ln_to_stack(tl_stack, layer=-1, pos_slice=-1)
    direction = ref.W_U[:, dog] - ref.W_U[:, cat]
    want = (tl_scaled * ref.ln_final.w) @ direction
    got = cache.logit_attrs(
        cache.decompose_resid(layer=-1, pos_slice=-1), tokens=dog, incorrect_tokens=cat, pos_slice=-1
    )
    assert (got - want).abs().max() <= ATOL


def test_head_results_plus_remainder_sum_to_the_residual(pair):
    ours, _, _ = pair
    _, cache = ours.run_with_cache(TEXT)
    heads = cache.stack_head_results(incl_remainder=True)
    assert (heads.sum(0) - cache["resid_post", -1]).abs().max().item() <= ATOL
    assert not any("hook_result" in k for k in cache)  # nothing per-head was materialised


def test_backward_hooks_never_outlive_their_context(pair):
    ours, _, _ = pair
    fired = []
    with ours.hooks(bwd_hooks=[("hook_embed", lambda g, hook: fired.append(1))]):
        loss = ours(TEXT, return_type="loss")
    loss.backward()  # the context has closed: the hook must not fire
    ours.zero_grad()
    assert fired == []
    with (
        pytest.raises(RuntimeError),
        ours.hooks(fwd_hooks=[("hook_embed", lambda a, hook: None)], bwd_hooks=[("hook_embed", lambda g, hook: None)]),
    ):
        raise RuntimeError("body fails")
    assert all(not hp.fwd_hooks and not hp.bwd_hooks for hp in ours.hook_dict.values())


def test_left_padding_is_loud_and_right_padding_matches_transformer_lens(pair):
    ours, ref, _ = pair
    texts = ["Hello", "The quick brown fox"]
    with pytest.warns(PortingWarning, match="LEFT"):
        left = ours.to_tokens(texts)
    assert left[0, -1] == ours.to_single_token("Hello")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PortingWarning)
        right = ours.to_tokens(texts, padding_side="right")
    assert torch.equal(right, ref.to_tokens(texts))


def test_return_type_none_fires_ln_final_hooks_like_transformer_lens(pair):
    ours, ref, _ = pair
    for model in (ours, ref):
        _, cache = model.run_with_cache(TEXT, return_type=None, names_filter="ln_final.hook_scale")
        assert "ln_final.hook_scale" in cache


@pytest.mark.slow  # TransformerLens's unbatched sweeps
@pytest.mark.parametrize(
    "fn",
    [
        # TransformerLens's pattern sweep runs one forward per (layer, head, destination, source) cell: the
        # longest of these oracle runs, so in the full lane only
        pytest.param(n, marks=pytest.mark.full) if n.endswith("pattern_dest_src_pos") else n
        for n in sorted(dir(__import__("gpt2_interp.analysis.tl_patching", fromlist=["x"])))
        if n.startswith("get_act_patch_")
    ],
)
def test_tl_patching_call_shape_matches_transformer_lens(pair, fn):
    ours, ref, _ = pair
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from transformer_lens import patching as tl_patching
    from gpt2_interp.analysis import tl_patching as our_patching

    clean, corrupted = ours.to_tokens(["The capital of France is", "The capital of Italy is"], padding_side="right")
    dog, cat = ours.to_single_token(" Paris"), ours.to_single_token(" Rome")

    def metric(logits):  # a TL metric on full logits [batch, pos, d_vocab]
        return (logits[:, -1, dog] - logits[:, -1, cat]).mean()

    results = []
    for model, lib in ((ref, tl_patching), (ours, our_patching)):
        _, clean_cache = model.run_with_cache(clean[None])
        results.append(getattr(lib, fn)(model, corrupted[None], clean_cache, metric))
    want, got = results
    assert got.shape == want.shape
    MAX_DELTA[fn] = (got.cpu() - want.cpu()).abs().max().item()
    assert MAX_DELTA[fn] <= ATOL


def test_decomposition_sums_to_the_logits_on_a_llama_config():
    """The same cache methods on RMSNorm, RoPE, SwiGLU, grouped-query attention and no biases:
    every head, neuron and embedding through the real (uncentred) ln_final sums to the logits."""
    from gpt2_interp.model import HookedGPT2
    from tests.families_cases import llama_like_config

    # GPT-2's vocabulary: TEXT goes through GPT-2's tokenizer
    model = HookedGPT2(llama_like_config(d_vocab=50257), seed=0).eval()
    with torch.no_grad():
        model.ln_final.w.add_(torch.randn_like(model.ln_final.w) * 0.2)
    logits, cache = model.run_with_cache(TEXT)
    full = cache.get_full_resid_decomposition(apply_ln=True)
    assert ((full @ model.W_U).sum(0) + cache.ln_bias_logits() - logits).abs().max().item() <= ATOL
    assert (cache.stack_head_results(incl_remainder=True).sum(0) - cache["resid_post", -1]).abs().max() <= ATOL


# ---------------------------------------------------------------------------------------------------- surface
def test_cfg_device_and_dtype_follow_the_model_and_the_config_stays_a_shared_value(pair):
    import copy

    ours, _, _ = pair
    shared = ours.cfg.config
    assert ours.cfg == shared and hash(ours.cfg) == hash(shared) and ours.cfg.to_dict() == shared.to_dict()
    moved = copy.deepcopy(ours).to("meta")  # a device move without a GPU: the copy's cfg follows the copy
    assert moved.cfg.device.type == "meta" and ours.cfg.device.type == "cpu"
    assert copy.deepcopy(ours).double().cfg.dtype == torch.float64 and ours.cfg.dtype == torch.float32
    twin = gi.HookedGPT2(ours.cfg)  # a config read off one model builds another, with its own view
    assert twin.cfg == ours.cfg and twin.cfg.use_attn_result is False
    with pytest.raises(AttributeError, match=r"model\.to"):
        ours.cfg.device = "cuda"
    with pytest.raises(AttributeError, match="no such switch"):
        ours.cfg.ungroup_grouped_query_attention = True  # a TransformerLens flag we lack must not be a silent no-op
    with pytest.raises(Exception, match="frozen"):
        ours.cfg.n_layer = 3


def test_hook_result_is_materialised_only_when_asked(pair):
    ours, _, _ = pair
    fired = []
    with ours.hooks(fwd_hooks=[("blocks.0.attn.hook_result", lambda a, hook: fired.append(a.shape))]):
        plain = ours(TEXT)
    assert fired == []  # off: the per-head result is never computed (as in TransformerLens)
    ours.set_use_attn_result(True)
    try:
        with ours.hooks(fwd_hooks=[("blocks.0.attn.hook_result", lambda a, hook: fired.append(a.shape))]):
            on = ours(TEXT)
    finally:
        ours.set_use_attn_result(False)
    assert fired == [(1, 10, 4, 64)] and (on - plain).abs().max().item() <= ATOL


def _bos_free_equal(ours_tok, ref_tok, texts):
    """Every Hugging Face call of ours equals ``ref_tok``'s on ``texts`` (ids, masks, strings)."""
    for t in texts:
        ids = ours_tok.encode(t)
        assert ids == ref_tok.encode(t), t
        assert dict(ours_tok(t)) == dict(ref_tok(t)), t
        assert ours_tok.decode(ids) == ref_tok.decode(ids), t
        assert ours_tok.decode(ids, skip_special_tokens=True) == ref_tok.decode(ids, skip_special_tokens=True), t
        assert ours_tok.convert_ids_to_tokens(ids) == ref_tok.convert_ids_to_tokens(ids), t
        assert ours_tok.convert_tokens_to_ids(ours_tok.convert_ids_to_tokens(ids)) == ids
    for side in ("right", "left"):
        ours_tok.padding_side = ref_tok.padding_side = side
        a = ours_tok(texts, padding=True, return_tensors="pt")
        b = ref_tok(texts, padding=True, return_tensors="pt")
        assert torch.equal(a.input_ids, b["input_ids"]) and torch.equal(a["attention_mask"], b["attention_mask"])
        assert ours_tok.batch_decode(a.input_ids) == ref_tok.batch_decode(b["input_ids"])
    assert (
        ours_tok.encode(texts[0], return_tensors="pt").tolist()
        == ref_tok.encode(texts[0], return_tensors="pt").tolist()
    )


def test_tokenizer_equals_hugging_face_gpt2_and_bos_is_a_stated_choice(pair):
    """Without BOS ours equals transformers' GPT2TokenizerFast on varied text; TransformerLens 3.9
    reloads its tokenizer with add_bos_token=True (under transformers 5 its encode and call prepend BOS):
    until a choice is stated ours warns, and add_bos_token=True equals TransformerLens's tokenizer."""
    from gpt2_interp.io.tokenizer import GPT2Tokenizer

    ours, ref, _ = pair
    tok = GPT2Tokenizer()
    with pytest.warns(PortingWarning, match="add_bos_token"):
        assert tok.encode(TEXT) == ours.to_tokens(TEXT)[0, 1:].tolist()
    with pytest.warns(PortingWarning, match="add_bos_token"):
        tok([TEXT])
    with warnings.catch_warnings():
        warnings.simplefilter("error", PortingWarning)
        assert tok.encode(TEXT, add_special_tokens=False) == ours.to_tokens(TEXT, prepend_bos=False)[0].tolist()
        tok.add_bos_token = False
        _bos_free_equal(tok, _gpt2_tokenizer_fast(), VARIED)
        tok.add_bos_token = True
        tl_tok = ref.tokenizer
        _bos_free_equal(tok, tl_tok, VARIED)
        assert tok.encode(TEXT) == ours.to_tokens(TEXT)[0].tolist()  # TransformerLens's: BOS first
    assert ours.tokenizer is not GPT2Tokenizer() and ours.tokenizer.padding_side == "right"


def test_a_padding_side_set_on_the_tokenizer_is_honoured_by_to_tokens_as_in_transformer_lens(pair):
    ours, ref, _ = pair
    texts = ["Hello", "The quick brown fox"]
    try:
        for side in ("left", "right"):
            ours.tokenizer.padding_side = ref.tokenizer.padding_side = side
            with warnings.catch_warnings():
                warnings.simplefilter("error", PortingWarning)
                assert torch.equal(ours.to_tokens(texts), ref.to_tokens(texts))
    finally:
        ours.tokenizer.__dict__.pop("_padding_side", None)
        ref.tokenizer.padding_side = "right"


def test_generate_defaults_are_transformer_lens_sampling_and_greedy_is_asked_for(pair):
    """TL's generate samples at temperature 1 for 10 tokens by default; ours does the same (quietly),
    and do_sample=False / temperature=0 are greedy — equal to TL's greedy tokens."""
    ours, ref, _ = pair
    with warnings.catch_warnings():
        warnings.simplefilter("error", PortingWarning)
        tokens = ours.to_tokens("The quick")
        sampled = [ours.generate(tokens, stop_at_eos=False, seed=s) for s in range(4)]
        assert all(t.shape == (1, tokens.shape[1] + 10) for t in sampled)  # TL's 10 new tokens
        assert len({tuple(t[0].tolist()) for t in sampled}) > 1  # it samples
        assert torch.equal(
            ours.generate(tokens, stop_at_eos=False, seed=7), ours.generate(tokens, stop_at_eos=False, seed=7)
        )
        greedy = ours.generate(tokens, max_new_tokens=5, stop_at_eos=False, do_sample=False)
        assert torch.equal(ours.generate(tokens, max_new_tokens=5, stop_at_eos=False, temperature=0), greedy)
    want = ref.generate(tokens, max_new_tokens=5, stop_at_eos=False, do_sample=False, verbose=False)
    assert torch.equal(greedy, want)


def test_from_pretrained_loads_through_load_and_says_it_never_folds(pair):
    import transformers

    with pytest.warns(PortingWarning, match="never folds"):
        model = gi.HookedTransformer.from_pretrained("gpt2-facts")
    with warnings.catch_warnings():
        warnings.simplefilter("error", PortingWarning)
        quiet = gi.HookedTransformer.from_pretrained_no_processing("gpt2-facts", dtype="float32")
        again = gi.HookedTransformer.from_pretrained(
            "gpt2-facts", fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False
        )
    ref = gi.load("gpt2-facts")
    tokens = ref.to_tokens("The capital of France is")
    for m in (model, quiet, again):
        assert torch.equal(m(tokens), ref(tokens))
    torch.manual_seed(1)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, n_positions=16)).eval()
    with pytest.warns(PortingWarning):
        from_hf = gi.HookedTransformer.from_pretrained("gpt2", hf_model=hf, dtype=torch.float64)
    assert from_hf.cfg.dtype == torch.float64
    assert (from_hf(tokens).float() - hf(tokens).logits).abs().max().item() <= ATOL
    with pytest.raises(ValueError, match="not supported"):
        gi.HookedTransformer.from_pretrained_no_processing("gpt2-facts", n_devices=2)
    left = gi.HookedTransformer.from_pretrained_no_processing("gpt2-facts", default_padding_side="left")
    assert left.tokenizer.padding_side == "left" and ref.tokenizer.padding_side == "right"


# ---------------------------------------------------------------------------------------------------- Llama / GQA
@pytest.fixture(scope="module")
def llama_pair():
    """(ours, TransformerLens) on one random Llama-style model: RMSNorm, RoPE, SwiGLU, GQA (4 heads, 2 kv), no
    biases."""
    from tests.families_cases import hf_llama, tl_llama

    hf = hf_llama()
    return gi.from_transformers(hf).eval(), tl_llama(hf)


def stacked_weights_rotary(model, utils):
    """:func:`stacked_weights` on a rotary model (no W_pos)."""
    return [
        model.W_Q,
        model.W_K,
        model.W_V,
        model.W_O,
        model.b_Q,
        model.b_K,
        model.b_V,
        model.b_O,
        model.W_in,
        model.W_out,
        model.b_in,
        model.b_out,
        model.W_U,
        model.b_U,
        model.W_E,
    ]


@pytest.mark.parametrize("idiom", [stacked_weights_rotary, factored_circuits], ids=lambda f: f.__name__)
def test_stacked_weights_and_zero_biases_on_a_grouped_query_llama_match_transformer_lens(llama_pair, idiom):
    """No biases: TransformerLens's zeros of the same shapes; grouped-query W_K/W_V/b_K/b_V repeated per query head."""
    ours, ref = llama_pair
    got, want = _flat(idiom(ours, our_utils)), _flat(idiom(ref, None))
    assert [g.shape for g in got] == [w.shape for w in want]
    MAX_DELTA[f"llama_{idiom.__name__}"] = max((g - w).abs().max().item() for g, w in zip(got, want))
    assert MAX_DELTA[f"llama_{idiom.__name__}"] <= ATOL


# ---------------------------------------------------------------------------------------------------- one line differs
def test_hook_tokens_matches_transformer_lens_use_hook_tokens(pair):
    """TransformerLens adds ``hook_tokens`` with ``HookedTransformerConfig(use_hook_tokens=True)``;
    ours with ``model.set_use_hook_tokens(True)``. Off (both defaults), neither model has the name."""
    tl = pytest.importorskip("transformer_lens")
    ours, ref, _ = pair
    assert "hook_tokens" not in ours.hook_dict and "hook_tokens" not in ref.hook_dict
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ref_tok = tl.HookedTransformer(ref.cfg.to_dict() | {"use_hook_tokens": True})
    ref_tok.load_state_dict(ref.state_dict())
    ref_tok.eval()

    def swap(tokens, hook):  # " fox" -> " cat" wherever it occurs
        return torch.where(tokens == 21831, 3797, tokens)

    tokens = ours.to_tokens(TEXT)
    ours.set_use_hook_tokens(True)
    try:
        assert ours.hook_names()[0] == "hook_tokens"
        results = []
        for model in (ref_tok, ours):
            _, cache = model.run_with_cache(tokens, names_filter="hook_tokens")
            results.append([cache["hook_tokens"], model.run_with_hooks(tokens, fwd_hooks=[("hook_tokens", swap)])])
    finally:
        ours.set_use_hook_tokens(False)
    (want_tokens, want), (got_tokens, got) = results
    assert torch.equal(got_tokens, tokens) and torch.equal(got_tokens, want_tokens)
    assert (got - want).abs().max().item() <= ATOL
    assert (got - ours(TEXT.replace(" fox", " cat"))).abs().max().item() <= ATOL  # the swap took effect
    assert "hook_tokens" not in ours.hook_dict and not ours.hook_tokens.fwd_hooks


def test_a_transformer_lens_state_dict_loads_into_our_model_with_equal_logits(pair):
    ours, ref, _ = pair
    fresh = gi.HookedGPT2(ours.cfg.config, seed=5).eval()
    fresh.load_state_dict(ref.state_dict())  # TL's own names: unfused W_Q…, unembed.W_U/b_U, masks
    tokens = ours.to_tokens(TEXT)
    assert (fresh(tokens) - ref(tokens)).abs().max().item() <= ATOL
    bad = dict(ref.state_dict())
    bad["unembed.b_U"] = torch.ones_like(bad["unembed.b_U"])
    with pytest.raises(ValueError, match=r"unembed\.b_U"):
        fresh.load_state_dict(bad)


def test_state_dict_keeps_our_names_and_saves_as_a_plain_dict(pair, tmp_path):
    """Iterating ``state_dict()`` gives our (fused) names; ``torch.save`` writes a plain OrderedDict that
    ``torch.load(weights_only=True)`` reads and ``load_state_dict`` takes back."""
    ours, _, _ = pair
    sd = ours.state_dict()
    assert "blocks.0.attn.W_QKV" in sd and "blocks.0.attn.W_Q" not in list(sd)
    torch.save(sd, tmp_path / "sd.pt")
    back = torch.load(tmp_path / "sd.pt", weights_only=True)
    assert type(back).__name__ == "OrderedDict" and list(back) == list(sd)
    fresh = gi.HookedGPT2(ours.cfg.config, seed=5).eval()
    fresh.load_state_dict(back)
    assert torch.equal(fresh(TEXT), ours(TEXT))


def test_named_parameters_differ_from_transformer_lens_only_by_the_fused_attention_weights(pair):
    """What does not port: parameter *names* in ``named_parameters()``. Ours fuse each block's query, key
    and value weights into ``attn.W_QKV``/``b_QKV`` and the unembedding is tied (no ``unembed.*``);
    a PortingWarning (once per model) names where TransformerLens's names are read instead."""
    ours, ref, _ = pair
    theirs = {n for n, _ in ref.named_parameters()}
    fresh = gi.from_transformer_lens(ref)
    with pytest.warns(PortingWarning, match=r"fused.*state_dict\(\)\['blocks\.0\.attn\.W_Q'\]"):
        mine = {n for n, _ in fresh.named_parameters()}
    with warnings.catch_warnings():
        warnings.simplefilter("error", PortingWarning)  # said once per model; torch's own calls stay quiet
        assert {n for n, _ in fresh.named_parameters()} == mine
        torch.optim.SGD(ours.parameters(), lr=0.1)
    unfused = {f"blocks.{i}.attn.{w}_{x}" for i in range(2) for w in "Wb" for x in "QKV"}
    assert theirs - mine == unfused | {"unembed.W_U", "unembed.b_U"}
    assert mine - theirs == {f"blocks.{i}.attn.{w}_QKV" for i in range(2) for w in "Wb"}
    for name in unfused:
        block, _, w = name.partition(".attn.")
        assert torch.equal(getattr(ours.blocks[int(block[-1])].attn, w), ref.get_parameter(name))


def test_new_hook_points_pass_activations_through_untouched_when_unused(pair):
    """``unembed.hook_in``/``hook_out`` with no hook return the very tensor they get (no copy, no
    work), and ``hook_tokens`` is not called at all while off."""
    ours, _, _ = pair
    x = torch.randn(2, 3, ours.cfg.d_model)
    assert ours.unembed.hook_in(x) is x and ours.unembed.hook_out(x) is x
    calls = []
    ours.hook_tokens.add_hook(lambda t, hook: calls.append(t))  # on the point, but the point is off
    try:
        ours(TEXT)
    finally:
        ours.hook_tokens.remove_hooks("both", including_permanent=True)
    assert calls == []
