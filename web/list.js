// `knob view` with no id: every experiment of the registry, each opening its dashboard
// (read-only) under /e/ID/.
"use strict";

const $ = (id) => document.getElementById(id);
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
const fmt = (v) => (v === null || v === undefined ? "–" : typeof v === "number" ? (Number.isInteger(v) ? String(v) : String(Number(v.toPrecision(6)))) : String(v));

// The same theme choice as the dashboards' (one key in this browser's storage).
function applyTheme() {
  const chosen = localStorage.getItem("knob-theme");
  if (chosen) document.documentElement.dataset.theme = chosen;
  else delete document.documentElement.dataset.theme;
  const dark = chosen ? chosen === "dark" : matchMedia("(prefers-color-scheme: dark)").matches;
  $("theme").textContent = dark ? "☀ light" : "☾ dark";
  return dark;
}

async function load() {
  try {
    const headers = token ? { Authorization: "Bearer " + token } : {};
    const response = await fetch("/api/v1/experiments", { headers, cache: "no-store" });
    const body = await response.json();
    if (!response.ok) throw new Error(body.error || response.statusText);
    render(body.experiments);
    $("error").hidden = true;
  } catch (error) {
    $("error").hidden = false;
    $("error").textContent = `cannot list the experiments: ${error.message || error}`;
  }
}

function render(experiments) {
  $("experiment-count").textContent = String(experiments.length);
  const body = document.createElement("tbody");
  // Newest first: the one just run is the one most often looked for.
  for (const e of [...experiments].reverse()) {
    const row = body.insertRow();
    row.dataset.experiment = e.id;
    const href = `/e/${encodeURIComponent(e.id)}/`;
    const name = row.insertCell().appendChild(document.createElement("a"));
    name.href = href;
    name.textContent = e.name || e.id;
    row.insertCell().textContent = e.id;
    const status = row.insertCell().appendChild(document.createElement("span"));
    status.className = "badge " + e.status;
    status.textContent = e.status;
    row.insertCell().textContent = e.best ? `${fmt(e.best.final_value)} (${e.best.trial_id}, ${e.optimize_mode})` : "–";
    row.insertCell().textContent = e.error ? e.error : e.trial_total === undefined ? "–" : `${e.trial_total}` + (e.trial_counts && Object.keys(e.trial_counts).length ? " (" + Object.entries(e.trial_counts).map(([s, n]) => `${s} ${n}`).join(" · ") + ")" : "");
    row.insertCell().textContent = new Date(e.start_time_ms || e.created_ms).toLocaleString();
    const links = row.insertCell();
    const open = links.appendChild(document.createElement("a"));
    open.href = href;
    open.textContent = "open";
    if (e.port) {
      links.append(" · ");
      const live = links.appendChild(document.createElement("a"));
      const host = !e.host ? location.hostname : e.host.includes(":") ? `[${e.host}]` : e.host;
      live.href = `${location.protocol}//${host}:${e.port}/`;
      live.textContent = "its own live dashboard";
      live.title = "the process running it serves a dashboard with run controls";
    }
    row.onclick = (event) => { if (event.target.tagName !== "A") location.href = href; };
  }
  $("experiments").replaceChild(body, $("experiments").tBodies[0]);
}

$("theme").onclick = () => {
  const dark = applyTheme();
  localStorage.setItem("knob-theme", dark ? "light" : "dark");
  applyTheme();
};
applyTheme();
load();
setInterval(load, 5000);
