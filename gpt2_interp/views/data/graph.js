// The attribution graph page (gpt2_interp.views.graphs): one SVG element per node and per edge, a tooltip on
// hover, a node pinned on click with the edges on paths through it highlighted. D is graph_page_data's output.
var D = {data};
var root = document.getElementById('{id}');
var svg = root.querySelector('svg.g2v-gsvg'), tip = root.querySelector('.g2v-gtip');
var info = root.querySelector('.g2v-ginfo'), mode = root.querySelector('select[aria-label=highlight]');
var slider = root.querySelector('input[aria-label="edge threshold"]'), thr = root.querySelector('.g2v-gthr');
var NS = 'http://www.w3.org/2000/svg', N = D.nodes, E = D.edges, pinned = null;
var ins = N.map(function () { return []; }), outs = N.map(function () { return []; });
E.forEach(function (e, k) { outs[e[0]].push(k); ins[e[1]].push(k); });
var maxW = E.reduce(function (m, e) { return Math.max(m, Math.abs(e[2])); }, 0) || 1;

function el(tag, attrs, parent) {
  var x = document.createElementNS(NS, tag);
  for (var a in attrs) x.setAttribute(a, attrs[a]);
  parent.appendChild(x);
  return x;
}
function esc(s) {
  return String(s).replace(/[&<>"']/g, function (c) {
    return {'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;'}[c];
  });
}
function tok(t) { t = String(t).replace(/\n/g, '\\n'); return t.charAt(0) === ' ' ? '\u2423' + t.slice(1) : t; }
function fmt(v) { return (v >= 0 ? '+' : '') + Number(v).toPrecision(4); }
function short(i) {
  var n = N[i];
  if (n.kind === 'feature') return n.label + '@' + n.pos;
  if (n.kind === 'error') return 'error L' + n.layer + '@' + n.pos;
  if (n.kind === 'token') return '\u2018' + tok(n.label) + '\u2019@' + n.pos;
  return 'logit \u2018' + tok(n.label) + '\u2019';
}
function pairs(list) {
  return list.map(function (p) { return esc(tok(p[0])) + ' ' + fmt(p[1]); }).join(', ');
}
function contextHtml(cs) {
  var top = cs.reduce(function (m, c) { return Math.max(m, c.max_act); }, 0) || 1;
  return cs.map(function (c) {
    var spans = c.tokens.map(function (t, j) {
      var a = Math.min(Math.max(c.acts[j] / top, 0), 1);
      return '<span class="g2v-gctok' + (j === c.position ? ' g2v-sel' : '') + '" style="background:rgba(214,39,40,' +
        a.toFixed(3) + ')">' + esc(t) + '</span>';
    }).join('');
    return '<div class="g2v-gctx">' + Number(c.max_act).toFixed(3) + ' ' + spans + '</div>';
  }).join('');
}
function nodeHtml(i) {
  var n = N[i], h = '<b>' + esc(n.title) + '</b>';
  if (n.kind === 'feature') h += '<br>activation ' + Number(n.act).toPrecision(5);
  if (n.kind === 'logit') h += '<br>probability ' + Number(n.prob).toPrecision(4);
  h += '<br>' + ins[i].length + ' edges in, ' + outs[i].length + ' out (drawn)';
  if (n.to_logits && n.to_logits.length) {
    h += '<div class="g2v-gsec">direct effect on the logits: ' + pairs(n.to_logits) + '</div>';
  }
  if (n.logits) {
    h += '<div class="g2v-gsec g2v-glogits">top logit effects: promotes ' + pairs(n.logits.promoted) +
      '<br>suppresses ' + pairs(n.logits.suppressed) + '</div>';
  }
  if (n.contexts && n.contexts.length) {
    h += '<div class="g2v-gsec g2v-gcontexts">top-activating contexts:' + contextHtml(n.contexts) + '</div>';
  }
  return h;
}
function edgeHtml(k) {
  var e = E[k];
  return '<b>' + esc(short(e[0])) + ' \u2192 ' + esc(short(e[1])) + '</b><br>direct effect ' + fmt(e[2]);
}
function showTip(ev, html) {
  tip.innerHTML = html;
  tip.style.display = 'block';
  moveTip(ev);
}
function moveTip(ev) {
  var w = tip.offsetWidth, h = tip.offsetHeight, x = ev.clientX + 14, y = ev.clientY + 14;
  if (x + w > window.innerWidth - 4) x = Math.max(4, ev.clientX - w - 14);
  if (y + h > window.innerHeight - 4) y = Math.max(4, ev.clientY - h - 14);
  tip.style.left = x + 'px';
  tip.style.top = y + 'px';
}
function hideTip() { tip.style.display = 'none'; }
function hover(x, html) {
  x.addEventListener('mouseenter', function (ev) { showTip(ev, html()); });
  x.addEventListener('mousemove', moveTip);
  x.addEventListener('mouseleave', hideTip);
}

svg.setAttribute('width', D.width);
svg.setAttribute('height', D.height);
svg.setAttribute('viewBox', '0 0 ' + D.width + ' ' + D.height);
var bg = el('rect', {x: 0, y: 0, width: D.width, height: D.height, class: 'g2v-gbg'}, svg);
D.rows.forEach(function (r) {
  el('line', {x1: 52, x2: D.width, y1: r.y, y2: r.y, class: 'g2v-grow'}, svg);
  el('text', {x: 6, y: r.y + 4, class: 'g2v-growname'}, svg).textContent = r.name;
});
var gE = el('g', {class: 'g2v-gedges'}, svg), gN = el('g', {class: 'g2v-gnodes'}, svg);
var edgeEls = E.map(function (e, k) {
  var a = N[e[0]], b = N[e[1]], f = Math.abs(e[2]) / maxW, my = (a.y + b.y) / 2;
  var p = el('path', {
    d: 'M' + a.x + ',' + a.y + ' C' + a.x + ',' + my + ' ' + b.x + ',' + my + ' ' + b.x + ',' + b.y,
    class: 'g2v-gedge', stroke: e[2] >= 0 ? D.colours[0] : D.colours[1], 'stroke-width': (0.6 + 4.4 * f).toFixed(2),
    'stroke-opacity': (0.2 + 0.75 * f).toFixed(3), 'data-s': a.id, 'data-t': b.id, 'data-w': e[2]
  }, gE);
  hover(p, function () { return edgeHtml(k); });
  return p;
});
var nodeEls = N.map(function (n, i) {
  var g = el('g', {class: 'g2v-gnode g2v-gn-' + n.kind, 'data-node': n.id, 'data-kind': n.kind,
                   transform: 'translate(' + n.x + ',' + n.y + ')'}, gN);
  if (n.kind === 'feature') {
    el('circle', {r: 7}, g);
  } else if (n.kind === 'error') {
    el('rect', {x: -5, y: -5, width: 10, height: 10}, g);
  } else {
    var box = el('rect', {x: -8, y: -8, width: 16, height: 16}, g);
    if (n.kind === 'logit') {
      box.setAttribute('style', 'fill:rgba(26,127,55,' + Math.min(1, 0.15 + n.prob).toFixed(3) + ')');
      el('text', {x: 4, y: -14, transform: 'rotate(-40 4 -14)', class: 'g2v-glabel'}, g).textContent =
        tok(n.label) + ' ' + (100 * n.prob).toFixed(1) + '%';
    } else {
      var col = D.columns[n.pos], chars = Math.max(3, Math.floor(col.w / 6.2)), t = tok(n.label);
      el('text', {x: 0, y: 24, 'text-anchor': 'middle', class: 'g2v-glabel'}, g).textContent =
        t.length > chars ? t.slice(0, chars - 1) + '\u2026' : t;
    }
  }
  hover(g, function () { return nodeHtml(i); });
  g.addEventListener('click', function (ev) { ev.stopPropagation(); pin(pinned === i ? null : i); });
  return g;
});

function highlighted(i) {
  // the edges (and their nodes) on paths through node i: every edge into an ancestor of i (or into i) and out
  // of a descendant of i (or out of i) with mode 'paths'; i's own incoming and outgoing edges with 'direct'
  var edges = new Set(), nodes = new Set([i]);
  [[ins, 0], [outs, 1]].forEach(function (way) {
    var lists = way[0], end = way[1], stack = [i];
    while (stack.length) {
      var j = stack.pop();
      lists[j].forEach(function (k) {
        edges.add(k);
        var other = E[k][end];
        if (!nodes.has(other)) {
          nodes.add(other);
          if (mode.value === 'paths') stack.push(other);
        }
      });
      if (mode.value !== 'paths') break;
    }
  });
  return {edges: edges, nodes: nodes};
}
function strongest(list, end) {
  var ks = list.slice().sort(function (a, b) { return Math.abs(E[b][2]) - Math.abs(E[a][2]); }).slice(0, 8);
  return ks.map(function (k) { return esc(short(E[k][end])) + ' ' + fmt(E[k][2]); }).join(', ') || 'none';
}
function pin(i) {
  pinned = i;
  nodeEls.forEach(function (g) { g.classList.remove('g2v-pinned', 'g2v-hl'); });
  edgeEls.forEach(function (p) { p.classList.remove('g2v-hl'); });
  root.classList.toggle('g2v-pinmode', i !== null);
  if (i === null) {
    info.textContent = 'click a node to pin it';
    return;
  }
  var hl = highlighted(i);
  hl.edges.forEach(function (k) { edgeEls[k].classList.add('g2v-hl'); });
  hl.nodes.forEach(function (j) { nodeEls[j].classList.add('g2v-hl'); });
  nodeEls[i].classList.add('g2v-pinned');
  info.innerHTML = 'pinned: ' + nodeHtml(i) + '<div class="g2v-gsec">strongest inputs: ' + strongest(ins[i], 0) +
    '<br>strongest outputs: ' + strongest(outs[i], 1) + '</div>';
}
bg.addEventListener('click', function () { pin(null); });
mode.value = D.highlight;
mode.onchange = function () { if (pinned !== null) pin(pinned); };
slider.oninput = function () {
  var t = Number(slider.value) * maxW;
  thr.textContent = Math.round(100 * Number(slider.value)) + '%';
  edgeEls.forEach(function (p, k) { p.classList.toggle('g2v-ghide', Math.abs(E[k][2]) < t); });
};
root.g2v = {data: D, pin: pin, pinned: function () { return pinned; }, highlighted: highlighted};
