/* subagentd console — plain ES2020, no build step. All API text goes in via
 * text nodes / textContent; elements are built with document.createElement. */
(function () {
  'use strict';

  // ---------------------------------------------------------------- constants
  const SESSION_URL = '/console/session';
  const STATUSES = ['scheduled', 'queued', 'running', 'requires_action', 'completed', 'incomplete', 'failed', 'cancelled'];
  const TERMINAL = new Set(['completed', 'incomplete', 'failed', 'cancelled']);
  const CANCELLABLE = new Set(['scheduled', 'queued', 'running', 'requires_action']);
  const EVENT_KINDS = ['created', 'queued', 'claimed', 'llm_call_started', 'llm_call_finished', 'llm_call_failed',
    'model_fallback', 'model_fallback_skipped', 'tool_calls_started', 'tool_call_finished',
    'tool_call_refused', 'tool_call_cut', 'tool_calls_waiting', 'text_tool_calls', 'loop_warning',
    'answer_cut', 'output_invalid', 'checkpoint', 'budget_wait', 'requires_action', 'action_answered',
    'actions_answered', 'cancel_requested', 'cancelled', 'released', 'rescued', 'workspace_ready', 'environment_ready', 'finished'];
  const OUTCOME_COLORS = { completed: '#16a34a', incomplete: '#d97706', failed: '#dc2626', cancelled: '#64748b' };
  const PALETTE = ['#2563eb', '#16a34a', '#d97706', '#dc2626', '#7c3aed', '#0891b2', '#db2777', '#65a30d',
    '#ea580c', '#4f46e5', '#0d9488', '#a16207'];
  const REFRESH_MS = 2000;
  const EVENTS_PAGE = 1000;
  const TEXT_LIMIT = 4000;

  // ------------------------------------------------------------------- state
  const state = {
    session: null,   // {mode, tenant, admin, csrf}
    gen: 0,          // bumped on every route change; stale async work checks it
    cleanups: [],    // run when leaving a page (timers, EventSource, charts)
    errorSource: null,
  };

  const $ = (sel) => document.querySelector(sel);

  // ------------------------------------------------------------------ DOM helper
  /** h('div', {class: 'x', dataset: {a: 1}, onClick: fn}, 'text', child, [more]) */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    if (attrs) {
      for (const [k, v] of Object.entries(attrs)) {
        if (v === undefined || v === null || v === false) continue;
        if (k === 'class' || k === 'className') el.className = v;
        else if (k === 'dataset') Object.assign(el.dataset, v);
        else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2).toLowerCase(), v);
        else if (k === 'value' || k === 'checked' || k === 'disabled' || k === 'hidden' || k === 'selected' || k === 'open') el[k] = v;
        else if (k === 'style') throw new Error('use el.style properties, not style attributes');
        else el.setAttribute(k, v === true ? '' : String(v));
      }
    }
    append(el, children);
    return el;
  }

  function append(el, children) {
    for (const c of children) {
      if (c === undefined || c === null || c === false) continue;
      if (Array.isArray(c)) append(el, c);
      else if (c instanceof Node) el.appendChild(c);
      else el.appendChild(document.createTextNode(String(c)));
    }
    return el;
  }

  function setText(el, text) { el.textContent = text == null ? '' : String(text); }

  // ---------------------------------------------------------------- formatting
  const dash = '—';
  const nf = new Intl.NumberFormat('en-US');

  function fmtInt(n) { return typeof n === 'number' && isFinite(n) ? nf.format(n) : dash; }

  function fmtCost(v) {
    if (typeof v !== 'number' || !isFinite(v)) return dash;
    if (v === 0) return '$0';
    const a = Math.abs(v);
    if (a < 0.0001) return '<$0.0001';
    if (a < 1) return '$' + v.toFixed(4);
    return '$' + v.toFixed(2);
  }

  function fmtPct(ratio) {
    return typeof ratio === 'number' && isFinite(ratio) ? (ratio * 100).toFixed(1) + '%' : dash;
  }

  function parseDate(iso) {
    if (!iso) return null;
    const d = new Date(iso);
    return isNaN(d.getTime()) ? null : d;
  }

  function fmtRel(iso) {
    const d = parseDate(iso);
    if (!d) return dash;
    const s = Math.round((Date.now() - d.getTime()) / 1000);
    const a = Math.abs(s);
    let txt;
    if (a < 60) txt = a + ' s';
    else if (a < 3600) txt = Math.floor(a / 60) + ' min';
    else if (a < 86400) txt = Math.floor(a / 3600) + ' h';
    else txt = Math.floor(a / 86400) + ' d';
    return s >= 0 ? txt + ' ago' : 'in ' + txt;
  }

  const pad = (n, w = 2) => String(n).padStart(w, '0');

  function fmtDateTime(iso) {
    const d = parseDate(iso);
    if (!d) return iso ? String(iso) : dash;
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  }

  function fmtClock(iso) {
    const d = parseDate(iso);
    if (!d) return iso ? String(iso) : dash;
    return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
  }

  function truncate(s, n) {
    s = s == null ? '' : String(s);
    return s.length > n ? s.slice(0, n) + '…' : s;
  }

  // A task id (UUIDv7) by the part that differs: its first digits are its creation time, the same
  // for every task of a busy minute, so the last eight (random) ones are shown.
  function shortId(id) { return id ? '…' + String(id).slice(-8) : dash; }

  // A short id with the whole one on hover, and a button that copies the whole one.
  function idWithCopy(id, link) {
    const label = link
      ? h('a', { href: '#/tasks/' + encodeURIComponent(id), title: id, class: 'mono task-short-id' }, shortId(id))
      : h('span', { title: id, class: 'mono task-short-id' }, shortId(id));
    const btn = h('button', { type: 'button', class: 'copy-id', title: 'Copy the whole id', 'aria-label': 'Copy task id ' + id }, 'copy');
    btn.addEventListener('click', async (e) => {
      e.preventDefault();
      e.stopPropagation();
      let ok = false;
      try { if (navigator.clipboard) { await navigator.clipboard.writeText(id); ok = true; } } catch (err) { ok = false; }
      if (!ok) {
        const area = h('textarea', { class: 'copy-buffer' }, id);
        document.body.append(area);
        area.select();
        try { ok = document.execCommand('copy'); } catch (err) { ok = false; }
        area.remove();
      }
      btn.textContent = ok ? 'copied' : 'copy failed';
      btn.dataset.copied = ok ? id : '';
      setTimeout(() => { btn.textContent = 'copy'; }, 1500);
    });
    return h('span', { class: 'id-cell' }, label, btn);
  }

  function json(v) {
    try { return JSON.stringify(v); } catch (e) { return String(v); }
  }

  function cssToken(s) { return String(s == null ? 'unknown' : s).toLowerCase().replace(/[^a-z0-9_-]/g, '_'); }

  function timeEl(iso, rel) {
    return h('span', { title: iso || null, class: 'time' }, rel ? fmtRel(iso) : fmtDateTime(iso));
  }

  function statusSpan(status, id) {
    return h('span', { id: id || null, 'data-test': 'status', class: 'status status-' + cssToken(status) },
      status == null ? 'unknown' : String(status));
  }

  function todayUTC(offsetDays = 0) {
    const d = new Date(Date.now() + offsetDays * 86400000);
    return d.toISOString().slice(0, 10);
  }

  // ---------------------------------------------------------------- errors/api
  class ApiError extends Error {
    constructor(status, detail, problem) { super(detail); this.status = status; this.problem = problem; }
  }
  class AuthError extends Error {}

  async function problemDetail(res) {
    let text = '';
    try { text = await res.text(); } catch (e) { /* ignore */ }
    try {
      const p = JSON.parse(text);
      if (p && (p.detail || p.title)) return { detail: String(p.detail || p.title), problem: p };
    } catch (e) { /* not JSON */ }
    return { detail: `HTTP ${res.status}${res.statusText ? ' ' + res.statusText : ''}`, problem: null };
  }

  function csrfHeaders(method) {
    const hdrs = {};
    if (method !== 'GET' && method !== 'HEAD' && state.session && state.session.csrf) {
      hdrs['X-CSRF-Token'] = state.session.csrf;
    }
    return hdrs;
  }

  async function api(path, opts = {}) {
    const method = opts.method || 'GET';
    const headers = Object.assign({ accept: 'application/json' }, csrfHeaders(method));
    const init = { method, headers, credentials: 'same-origin' };
    if (opts.body !== undefined) {
      headers['content-type'] = 'application/json';
      init.body = JSON.stringify(opts.body);
    }
    let res;
    try {
      res = await fetch(path, init);
    } catch (e) {
      throw new ApiError(0, 'Network error: ' + (e && e.message ? e.message : 'request failed'), null);
    }
    if (res.status === 401) {
      showSignin();
      throw new AuthError('unauthorized');
    }
    if (!res.ok) {
      const { detail, problem } = await problemDetail(res);
      throw new ApiError(res.status, detail, problem);
    }
    if (res.status === 204) return null;
    return res.json();
  }

  function showError(msg, source) {
    const b = $('#error-banner');
    setText(b, msg);
    b.hidden = !msg;
    state.errorSource = msg ? (source || null) : null;
  }

  function clearError(source) {
    if (source && state.errorSource !== source) return;
    showError('');
  }

  /** Shows an API error in the banner; auth errors are already handled. */
  function handleError(e, source) {
    if (e instanceof AuthError) return;
    showError(e && e.message ? e.message : String(e), source);
  }

  // ------------------------------------------------------------ page lifecycle
  function onCleanup(fn) { state.cleanups.push(fn); }

  function teardown() {
    const fns = state.cleanups;
    state.cleanups = [];
    for (const fn of fns) {
      try { fn(); } catch (e) { /* ignore */ }
    }
  }

  /** Runs fn now and then every ms until the page changes (no overlapping runs). */
  function poll(fn, ms) {
    const gen = state.gen;
    let timer = null;
    let stopped = false;
    const tick = async () => {
      try { await fn(); } catch (e) { /* fn reports its own errors */ }
      if (!stopped && gen === state.gen && state.session) timer = setTimeout(tick, ms);
    };
    onCleanup(() => { stopped = true; clearTimeout(timer); });
    tick();
  }

  /** Wraps an async fn so concurrent calls collapse into at most one extra rerun. */
  function coalesce(fn) {
    let running = false;
    let again = false;
    return async function run() {
      if (running) { again = true; return; }
      running = true;
      try {
        do { again = false; await fn(); } while (again);
      } finally { running = false; }
    };
  }

  // ---------------------------------------------------------------- widgets
  function card(title, ...children) {
    return h('section', { class: 'card' }, title ? h('h2', null, title) : null, ...children);
  }

  /** cols: [label | [label, 'num']]; returns {el, table, tbody, setEmpty} */
  function makeTable(id, cols, emptyText) {
    const tbody = h('tbody');
    const table = h('table', { id, class: 'data' },
      h('thead', null, h('tr', null, cols.map((c) => Array.isArray(c)
        ? h('th', { class: c[1] }, c[0]) : h('th', null, c)))),
      tbody);
    const empty = h('p', { class: 'empty muted', hidden: true }, emptyText || 'Nothing to show.');
    const el = h('div', null, h('div', { class: 'table-wrap' }, table), empty);
    return { el, table, tbody, empty, setEmpty(isEmpty) { empty.hidden = !isEmpty; } };
  }

  function td(content, cls, title) {
    return h('td', { class: cls || null, title: title || null }, content);
  }

  function fillRows(t, rows) {
    t.tbody.replaceChildren(...rows);
    t.setEmpty(rows.length === 0);
  }

  function collapsible(text, limit, key, expandedSet, cls) {
    text = text == null ? '' : String(text);
    const body = h('div', { class: 'pre ' + (cls || '') });
    if (text.length <= limit) { setText(body, text); return body; }
    let expanded = !!(expandedSet && expandedSet.has(key));
    const btn = h('button', { type: 'button', class: 'link-btn show-all', title: text.length + ' characters' });
    const paint = () => {
      setText(body, expanded ? text : text.slice(0, limit) + '…');
      setText(btn, expanded ? 'show less' : 'show all');
    };
    btn.addEventListener('click', () => {
      expanded = !expanded;
      if (expandedSet) { if (expanded) expandedSet.add(key); else expandedSet.delete(key); }
      paint();
    });
    paint();
    return h('div', { class: 'collapsible' }, body, btn);
  }

  // ------------------------------------------------------------------ charts
  function chartsAvailable() { return typeof window.uPlot === 'function'; }

  function chartWidth(el) { return Math.max(Math.floor(el.clientWidth || el.getBoundingClientRect().width), 240); }

  /** Creates a uPlot in el that follows the container width; destroyed on page change. */
  function makeChart(el, series, data, opts = {}) {
    if (!chartsAvailable()) {
      el.replaceChildren(h('p', { class: 'muted' }, 'Chart library not loaded.'));
      return null;
    }
    const height = opts.height || 220;
    const config = {
      width: chartWidth(el),
      height,
      series: [{}].concat(series),
      scales: { x: { time: true } },
      axes: [{}, opts.yValues ? { size: 64, values: opts.yValues } : { size: 50 }],
      cursor: { drag: { x: false, y: false } },
    };
    if (opts.utc && typeof window.uPlot.tzDate === 'function') {
      config.tzDate = (ts) => window.uPlot.tzDate(new Date(ts * 1000), 'Etc/UTC');
    }
    el.replaceChildren();
    const u = new window.uPlot(config, data, el);
    let raf = 0;
    const onResize = () => {
      cancelAnimationFrame(raf);
      raf = requestAnimationFrame(() => u.setSize({ width: chartWidth(el), height }));
    };
    window.addEventListener('resize', onResize);
    onCleanup(() => {
      window.removeEventListener('resize', onResize);
      cancelAnimationFrame(raf);
      u.destroy();
    });
    return u;
  }

  function hexA(hex, alpha) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${(n >> 16) & 255},${(n >> 8) & 255},${n & 255},${alpha})`;
  }

  // ---------------------------------------------------------------- task rows
  function taskSummary(t) {
    if (t.summary) return String(t.summary);
    if (t.error && t.error.message) return String(t.error.message);
    return '';
  }

  function taskRow(t) {
    const summary = taskSummary(t);
    let cost = fmtCost(t.cost_usd);
    if (t.cost_complete === false) cost += '+';
    return h('tr', { dataset: { taskId: t.id } },
      td(idWithCopy(t.id, true), 'mono'),
      td(statusSpan(t.status)),
      td(t.subagent_type || dash),
      td(t.model || dash, 'mono'),
      td(fmtInt(t.turns), 'num'),
      td(cost, 'num', t.cost_complete === false ? 'cost incomplete' : null),
      td(timeEl(t.created_at, true)),
      td(summary ? truncate(summary, 120) : dash, 'summary', summary || null));
  }

  /** Updates a task tbody in place: unchanged rows are kept, changed rows replaced, order synced. */
  function syncTaskRows(t, tasks) {
    const existing = new Map();
    for (const tr of Array.from(t.tbody.children)) {
      if (tr.dataset.taskId) existing.set(tr.dataset.taskId, tr);
    }
    const wanted = [];
    for (const task of tasks) {
      const sig = json(task);
      let tr = existing.get(task.id);
      if (tr && tr._sig === sig) {
        const created = tr.querySelector('.time');
        if (created) setText(created, fmtRel(task.created_at));
      } else {
        const fresh = taskRow(task);
        fresh._sig = sig;
        if (tr) tr.replaceWith(fresh);
        tr = fresh;
      }
      existing.delete(task.id);
      wanted.push(tr);
    }
    for (const tr of existing.values()) tr.remove();
    wanted.forEach((tr, i) => {
      if (t.tbody.children[i] !== tr) t.tbody.insertBefore(tr, t.tbody.children[i] || null);
    });
    t.setEmpty(tasks.length === 0);
  }

  const POLL_EVENTS_MS = 3000;

  /** A task's workspace as one line: the repository and ref (and the commit read), or the upload. */
  function workspaceText(w) {
    if (!w) return null;
    if (w.git) return `${w.git}${w.ref ? ' @ ' + w.ref : ''}${w.commit ? ' (' + w.commit.slice(0, 12) + ')' : ''}`;
    return `upload ${w.name || ''}${w.content_hash ? ' (' + w.content_hash.slice(0, 19) + ')' : ''}`;
  }

  /** A task's environment as one line: the image or the named environment, and the digest it runs in. */
  function environmentText(e) {
    if (!e) return null;
    const what = e.name ? `${e.name} (named)` : (e.image || '');
    return `${what}${e.digest ? ' @ ' + e.digest : ' (not started)'}`;
  }

  const TASK_COLS = ['ID', 'Status', 'Type', 'Model', ['Turns', 'num'], ['Cost', 'num'], 'Created', 'Summary'];

  // ================================================================ Overview
  function renderOverview(root) {
    const gen = state.gen;
    const tiles = {};
    const tile = (key, test, label) => {
      const value = h('div', { class: 'value' }, dash);
      tiles[key] = value;
      return h('div', { class: 'tile tile-' + key, 'data-test': test }, value, h('div', { class: 'label' }, label));
    };
    const chartEl = h('div', { id: 'chart-finished', class: 'chart' });
    const models = makeTable('models-table', ['Model', ['Calls', 'num'], ['Failed', 'num'], ['Error rate', 'num'], ['Cost', 'num']], 'No model calls today.');
    const spend = h('div', { id: 'spend', class: 'spend' });
    const replicas = makeTable('replicas-table', ['Worker', ['Running', 'num'], 'Lease expires'], 'No active replicas.');
    const holds = makeTable('holds-table', ['Tenant', ['Streams', 'num'], ['Waits', 'num']], 'No open streams or waits.');
    const conns = h('p', { class: 'muted', 'data-test': 'connections' }, dash);
    const latest = makeTable('latest-tasks', TASK_COLS, 'No tasks yet.');

    root.append(h('section', { id: 'overview', class: 'page' },
      h('div', { class: 'tiles' },
        tile('scheduled', 'count-scheduled', 'Scheduled'),
        tile('queued', 'count-queued', 'Queued'),
        tile('running', 'count-running', 'Running'),
        tile('requires_action', 'count-requires-action', 'Requires action'),
        tile('waiting_for_budget', 'count-waiting-budget', 'Waiting for budget')),
      card('Finished per minute, last hour', chartEl),
      h('div', { class: 'grid-2' },
        card('Models today', models.el),
        card('Spend', spend)),
      h('div', { class: 'grid-2' },
        card('Replicas', replicas.el),
        card('Held open on this replica', holds.el, conns)),
      card('Latest tasks', latest.el, h('p', { class: 'more' }, h('a', { href: '#/tasks' }, 'All tasks →')))));

    let chart = null;
    const load = async () => {
      let d;
      try {
        d = await api('/overview');
      } catch (e) { if (gen === state.gen) handleError(e, 'overview'); return; }
      if (gen !== state.gen || !d) return;
      clearError('overview');
      const now = d.now || {};
      for (const k of Object.keys(tiles)) setText(tiles[k], fmtInt(now[k] || 0));

      const data = finishedSeries(d.finished_per_minute || []);
      if (!chart) {
        chart = makeChart(chartEl, ['completed', 'incomplete', 'failed', 'cancelled'].map((k) => ({
          label: k, stroke: OUTCOME_COLORS[k], fill: hexA(OUTCOME_COLORS[k], 0.08), width: 2, points: { show: false },
        })), data);
      } else chart.setData(data);

      fillRows(models, (d.models || []).map((m) => h('tr', null,
        td(m.model || dash, 'mono'), td(fmtInt(m.calls), 'num'), td(fmtInt(m.failed), 'num'),
        td(fmtPct(m.error_rate), 'num'), td(fmtCost(m.cost_usd), 'num'))));

      renderSpend(spend, d.spend || [], d.storage_quota_bytes);

      fillRows(replicas, (d.replicas || []).map((r) => h('tr', null,
        td(r.worker || dash, 'mono'), td(fmtInt(r.running), 'num'), td(timeEl(r.lease_expires_at, true)))));

      const held = d.this_replica || {};
      fillRows(holds, (held.holds || []).map((t) => h('tr', { dataset: { tenant: String(t.tenant) } },
        td(String(t.tenant), 'mono'),
        td(fmtInt(t.streams) + (t.max_streams != null ? ' / ' + fmtInt(t.max_streams) : ''), 'num'),
        td(fmtInt(t.waits) + (t.max_waits != null ? ' / ' + fmtInt(t.max_waits) : ''), 'num'))));
      setText(conns, held.connection_cap != null
        ? `${fmtInt(held.connections)} of ${fmtInt(held.connection_cap)} connections on the replica that answered.`
        : '');

      syncTaskRows(latest, d.latest || []);
    };
    poll(load, REFRESH_MS);
  }

  function finishedSeries(entries) {
    const byMinute = new Map();
    let end = Math.floor(Date.now() / 60000) * 60;
    for (const e of entries) {
      const d = parseDate(e.minute);
      if (!d) continue;
      const m = Math.floor(d.getTime() / 60000) * 60;
      byMinute.set(m, e);
      if (m > end) end = m;
    }
    const xs = [];
    const ys = { completed: [], incomplete: [], failed: [], cancelled: [] };
    for (let m = end - 59 * 60; m <= end; m += 60) {
      xs.push(m);
      const e = byMinute.get(m) || {};
      for (const k of Object.keys(ys)) ys[k].push(Number(e[k]) || 0);
    }
    return [xs, ys.completed, ys.incomplete, ys.failed, ys.cancelled];
  }

  function spendCell(cls, label, spent, limit) {
    const parts = [h('div', { class: 'spend-label' }, label)];
    if (limit == null) {
      parts.push(h('div', { class: 'spend-amount' }, fmtCost(spent), h('span', { class: 'muted' }, ' · no limit')));
    } else {
      const pct = limit > 0 ? (Number(spent) || 0) / limit * 100 : ((Number(spent) || 0) > 0 ? 100 : 0);
      const fill = h('div', { class: 'bar-fill' });
      fill.style.width = Math.max(0, Math.min(pct, 100)).toFixed(1) + '%';
      let barCls = 'bar';
      if (pct >= 80) barCls += ' near';
      if (pct >= 100) barCls += ' over';
      parts.push(h('div', { class: 'spend-amount' }, `${fmtCost(spent)} / ${fmtCost(limit)}`,
        h('span', { class: 'muted' }, ` · ${pct.toFixed(0)}%`)));
      parts.push(h('div', { class: barCls, title: pct.toFixed(1) + '%' }, fill));
    }
    return h('div', { class: 'spend-cell ' + cls }, parts);
  }

  // Bytes as the console shows a size: B, KiB, MiB, GiB.
  function fmtBytes(n) {
    n = Number(n) || 0;
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i === 0 ? String(n) : n.toFixed(n < 10 ? 1 : 0)) + ' ' + units[i];
  }

  function renderSpend(el, rows, quota) {
    if (!rows.length) { el.replaceChildren(h('p', { class: 'muted' }, 'No spend recorded.')); return; }
    el.replaceChildren(...rows.map((s) => {
      let tokens = fmtInt(s.tokens_today) + ' tokens today';
      if (s.tokens_per_day != null) tokens += ' / ' + fmtInt(s.tokens_per_day);
      if (s.reserved_usd) tokens += ' · reserved ' + fmtCost(s.reserved_usd);
      tokens += ' · kept diffs ' + fmtBytes(s.kept_bytes);
      if (quota != null) tokens += ' / ' + fmtBytes(quota);
      return h('div', { class: 'spend-row', dataset: { tenant: s.tenant == null ? '' : String(s.tenant) } },
        h('div', { class: 'spend-tenant mono' }, s.tenant == null ? dash : String(s.tenant)),
        spendCell('spend-today', 'Today', s.today_usd, s.usd_per_day),
        spendCell('spend-month', 'This month', s.month_usd, s.usd_per_month),
        h('div', { class: 'spend-extra muted' }, tokens));
    }));
  }

  // ================================================================ Tasks list
  const TASK_FILTERS = ['status', 'subagent_type', 'model', 'metadata', 'created_after', 'created_before'];

  function isoToLocalInput(iso) {
    const d = parseDate(iso);
    if (!d) return '';
    return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
  }

  function localInputToIso(v) {
    if (!v) return '';
    const d = new Date(v);
    return isNaN(d.getTime()) ? '' : d.toISOString().replace(/\.000Z$/, 'Z');
  }

  function setHash(hash) {
    const before = location.hash;
    location.hash = hash;
    if (location.hash === before) route(); // no hashchange will fire
  }

  function renderTasks(root, params) {
    const gen = state.gen;
    const cursor = params.get('cursor') || '';
    const cur = (k) => params.get(k) || '';

    const statusSel = h('select', { id: 'filter-status' },
      h('option', { value: '' }, 'any'),
      STATUSES.map((s) => h('option', { value: s }, s)));
    if (cur('status') && !STATUSES.includes(cur('status'))) statusSel.append(h('option', { value: cur('status') }, cur('status')));
    statusSel.value = cur('status');
    const typeIn = h('input', { id: 'filter-type', type: 'text', placeholder: 'any', value: cur('subagent_type') });
    const modelIn = h('input', { id: 'filter-model', type: 'text', placeholder: 'any', value: cur('model') });
    const metaIn = h('input', { id: 'filter-metadata', type: 'text', placeholder: '{"batch":"a"}', value: cur('metadata'), class: 'mono' });
    const afterIn = h('input', { id: 'filter-after', type: 'datetime-local', value: isoToLocalInput(cur('created_after')) });
    const beforeIn = h('input', { id: 'filter-before', type: 'datetime-local', value: isoToLocalInput(cur('created_before')) });
    const applyBtn = h('button', { id: 'filter-apply', type: 'submit', class: 'btn btn-primary' }, 'Apply');
    const field = (label, input) => h('label', { class: 'field' }, h('span', null, label), input);

    const form = h('form', { class: 'filters', id: 'tasks-filters' },
      field('Status', statusSel), field('Type', typeIn), field('Model', modelIn), field('Metadata', metaIn),
      field('Created after', afterIn), field('Created before', beforeIn), h('div', { class: 'field field-btn' }, applyBtn));
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      const meta = metaIn.value.trim();
      if (meta) {
        let parsed;
        try { parsed = JSON.parse(meta); } catch (e) { parsed = undefined; }
        if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) {
          showError('Metadata filter must be a JSON object, e.g. {"batch":"a"}', 'filters');
          return;
        }
      }
      clearError('filters');
      const q = new URLSearchParams();
      const put = (k, v) => { if (v) q.set(k, v); };
      put('status', statusSel.value);
      put('subagent_type', typeIn.value.trim());
      put('model', modelIn.value.trim());
      put('metadata', meta);
      put('created_after', localInputToIso(afterIn.value));
      put('created_before', localInputToIso(beforeIn.value));
      const qs = q.toString();
      setHash('#/tasks' + (qs ? '?' + qs : ''));
    });

    const tasks = makeTable('tasks-table', TASK_COLS, 'No tasks match.');
    const pageHash = (c) => {
      const q = new URLSearchParams();
      for (const k of TASK_FILTERS) if (params.get(k)) q.set(k, params.get(k));
      if (c) q.set('cursor', c);
      const qs = q.toString();
      return '#/tasks' + (qs ? '?' + qs : '');
    };
    let nextCursor = null;
    const firstBtn = h('button', { id: 'first-page', type: 'button', class: 'btn', hidden: !cursor }, 'Newest');
    const nextBtn = h('button', { id: 'next-page', type: 'button', class: 'btn', hidden: true }, 'Older →');
    firstBtn.addEventListener('click', () => setHash(pageHash('')));
    nextBtn.addEventListener('click', () => { if (nextCursor) setHash(pageHash(nextCursor)); });
    const live = h('span', { class: 'muted live-note' }, cursor ? 'Older page (not live)' : 'Live: refreshing every 2 s');

    root.append(h('section', { id: 'tasks-page', class: 'page' },
      card('Tasks', form, tasks.el, h('div', { class: 'pager' }, firstBtn, nextBtn, live))));

    const q = new URLSearchParams();
    for (const k of TASK_FILTERS) if (params.get(k)) q.set(k, params.get(k));
    q.set('limit', '50');
    if (cursor) q.set('cursor', cursor);
    const url = '/tasks?' + q.toString();

    const load = async () => {
      let d;
      try { d = await api(url); } catch (e) { if (gen === state.gen) handleError(e, 'tasks'); return; }
      if (gen !== state.gen || !d) return;
      clearError('tasks');
      syncTaskRows(tasks, d.tasks || []);
      nextCursor = d.next_cursor || null;
      nextBtn.hidden = !nextCursor;
    };
    if (cursor) load();
    else poll(load, REFRESH_MS);
  }

  // ================================================================ Task page
  function renderTask(root, id) {
    const gen = state.gen;
    const alive = () => gen === state.gen;
    const base = '/tasks/' + encodeURIComponent(id);

    const statusSlot = h('span', null, statusSpan('…', 'task-status'));
    const stopReason = h('span', { class: 'muted', id: 'task-stop-reason' });
    const cancelBtn = h('button', { id: 'cancel-button', type: 'button', class: 'btn btn-danger', hidden: true }, 'Cancel task');
    const fields = h('dl', { id: 'task-fields', class: 'fields' });
    const summary = h('div', { id: 'task-summary', class: 'pre' }, dash);
    const prompt = h('div', { id: 'task-prompt', class: 'pre' });
    const pendingList = h('div', { class: 'pending-list' });
    const pending = h('section', { id: 'pending-actions', class: 'card', hidden: true }, h('h2', null, 'Pending actions'), pendingList);
    const timeline = h('ol', { id: 'timeline', class: 'timeline' });
    const streamNote = h('span', { class: 'muted', id: 'stream-state' });
    const conversation = h('div', { id: 'conversation', class: 'conversation' });
    // The run's text as the model writes it (output_delta: live only, never stored).
    const liveText = h('div', { id: 'live-output', class: 'pre live-output' });
    const liveNote = h('span', { class: 'muted', id: 'live-note' });
    const live = h('section', { id: 'live-card', class: 'card', hidden: true },
      h('h2', null, 'Live output ', liveNote), liveText);
    const calls = makeTable('calls', [['Turn', 'num'], ['Attempt', 'num'], ['Try', 'num'], 'Model', 'Outcome', ['HTTP', 'num'],
      ['In', 'num'], ['Out', 'num'], ['Cached', 'num'], ['Cost', 'num'], ['Latency ms', 'num'], 'Est.', 'Error'], 'No LLM calls yet.');

    root.append(h('section', { id: 'task-page', class: 'page' },
      h('section', { class: 'card task-header' },
        h('div', { class: 'task-title' },
          h('h1', null, 'Task ', idWithCopy(id, false)),
          h('span', { class: 'mono muted task-id', id: 'task-id' }, id),
          statusSlot, stopReason),
        cancelBtn),
      pending,
      live,
      h('div', { class: 'grid-2' },
        card('Details', fields),
        h('div', null,
          card('Summary', summary),
          h('section', { class: 'card' },
            h('details', { open: true }, h('summary', null, h('h2', { class: 'inline' }, 'Prompt')), prompt)))),
      card('Timeline', streamNote, timeline),
      card('Conversation', conversation),
      card('LLM calls', calls.el)));

    let task = null;

    // -- header / fields
    function paintTask(t) {
      task = t;
      statusSlot.replaceChildren(statusSpan(t.status, 'task-status'));
      setText(stopReason, t.stop_reason ? 'stop: ' + t.stop_reason : '');
      cancelBtn.hidden = !CANCELLABLE.has(t.status);

      const u = t.usage || {};
      let cost = fmtCost(t.cost_usd);
      if (t.cost_complete === false) cost += ' (incomplete)';
      if (t.usage_estimated) cost += ' (estimated)';
      const rows = [
        ['Type', t.subagent_type], ['Description', t.description], ['Model', t.model, 'mono'],
        ...(t.answered_model && t.answered_model !== t.model ? [['Answered by', t.answered_model, 'mono']] : []),
        ...(t.fallback_models && t.fallback_models.length ? [['Fallback models', t.fallback_models.join(', '), 'mono']] : []),
        ['Tenant', t.tenant], ['Priority', t.priority],
        ...(t.run_at ? [['Runs at', timeEl(t.run_at)]] : []),
        ['Turns', `${t.turns == null ? dash : t.turns} / ${t.max_turns == null ? dash : t.max_turns}`],
        ['Tokens in / out / cached', `${fmtInt(u.input_tokens)} / ${fmtInt(u.output_tokens)} / ${fmtInt(u.cached_tokens)}`],
        ...(u.cache_write_tokens ? [['Cache writes', fmtInt(u.cache_write_tokens)]] : []),
        ['Cost', cost], ['Attempt', t.attempt],
        ['Created', timeEl(t.created_at)], ['Started', t.started_at ? timeEl(t.started_at) : null],
        ['Finished', t.finished_at ? timeEl(t.finished_at) : null],
        ['Queue ms', t.queue_ms == null ? null : fmtInt(t.queue_ms)], ['Run ms', t.run_ms == null ? null : fmtInt(t.run_ms)],
        ['Waiting for', t.waiting_for],
        ['Metadata', t.metadata && Object.keys(t.metadata).length ? json(t.metadata) : null, 'mono'],
        ['Tools', Array.isArray(t.tools) && t.tools.length ? t.tools.join(', ') : null],
        ...(t.workspace ? [['Workspace', workspaceText(t.workspace), 'mono']] : []),
        ...(t.environment ? [['Environment', environmentText(t.environment), 'mono']] : []),
        ['Parent task', t.parent_task_id ? h('a', { href: '#/tasks/' + encodeURIComponent(t.parent_task_id), class: 'mono' }, t.parent_task_id) : null],
        ['Trace ID', t.trace_id, 'mono'],
        ['Error', t.error ? `${t.error.code || 'error'}: ${t.error.message || ''}` : null, 'error-text'],
      ];
      fields.replaceChildren(...rows.flatMap(([k, v, cls]) => [
        h('dt', null, k),
        h('dd', { class: cls || null }, v === null || v === undefined || v === '' ? dash : (v instanceof Node ? v : String(v))),
      ]));

      if (t.summary) { setText(summary, t.summary); summary.classList.remove('error-text'); }
      else if (t.error && t.error.message) { setText(summary, t.error.message); summary.classList.add('error-text'); }
      else { setText(summary, dash); summary.classList.remove('error-text'); }
      setText(prompt, t.prompt == null ? '' : t.prompt);
      paintPending(t);
    }

    // Pending actions keep their element (and what was typed in it) while they stay pending.
    const pendingEls = new Map(); // action id -> element

    function paintPending(t) {
      const actions = Array.isArray(t.pending_actions) ? t.pending_actions : [];
      pending.hidden = actions.length === 0;
      const ids = new Set(actions.map((a) => String(a && a.id)));
      for (const id of [...pendingEls.keys()]) if (!ids.has(id)) pendingEls.delete(id);
      pendingList.replaceChildren(...actions.map((a) => {
        const aid = String(a.id);
        if (!pendingEls.has(aid)) pendingEls.set(aid, pendingAction(a));
        return pendingEls.get(aid);
      }));
    }

    async function sendAnswer(answer, controls, errorEl) {
      controls.forEach((x) => { x.disabled = true; });
      setText(errorEl, '');
      try {
        await api(base + '/actions', { method: 'POST', body: [answer] });
        clearError();
        await refreshTask();
      } catch (e) {
        setText(errorEl, (e && (e.detail || e.message)) || 'The answer was not taken.');
      } finally { controls.forEach((x) => { x.disabled = false; }); }
    }

    // One pending action: an approval (Approve / Deny with an optional message) or the output
    // of a caller tool (JSON, or else sent as text).
    function pendingAction(a) {
      const aid = String(a.id);
      const kind = a.kind === 'output' ? 'output' : 'approval';
      const errorEl = h('div', { class: 'error-text', dataset: { test: 'action-error' } });
      const head = h('div', null,
        h('span', { class: 'badge' }, kind === 'output' ? 'output needed' : 'approval needed'), ' ',
        h('strong', null, String(a.name || 'tool')), ' ',
        h('span', { class: 'mono muted' }, aid),
        a.expires_at ? h('span', { class: 'muted' }, ' · expires ', timeEl(a.expires_at)) : null);
      const args = a.arguments === undefined ? null : collapsible(json(a.arguments), TEXT_LIMIT, null, null, 'mono');
      let controls;
      let row;
      if (kind === 'output') {
        const text = h('textarea', { class: 'mono', rows: '3', placeholder: 'The tool\'s output (JSON or text)', 'aria-label': 'Output of ' + (a.name || 'tool'), dataset: { test: 'action-output' } });
        const submit = h('button', { type: 'button', class: 'btn btn-primary', dataset: { actionId: aid, decision: 'output' } }, 'Submit output');
        controls = [text, submit];
        submit.addEventListener('click', () => {
          let output = text.value;
          try { output = JSON.parse(text.value); } catch (_) { /* text, as typed */ }
          sendAnswer({ id: aid, output }, controls, errorEl);
        });
        row = h('div', { class: 'actions' }, submit);
        return h('div', { class: 'pending-action', dataset: { actionId: aid, kind } }, head, args, text, row, errorEl);
      }
      const message = h('input', { type: 'text', placeholder: 'Message to the model (optional)', 'aria-label': 'Message', dataset: { test: 'action-message' } });
      const buttons = ['approve', 'deny'].map((decision) => h('button', {
        type: 'button', class: 'btn ' + (decision === 'approve' ? 'btn-primary' : 'btn-danger'),
        dataset: { actionId: aid, decision },
      }, decision === 'approve' ? 'Approve' : 'Deny'));
      controls = [message, ...buttons];
      buttons.forEach((b) => b.addEventListener('click', () => {
        const answer = { id: aid, decision: b.dataset.decision };
        if (message.value.trim()) answer.message = message.value.trim();
        sendAnswer(answer, controls, errorEl);
      }));
      row = h('div', { class: 'actions' }, message, buttons);
      return h('div', { class: 'pending-action', dataset: { actionId: aid, kind } }, head, args, row, errorEl);
    }

    const refreshTask = coalesce(async () => {
      try {
        const t = await api(base);
        if (alive() && t) paintTask(t);
      } catch (e) { if (alive()) handleError(e); }
    });

    cancelBtn.addEventListener('click', async () => {
      cancelBtn.disabled = true;
      try {
        const t = await api(base + '/cancel', { method: 'POST' });
        if (alive()) { clearError(); if (t && t.id) paintTask(t); }
        await refreshTask();
      } catch (e) { handleError(e); }
      finally { cancelBtn.disabled = false; }
    });

    // -- timeline
    const seen = new Map(); // seq -> li
    let maxSeq = 0;

    function addEvent(ev) {
      const seq = Number(ev.seq);
      if (!isFinite(seq) || seen.has(seq)) return false;
      const data = ev.data === undefined ? null : ev.data;
      const full = data === null ? '' : json(data);
      const li = h('li', { dataset: { seq: String(seq), kind: String(ev.kind) }, class: 'ev ev-' + cssToken(ev.kind) },
        h('span', { class: 'ev-time mono', title: ev.created_at || null }, fmtClock(ev.created_at)),
        h('span', { class: 'ev-kind' }, String(ev.kind)),
        h('code', { class: 'ev-data', title: full.length > 300 ? truncate(full, 5000) : null }, truncate(full, 300)));
      let before = null;
      if (seq < maxSeq) {
        for (const [s, el] of seen) if (s > seq && (!before || s < Number(before.dataset.seq))) before = el;
      }
      timeline.insertBefore(li, before);
      seen.set(seq, li);
      if (seq > maxSeq) maxSeq = seq;
      return true;
    }

    async function fetchEvents(after) {
      let last = null;
      for (let i = 0; i < 200; i++) {
        const d = await api(`${base}/events?after=${after}&limit=${EVENTS_PAGE}`);
        if (!alive() || !d) return last;
        last = d;
        const evs = d.events || [];
        evs.forEach(addEvent);
        const next = typeof d.next_after === 'number' ? d.next_after : maxSeq;
        if (evs.length < EVENTS_PAGE || next <= after) break;
        after = next;
      }
      return last;
    }

    // Fetches missed events (e.g. kinds without a listener) after the given seq.
    let backfillFrom = Infinity;
    const runBackfill = coalesce(async () => {
      const from = Math.min(backfillFrom, maxSeq);
      backfillFrom = Infinity;
      try { await fetchEvents(from); } catch (e) { if (alive()) handleError(e); }
    });
    function backfill(from) {
      backfillFrom = Math.min(backfillFrom, from == null ? maxSeq : from);
      return runBackfill();
    }
    function firstGap() {
      let s = 0;
      while (seen.has(s + 1)) s++;
      return s;
    }

    // -- conversation
    const expanded = new Set();
    const loadMessages = coalesce(async () => {
      let d;
      try { d = await api(base + '/messages'); } catch (e) { if (alive()) handleError(e); return; }
      if (!alive() || !d) return;
      const msgs = d.messages || [];
      if (!msgs.length) { conversation.replaceChildren(h('p', { class: 'muted' }, 'No messages yet.')); return; }
      conversation.replaceChildren(...msgs.map(renderMessage));
    });

    function renderMessage(m) {
      const msg = m.message || {};
      const role = msg.role || 'unknown';
      const head = h('div', { class: 'msg-head' },
        h('span', { class: 'role' }, String(role)),
        m.turn != null ? h('span', { class: 'muted' }, 'turn ' + m.turn) : null,
        msg.name ? h('span', { class: 'mono' }, String(msg.name)) : null,
        msg.tool_call_id ? h('span', { class: 'mono muted' }, String(msg.tool_call_id)) : null,
        msg.is_error ? h('span', { class: 'badge badge-error' }, 'error') : null,
        h('span', { class: 'muted msg-time', title: m.created_at || null }, fmtClock(m.created_at)));
      const parts = [head];
      if (msg.content != null && msg.content !== '') {
        const text = typeof msg.content === 'string' ? msg.content : json(msg.content);
        parts.push(collapsible(text, TEXT_LIMIT, m.seq + ':c', expanded, 'msg-content'));
      }
      if (Array.isArray(msg.tool_calls)) {
        msg.tool_calls.forEach((tc, i) => {
          const args = typeof tc.arguments === 'string' ? tc.arguments : json(tc.arguments);
          parts.push(h('div', { class: 'tool-call' },
            h('div', null, h('span', { class: 'muted' }, 'tool call '), h('strong', { class: 'mono' }, String(tc.name || '?')),
              tc.id ? h('span', { class: 'mono muted' }, ' ' + tc.id) : null),
            collapsible(args, TEXT_LIMIT, m.seq + ':t' + i, expanded, 'mono')));
        });
      }
      return h('div', { class: 'message role-' + cssToken(role) + (msg.is_error ? ' is-error' : ''), dataset: { seq: String(m.seq) } }, parts);
    }

    // -- calls ledger
    const loadCalls = coalesce(async () => {
      let d;
      try { d = await api(base + '/calls'); } catch (e) { if (alive()) handleError(e); return; }
      if (!alive() || !d) return;
      fillRows(calls, (d.calls || []).map((c) => h('tr', { class: 'outcome-' + cssToken(c.outcome) },
        td(fmtInt(c.turn), 'num'), td(fmtInt(c.attempt), 'num'), td(fmtInt(c.try), 'num'),
        td(c.model || dash, 'mono', c.provider ? 'provider: ' + c.provider : null),
        td(h('span', { class: 'outcome outcome-' + cssToken(c.outcome) }, String(c.outcome == null ? dash : c.outcome))),
        td(c.http_status == null ? dash : String(c.http_status), 'num'),
        td(fmtInt(c.input_tokens), 'num'), td(fmtInt(c.output_tokens), 'num'), td(fmtInt(c.cached_tokens), 'num', c.cache_write_tokens ? `${fmtInt(c.cache_write_tokens)} written to the cache` : null),
        td(fmtCost(c.cost_usd), 'num'), td(fmtInt(c.latency_ms), 'num'),
        td(c.usage_estimated ? 'est.' : ''),
        td(c.error ? truncate(c.error, 120) : '', 'error-text wrap', c.error || null))));
    });

    // -- live stream
    let es = null;
    let retryTimer = null;
    onCleanup(() => { closeStream(); clearTimeout(retryTimer); });

    function closeStream() {
      if (es) { es.close(); es = null; }
    }

    function onEvent(kind) {
      if (kind === 'checkpoint' || kind === 'finished' || kind === 'cancelled') loadMessages();
      if (['llm_call_finished', 'llm_call_failed', 'checkpoint', 'finished', 'cancelled'].includes(kind)) loadCalls();
      refreshTask();
    }

    async function streamEnded() {
      closeStream();
      if (liveAt) setText(liveNote, 'as it was written; the run has ended');
      await refreshTask();
      await backfill(firstGap());
      if (!alive()) return;
      loadMessages();
      loadCalls();
      if (task && !TERMINAL.has(task.status)) {
        // A stream the server refused (the tenant holds its stream limit on this replica) is
        // followed by polling the JSON events, with the stream tried again now and then.
        if (await streamRefused()) {
          setText(streamNote, 'This tenant is at its stream limit on this replica: following by polling the events.');
          retryTimer = setTimeout(() => { if (alive()) pollInstead(0); }, POLL_EVENTS_MS);
          return;
        }
        setText(streamNote, 'Stream disconnected; reconnecting…');
        retryTimer = setTimeout(() => { if (alive()) openStream(); }, 3000);
      } else setText(streamNote, '');
    }

    // Was the stream refused with 429? (EventSource does not tell: ask once, and let go.)
    async function streamRefused() {
      const ctl = new AbortController();
      try {
        const r = await fetch(`${base}/events?after=${maxSeq}`, {
          headers: { accept: 'text/event-stream' }, credentials: 'same-origin', signal: ctl.signal,
        });
        return r.status === 429;
      } catch (e) {
        return false;
      } finally {
        ctl.abort();
      }
    }

    // Poll the events while the stream is refused; every tenth round, try the stream again.
    async function pollInstead(round) {
      if (!alive()) return;
      await refreshTask();
      await backfill(maxSeq);
      if (!alive()) return;
      if (task && TERMINAL.has(task.status)) { streamEnded(); return; }
      if (round > 0 && round % 10 === 0) { openStream(); return; }
      retryTimer = setTimeout(() => pollInstead(round + 1), POLL_EVENTS_MS);
    }

    // The text of the call streaming now: a new turn (or a retried call) starts it again.
    let liveAt = null;
    function onOutput(msg) {
      let d;
      try { d = JSON.parse(msg.data); } catch (e) { return; }
      if (!d || typeof d.text !== 'string') return;
      const at = `${d.turn}/${d.try}`;
      if (at !== liveAt) {
        liveAt = at;
        liveText.textContent = '';
        setText(liveNote, `turn ${d.turn}${d.try > 1 ? `, try ${d.try}` : ''}, as it is written`);
      }
      live.hidden = false;
      liveText.append(document.createTextNode(d.text));
      liveText.scrollTop = liveText.scrollHeight;
    }

    function openStream() {
      if (!alive() || es || typeof window.EventSource !== 'function') return;
      es = new EventSource(`${base}/events?after=${maxSeq}`);
      setText(streamNote, 'Live');
      es.addEventListener('output_delta', onOutput);
      const handler = (msg) => {
        let ev;
        try { ev = JSON.parse(msg.data); } catch (e) { return; }
        if (!ev || typeof ev !== 'object') return;
        if (ev.seq == null && msg.lastEventId) ev.seq = Number(msg.lastEventId);
        if (ev.kind == null) ev.kind = msg.type === 'message' ? 'message' : msg.type;
        const prevMax = maxSeq;
        if (!addEvent(ev)) return;
        if (Number(ev.seq) > prevMax + 1) backfill(prevMax); // an unknown kind slipped past the listeners
        if (ev.kind === 'finished' || ev.kind === 'cancelled') {
          streamEnded();
          return;
        }
        onEvent(ev.kind);
      };
      EVENT_KINDS.forEach((k) => es.addEventListener(k, handler));
      es.onmessage = handler;
      es.onerror = () => {
        if (es && es.readyState === EventSource.CLOSED) streamEnded();
      };
    }

    // -- initial load
    (async () => {
      try {
        const t = await api(base);
        if (!alive()) return;
        paintTask(t);
      } catch (e) {
        if (!alive()) return;
        handleError(e);
        if (e instanceof ApiError && e.status === 404) {
          statusSlot.replaceChildren(statusSpan('not found', 'task-status'));
        }
        return;
      }
      loadMessages();
      loadCalls();
      let evStatus = null;
      try {
        const d = await fetchEvents(0);
        evStatus = d && d.task_status;
      } catch (e) { if (alive()) handleError(e); }
      if (!alive()) return;
      if (evStatus && task && evStatus !== task.status) await refreshTask();
      const terminal = TERMINAL.has(evStatus || (task && task.status));
      if (!terminal) openStream();
    })();
  }

  // ================================================================ Usage
  const METRICS = {
    cost_usd: { label: 'cost (USD)', get: (r) => Number(r.cost_usd) || 0, fmt: (v) => fmtCost(v) },
    tokens: { label: 'total tokens (input+output)', get: (r) => (Number(r.input_tokens) || 0) + (Number(r.output_tokens) || 0), fmt: fmtInt },
    calls: { label: 'calls', get: (r) => Number(r.calls) || 0, fmt: fmtInt },
  };

  function renderUsage(root, params) {
    const gen = state.gen;
    const admin = !!(state.session && state.session.admin);
    const groups = ['model', 'agent_type'].concat(admin ? ['tenant'] : [], ['api_key']);
    const from = /^\d{4}-\d{2}-\d{2}$/.test(params.get('from') || '') ? params.get('from') : todayUTC(-29);
    const to = /^\d{4}-\d{2}-\d{2}$/.test(params.get('to') || '') ? params.get('to') : todayUTC(0);
    const group = groups.includes(params.get('group')) ? params.get('group') : 'model';
    const metric = METRICS[params.get('metric')] ? params.get('metric') : 'cost_usd';

    const fromIn = h('input', { id: 'usage-from', type: 'date', value: from });
    const toIn = h('input', { id: 'usage-to', type: 'date', value: to });
    const groupSel = h('select', { id: 'usage-group' }, groups.map((g) => h('option', { value: g }, g)));
    groupSel.value = group;
    const metricSel = h('select', { id: 'usage-metric' },
      Object.entries(METRICS).map(([k, m]) => h('option', { value: k }, m.label)));
    metricSel.value = metric;
    const field = (label, input) => h('label', { class: 'field' }, h('span', null, label), input);
    const form = h('form', { class: 'filters' },
      field('From', fromIn), field('To', toIn), field('Group by', groupSel), field('Metric', metricSel),
      h('div', { class: 'field field-btn' }, h('button', { id: 'usage-apply', type: 'submit', class: 'btn btn-primary' }, 'Apply')));
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams({ from: fromIn.value || from, to: toIn.value || to, group: groupSel.value, metric: metricSel.value });
      setHash('#/usage?' + q.toString());
    });

    const apiQs = `from=${encodeURIComponent(from)}&to=${encodeURIComponent(to)}&group_by=day,${encodeURIComponent(group)}`;
    const csv = h('a', { id: 'usage-csv', class: 'btn', href: '/usage?' + apiQs + '&format=csv', download: 'usage.csv' }, 'Download CSV');
    const chartEl = h('div', { id: 'usage-chart', class: 'chart' });
    const table = makeTable('usage-table', ['Day', group, ['Calls', 'num'], ['OK', 'num'], ['Failed', 'num'], ['Input', 'num'],
      ['Output', 'num'], ['Cached', 'num'], ['Cost', 'num'], ['Est. calls', 'num']], 'No usage in this range.');

    root.append(h('section', { id: 'usage-page', class: 'page' },
      card('Usage', form, h('div', { class: 'toolbar' }, csv)),
      card(`${METRICS[metric].label} per day by ${group}`, chartEl),
      card('Rows', table.el)));

    (async () => {
      let d;
      try { d = await api('/usage?' + apiQs); } catch (e) { if (gen === state.gen) handleError(e); return; }
      if (gen !== state.gen || !d) return;
      const rows = d.rows || [];
      const m = METRICS[metric];
      const keyOf = (r) => (r[group] == null || r[group] === '' ? '(none)' : String(r[group]));

      // x axis: every day in [from, to] (UTC midnights), or only the days present if the range is huge
      const dayTs = (s) => { const t = Date.parse(s + 'T00:00:00Z'); return isNaN(t) ? null : t / 1000; };
      let xs = [];
      const a = dayTs(d.from || from);
      const b = dayTs(d.to || to);
      if (a != null && b != null && b >= a && (b - a) / 86400 <= 1000) {
        for (let t = a; t <= b; t += 86400) xs.push(t);
      } else {
        xs = Array.from(new Set(rows.map((r) => dayTs(r.day)).filter((t) => t != null))).sort((p, q) => p - q);
      }
      const idx = new Map(xs.map((t, i) => [t, i]));
      const totals = new Map();
      const seriesData = new Map();
      for (const r of rows) {
        const k = keyOf(r);
        const i = idx.get(dayTs(r.day));
        if (!seriesData.has(k)) { seriesData.set(k, xs.map(() => 0)); totals.set(k, 0); }
        const v = m.get(r);
        if (i !== undefined) seriesData.get(k)[i] += v;
        totals.set(k, totals.get(k) + v);
      }
      const keys = Array.from(seriesData.keys()).sort((p, q) => totals.get(q) - totals.get(p));
      if (!keys.length || !xs.length) {
        chartEl.replaceChildren(h('p', { class: 'muted' }, 'No usage in this range.'));
      } else {
        makeChart(chartEl, keys.map((k, i) => ({
          label: k, stroke: PALETTE[i % PALETTE.length], width: 2,
          value: (u, v) => (v == null ? dash : m.fmt(v)),
        })), [xs].concat(keys.map((k) => seriesData.get(k))), {
          utc: true, height: 260,
          yValues: (u, vals) => vals.map((v) => (metric === 'cost_usd' ? fmtCost(v) : fmtInt(v))),
        });
      }

      const sorted = rows.slice().sort((p, q) => String(q.day).localeCompare(String(p.day)) || keyOf(p).localeCompare(keyOf(q)));
      fillRows(table, sorted.map((r) => h('tr', null,
        td(r.day == null ? dash : String(r.day), 'mono'), td(keyOf(r), 'mono'),
        td(fmtInt(r.calls), 'num'), td(fmtInt(r.ok), 'num'), td(fmtInt(r.failed), 'num'),
        td(fmtInt(r.input_tokens), 'num'), td(fmtInt(r.output_tokens), 'num'), td(fmtInt(r.cached_tokens), 'num', r.cache_write_tokens ? `${fmtInt(r.cache_write_tokens)} written to the cache` : null),
        td(fmtCost(r.cost_usd), 'num'), td(fmtInt(r.estimated_calls), 'num'))));
      if (rows.length) {
        const sum = (f) => rows.reduce((acc, r) => acc + (Number(r[f]) || 0), 0);
        table.table.append(h('tfoot', null, h('tr', null,
          h('th', null, 'Total'), h('th'),
          ['calls', 'ok', 'failed', 'input_tokens', 'output_tokens', 'cached_tokens'].map((f) => h('th', { class: 'num' }, fmtInt(sum(f)))),
          h('th', { class: 'num' }, fmtCost(sum('cost_usd'))), h('th', { class: 'num' }, fmtInt(sum('estimated_calls'))))));
      }
    })();
  }

  // ================================================================ Catalog
  function renderCatalog(root) {
    const gen = state.gen;
    const agents = makeTable('agents-table', ['Name', 'Source', 'Description', 'Model', ['Max turns', 'num'], 'Tools', 'Warnings'], 'No agents.');
    const invalidList = h('ul', { class: 'invalid-list' });
    const invalid = h('div', { id: 'invalid-agents', class: 'invalid', hidden: true },
      h('h3', null, 'Invalid agent definitions'), invalidList);
    const tools = makeTable('tools-table', ['Name', 'Source', 'Policy', 'Description', 'Endpoint / source'], 'No tools.');
    const sources = makeTable('sources-table', ['Name', 'URL', ['Tools', 'num'], 'Refreshed', 'Last error'], 'No tool sources.');
    const envs = makeTable('environments-table', ['Name', 'Image', 'Status', 'Digest', ['Size', 'num'], ['Exit code', 'num'], 'Built', 'Output'], 'No environments.');

    root.append(h('section', { id: 'catalog-page', class: 'page' },
      card('Agents', agents.el, invalid),
      card('Tools', tools.el),
      card('Tool sources', sources.el),
      card('Environments', envs.el)));

    const load = async (path, fn) => {
      try {
        const d = await api(path);
        if (gen === state.gen && d) fn(d);
      } catch (e) { if (gen === state.gen) handleError(e); }
    };
    load('/agents', (d) => {
      fillRows(agents, (d.agents || []).map((a) => h('tr', null,
        td(String(a.name), 'mono'), td(a.source || dash), td(a.description || dash, 'wrap'),
        td(a.model || dash, 'mono'), td(a.max_turns == null ? dash : String(a.max_turns), 'num'),
        td(agentTools(a), 'wrap'),
        td(Array.isArray(a.warnings) && a.warnings.length
          ? h('ul', { class: 'warnings', dataset: { test: 'agent-warnings' } }, a.warnings.map((w) => h('li', null, String(w))))
          : dash, 'wrap'))));
      const bad = d.invalid || [];
      invalid.hidden = bad.length === 0;
      invalidList.replaceChildren(...bad.map((b) => h('li', null,
        h('span', { class: 'mono' }, String(b.source == null ? dash : b.source)), ': ',
        h('span', { class: 'error-text' }, String(b.error == null ? '' : b.error)))));
    });
    load('/tools', (d) => {
      fillRows(tools, (d.tools || []).map((t) => h('tr', null,
        td(String(t.name), 'mono'), td(t.source || dash),
        td(h('span', { class: 'policy policy-' + cssToken(t.policy) }, String(t.policy == null ? dash : t.policy))),
        td(t.description || dash, 'wrap'),
        td(t.endpoint || t.tool_source || (t.source === 'builtin' ? 'built in: run by subagentd' : dash), 'mono'))));
    });
    load('/environments', (d) => {
      fillRows(envs, (d.environments || []).map(environmentRow));
    });
    load('/tool-sources', (d) => {
      fillRows(sources, (d.tool_sources || []).map((s) => h('tr', null,
        td(String(s.name), 'mono'), td(s.url || dash, 'mono'),
        td(Array.isArray(s.tools) ? String(s.tools.length) : dash, 'num', Array.isArray(s.tools) ? s.tools.join(', ') : null),
        td(s.refreshed_at ? timeEl(s.refreshed_at, true) : dash),
        td(s.last_error ? truncate(s.last_error, 200) : '', 'error-text wrap', s.last_error || null))));
    });
  }

  // A named environment's row: its status as a pill (the setup's output in its title), the
  // digest its build ran on, the root's size, the setup's exit code and the end of its output.
  function environmentRow(e) {
    const st = String(e.status == null ? dash : e.status);
    return h('tr', { dataset: { environment: String(e.name) } },
      td(String(e.name), 'mono'), td(e.image || dash, 'mono'),
      td(h('span', { 'data-test': 'env-status', class: 'status env-' + cssToken(st) }, st)),
      td(e.digest ? truncate(e.digest, 19) : dash, 'mono', e.digest || null),
      td(e.size_bytes == null ? dash : fmtInt(e.size_bytes), 'num'),
      td(e.exit_code == null ? dash : String(e.exit_code), 'num'),
      td(e.built_at ? timeEl(e.built_at, true) : dash),
      td(e.output_tail ? truncate(e.output_tail.trim().split('\n').pop(), 120) : dash, e.status === 'failed' ? 'error-text wrap' : 'wrap', e.output_tail || null));
  }

  // An agent's tools as the catalog shows them: its list (or rule), then the built-ins its
  // type is offered where they are on.
  function agentTools(a) {
    let s = Array.isArray(a.tools) ? (a.tools.length ? a.tools.join(', ') : 'none') : (a.tools == null ? dash : String(a.tools));
    if (Array.isArray(a.builtin_tools) && a.builtin_tools.length) s += '; built in: ' + a.builtin_tools.join(', ');
    return s;
  }

  function renderNotFound(root) {
    root.append(h('section', { class: 'page card' }, h('h1', null, 'Not found'),
      h('p', null, 'No page at this address. ', h('a', { href: '#/' }, 'Go to the overview.'))));
  }

  // ================================================================ router
  function parseHash() {
    let raw = location.hash.replace(/^#/, '');
    if (!raw.startsWith('/')) raw = '/' + raw;
    const qi = raw.indexOf('?');
    const path = (qi >= 0 ? raw.slice(0, qi) : raw).replace(/\/+$/, '') || '/';
    const params = new URLSearchParams(qi >= 0 ? raw.slice(qi + 1) : '');
    return { path, params };
  }

  function setActiveNav(name) {
    document.querySelectorAll('nav [data-nav]').forEach((a) => {
      a.classList.toggle('active', a.dataset.nav === name);
      if (a.dataset.nav === name) a.setAttribute('aria-current', 'page');
      else a.removeAttribute('aria-current');
    });
  }

  function route() {
    if (!state.session) return;
    teardown();
    state.gen++;
    clearError();
    const root = $('#app');
    root.replaceChildren();
    const { path, params } = parseHash();
    let m;
    if (path === '/') { setActiveNav('overview'); renderOverview(root); }
    else if (path === '/tasks') { setActiveNav('tasks'); renderTasks(root, params); }
    else if ((m = path.match(/^\/tasks\/([^/]+)$/))) {
      setActiveNav('tasks');
      let id = m[1];
      try { id = decodeURIComponent(id); } catch (e) { /* keep raw */ }
      renderTask(root, id);
    }
    else if (path === '/usage') { setActiveNav('usage'); renderUsage(root, params); }
    else if (path === '/catalog') { setActiveNav('catalog'); renderCatalog(root); }
    else { setActiveNav(null); renderNotFound(root); }
    window.scrollTo(0, 0);
  }

  // ================================================================ auth views
  function whoamiText(s) {
    if (s.mode === 'open') return `single-user (${s.tenant || 'default'})`;
    if (s.admin) return 'admin (all tenants)';
    return 'tenant ' + (s.tenant == null ? '?' : s.tenant);
  }

  function showApp(session) {
    state.session = session || {};
    $('#boot-status').hidden = true;
    $('#signin-view').hidden = true;
    $('#nav').hidden = false;
    setText($('#whoami'), whoamiText(state.session));
    $('#signout').hidden = state.session.mode !== 'session';
    $('#app').hidden = false;
    route();
  }

  function showSignin() {
    teardown();
    state.gen++;
    state.session = null;
    $('#boot-status').hidden = true;
    $('#app').hidden = true;
    $('#app').replaceChildren();
    $('#nav').hidden = true;
    setText($('#whoami'), '');
    $('#signout').hidden = true;
    clearError();
    $('#signin-view').hidden = false;
    const key = $('#signin-key');
    if (key) key.focus();
  }

  async function onSigninSubmit(ev) {
    ev.preventDefault();
    const input = $('#signin-key');
    const btn = $('#signin-submit');
    const err = $('#signin-error');
    setText(err, '');
    if (!input.value) { setText(err, 'Enter an API key or admin token.'); return; }
    btn.disabled = true;
    try {
      const res = await fetch(SESSION_URL, {
        method: 'POST',
        credentials: 'same-origin',
        headers: { 'content-type': 'application/json', accept: 'application/json' },
        body: JSON.stringify({ key: input.value }),
      });
      if (res.ok) {
        const session = await res.json();
        input.value = '';
        showApp(session);
      } else {
        setText(err, (await problemDetail(res)).detail);
      }
    } catch (e) {
      setText(err, 'Network error: ' + (e && e.message ? e.message : 'request failed'));
    } finally {
      btn.disabled = false;
    }
  }

  async function onSignout() {
    const btn = $('#signout');
    btn.disabled = true;
    try {
      const res = await fetch(SESSION_URL, { method: 'DELETE', credentials: 'same-origin', headers: csrfHeaders('DELETE') });
      if (res.ok || res.status === 401) showSignin();
      else showError((await problemDetail(res)).detail);
    } catch (e) {
      showError('Network error: ' + (e && e.message ? e.message : 'request failed'));
    } finally {
      btn.disabled = false;
    }
  }

  async function boot() {
    $('#signin-form').addEventListener('submit', onSigninSubmit);
    $('#signout').addEventListener('click', onSignout);
    window.addEventListener('hashchange', () => { if (state.session) route(); });
    try {
      const res = await fetch(SESSION_URL, { credentials: 'same-origin', headers: { accept: 'application/json' } });
      if (res.status === 200) showApp(await res.json());
      else if (res.status === 401) showSignin();
      else {
        setText($('#boot-status'), '');
        showError((await problemDetail(res)).detail);
      }
    } catch (e) {
      setText($('#boot-status'), '');
      showError('Cannot reach the server: ' + (e && e.message ? e.message : 'request failed'));
    }
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', boot);
  else boot();
})();
