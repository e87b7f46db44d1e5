// knob dashboard: one snapshot from the API, then live events from /api/v1/stream (SSE read
// through fetch, so a token can travel in the Authorization header).
"use strict";
performance.mark("knob-script");

const STATUSES = ["WAITING", "RUNNING", "SUCCEEDED", "FAILED", "USER_CANCELED", "SYS_CANCELED", "EARLY_STOPPED"];
const state = {
  experiment: null,
  trials: new Map(),        // trial_id -> trial row
  curves: new Map(),        // trial_id -> {attempt, points: [[seq, value]], seqs: Set}
  complete: new Set(),      // trials whose whole curve is loaded (the rest: only what streamed in)
  lastSeq: 0,
  connection: "connecting", // connecting | connected | reconnecting | gone
  lastSeen: null,           // when the server last answered (ms)
  sort: { key: "sequence", desc: false },
  dirtyTrials: new Set(),
  selected: new Set(),      // trials ticked for comparison
  curveMode: "latest",      // latest | best
  curveCount: null,         // 0 = all; null until the snapshot decides
  curveLog: false,
  curveBetter: null,        // draw only curves whose final (or latest report) is better than this
  detail: null,
  tableRows: 200,           // rows drawn; "show more" adds TABLE_STEP (a DOM of 10 000 rows is slow)
  pendingKills: new Map(),  // trial_id -> the server's message: a kill recorded, not carried out yet
};
const TABLE_STEP = 500;
const TABLE_FIRST = 50;
// A token may hold a `%` that begins no escape (`#token=50%off`): decodeURIComponent throws on
// it, which stopped the whole page; such a token is taken as written.
const token = (() => {
  const match = location.hash.match(/token=([^&]+)/);
  if (match) {
    let given = match[1];
    try { given = decodeURIComponent(given); } catch { /* as written */ }
    sessionStorage.setItem("knob-token", given);
  }
  return sessionStorage.getItem("knob-token");
})();

// Views have URLs: `#trial=ID` opens a trial, `#compare=ID,ID,...` a comparison (a token in
// the URL is kept in this tab's session storage and left out of the URLs the page writes).
function hashParams() {
  const params = new URLSearchParams(location.hash.slice(1));
  params.delete("token");
  return params;
}
function setHash(key, value) {
  const url = location.pathname + location.search + (key ? "#" + key + "=" + value.split(",").map(encodeURIComponent).join(",") : "");
  if (url !== location.pathname + location.search + location.hash) history.pushState(null, "", url);
}
async function applyHash() {
  const params = hashParams();
  const trial = params.get("trial");
  const compare = params.get("compare");
  if (trial && state.trials.has(trial)) {
    if ($("compare").open) $("compare").close();
    if (state.detail !== trial) await openDetail(trial);
  } else if (compare) {
    const ids = compare.split(",").filter((id) => state.trials.has(id));
    if ($("detail").open) $("detail").close();
    if (ids.length >= 1) {
      state.selected = new Set(ids);
      renderTable();
      await openCompare();
    }
  } else {
    if ($("detail").open) $("detail").close();
    if ($("compare").open) $("compare").close();
  }
}
const $ = (id) => document.getElementById(id);
// Relative to the page: `knob view` of every experiment serves each dashboard under /e/ID/.
const API = new URL("api/v1", location.href.replace(/#.*$/, "")).pathname;

async function api(path, options = {}) {
  const headers = Object.assign({ "Content-Type": "application/json" }, options.headers || {});
  if (token) headers.Authorization = "Bearer " + token;
  const response = await fetch(API + path, Object.assign({}, options, { headers }));
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

// A trial's parameters by name, nested ones flattened. Names are the server's (`/trial-columns`
// names each key path as `knob experiment export` does: `opt/lr` for `lr` inside `opt`, JSON
// Pointers where two would clash), so that a trial read whole from `/trials/ID` matches the
// table. The objects have no prototype: a parameter named `__proto__` is a key like any other
// (on a `{}` it would set the object's prototype and vanish).
const pathNames = new Map(); // JSON of a key path -> its name
function flatParams(value, path = [], out = Object.create(null)) {
  for (const [key, v] of Object.entries(value || {})) {
    const at = path.concat([key]);
    if (v && typeof v === "object" && !Array.isArray(v)) flatParams(v, at, out);
    else out[nameOfPath(at)] = v;
  }
  return out;
}
function nameOfPath(path) {
  const name = pathNames.get(JSON.stringify(path));
  if (name !== undefined) return name;
  // A path the server's list did not have yet (a nested option no trial had): its JSON Pointer
  // until `refresh` reads the list again, which names it.
  state.unnamedPath = true;
  return path.map((key) => key.replace(/~/g, "~0").replace(/\//g, "~1")).join("/");
}

const fmt = (v) => (v === null || v === undefined ? "–" : typeof v === "number" ? (Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(6)))) : String(v));
// ECharts renders what a tooltip's formatter returns as HTML: each value put in one is escaped
// (a parameter's or a metric's name is the config's text, a choice value the tuner's or the
// API's), only the template's own markup is kept.
const escapeHtml = (v) => String(v).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const html = (strings, ...values) => strings.reduce((out, text, i) => out + escapeHtml(values[i - 1]) + text);
const fmtDuration = (ms) => (ms === null || ms === undefined ? "–" : ms < 60000 ? (ms / 1000).toFixed(1) + "s" : (ms / 60000).toFixed(1) + "m");
const maximize = () => !state.experiment || state.experiment.optimize_mode !== "minimize";

// The intermediate chart draws every trial's curve while there are at most ALL_CURVES_UP_TO
// trials; beyond that it starts with the latest DEFAULT_CURVES (an experiment with 200 000
// intermediate results would otherwise download all of them before its first paint) and says
// so ("50 of 10000"), with a control to draw more, all of them included.
const ALL_CURVES_UP_TO = 200;
const DEFAULT_CURVES = 50;
const CURVE_COUNTS = [10, 50, 200, 1000];

// The first paint is the overview and the table's first rows: it needs `/experiment` and the
// trial list's first TABLE_FIRST rows only, asked for as soon as this script runs. The whole list
// (10 000 trials are 1.5 MB of JSON) is asked for at the same time, but read only after the
// first paint; ECharts (1 MB of script) is loaded after it too. The page follows the stream from
// the whole list's `last_seq`, which the server reads before the trials, so no change in between
// is missed.
const early = {
  experiment: api("/experiment"),
  firstPage: api(`/trial-columns?offset=0&limit=${TABLE_FIRST}`),
  trials: fetchApi("/trial-columns?offset=0&limit=10000"),
};
for (const promise of Object.values(early)) promise.catch(() => {});

// A GET whose body is read later: the response, its body left unread.
function fetchApi(path) {
  return fetch(API + path, { headers: token ? { Authorization: "Bearer " + token } : {} });
}
// The JSON body of a response from fetchApi, or its error.
async function bodyOf(response) {
  response = await response;
  const text = await response.text();
  let body;
  try { body = JSON.parse(text); } catch (_) { body = text; }
  if (!response.ok) throw new Error((body && body.error) || response.statusText);
  return body;
}

// Trial rows from `/trial-columns` (one array per field): parameters arrive flattened, so they
// are their own flattened form.
function trialsFromColumns(page) {
  const c = page.columns;
  const names = Object.keys(page.parameters);
  for (const name of names) pathNames.set(JSON.stringify(page.parameter_paths[name]), name);
  const rows = [];
  for (let i = 0; i < page.count; i++) {
    const parameters = Object.create(null);
    for (const name of names) {
      const v = page.parameters[name][i];
      if (v !== null) parameters[name] = v;
    }
    const t = { trial_id: c.trial_id[i], sequence: c.sequence[i], status: c.status[i], attempts: c.attempts[i],
      started_ms: c.started_ms[i], ended_ms: c.ended_ms[i], duration_ms: c.duration_ms[i], final_value: c.final_value[i], ranks: c.ranks[i],
      environment_id: c.environment_id[i], end_message: c.end_message[i], waiting_reason: c.waiting_reason[i], parameters };
    flatCache.set(t, parameters);
    rows.push(t);
  }
  return rows;
}

// Every trial, in pages of 10 000; returns the `last_seq` of the first page. The first page's
// `total` says whether there is another (at exactly 10 000 trials, asking for an empty second
// page cost a round trip before the first paint).
async function loadTrialColumns(first) {
  let lastSeq = null;
  for (let offset = 0, pages = 0; pages < 1000; offset += 10000, pages++) {
    const page = offset === 0 && first ? await bodyOf(first) : await api(`/trial-columns?offset=${offset}&limit=10000`);
    if (lastSeq === null) lastSeq = page.last_seq;
    for (const t of trialsFromColumns(page)) state.trials.set(t.trial_id, t);
    if (page.count < 10000 || offset + page.count >= page.total) break;
  }
  return lastSeq;
}

async function loadSnapshot() {
  const [experiment, lastSeq] = await Promise.all([early.experiment, loadTrialColumns(early.trials)]);
  state.experiment = experiment;
  state.lastSeq = Math.min(experiment.last_seq, lastSeq);
  state.snapshotTrials = new Set(state.trials.keys());
  if (state.curveCount === null) state.curveCount = startedTrials().length <= ALL_CURVES_UP_TO ? 0 : DEFAULT_CURVES;
  renderCurveControls();
  await loadCurves(curveTrials().map((t) => t.trial_id));
}

const startedTrials = () => [...state.trials.values()].filter((t) => t.started_ms !== null && t.started_ms !== undefined);

// Loads the whole curves of these trials (those not loaded yet), 500 trials a request. The
// stream adds what comes later; a metric seen both ways is kept once (by its sequence number).
async function loadCurves(trialIds) {
  const missing = trialIds.filter((id) => !state.complete.has(id) && state.snapshotTrials.has(id));
  for (let i = 0; i < missing.length; i += 500) {
    const chunk = missing.slice(i, i + 500);
    const ids = chunk.map(encodeURIComponent).join(",");
    for (let since = 0, pages = 0; pages < 1000; pages++) {
      const page = await api(`/metrics?trial_ids=${ids}&kind=intermediate&since=${since}&limit=10000`);
      page.metrics.forEach(addMetric);
      if (page.metrics.length < 10000) break;
      since = page.last_seq;
    }
    chunk.forEach((id) => state.complete.add(id));
  }
}

// A trial's curve is that of its latest attempt: a new attempt (a retry, a re-run after a
// crash or a stop) starts it again, and an older attempt's late metric is not drawn.
function addMetric(m) {
  if (m.kind !== "intermediate") return;
  let curve = state.curves.get(m.trial_id);
  if (!curve || m.attempt > curve.attempt) {
    curve = { attempt: m.attempt, points: [], seqs: new Set() };
    state.curves.set(m.trial_id, curve);
  }
  if (m.attempt !== curve.attempt || curve.seqs.has(m.seq)) return;
  curve.seqs.add(m.seq);
  const last = curve.points[curve.points.length - 1];
  curve.points.push([m.seq, m.value]);
  if (last && last[0] > m.seq) curve.points.sort((a, b) => a[0] - b[0]);
}

const better = (a, b) => (maximize() ? a > b : a < b);

// "Best" is the server's rule, taken as it is (`objectives::Ranking`, each trial's `ranks`): a
// trial ranks when it SUCCEEDED with a finite final and, with objectives, every listed metric
// finite and every constraint met. So the chart's best, the best table (the API's
// `best_trials`), `knob experiment show` and the e-mails name the same trial.
const ranks = (t) => t.ranks === true && typeof t.final_value === "number";
// Best first; a tie goes to the earlier trial (`objectives::best_first`).
const bestFirst = (a, b) => (maximize() ? b.final_value - a.final_value : a.final_value - b.final_value) || a.sequence - b.sequence;

// The threshold filter: a trial's final result, or while it has none its latest report, must be
// at least as good as the threshold. A running trial whose curve is not loaded yet stays in (it
// is judged once its reports are in).
function passesThreshold(t) {
  if (state.curveBetter === null) return true;
  let value = typeof t.final_value === "number" ? t.final_value : null;
  const curve = state.curves.get(t.trial_id);
  if (value === null && curve && curve.points.length) value = curve.points[curve.points.length - 1][1];
  if (typeof value !== "number") return isRunning(t) && !state.complete.has(t.trial_id);
  return value === state.curveBetter || better(value, state.curveBetter);
}

// The trials whose curves the chart draws, as the controls ask.
function curveTrials() {
  let trials = startedTrials().filter(passesThreshold);
  if (state.curveMode === "best") {
    trials = trials.filter(ranks).sort(bestFirst);
  } else {
    trials.sort((a, b) => b.sequence - a.sequence);
  }
  return state.curveCount ? trials.slice(0, state.curveCount) : trials;
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
    let ended = false;
    try {
      const headers = token ? { Authorization: "Bearer " + token } : {};
      const response = await fetch(`${API}/stream?since=${state.lastSeq}`, { headers });
      if (response.status === 410) return experimentDeleted(response);
      if (!response.ok) throw new Error("stream: " + response.status);
      setConnection("connected");
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      while (!ended) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          if (/^event: end$/m.test(block)) ended = true;
          const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
          if (data && !ended && !block.includes("event: error")) onEvent(JSON.parse(data));
        }
      }
      if (ended) {
        // The process running the experiment recorded its end and is closing: it waits (a
        // few seconds at most) until its pages have closed their streams. Read the end now,
        // then close this stream to let it go; waiting for the next once-a-second refresh,
        // the page had kept the state of up to a second before the end (a RUNNING experiment,
        // trials still running), and then called that the last known state.
        state.experimentDirty = true;
        await refresh();
        reader.cancel().catch(() => {});
        while (await serverAnswers()) await new Promise((r) => setTimeout(r, 1000));
      }
    } catch (_) {
      // The stream broke: the connection dropped, or the process serving the page is gone.
    }
    setConnection(!ended && await serverAnswers() ? "reconnecting" : "gone");
    await new Promise((r) => setTimeout(r, state.connection === "gone" ? 2000 : 1000));
  }
}

// The experiment's store was deleted (or moved) under the server (410): the page stops
// following and says so, with the server's reason, in place of "server gone".
async function experimentDeleted(response) {
  let reason;
  try { reason = (await response.json()).error; } catch (_) { reason = "the experiment was deleted"; }
  state.deleted = reason;
  showError(null);
  setConnection("gone");
  showDeleted();
}
function showDeleted() {
  const e = state.experiment;
  $("gone").hidden = false;
  $("gone").textContent = e ? `${state.deleted}. Last known state of experiment ${e.id}: ${e.status}.` : state.deleted;
}

// Whether the server answers at all (any HTTP answer counts), within 3 seconds.
async function serverAnswers() {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), 3000);
  try {
    const headers = token ? { Authorization: "Bearer " + token } : {};
    await fetch(API + "/experiment", { headers, signal: abort.signal, cache: "no-store" });
    return true;
  } catch (_) {
    return false;
  } finally {
    clearTimeout(timer);
  }
}

function setConnection(connection) {
  const was = state.connection;
  state.connection = connection;
  if (connection !== "gone") state.lastSeen = Date.now();
  if (was === "gone" && connection !== "gone") {
    state.experimentDirty = true;
    state.wasGone = true;
  }
  if (was !== connection && state.experiment) {
    renderOverview();
    renderConnection();
  }
}

// Whether the page may change the experiment now, and if not, why.
function writeRefusal() {
  const e = state.experiment;
  if (!e) return "loading";
  if (state.connection === "gone") return state.deleted || "the server of this page is gone";
  if (!e.writable) return ACTIVE.includes(e.status) ? "this page is read-only (knob view); the process running the experiment serves its own dashboard" : `the experiment is ${e.status}, not running`;
  if (!ACTIVE.includes(e.status)) return `the experiment is ${e.status}, not running`;
  return null;
}
const ACTIVE = ["INITIALIZED", "RUNNING", "NO_MORE_TRIAL", "TUNER_NO_MORE_TRIAL", "STOPPING"];

// The live badge only while the experiment can still change; a finished one shows none.
function renderConnection() {
  const e = state.experiment;
  const live = $("live");
  const active = e && ACTIVE.includes(e.status);
  live.hidden = !active || state.connection === "gone";
  live.className = "live " + state.connection;
  live.textContent = state.connection === "connected" ? "● live" : state.connection === "reconnecting" ? "○ reconnecting…" : "";
  live.title = state.connection === "connected" ? "following the experiment as it runs" : "the event stream broke; trying again";
  const gone = $("gone");
  gone.hidden = state.connection !== "gone";
  if (state.connection === "gone" && e) {
    const when = state.lastSeen ? new Date(state.lastSeen).toLocaleTimeString() : "?";
    gone.innerHTML = "";
    gone.append(
      `The server of this page is gone (the knob process serving it exited or cannot be reached; last answer at ${when}). ` +
      `Last known state of experiment ${e.id}: ${e.status}. To look again, run `,
      Object.assign(document.createElement("code"), { textContent: `knob view ${e.id}` }),
      " and open the address it prints.");
  }
  if (state.deleted) showDeleted();
  if (e) renderWriteControls();
}

// One refresh at a time, so that an older answer never replaces a newer one; asked for while
// one runs, it runs once more after it (and the promise is that later one's).
let refreshing = null;
let refreshAgain = false;
function refresh() {
  if (refreshing) {
    refreshAgain = true;
    return refreshing;
  }
  refreshing = (async () => {
    do {
      refreshAgain = false;
      await refreshOnce();
    } while (refreshAgain);
  })().finally(() => { refreshing = null; });
  return refreshing;
}

async function refreshOnce() {
  if (state.connection === "gone" || !state.experiment) return;
  try {
    if (state.experimentDirty) {
      state.experimentDirty = false;
      state.experiment = await api("/experiment");
      state.panelDirty = true;
    }
    const dirty = [...state.dirtyTrials];
    state.dirtyTrials.clear();
    if (dirty.length > 200) {
      await loadTrialColumns(null);
    } else {
      await Promise.all(dirty.map(async (id) => {
        const t = await api(`/trials/${encodeURIComponent(id)}`);
        delete t.metrics;
        flatOf(t);
        state.trials.set(id, t);
      }));
      // A parameter path the list had not named: the whole list again, which names every
      // path as it names them together (a new path can change an old one's name).
      if (state.unnamedPath) {
        state.unnamedPath = false;
        await loadTrialColumns(null);
      }
    }
    if (dirty.length || state.rendered !== true || state.wasGone) render();
    else if (state.panelDirty) {
      renderOverview();
      renderPanel();
      renderWriteControls();
    }
    if ((dirty.length || state.panelDirty) && state.firstPainted) loadEnvironments();
    state.panelDirty = false;
    state.wasGone = false;
    state.rendered = true;
    showError(null);
  } catch (error) {
    showError(error);
  }
}

// The first render's parts are timed (User Timing measures `knob-…`, which benches/ prints).
function timed(name, draw) {
  const start = performance.now();
  draw();
  if (!state.rendered) performance.measure("knob-" + name, { start });
}

function render() {
  timed("overview", renderOverview);
  timed("panel", renderPanel);
  timed("table", renderTable);
  timed("charts", renderCharts);
  renderConnection();
  renderPendingKills();
  if (state.detail) renderDetail(state.detail, false);
}

function renderOverview() {
  const e = state.experiment;
  $("experiment-name").textContent = e.name || "";
  $("experiment-id").textContent = e.name ? `(${e.id})` : e.id;
  document.title = `knob · ${e.name || e.id}`;
  const gone = state.connection === "gone";
  $("status").textContent = gone ? `${e.status} (last known)` : e.status;
  $("status").className = "badge " + e.status + (gone ? " last-known" : "");
  $("status").title = e.status_message || "";
  $("read-only").hidden = e.writable;
  $("read-only").textContent = "read-only";
  $("counts").textContent = Object.entries(e.trial_counts).map(([s, n]) => `${s} ${n}`).join(" · ") || "no trials yet";
  const maxTrials = e.config.maxTrialNumber;
  $("trial-budget").max = maxTrials || 1;
  $("trial-budget").value = maxTrials ? Math.min(e.trial_total, maxTrials) : 0;
  $("trial-budget-text").textContent = maxTrials ? `${e.trial_total} / ${maxTrials}` : `${e.trial_total} (no limit)`;
  const maxSeconds = e.config.maxExperimentDuration;
  // Running time, what maxExperimentDuration counts (elapsed_ms grows while it is stopped).
  const elapsed = e.running_ms / 1000;
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

const fmtTime = (ms) => (ms ? new Date(ms).toLocaleString() : "–");

function renderPanel() {
  const e = state.experiment;
  const config = e.config || {};
  const info = $("experiment-info");
  info.innerHTML = "";
  infoRow(info, "name", e.name || "–");
  infoRow(info, "id", e.id);
  infoRow(info, "status", e.status + (e.status_message ? ` (${e.status_message})` : ""));
  const tuner = config.tuner || {};
  infoRow(info, "tuner", (tuner.name || tuner.className || "–") + (tuner.classArgs ? " " + JSON.stringify(tuner.classArgs) : ""));
  if (config.assessor) infoRow(info, "assessor", (config.assessor.name || config.assessor.className) + (config.assessor.classArgs ? " " + JSON.stringify(config.assessor.classArgs) : ""));
  const services = Array.isArray(config.trainingService) ? config.trainingService : [config.trainingService || {}];
  infoRow(info, "platform", services.map((s) => s.platform || "?").join(", "));
  for (const service of services) {
    const rest = Object.fromEntries(Object.entries(service).filter(([k]) => k !== "platform"));
    if (Object.keys(rest).length) infoRow(info, service.platform + " settings", JSON.stringify(rest));
  }
  infoRow(info, "trial command", config.trialCommand || "–");
  infoRow(info, "started", fmtTime(e.start_time_ms));
  infoRow(info, "ended", ACTIVE.includes(e.status) ? "– (running)" : fmtTime(e.updated_ms));
  renderEnvironments();
  $("experiment-config").textContent = JSON.stringify(config, null, 2);
  // The control fields show the current settings, except one the user is editing.
  const fields = [["set-concurrency", config.trialConcurrency], ["set-max-trials", config.maxTrialNumber], ["set-max-duration", config.maxExperimentDuration]];
  for (const [id, value] of fields) if (document.activeElement !== $(id) && !$(id).dataset.edited) $(id).value = value === undefined || value === null ? "" : value;
  if (!$("set-search-space").dataset.edited) $("set-search-space").value = JSON.stringify(config.searchSpace || {}, null, 2);
}

// The platform's environments (GET /environments: as the running experiment sees them, or as
// the trials recorded them); asked for after the first paint, and again when the panel changes,
// at most every 5 seconds.
async function loadEnvironments() {
  if (state.environmentsLoading || (state.environmentsAt && Date.now() - state.environmentsAt < 5000)) return;
  state.environmentsLoading = true;
  try {
    state.environments = await api("/environments");
    state.environmentsAt = Date.now();
    renderEnvironments();
  } catch (error) {
    $("environments-note").textContent = `(${error.message})`;
  } finally {
    state.environmentsLoading = false;
  }
}

function renderEnvironments() {
  const answer = state.environments;
  const body = $("experiment-environments").tBodies[0];
  body.innerHTML = "";
  if (!answer) {
    $("environments-note").textContent = "(loading…)";
    return;
  }
  $("environments-note").textContent = answer.note ? `(${answer.note})` : "(live)";
  for (const env of answer.environments) {
    const row = body.insertRow();
    row.dataset.environment = env.id;
    row.insertCell().textContent = env.id;
    row.insertCell().textContent = env.platform || "–";
    row.insertCell().textContent = env.host || "–";
    const ready = row.insertCell();
    ready.textContent = env.ready === null ? "–" : env.ready ? "ready" : "not ready" + (env.why ? ": " + env.why : "");
    if (env.ready === false) ready.className = "not-ready";
    row.insertCell().textContent = `${env.trials}` + (env.running ? ` (${env.running} running)` : "");
  }
  if (!answer.environments.length) body.insertRow().insertCell().textContent = "none yet";
}

// The downloads go through fetch, so that a token travels in the header as for every request.
async function exportText(format) {
  const headers = token ? { Authorization: "Bearer " + token } : {};
  const response = await fetch(`${API}/export?format=${format}`, { headers });
  const text = await response.text();
  if (!response.ok) throw new Error(JSON.parse(text).error);
  return text;
}

async function download(format) {
  try {
    const text = await exportText(format);
    const link = document.createElement("a");
    link.href = URL.createObjectURL(new Blob([text], { type: format === "csv" ? "text/csv" : "application/json" }));
    link.download = `${state.experiment.id}.${format}`;
    link.click();
    setTimeout(() => URL.revokeObjectURL(link.href), 10000);
  } catch (error) {
    showError(error);
  }
}

// One PATCH /experiment per control; the answer (or the refusal) is shown beside it.
async function applyControl(field) {
  const shown = document.querySelector(`[data-error="${field}"]`);
  shown.className = "field-error";
  shown.textContent = "";
  let value;
  try {
    if (field === "trialConcurrency") value = Number($("set-concurrency").value);
    else if (field === "maxTrialNumber") value = Number($("set-max-trials").value);
    else if (field === "maxExperimentDuration") value = /^\s*\d+(\.\d+)?\s*$/.test($("set-max-duration").value) ? Number($("set-max-duration").value) : $("set-max-duration").value.trim();
    else value = parseSearchSpace($("set-search-space").value);
  } catch (error) {
    shown.textContent = error.message;
    return;
  }
  try {
    await api("/experiment", { method: "PATCH", body: JSON.stringify({ [field]: value }) });
    shown.className = "field-ok";
    shown.textContent = "applied";
    for (const id of ["set-concurrency", "set-max-trials", "set-max-duration", "set-search-space"]) delete $(id).dataset.edited;
    state.experimentDirty = true;
    state.panelDirty = true;
  } catch (error) {
    shown.textContent = error.message;
  }
}

// JSON.parse's message, with the line and column of its position.
function parseSearchSpace(text) {
  try {
    const value = JSON.parse(text);
    if (!value || typeof value !== "object" || Array.isArray(value)) throw new Error("the search space must be a JSON object of parameters");
    return value;
  } catch (error) {
    const at = /position (\d+)/.exec(error.message);
    if (!at) throw error;
    const before = text.slice(0, Number(at[1]));
    const line = before.split("\n").length;
    const column = before.length - before.lastIndexOf("\n");
    throw new Error(`line ${line}, column ${column}: ${error.message}`);
  }
}

// Enables or disables every control that changes the experiment, saying why when disabled.
function renderWriteControls() {
  const refusal = writeRefusal();
  const e = state.experiment;
  for (const control of document.querySelectorAll("#controls input, #controls button, #set-search-space, #apply-search-space")) {
    control.disabled = !!refusal;
    if (control.tagName === "BUTTON") control.title = refusal || "apply through PATCH /api/v1/experiment";
  }
  $("controls-reason").textContent = refusal ? `(disabled: ${refusal})` : "";
  $("stop").hidden = !e.writable;
  $("stop").disabled = !!refusal;
  $("stop").title = refusal || "stop the experiment (it can be resumed)";
  $("add-trial-open").hidden = !e.writable;
  $("add-trial-open").disabled = !!refusal;
  $("add-trial-open").title = refusal || "run a trial with parameters you give";
  for (const button of document.querySelectorAll("button.kill, #detail-kill")) {
    button.disabled = !!refusal;
    button.title = refusal || "kill this trial";
  }
}

// The table's columns: the fixed ones and one per parameter (at most MAX_PARAM_COLUMNS; the
// rest stay in a "more parameters" column).
const MAX_PARAM_COLUMNS = 24;
function paramNames() {
  const names = new Set();
  for (const t of state.trials.values()) for (const name of Object.keys(flatOf(t))) names.add(name);
  return [...names];
}

function renderTableHead(names) {
  const shown = names.slice(0, MAX_PARAM_COLUMNS);
  const key = JSON.stringify(names);
  if (state.headKey === key) return shown;
  state.headKey = key;
  const columns = [["", null], ["#", "sequence"], ["trial", "trial_id"], ["status", "status"], ["final", "final_value"], ["duration", "duration_ms"]]
    .concat(shown.map((n) => [n, "param:" + n]))
    .concat(names.length > shown.length ? [["more parameters", "parameters"]] : [])
    .concat([["reason", "end_message"], ["", null]]);
  const row = $("trials").tHead.rows[0];
  row.innerHTML = "";
  for (const [text, sortKey] of columns) {
    const th = row.appendChild(document.createElement("th"));
    th.textContent = text;
    if (!sortKey) { if (!text && row.cells.length === 1) th.className = "select"; continue; }
    th.dataset.key = sortKey;
    if (sortKey.startsWith("param:")) th.classList.add("param");
    th.onclick = () => {
      state.sort = { key: sortKey, desc: state.sort.key === sortKey ? !state.sort.desc : false };
      renderTable();
    };
  }
  return shown;
}

// Numbers sort as numbers, everything else as text; missing values last either way.
function compareValues(x, y) {
  const missing = (v) => v === null || v === undefined;
  if (missing(x) || missing(y)) return missing(x) === missing(y) ? 0 : missing(x) ? 1 : -1;
  if (typeof x === "number" && typeof y === "number") return x - y;
  const a = typeof x === "string" ? x : JSON.stringify(x), b = typeof y === "string" ? y : JSON.stringify(y);
  return a < b ? -1 : a > b ? 1 : 0;
}

function sortedFilteredTrials() {
  const text = $("filter").value.trim().toLowerCase();
  const status = $("status-filter").value;
  const { key, desc } = state.sort;
  const value = key.startsWith("param:") ? (t) => flatOf(t)[key.slice(6)] : key === "parameters" ? (t) => JSON.stringify(t.parameters) : (t) => t[key];
  const missing = (v) => v === null || v === undefined;
  return [...state.trials.values()]
    .filter((t) => !status || t.status === status)
    .filter((t) => !text || (t.trial_id + " " + JSON.stringify(t.parameters) + " " + (t.waiting_reason || t.end_message || "")).toLowerCase().includes(text))
    .sort((a, b) => {
      const x = value(a), y = value(b);
      // Missing values stay last in both directions.
      if (missing(x) !== missing(y)) return missing(x) ? 1 : -1;
      const order = compareValues(x, y) || a.sequence - b.sequence;
      return desc ? -order : order;
    });
}

const isRunning = (t) => t.status === "RUNNING" || t.status === "WAITING";

function renderTable() {
  const allNames = paramNames();
  const names = renderTableHead(allNames);
  const rest = allNames.slice(names.length);
  const rows = sortedFilteredTrials();
  // Until the whole list is in, the table holds the list's first page: the count says so.
  $("trial-count").textContent = state.partialTotal !== undefined
    ? `first ${rows.length} of ${state.partialTotal} (loading the rest…)`
    : `${rows.length} of ${state.trials.size}`;
  // Until the charts are drawn only the table's first TABLE_FIRST rows; afterCharts draws the
  // rest of its first page.
  const limit = state.firstPainted ? state.tableRows : Math.min(state.tableRows, TABLE_FIRST);
  const hidden = state.partialTotal !== undefined ? 0 : rows.length - limit;
  $("more-rows").hidden = hidden <= 0;
  $("more-rows").textContent = `show ${Math.min(TABLE_STEP, hidden)} more (${hidden} not shown)`;
  const body = document.createElement("tbody");
  for (const t of rows.slice(0, limit)) {
    const row = body.insertRow();
    row.dataset.trial = t.trial_id;
    const tick = row.insertCell();
    tick.className = "select";
    const box = tick.appendChild(document.createElement("input"));
    box.type = "checkbox";
    box.checked = state.selected.has(t.trial_id);
    box.title = "select for comparison";
    box.onclick = (event) => { event.stopPropagation(); toggleSelected(t.trial_id, box.checked); };
    row.insertCell().textContent = t.sequence;
    row.insertCell().textContent = t.trial_id;
    const status = row.insertCell().appendChild(document.createElement("span"));
    status.className = "badge " + t.status;
    status.textContent = t.status;
    row.insertCell().textContent = fmt(t.final_value);
    const duration = row.insertCell();
    duration.textContent = fmtDuration(t.duration_ms) + (isRunning(t) && t.duration_ms !== null ? " so far" : "");
    if (isRunning(t)) duration.className = "running-duration";
    const flat = flatOf(t);
    for (const name of names) {
      const cell = row.insertCell();
      cell.className = "param";
      cell.textContent = fmt(flat[name]);
    }
    if (rest.length) {
      const params = row.insertCell();
      params.className = "params";
      params.textContent = JSON.stringify(Object.fromEntries(rest.filter((n) => n in flat).map((n) => [n, flat[n]])));
    }
    // A waiting trial shows why it has not started (a cluster job's pending reason, say).
    row.insertCell().textContent = t.waiting_reason || t.end_message || "";
    const actions = row.insertCell();
    if (state.experiment.writable && isRunning(t)) {
      const kill = actions.appendChild(document.createElement("button"));
      kill.textContent = "kill";
      kill.className = "danger kill";
      kill.onclick = (event) => { event.stopPropagation(); killTrial(t.trial_id); };
    }
    row.onclick = () => openDetail(t.trial_id);
  }
  $("trials").replaceChild(body, $("trials").tBodies[0]);
  for (const th of $("trials").tHead.rows[0].cells) {
    if (!th.dataset.key) continue;
    th.classList.toggle("asc", th.dataset.key === state.sort.key && !state.sort.desc);
    th.classList.toggle("desc", th.dataset.key === state.sort.key && state.sort.desc);
  }
  renderWriteControls();
  renderSelection();
}

function toggleSelected(trialId, on) {
  if (on) state.selected.add(trialId);
  else state.selected.delete(trialId);
  for (const box of document.querySelectorAll(`#trials tr[data-trial="${CSS.escape(trialId)}"] td.select input`)) box.checked = on;
  renderSelection();
}

function renderSelection() {
  const n = state.selected.size;
  $("compare-open").disabled = n < 2;
  $("compare-open").textContent = n ? `Compare ${n}` : "Compare";
  $("compare-clear").hidden = n === 0;
  if (state.detail) $("detail-select").textContent = state.selected.has(state.detail) ? "Remove from comparison" : "Add to comparison";
}

async function openCompare() {
  const ids = [...state.selected].filter((id) => state.trials.has(id));
  if (ids.length === 0) return;
  setHash("compare", ids.join(","));
  if (!$("compare").open) $("compare").showModal();
  $("compare-count").textContent = String(ids.length);
  try {
    const trials = await Promise.all(ids.map((id) => api(`/trials/${encodeURIComponent(id)}`)));
    await loadEcharts();
    const rows = [["status", (t) => t.status], ["final", (t) => fmt(t.final_value)], ["duration", (t) => fmtDuration(t.duration_ms) + (isRunning(t) ? " so far" : "")]];
    const names = [...new Set(trials.flatMap((t) => Object.keys(flatParams(t.parameters))))];
    for (const name of names) rows.push([name, (t) => { const v = flatParams(t.parameters)[name]; return v === undefined ? "–" : typeof v === "string" ? v : JSON.stringify(v); }]);
    rows.push(["stop reason", (t) => t.end_message || ""]);
    const table = $("compare-table");
    table.innerHTML = "";
    const head = table.createTHead().insertRow();
    head.appendChild(document.createElement("th")).textContent = "trial";
    for (const t of trials) {
      const th = head.appendChild(document.createElement("th"));
      const link = th.appendChild(document.createElement("a"));
      link.href = "#trial=" + encodeURIComponent(t.trial_id);
      link.textContent = t.trial_id;
    }
    const body = table.createTBody();
    for (const [name, value] of rows) {
      const cells = trials.map(value);
      const row = body.insertRow();
      row.dataset.row = name;
      if (new Set(cells).size > 1) row.className = "diff";
      row.appendChild(document.createElement("th")).textContent = name;
      for (const cell of cells) row.insertCell().textContent = cell;
    }
    chart("chart-compare").setOption({
      animation: false, backgroundColor: chartBackground(), grid: GRID,
      tooltip: { trigger: "item", formatter: (p) => html`${p.seriesName}<br>report ${p.value[0]}: ${fmt(p.value[1])}` },
      legend: { data: ids, type: "scroll" },
      xAxis: { type: "value", name: "report", nameLocation: "middle", nameGap: 24, minInterval: 1, min: 1, max: (v) => Math.max(2, v.max) },
      yAxis: { type: "value", name: "intermediate result", scale: true },
      series: trials.map((t) => ({ name: t.trial_id, type: "line", emphasis: { focus: "series" },
        data: t.metrics.filter((m) => m.kind === "intermediate").map((m, i) => [i + 1, m.value]) })),
    }, true);
  } catch (error) {
    showError(error);
  }
}

const charts = {};
// The trial id of each data item, by chart and then by series index: the big charts take plain
// arrays (one object per point costs ECharts several times more at 10 000 trials, most of the
// first paint), so a click or a tooltip finds its trial by the item's index.
const itemIds = {};
const itemId = (id, params) => {
  const ids = itemIds[id] && itemIds[id][params.seriesIndex];
  return ids ? ids[params.dataIndex] : (params.data && params.data.name);
};
function chart(id) {
  if (!charts[id]) {
    charts[id] = echarts.init($(id), darkMode() ? "dark" : null);
    // Clicking a point, a bar or a curve opens its trial (a data item's trial is in itemIds or
    // its name; a curve's series is named by its trial id).
    if (id !== "chart-detail" && id !== "chart-compare") charts[id].on("click", (params) => {
      const trialId = itemId(id, params) || (params.seriesType === "line" && state.trials.has(params.seriesName) ? params.seriesName : null);
      if (!trialId || !state.trials.has(trialId)) return;
      const event = params.event && params.event.event;
      // Shift- (or Ctrl-, Cmd-) click ticks the trial for comparison instead of opening it.
      if (event && (event.shiftKey || event.ctrlKey || event.metaKey)) toggleSelected(trialId, !state.selected.has(trialId));
      else openDetail(trialId);
    });
  }
  return charts[id];
}

// An axis of trial numbers: whole numbers only, with a trial's width of room at both ends so
// that a point or a bar at the first or last trial stays inside the plot (the labels of that
// room, trial -1 and one past the last, are not drawn).
const trialAxis = () => ({
  type: "value", name: "trial #", nameLocation: "middle", nameGap: 24, minInterval: 1,
  min: (v) => Math.floor(v.min) - 1, max: (v) => Math.ceil(v.max) + 1,
  axisLabel: { showMinLabel: false, showMaxLabel: false },
});
// A value axis that stays at the plot's left edge (not at trial 0).
const valueAxis = (extra) => Object.assign({ type: "value", axisLine: { onZero: false } }, extra);
const GRID = { left: 12, right: 24, top: 40, bottom: 32, containLabel: true };
const chartBackground = () => (darkMode() ? "transparent" : null);

function renderCharts() {
  const trials = [...state.trials.values()].sort((a, b) => a.sequence - b.sequence);
  const finished = trials.filter((t) => t.final_value !== null && t.final_value !== undefined);
  // The best-so-far line holds a point only where the best changes, and one at the last trial
  // (a step line through those draws the same as one point per trial, at a few dozen points
  // instead of 10 000).
  // Only trials that rank count toward the best (a final from a trial that then failed does not).
  let best = null;
  let bestTrial = null;
  const bestLine = [];
  for (const t of finished) {
    if (ranks(t) && (bestTrial === null || bestFirst(t, bestTrial) < 0)) {
      best = t.final_value;
      bestTrial = t;
      bestLine.push([t.sequence, best]);
    }
  }
  if (bestLine.length && bestLine[bestLine.length - 1][0] !== finished[finished.length - 1].sequence) {
    bestLine.push([finished[finished.length - 1].sequence, best]);
  }
  let start = performance.now();
  const measure = (name) => {
    if (!state.rendered) performance.measure("knob-chart-" + name, { start });
    start = performance.now();
  };
  itemIds["chart-final"] = [null, finished.map((t) => t.trial_id), bestTrial ? [bestTrial.trial_id] : []];
  chart("chart-final").setOption({
    animation: false,
    backgroundColor: chartBackground(),
    tooltip: { trigger: "item", formatter: (p) => itemId("chart-final", p) ? html`${itemId("chart-final", p)}<br>trial #${p.value[0]}: ${fmt(p.value[1])}` : "" },
    legend: { data: ["final", "best so far", "best"] },
    grid: GRID,
    xAxis: trialAxis(),
    yAxis: valueAxis({ scale: true }),
    // The line first and the best point last, so the point is drawn over the line.
    series: [
      { name: "best so far", type: "line", step: "end", showSymbol: false, z: 1, data: bestLine, silent: true },
      { name: "final", type: "scatter", symbolSize: 6, large: finished.length > 2000, z: 2, data: finished.map((t) => [t.sequence, t.final_value]) },
      { name: "best", type: "scatter", symbol: "diamond", symbolSize: 13, z: 3, itemStyle: { color: "#f59e0b", borderColor: "#1d2330", borderWidth: 1 },
        data: bestTrial ? [[bestTrial.sequence, bestTrial.final_value]] : [] },
    ],
  }, true);

  measure("final");
  const names = [...new Set(finished.flatMap((t) => Object.keys(flatOf(t))))].slice(0, 30);
  const categorical = names.map((n) => finished.some((t) => typeof flatOf(t)[n] !== "number"));
  const axes = names.map((name, i) => categorical[i]
    ? { dim: i, name, type: "category", data: [...new Set(finished.map((t) => String(flatOf(t)[name])))] }
    : { dim: i, name, type: "value", scale: true });
  axes.push({ dim: names.length, name: "metric", type: "value", scale: true });
  const values = finished.map((t) => t.final_value);
  const low = values.length ? Math.min(...values) : 0;
  const high = values.length ? Math.max(...values) : 1;
  itemIds["chart-parallel"] = [finished.map((t) => t.trial_id)];
  chart("chart-parallel").setOption({
    animation: false,
    backgroundColor: chartBackground(),
    parallelAxis: axes,
    // Room on the right for the colour scale, which sits apart from the metric axis's labels.
    parallel: { left: 40, right: 175, bottom: 30, top: 40 },
    visualMap: { show: true, min: low, max: high === low ? low + 1 : high, dimension: names.length, precision: 6,
      formatter: (v) => fmt(Number(v)), text: [maximize() ? "best" : "worst", maximize() ? "worst" : "best"], textGap: 6,
      inRange: { color: maximize() ? ["#d73027", "#fee090", "#4575b4"] : ["#4575b4", "#fee090", "#d73027"] }, right: 8, align: "left", top: "middle", calculable: true, itemHeight: 120 },
    series: [{ type: "parallel", lineStyle: { width: 1, opacity: 0.6 }, data: finished.map((t) => {
      const p = flatOf(t);
      return names.map((n, i) => (categorical[i] ? String(p[n]) : p[n])).concat([t.final_value]);
    }) }],
  }, true);

  measure("parallel");
  renderIntermediate();
  measure("intermediate");
  // After the first paint only: importance (a forest fitted on the server) and the slice plot
  // (one point per finished trial) are not part of it.
  if (state.firstPainted) {
    if (state.sliceVisible) renderSlice();
    if (finished.length !== state.importanceFinished) loadImportance(finished.length);
    if (hasObjectives() && finished.length !== state.paretoFinished) loadPareto(finished.length);
  }

  const timed = trials.filter((t) => t.duration_ms !== null && t.duration_ms !== undefined);
  const bar = (t) => [t.sequence, t.duration_ms / 1000];
  const done = timed.filter((t) => !isRunning(t));
  const running = timed.filter(isRunning);
  itemIds["chart-duration"] = [done.map((t) => t.trial_id), running.map((t) => t.trial_id)];
  chart("chart-duration").setOption({
    animation: false,
    backgroundColor: chartBackground(),
    tooltip: { trigger: "item", formatter: (p) => html`${itemId("chart-duration", p)}<br>${fmtDuration(p.value[1] * 1000)}${p.seriesName === "running (so far)" ? " so far" : ""}` },
    legend: { data: ["finished", "running (so far)"] },
    grid: GRID,
    xAxis: trialAxis(),
    yAxis: valueAxis({ name: "seconds" }),
    series: [
      { name: "finished", type: "bar", large: timed.length > 2000, barMaxWidth: 14, data: done.map(bar) },
      { name: "running (so far)", type: "bar", barMaxWidth: 14, barGap: "-100%", itemStyle: { color: "rgba(245, 158, 11, 0.45)", borderColor: "#d97706", borderType: "dashed", borderWidth: 1 }, data: running.map(bar) },
    ],
  }, true);
  measure("duration");
}

// Importance comes from the server (GET /importance, fANOVA in Rust); asked again when the
// number of finished trials changed, at most every 10 seconds.
async function loadImportance(finishedCount) {
  const now = Date.now();
  if (state.importanceLoading || (state.importanceAt && now - state.importanceAt < 10000)) return;
  state.importanceLoading = true;
  try {
    const answer = await api("/importance");
    state.importance = answer;
    state.importanceFinished = finishedCount;
    state.importanceAt = now;
    renderImportance();
    if (state.sliceVisible) renderSlice();
  } catch (error) {
    $("importance-note").textContent = `(${error.message})`;
  } finally {
    state.importanceLoading = false;
  }
}

function renderImportance() {
  const answer = state.importance;
  if (!answer) return;
  const params = [...answer.parameters].reverse(); // the most important at the top
  $("importance-note").textContent = answer.note ? `(${answer.note})` : `(${answer.trials} trials)`;
  $("importance-method").textContent = answer.method + (answer.skipped.length ? ". Left out: " + answer.skipped.map((s) => `${s.name} (${s.reason})`).join("; ") : "");
  chart("chart-importance").setOption({
    animation: false, backgroundColor: chartBackground(),
    grid: Object.assign({}, GRID, { top: 10, right: 64 }),
    tooltip: { trigger: "item", formatter: (p) => html`${p.name}: ${(p.value * 100).toFixed(1)}%` },
    xAxis: { type: "value", min: 0, max: 1, name: "share of the final's variance", nameLocation: "middle", nameGap: 24 },
    yAxis: { type: "category", data: params.map((p) => p.name) },
    series: [{ type: "bar", barMaxWidth: 22, data: params.map((p) => p.importance),
      label: { show: true, position: "right", formatter: (p) => `${(p.value * 100).toFixed(1)}%` } }],
  }, true);
}

// One parameter against the final result, one point per finished trial (the most important
// parameter first until the user picks another).
function renderSlice() {
  const names = paramNames();
  const select = $("slice-param");
  if (select.options.length !== names.length || [...select.options].some((o, i) => o.value !== names[i])) {
    const chosen = select.value;
    select.innerHTML = "";
    for (const name of names) select.add(new Option(name, name));
    select.value = names.includes(chosen) ? chosen : names[0] || "";
  }
  if (!state.sliceChosen && state.importance && state.importance.parameters.length) select.value = state.importance.parameters[0].name;
  const name = select.value;
  const finished = [...state.trials.values()].filter((t) => typeof t.final_value === "number" && name in flatOf(t));
  const numeric = finished.every((t) => typeof flatOf(t)[name] === "number");
  const searchSpace = state.experiment.config.searchSpace || {};
  const space = (Object.hasOwn(searchSpace, name) && searchSpace[name]) || {};
  const log = numeric && /log/.test(space._type || "") && finished.every((t) => flatOf(t)[name] > 0);
  chart("chart-slice").setOption({
    animation: false, backgroundColor: chartBackground(), grid: GRID,
    tooltip: { trigger: "item", formatter: (p) => html`${p.data.name}<br>${name} = ${fmt(p.value[0])}<br>final ${fmt(p.value[1])}` },
    xAxis: numeric ? { type: log ? "log" : "value", name, nameLocation: "middle", nameGap: 24, scale: true }
      : { type: "category", name, nameLocation: "middle", nameGap: 24, data: [...new Set(finished.map((t) => String(flatOf(t)[name])))] },
    yAxis: valueAxis({ name: "final", scale: true }),
    visualMap: { show: false, dimension: 2, min: 0, max: Math.max(1, ...finished.map((t) => t.sequence)), inRange: { colorLightness: [0.75, 0.35] } },
    series: [{ type: "scatter", symbolSize: 7, large: finished.length > 2000,
      data: finished.map((t) => ({ value: [numeric ? flatOf(t)[name] : String(flatOf(t)[name]), t.final_value, t.sequence], name: t.trial_id })) }],
  }, true);
}

// Multi-objective experiments (the knob extension `objectives`): GET /pareto gives each succeeded
// trial's listed metrics, feasibility and place on the front, the reference point and the
// hypervolume after each trial. Asked after the first paint, again when the number of finished
// trials changed, at most every 2 seconds (a change inside that window is fetched at its end).
const hasObjectives = () => !!state.experiment && ((state.experiment.config || {}).objectives || []).length > 0;
const PARETO_EVERY_MS = 2000;
async function loadPareto(finishedCount) {
  if (!hasObjectives()) return;
  const wait = state.paretoAt ? state.paretoAt + PARETO_EVERY_MS - Date.now() : 0;
  if (state.paretoLoading || wait > 0) {
    if (!state.paretoRetry) state.paretoRetry = setTimeout(() => {
      state.paretoRetry = null;
      loadPareto(state.paretoWanted);
    }, Math.max(wait, 200));
    state.paretoWanted = finishedCount;
    return;
  }
  state.paretoLoading = true;
  try {
    state.paretoAt = Date.now();
    state.pareto = await api("/pareto");
    state.paretoFinished = finishedCount;
    renderPareto();
  } catch (error) {
    $("pareto-note").textContent = `(${error.message})`;
  } finally {
    state.paretoLoading = false;
  }
}

// A metric's label on an axis: its name and what is better.
function objectiveLabel(o) {
  if (o.constraint) return `${o.metric} (constraint ${o.constraint})`;
  return `${o.metric} (${o.mode === "maximize" ? "max" : "min"})`;
}

// Two chosen metrics against each other, the feasible non-dominated trials highlighted (the
// front is over every objective: with three or more, a front point may look dominated in the
// two drawn), and the hypervolume after each trial in the order they ended.
function renderPareto() {
  const answer = state.pareto;
  if (!answer || !answer.objectives.length) return;
  $("pareto-card").hidden = false;
  $("hypervolume-card").hidden = false;
  const objectives = answer.objectives;
  for (const [id, fallback] of [["pareto-x", 0], ["pareto-y", 1]]) {
    const select = $(id);
    if (select.options.length !== objectives.length) {
      select.innerHTML = "";
      objectives.forEach((o, i) => select.add(new Option(objectiveLabel(o), String(i))));
      // The first two objectives (constraints only when there are not two).
      const goals = objectives.map((o, i) => (o.constraint ? null : i)).filter((i) => i !== null);
      const others = objectives.map((o, i) => i).filter((i) => !goals.includes(i));
      select.value = String([...goals, ...others][fallback] ?? 0);
    }
  }
  const x = Number($("pareto-x").value);
  const y = Number($("pareto-y").value);
  const drawn = answer.trials.filter((t) => typeof t.values[x] === "number" && typeof t.values[y] === "number");
  const front = drawn.filter((t) => t.pareto);
  const feasible = drawn.filter((t) => t.feasible && !t.pareto);
  const infeasible = drawn.filter((t) => !t.feasible);
  const point = (t) => [t.values[x], t.values[y]];
  const goals = objectives.filter((o) => !o.constraint).length;
  // A trial with a metric NaN or infinite is never on the front, whatever it meets.
  const incomplete = answer.trials.filter((t) => t.complete === false).length;
  $("pareto-note").textContent = `(${front.length} of ${answer.trials.length} on the front` + (infeasible.length ? `, ${infeasible.length} infeasible` : "") + (incomplete ? `, ${incomplete} with a metric NaN or infinite` : "") + (goals > 2 ? `; front over all ${goals} objectives` : "") + ")";
  // With exactly two objectives on the axes the front is a staircase: drawn as one.
  const staircase = goals === 2 && !objectives[x].constraint && !objectives[y].constraint && x !== y;
  const sortedFront = [...front].sort((a, b) => a.values[x] - b.values[x]);
  itemIds["chart-pareto"] = [feasible.map((t) => t.trial_id), infeasible.map((t) => t.trial_id), front.map((t) => t.trial_id)];
  chart("chart-pareto").setOption({
    animation: false, backgroundColor: chartBackground(), grid: GRID,
    legend: { data: ["trials", "infeasible", "Pareto front"] },
    tooltip: { trigger: "item", formatter: (p) => {
      const id = itemId("chart-pareto", p);
      return id ? html`${id}<br>${objectives[x].metric} = ${fmt(p.value[0])}<br>${objectives[y].metric} = ${fmt(p.value[1])}` : "";
    } },
    xAxis: valueAxis({ name: objectiveLabel(objectives[x]), nameLocation: "middle", nameGap: 24, scale: true }),
    yAxis: valueAxis({ name: objectiveLabel(objectives[y]), scale: true }),
    series: [
      { name: "trials", type: "scatter", symbolSize: 6, z: 2, large: feasible.length > 2000, data: feasible.map(point) },
      { name: "infeasible", type: "scatter", symbol: "triangle", symbolSize: 6, z: 1, itemStyle: { color: "#9ca3af" }, data: infeasible.map(point) },
      { name: "Pareto front", type: "scatter", symbol: "diamond", symbolSize: 12, z: 4, itemStyle: { color: "#f59e0b", borderColor: "#1d2330", borderWidth: 1 }, data: front.map(point) },
      { name: "front line", type: "line", step: objectives[x].mode === objectives[y].mode ? "end" : "start", silent: true, showSymbol: false, z: 3,
        lineStyle: { color: "#f59e0b", width: 1.5 }, data: staircase ? sortedFront.map(point) : [] },
    ],
  }, true);
  const history = answer.hypervolume;
  itemIds["chart-hypervolume"] = [history.map((h) => h.trial_id)];
  chart("chart-hypervolume").setOption({
    animation: false, backgroundColor: chartBackground(), grid: GRID,
    tooltip: { trigger: "item", formatter: (p) => html`${itemId("chart-hypervolume", p)}<br>after ${p.value[0]} trials: ${fmt(p.value[1])}` },
    xAxis: { type: "value", name: "succeeded trials, in the order they ended", nameLocation: "middle", nameGap: 24, minInterval: 1, min: 1, max: (v) => Math.max(2, v.max) },
    yAxis: valueAxis({ name: "hypervolume", scale: true }),
    series: [{ name: "hypervolume", type: "line", step: "end", symbolSize: 4, showSymbol: history.length <= 200, data: history.map((h, i) => [i + 1, h.hypervolume]) }],
  }, true);
  const configured = objectives.filter((o) => !o.constraint).every((o) => typeof o.reference === "number");
  $("hypervolume-reference").textContent = answer.reference
    ? "reference point: " + objectives.filter((o) => !o.constraint).map((o, i) => `${o.metric} = ${fmt(answer.reference[i])}`).join(", ") +
      (configured ? " (from the config's objectives)" : " (the worst values seen, pushed out by a tenth of the range; set each objective's reference in the config to fix it)")
    : "no feasible trial yet";
}

function renderCurveControls() {
  const total = startedTrials().length;
  const select = $("curve-count");
  const options = CURVE_COUNTS.filter((n) => n < total).map((n) => [n, `${n}`]).concat([[0, `all (${total})`]]);
  if (state.curveCount && !CURVE_COUNTS.includes(state.curveCount)) state.curveCount = 0;
  select.innerHTML = "";
  for (const [value, text] of options) select.add(new Option(text, String(value)));
  select.value = String(state.curveCount && state.curveCount < total ? state.curveCount : 0);
  $("curve-better-text").textContent = maximize() ? "final ≥" : "final ≤";
}

function renderIntermediate() {
  const total = startedTrials().length;
  if ($("curve-count").options.length === 0 || !$("curve-count").options[$("curve-count").options.length - 1].text.endsWith(`(${total})`)) renderCurveControls();
  const shown = curveTrials().filter((t) => state.complete.has(t.trial_id) || !state.snapshotTrials.has(t.trial_id));
  const drawn = shown.filter((t) => state.curves.has(t.trial_id));
  const threshold = state.curveBetter === null ? "" : `, final ${maximize() ? "≥" : "≤"} ${fmt(state.curveBetter)}`;
  $("curve-shown").textContent = `${shown.length} of ${total} trials` + (state.curveMode === "best" ? " (best by final)" : "") + threshold;
  const values = drawn.flatMap((t) => state.curves.get(t.trial_id).points.map((p) => p[1])).filter((v) => typeof v === "number");
  const logPossible = values.length > 0 && values.every((v) => v > 0);
  $("curve-log").disabled = !logPossible;
  $("curve-log").parentElement.title = logPossible ? "a logarithmic value axis" : "a log scale needs every value above 0";
  const log = state.curveLog && logPossible;
  chart("chart-intermediate").setOption({
    animation: false,
    backgroundColor: chartBackground(),
    tooltip: { trigger: "item", formatter: (p) => html`${p.seriesName}${isRunning(state.trials.get(p.seriesName) || {}) ? " (running)" : ""}<br>report ${p.value[0]}: ${fmt(p.value[1])}` },
    grid: GRID,
    xAxis: { type: "value", name: "report", nameLocation: "middle", nameGap: 24, minInterval: 1, min: 1, max: (v) => Math.max(2, v.max) },
    yAxis: log ? { type: "log", name: "value (log)" } : { type: "value", name: "value", scale: true },
    // Hovering a curve dims the others; running trials are dashed.
    series: drawn.map((t) => {
      const running = isRunning(t);
      return {
        name: t.trial_id, type: "line", showSymbol: state.curves.get(t.trial_id).points.length < 2, symbolSize: 4,
        lineStyle: { width: running ? 2 : 1.2, type: running ? "dashed" : "solid" },
        emphasis: { focus: "series", lineStyle: { width: 3 } }, blur: { lineStyle: { opacity: 0.15 } },
        triggerLineEvent: true,
        data: state.curves.get(t.trial_id).points.map((p, i) => [i + 1, p[1]]),
      };
    }),
  }, true);
}

// Draws the curves the controls ask for, loading those not loaded yet first.
async function changeCurves() {
  state.curveMode = $("curve-mode").value;
  state.curveCount = Number($("curve-count").value);
  state.curveLog = $("curve-log").checked;
  const threshold = $("curve-better").value.trim();
  state.curveBetter = threshold === "" || !Number.isFinite(Number(threshold)) ? null : Number(threshold);
  $("curve-better").classList.toggle("invalid", threshold !== "" && state.curveBetter === null);
  try {
    $("curve-shown").textContent = "loading…";
    await loadCurves(curveTrials().map((t) => t.trial_id));
  } catch (error) {
    showError(error);
  }
  renderIntermediate();
}

async function openDetail(trialId) {
  state.detail = trialId;
  setHash("trial", trialId);
  if ($("compare").open) $("compare").close();
  if (!$("detail").open) $("detail").showModal();
  renderSelection();
  await renderDetail(trialId, true);
}

function infoRow(table, name, value) {
  const row = table.insertRow();
  row.appendChild(document.createElement("th")).textContent = name;
  row.insertCell().textContent = value;
}

async function renderDetail(trialId, withLog) {
  try {
    // A trial opened from the table before the charts are drawn waits for the chart library.
    const [t] = await Promise.all([api(`/trials/${encodeURIComponent(trialId)}`), loadEcharts()]);
    $("detail-id").textContent = t.trial_id;
    $("detail-status").textContent = t.status;
    $("detail-status").className = "badge " + t.status;
    $("detail-kill").hidden = !(state.experiment.writable && isRunning(t));
    const info = $("detail-info");
    info.innerHTML = "";
    for (const [name, value] of Object.entries(flatParams(t.parameters))) infoRow(info, name, typeof value === "string" ? value : JSON.stringify(value));
    const final = t.metrics.find((m) => m.kind === "final");
    infoRow(info, "final", final ? (typeof final.value === "number" ? fmt(final.value) : final.raw) : isRunning(t) ? "– (running)" : "–");
    infoRow(info, "duration", fmtDuration(t.duration_ms) + (isRunning(t) && t.duration_ms !== null ? " so far" : ""));
    infoRow(info, "attempts", String(t.attempts));
    if (t.exit_code !== null && t.exit_code !== undefined) infoRow(info, "exit code", String(t.exit_code));
    if (t.signal !== null && t.signal !== undefined) infoRow(info, "signal", String(t.signal));
    if (t.waiting_reason) infoRow(info, "waiting", t.waiting_reason);
    if (t.end_message) infoRow(info, "stop reason", t.end_message);
    else if (t.waiting_reason) infoRow(info, "waiting", t.waiting_reason);
    if (t.gpu_indices && t.gpu_indices.length) infoRow(info, "GPUs", t.gpu_indices.join(", "));
    if (t.lineage) renderLineage(info, t);
    const intermediate = t.metrics.filter((m) => m.kind === "intermediate");
    chart("chart-detail").setOption({
      animation: false, backgroundColor: chartBackground(), grid: GRID,
      xAxis: { type: "value", name: "report", nameLocation: "middle", nameGap: 24, minInterval: 1, min: 1, max: (v) => Math.max(2, v.max) },
      yAxis: { type: "value", name: "intermediate result", scale: true },
      tooltip: { trigger: "axis" },
      series: [{ type: "line", name: t.trial_id, data: intermediate.map((m, i) => [i + 1, m.value]) }],
    }, true);
    if (withLog) await showLog(trialId, "stdout");
    renderWriteControls();
  } catch (error) {
    showError(error);
  }
}

// A population member (PBT): links to the member it was cloned from and the one it replaced, and
// the schedule of its parameters over time (each ancestor from the step it took over).
function renderLineage(info, t) {
  const link = (name, id, note) => {
    const row = info.insertRow();
    row.appendChild(document.createElement("th")).textContent = name;
    const cell = row.insertCell();
    const a = cell.appendChild(document.createElement("a"));
    a.href = "#";
    a.className = "lineage-link";
    a.textContent = id;
    a.onclick = (event) => { event.preventDefault(); openDetail(id); };
    if (note) cell.append(note);
  };
  if (t.lineage.parent) link("cloned from", t.lineage.parent, t.lineage.parent_step != null ? ` at step ${t.lineage.parent_step}` : "");
  if (t.lineage.replaces) link("replaces", t.lineage.replaces, "");
  if (!t.schedule || t.schedule.length < 1) return;
  const row = info.insertRow();
  row.appendChild(document.createElement("th")).textContent = "schedule";
  const table = row.insertCell().appendChild(document.createElement("table"));
  table.className = "schedule";
  const names = Object.keys(flatParams(t.schedule[t.schedule.length - 1].parameters || {}));
  const head = table.createTHead().insertRow();
  for (const name of ["from step", "trial", ...names]) head.appendChild(document.createElement("th")).textContent = name;
  for (const stage of t.schedule) {
    const r = table.insertRow();
    r.insertCell().textContent = String(stage.from_step);
    r.insertCell().textContent = stage.trial_id;
    const flat = flatParams(stage.parameters || {});
    for (const name of names) r.insertCell().textContent = typeof flat[name] === "number" ? fmt(flat[name]) : String(flat[name] ?? "–");
  }
}

async function showLog(trialId, name) {
  const trial = state.trials.get(trialId);
  $("detail-log-name").textContent = `${name} of trial ${trialId}` + (trial && trial.attempts > 1 ? `, attempt ${trial.attempts}` : "");
  for (const button of document.querySelectorAll("[data-log]")) button.classList.toggle("active", button.dataset.log === name);
  try {
    const headers = token ? { Authorization: "Bearer " + token } : {};
    const response = await fetch(`${API}/trials/${encodeURIComponent(trialId)}/logs/${name}?tail=200000`, { headers });
    const text = await response.text();
    $("detail-log").textContent = response.ok ? text || "(empty)" : `(${JSON.parse(text).error})`;
  } catch (error) {
    $("detail-log").textContent = String(error);
  }
}

async function killTrial(trialId) {
  try {
    const answer = await api(`/trials/${encodeURIComponent(trialId)}/kill`, { method: "POST" });
    // 202: nothing reached the trial yet (its host cannot be reached); knob kills it when the
    // host answers. Said until the trial is shown ended, so that a click is not taken as done.
    if (answer && answer.pending) state.pendingKills.set(trialId, answer.message);
    state.dirtyTrials.add(trialId);
    renderPendingKills();
  } catch (error) {
    showError(error);
  }
}

function renderPendingKills() {
  for (const id of [...state.pendingKills.keys()]) {
    const t = state.trials.get(id);
    if (t && !isRunning(t)) state.pendingKills.delete(id);
  }
  const notice = $("notice");
  notice.hidden = state.pendingKills.size === 0;
  notice.textContent = [...state.pendingKills].map(([id, message]) => `trial ${id}: ${message}`).join(" · ");
}

function wire() {
  for (const s of STATUSES) $("status-filter").add(new Option(s, s));
  $("filter").oninput = renderTable;
  $("more-rows").onclick = () => { state.tableRows += TABLE_STEP; renderTable(); };
  $("status-filter").onchange = renderTable;
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
  $("detail").addEventListener("close", () => {
    state.detail = null;
    if (hashParams().has("trial")) setHash(null);
  });
  $("compare").addEventListener("close", () => { if (hashParams().has("compare")) setHash(null); });
  $("compare-open").onclick = openCompare;
  $("download-csv").onclick = (event) => { event.preventDefault(); download("csv"); };
  $("download-json").onclick = (event) => { event.preventDefault(); download("json"); };
  $("download-csv").href = API + "/export?format=csv";
  $("download-json").href = API + "/export?format=json";
  $("controls").onsubmit = (event) => event.preventDefault();
  for (const button of document.querySelectorAll("[data-field]")) {
    button.onclick = (event) => { event.preventDefault(); applyControl(button.dataset.field); };
  }
  for (const id of ["set-concurrency", "set-max-trials", "set-max-duration", "set-search-space"]) {
    $(id).addEventListener("input", () => { $(id).dataset.edited = "1"; });
  }
  $("compare-clear").onclick = () => { state.selected.clear(); renderTable(); };
  $("detail-select").onclick = () => toggleSelected(state.detail, !state.selected.has(state.detail));
  window.addEventListener("popstate", applyHash);
  window.addEventListener("hashchange", applyHash);
  window.addEventListener("resize", () => Object.values(charts).forEach((c) => c.resize()));
  $("curve-mode").onchange = changeCurves;
  $("slice-param").onchange = () => { state.sliceChosen = true; renderSlice(); };
  $("pareto-x").onchange = renderPareto;
  $("pareto-y").onchange = renderPareto;
  $("curve-count").onchange = changeCurves;
  $("curve-log").onchange = changeCurves;
  $("curve-better").onchange = changeCurves;
  $("theme").onclick = () => {
    localStorage.setItem("knob-theme", darkMode() ? "light" : "dark");
    applyTheme();
  };
  matchMedia("(prefers-color-scheme: dark)").addEventListener("change", applyTheme);
  applyTheme();
}

// Dark mode: the system's setting until the toggle chooses (remembered in this browser).
function darkMode() {
  const chosen = localStorage.getItem("knob-theme");
  return chosen ? chosen === "dark" : matchMedia("(prefers-color-scheme: dark)").matches;
}

function applyTheme() {
  const chosen = localStorage.getItem("knob-theme");
  if (chosen) document.documentElement.dataset.theme = chosen;
  else delete document.documentElement.dataset.theme;
  $("theme").textContent = darkMode() ? "☀ light" : "☾ dark";
  // ECharts takes its theme at creation: charts are made again in the new one.
  const redraw = Object.keys(charts).length > 0;
  for (const id of Object.keys(charts)) {
    charts[id].dispose();
    delete charts[id];
  }
  if (redraw && state.experiment) {
    render();
    renderImportance();
    renderPareto();
  }
}

// The chart library, loaded after the first paint (1 MB of script to parse and run); resolves
// once `echarts` is defined.
let echartsLoading = null;
function loadEcharts() {
  if (!echartsLoading) echartsLoading = new Promise((resolve, reject) => {
    if (window.echarts) return resolve();
    const script = document.createElement("script");
    script.src = "/assets/echarts.min.js";
    script.addEventListener("load", () => resolve());
    script.addEventListener("error", () => reject(new Error("cannot load the chart library (/assets/echarts.min.js): reload the page")));
    document.head.appendChild(script);
  });
  return echartsLoading;
}

// The frame after the DOM changes made so far: the rAF callback runs just before that frame is
// painted.
const nextFrame = () => new Promise((resolve) => requestAnimationFrame(() => resolve(performance.now())));

// What waits until the charts are drawn: the table past its first rows, importance, the
// environments, and the slice plot, which is drawn when its card is on screen.
function afterCharts() {
  state.firstPainted = true;
  if (state.trials.size > TABLE_FIRST) renderTable();
  const finished = [...state.trials.values()].filter((t) => typeof t.final_value === "number").length;
  loadImportance(finished);
  loadPareto(finished);
  loadEnvironments();
  new IntersectionObserver((entries) => {
    const visible = entries.some((e) => e.isIntersecting);
    if (visible && !state.sliceVisible) {
      state.sliceVisible = true;
      renderSlice();
    }
  }).observe($("chart-slice"));
}

// The first paint: the overview and the table's first rows, from `/experiment` and the trial
// list's first page. What benches/ measures (`__knobFirstPaint`); it also notes what that frame
// held. The experiment's panel comes right after it: its dates are the page's first
// `toLocaleString`, whose locale data cost 0.1-0.3 s on a loaded machine.
async function firstPaint() {
  const [experiment, page] = await Promise.all([early.experiment, early.firstPage]);
  state.experiment = experiment;
  for (const t of trialsFromColumns(page)) state.trials.set(t.trial_id, t);
  state.partialTotal = page.total;
  timed("overview", renderOverview);
  timed("table", renderTable);
  renderConnection();
  const at = await nextFrame();
  performance.mark("knob-first-paint");
  window.__knobFirstPaint = at;
  window.__knobFirstPaintHeld = {
    rows: document.querySelectorAll("#trials tbody tr").length,
    counts: $("counts").textContent,
    charts: Object.keys(charts).length,
  };
}

async function main() {
  wire();
  try {
    await firstPaint();
    timed("panel", renderPanel);
    // Then ECharts, the whole trial list and the latest curves, and every chart.
    const library = loadEcharts();
    library.catch(() => {});
    await loadSnapshot();
    delete state.partialTotal;
    performance.mark("knob-snapshot-loaded");
    await library;
    render();
    state.rendered = true;
    window.__knobChartsDrawn = await nextFrame();
    performance.mark("knob-charts-drawn");
    setTimeout(afterCharts, 0);
    await applyHash();
  } catch (error) {
    showError(error);
  }
  follow();
  setInterval(refresh, 1000);
}

main();
