"""Mass editing: MEMIT (Meng et al. 2023) and AlphaEdit's null-space projection (Fang et al. 2025).

Our MLP computes ``out = k @ W_out + b_out`` (``k: [d_mlp]``, ``W_out: [d_mlp, d_model]``). For a
batch of ``n`` requests and edit layers ``L_1 < … < L_m`` (top layer ``L_m``):

1. **Targets** (MEMIT's ``compute_z``): per request, ROME's δ optimisation
   (:func:`.targets.optimise_deltas`, all requests in one batch) finds ``δ_i: [d_model]`` such that
   adding ``δ_i`` to the residual stream after block ``L_m`` at the subject's last token makes
   the model say the target (adding to ``blocks.{L_m}.hook_mlp_out`` is adding to that residual).
   The target residual is ``z_i = h_i + δ_i`` with ``h_i`` the unedited residual there (averaged,
   with the keys' weights, over the prompt variants: by default per context type, MEMIT's ``compute_ks`` —
   the bare prompt and each prefix length weigh equally — the default chosen by measurement, see
   docs/guide/editing.md). δ's clamp and weight decay scale with ``‖h_i‖`` (MEMIT's
   ``compute_z``; ``delta_norm="resid"``), not with the MLP output as in ROME (``"mlp_out"``): above
   the first layer an MLP's output can be tiny next to the residual it is added to.
2. **Spread** over the layers, lowest first: at layer ``L_j`` the keys ``K: [n, d_mlp]`` (ROME's
   k*, computed on the model with the updates of ``L_1 … L_{j-1}`` applied) must carry the remaining
   residual ``R = (z − h_now) / (m − j + 1)`` (``h_now``: the residual after block ``L_m`` with the
   lower updates applied), so each layer takes an equal share of what is left.
3. **Least squares** per layer. MEMIT: ``ΔW = argmin ‖K ΔW − R‖² + λ·tr(ΔWᵀ C ΔW)``
   ``= (λC + KᵀK)⁻¹ Kᵀ R`` with ``C = E[k kᵀ]`` over a corpus (:mod:`.stats`) and ``λ = mom2_weight``
   (MEMIT's ``mom2_update_weight``); where the block normalises its MLP's output (OLMo 2's and Gemma's
   ``ln2_post``) ``R`` is first carried back through that norm with its scale held (``R · scale / gain``).
   With one request, ``(λC + kkᵀ)⁻¹k = C⁻¹k / (λ + kᵀC⁻¹k)``
   (Sherman–Morrison), so ``ΔW = C⁻¹k δᵀ / (λ + kᵀC⁻¹k)``: ROME's update
   ``C⁻¹k δᵀ / (kᵀC⁻¹k)`` scaled by ``kᵀC⁻¹k / (λ + kᵀC⁻¹k)`` — the documented difference; the two
   agree as ``λ → 0``.
   AlphaEdit (``preserve=``): ``ΔW = P X`` with ``P`` the projection on the (approximate) null
   space of the preserved keys, so ``k₀ @ ΔW ≈ 0`` for every preserved key ``k₀``;
   ``X = argmin ‖K P X − R‖² + ‖K_p P X‖² + α‖P X‖²`` where ``K_p`` are the keys of the edits made
   earlier with the same :class:`NullSpace` (sequential editing does not overwrite them); the
   normal equations ``(P(KᵀK + K_pᵀK_p)P + αI) X = P Kᵀ R`` have their solution in ``P``'s range.
   ``α = alpha · tr(C)/d_mlp`` (scale-free). AlphaEdit writes the system unsymmetrised; ours is its
   symmetric least-squares form.

**Null space.** ``P = Σ_{λ_i ≤ τ·λ_max} u_i u_iᵀ`` over the eigenpairs ``(λ_i, u_i)`` of the
preserved keys' second moment ``C₀``: the directions in which preserved keys have (almost) no
energy. ``τ = nullspace_threshold`` is relative to the largest eigenvalue (AlphaEdit uses an
absolute 2e-2 on its models' unnormalised statistics; a relative threshold carries over between
models). For any preserved key, ``‖k₀ P‖² ≤ τ·λ_max·‖·‖``-small on average:
``E‖k₀P‖² = tr(P C₀) = Σ_{kept} λ_i``, reported as ``NullSpace.leak`` (fraction of ``tr C₀``).
``nullspace_rule="energy"`` reads τ as that leak instead: ``P`` spans the smallest eigen-directions
whose eigenvalues sum to at most ``τ·tr C₀``. A threshold relative to ``λ_max`` gives very different
null spaces on layers with different spectra (on SmolLM2, empty on one layer and large on another); the
energy rule lets every layer leak the same share of its preserved keys' energy.

The result is ONE :class:`~.edit.Edit` covering the layers (low-rank ``ΔW_l = U V`` with
``U: [d_mlp, n]``, ``V = R: [n, d_model]`` when ``n < d_model``, dense otherwise) with the edited
keys kept per layer (``edit.keys``) and the target residuals ``z: [n, d_model]`` (``edit.v_star``):
apply / undo (bit-exact) / save / load / fingerprint refusal as for ROME.

**The authors' mode.** ``hparams={"preset": "paper"}`` runs MEMIT's and AlphaEdit's own choices where ours
differ: the keys averaged per context type (``key_weighting="per_context_type"``), z and the residual from the
bare prompt (``target_state="bare_prompt"``), plain δ, the KL at the subject's last token, ROME's step count,
MEMIT's prefixes without BOS, and AlphaEdit's null space (``nullspace_rule="alphaedit"``) and ridge
(``alpha_scale="absolute"``); see :meth:`MemitHparams.of` and docs/guide/editing.md.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Annotated, Any

import torch

from ..core.boundary import boundary
from ..core.checks import check_choice, check_count, check_number
from ..core.progress import progress_bar
from ..model.fingerprint import parameter_digests, weights_fingerprint
from .edit import Edit, EditWarning, Request, TargetResiduals, is_weak, report_failed
from .hparams import PRESETS, load_hparams, model_hparams, models_with_hparams, preset_hparams
from .settings import MODEL_HPARAMS as ROME_MODEL_HPARAMS
from .settings import RomeHparams, default_layer
from .stats import DEFAULT_CORPUS_RULE, KeyStats, key_second_moment, keys_fingerprint, unedited_digests
from .targets import (
    RequestLike,
    TargetOutcome,
    context_prefix_groups,
    optimise_deltas,
    subject_states,
    target_outcomes,
    validate_request,
    variant_weights,
)

if TYPE_CHECKING:
    from ..model import HookedGPT2


# ---------------------------------------------------------------- hyperparameters
#: How AlphaEdit's null space reads its threshold τ (NullSpace.from_stats).
NULLSPACE_RULES = ("relative", "energy")
#: The rules NullSpace.from_stats accepts: ours, and AlphaEdit's own (``"alphaedit"``: eigenvalues of C₀ below τ).
ALL_NULLSPACE_RULES = (*NULLSPACE_RULES, "alphaedit")
#: How AlphaEdit's ridge ``alpha`` is scaled (``MemitHparams.alpha_scale``).
ALPHA_SCALES = ("trace", "absolute")

#: δ's clamp/weight-decay scale (:func:`.targets.optimise_deltas`' ``norm_reference``).
DELTA_NORMS = ("resid", "mlp_out")


@boundary
@dataclass
class MemitHparams:
    """MEMIT/AlphaEdit settings; ``rome`` holds the δ optimisation's (:class:`.settings.RomeHparams`).

    Per model: ``hparams/memit/`` and ``hparams/alphaedit/`` (:meth:`of`). Every value is checked when
    the object is made (:meth:`__post_init__`): a wrong kind, a non-finite number or a value out of
    range raises naming the field.

    - ``layers``: the edit layers (None: the model's default, :func:`default_layers`);
    - ``mom2_weight``: λ in ``(λC + KᵀK)⁻¹KᵀR`` (MEMIT's ``mom2_update_weight``; ≥ 0);
    - ``nullspace_threshold``: τ in (0, 1); ``nullspace_rule``: ``"relative"`` (P keeps the
      eigen-directions of C₀ with λ ≤ τ·λ_max) or ``"energy"`` (the smallest directions holding ≤ τ
      of tr C₀; see :meth:`NullSpace.from_stats`), or AlphaEdit's own ``"alphaedit"`` (λ < τ: a threshold
      that depends on the statistics' scale);
    - ``alpha``: AlphaEdit's ridge, × tr(C)/d_mlp (> 0); ``alpha_scale``: ``"trace"`` (that scaling,
      which carries over between models) or ``"absolute"`` (``alpha`` itself, AlphaEdit's ``L2``);
    - ``chunk``: requests per δ-optimisation batch (None: 32 on CPU, all on GPU);
    - ``delta_norm``: δ's clamp/weight-decay scale, ``"resid"`` (the residual after the top layer,
      MEMIT's ``compute_z``) or ``"mlp_out"`` (ROME's v₀);
    - ``preset``: the named preset the values came from (``"paper"``: the authors' algorithm and values,
      :meth:`of`), recorded in the edit (:attr:`~.edit.Edit.label`).

    The δ optimisation's departures from the authors' code (``rome.key_weighting``, ``target_state``,
    ``kl_positions``, ``step_count``, ``prefix_style``) are :class:`.settings.RomeHparams` options; here
    ``key_weighting`` also weights the keys of every edit layer, and ``target_state`` picks the state of
    the target residual z and of the per-layer residual."""

    layers: tuple[int, ...] | None = None  # edit layers (None: the model's default, see default_layers)
    mom2_weight: float = 1000.0  # λ in (λC + KᵀK)⁻¹KᵀR (MEMIT's mom2_update_weight)
    nullspace_threshold: float = 1e-3  # τ: P keeps eigen-directions of C₀ with λ ≤ τ·λ_max
    nullspace_rule: str = "relative"  # "relative" (as above) or "energy": the smallest directions
    # holding ≤ τ of tr C₀ (see NullSpace.from_stats)
    alpha: float = 0.1  # AlphaEdit's ridge, × tr(C)/d_mlp
    alpha_scale: str = "trace"  # ridge = alpha·tr(C)/d_mlp (scale-free); "absolute": alpha itself (AlphaEdit's L2)
    chunk: int | None = None  # requests per δ-optimisation batch (None: 32 on CPU, all on GPU)
    delta_norm: str = "resid"  # δ's clamp/weight-decay scale: the residual after the top layer
    # (MEMIT's compute_z) or "mlp_out" (ROME's v₀); see optimise_deltas
    rome: RomeHparams = field(default_factory=RomeHparams)
    preset: str | None = None  # the named preset the values came from ("paper": the authors'), recorded

    def __post_init__(self) -> None:
        what = "MEMIT hyperparameter {}".format
        if self.preset is not None:
            self.preset = check_choice(self.preset, what("preset"), PRESETS)
        if self.layers is not None:
            if isinstance(self.layers, (str, bytes)) or not isinstance(self.layers, (list, tuple)) or not self.layers:
                raise ValueError(
                    f"{what('layers')} must be a non-empty list of layer indices or None, got {self.layers!r}"
                )
            self.layers = tuple(check_count(x, f"{what('layers')} entry", 0) for x in self.layers)
        self.mom2_weight = check_number(self.mom2_weight, what("mom2_weight"), 0)
        self.nullspace_threshold = check_number(
            self.nullspace_threshold, what("nullspace_threshold"), 0, 1, low_open=True, high_open=True
        )
        self.alpha = check_number(self.alpha, what("alpha"), 0, low_open=True)
        self.nullspace_rule = check_choice(self.nullspace_rule, what("nullspace_rule"), ALL_NULLSPACE_RULES)
        self.alpha_scale = check_choice(self.alpha_scale, what("alpha_scale"), ALPHA_SCALES)
        self.delta_norm = check_choice(self.delta_norm, what("delta_norm"), DELTA_NORMS)
        if self.chunk is not None:
            self.chunk = check_count(self.chunk, what("chunk"), 1)
        if not isinstance(self.rome, RomeHparams):
            raise TypeError(f"{what('rome')} must be a RomeHparams, got {type(self.rome).__name__}")

    @classmethod
    def of(cls, model: HookedGPT2, **overrides: Any) -> MemitHparams:
        """Defaults (``hparams/{memit,alphaedit}/default.json``), then the model's own files
        (:data:`MODEL_HPARAMS`, AlphaEdit's), then ``overrides``; keys of :class:`RomeHparams`
        (``v_steps``, ``v_lr``, …) go to the δ optimisation, which starts from ROME's settings for the
        model with :data:`DELTA_DEFAULTS` (MEMIT's context templates) over them.

        ``preset="paper"``: the dataclass defaults, the model's files for what the preset does not set
        (the edit layers, AlphaEdit's settings), then the preset's MEMIT and AlphaEdit values
        (``hparams/preset-paper.json``: MEMIT's gpt2-xl settings and algorithm), then ``overrides``;
        the δ optimisation takes only the preset's values and ``overrides``."""
        name = model.cfg.name
        own = {f.name for f in fields(cls)} - {"rome"}
        rome_names = {f.name for f in fields(RomeHparams)} - {"layer"}  # the edit layers are MEMIT's `layers`
        bad = sorted(set(overrides) - own - rome_names)
        if bad:
            raise ValueError(
                f"unknown MEMIT hyperparameter(s) {bad}; valid: {sorted(own)} and the ROME δ settings "
                f"{sorted(rome_names)}"
            )
        preset = overrides.get("preset")
        if preset is None:
            memit = load_hparams("memit", name) | load_hparams("alphaedit", name) | overrides
            rome_kw = DELTA_DEFAULTS | ROME_MODEL_HPARAMS.get(name, {}) | model_hparams("memit", name) | overrides
        else:
            paper = preset_hparams(preset, "memit", name) | preset_hparams(preset, "alphaedit", name)
            memit = load_hparams("memit", name) | load_hparams("alphaedit", name) | paper | overrides
            rome_kw = paper | overrides
        return cls(
            **{k: v for k, v in memit.items() if k in own},
            rome=RomeHparams.of(**{k: v for k, v in rome_kw.items() if k in rome_names}),
        )

    def to_dict(self) -> dict[str, Any]:
        """Every field as a plain dict (``rome`` as a nested dict)."""
        return asdict(self)


#: MEMIT's own δ settings where they differ from ROME's (``hparams/memit/default.json``): the bare
#: prompt and 5 generated context prefixes of 10 tokens (MEMIT's context templates).
DELTA_DEFAULTS: dict[str, Any] = {
    k: v for k, v in load_hparams("memit", "default").items() if k in {f.name for f in fields(RomeHparams)}
}

#: Per-model MEMIT settings (``hparams/memit/<model>.json``; user arguments win; δ settings default to
#: ROME's for the model). Each file names the run behind every value.
MODEL_HPARAMS: dict[str, dict[str, Any]] = {
    name: model_hparams("memit", name) for name in models_with_hparams("memit") if model_hparams("memit", name)
}


def default_layers(model: HookedGPT2) -> list[int]:
    """MEMIT's window: ``round(5/48 · n_layer)`` layers ending at ROME's layer (gpt2-xl: 13–17, as
    published), or :data:`MODEL_HPARAMS`' ``layers``."""
    given = load_hparams("memit", model.cfg.name).get("layers")
    if given is not None:
        return list(given)
    top = default_layer(model)
    width = max(1, round(5 * model.cfg.n_layer / 48))
    return list(range(max(0, top - width + 1), top + 1))


def choose_layers(
    model: HookedGPT2,
    requests: Sequence[RequestLike],
    n_trace: int = 8,
    share: float = 0.5,
    max_width: int | None = None,
    progress: bool | None = None,
) -> list[int]:
    """``layers="auto"``: average the causal-trace MLP indirect effect at the subject's last token
    over up to ``n_trace`` requests; the window is the contiguous run of layers around the peak whose
    effect is at least ``share`` × the peak's, at most ``max_width`` layers
    (default ``max(1, round(5/48 · n_layer))``, MEMIT's 5 of 48), keeping the highest-effect ones.
    ``progress`` (None: on a terminal or in a notebook): a bar over the traced requests."""
    from ..analysis.tracing import causal_trace

    reqs = [Request.of(r) for r in requests][:n_trace]
    effect = torch.zeros(model.cfg.n_layer)
    for req in progress_bar(reqs, enabled=progress, desc="layers='auto': tracing requests", unit="request"):
        tr = causal_trace(model, req.text, req.subject, kind="mlp", progress=False)
        effect += torch.as_tensor(tr.indirect_effect[tr.subject_range[1] - 1]).float().cpu()
    effect /= max(len(reqs), 1)
    peak = int(effect.argmax())
    width = max_width or max(1, round(5 * model.cfg.n_layer / 48))
    lo = hi = peak
    while hi - lo + 1 < width:
        cand = [
            (float(effect[l]), l)
            for l in (lo - 1, hi + 1)
            if 0 <= l < model.cfg.n_layer and effect[l] >= share * effect[peak]
        ]
        if not cand:
            break
        _, l = max(cand)
        lo, hi = min(lo, l), max(hi, l)
    return list(range(lo, hi + 1))


# ---------------------------------------------------------------- the null space
@boundary
@dataclass(eq=False)
class NullSpace:
    """AlphaEdit's projections ``P_l: [d_mlp, d_mlp]`` per layer plus the keys of the edits made so
    far (``KpKp_l = K_pᵀK_p``), for sequential editing.

    ``compute_edits(…, preserve=ns)`` uses it and then remembers the batch's keys (so the next
    batch's update is fitted not to disturb them); ``remember=False`` there leaves it unchanged.

    Made by :meth:`from_stats`: ``P`` ``{layer: [d_mlp, d_mlp]}``; ``threshold`` and ``rule`` as
    given there; ``fingerprints``: the keys fingerprint of each layer's preserved statistics (checked
    against the model, :meth:`check`); ``null_dim``: the null space's dimension per layer; ``leak``:
    ``E‖k₀P‖² / E‖k₀‖²`` of the preserved keys per layer; ``KpKp`` ``{layer: [d_mlp, d_mlp]}`` and
    ``n_remembered``: the edited keys remembered so far."""

    P: dict[int, torch.Tensor]
    threshold: float
    fingerprints: dict[int, str]  # keys fingerprint of each layer's preserved statistics
    null_dim: dict[int, int]
    leak: dict[int, float]  # E‖k₀P‖² / E‖k₀‖² of the preserved keys
    KpKp: dict[int, torch.Tensor] = field(default_factory=dict)
    n_remembered: int = 0
    rule: str = "relative"

    @classmethod
    def from_stats(
        cls, stats: Mapping[int, KeyStats] | KeyStats, threshold: float = 1e-3, rule: str = "relative"
    ) -> NullSpace:
        """``P`` from the eigen-decomposition of each layer's preserved second moment ``C₀``:
        ``rule="relative"`` keeps the eigen-directions with ``λ ≤ threshold·λ_max``, ``rule="alphaedit"``
        (AlphaEdit's ``get_project``) those with ``λ < threshold``; ``rule="energy"``
        the smallest ones whose eigenvalues sum to ``≤ threshold·tr C₀`` (so ``leak ≤ threshold`` on
        every layer). ``stats``: one :class:`~.stats.KeyStats` or ``{layer: KeyStats}`` of the keys
        to preserve. Another rule, or ``threshold`` outside (0, 1), raises ValueError."""
        if rule not in ALL_NULLSPACE_RULES:
            raise ValueError(f"rule must be one of {ALL_NULLSPACE_RULES}, got {rule!r}")
        if not 0 < threshold < 1:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        if isinstance(stats, KeyStats):
            stats = {stats.layer: stats}
        P, dims, leak, fps = {}, {}, {}, {}
        for lay, st in stats.items():
            C0 = st.C.double()
            evals, evecs = torch.linalg.eigh(C0)  # ascending
            if rule == "relative":
                keep = evals <= threshold * evals[-1]
            elif rule == "alphaedit":  # AlphaEdit's get_project: singular values of C₀ below τ
                keep = evals < threshold
            else:
                pos = evals.clamp(min=0)
                keep = pos.cumsum(0) <= threshold * pos.sum()
            U = evecs[:, keep]
            P[lay] = U @ U.T
            dims[lay] = int(keep.sum())
            leak[lay] = float(evals[keep].clamp(min=0).sum() / evals.clamp(min=0).sum())
            fps[lay] = st.key.get("fingerprint", "")
        return cls(P, threshold, fps, dims, leak, rule=rule)

    def check(self, model: HookedGPT2, layers: Sequence[int], digests: dict[str, str] | None = None) -> None:
        """Raise a ValueError unless the null space has a projection for each of ``layers`` built from
        statistics of ``model``'s keys (with or without its applied edits). ``digests``: the model's
        parameter digests when the caller already has them."""
        missing = [l for l in layers if l not in self.P]
        if missing:
            raise ValueError(
                f"the null space has projections for layers {sorted(self.P)}, not {missing}; "
                "build it from statistics of every edit layer"
            )
        base = unedited_digests(model, digests)
        for l in layers:
            if self.fingerprints.get(l) and self.fingerprints[l] not in (
                keys_fingerprint(model, l, digests),
                keys_fingerprint(model, l, base),
            ):
                raise ValueError(
                    f"the null space of layer {l} was computed from statistics of another model "
                    "(its keys fingerprint differs); rebuild it with NullSpace.from_stats for this model"
                )

    def remember(self, keys: Mapping[int, torch.Tensor]) -> None:
        """Accumulate ``K_pᵀK_p`` of edited keys ``{layer: [n, d_mlp]}``."""
        n = 0
        for lay, K in keys.items():
            K = K.double().cpu()
            self.KpKp[lay] = self.KpKp.get(lay, torch.zeros(K.shape[1], K.shape[1], dtype=torch.float64)) + K.T @ K
            n = K.shape[0]
        self.n_remembered += n

    def key_energy(self, keys: Mapping[int, torch.Tensor]) -> dict[int, float]:
        """Per layer, the share of the keys' energy inside the null space, ``‖K P_l‖²_F / ‖K‖²_F`` for
        keys ``{layer: K [n, d_mlp]}`` (e.g. an edit's ``Edit.keys``): 1 when every key lies in the
        null space (an update confined to it can reach them), 0 when none does."""
        out = {}
        for lay, K in keys.items():
            if lay not in self.P:
                raise ValueError(f"keys of layer {lay}: the null space has projections for layers {sorted(self.P)}")
            K64 = K.double().cpu()
            total = float((K64**2).sum())
            if total == 0:
                raise ValueError(
                    f"keys of layer {lay} are all zero (shape {tuple(K.shape)}): their energy share is undefined"
                )
            out[lay] = float(((K64 @ self.P[lay].double().cpu()) ** 2).sum()) / total
        return out

    def __repr__(self) -> str:
        dims = ", ".join(f"L{l}: {d}" for l, d in self.null_dim.items())
        return (
            f"NullSpace(τ={self.threshold:g} ({self.rule}), null dims {{{dims}}}, {self.n_remembered} keys remembered)"
        )


# ---------------------------------------------------------------- the maths
def least_squares_update(K: torch.Tensor, R: torch.Tensor, C: torch.Tensor, mom2_weight: float) -> torch.Tensor:
    """MEMIT's per-layer update ``A = (λC + KᵀK)⁻¹ Kᵀ`` so that ``ΔW = A @ R``.

    ``K: [n, d_mlp]`` keys, ``R: [n, d_model]`` residuals, ``C: [d_mlp, d_mlp]``; returns
    ``A: [d_mlp, n]`` (float64). Minimises ``‖K ΔW − R‖² + λ tr(ΔWᵀ C ΔW)``."""
    K64 = K.double().cpu()
    M = mom2_weight * C.double().cpu() + K64.T @ K64
    return torch.linalg.solve(M, K64.T)


def projected_update(K: torch.Tensor, P: torch.Tensor, KpKp: torch.Tensor | None, ridge: float) -> torch.Tensor:
    """AlphaEdit's update in ``P``'s range: ``A = (P(KᵀK + K_pᵀK_p)P + αI)⁻¹ P Kᵀ``, ``ΔW = A @ R``.

    ``K: [n, d_mlp]``, ``P: [d_mlp, d_mlp]``, ``KpKp: [d_mlp, d_mlp]`` or None; returns ``A: [d_mlp, n]``."""
    K64, P64 = K.double().cpu(), P.double().cpu()
    G = K64.T @ K64 + (KpKp.double().cpu() if KpKp is not None else 0.0)
    M = P64 @ G @ P64 + ridge * torch.eye(P64.shape[0], dtype=torch.float64)
    return P64 @ torch.linalg.solve(M, P64 @ K64.T)  # = the solution (it lies in range(P)); P again kills round-off


# ---------------------------------------------------------------- input checks
def validate_requests(model: HookedGPT2, requests: Sequence[RequestLike]) -> tuple[list[Request], list[list[int]]]:
    """Requests and their target ids; an empty batch, or one subject+prompt asked for two targets,
    raises naming the requests' indices. An exact duplicate is kept once, with an :class:`EditWarning`."""
    if isinstance(requests, (Request, Mapping)):
        requests = [requests]
    if isinstance(requests, (str, bytes)) or not isinstance(requests, Sequence):
        raise TypeError(f"requests must be a list of requests, got {type(requests).__name__}")
    if not requests:
        raise ValueError("the request list is empty; give at least one {'prompt', 'subject', 'target'}")
    out, ids = [], []
    seen: dict[tuple[str, str], tuple[int, Request]] = {}  # (subject, prompt) → its first request
    for i, r in enumerate(requests):
        req, t = validate_request(model, r, i)
        key = (req.subject, req.prompt)
        if key in seen:
            j, first = seen[key]
            if first.target != req.target:
                raise ValueError(
                    f"conflicting requests {j} and {i} in one batch: {req.text!r} → {first.target!r} and → "
                    f"{req.target!r}. One batch writes one answer per subject and prompt; drop one, or edit "
                    "them in separate, sequential batches"
                )
            if first != req:
                raise ValueError(
                    f"requests {j} and {i} ask the same ({req.text!r} → {req.target!r}) with different "
                    "keep prompts; merge their keep lists into one request"
                )
            warnings.warn(
                f"requests {j} and {i} are the same ({req.text!r} → {req.target!r}); it is edited once",
                EditWarning,
                stacklevel=3,
            )
            continue
        seen[key] = (i, req)
        out.append(req)
        ids.append(t)
    return out, ids


def _resolve_stats(
    model: HookedGPT2,
    layers: list[int],
    stats: Any,
    hp: MemitHparams,
    digests: dict[str, str],
    progress: bool | None,
) -> dict[int, KeyStats]:
    if stats is None:
        got = key_second_moment(model, layers, corpus=hp.rome.corpus, n_samples=hp.rome.n_samples, progress=progress)
    elif isinstance(stats, KeyStats):
        got = {stats.layer: stats}
    elif isinstance(stats, Mapping):
        got = {int(k): v for k, v in stats.items()}
    else:
        raise TypeError(f"stats must be None, a KeyStats or {{layer: KeyStats}}, got {type(stats).__name__}")
    missing = [l for l in layers if l not in got]
    if missing:
        raise ValueError(
            f"no key statistics for edit layer(s) {missing} (given: {sorted(got)}); compute them with "
            f"key_second_moment(model, {layers})"
        )
    for l in layers:
        if not isinstance(got[l], KeyStats):
            raise TypeError(
                f"stats for layer {l} must be a KeyStats (key_second_moment(model, {layers})), "
                f"got {type(got[l]).__name__}"
            )
        got[l].check(model, l, digests)
    return got


def _resolve_layers(
    model: HookedGPT2, layers: Any, hp: MemitHparams, reqs: list[Request], progress: bool | None = None
) -> list[int]:
    if layers is None:
        layers = list(hp.layers) if hp.layers is not None else default_layers(model)
    elif isinstance(layers, str):
        if layers != "auto":
            raise ValueError(f"layers must be None, a list of ints or 'auto', got {layers!r}")
        layers = choose_layers(model, reqs, progress=progress)
    elif isinstance(layers, int):
        layers = [layers]
    out = sorted({model.check_layer(l) for l in layers})
    if not out:
        raise ValueError("layers is empty; give at least one edit layer")
    return out


# ---------------------------------------------------------------- the entry point
@boundary
def compute_edits(
    model: HookedGPT2,
    requests: Sequence[RequestLike],
    layers: int | Sequence[int] | str | None = None,
    stats: KeyStats | Mapping[int, KeyStats] | None = None,
    hparams: MemitHparams | Mapping[str, Any] | None = None,
    preserve: NullSpace | KeyStats | Mapping[int, KeyStats] | bool | None = None,
    remember: bool = True,
    progress: bool | None = None,
    targets: Annotated[
        TargetResiduals | Edit | None,
        "the targets of an earlier edit of these requests (edit.targets), that Edit, or None",
    ] = None,
) -> Edit:
    """Compute (not apply) ONE edit writing every request into ``model`` (module doc: the maths).

    ``layers``: None (:func:`default_layers`), ints, or ``"auto"`` (:func:`choose_layers`).
    ``stats``: key statistics per layer (computed in one pass and cached when None).
    ``hparams``: :class:`MemitHparams` or a dict of overrides. ``preserve``: AlphaEdit — a
    :class:`NullSpace` (reused across sequential batches; it remembers this batch's keys unless
    ``remember=False``), statistics of the keys to preserve, or True for ``stats`` themselves.
    ``targets``: the target residuals of an earlier edit of the same requests at the same top layer on
    the same model (``edit.targets``, or the edit itself); they carry the weights fingerprint and the
    requests they were computed for, and are refused for another model, other requests or another top
    layer. The δ optimisation, which does not depend on λ, τ, α or the lower layers, is then skipped —
    re-solving one batch under other settings costs a few forward passes instead of a δ optimisation.
    ``edit.metrics`` records P(target | rewrite prompt) per request before and after the edit, whether
    each request's edit took (``"took"``, :data:`.edit.EDIT_TOOK_RULE`; ``edit.failed`` lists those that
    did not, also in an :class:`.edit.EditFailedWarning`), the top-1 token after each rewrite prompt
    (``"top1_after"``) and the indices of weak edits (``"weak"``, :func:`.edit.is_weak`).
    A target unlikely to follow its prompt as written warns before any work
    (:class:`.edit.TargetSpacingWarning`). ``progress`` (None: on a terminal or in a notebook): bars
    for the key statistics, the δ steps (requests done out of the batch, loss, P(target), time left) and
    the per-layer updates.
    Apply with ``edit.apply(model)``; undo with ``edit.undo(model)``.

    ``requests``: a list of :class:`~.edit.Request` or dicts (one request alone is accepted). Returns
    one :class:`~.edit.Edit` of method ``"memit"`` (``"alphaedit"`` with ``preserve``): ``U [d_mlp, n]``,
    ``V [n, d_model]`` per layer, the edited ``keys`` ``{layer: [n, d_mlp]}`` and the target
    residuals ``v_star`` ``[n, d_model]``. The model is left unchanged.

    Refused before the optimisation: an empty or non-list ``requests``, a malformed request, two
    requests of one subject and prompt with different targets or keep prompts, an unknown or
    out-of-range hyperparameter, empty ``layers`` or another string than ``"auto"``, statistics or a
    null space for other layers or weights, and ``targets`` for another model, other requests or
    another top layer (ValueError/TypeError, naming the request or layer); a layer out of range
    (IndexError).
    """
    t0 = time.perf_counter()
    hp = _checked_hparams(model, hparams)
    reqs, ids = validate_requests(model, requests)
    layers_ = _resolve_layers(model, layers, hp, reqs, progress)
    top = layers_[-1]
    digests = parameter_digests(model)
    base_fp = weights_fingerprint(model, digests=digests)
    given = _given_targets(targets, base_fp, reqs, top, model.cfg.d_model)
    st = _resolve_stats(model, layers_, stats, hp, digests, progress)
    ns = _resolve_preserve(model, preserve, st, layers_, hp, digests)
    method = "alphaedit" if ns is not None else "memit"
    groups = context_prefix_groups(
        model, hp.rome.prefix_lengths, hp.rome.prefixes_per_length, hp.rome.prefix_seed, hp.rome.prefix_style
    )
    prefixes = [p for g in groups for p in g]
    weights = _Weights.of(hp.rome, groups)
    p_before = [float(torch.tensor(o.logprob).exp()) for o in target_outcomes(model, [r.text for r in reqs], ids)]

    # 1. target residuals at the top layer
    t1 = time.perf_counter()
    h0, delta, opt = _target_residuals(
        model, list(zip(reqs, ids)), top, prefixes, hp, st[top], weights, given, f"{method}: δ at layer {top}", progress
    )
    t_delta = time.perf_counter() - t1
    z = h0.double().cpu() + delta  # [n, d_model]

    # 2-3. spread over the layers, lowest first
    factors, keys_used, fit, after = _solve_layers(
        model, reqs, ids, z, layers_, prefixes, st, hp, ns, progress, weights
    )
    if ns is not None and remember:
        ns.remember(keys_used)
    metrics = {
        "n_requests": len(reqs),
        "layers": layers_,
        "seconds": time.perf_counter() - t0,
        "delta_seconds": t_delta,
        **_delta_metrics(delta, opt, given is not None),
        "fit": fit,
        **_outcome_metrics(p_before, after, ns, layers_),
    }
    report_failed(reqs, [o.took for o in after], p_before, metrics["p_target_after"], [o.top1 for o in after])
    hdict = hp.to_dict() | {"layers": layers_, "stats_corpus": st[top].key.get("corpus"), "stats_count": st[top].count}
    hdict["stats_corpus_default"] = DEFAULT_CORPUS_RULE
    return Edit.factored(
        factors,
        reqs,
        keys=keys_used,
        v_star=z.float(),
        base_fingerprint=base_fp,
        hparams=hdict,
        metrics=metrics,
        model_name=model.cfg.name,
        shape=(model.cfg.d_mlp, model.cfg.d_model),
        method=method,
    )


def _checked_hparams(model: HookedGPT2, hparams: MemitHparams | Mapping[str, Any] | None) -> MemitHparams:
    """``compute_edits``' ``hparams`` as :class:`MemitHparams`, every field checked (a given object is copied,
    which re-checks it also after it was changed)."""
    if isinstance(hparams, MemitHparams):
        return replace(hparams, rome=replace(hparams.rome))
    return MemitHparams.of(model, **dict(hparams or {}))


def _target_residuals(
    model: HookedGPT2,
    items: list[tuple[Request, list[int]]],
    top: int,
    prefixes: list[str],
    hp: MemitHparams,
    stats: KeyStats,
    weights: _Weights,
    given: TargetResiduals | None,
    desc: str,
    progress: bool | None,
) -> tuple[torch.Tensor, torch.Tensor, list[dict[str, Any]]]:
    """Step 1 of the module doc: the residual after the top layer ``h0`` ``[n, d_model]``, δ ``[n, d_model]``
    (float64, CPU) that moves it to the target z, and the δ optimisation's result per request (empty when
    the targets are ``given``)."""
    reqs = [r for r, _ in items]
    _, h0 = subject_states(
        model, reqs, [], prefixes, resid_layer=top, resid_weights=weights.resid, prepend_bos=hp.rome.prepend_bos
    )
    assert h0 is not None, "subject_states returns the residual of resid_layer"
    if given is not None:
        return h0, given.z.double().cpu() - h0.double().cpu(), []
    opt = optimise_deltas(
        model,
        items,
        top,
        prefixes,
        hp.rome,
        stats.solve,
        chunk=hp.chunk,
        progress=progress,
        norm_reference=hp.delta_norm,
        desc=desc,
        key_weights=weights.keys,
        delta_site="resid_post",  # z is a residual: δ after the top block (and after its post-MLP norm)
        packed=True,  # many requests of many lengths: measured 1.21× faster than the padded batch
    )
    return h0, torch.stack([o["delta"] for o in opt]).double().cpu(), opt


def _delta_metrics(delta: torch.Tensor, opt: list[dict[str, Any]], given: bool) -> dict[str, Any]:
    """The metrics of step 1: δ's mean norm, the mean steps and final P(target) of the optimisation (None
    when the targets were given)."""
    n = len(delta)
    return {
        "delta_norm_mean": float(delta.norm(dim=-1).mean()),
        "steps_mean": sum(len(o["log"]) - 1 for o in opt) / n if opt else None,
        "p_target_optimised_mean": sum(o["log"][-1]["p_target"] for o in opt) / n if opt else None,
        "targets_given": given,
    }


def _outcome_metrics(
    p_before: list[float], after: list[TargetOutcome], ns: NullSpace | None, layers: list[int]
) -> dict[str, Any]:
    """The metrics of the edited model: P(target) before and after, whether each edit took, the top-1 token
    after it, AlphaEdit's null space per layer (warning where it is empty) and the weak edits."""
    p_after = [float(torch.tensor(o.logprob).exp()) for o in after]
    out: dict[str, Any] = {
        "p_target_before": p_before,
        "p_target_after": p_after,
        "took": [o.took for o in after],
        "top1_after": [o.top1 for o in after],
    }
    if ns is not None:
        out["null_dim"] = {l: ns.null_dim[l] for l in layers}
        out["null_leak"] = {l: ns.leak[l] for l in layers}
        _warn_empty_null_space(ns, layers)
    out["weak"] = [i for i, (b, a) in enumerate(zip(p_before, p_after)) if is_weak(b, a)]
    return out


@dataclass(frozen=True)
class _Weights:
    """The prompt variants' weights in the keys and in the residuals (None: their mean). The residuals take the
    keys' weights (``target_state="averaged"``: z and the residual belong to the key that carries them) or the
    bare prompt alone (``"bare_prompt"``)."""

    keys: list[float] | None = None
    resid: list[float] | None = None

    @classmethod
    def of(cls, hp: RomeHparams, groups: Sequence[Sequence[str]]) -> _Weights:
        n = 1 + sum(len(g) for g in groups)
        keys = variant_weights(hp, groups)
        return cls(keys, [1.0] + [0.0] * (n - 1) if hp.target_state == "bare_prompt" else keys)


def _given_targets(
    targets: Any, fingerprint: str, reqs: list[Request], top: int, d_model: int
) -> TargetResiduals | None:
    """``compute_edits``' ``targets`` as checked :class:`TargetResiduals` (None when not given)."""
    if targets is None:
        return None
    if isinstance(targets, Edit):
        targets = targets.targets
    if not isinstance(targets, TargetResiduals):
        raise TypeError(
            f"targets must be an earlier edit's target residuals (edit.targets) or the edit itself, "
            f"which record the model and requests they were computed for; got {type(targets).__name__}"
        )
    targets.check(fingerprint, reqs, top, d_model)
    return targets


def _resolve_preserve(
    model: HookedGPT2,
    preserve: Any,
    st: dict[int, KeyStats],
    layers: list[int],
    hp: MemitHparams,
    digests: dict[str, str],
) -> NullSpace | None:
    """``compute_edits``' ``preserve`` as a :class:`NullSpace` checked against the model (None: MEMIT)."""
    if preserve is None or preserve is False:
        return None
    if isinstance(preserve, NullSpace):
        ns = preserve
    elif preserve is True:
        ns = NullSpace.from_stats({l: st[l] for l in layers}, hp.nullspace_threshold, hp.nullspace_rule)
    else:
        given = {preserve.layer: preserve} if isinstance(preserve, KeyStats) else dict(preserve)
        for lay, s in given.items():
            if not isinstance(s, KeyStats):
                raise TypeError(f"preserve must hold KeyStats per layer, got {type(s).__name__} for layer {lay}")
            s.check(model, int(lay), digests)
        ns = NullSpace.from_stats(given, hp.nullspace_threshold, hp.nullspace_rule)
    unverified = [l for l in layers if l in ns.P and not ns.fingerprints.get(l)]
    if unverified:
        raise ValueError(
            f"the null space of layer(s) {unverified} was built from statistics that record no keys "
            "fingerprint, so it cannot be checked against this model; build it with "
            "NullSpace.from_stats(key_second_moment(model, layers))"
        )
    wrong = [l for l in layers if l in ns.P and ns.P[l].shape[0] != model.cfg.d_mlp]
    if wrong:
        raise ValueError(
            f"the null space of layer(s) {wrong} is {ns.P[wrong[0]].shape[0]}-dimensional, this model's "
            f"keys have d_mlp {model.cfg.d_mlp}"
        )
    ns.check(model, layers, digests)
    return ns


def _warn_empty_null_space(ns: NullSpace, layers: list[int]) -> None:
    """An :class:`EditWarning` for each edit layer whose null space is empty: its update is exactly zero."""
    empty = [l for l in layers if ns.null_dim.get(l) == 0]
    if empty:
        warnings.warn(
            f"AlphaEdit's null space has dimension 0 at layer(s) {empty} (τ = {ns.threshold:g}, "
            f"rule {ns.rule!r}): the update there is zero, so "
            f"{'the edit does nothing' if len(empty) == len(layers) else 'those layers are not edited'}. "
            f"Raise nullspace_threshold (e.g. τ = {min(ns.threshold * 10, 0.5):g}) or use "
            "nullspace_rule='energy'",
            EditWarning,
            stacklevel=4,
        )


def _solve_layers(
    model: HookedGPT2,
    reqs: list[Request],
    ids: list[list[int]],
    z: torch.Tensor,
    layers: list[int],
    prefixes: list[str],
    st: dict[int, KeyStats],
    hp: MemitHparams,
    ns: NullSpace | None,
    progress: bool | None = None,
    weights: _Weights | None = None,
) -> tuple[
    dict[int, tuple[torch.Tensor, torch.Tensor | None]],
    dict[int, torch.Tensor],
    dict[int, dict[str, float]],
    list[TargetOutcome],
]:
    """Steps 2-3 of the module doc: each layer's update, lowest first, applied before the next layer's
    keys are read, then what the model says with every update applied (:func:`.targets.target_outcomes`);
    the weights are restored on return. Returns ``(factors, keys, fit, outcomes)``."""
    factors: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
    keys_used: dict[int, torch.Tensor] = {}
    fit: dict[int, dict[str, float]] = {}
    saved = {l: model.blocks[l].mlp.W_out.detach().clone() for l in layers}
    n, d_model, top = len(reqs), model.cfg.d_model, layers[-1]
    bar = progress_bar(
        total=len(layers),
        unit="layer",
        desc=f"{'alphaedit' if ns else 'memit'}: updates",
        enabled=progress,
        leave=False,
    )
    try:
        for j, lay in enumerate(layers):
            w = weights or _Weights()
            K_all, h_now = subject_states(
                model,
                reqs,
                [lay],
                prefixes,
                resid_layer=top,
                key_weights=w.keys,
                resid_weights=w.resid,
                prepend_bos=hp.rome.prepend_bos,
            )
            assert h_now is not None, "subject_states returns the residual of resid_layer"
            K = K_all[lay].double().cpu()  # [n, d_mlp]
            R = (z - h_now.double().cpu()) / (len(layers) - j)  # [n, d_model]
            R = _before_post_norm(model.blocks[lay], K, R)
            if ns is None:
                A = least_squares_update(K, R, st[lay].C, hp.mom2_weight)
            else:
                scale = float(st[lay].C.double().diagonal().mean()) if hp.alpha_scale == "trace" else 1.0
                ridge = hp.alpha * scale
                A = projected_update(K, ns.P[lay], ns.KpKp.get(lay), ridge)
            dW = A @ R  # [d_mlp, d_model]
            fit[lay] = {
                "target_norm": float(R.norm(dim=-1).mean()),
                "fit_error": float((K @ dW - R).norm(dim=-1).mean() / R.norm(dim=-1).mean().clamp(min=1e-12)),
                "dW_norm": float(dW.norm()),
            }
            factors[lay] = (A.float(), R.float()) if n < min(d_model, A.shape[0]) else (dW.float(), None)
            keys_used[lay] = K.float()
            with torch.no_grad():
                W = model.blocks[lay].mlp.W_out
                W.add_(dW.to(W.device, W.dtype))
            bar.update(1)
        after = target_outcomes(model, [r.text for r in reqs], ids)
    finally:
        bar.close()
        with torch.no_grad():
            for l, W0 in saved.items():
                model.blocks[l].mlp.W_out.copy_(W0)
    return factors, keys_used, fit, after


def _before_post_norm(block: Any, K: torch.Tensor, R: torch.Tensor) -> torch.Tensor:
    """The change of a layer's MLP output that moves the residual by ``R`` ``[n, d_model]``: ``R`` itself,
    or where the block normalises its MLP's output (``ln2_post``: OLMo 2, Gemma), ``R`` carried back
    through that norm to first order at the keys' output ``K W_out + b`` with the norm's scale held:
    ``R · scale / gain`` (``scale = sqrt(mean(x²) + eps)`` for RMSNorm, the standard deviation's for
    LayerNorm)."""
    norm = getattr(block, "ln2_post", None)
    if norm is None:
        return R
    mlp = block.mlp
    x = K @ mlp.W_out.detach().double().cpu()
    if mlp.b_out is not None:
        x = x + mlp.b_out.detach().double().cpu()
    if getattr(norm, "centred", False):
        x = x - x.mean(-1, keepdim=True)
    scale = (x.pow(2).mean(-1, keepdim=True) + norm.eps).sqrt()  # [n, 1]
    return R * scale / norm.gain.detach().double().cpu()


@boundary
def apply_memit(
    model: HookedGPT2,
    requests: Sequence[RequestLike],
    batch_size: int | None = None,
    progress: bool | None = None,
    **kwargs: Any,
) -> list[Edit]:
    """Compute and apply edits for ``requests`` in batches of ``batch_size`` (all at once when None),
    each batch on the model edited by the previous ones. ``kwargs`` go to :func:`compute_edits`
    (a ``preserve=NullSpace`` accumulates the earlier batches' keys). Undo with ``undo_all(model)``.
    Returns the applied edits, one per batch. An empty request list or ``batch_size`` < 1 raises
    ValueError; otherwise the refusals of :func:`compute_edits`. ``progress``: as in :func:`compute_edits`,
    plus, with several batches, a bar over the requests (done out of total, with the time left)."""
    reqs = list(requests)
    if not reqs:
        raise ValueError("the request list is empty")
    size = len(reqs) if batch_size is None else check_count(batch_size, "batch_size")
    edits = []
    method = "alphaedit" if kwargs.get("preserve") not in (None, False) else "memit"
    bar = progress_bar(
        total=len(reqs), unit="req", desc=f"{method} batches", enabled=progress if size < len(reqs) else False
    )
    for s in range(0, len(reqs), size):
        e = compute_edits(model, reqs[s : s + size], progress=progress, **kwargs)
        edits.append(e.apply(model, verify=False))
        bar.update(len(reqs[s : s + size]))
    bar.close()
    return edits


__all__ = [
    "MODEL_HPARAMS",
    "MemitHparams",
    "NullSpace",
    "TargetResiduals",
    "apply_memit",
    "choose_layers",
    "compute_edits",
    "default_layers",
    "least_squares_update",
    "projected_update",
    "validate_requests",
]
