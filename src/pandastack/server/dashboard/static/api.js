// What every page shares: the session (and its CSRF token), calls to the REST API through
// /dashboard/api, DOM building without innerHTML (every value shown may be a tenant's text),
// and formatting.

export const session = {csrf: null, info: null};

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export async function loadSession() {
  const response = await fetch("/dashboard/session", {credentials: "same-origin"});
  if (response.status === 401) {
    location.assign("/dashboard/login");
    return null;
  }
  if (!response.ok) throw new ApiError(response.status, "unavailable", "no session info");
  session.info = await response.json();
  session.csrf = session.info.csrf_token;
  return session.info;
}

async function fail(response) {
  if (response.status === 401) {
    location.assign("/dashboard/login");
  }
  let code = "error", message = `HTTP ${response.status}`;
  try {
    const body = await response.json();
    if (body.error) ({code, message} = body.error);
  } catch (e) { /* not an envelope */ }
  throw new ApiError(response.status, code, message);
}

// A request to the REST API (`path` starts with /v1/) as the signed-in key. `body`: an object
// is sent as JSON, a Blob or ArrayBuffer as raw bytes.
export async function raw(method, path, {body, query, signal} = {}) {
  let url = "/dashboard/api" + path;
  if (query) {
    const params = new URLSearchParams();
    for (const [k, v] of Object.entries(query)) {
      if (v !== undefined && v !== null) params.set(k, String(v));
    }
    const text = params.toString();
    if (text) url += "?" + text;
  }
  const headers = {"X-CSRF-Token": session.csrf};
  let payload;
  if (body instanceof Blob || body instanceof ArrayBuffer) {
    headers["Content-Type"] = "application/octet-stream";
    payload = body;
  } else if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    payload = JSON.stringify(body);
  }
  const response = await fetch(url, {method, headers, body: payload, signal,
                                     credentials: "same-origin"});
  if (!response.ok) await fail(response);
  return response;
}

export async function api(method, path, options = {}) {
  const response = await raw(method, path, options);
  if (response.status === 204) return null;
  return response.json();
}

// Server-Sent Events over fetch (EventSource cannot send the CSRF header): calls
// onEvent(type, data) for each event until the stream ends or `signal` aborts it.
export async function events(path, onEvent, signal) {
  const response = await raw("GET", path, {signal});
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, {stream: true});
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let type = "message";
      const data = [];
      for (const line of block.split("\n")) {
        if (line.startsWith("event:")) type = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) {
        let parsed = data.join("\n");
        try { parsed = JSON.parse(parsed); } catch (e) { /* plain text */ }
        onEvent(type, parsed);
      }
    }
  }
}

// h("button", {type: "button", onclick: f}, "Kill"): an element; strings become text nodes.
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (v === true) el.setAttribute(k, "");
    else el.setAttribute(k, String(v));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  for (const child of children.flat()) {
    if (child === undefined || child === null) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function setText(el, text) {
  const value = text === undefined || text === null ? "" : String(text);
  if (el.textContent !== value) el.textContent = value;
}

let statusTimer = null;
export function notify(message, kind = "info") {
  const box = document.getElementById("status");
  box.textContent = message;
  box.className = kind;
  box.hidden = false;
  clearTimeout(statusTimer);
  statusTimer = setTimeout(() => { box.hidden = true; }, kind === "error" ? 8000 : 4000);
}

// Runs an action, and says how it went (errors as the API's message, never a console error);
// `quiet`: only a failure is told (loading a page's data). A string fn returns is the news.
export async function act(label, fn, {quiet = false} = {}) {
  try {
    const result = await fn();
    if (!quiet) notify(typeof result === "string" ? result : `${label}: done`);
    return result;
  } catch (e) {
    notify(`${label}: ${e.message}`, "error");
    return undefined;
  }
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined || !isFinite(seconds)) return "–";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

export function when(unix) {
  if (!unix) return "–";
  return new Date(unix * 1000).toLocaleString();
}

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

export function load(label, fn) {
  return act(label, fn, {quiet: true});
}

export function usd(n) {
  if (!n) return "$0";
  return n < 0.01 ? `$${n.toFixed(6)}` : `$${n.toFixed(2)}`;
}

export function now() {
  return Date.now() / 1000;
}

// A table with a header row; rows are arrays of cells (text or nodes).
export function table(headers, rows, {caption, empty = "Nothing here yet."} = {}) {
  if (!rows.length) return h("p", {class: "empty"}, empty);
  return h("div", {class: "table-wrap"}, h("table", {},
    caption ? h("caption", {}, caption) : null,
    h("thead", {}, h("tr", {}, headers.map((t) => h("th", {scope: "col"}, t)))),
    h("tbody", {}, rows.map((cells) => h("tr", {}, cells.map((c) => h("td", {}, c)))))));
}

// Polls fn() every `ms` while the page is open and visible; returns the stop function.
export function poll(fn, ms) {
  let stopped = false, timer = null, running = false;
  const tick = async () => {
    if (stopped) return;
    if (!document.hidden && !running) {
      running = true;
      try { await fn(); } catch (e) { notify(e.message, "error"); }
      running = false;
    }
    if (!stopped) timer = setTimeout(tick, ms);
  };
  tick();
  return () => { stopped = true; clearTimeout(timer); };
}
