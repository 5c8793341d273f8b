// Templates (versions, live build logs), snapshots, volumes, usage, API keys (admin).
import {act, api, bytes, duration, events, h, load as quietly, notify, session, table, usd,
  when}
  from "./api.js";
import {barChart, everyDay} from "./charts.js";

function head(title, ...extra) {
  return h("div", {class: "page-head"}, h("h1", {}, title), ...extra);
}

function refreshButton(fn) {
  return h("button", {type: "button", class: "secondary", onclick: fn}, "Refresh");
}

// -- templates --------------------------------------------------------------------------

export function templatesPage(main) {
  const body = h("div", {});
  const logTitle = h("h2", {id: "build-log-h"}, "Build log");
  const log = h("pre", {class: "log", id: "build-log", tabindex: "0",
                        "aria-labelledby": "build-log-h"});
  const logSection = h("section", {hidden: true, "aria-labelledby": "build-log-h"},
                       logTitle, log);
  let following = null;

  function follow(build) {
    if (following) following.abort();
    following = new AbortController();
    logSection.hidden = false;
    logTitle.textContent = `Build log: ${build.name} v${build.version} (${build.build_id})`;
    log.textContent = "";
    const signal = following.signal;
    events(`/v1/templates/builds/${build.build_id}/logs`, (type, data) => {
      if (type === "log") {
        log.append(document.createTextNode((data.line ?? String(data)) + "\n"));
        log.scrollTop = log.scrollHeight;
      } else if (type === "status") {
        log.append(document.createTextNode(`\n[${data.status}${data.error ? ": " +
                                           data.error : ""}]\n`));
        load();
      }
    }, signal).catch((e) => {
      if (e.name !== "AbortError") notify(`Build log: ${e.message}`, "error");
    });
    log.focus();
  }

  async function load() {
    const list = await api("GET", "/v1/templates");
    const byName = new Map();
    for (const b of list.templates) {
      if (!byName.has(b.name)) byName.set(b.name, []);
      byName.get(b.name).push(b);
    }
    const sections = [];
    for (const [name, builds] of [...byName].sort()) {
      builds.sort((a, b) => b.version - a.version);
      sections.push(h("section", {"aria-label": `Template ${name}`}, h("h2", {}, name),
        table(["Version", "Status", "Steps (cached)", "Started", "Took", "Error", ""],
          builds.map((b) => [String(b.version), h("span", {class: `badge build-${b.status}`},
                                                   b.status),
            b.steps_total === null ? "–" : `${b.steps_total} (${b.steps_cached ?? 0})`,
            when(b.created_at), b.finished_at ? duration(b.finished_at - b.created_at) : "…",
            b.error || "", h("button", {type: "button", class: "secondary",
                                        "aria-label": `Build log of ${name} v${b.version}`,
                                        onclick: () => follow(b)},
                             b.status === "building" || b.status === "queued" ? "Follow log"
                               : "Log")]))));
    }
    body.replaceChildren(...(sections.length ? sections
      : [h("p", {class: "empty"}, "No templates built yet (the built-in ones need no build).")]));
  }

  main.append(head("Templates", refreshButton(() => quietly("Templates", load))), body,
              logSection);
  quietly("Templates", load);
  return () => following && following.abort();
}

// -- snapshots --------------------------------------------------------------------------

export function snapshotsPage(main) {
  const body = h("div", {});
  async function load() {
    const list = await api("GET", "/v1/snapshots");
    body.replaceChildren(table(["Snapshot", "Name", "Template", "From sandbox", "Size",
                                "Created", ""],
      list.snapshots.map((s) => [h("code", {}, s.id), s.name || "–", s.template,
        s.source_sandbox || "–", bytes(s.size_bytes), when(s.created_at),
        h("span", {class: "actions"},
          h("button", {type: "button", class: "secondary",
                       "aria-label": `New sandbox from ${s.id}`, onclick: () =>
                         act(`New sandbox from ${s.id}`, async () => {
                           const sbx = await api("POST", "/v1/sandboxes",
                                                 {body: {snapshot: s.id}});
                           location.hash = `#/sandboxes/${sbx.id}`;
                         })}, "New sandbox"),
          h("button", {type: "button", class: "danger", "aria-label": `Delete ${s.id}`,
                       onclick: () => confirm(`Delete snapshot ${s.id}?`) &&
                         act(`Delete ${s.id}`, async () => {
                           await api("DELETE", `/v1/snapshots/${s.id}`);
                           await load();
                         })}, "Delete"))]),
      {empty: "No snapshots. Take one from a sandbox's Snapshot action."}));
  }
  main.append(head("Snapshots", refreshButton(() => quietly("Snapshots", load))), body);
  quietly("Snapshots", load);
}

// -- volumes ----------------------------------------------------------------------------

export function volumesPage(main) {
  const body = h("div", {});
  const snaps = h("div", {});
  async function load() {
    const [list, snapshots] = await Promise.all([api("GET", "/v1/volumes"),
                                                 api("GET", "/v1/volume-snapshots")]);
    body.replaceChildren(table(["Volume", "Size", "Host", "Attached to", "Created"],
      list.volumes.map((v) => [v.name, `${v.size_mb} MiB`, v.host_id || "–",
        (v.attachments || []).map((a) => `${a.sandbox_id}${a.read_only ? " (ro)" : ""}`)
          .join(", ") || "–", when(v.created_at)]),
      {empty: "No volumes."}));
    snaps.replaceChildren(table(["Snapshot", "Volume", "Size", "Created"],
      (snapshots.snapshots || []).map((s) => [h("code", {}, s.id), s.volume_name,
        `${s.size_mb} MiB`, when(s.created_at)]), {empty: "No volume snapshots."}));
  }
  main.append(head("Volumes", refreshButton(() => quietly("Volumes", load))), body,
              h("h2", {}, "Volume snapshots"), snaps);
  quietly("Volumes", load);
}

// -- usage ------------------------------------------------------------------------------

// The team's usage per UTC day, one bar chart per measure; days without usage are zero bars.
const DAY_CHARTS = [
  {name: "cost", title: "Cost per day", value: (r) => r.cost_usd, format: usd},
  {name: "vcpu", title: "vCPU-hours per day", value: (r) => r.vcpu_seconds / 3600,
   format: (v) => `${v.toFixed(v < 10 ? 2 : 0)} h`},
  {name: "memory", title: "Memory GiB-hours per day", value: (r) => r.memory_gib_seconds / 3600,
   format: (v) => `${v.toFixed(v < 10 ? 2 : 0)} GiB·h`},
];

function dayCharts(rows, start) {
  if (!rows.some((r) => r.day)) return [h("p", {class: "empty"}, "No usage in the last 30 days.")];
  return DAY_CHARTS.map((c) => h("figure", {class: "chart"},
    barChart({label: `${c.title}, last 30 days`, name: c.name, yFormat: c.format,
              days: everyDay(rows, start, c.value)}),
    h("figcaption", {}, `${c.title} (UTC), last 30 days`)));
}

export function usagePage(main) {
  const chart = h("div", {class: "charts"});
  const totals = h("p", {class: "totals"});
  const byTemplate = h("div", {});
  const bySandbox = h("div", {});
  async function load() {
    const start = Math.floor(Date.now() / 1000 - 30 * 86400);
    const [days, templates, sandboxes] = await Promise.all(["day", "template", "sandbox"].map(
      (group) => api("GET", "/v1/usage", {query: {start, group_by: group}})));
    chart.replaceChildren(...dayCharts(days.rows, start));
    totals.textContent = `Last 30 days: ${usd(days.totals.cost_usd)} · ` +
      `${Math.round(days.totals.vcpu_seconds)} vCPU-seconds · ` +
      `${Math.round(days.totals.memory_gib_seconds)} GiB-seconds of memory`;
    const cells = (r, label) => [label, usd(r.cost_usd), String(Math.round(r.vcpu_seconds)),
                                 String(Math.round(r.memory_gib_seconds))];
    const heads = ["Cost", "vCPU-s", "Memory GiB-s"];
    byTemplate.replaceChildren(table(["Template", ...heads],
      templates.rows.sort((a, b) => b.cost_usd - a.cost_usd)
        .map((r) => cells(r, r.template || "–")), {empty: "No usage."}));
    bySandbox.replaceChildren(table(["Sandbox", ...heads],
      sandboxes.rows.sort((a, b) => b.cost_usd - a.cost_usd).slice(0, 200)
        .map((r) => cells(r, r.sandbox_id
          ? h("a", {href: `#/sandboxes/${r.sandbox_id}`}, r.sandbox_id)
          : (r.volume_id ? `volume ${r.volume_id}` : "snapshots"))), {empty: "No usage."}));
  }
  main.append(head("Usage", refreshButton(() => quietly("Usage", load))), totals, chart,
              h("h2", {}, "Per template"), byTemplate, h("h2", {}, "Per sandbox"), bySandbox);
  quietly("Usage", load);
}

// -- API keys (admin) -------------------------------------------------------------------

export function keysPage(main) {
  if (!session.info || !session.info.admin) {
    main.append(head("API keys"), h("p", {class: "error"}, "Only an admin key manages keys."));
    return undefined;
  }
  const body = h("div", {});
  const created = h("div", {role: "status"});
  const name = h("input", {type: "text", id: "key-name", required: true, maxlength: 128,
                           placeholder: "ci-runner"});
  const team = h("input", {type: "text", id: "key-team", maxlength: 128,
                           placeholder: session.info.team});

  async function load() {
    const list = await api("GET", "/v1/keys");
    body.replaceChildren(table(["Key", "Name", "Team", "Prefix", "Created", "Status", ""],
      list.keys.map((k) => [h("code", {}, k.id), k.name, k.team, h("code", {}, k.prefix),
        when(k.created_at), k.revoked ? "revoked" : "active",
        k.revoked || k.id === session.info.key_id ? "" :
          h("button", {type: "button", class: "danger", "aria-label": `Revoke ${k.name}`,
                       onclick: () => confirm(`Revoke ${k.name} (${k.prefix}…)?`) &&
                         act(`Revoke ${k.name}`, async () => {
                           await api("DELETE", `/v1/keys/${k.id}`);
                           await load();
                         })}, "Revoke")])));
  }

  const form = h("form", {class: "row", onsubmit: (event) => {
    event.preventDefault();
    act("Create key", async () => {
      const key = await api("POST", "/v1/keys",
                            {body: {name: name.value.trim(), team: team.value.trim() || null}});
      created.replaceChildren(h("p", {class: "secret"},
        "New key (shown once, copy it now): ", h("code", {}, key.key)));
      name.value = "";
      await load();
    });
  }},
  h("label", {for: "key-name"}, "Name"), name, h("label", {for: "key-team"}, "Team"), team,
  h("button", {type: "submit"}, "Create key"));
  main.append(head("API keys", refreshButton(() => quietly("Keys", load))), form, created, body);
  quietly("Keys", load);
  return undefined;
}
