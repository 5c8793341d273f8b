import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { Client, ConfigError, InvalidRequestError, NotFoundError, ProtocolError, Sandbox,
  TemplateBuildError, WaitTimeoutError, resolveConfig } from "../../src/index.js";
import { OPTS, SANDBOX, json, mockFetch, sse, type Handler } from "./mock.js";

async function sandbox(handler: Handler) {
  const { fetch, sent } = mockFetch((req) => req.method === "GET" && req.url.pathname === "/v1/sandboxes/sbx-1"
    ? json(200, SANDBOX) : handler(req));
  const sbx = await Sandbox.connect("sbx-1", { ...OPTS, fetch });
  sent.length = 0;
  return { sbx, sent };
}

test("config: option > environment > file; a missing key names every place", () => {
  const dir = mkdtempSync(join(tmpdir(), "psts-"));
  try {
    const path = join(dir, "config.json");
    writeFileSync(path, JSON.stringify({ api_url: "http://file:1/", api_key: "from-file" }));
    assert.deepEqual(resolveConfig({}, {}, path), { apiUrl: "http://file:1", apiKey: "from-file", timeout: 60 });
    assert.equal(resolveConfig({}, { PANDASTACK_API_KEY: "env" }, path).apiKey, "env");
    assert.equal(resolveConfig({ apiKey: "opt" }, { PANDASTACK_API_KEY: "env" }, path).apiKey, "opt");
    assert.equal(resolveConfig({}, { XDG_CONFIG_HOME: dir, PANDASTACK_API: "http://x", PANDASTACK_API_KEY: "k" }).apiUrl, "http://x");
    assert.throws(() => resolveConfig({}, {}, join(dir, "none.json")), (e: unknown) =>
      e instanceof ConfigError && /PANDASTACK_API/.test(e.message));
    writeFileSync(path, "{nope");
    assert.throws(() => resolveConfig({}, {}, path), ConfigError);
    assert.throws(() => resolveConfig({ apiUrl: "ftp://x", apiKey: "k" }, {}, path), ConfigError);
  } finally {
    rmSync(dir, { recursive: true });
  }
});

test("files: paths in the query, the mode in octal, bytes back as bytes", async () => {
  const { sbx, sent } = await sandbox((req) => {
    if (req.method === "PUT") return json(200, { path: "/work/a", size: 3 });
    if (req.url.pathname.endsWith("/files")) return new Response(new Uint8Array([0, 255, 10]));
    if (req.url.pathname.endsWith("/stat")) return json(404, { error: { code: "not_found", message: "no" } });
    return json(200, {});
  });
  assert.deepEqual(await sbx.files.write("/work/a", "abc", { mode: 0o755 }), { path: "/work/a", size: 3 });
  assert.equal(sent[0]!.url.searchParams.get("mode"), "755");
  assert.equal(sent[0]!.body, "abc");
  assert.deepEqual(Array.from(await sbx.files.read("/work/a")), [0, 255, 10]);
  assert.equal(sent[1]!.url.searchParams.get("path"), "/work/a");
  assert.equal(await sbx.files.exists("/work/nope"), false);
  await sbx.files.remove("/work/d", { recursive: true });
  assert.equal(sent.at(-1)!.url.searchParams.get("recursive"), "true");
  await sbx.files.mkdir("/work/d");
  assert.deepEqual(JSON.parse(sent.at(-1)!.body!), { path: "/work/d", parents: true });
});

test("files: writeMany sends bytes as base64; download writes only a complete file", async () => {
  const { sbx, sent } = await sandbox((req) => req.url.pathname.endsWith("/batch")
    ? json(200, { files: [{ path: "/a", size: 1 }, { path: "/b", size: 2 }] })
    : new Response("hello"));
  await sbx.files.writeMany([["/a", "x"], ["/b", new Uint8Array([1, 2])]]);
  assert.deepEqual(JSON.parse(sent[0]!.body!), { files: [{ path: "/a", data: "x" },
    { path: "/b", data: "AQI=", encoding: "base64" }] });
  const dir = mkdtempSync(join(tmpdir(), "psts-"));
  try {
    const progress: number[] = [];
    assert.equal(await sbx.files.download("/r", join(dir, "out"), { onProgress: (n) => { progress.push(n); } }), 5);
    assert.equal(readFileSync(join(dir, "out"), "utf8"), "hello");
    assert.deepEqual(progress, [5]);
  } finally {
    rmSync(dir, { recursive: true });
  }
});

test("commands: a background process's stream replays, follows, and ends with its exit", async () => {
  const exit = { exit_code: 0, stdout: "", stderr: "", timed_out: false, duration_ms: 1, truncated: false };
  const { sbx, sent } = await sandbox((req) => {
    if (req.url.pathname.endsWith("/processes") && req.method === "POST") return json(201, { pid: 7, cmd: "x", running: true });
    if (req.url.pathname.endsWith("/stream")) {
      return sse(['event: dropped\ndata: {"stdout": 10, "stderr": 0}\n\n', 'event: stdout\ndata: {"data": "a"}\n\n',
        'event: stderr\ndata: {"data": "b"}\n\nevent: exit\ndata: ' + JSON.stringify(exit) + "\n\n"]);
    }
    if (req.url.pathname.endsWith("/wait")) return json(408, { error: { code: "timeout", message: "still running" } });
    return json(200, {});
  });
  const out: string[] = [];
  const proc = await sbx.commands.start("x", { env: { A: "1" }, timeoutSeconds: 9, onStdout: (t) => { out.push(t); } });
  assert.deepEqual(JSON.parse(sent[0]!.body!), { cmd: "x", env: { A: "1" }, timeout_seconds: 9 });
  assert.equal(proc.pid, 7);
  const events = [];
  for await (const e of proc.stream()) events.push(e);
  assert.deepEqual(events.map((e) => e.type), ["dropped", "stdout", "stderr", "exit"]);
  assert.deepEqual(events[0], { type: "dropped", dropped: { stdout: 10, stderr: 0 } });
  const last = events[3]!;
  assert.ok(last.type === "exit" && last.result.stdout === "a" && last.result.stderr === "b");
  assert.deepEqual(out, ["a"]);
  const bare = await sbx.commands.start("y");
  await assert.rejects(bare.wait({ timeoutSeconds: 1 }), WaitTimeoutError);
  assert.equal(sent.at(-1)!.url.searchParams.get("timeout_seconds"), "1");
  await bare.sendStdin("in", { eof: true });
  assert.equal(sent.at(-1)!.url.searchParams.get("eof"), "true");
  assert.equal(sent.at(-1)!.body, "in");
  await bare.kill();
  assert.deepEqual(JSON.parse(sent.at(-1)!.body!), { signal: 9 });
  await bare.sendSignal("SIGTERM");
  assert.deepEqual(JSON.parse(sent.at(-1)!.body!), { signal: 15 });
});

test("commands: a stream that ends before its exit is a ProtocolError; connect finds a pid", async () => {
  const { sbx } = await sandbox((req) => req.url.pathname.endsWith("/stream")
    ? sse(['event: stdout\ndata: {"data": "a"}\n\n'])
    : json(200, { processes: [{ pid: 3, cmd: "x", running: true }] }));
  const proc = await sbx.commands.connect(3);
  await assert.rejects((async () => { for await (const _ of proc.stream()) { /* drain */ } })(), ProtocolError);
  await assert.rejects(sbx.commands.connect(4), NotFoundError);
});

test("runCode: streamed events, rich results, the error as data", async () => {
  const { sbx, sent } = await sandbox(() => sse([
    'event: stdout\ndata: {"data": "hi\\n"}\n\n',
    'event: result\ndata: {"data": {"text/plain": "42", "image/png": "iVBORw0KGgo=", "application/json": "{\\"a\\": 1}"}, "is_main_result": true}\n\n',
    'event: error\ndata: {"name": "ZeroDivisionError", "value": "division by zero", "traceback": "Traceback..."}\n\n',
    'event: end\ndata: {"execution_count": 3}\n\n']));
  const seen: string[] = [];
  const ex = await sbx.runCode("x", { context: { id: "ctx-1", language: "python" } as never,
    onStdout: (t) => { seen.push(`out:${t}`); }, onResult: (r) => { seen.push(`result:${r.text}`); },
    onEvent: (e) => { seen.push(e.type); } });
  assert.deepEqual(JSON.parse(sent[0]!.body!), { code: "x", language: "python", context_id: "ctx-1", timeout_seconds: 300 });
  assert.ok(sent[0]!.url.pathname.endsWith("/code/stream"));
  assert.deepEqual(seen, ["stdout", "out:hi\n", "result", "result:42", "error", "end"]);
  assert.equal(ex.text, "42");
  assert.equal(ex.stdout, "hi\n");
  assert.equal(ex.executionCount, 3);
  assert.equal(ex.error?.name, "ZeroDivisionError");
  const r = ex.results[0]!;
  assert.deepEqual(r.json, { a: 1 });
  assert.deepEqual(Array.from(r.pngBytes()!.slice(0, 4)), [0x89, 0x50, 0x4e, 0x47]);
  assert.deepEqual(r.formats(), ["text/plain", "image/png", "application/json"]);
});

test("a file watch: set up when watch() resolves, events until stop", async () => {
  const { sbx, sent } = await sandbox(() => sse(['event: watching\ndata: {}\n\n',
    'event: create\ndata: {"type": "create", "path": "/w/a", "is_dir": false}\n\n',
    'event: rename\ndata: {"type": "rename", "path": "/w/b", "old_path": "/w/a"}\n\n',
    'event: overflow\ndata: {"type": "overflow", "path": "/w"}\n\n']));
  const watch = await sbx.files.watch("/w", { recursive: false });
  assert.equal(sent[0]!.url.searchParams.get("recursive"), "false");
  const events = [];
  for await (const e of watch) events.push(e);
  assert.deepEqual(events, [{ type: "create", path: "/w/a", isDir: false },
    { type: "rename", path: "/w/b", oldPath: "/w/a", isDir: false }, { type: "overflow", path: "/w", isDir: false }]);
  assert.ok(watch.stopped);
});

test("templates: build follows the log, a failed build throws with its status", async () => {
  const info = { build_id: "b1", name: "app", version: 2, status: "building", created_at: 1 };
  let status = "ready";
  const { fetch, sent } = mockFetch((req) => {
    if (req.method === "POST") return json(202, info);
    if (req.url.pathname.endsWith("/logs")) {
      return sse(['event: log\ndata: {"line": "step 1"}\n\n', 'event: log\ndata: {"line": "step 2"}\n\n',
        `event: status\ndata: ${JSON.stringify({ ...info, status })}\n\n`]);
    }
    return json(200, { ...info, status, error: status === "failed" ? "step 2: exit 1" : null });
  });
  const client = new Client({ ...OPTS, fetch });
  const lines: string[] = [];
  const spec = { from_template: "base", steps: [{ kind: "run", cmd: "true" }] } as never;
  const done = await client.templates.build(spec, "app", { memoryMb: 1024, onLog: (l) => { lines.push(l); } });
  assert.equal(done.status, "ready");
  assert.deepEqual(lines, ["step 1", "step 2"]);
  assert.deepEqual(JSON.parse(sent[0]!.body!), { name: "app", spec, vcpus: 1, memory_mb: 1024 });
  await client.templates.build("FROM python\nRUN pip install flask\nCMD [\"python\", \"app.py\"]\n", "app", { wait: false });
  assert.deepEqual(JSON.parse(sent.at(-1)!.body!).spec, { from_template: "python",
    steps: [{ kind: "run", command: "pip install flask" }], start: "python app.py" });
  await assert.rejects(client.templates.build("FROM base\nCOPY . /app\n", "app"), (e: unknown) =>
    e instanceof InvalidRequestError && /line 2: COPY/.test(e.message));
  status = "failed";
  await assert.rejects(client.templates.build(spec, "app"), (e: unknown) =>
    e instanceof TemplateBuildError && /step 2/.test(e.message));
});

test("client: usage's query, quotas' clear, volumes' paths", async () => {
  const { fetch, sent } = mockFetch(() => json(200, { rows: [], total_usd: 0 }));
  const client = new Client({ ...OPTS, fetch });
  await client.usage({ start: new Date(Date.UTC(2026, 0, 1)), groupBy: "day" });
  assert.equal(sent[0]!.url.searchParams.get("start"), "2026-01-01T00:00:00.000Z");
  assert.equal(sent[0]!.url.searchParams.get("group_by"), "day");
  await assert.rejects(client.usage({ groupBy: "week" as never }), InvalidRequestError);
  await client.teams.setQuota("t", { maxSandboxes: 5, clear: ["max_vcpus"] });
  assert.deepEqual(JSON.parse(sent.at(-1)!.body!), { max_sandboxes: 5, max_vcpus: null });
  await client.teams.setQuota("t", { maxHibernated: 4, maxSnapshotGb: 2.5, clear: ["max_volume_gb"] });
  assert.deepEqual(JSON.parse(sent.at(-1)!.body!),
    { max_hibernated: 4, max_snapshot_gb: 2.5, max_volume_gb: null });
  await client.teams.setQuota("t", { maxTemplateGb: 0.5, clear: ["max_template_gb"] });
  assert.deepEqual(JSON.parse(sent.at(-1)!.body!), { max_template_gb: null });
  await client.volumes.create("data", { sizeMb: 2048, fromSnapshot: "vs-1" });
  assert.deepEqual(JSON.parse(sent.at(-1)!.body!), { name: "data", size_mb: 2048, from_snapshot: "vs-1" });
  await client.volumes.snapshots({ name: "data" });
  assert.equal(sent.at(-1)!.url.search, "?volume=data");
  assert.equal(client.volumes.apiUrl, "http://api.test");
});

test("templates.builtin lists the built-ins the server names beside the team's", async () => {
  const { fetch, sent } = mockFetch(() => json(200, { templates: [],
    builtin: [{ name: "base", default: true }, { name: "python", default: false }] }));
  const client = new Client({ ...OPTS, fetch });
  assert.deepEqual(await client.templates.builtin(), [{ name: "base", default: true }, { name: "python", default: false }]);
  assert.deepEqual(await client.templates.list(), []);
  assert.equal(sent[0]!.url.pathname, "/v1/templates");
  const old = mockFetch(() => json(200, { templates: [] }));  // a server from before the field
  assert.deepEqual(await new Client({ ...OPTS, fetch: old.fetch }).templates.builtin(), []);
});
