// The sandboxes list (live: polled every second) and one sandbox's page.
import {act, api, bytes, duration, h, load, now, poll, setText, table, when}
  from "./api.js";
import {lineChart} from "./charts.js";
import {filesPanel} from "./files.js";
import {terminalPanel} from "./terminal.js";

// The API measures a sandbox when asked and keeps no history (ADR 0026): the page keeps the
// samples it read, for as long as it is open, and charts the last few minutes of them.
const CHART_SPAN_S = 300;
const METRICS_EVERY_MS = 1500;

const ENDED = new Set(["killed", "expired", "failed", "reaped", "host_lost"]);

const ACTIONS = {
  kill: {label: "Kill", danger: true, run: async (s) => {
    if (!confirm(`Kill ${s.name || s.id}? Its memory and disk are gone for good.`)) return false;
    await api("DELETE", `/v1/sandboxes/${s.id}`);
  }},
  pause: {label: "Pause", run: (s) => api("POST", `/v1/sandboxes/${s.id}/pause`)},
  resume: {label: "Resume", run: (s) => api("POST", `/v1/sandboxes/${s.id}/resume`)},
  hibernate: {label: "Hibernate", run: (s) => api("POST", `/v1/sandboxes/${s.id}/hibernate`)},
  wake: {label: "Wake", run: (s) => api("POST", `/v1/sandboxes/${s.id}/wake`)},
  fork: {label: "Fork", run: async (s) => {
    const result = await api("POST", `/v1/sandboxes/${s.id}/fork`, {body: {count: 1}});
    return `Forked: ${result.sandboxes.map((c) => c.id).join(", ")}`;
  }},
  snapshot: {label: "Snapshot", run: async (s) => {
    const name = prompt("Snapshot name (optional)", "");
    if (name === null) return false;
    const snap = await api("POST", `/v1/sandboxes/${s.id}/snapshots`,
                           {body: {name: name.trim() || null}});
    return `Snapshot ${snap.id} taken`;
  }},
  extend: {label: "Extend TTL", run: async (s) => {
    const minutes = prompt("Add how many minutes to its time to live?", "60");
    if (minutes === null) return false;
    const add = Math.round(Number(minutes) * 60);
    if (!(add > 0)) throw new Error("a positive number of minutes is needed");
    // The TTL now, not the one this button was drawn with (it may have been extended since).
    const {ttl_seconds: ttl} = await api("GET", `/v1/sandboxes/${s.id}/lifecycle`);
    await api("PATCH", `/v1/sandboxes/${s.id}/lifecycle`, {body: {ttl_seconds: ttl + add}});
  }},
};

function actionsFor(state) {
  switch (state) {
    case "running": return ["pause", "hibernate", "fork", "snapshot", "extend", "kill"];
    case "paused": return ["resume", "hibernate", "snapshot", "extend", "kill"];
    case "hibernated": return ["wake", "extend", "kill"];
    case "stopped": return ["wake", "extend", "kill"];
    case "starting": return ["kill"];
    default: return [];
  }
}

function actionButtons(sandbox, after) {
  return actionsFor(sandbox.state).map((name) => {
    const spec = ACTIONS[name];
    return h("button", {type: "button", class: spec.danger ? "danger" : "secondary",
                        dataset: {action: name},
                        "aria-label": `${spec.label} ${sandbox.name || sandbox.id}`,
                        onclick: async (event) => {
                          const button = event.currentTarget;
                          button.disabled = true;
                          await act(`${spec.label} ${sandbox.id}`, async () => {
                            const news = await spec.run(sandbox);
                            if (news === false) throw new Error("cancelled");
                            return news;
                          });
                          button.disabled = false;
                          after();
                        }}, spec.label);
  });
}

function ttlLeft(s) {
  if (s.persistent) return "persistent";
  if (!s.expires_at) return "–";
  return duration(s.expires_at - now());
}

function metadataChips(metadata) {
  const entries = Object.entries(metadata || {});
  if (!entries.length) return "–";
  return h("span", {class: "chips"},
           entries.map(([k, v]) => h("span", {class: "chip"}, `${k}=${v}`)));
}

function stateBadge(state) {
  return h("span", {class: `badge state-${state}`}, state);
}

export function sandboxesPage(main) {
  let showEnded = false;
  const rows = new Map();
  const tbody = h("tbody", {});
  const empty = h("p", {class: "empty", hidden: true}, "No sandboxes. Create one with the SDK: " +
                  "Sandbox.create().");
  const count = h("span", {class: "count"});
  const toggle = h("input", {type: "checkbox", id: "show-ended", onchange: () => {
    showEnded = toggle.checked;
    refresh();
  }});
  main.append(
    h("div", {class: "page-head"}, h("h1", {}, "Sandboxes ", count),
      h("label", {class: "inline", for: "show-ended"}, toggle, " show ended (last 24 h)")),
    h("div", {class: "table-wrap"}, h("table", {id: "sandboxes", class: "live"},
      h("thead", {}, h("tr", {}, ["Sandbox", "State", "Template", "Host", "Age", "TTL left",
                                  "Metadata", "Actions"].map((t) => h("th", {scope: "col"}, t)))),
      tbody)),
    empty);

  function update(row, s) {
    const [idCell, stateCell, tplCell, hostCell, ageCell, ttlCell, metaCell, actCell] =
      row.cells;
    if (row.dataset.state !== s.state) {
      const focused = actCell.contains(document.activeElement);
      row.dataset.state = s.state;
      stateCell.replaceChildren(stateBadge(s.state));
      actCell.replaceChildren(h("span", {class: "actions"}, actionButtons(s, refresh)));
      if (focused) (actCell.querySelector("button") || idCell.querySelector("a")).focus();
    }
    row.sandbox = s;
    setText(tplCell, s.template);
    setText(hostCell, s.host_id || "–");
    setText(ageCell, duration((s.ended_at || now()) - s.created_at));
    setText(ttlCell, ENDED.has(s.state) ? (s.end_reason || "ended") : ttlLeft(s));
    const meta = JSON.stringify(s.metadata || {});
    if (row.dataset.meta !== meta) {
      row.dataset.meta = meta;
      metaCell.replaceChildren(metadataChips(s.metadata));
    }
  }

  function make(s) {
    const link = h("a", {href: `#/sandboxes/${encodeURIComponent(s.id)}`}, s.name || s.id);
    const cell = (label) => h("td", {dataset: {label}});
    const row = h("tr", {dataset: {id: s.id}},
      h("td", {}, link, s.name ? h("div", {class: "sub"}, s.id) : null),
      cell("State"), cell("Template"), cell("Host"), cell("Age"), cell("TTL left"),
      cell("Metadata"), cell("Actions"));
    update(row, s);
    return row;
  }

  async function refresh() {
    const query = showEnded ? {include_ended: true, started_after: Math.floor(now() - 86400)}
      : {include_ended: false};
    const list = await api("GET", "/v1/sandboxes", {query});
    const seen = new Set();
    list.sandboxes.slice().reverse().forEach((s, i) => {
      seen.add(s.id);
      let row = rows.get(s.id);
      if (!row) {
        row = make(s);
        rows.set(s.id, row);
      } else {
        update(row, s);
      }
      if (tbody.children[i] !== row) tbody.insertBefore(row, tbody.children[i] || null);
    });
    for (const [id, row] of rows) {
      if (!seen.has(id)) {
        row.remove();
        rows.delete(id);
      }
    }
    empty.hidden = rows.size > 0;
    setText(count, `(${rows.size})`);
  }

  return poll(refresh, 1000);
}

export function sandboxPage(main, id) {
  const stops = [];
  let sandbox = null;
  const title = h("h1", {}, id);
  const info = h("dl", {class: "info"});
  const actions = h("div", {class: "actions"});
  const metrics = h("div", {class: "metrics"}, h("p", {class: "empty"}, "…"));
  main.append(
    h("p", {class: "crumbs"}, h("a", {href: "#/sandboxes"}, "← Sandboxes")),
    h("div", {class: "page-head"}, title, actions),
    h("div", {class: "grid"},
      h("section", {"aria-labelledby": "info-h"}, h("h2", {id: "info-h"}, "Info"), info),
      h("section", {"aria-labelledby": "metrics-h"}, h("h2", {id: "metrics-h"}, "Metrics"),
        metrics)));

  const terminal = terminalPanel(id);
  const files = filesPanel(id);
  const processes = processesPanel(id);
  const logs = logsPanel(id);
  main.append(terminal.element, files.element, processes.element, logs.element);
  stops.push(terminal.stop);

  function renderInfo(s) {
    setText(title, s.name ? `${s.name} (${s.id})` : s.id);
    const items = [
      ["State", stateBadge(s.state)], ["Template", s.template], ["Host", s.host_id || "–"],
      ["vCPUs", s.vcpus], ["Memory", `${s.memory_mb} MiB`],
      ["Disk", s.disk_mb ? `${s.disk_mb} MiB` : "template's"],
      ["Created", when(s.created_at)], ["Age", duration((s.ended_at || now()) - s.created_at)],
      ["TTL left", ENDED.has(s.state) ? (s.end_reason || "ended") : ttlLeft(s)],
      ["From snapshot", s.snapshot || "–"],
      ["Volumes", (s.volumes || []).map((v) => `${v.name} → ${v.mount_path}`).join(", ") || "–"],
      ["Metadata", metadataChips(s.metadata)],
    ];
    info.replaceChildren(...items.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
    if (actions.dataset.state !== s.state) {
      actions.dataset.state = s.state;
      const focused = actions.contains(document.activeElement);
      actions.replaceChildren(...actionButtons(s, refresh));
      if (focused && actions.querySelector("button")) actions.querySelector("button").focus();
    }
  }

  async function refresh() {
    try {
      sandbox = await api("GET", `/v1/sandboxes/${encodeURIComponent(id)}`);
    } catch (e) {
      if (e.status === 404) {
        info.replaceChildren(h("p", {class: "error"}, "No such sandbox in your team."));
        return;
      }
      throw e;
    }
    const first = !info.dataset.loaded;
    info.dataset.loaded = "1";
    renderInfo(sandbox);
    terminal.setState(sandbox.state);
    files.setState(sandbox.state);
    if (first) {
      logs.refresh();
      if (sandbox.state === "running") processes.refresh();
    }
  }

  const readings = [];
  async function refreshMetrics() {
    if (!sandbox || sandbox.state !== "running") {
      metrics.replaceChildren(h("p", {class: "empty"},
                                sandbox ? `No metrics while ${sandbox.state}.` : "…"));
      return;
    }
    let m;
    try {
      m = await api("GET", `/v1/sandboxes/${sandbox.id}/metrics`);
    } catch (e) {
      // 409: it stopped running since the last look (killed, paused, hibernated): its next
      // refresh shows the state; that is not an error to report.
      if (e.status !== 409) throw e;
      metrics.replaceChildren(h("p", {class: "empty"}, "No metrics: not running."));
      return;
    }
    readings.push(m);
    while (readings.length && readings[0].sampled_at < m.sampled_at - CHART_SPAN_S) {
      readings.shift();
    }
    const series = (value) => readings.map((s) => ({t: s.sampled_at, v: value(s)}));
    metrics.replaceChildren(
      meter("CPU", m.cpu_percent, 100, `${m.cpu_percent.toFixed(1)}% of ` +
            `${m.cpu_count} vCPU`),
      meter("Memory", m.memory_used_bytes, m.memory_total_bytes,
            `${bytes(m.memory_used_bytes)} of ${bytes(m.memory_total_bytes)}`),
      meter("Disk", m.disk_used_bytes, m.disk_total_bytes,
            `${bytes(m.disk_used_bytes)} of ${bytes(m.disk_total_bytes)}`),
      h("figure", {class: "chart"},
        lineChart({label: `CPU use over the last ${CHART_SPAN_S / 60} minutes, now ` +
                          `${m.cpu_percent.toFixed(1)}%`, name: "cpu",
                   samples: series((s) => s.cpu_percent), yMax: 100,
                   yFormat: (v) => `${Math.round(v)}%`, spanSeconds: CHART_SPAN_S}),
        h("figcaption", {}, "CPU, % of all vCPUs")),
      h("figure", {class: "chart"},
        lineChart({label: `Memory use over the last ${CHART_SPAN_S / 60} minutes, now ` +
                          bytes(m.memory_used_bytes), name: "memory",
                   samples: series((s) => s.memory_used_bytes), yMax: m.memory_total_bytes,
                   yFormat: bytes, spanSeconds: CHART_SPAN_S}),
        h("figcaption", {}, "Memory used (total minus available)")));
  }

  stops.push(poll(refresh, 1000));
  stops.push(poll(refreshMetrics, METRICS_EVERY_MS));
  return () => stops.forEach((stop) => stop());
}

function meter(label, value, max, text) {
  return h("div", {class: "meter"}, h("span", {class: "meter-label"}, label),
    h("meter", {min: 0, max: max || 1, value: value || 0, "aria-label": label}),
    h("span", {class: "meter-text"}, text));
}

function processesPanel(id) {
  const body = h("div", {}, h("p", {class: "empty"}, "Press Refresh to list them."));
  const refresh = () => load("Processes", async () => {
    const list = await api("GET", `/v1/sandboxes/${id}/processes`);
    body.replaceChildren(table(["PID", "Command", "Running", "Exit code"],
      list.processes.map((p) => [String(p.pid),
        h("code", {}, Array.isArray(p.cmd) ? p.cmd.join(" ") : p.cmd),
        p.running ? "yes" : "no", p.exit_code === null ? "–" : String(p.exit_code)]),
      {empty: "No processes started through the API."}));
  });
  const element = h("section", {"aria-labelledby": "procs-h"},
    h("div", {class: "section-head"}, h("h2", {id: "procs-h"}, "Processes"),
      h("button", {type: "button", class: "secondary", onclick: refresh}, "Refresh")), body);
  return {element, refresh};
}

function logsPanel(id) {
  const consoleLog = h("pre", {class: "log", tabindex: "0", "aria-label": "Console log"});
  const agentLog = h("pre", {class: "log", tabindex: "0", "aria-label": "Agent log"});
  const refresh = () => load("Logs", async () => {
    const logs = await api("GET", `/v1/sandboxes/${id}/logs`);
    consoleLog.textContent = logs.console || "(empty)";
    agentLog.textContent = logs.agent || "(empty)";
    consoleLog.scrollTop = consoleLog.scrollHeight;
  });
  const element = h("section", {"aria-labelledby": "logs-h"},
    h("div", {class: "section-head"}, h("h2", {id: "logs-h"}, "Logs"),
      h("button", {type: "button", class: "secondary", onclick: refresh}, "Refresh")),
    h("h3", {}, "Console"), consoleLog, h("h3", {}, "Guest agent"), agentLog);
  return {element, refresh};
}
