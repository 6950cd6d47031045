"""``view(result)``: the interactive view of any result, found from the kind the result records.

A result's ``to_dict()`` names its kind (``{"result": "lens", …}``:
:attr:`~gpt2_interp.core.result.Result.result_kind`), and :data:`VIEWS` maps each kind to its view. A dict without
that key is recognised by the fields its kind always has (:data:`FIELDS`).

Works the same on a result object, on its ``to_dict()`` and on a saved JSON file read back (a result's
``to_json``, or an experiment's ``result.json``, whose ``data`` is searched for results it holds), so
``gpt2-interp view RESULT.json`` needs no model and no recomputation.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..core.boundary import boundary
from ..core.result import KIND_KEY, ResultLike
from .attention import AttentionPatterns, view_attention
from .attribution import view_agreement, view_verification
from .causal import view_average_trace, view_patch, view_traces
from .circuits import view_circuit, view_faithfulness
from .editing import view_edit_evaluation, view_probe, view_topk
from .features import view_feature
from .graphs import view_graph
from .heatmap import as_dict
from .interventions import view_intervention, view_two_hop_check
from .lens import view_dla, view_lens, view_neuron_search, view_subupdates, view_vocab
from .page import Part, View, text_part
from .steering import view_steering

#: Each kind of result (its ``result_kind``) and its interactive view.
VIEWS: dict[str, Callable[..., View]] = {
    "attention patterns": view_attention,
    "lens": view_lens,
    "average trace": view_average_trace,
    "trace set": view_traces,
    "causal trace": view_traces,
    "patching": view_patch,
    "attribution": view_patch,
    "verification": view_verification,
    "agreement": view_agreement,
    "top-k comparison": view_topk,
    "edit evaluation": view_edit_evaluation,
    "probe": view_probe,
    "direct logit attribution": view_dla,
    "vocabulary projection": view_vocab,
    "MLP sub-updates": view_subupdates,
    "neuron search": view_neuron_search,
    "circuit": view_circuit,
    "edge scores": view_circuit,
    "faithfulness curve": view_faithfulness,
    "feature": view_feature,
    "steering curve": view_steering,
    "attribution_graph": view_graph,
    "graph_intervention": view_intervention,
    "two_hop_check": view_two_hop_check,
}

#: For a dict that names no kind: the fields each kind always has, most specific first.
FIELDS: list[tuple[str, frozenset[str]]] = [
    ("attention patterns", frozenset({"pattern", "str_tokens", "n_kv_heads"})),
    ("lens", frozenset({"top_tokens", "top_probs", "str_tokens", "valid"})),
    ("average trace", frozenset({"kinds", "buckets", "indirect_effect", "counts"})),
    ("trace set", frozenset({"traces"})),
    ("causal trace", frozenset({"scores", "subject_range", "tokens", "kind"})),
    ("patching", frozenset({"values", "index_names", "layer_labels", "direction", "metric"})),
    ("verification", frozenset({"verified_top", "estimate", "exact", "labels"})),
    ("agreement", frozenset({"spearman_abs", "estimate", "exact", "n_cells"})),
    ("top-k comparison", frozenset({"before", "after", "prompts"})),
    ("edit evaluation", frozenset({"summary", "rows", "method", "sequential"})),
    ("probe", frozenset({"task", "scores", "chance", "classes"})),
    ("direct logit attribution", frozenset({"parts", "head_parts", "ln_bias"})),
    ("vocabulary projection", frozenset({"top_scores", "bottom_scores", "bottom_tokens"})),
    ("MLP sub-updates", frozenset({"norms", "activations", "neurons", "token"})),
    ("neuron search", frozenset({"neurons", "scores", "top_tokens", "tokens"})),
    ("circuit", frozenset({"edges", "scores", "n_layer", "n_head", "n_kv", "total_edges"})),
    ("edge scores", frozenset({"edges", "scores", "method", "n_pairs", "clean_metric"})),
    ("faithfulness curve", frozenset({"faithfulness", "sizes", "kept", "methods"})),
    ("feature", frozenset({"latent", "contexts", "promoted", "suppressed", "histogram", "density"})),
    ("steering curve", frozenset({"scales", "target_prob", "loss_change", "kl", "baseline_prob"})),
    ("attribution_graph", frozenset({"adjacency", "features", "logit_tokens", "logit_probabilities", "n_layers"})),
    (
        "graph_intervention",
        frozenset({"graph_direct", "graph_total", "frozen_held", "frozen_free", "real", "node_free"}),
    ),
    ("two_hop_check", frozenset({"bridge", "answer", "bridge_features", "first_hop_prob", "suppressed"})),
]


@boundary
def kind_of(d: Mapping[str, Any]) -> str | None:
    """The kind of result a dict holds that has a view (``"lens"``, ``"patching"``, …; see :data:`VIEWS`): the
    kind it records, or for a dict that records none, the kind whose fields it has (:data:`FIELDS`); else None."""
    named = d.get(KIND_KEY)
    if isinstance(named, str):
        return named if named in VIEWS else None
    keys = set(d)
    return next((name for name, need in FIELDS if need <= keys), None)


def _children(data: Any, where: str) -> list[tuple[str, Any]]:
    """The entries of a mapping, or the first 8 of a list of mappings, each with the path it sits at."""
    if isinstance(data, Mapping):
        return [(f"{where}.{k}" if where else str(k), v) for k, v in data.items()]
    if isinstance(data, list) and data and isinstance(data[0], Mapping):
        return [(f"{where}[{i}]", v) for i, v in enumerate(data[:8])]
    return []


def _found(data: Any, where: str, depth: int = 0) -> list[tuple[str, dict[str, Any]]]:
    """Result dicts inside an experiment's data (two levels deep), each with the path it sits at."""
    if depth > 2:
        return []
    if isinstance(data, Mapping) and kind_of(data):
        return [(where, dict(data))]
    return [hit for path, v in _children(data, where) for hit in _found(v, path, depth + 1)]


@boundary
def view(result: ResultLike, **kwargs: Any) -> View:
    """The interactive :class:`~gpt2_interp.views.View` of ``result``: a result object (lens, patching,
    attribution, trace, average trace, verification, agreement, top-k comparison, edit evaluation, probe,
    vocabulary, neuron search, sub-updates, attention patterns, circuit, edge scores, faithfulness curve,
    feature, steering curve, attribution graph, graph intervention, two-hop check), its ``to_dict()``, or an experiment
    result (``ExperimentResult`` or its ``result.json`` as a dict), whose data is searched for the
    results it holds. ``kwargs`` go to the kind's view function. A dict of no known kind raises
    ValueError naming the kinds; a dict of a known kind that lacks a field or holds one of the wrong type
    raises ValueError naming the kind and the field."""
    if isinstance(result, AttentionPatterns):
        return view_attention(result, **kwargs)
    d = as_dict(result)
    kind = kind_of(d)
    if kind is not None:
        fn = VIEWS[kind]
        if isinstance(result, Mapping):  # a dict read back: a missing or malformed field is named, not a raw error
            return _view_dict(kind, fn, d, **kwargs)
        return fn(d, **kwargs)
    if {"experiment", "data"} <= set(d):
        return view_experiment(d)
    named = f"of kind {d[KIND_KEY]!r}" if isinstance(d.get(KIND_KEY), str) else f"with fields {sorted(d)[:12]}"
    raise ValueError(f"no view for a result {named}; views exist for: " + ", ".join(VIEWS))


def _view_dict(kind: str, fn: Callable[..., View], d: dict[str, Any], **kwargs: Any) -> View:
    """``fn(d)`` for a dict of the ``kind`` (a result read back), a missing field or a field of the wrong
    shape answered with a ValueError naming the kind and the field (or the error) instead of a raw one."""
    try:
        return fn(d, **kwargs)
    except KeyError as e:
        raise ValueError(
            f"this {kind} result lacks the field {e.args[0]!r} (it has {', '.join(sorted(d))[:200]}); "
            "give the dict or file its to_dict()/to_json() wrote"
        ) from None
    except (TypeError, IndexError, AttributeError) as e:
        raise ValueError(
            f"this {kind} result has a field of the wrong type or shape ({type(e).__name__}: {e}); "
            "give the dict or file its to_dict()/to_json() wrote"
        ) from None


@boundary
def view_experiment(
    d: Mapping[str, Any], figures: Mapping[str, str] | None = None, tables: Mapping[str, str] | None = None
) -> View:
    """An experiment's result ``d`` (``result.json`` as a dict): its finding, the view of every result found in
    its data, then ``tables`` (``{name: HTML}``) and ``figures`` (``{name: PNG as base64}``) the experiment
    renders itself, where given (the figures only where no interactive view was found); without any of
    these, the data as indented JSON."""
    data = d.get("data", {})
    name = d.get("experiment", "experiment")
    parts: list[Part] = [text_part(f"model {d.get('model', '?')}; config {json.dumps(d.get('config', {}))}")]
    if isinstance(data, Mapping) and data.get("finding"):
        parts.append(text_part(str(data["finding"]), "p", "g2v-finding"))
    found = _found(data, "")
    parts += _found_parts(found)
    parts += _rendered_parts(tables or {}, {} if found else figures or {})
    if not found and not tables and not figures:
        parts.append(Part(f"<pre>{html.escape(json.dumps(data, indent=1)[:200_000])}</pre>"))
    return View(f"Experiment {name}", parts)


def _found_parts(found: list[tuple[str, dict[str, Any]]]) -> list[Part]:
    """The view of each result found in an experiment's data, under its title and the path it sits at."""
    parts: list[Part] = []
    for where, sub in found:
        inner = view(sub)
        parts += [text_part(f"{inner.title} (data{'.' + where if where else ''})", "h3", "g2v-title"), *inner.parts]
    return parts


def _rendered_parts(tables: Mapping[str, str], figures: Mapping[str, str]) -> list[Part]:
    """The ``tables`` (``{name: HTML}``) and ``figures`` (``{name: PNG as base64}``) an experiment renders
    itself, each under its name."""
    parts = [Part(f"<h3>{html.escape(tname)}</h3>{table}") for tname, table in tables.items()]
    for fname, png in figures.items():
        img = f'<img alt="{html.escape(fname)}" src="data:image/png;base64,{png}" style="max-width:100%">'
        parts.append(Part(f"<h3>{html.escape(fname)}</h3>{img}"))
    return parts


@boundary
def load_result(path: str | Path) -> dict[str, Any]:
    """A saved result read back: a JSON file (a result's ``to_json``, an experiment's ``result.json``) or
    a folder holding ``result.json``. A missing file or one that is not JSON raises a one-line error."""
    p = Path(path)
    if p.is_dir():
        p = p / "result.json"
    if not p.exists():
        raise FileNotFoundError(f"{path} does not exist; give a result JSON file (or a folder holding result.json)")
    try:
        data = json.loads(p.read_text())
    except ValueError as e:
        raise ValueError(f"{p} is not JSON ({e}); give a file written by a result's to_json() or the runner") from None
    if not isinstance(data, dict):
        raise ValueError(f"{p} holds a JSON {type(data).__name__}, not a result object")
    return data
