// The status page: reads /status.json every 2 s and draws it. Text goes in through textContent
// only (nothing from the server is parsed as HTML); the page loads nothing from the network but
// this server's own /status.json.
'use strict';

const SVG = 'http://www.w3.org/2000/svg';
const $ = (id) => document.getElementById(id);

function text(id, s) { $(id).textContent = s; }
function el(tag, cls, content) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (content !== undefined) e.textContent = content;
  return e;
}
function svgEl(tag, attrs) {
  const e = document.createElementNS(SVG, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  return e;
}
function bytes(n) {
  if (n >= 1e9) return (n / 1e9).toFixed(2) + ' GB';
  if (n >= 1e6) return (n / 1e6).toFixed(2) + ' MB';
  if (n >= 1e3) return (n / 1e3).toFixed(1) + ' KB';
  return n + ' B';
}
function ago(s) {
  if (s < 1) return 'now';
  if (s < 120) return Math.round(s) + ' s ago';
  if (s < 7200) return Math.round(s / 60) + ' min ago';
  return Math.round(s / 3600) + ' h ago';
}
function stateOf(p) {
  if (p.revoked) return 'revoked';
  if (p.registered === false || !p.online) return 'offline';
  return p.in_round ? 'in_round' : 'online';
}
const STATE_TEXT = { revoked: 'revoked', offline: 'offline', in_round: 'in the round', online: 'online' };

// A line chart of `series` ([{cls, points: [[x, y]]}]) on one x axis, each series scaled to its
// own y range (accuracy 0..1 on the left, loss on the right).
function lineChart(svg, series, xLabel) {
  svg.replaceChildren();
  const W = 480, H = 220, L = 40, R = 40, T = 10, B = 30;
  const all = series.flatMap((s) => s.points);
  if (all.length === 0) {
    svg.appendChild(svgEl('text', { x: W / 2 - 70, y: H / 2, class: 'none' })).textContent =
      'no round recorded yet';
    return;
  }
  let x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]));
  if (x1 === x0) x1 = x0 + 1;
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  svg.appendChild(svgEl('line', { x1: L, y1: H - B, x2: W - R, y2: H - B, class: 'axis' }));
  for (let i = 0; i <= 4; ++i) {
    const y = T + (i * (H - T - B)) / 4;
    svg.appendChild(svgEl('line', { x1: L, y1: y, x2: W - R, y2: y, class: 'grid' }));
  }
  for (const x of [x0, (x0 + x1) / 2, x1]) {
    const t = svgEl('text', { x: sx(x) - 10, y: H - B + 14 });
    t.textContent = Number.isInteger(x) ? String(x) : String(Number(x.toPrecision(3)));
    svg.appendChild(t);
  }
  const xl = svgEl('text', { x: W / 2 - 20, y: H - 2 });
  xl.textContent = xLabel;
  svg.appendChild(xl);
  series.forEach((s, i) => {
    if (s.points.length === 0) return;
    let y0 = s.min !== undefined ? s.min : Math.min(...s.points.map((p) => p[1]));
    let y1 = s.max !== undefined ? s.max : Math.max(...s.points.map((p) => p[1]));
    if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
    const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
    const d = s.points.map((p, j) => (j ? 'L' : 'M') + sx(p[0]).toFixed(1) + ' ' + sy(p[1]).toFixed(1));
    svg.appendChild(svgEl('path', { d: d.join(' '), class: s.cls, 'data-points': s.points.length }));
    const left = i === 0;
    for (const v of [y0, y1]) {
      const t = svgEl('text', { x: left ? 2 : W - R + 4, y: sy(v) + (v === y1 ? 8 : 0), class: s.cls + '-label' });
      t.textContent = s.fmt(v);
      svg.appendChild(t);
    }
    const name = svgEl('text', { x: left ? L + 4 : W - R - 60, y: T + 10 });
    name.textContent = s.name;
    svg.appendChild(name);
  });
}

function barChart(svg, rounds) {
  svg.replaceChildren();
  const W = 480, H = 220, L = 40, R = 10, T = 10, B = 30;
  const last = rounds.slice(-60);
  if (last.length === 0) {
    svg.appendChild(svgEl('text', { x: W / 2 - 70, y: H / 2, class: 'none' })).textContent =
      'no round recorded yet';
    return;
  }
  const max = Math.max(1, ...last.map((r) => r.up + r.down));
  const w = (W - L - R) / last.length;
  const sy = (v) => ((H - T - B) * v) / max;
  last.forEach((r, i) => {
    const x = L + i * w;
    const hu = sy(r.up), hd = sy(r.down);
    svg.appendChild(svgEl('rect', { x: x + 1, y: H - B - hu, width: Math.max(1, w - 2), height: hu, class: 'up' }));
    svg.appendChild(svgEl('rect', { x: x + 1, y: H - B - hu - hd, width: Math.max(1, w - 2), height: hd, class: 'down' }));
  });
  svg.appendChild(svgEl('line', { x1: L, y1: H - B, x2: W - R, y2: H - B, class: 'axis' }));
  const top = svgEl('text', { x: 2, y: T + 8 });
  top.textContent = (max / 1e3).toFixed(0);
  svg.appendChild(top);
  for (const [i, r] of [[0, last[0]], [last.length - 1, last[last.length - 1]]]) {
    const t = svgEl('text', { x: L + i * w, y: H - B + 14 });
    t.textContent = String(r.round);
    svg.appendChild(t);
  }
}

function duration(s) {
  if (s < 90) return Math.round(s) + ' s';
  if (s < 5400) return Math.round(s / 60) + ' min';
  return (s / 3600).toFixed(1) + ' h';
}

function drawTree(s) {
  const root = el('li');
  if (s.role === 'simulation') {
    root.appendChild(el('strong', '', 'starling-sim'));
    root.appendChild(el('span', 'dim', ': ' + s.clients.registered + ' simulated clients, ' +
      s.clients.in_round + ' a round'));
    $('tree').replaceChildren(root);
    return;
  }
  root.appendChild(el('strong', '', s.role === 'root' ? 'root (this server)' : 'edge aggregator (this server)'));
  const kids = el('ul');
  const aggregators = s.peers.filter((p) => p.role === 'aggregator');
  const clients = s.peers.filter((p) => p.role !== 'aggregator');
  const chips = (li, list) => {
    for (const c of list) {
      const chip = el('span', 'chip ' + stateOf(c), c.id);
      chip.title = 'client ' + c.id + ': ' + STATE_TEXT[stateOf(c)] + ', seen ' + ago(c.seen_seconds_ago);
      chip.dataset.id = c.id;
      li.appendChild(chip);
    }
  };
  for (const a of aggregators) {
    const li = el('li');
    li.dataset.id = a.id;
    li.appendChild(el('span', 'chip ' + stateOf(a), 'aggregator ' + a.id));
    const sub = a.subtree || [];
    const online = sub.filter((c) => c.online).length;
    li.appendChild(el('span', 'dim', ' ' + STATE_TEXT[stateOf(a)] + ', ' + a.updates +
      ' partial aggregates; ' + online + ' of ' + sub.length + ' clients online' +
      (sub.length ? ' (as told ' + ago(a.subtree_seconds_ago) +
        (a.subtree_stale ? ': stale, shown offline' : '') + ')' : '')));
    if (sub.length) {
      const ul = el('ul');
      const inner = el('li');
      inner.className = 'subtree';
      chips(inner, sub);
      ul.appendChild(inner);
      li.appendChild(ul);
    }
    kids.appendChild(li);
  }
  if (clients.length) {
    const li = el('li');
    li.appendChild(el('span', 'dim', clients.length + (clients.length === 1 ? ' client: ' : ' clients: ')));
    chips(li, clients);
    kids.appendChild(li);
  }
  root.appendChild(kids);
  $('tree').replaceChildren(root);
}

function draw(s) {
  document.title = 'Starling ' + s.role + ': round ' + s.round.number;
  const ROLE = { root: 'root', aggregator: 'edge aggregator', simulation: 'simulation' };
  text('role', ROLE[s.role] || s.role);
  text('clients-label', s.role === 'simulation' ? 'Simulated clients' : 'Peers online');
  text('model', s.model + ' \u00b7 fingerprint ' + s.fingerprint);
  const r = s.round;
  text('round', r.planned ? r.number + ' / ' + r.planned : String(r.number || '\u2013'));
  let progress = 'waiting for clients';
  let frac = 0;
  if (r.step === 'fit' || r.step === 'evaluate' || r.step === 'secure') {
    const what = r.step === 'fit' ? 'training' : r.step === 'evaluate' ? 'evaluating' : 'secure aggregation';
    progress = what + ': ' + r.accepted + ' of ' + r.sent + ' answered (' + r.target + ' wanted), ' +
      Math.round(r.seconds_left) + ' s left';
    frac = r.target ? Math.min(1, r.accepted / r.target) : 0;
  } else if (r.step === 'async') {
    progress = 'asynchronous: ' + r.open + ' tasks open';
    frac = 1;
  }
  if (s.role === 'simulation') {
    const done = s.rounds.length ? s.rounds[s.rounds.length - 1].round : 0;
    progress = r.eta_seconds !== null ? 'ETA ' + duration(r.eta_seconds) : 'first round running';
    frac = r.planned ? Math.min(1, done / r.planned) : 0;
  }
  text('progress', progress);
  $('progress-bar').style.width = (100 * frac).toFixed(0) + '%';
  const behind = s.peers.flatMap((p) => p.subtree || []);
  text('clients-online', String(s.role === 'simulation' ? s.clients.registered : s.clients.online));
  text('clients-detail', s.role === 'simulation' ? s.clients.in_round + ' a round' :
    s.clients.registered + ' registered, ' + s.clients.in_round + ' in the round' +
    (behind.length ? '; behind aggregators ' + behind.filter((c) => c.online).length + ' of ' +
      behind.length + ' online' : ''));
  const evaluated = s.rounds.filter((x) => x.accuracy !== null);
  const lastEval = evaluated[evaluated.length - 1];
  text('accuracy', lastEval ? (100 * lastEval.accuracy).toFixed(1) + '%' : '\u2013');
  text('accuracy-detail', lastEval ? 'measured at round ' + lastEval.round +
    (lastEval.loss !== null ? ', loss ' + lastEval.loss.toFixed(4) : '') : 'no evaluation yet');
  text('bytes', bytes(s.bytes.rounds));
  text('bytes-detail', 'updates and tasks; socket: ' + bytes(s.bytes.in) + ' in, ' + bytes(s.bytes.out) + ' out');
  const codes = Object.entries(s.refusals).sort((a, b) => b[1] - a[1]);
  const refusedTotal = codes.reduce((n, c) => n + c[1], 0);
  text('refused', String(refusedTotal));
  text('refused-detail', codes.length ? codes.length + ' codes' : 'none');
  const none = el('tr');
  none.appendChild(el('td', 'dim', 'none'));
  none.appendChild(el('td', 'n', ''));
  $('refusals').tBodies[0].replaceChildren(...(codes.length ? codes.map(([code, n]) => {
    const tr = el('tr');
    tr.dataset.code = code;
    tr.appendChild(el('td', '', code));
    tr.appendChild(el('td', 'n', String(n)));
    return tr;
  }) : [none]));

  const acc = evaluated.map((x) => [x.round, x.accuracy]);
  const lossOf = (x) => (x.loss !== null ? x.loss : x.train_loss);
  const withLoss = s.rounds.filter((x) => lossOf(x) !== null);
  const pct = (v) => (100 * v).toFixed(0) + '%';
  const num = (v) => v.toFixed(3);
  lineChart($('chart-round'), [
    { cls: 'accuracy', name: 'accuracy', points: acc, fmt: pct, min: 0, max: 1 },
    { cls: 'loss', name: 'loss', points: withLoss.map((x) => [x.round, lossOf(x)]), fmt: num },
  ], 'round');
  lineChart($('chart-bytes'), [
    { cls: 'accuracy', name: 'accuracy', points: evaluated.map((x) => [x.total_bytes / 1e6, x.accuracy]), fmt: pct, min: 0, max: 1 },
    { cls: 'loss', name: 'loss', points: withLoss.map((x) => [x.total_bytes / 1e6, lossOf(x)]), fmt: num },
  ], 'MB');
  barChart($('chart-traffic'), s.rounds);

  drawTree(s);
  const rows = s.peers.flatMap((p) => [p, ...(p.subtree || []).map((c) =>
    Object.assign({ role: 'client', via: p.id }, c))]);
  $('peers').tBodies[0].replaceChildren(...rows.map((p) => {
    const st = stateOf(p);
    const tr = el('tr', st === 'offline' || st === 'revoked' ? st : '');
    tr.dataset.id = p.id;
    if (p.via) tr.dataset.via = p.via;
    tr.appendChild(el('td', '', p.id));
    tr.appendChild(el('td', '', p.via ? 'client of aggregator ' + p.via : p.role));
    tr.appendChild(el('td', 'state-' + st, STATE_TEXT[st]));
    tr.appendChild(el('td', 'n', ago(p.seen_seconds_ago)));
    tr.appendChild(el('td', 'n', String(p.updates)));
    tr.appendChild(el('td', 'n', String(p.refused)));
    tr.appendChild(el('td', '', p.last_refusal || ''));
    return tr;
  }));
  text('link', 'updated ' + new Date(s.time * 1000).toLocaleTimeString());
  // For tests and the page-load benchmark: drawn once, and how long after navigation began.
  // (offsetHeight: the layout of what was drawn is done first, and counted.)
  if (!document.body.dataset.loaded && document.body.offsetHeight >= 0)
    document.body.dataset.firstDrawMs = performance.now().toFixed(0);
  document.body.dataset.loaded = 'yes';
}

async function refresh() {
  try {
    const res = await fetch('/status.json', { cache: 'no-store' });
    if (!res.ok) throw new Error('HTTP ' + res.status);
    draw(await res.json());
  } catch (e) {
    text('link', 'cannot reach the server (' + e.message + '); trying again');
  }
}

refresh();
setInterval(refresh, 2000);
