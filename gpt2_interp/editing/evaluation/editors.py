"""The editing methods an evaluation runs, behind one interface (:class:`Editor`).

An editor is prepared once per evaluation — its layer(s), key statistics and (AlphaEdit) null space
resolved then — and afterwards only computes edits: ``editor.compute(model, requests) -> Edit``.
The loop (:mod:`.loop`) applies, scores and undoes them, whatever the method.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, runtime_checkable

from ...core.boundary import boundary
from ...core.checks import as_int
from ...model.fingerprint import parameter_digests
from ..edit import Edit, Request, TargetResiduals
from ..memit import MemitHparams, NullSpace, _resolve_layers, _resolve_stats, compute_edits
from ..rome import compute_edit
from ..settings import default_layer, hparams_for
from ..stats import KeyStats, key_second_moment
from .config import EvalConfig

if TYPE_CHECKING:
    from ...model import HookedGPT2


@runtime_checkable
class Editor(Protocol):
    """What the evaluation loop needs of an editing method.

    ``name``: the method's name in reports. ``max_batch``: the most requests one edit may hold (1 for
    ROME, None for any). ``layer``: the layer(s) it edits, as reported (None: chosen per request).
    ``hparams``: its settings, as reported. ``compute(model, requests)``: ONE edit (not applied) that
    writes ``requests`` into ``model`` as it is now."""

    name: ClassVar[str]
    max_batch: ClassVar[int | None]

    @property
    def layer(self) -> int | list[int] | None:
        """The layer(s) the editor edits, as reported (None: chosen per request)."""

    @property
    def hparams(self) -> dict[str, Any]:
        """The editor's settings, as reported."""

    def compute(self, model: HookedGPT2, requests: Sequence[Request]) -> Edit:
        """ONE edit (not applied) that writes ``requests`` into ``model`` as it is now."""


@boundary
@dataclass
class RomeEditor:
    """ROME, one request per edit, at one fixed layer (with its key statistics) or at a layer chosen
    per request (``fixed_layer`` None: ``layer="auto"``).

    ``stats``: the key statistics of ``fixed_layer`` (None with ``"auto"``: computed per edit);
    ``overrides``: the hyperparameters given by the caller (passed to every
    :func:`~..rome.compute_edit`); ``settings``: the full resolved :class:`~..settings.RomeHparams`, as
    reported; ``progress``: the δ-step bars of each edit (None: on a terminal or in a notebook)."""

    fixed_layer: int | None
    stats: KeyStats | None
    overrides: dict[str, Any] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    progress: bool | None = False
    name: ClassVar[str] = "rome"
    max_batch: ClassVar[int | None] = 1

    @classmethod
    def prepare(
        cls,
        model: HookedGPT2,
        layer: int | str | None = None,
        stats: KeyStats | Mapping[int, KeyStats] | None = None,
        progress: bool | None = None,
        group: Any = None,
        **hparams: Any,
    ) -> RomeEditor:
        """Resolve the layer (None: :func:`~..rome.default_layer`) and its key statistics (given, or
        computed once — by the ranks of ``group`` together when distributed); ``hparams`` override
        :class:`~..settings.RomeHparams`. ``stats``: one :class:`~..stats.KeyStats` or ``{layer: KeyStats}``;
        ``progress``: for the statistics and each edit (:func:`~..rome.compute_edit`). A ``layer`` that is
        not an int, None or ``"auto"`` raises TypeError; an unknown hyperparameter ValueError."""
        hp = hparams_for(model, **hparams)
        if layer is None:
            fixed: int | None = default_layer(model)
        elif isinstance(layer, str) and layer == "auto":
            fixed = None
        else:
            fixed = as_int(layer, "layer (ROME edits one layer: an int, None or 'auto')")
        st = None
        if fixed is not None:
            st = stats if isinstance(stats, KeyStats) else (stats or {}).get(fixed)
            if st is None:
                st = key_second_moment(
                    model, fixed, corpus=hp.corpus, n_samples=hp.n_samples, progress=progress, group=group
                )
        return cls(fixed, st, dict(hparams), dict(vars(hp)), progress)

    @property
    def layer(self) -> int | None:
        """The fixed edit layer (None: chosen per request)."""
        return self.fixed_layer

    @property
    def hparams(self) -> dict[str, Any]:
        """The resolved ROME hyperparameters."""
        return self.settings

    def compute(self, model: HookedGPT2, requests: Sequence[Request]) -> Edit:
        """The ROME edit (:func:`~..rome.compute_edit`, not applied) of the one request in ``requests``
        (any other number raises ValueError)."""
        if len(requests) != 1:
            raise ValueError(f"requests: ROME edits one request at a time, got {len(requests)}")
        layer = "auto" if self.fixed_layer is None else self.fixed_layer
        return compute_edit(model, requests[0], layer=layer, stats=self.stats, progress=self.progress, **self.overrides)


_MemitE = TypeVar("_MemitE", bound="MemitEditor")  # MemitEditor.prepare builds the class it is called on


@boundary
@dataclass
class MemitEditor:
    """MEMIT: one edit for a batch of requests, spread over ``layers`` with their key statistics.
    ``remember`` (sequential editing): an AlphaEdit null space remembers each batch's keys.
    ``targets``: the target residuals of an earlier edit of the same one batch (the δ optimisation
    is skipped). ``stats``: ``{layer: KeyStats}``; ``hp``: the resolved :class:`~..memit.MemitHparams`;
    ``progress``: progress bars while computing; ``null_space``: AlphaEdit's (None for MEMIT)."""

    layers: list[int]
    stats: dict[int, KeyStats]
    hp: MemitHparams
    remember: bool = False
    targets: TargetResiduals | None = None
    progress: bool | None = False
    null_space: NullSpace | None = None
    name: ClassVar[str] = "memit"
    max_batch: ClassVar[int | None] = None

    @classmethod
    def prepare(
        cls: type[_MemitE],
        model: HookedGPT2,
        requests: Sequence[Request],
        layer: int | Sequence[int] | str | None = None,
        stats: KeyStats | Mapping[int, KeyStats] | None = None,
        remember: bool = False,
        targets: TargetResiduals | None = None,
        progress: bool | None = None,
        **hparams: Any,
    ) -> _MemitE:
        """Resolve the layers (None: the model's defaults; "auto": chosen from ``requests``' traces)
        and their key statistics (given, or computed once) as :func:`~..memit.compute_edits` does;
        ``hparams`` override :class:`~..memit.MemitHparams`. ``layer``: None, an int, a list or
        ``"auto"``; ``stats``: a :class:`~..stats.KeyStats` or ``{layer: KeyStats}``; ``remember``,
        ``targets`` and ``progress`` are kept for :meth:`compute`. Refusals as in ``compute_edits``."""
        hp = MemitHparams.of(model, **hparams)
        layers = _resolve_layers(model, layer, hp, list(requests))
        st = _resolve_stats(model, layers, stats, hp, parameter_digests(model), progress)
        return cls(layers, st, hp, remember=remember, targets=targets, progress=progress)

    @property
    def layer(self) -> list[int]:
        """The edit layers, ascending."""
        return self.layers

    @property
    def hparams(self) -> dict[str, Any]:
        """The resolved MEMIT hyperparameters as a dict."""
        return self.hp.to_dict()

    def compute(self, model: HookedGPT2, requests: Sequence[Request]) -> Edit:
        """One edit (:func:`~..memit.compute_edits`, not applied) of every request in ``requests``, at
        the prepared layers with the prepared statistics (and null space)."""
        return compute_edits(
            model,
            list(requests),
            layers=self.layers,
            stats=self.stats,
            hparams=self.hp,
            preserve=self.null_space,
            remember=self.remember,
            progress=self.progress,
            targets=self.targets,
        )


@boundary
@dataclass
class AlphaEditEditor(MemitEditor):
    """AlphaEdit: MEMIT's batches with each update confined to the null space of preserved keys
    (:class:`~..memit.NullSpace`), which remembers earlier batches' keys when ``remember``."""

    name: ClassVar[str] = "alphaedit"

    @classmethod
    def prepare(
        cls,
        model: HookedGPT2,
        requests: Sequence[Request],
        layer: int | Sequence[int] | str | None = None,
        stats: KeyStats | Mapping[int, KeyStats] | None = None,
        remember: bool = False,
        targets: TargetResiduals | None = None,
        progress: bool | None = None,
        preserve: Any = None,
        **hparams: Any,
    ) -> AlphaEditEditor:
        """:meth:`MemitEditor.prepare`, then the null space: ``preserve`` as a
        :class:`~..memit.NullSpace`, else built from ``preserve``'s statistics (None or True: the
        edit layers' own) with the hyperparameters' threshold and rule. ``requests``, ``layer``,
        ``stats``, ``remember``, ``targets``, ``progress`` and ``hparams`` as in :meth:`MemitEditor.prepare`."""
        editor = super().prepare(model, requests, layer, stats, remember, targets, progress, **hparams)
        if not isinstance(preserve, NullSpace):
            own = preserve is None or preserve is True
            preserve = NullSpace.from_stats(
                {l: editor.stats[l] for l in editor.layers} if own else preserve,
                editor.hp.nullspace_threshold,
                editor.hp.nullspace_rule,
            )
        editor.null_space = preserve
        return editor


@boundary
def make_editor(model: HookedGPT2, config: EvalConfig, requests: Sequence[Request], group: Any = None) -> Editor:
    """The editor ``config.method`` names, prepared for ``requests`` (their layers chosen when
    ``config.layer`` is "auto") with ``config``'s layer, statistics and hyperparameters. ``group``:
    the process group whose ranks compute ROME's key statistics together."""
    common = dict(layer=config.layer, stats=config.stats, progress=config.progress, **config.hparams)
    if config.method == "rome":
        return RomeEditor.prepare(model, group=group, **common)
    batch = dict(remember=config.sequential, targets=config.targets, **common)
    if config.method == "memit":
        return MemitEditor.prepare(model, requests, **batch)
    return AlphaEditEditor.prepare(model, requests, preserve=config.preserve, **batch)


__all__ = ["AlphaEditEditor", "Editor", "MemitEditor", "RomeEditor", "make_editor"]
