// The dashboard's shell: the session, the navigation, and one page at a time by the URL's
// hash (#/sandboxes, #/sandboxes/<id>, #/templates, …); each page returns its clean-up.
import {h, loadSession, notify, session} from "./api.js";
import {sandboxPage, sandboxesPage} from "./sandboxes.js";
import {keysPage, snapshotsPage, templatesPage, usagePage, volumesPage} from "./pages.js";

const pages = {
  sandboxes: sandboxesPage,
  templates: templatesPage,
  snapshots: snapshotsPage,
  volumes: volumesPage,
  usage: usagePage,
  keys: keysPage,
};

let cleanup = null;

function route() {
  const main = document.getElementById("main");
  if (cleanup) {
    try { cleanup(); } catch (e) { /* the page is gone either way */ }
    cleanup = null;
  }
  main.replaceChildren();
  document.getElementById("status").hidden = true;  // news of the page left behind
  const [name = "sandboxes", ...rest] = location.hash.replace(/^#\/?/, "").split("/");
  const page = name === "sandboxes" && rest.length ? sandboxPage : pages[name];
  for (const link of document.querySelectorAll("#nav a")) {
    if (link.dataset.page === name) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  if (!page) {
    main.append(h("h1", {}, "Not found"), h("p", {}, "There is no such page."));
    return;
  }
  document.title = `${name[0].toUpperCase()}${name.slice(1)} · pandastack`;
  cleanup = page(main, ...rest.map(decodeURIComponent)) || null;
}

async function start() {
  const info = await loadSession();
  if (!info) return;
  document.getElementById("who").textContent =
    `${info.key_name || info.key_prefix} · team ${info.team}${info.admin ? " · admin" : ""}`;
  document.getElementById("nav-keys").hidden = !info.admin;
  document.getElementById("logout").addEventListener("click", async () => {
    await fetch("/dashboard/logout", {method: "POST", credentials: "same-origin",
                                      headers: {"X-CSRF-Token": session.csrf}});
    location.assign("/dashboard/login");
  });
  window.addEventListener("hashchange", route);
  if (!location.hash) history.replaceState(null, "", "#/sandboxes");
  route();
}

start().catch((e) => notify(`The dashboard could not start: ${e.message}`, "error"));
