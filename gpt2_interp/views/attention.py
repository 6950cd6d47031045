"""Attention patterns of one prompt: every head of a chosen layer as a destination × source heatmap, and
the prompt coloured by the attention from a chosen token (as CircuitsVis's attention heads and tokens).

The patterns are the model's ``blocks.{l}.attn.hook_pattern`` values, read with ``run_with_cache`` and a
names filter (so only the patterns are kept). The page carries them as base64 float32, decoded to the
very same numbers in the browser: what a heatmap shows is the hook's value, bit for bit.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..core.boundary import boundary
from ..core.checks import check_index
from ..core.result import Result
from .heatmap import axis_labels
from .page import Part, View, script_json, text_part

if TYPE_CHECKING:
    from ..model import HookedGPT2


@boundary
@dataclass
class AttentionPatterns(Result):
    """The attention patterns of one prompt.

    ``prompt`` and its ``str_tokens`` (BOS included); ``layers``: the layer indices kept; ``pattern``:
    ``[n_layers_kept, n_head, dst, src]`` float32, ``pattern[i, h, q, k]`` = how much head ``h`` of layer
    ``layers[i]`` at destination ``q`` attends to source ``k`` (rows sum to 1, zero above the diagonal);
    ``n_kv_heads``: key/value heads (fewer than ``n_head`` under grouped-query attention: query head ``h``
    reads KV group ``h // (n_head // n_kv_heads)``)."""

    result_kind = "attention patterns"

    prompt: str
    str_tokens: list[str]
    layers: list[int]
    pattern: torch.Tensor
    n_kv_heads: int

    @property
    def n_heads(self) -> int:
        """Query heads per layer."""
        return int(self.pattern.shape[1])

    def kv_group(self, head: int) -> int:
        """The key/value group query head ``head`` reads (its own index without grouped-query attention)."""
        return head // (self.n_heads // self.n_kv_heads)

    def view(self, layer: int | None = None) -> View:
        """This result as an interactive page (:func:`view_attention`); ``layer``: the one shown first."""
        return view_attention(self, layer=layer)


@boundary
def attention_patterns(model: HookedGPT2, prompt: str, layers: Sequence[int] | None = None) -> AttentionPatterns:
    """Run ``model`` on ``prompt`` (BOS prepended, as ``to_tokens`` does) caching only each layer's
    ``attn.hook_pattern`` (``layers``: which, default all) and return them as :class:`AttentionPatterns`.
    A layer whose pattern is not asked for runs the fused attention kernel, which may differ from the
    explicit softmax by a few ulps downstream: the values are those of a run that reads these hooks."""
    n = model.cfg.n_layer
    kept = (
        list(range(n)) if layers is None else [check_index(l, n, "layer", f"the model has {n} layers") for l in layers]
    )
    if not kept:
        raise ValueError("layers is empty; pass at least one layer index, or None for every layer")
    names = {f"blocks.{l}.attn.hook_pattern" for l in kept}
    tokens = model.to_tokens(prompt)
    with torch.inference_mode():
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name in names)
    pattern = torch.stack([cache[f"blocks.{l}.attn.hook_pattern"][0] for l in kept]).float().cpu()
    return AttentionPatterns(
        prompt=prompt,
        str_tokens=model.to_str_tokens(tokens),
        layers=kept,
        pattern=pattern,
        n_kv_heads=model.cfg.n_kv,
    )


_SCRIPT = r"""
var D = {data};
var raw = atob(D.b64), buf = new Uint8Array(raw.length);
for (var i = 0; i < raw.length; i++) buf[i] = raw.charCodeAt(i);
var P = new Float32Array(buf.buffer), L = D.shape[0], H = D.shape[1], T = D.shape[2];
var root = document.getElementById('{id}'), gd = document.getElementById('{id}-fig');
var selL = document.getElementById('{id}-layer'), selH = document.getElementById('{id}-head');
var toks = document.getElementById('{id}-tokens'), info = document.getElementById('{id}-info');
var labels = D.labels;
var cols = Math.min(H, D.cols), rows = Math.ceil(H / cols), state = {layer: D.first, head: 0, dst: T - 1};
function rowsOf(l, h) {
  var z = [], o = ((l * H) + h) * T * T;
  for (var q = 0; q < T; q++) z.push(Array.from(P.subarray(o + q * T, o + (q + 1) * T)));
  return z;
}
function value(l, h, q, k) { return P[(((l * H) + h) * T + q) * T + k]; }
function headTitle(h) {
  return 'head ' + h + (D.kv === H ? '' : ' · KV group ' + Math.floor(h / D.group));
}
function draw() {
  var data = [], layout = {height: D.panel * rows + 140, margin: {l: 90, r: 10, t: 50, b: 80}, showlegend: false,
    title: {text: 'layer ' + D.layers[state.layer] + ': attention, destination (rows) × source (columns)',
            font: {size: 13}}, annotations: []};
  var gap = 0.06;
  for (var h = 0; h < H; h++) {
    var r = Math.floor(h / cols), c = h % cols, ax = h === 0 ? '' : String(h + 1);
    var x0 = c / cols + gap / 4, x1 = (c + 1) / cols - gap / 4 - (c === cols - 1 ? 0.04 : 0);
    var y1 = 1 - r / rows - gap / 2, y0 = 1 - (r + 1) / rows + gap / 4;
    data.push({type: 'heatmap', z: rowsOf(state.layer, h), x: labels, y: labels, xaxis: 'x' + ax, yaxis: 'y' + ax,
      zmin: 0, zmax: 1, colorscale: [[0, '#ffffff'], [1, '#08306b']], showscale: h === H - 1, name: headTitle(h),
      hovertemplate: 'layer ' + D.layers[state.layer] + ' ' + headTitle(h) +
        '<br>destination %{y}<br>source %{x}<br>attention %{z:.4f}<extra></extra>'});
    layout['xaxis' + ax] = {domain: [x0, x1], anchor: 'y' + ax, showticklabels: T <= 32 && r === rows - 1,
                            tickfont: {size: 8}, type: 'category'};
    layout['yaxis' + ax] = {domain: [y0, y1], anchor: 'x' + ax, autorange: 'reversed',
                            showticklabels: T <= 32 && c === 0, tickfont: {size: 8}, type: 'category'};
    layout.annotations.push({text: headTitle(h), x: (x0 + x1) / 2, y: y1, xref: 'paper', yref: 'paper',
      yanchor: 'bottom', showarrow: false, font: {size: 11, color: h === state.head ? '#d62728' : '#222'}});
  }
  Plotly.react(gd, data, layout, {displaylogo: false, responsive: true});
  drawTokens();
}
function drawTokens() {
  var l = state.layer, h = state.head, q = state.dst;
  toks.innerHTML = '';
  D.tokens.forEach(function (t, k) {
    var s = document.createElement('span'), v = k <= q ? value(l, h, q, k) : 0;
    s.className = 'g2v-tok' + (k === q ? ' g2v-sel' : '');
    s.textContent = t;
    s.dataset.pos = k;
    s.style.background = 'rgba(31,119,180,' + v.toFixed(3) + ')';
    s.style.color = v > 0.55 ? 'white' : '#222';
    s.title = 'source ' + k + ':' + t + ' ← destination ' + q + ':' + D.tokens[q] + ': ' + v.toFixed(4);
    s.onmouseenter = function () { info.textContent = s.title; };
    s.onclick = function () { state.dst = k; drawTokens(); };
    toks.appendChild(s);
  });
  info.textContent = 'layer ' + D.layers[l] + ', ' + headTitle(h) + ': attention from ' + q + ':' +
    D.tokens[q] + ' (click a token to attend from it)';
}
D.layers.forEach(function (l, i) { selL.add(new Option('layer ' + l, i)); });
for (var h = 0; h < H; h++) selH.add(new Option(headTitle(h), h));
selL.value = state.layer;
selL.onchange = function () { state.layer = +selL.value; draw(); };
selH.onchange = function () { state.head = +selH.value; draw(); };
draw();
gd.on('plotly_click', function (e) {
  var p = e.points[0]; state.head = p.curveNumber; state.dst = p.pointIndex[0]; selH.value = state.head; draw();
});
root.g2v = {pattern: function (l, h) { return rowsOf(l, h); }, state: state, draw: draw,
            select: function (l, h, q) {
              state.layer = l; state.head = h; state.dst = q; selL.value = l; selH.value = h; draw();
            }};
"""


def _attention_data(d: Mapping[str, Any]) -> tuple[np.ndarray, list[str], list[int], int]:
    pattern = d["pattern"]
    arr = (pattern.detach().float().cpu().numpy() if isinstance(pattern, torch.Tensor) else np.asarray(pattern)).astype(
        "<f4"
    )
    if arr.ndim != 4 or arr.shape[2] != arr.shape[3]:
        raise ValueError(f"pattern must be [layers, heads, dst, src] with dst == src, got shape {tuple(arr.shape)}")
    return arr, list(d["str_tokens"]), [int(l) for l in d["layers"]], int(d.get("n_kv_heads") or arr.shape[1])


@boundary
def view_attention(result: AttentionPatterns | Mapping[str, Any], layer: int | None = None, panel: int = 260) -> View:
    """The attention page of ``result`` (an :class:`AttentionPatterns` or its ``to_dict()``).

    A layer menu; every head of that layer as a destination × source heatmap with the tokens on the axes
    (hover: the two tokens and the value; GQA heads titled with their KV group); a head menu (or a click on
    a panel) chooses the head whose attention colours the prompt below, from the token clicked there (the
    last one at first). ``layer``: the layer shown first (an index into ``result.layers``, default 0);
    ``panel``: the height of one row of head panels in pixels."""
    d = result.to_dict() if isinstance(result, AttentionPatterns) else result
    if isinstance(result, AttentionPatterns):
        d = {**d, "pattern": result.pattern}  # the tensor itself: to_dict rounds to 6 digits
    arr, tokens, layers, n_kv = _attention_data(d)
    first = 0 if layer is None else check_index(layer, len(layers), "layer", f"the result holds {len(layers)} layers")
    n_heads = arr.shape[1]
    data = {
        "b64": base64.b64encode(np.ascontiguousarray(arr).tobytes()).decode("ascii"),
        "shape": list(arr.shape),
        "tokens": tokens,
        "labels": axis_labels(tokens),
        "layers": layers,
        "first": first,
        "kv": n_kv,
        "group": n_heads // n_kv,
        "cols": 3 if n_heads == 9 else 4,
        "panel": panel,
    }
    controls = (
        '<div id="{id}" class="g2v-attn"><div class="g2v-controls">'
        '<select id="{id}-layer" aria-label="layer"></select>'
        '<select id="{id}-head" aria-label="head"></select></div>'
        '<div id="{id}-fig" class="g2v-fig"></div>'
        '<div id="{id}-tokens" class="g2v-tokens"></div><div id="{id}-info" class="g2v-info"></div></div>'
    )
    gqa = f", {n_kv} key/value heads (grouped-query attention)" if n_kv != n_heads else ""
    note = text_part(
        f"{len(layers)} layers × {n_heads} heads{gqa}, {len(tokens)} tokens; values are blocks.L.attn.hook_pattern."
    )
    return View(
        f"Attention patterns: {d.get('prompt', '')!r}",
        [note, Part(controls, _SCRIPT.replace("{data}", script_json(data)))],
    )
