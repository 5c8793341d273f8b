// A sandbox's files: browse directories, download a file, upload into the directory shown.
import {act, api, bytes, h, load, raw, table, when} from "./api.js";

function join(dir, name) {
  return dir.endsWith("/") ? dir + name : `${dir}/${name}`;
}

function parent(dir) {
  if (dir === "/") return "/";
  const cut = dir.replace(/\/+$/, "").lastIndexOf("/");
  return cut <= 0 ? "/" : dir.slice(0, cut);
}

export function filesPanel(id) {
  let dir = "/", running = false;
  const pathInput = h("input", {type: "text", id: "files-path", value: dir,
                                "aria-label": "Directory", spellcheck: "false"});
  const listing = h("div", {}, h("p", {class: "empty"}, "Press Open to list a directory."));
  const upload = h("input", {type: "file", id: "files-upload", "aria-label": "File to upload"});

  async function show(path) {
    dir = path || "/";
    pathInput.value = dir;
    const list = await api("GET", `/v1/sandboxes/${id}/files/list`, {query: {path: dir}});
    const entries = list.entries.slice().sort((a, b) =>
      (a.type === "dir" ? 0 : 1) - (b.type === "dir" ? 0 : 1) || a.name.localeCompare(b.name));
    const rows = entries.map((e) => [
      e.type === "dir"
        ? h("button", {type: "button", class: "link", onclick: () => open(e.path)}, `${e.name}/`)
        : h("span", {}, e.name),
      e.type, e.type === "dir" ? "–" : bytes(e.size), when(e.mtime),
      e.type === "file"
        ? h("button", {type: "button", class: "secondary", "aria-label": `Download ${e.name}`,
                       onclick: () => download(e)}, "Download")
        : "",
    ]);
    if (dir !== "/") {
      rows.unshift([h("button", {type: "button", class: "link",
                                 onclick: () => open(parent(dir))}, "../"), "dir", "–", "", ""]);
    }
    listing.replaceChildren(table(["Name", "Type", "Size", "Modified", ""], rows,
                                  {empty: "Empty directory."}));
  }

  const open = (path) => load(`List ${path}`, () => show(path));

  function download(entry) {
    return act(`Download ${entry.name}`, async () => {
      const response = await raw("GET", `/v1/sandboxes/${id}/files`, {query: {path: entry.path}});
      const url = URL.createObjectURL(await response.blob());
      const link = h("a", {href: url, download: entry.name, hidden: true});
      document.body.append(link);
      link.click();
      link.remove();
      setTimeout(() => URL.revokeObjectURL(url), 10000);
    });
  }

  function send() {
    const file = upload.files[0];
    if (!file) return undefined;
    return act(`Upload ${file.name}`, async () => {
      await raw("PUT", `/v1/sandboxes/${id}/files`,
                {query: {path: join(dir, file.name)}, body: file});
      upload.value = "";
      await show(dir);
    });
  }

  const form = h("form", {class: "row", onsubmit: (event) => {
    event.preventDefault();
    open(pathInput.value.trim() || "/");
  }}, pathInput, h("button", {type: "submit", class: "secondary"}, "Open"));
  const uploadRow = h("div", {class: "row"}, upload,
    h("button", {type: "button", class: "secondary", id: "files-upload-button",
                 onclick: send}, "Upload here"));
  const element = h("section", {"aria-labelledby": "files-h"},
    h("h2", {id: "files-h"}, "Files"), form, uploadRow, listing);
  return {
    element,
    setState(state) {
      const wasRunning = running;
      running = state === "running";
      if (running && !wasRunning) open(dir);
    },
  };
}
