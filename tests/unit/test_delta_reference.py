"""The δ optimisation (:func:`~gpt2_interp.editing.targets.optimise_deltas`, as ROME and MEMIT call it) against
a plain reference written here: every prompt run alone through the whole model (no padding, no packing, no
cached prefix), δ added by a forward hook, the loss assembled from its definition, ``torch.optim.Adam``
and the clamp applied by hand. The losses of every step and the final δ agree to float rounding, for the
paper preset and the defaults, on gpt2-facts (learned positions) and a tiny random Llama-family model
(RoPE, grouped-query attention)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

from gpt2_interp.analysis.tokens import token_span
from gpt2_interp.editing import Request
from gpt2_interp.editing.memit import MemitHparams
from gpt2_interp.editing.settings import RomeHparams, hparams_for
from gpt2_interp.editing.targets import optimise_deltas, variant_weights
from gpt2_interp.model import HookedGPT2, llama_config

REQS = [
    Request("{} is located in the city of", "Eiffel Tower", " New York", keep=("The {} is",)),
    Request("The capital of {} is", "France", " Rome"),
    Request("{} plays the sport of", "Michael Jordan", " soccer"),
]
GROUPS = [["Hello there", "It was late"], ["The story of a long day at the office", "Once upon a time in a land"]]


def _row(model: HookedGPT2, prompt: str, subject: str, bos: bool, prefix: str = "") -> tuple[list[int], int]:
    """The tokens of ``[prefix. ]prompt`` with the subject filled in, and the subject's last token's position."""
    head = f"{prefix}. " if prefix else ""
    before, after = prompt.split("{}")
    text = head + before + subject + after
    lo = len(head) + len(before)
    return model.to_tokens(text, prepend_bos=bos)[0].tolist(), token_span(model, text, lo, lo + len(subject), bos)[
        1
    ] - 1


def _run(model: HookedGPT2, tokens: list[int], hook: str, add: torch.Tensor | None) -> torch.Tensor:
    """Log-probabilities ``[len(tokens), d_vocab]`` of one prompt alone, ``add`` ``[len, d_model]`` added
    at ``hook``."""
    x = torch.tensor([tokens])
    if add is None:
        logits = model(x)
    else:
        logits = model.run_with_hooks(x, fwd_hooks=[(hook, lambda act, hook: act + add[None].to(act.dtype))])
    return logits[0].float().log_softmax(-1)


def reference(
    model: HookedGPT2,
    req: Request,
    layer: int,
    prefixes: Sequence[str],
    hp: RomeHparams,
    solve: Callable[[torch.Tensor], torch.Tensor] | None,
    site: str,
    norm_reference: str,
    key_weights: Sequence[float] | None,
) -> tuple[torch.Tensor, list[float]]:
    """δ and the loss of every evaluation, for one request, computed from the definitions."""
    bos, ids = hp.prepend_bos, model.tokenizer.encode_ids(req.target)
    T = len(ids)
    rewrite = [_row(model, req.prompt, req.subject, bos, p) for p in ["", *prefixes]]
    kl_row = _row(model, hp.kl_prompt, req.subject, bos)
    keep_rows = [_row(model, k, req.subject, bos) for k in req.keep]
    post, out, resid = (f"blocks.{layer}.{n}" for n in ("mlp.hook_post", "hook_mlp_out", "hook_resid_post"))
    hook = out if site == "mlp_out" else resid

    def states(tokens: list[int]) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            _, cache = model.run_with_cache(torch.tensor([tokens]), names_filter=[post, out, resid])
        return {k: cache[k][0].float() for k in (post, out, resid)}

    st = [states(t + ids[:-1]) for t, _ in rewrite]
    keys = torch.stack([s[post][i] for s, (_, i) in zip(st, rewrite)])
    w = torch.full((len(rewrite),), 1 / len(rewrite)) if key_weights is None else torch.tensor(key_weights)
    k_star = w @ keys
    ck = solve(k_star).float() if solve is not None else k_star
    bare_last = rewrite[0][1]
    v0 = (st[0][out] if norm_reference == "mlp_out" else st[0][resid])[bare_last]

    def scale(tokens: list[int], last: int) -> torch.Tensor:  # [len]: how much of δ each position gets
        if hp.exact_edit:
            return states(tokens)[post] @ ck / (k_star @ ck)
        return torch.nn.functional.one_hot(torch.tensor(last), len(tokens)).float()

    rw = [(t + ids[:-1], scale(t + ids[:-1], i), len(t)) for t, i in rewrite]
    kl_at = [kl_row[1]] if hp.kl_positions == "subject_last" else list(range(kl_row[1], len(kl_row[0])))
    kl_sc = scale(*kl_row)
    keep_sc = [scale(*k) for k in keep_rows]
    nw = torch.full((len(rw),), 1 / len(rw))
    if hp.bare_weight is not None and len(rw) > 1:
        nw.fill_((1 - hp.bare_weight) / (len(rw) - 1))
        nw[0] = hp.bare_weight
    with torch.no_grad():
        kl0 = _run(model, kl_row[0], hook, None)[kl_at]
        keep0 = [_run(model, k, hook, None)[-1] for k, _ in keep_rows]

    delta = torch.zeros(model.cfg.d_model, requires_grad=True)
    opt = torch.optim.Adam([delta], lr=hp.v_lr)
    losses: list[float] = []
    for step in range(hp.n_updates + 1):
        opt.zero_grad()
        nll_rows = []
        for tokens, sc, n in rw:
            lp = _run(model, tokens, hook, sc[:, None] * delta)
            nll_rows.append(-sum(lp[n - 1 + t, ids[t]] for t in range(T)) / T)
        nll = sum(wj * x for wj, x in zip(nw, nll_rows))
        lp = _run(model, kl_row[0], hook, kl_sc[:, None] * delta)[kl_at]
        kl = (lp.exp() * (lp - kl0)).sum(-1).mean()
        keep = torch.zeros(())
        for (k, _), sc, ref in zip(keep_rows, keep_sc, keep0):
            lp = _run(model, k, hook, sc[:, None] * delta)[-1]
            keep = keep + (lp.exp() * (lp - ref)).sum() / len(keep_rows)
        loss = nll + hp.kl_factor * kl + hp.keep_factor * keep + hp.weight_decay * delta.norm() / v0.norm() ** 2
        losses.append(float(loss.detach()))
        bare_ok = hp.bare_early_stop is None or float(nll_rows[0].detach()) < hp.bare_early_stop
        if step == hp.n_updates or (losses[-1] < hp.early_stop and bare_ok):
            break
        loss.backward()
        opt.step()
        with torch.no_grad():
            if delta.norm() > hp.clamp_factor * v0.norm():
                delta *= hp.clamp_factor * v0.norm() / delta.norm()
    return delta.detach(), losses


def _solve(d: int) -> Callable[[torch.Tensor], torch.Tensor]:
    """``x ↦ A⁻¹x`` for a fixed well-conditioned symmetric positive definite ``A`` (a stand-in for the
    key statistics)."""
    g = torch.Generator().manual_seed(1)
    m = torch.randn(d, d, generator=g)
    a = torch.eye(d) + m @ m.T / d
    return lambda k: torch.linalg.solve(a.to(k.dtype), k[..., None])[..., 0]


def _check(model: HookedGPT2, reqs: list[Request], layer: int, hp: RomeHparams, **kw: Any) -> list[dict[str, Any]]:
    prefixes = [p for g in GROUPS for p in g]
    kw.setdefault("key_weights", variant_weights(hp, GROUPS))
    items = [(r, model.tokenizer.encode_ids(r.target)) for r in reqs]
    solve = _solve(model.cfg.d_mlp)
    got = optimise_deltas(model, items, layer, prefixes, hp, solve, **kw)
    for r, o in zip(reqs, got):
        want, losses = reference(
            model,
            r,
            layer,
            prefixes,
            hp,
            solve,
            kw.get("delta_site", "mlp_out"),
            kw.get("norm_reference", "mlp_out"),
            kw["key_weights"],
        )
        assert [x["loss"] for x in o["log"]] == pytest.approx(losses, rel=1e-4, abs=1e-5)
        assert float(want.norm()) > 0
        # Adam divides each gradient component by its own magnitude: fp32 rounding differences of the batched
        # and the one-prompt-at-a-time sums reach δ's small components undamped (up to ~3e-4 relative
        # after 6 steps); a wrong position or prompt moves δ by its own size
        assert float((o["delta"] - want).norm()) <= 1e-3 * float(want.norm())
    return got


def _tiny_llama() -> HookedGPT2:
    cfg = llama_config(n_layer=4, d_model=64, n_head=4, n_kv_heads=2, d_mlp=96, n_ctx=128)
    return HookedGPT2(cfg, seed=0).eval()


@pytest.fixture(scope="module")
def llama() -> HookedGPT2:
    return _tiny_llama()


MODELS = ["gpt2-facts", "llama"]


def _model(name: str, facts_model: HookedGPT2, llama: HookedGPT2) -> HookedGPT2:
    return facts_model if name == "gpt2-facts" else llama


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("preset", [None, "paper"])
def test_rome_delta_matches_the_plain_reference(facts_model, llama, name, preset):
    """ROME's call: one request, δ at the MLP's output, its norm from v₀; 6 Adam updates at most."""
    model = _model(name, facts_model, llama)
    hp = hparams_for(model, **({} if preset is None else {"preset": preset}), v_steps=6)
    assert hp.exact_edit == (
        preset is None
    )  # the defaults add δ by the update's exact effect, the paper's at one token
    _check(model, REQS[:1], 1, hp)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("preset", [None, "paper"])
def test_memit_deltas_match_the_plain_reference(facts_model, llama, name, preset):
    """MEMIT's call: three requests in one batch (two per chunk), packed, δ on the residual after the top
    layer, its norm from that residual; each request's δ is the one it gets alone."""
    model = _model(name, facts_model, llama)
    hp = MemitHparams.of(model, **({} if preset is None else {"preset": preset}), v_steps=5, delta_norm="resid")
    _check(model, REQS, 2, hp.rome, chunk=2, delta_site="resid_post", norm_reference="resid", packed=True)


def test_an_early_stop_freezes_a_request_as_the_reference_does(llama):
    """A loss threshold that some requests reach before the last step: each stops where it stops alone."""
    hp = RomeHparams.of(
        v_steps=6,
        v_lr=0.05,
        weight_decay=0.0,
        early_stop=10.58,
        exact_edit=False,
        prepend_bos=False,
        kl_positions="subject_last",
    )
    got = _check(llama, REQS, 1, hp, packed=True, delta_site="resid_post", norm_reference="resid")
    assert len({len(o["log"]) for o in got}) > 1, "the threshold should stop the requests at different steps"


def test_the_cached_prefix_is_what_the_model_computes(facts_model):
    """The paper preset's δ (added at one token) with the prefix columns cached equals the reference on a
    request whose subject ends late in a long prompt."""
    req = Request("In the year 2000, people said that {} is located in", "the Eiffel Tower", " Rome")
    hp = hparams_for(facts_model, preset="paper", v_steps=4)
    _check(facts_model, [req], 0, hp)
