// knob dashboard: one snapshot from the API, then live events from /api/v1/stream (SSE read
// through fetch, so a token can travel in the Authorization header).
"use strict";

const STATUSES = ["WAITING", "RUNNING", "SUCCEEDED", "FAILED", "USER_CANCELED", "SYS_CANCELED", "EARLY_STOPPED"];
const state = {
  experiment: null,
  trials: new Map(),        // trial_id -> trial row
  intermediate: new Map(),  // trial_id -> [value]
  lastSeq: 0,
  sort: { key: "sequence", desc: false },
  dirtyTrials: new Set(),
  detail: null,
  tableRows: 200,           // rows drawn; "show more" adds TABLE_STEP (a DOM of 10 000 rows is slow)
};
const TABLE_STEP = 500;
const token = (() => {
  const match = location.hash.match(/token=([^&]+)/);
  if (match) sessionStorage.setItem("knob-token", decodeURIComponent(match[1]));
  return sessionStorage.getItem("knob-token");
})();
const $ = (id) => document.getElementById(id);

async function api(path, options = {}) {
  const headers = Object.assign({ "Content-Type": "application/json" }, options.headers || {});
  if (token) headers.Authorization = "Bearer " + token;
  const response = await fetch("/api/v1" + path, Object.assign({}, options, { headers }));
  const text = await response.text();
  let body;
  try { body = JSON.parse(text); } catch (_) { body = text; }
  if (!response.ok) throw new Error((body && body.error) || response.statusText);
  return body;
}

function showError(error) {
  $("error").hidden = !error;
  $("error").textContent = error ? String(error.message || error) : "";
}

// Parameters flattened once per trial row (a row is replaced, never changed, when it updates).
const flatCache = new WeakMap();
function flatOf(trial) {
  let flat = flatCache.get(trial);
  if (!flat) flatCache.set(trial, (flat = flatParams(trial.parameters)));
  return flat;
}

function flatParams(value, prefix = "", out = {}) {
  for (const [key, v] of Object.entries(value || {})) {
    const name = prefix ? prefix + "." + key : key;
    if (v && typeof v === "object" && !Array.isArray(v)) flatParams(v, name, out);
    else out[name] = v;
  }
  return out;
}

const fmt = (v) => (v === null || v === undefined ? "–" : typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toPrecision(6)) : String(v));
const fmtDuration = (ms) => (ms === null || ms === undefined ? "–" : ms < 60000 ? (ms / 1000).toFixed(1) + "s" : (ms / 60000).toFixed(1) + "m");
const maximize = () => !state.experiment || state.experiment.optimize_mode !== "minimize";

// How many trials' intermediate curves the chart shows (the latest ones): a dashboard of an
// experiment with 200 000 intermediate results downloads only these trials' metrics.
const CURVES = 50;

async function loadSnapshot() {
  state.experiment = await api("/experiment");
  state.lastSeq = state.experiment.last_seq;
  for (let offset = 0; ; offset += 10000) {
    const page = await api(`/trials?offset=${offset}&limit=10000`);
    for (const t of page.trials) state.trials.set(t.trial_id, t);
    if (page.trials.length < 10000) break;
  }
  const latest = [...state.trials.values()].filter((t) => t.started_ms !== null).sort((a, b) => b.sequence - a.sequence).slice(0, CURVES);
  if (latest.length === 0) return;
  const ids = latest.map((t) => encodeURIComponent(t.trial_id)).join(",");
  for (let since = 0; since < state.lastSeq; ) {
    const page = await api(`/metrics?trial_ids=${ids}&kind=intermediate&since=${since}&limit=10000`);
    page.metrics.filter((m) => m.seq <= state.lastSeq).forEach(addMetric);
    if (page.metrics.length < 10000) break;
    since = page.last_seq;
  }
}

// A trial's curve is that of its latest attempt: a new attempt (a retry, a re-run after a
// crash or a stop) starts it again, and an older attempt's late metric is not drawn.
function addMetric(m) {
  if (m.kind !== "intermediate") return;
  const curve = state.intermediate.get(m.trial_id);
  if (!curve || m.attempt > curve.attempt) {
    state.intermediate.set(m.trial_id, Object.assign([m.value], { attempt: m.attempt }));
  } else if (m.attempt === curve.attempt) {
    curve.push(m.value);
  }
}

// Events name what changed; changed trials are fetched again, at most once a second.
function onEvent(record) {
  state.lastSeq = Math.max(state.lastSeq, record.seq);
  const event = record.event;
  if (event.type === "metric") addMetric(Object.assign({ seq: record.seq }, event));
  if (event.trial_id) state.dirtyTrials.add(event.trial_id);
  state.experimentDirty = true;
}

async function follow() {
  for (;;) {
    try {
      const headers = token ? { Authorization: "Bearer " + token } : {};
      const response = await fetch(`/api/v1/stream?since=${state.lastSeq}`, { headers });
      if (!response.ok) throw new Error("stream: " + response.status);
      $("live").textContent = "● live";
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
          if (data && !block.includes("event: error")) onEvent(JSON.parse(data));
        }
      }
    } catch (error) {
      $("live").textContent = "○ reconnecting";
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
}

async function refresh() {
  try {
    if (state.experimentDirty) {
      state.experimentDirty = false;
      state.experiment = await api("/experiment");
    }
    const dirty = [...state.dirtyTrials];
    state.dirtyTrials.clear();
    if (dirty.length > 200) {
      const page = await api(`/trials?limit=10000`);
      for (const t of page.trials) state.trials.set(t.trial_id, t);
    } else {
      await Promise.all(dirty.map(async (id) => {
        const t = await api(`/trials/${encodeURIComponent(id)}`);
        delete t.metrics;
        state.trials.set(id, t);
      }));
    }
    if (dirty.length || state.rendered !== true) render();
    state.rendered = true;
    showError(null);
  } catch (error) {
    showError(error);
  }
}

function render() {
  renderOverview();
  renderTable();
  renderCharts();
  if (state.detail) renderDetail(state.detail, false);
}

function renderOverview() {
  const e = state.experiment;
  $("experiment-id").textContent = e.id;
  $("status").textContent = e.status;
  $("status").className = "badge " + e.status;
  $("stop").hidden = !e.writable;
  $("add-trial-open").hidden = !e.writable;
  $("counts").textContent = Object.entries(e.trial_counts).map(([s, n]) => `${s} ${n}`).join(" · ") || "no trials yet";
  const maxTrials = e.config.maxTrialNumber;
  $("trial-budget").max = maxTrials || 1;
  $("trial-budget").value = maxTrials ? Math.min(e.trial_total, maxTrials) : 0;
  $("trial-budget-text").textContent = maxTrials ? `${e.trial_total} / ${maxTrials}` : `${e.trial_total} (no limit)`;
  const maxSeconds = e.config.maxExperimentDuration;
  const elapsed = e.elapsed_ms / 1000;
  $("time-budget").max = maxSeconds || 1;
  $("time-budget").value = maxSeconds ? Math.min(elapsed, maxSeconds) : 0;
  $("time-budget-text").textContent = maxSeconds ? `${fmtDuration(elapsed * 1000)} / ${fmtDuration(maxSeconds * 1000)}` : `${fmtDuration(elapsed * 1000)} (no limit)`;
  $("best").tBodies[0].innerHTML = "";
  for (const t of e.best_trials.slice(0, 5)) {
    const row = $("best").tBodies[0].insertRow();
    row.insertCell().textContent = t.trial_id;
    row.insertCell().textContent = fmt(t.final_value);
    const params = row.insertCell();
    params.className = "params";
    params.textContent = JSON.stringify(t.parameters);
    row.onclick = () => openDetail(t.trial_id);
  }
}

function sortedFilteredTrials() {
  const text = $("filter").value.trim().toLowerCase();
  const status = $("status-filter").value;
  const { key, desc } = state.sort;
  const value = (t) => (key === "parameters" ? JSON.stringify(t.parameters) : t[key]);
  return [...state.trials.values()]
    .filter((t) => !status || t.status === status)
    .filter((t) => !text || (t.trial_id + " " + JSON.stringify(t.parameters) + " " + (t.end_message || "")).toLowerCase().includes(text))
    .sort((a, b) => {
      const x = value(a), y = value(b);
      const order = x === y ? a.sequence - b.sequence : x === null || x === undefined ? 1 : y === null || y === undefined ? -1 : x < y ? -1 : 1;
      return desc ? -order : order;
    });
}

function renderTable() {
  const rows = sortedFilteredTrials();
  $("trial-count").textContent = `${rows.length} of ${state.trials.size}`;
  const hidden = rows.length - state.tableRows;
  $("more-rows").hidden = hidden <= 0;
  $("more-rows").textContent = `show ${Math.min(TABLE_STEP, hidden)} more (${hidden} not shown)`;
  const body = document.createElement("tbody");
  for (const t of rows.slice(0, state.tableRows)) {
    const row = body.insertRow();
    row.dataset.trial = t.trial_id;
    row.insertCell().textContent = t.sequence;
    row.insertCell().textContent = t.trial_id;
    const status = row.insertCell().appendChild(document.createElement("span"));
    status.className = "badge " + t.status;
    status.textContent = t.status;
    row.insertCell().textContent = fmt(t.final_value);
    row.insertCell().textContent = fmtDuration(t.duration_ms);
    const params = row.insertCell();
    params.className = "params";
    params.textContent = JSON.stringify(t.parameters);
    row.insertCell().textContent = t.end_message || "";
    const actions = row.insertCell();
    if (state.experiment.writable && (t.status === "RUNNING" || t.status === "WAITING")) {
      const kill = actions.appendChild(document.createElement("button"));
      kill.textContent = "kill";
      kill.className = "danger kill";
      kill.onclick = (event) => { event.stopPropagation(); killTrial(t.trial_id); };
    }
    row.onclick = () => openDetail(t.trial_id);
  }
  $("trials").replaceChild(body, $("trials").tBodies[0]);
  for (const th of $("trials").tHead.rows[0].cells) {
    th.className = th.dataset.key === state.sort.key ? (state.sort.desc ? "desc" : "asc") : "";
  }
}

const charts = {};
function chart(id) {
  if (!charts[id]) charts[id] = echarts.init($(id));
  return charts[id];
}

function renderCharts() {
  const trials = [...state.trials.values()].sort((a, b) => a.sequence - b.sequence);
  const finished = trials.filter((t) => t.final_value !== null && t.final_value !== undefined);
  let best = null;
  const bestLine = finished.map((t) => {
    best = best === null ? t.final_value : maximize() ? Math.max(best, t.final_value) : Math.min(best, t.final_value);
    return [t.sequence, best];
  });
  chart("chart-final").setOption({
    animation: false,
    tooltip: { trigger: "item" },
    legend: { data: ["final", "best so far"] },
    xAxis: { type: "value", name: "trial #" },
    yAxis: { type: "value", scale: true },
    series: [
      { name: "final", type: "scatter", symbolSize: 6, large: true, data: finished.map((t) => ({ value: [t.sequence, t.final_value], name: t.trial_id })) },
      { name: "best so far", type: "line", step: "end", showSymbol: false, data: bestLine },
    ],
  });

  const names = [...new Set(finished.flatMap((t) => Object.keys(flatOf(t))))].slice(0, 30);
  const categorical = names.map((n) => finished.some((t) => typeof flatOf(t)[n] !== "number"));
  const axes = names.map((name, i) => categorical[i]
    ? { dim: i, name, type: "category", data: [...new Set(finished.map((t) => String(flatOf(t)[name])))] }
    : { dim: i, name, type: "value", scale: true });
  axes.push({ dim: names.length, name: "metric", type: "value", scale: true });
  const values = finished.map((t) => t.final_value);
  chart("chart-parallel").setOption({
    animation: false,
    parallelAxis: axes,
    parallel: { left: 40, right: 60, bottom: 30, top: 40 },
    visualMap: { show: true, min: values.length ? Math.min(...values) : 0, max: values.length ? Math.max(...values) : 1, dimension: names.length, inRange: { color: maximize() ? ["#d73027", "#fee090", "#4575b4"] : ["#4575b4", "#fee090", "#d73027"] }, right: 0, top: "middle", calculable: true, itemHeight: 120 },
    series: [{ type: "parallel", lineStyle: { width: 1, opacity: 0.6 }, data: finished.map((t) => {
      const p = flatOf(t);
      return names.map((n, i) => (categorical[i] ? String(p[n]) : p[n])).concat([t.final_value]);
    }) }],
  }, true);

  const recent = trials.filter((t) => state.intermediate.has(t.trial_id)).slice(-CURVES);
  chart("chart-intermediate").setOption({
    animation: false,
    tooltip: { trigger: "item" },
    xAxis: { type: "value", name: "report", minInterval: 1 },
    yAxis: { type: "value", scale: true },
    series: recent.map((t) => { const values = state.intermediate.get(t.trial_id); return { name: t.trial_id, type: "line", showSymbol: values.length < 2, data: values.map((v, i) => [i + 1, v]) }; }),
  }, true);

  chart("chart-duration").setOption({
    animation: false,
    tooltip: { trigger: "item" },
    xAxis: { type: "value", name: "trial #" },
    yAxis: { type: "value", name: "seconds" },
    series: [{ type: "bar", large: true, data: trials.filter((t) => t.duration_ms !== null).map((t) => ({ value: [t.sequence, t.duration_ms / 1000], name: t.trial_id })) }],
  });
}

async function openDetail(trialId) {
  state.detail = trialId;
  $("detail").showModal ? $("detail").open || $("detail").showModal() : ($("detail").open = true);
  await renderDetail(trialId, true);
}

async function renderDetail(trialId, withLog) {
  try {
    const t = await api(`/trials/${encodeURIComponent(trialId)}`);
    $("detail-id").textContent = t.trial_id;
    $("detail-status").textContent = t.status;
    $("detail-status").className = "badge " + t.status;
    $("detail-kill").hidden = !(state.experiment.writable && (t.status === "RUNNING" || t.status === "WAITING"));
    $("detail-info").textContent = JSON.stringify({ parameters: t.parameters, final: t.final_raw, duration: fmtDuration(t.duration_ms), attempts: t.attempts, exit_code: t.exit_code, signal: t.signal, stop_reason: t.end_message, gpus: t.gpu_indices }, null, 2);
    const intermediate = t.metrics.filter((m) => m.kind === "intermediate");
    chart("chart-detail").setOption({ animation: false, xAxis: { type: "value", minInterval: 1 }, yAxis: { type: "value", scale: true }, tooltip: { trigger: "axis" }, series: [{ type: "line", data: intermediate.map((m, i) => [i + 1, m.value]) }] }, true);
    if (withLog) await showLog(trialId, "stdout");
  } catch (error) {
    showError(error);
  }
}

async function showLog(trialId, name) {
  try {
    const headers = token ? { Authorization: "Bearer " + token } : {};
    const response = await fetch(`/api/v1/trials/${encodeURIComponent(trialId)}/logs/${name}?tail=200000`, { headers });
    const text = await response.text();
    $("detail-log").textContent = response.ok ? text || "(empty)" : `(${JSON.parse(text).error})`;
  } catch (error) {
    $("detail-log").textContent = String(error);
  }
}

async function killTrial(trialId) {
  try {
    await api(`/trials/${encodeURIComponent(trialId)}/kill`, { method: "POST" });
    state.dirtyTrials.add(trialId);
  } catch (error) {
    showError(error);
  }
}

function wire() {
  for (const s of STATUSES) $("status-filter").add(new Option(s, s));
  $("filter").oninput = renderTable;
  $("more-rows").onclick = () => { state.tableRows += TABLE_STEP; renderTable(); };
  $("status-filter").onchange = renderTable;
  for (const th of $("trials").tHead.rows[0].cells) {
    if (!th.dataset.key) continue;
    th.onclick = () => {
      state.sort = { key: th.dataset.key, desc: state.sort.key === th.dataset.key ? !state.sort.desc : false };
      renderTable();
    };
  }
  $("stop").onclick = async () => {
    if (!confirm("Stop the experiment? Running trials are killed; it can be resumed.")) return;
    try { await api("/experiment/stop", { method: "POST" }); } catch (error) { showError(error); }
  };
  $("add-trial-open").onclick = () => { $("add-trial").hidden = !$("add-trial").hidden; };
  $("add-trial").onsubmit = async (event) => {
    event.preventDefault();
    try {
      const parameters = JSON.parse($("add-trial-parameters").value);
      const added = await api("/trials", { method: "POST", body: JSON.stringify({ parameters }) });
      $("add-trial-result").textContent = "added " + added.trial_id;
    } catch (error) {
      $("add-trial-result").textContent = String(error.message || error);
    }
  };
  for (const button of document.querySelectorAll("[data-log]")) {
    button.onclick = () => showLog(state.detail, button.dataset.log);
  }
  $("detail-kill").onclick = () => killTrial(state.detail);
  $("detail").addEventListener("close", () => { state.detail = null; });
  window.addEventListener("resize", () => Object.values(charts).forEach((c) => c.resize()));
}

async function main() {
  wire();
  try {
    await loadSnapshot();
    performance.mark("knob-snapshot-loaded");
    render();
    state.rendered = true;
    // The first frame after the table and the charts were built: what benches/ measures.
    requestAnimationFrame(() => {
      performance.mark("knob-first-paint");
      window.__knobFirstPaint = performance.now();
    });
  } catch (error) {
    showError(error);
  }
  follow();
  setInterval(refresh, 1000);
}

main();
