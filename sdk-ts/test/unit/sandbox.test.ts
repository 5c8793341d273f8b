import assert from "node:assert/strict";
import { test } from "node:test";

import { AuthenticationError, ConflictError, HostLostError, NotFoundError, PandastackError,
  PandastackTimeoutError, QuotaExceededError, RateLimitError, Sandbox, ServerError,
  TransportTimeoutError, WaitTimeoutError, APIConnectionError, InvalidRequestError, PermissionDeniedError } from "../../src/index.js";
import { OPTS, SANDBOX, json, mockFetch, sse } from "./mock.js";

test("create sends snake_case, hands back camelCase, keeps the user's metadata keys", async () => {
  const { fetch, sent } = mockFetch(() => json(201, SANDBOX));
  const sbx = await Sandbox.create({ ...OPTS, fetch, ttlSeconds: 900, memoryMb: 1024,
    metadata: { role_name: "worker" }, env: { MY_VAR: "1" }, network: { internet: false, allowOut: ["pypi.org"] } });
  assert.equal(sbx.id, "sbx-1");
  assert.equal(sbx.info.memoryMb, 512);
  assert.deepEqual(sbx.info.metadata, { role_name: "worker" });
  const req = sent[0]!;
  assert.equal(req.method, "POST");
  assert.equal(req.url.pathname, "/v1/sandboxes");
  assert.equal(req.headers.get("authorization"), "Bearer k-1");
  assert.deepEqual(JSON.parse(req.body!), { template: "base", ttl_seconds: 900, persistent: false,
    memory_mb: 1024, env: { MY_VAR: "1" }, metadata: { role_name: "worker" },
    network: { internet: false, allow_out: ["pypi.org"] } });
});

test("create from a snapshot does not send the default template", async () => {
  const { fetch, sent } = mockFetch(() => json(201, SANDBOX));
  await Sandbox.create({ ...OPTS, fetch, snapshot: "snap-1" });
  assert.equal(JSON.parse(sent[0]!.body!).template, undefined);
});

test("create waits while the template builds", async () => {
  let calls = 0;
  const { fetch } = mockFetch(() => ++calls === 1
    ? json(409, { error: { code: "template_building", message: "building" } }, { "retry-after": "0" })
    : json(201, SANDBOX));
  const sbx = await Sandbox.create({ ...OPTS, fetch });
  assert.equal(sbx.id, "sbx-1");
  assert.equal(calls, 2);
});

test("exec returns camelCase results; argv and options are sent as the API spells them", async () => {
  const { fetch, sent } = mockFetch((req) => req.url.pathname.endsWith("/exec")
    ? json(200, { exit_code: 3, stdout: "o", stderr: "e", timed_out: false, duration_ms: 5, truncated: false })
    : json(200, SANDBOX));
  const sbx = await Sandbox.connect("sbx-1", { ...OPTS, fetch });
  const run = await sbx.exec(["python3", "-c", "x"], { timeoutSeconds: 5, cwd: "/work", env: { A: "b" } });
  assert.equal(run.exitCode, 3);
  assert.equal(run.timedOut, false);
  assert.equal(run.durationMs, 5);
  assert.deepEqual(JSON.parse(sent[1]!.body!), { cmd: ["python3", "-c", "x"], timeout_seconds: 5,
    env: { A: "b" }, cwd: "/work" });
});

test("exec with callbacks streams over SSE, chunks split anywhere", async () => {
  const events = 'event: stdout\ndata: {"data": "hé"}\n\nevent: stderr\ndata: {"data": "err"}\n\n' +
    'event: stdout\r\ndata: {"data": "llo"}\r\n\r\nevent: exit\ndata: {"exit_code": 0, "stdout": "", ' +
    '"stderr": "", "timed_out": false, "duration_ms": 1, "truncated": false}\n\n';
  const bytes = new TextEncoder().encode(events);
  const chunks: string[] = [];
  // split inside the two-byte "é" and between \r and \n
  const cuts = [0, 27, 29, 70, 71, bytes.length];
  for (let i = 0; i + 1 < cuts.length; i++) chunks.push(new TextDecoder().decode(bytes.slice(cuts[i], cuts[i + 1]), { stream: true }));
  const { fetch, sent } = mockFetch((req) => req.url.pathname.endsWith("/exec/stream")
    ? new Response(new ReadableStream({ start(c) { for (let i = 0; i + 1 < cuts.length; i++) c.enqueue(bytes.slice(cuts[i], cuts[i + 1])); c.close(); } }), { status: 200 })
    : json(200, SANDBOX));
  const sbx = await Sandbox.connect("sbx-1", { ...OPTS, fetch });
  const out: string[] = [];
  const err: string[] = [];
  const run = await sbx.exec("echo", { onStdout: (t) => { out.push(t); }, onStderr: (t) => { err.push(t); } });
  assert.deepEqual(out, ["hé", "llo"]);
  assert.deepEqual(err, ["err"]);
  assert.equal(run.stdout, "héllo");
  assert.equal(run.stderr, "err");
  assert.equal(sent[1]!.headers.get("accept"), "text/event-stream");
  assert.ok(chunks.length > 0);
});

test("an error event in the exec stream throws its error class", async () => {
  const { fetch } = mockFetch((req) => req.url.pathname.endsWith("/stream")
    ? sse(['event: error\ndata: {"error": {"code": "conflict", "message": "not running", "request_id": "r-9"}}\n\n'])
    : json(200, SANDBOX));
  const sbx = await Sandbox.connect("sbx-1", { ...OPTS, fetch });
  await assert.rejects(sbx.exec("x", { onStdout: () => undefined }), (e: unknown) =>
    e instanceof ConflictError && e.status === 409 && e.requestId === "r-9");
});

test("error envelopes map to the error tree, with status, code and requestId", async () => {
  const cases: [number, string, unknown][] = [
    [401, "unauthorized", AuthenticationError], [404, "not_found", NotFoundError],
    [409, "host_lost", HostLostError], [408, "timeout", WaitTimeoutError],
    [422, "validation_error", InvalidRequestError], [503, "host_unavailable", ServerError],
    [500, "internal", ServerError],
  ];
  for (const [status, code, cls] of cases) {
    const { fetch } = mockFetch(() => json(status, { error: { code, message: "m", request_id: "req-1" } }));
    await assert.rejects(Sandbox.connect("x", { ...OPTS, fetch }), (e: unknown) => {
      assert.ok(e instanceof (cls as typeof PandastackError), `${status} ${code}: ${String(e)}`);
      assert.equal((e as PandastackError).status, status);
      assert.equal((e as PandastackError).code, code);
      assert.equal((e as PandastackError).requestId, "req-1");
      return true;
    });
  }
});

test("429 carries retryAfter; quota_exceeded its limit", async () => {
  let { fetch } = mockFetch(() => json(429, { error: { code: "rate_limited", message: "slow" } }, { "retry-after": "7" }));
  await assert.rejects(Sandbox.connect("x", { ...OPTS, fetch }), (e: unknown) => e instanceof RateLimitError && e.retryAfter === 7);
  ({ fetch } = mockFetch(() => json(429, { error: { code: "quota_exceeded", message: "q", limit: "max_sandboxes", value: 2, current: 2 } })));
  await assert.rejects(Sandbox.connect("x", { ...OPTS, fetch }), (e: unknown) =>
    e instanceof QuotaExceededError && e.limit === "max_sandboxes" && e.value === 2);
});

test("a bare 5xx without an envelope is a ServerError; a dead server an APIConnectionError", async () => {
  let { fetch } = mockFetch(() => new Response("bad gateway", { status: 502 }));
  await assert.rejects(Sandbox.connect("x", { ...OPTS, fetch }), (e: unknown) =>
    e instanceof ServerError && e.code === "unavailable" && e.message.includes("bad gateway"));
  ({ fetch } = mockFetch(() => { throw new TypeError("fetch failed"); }));
  await assert.rejects(Sandbox.connect("x", { ...OPTS, fetch }), APIConnectionError);
});

test("a silent server is a TransportTimeoutError, also a PandastackTimeoutError", async () => {
  const fetch = ((_: unknown, init?: RequestInit) => new Promise<Response>((_resolve, reject) => {
    init?.signal?.addEventListener("abort", () => reject(new DOMException("aborted", "AbortError")));
  })) as typeof globalThis.fetch;
  await assert.rejects(Sandbox.connect("x", { ...OPTS, fetch, timeout: 0.05 }), (e: unknown) =>
    e instanceof TransportTimeoutError && e instanceof PandastackTimeoutError && e instanceof APIConnectionError);
  assert.ok(new WaitTimeoutError("w", { status: 408, code: "timeout" }) instanceof PandastackTimeoutError);
  assert.ok(!(new NotFoundError("n", { status: 404, code: "not_found" }) instanceof PandastackTimeoutError));
});

test("kill is idempotent and a 404 counts as killed; await using kills", async () => {
  const { fetch, sent } = mockFetch((req) => req.method === "DELETE"
    ? json(404, { error: { code: "not_found", message: "gone" } }) : json(200, SANDBOX));
  {
    await using sbx = await Sandbox.connect("sbx-1", { ...OPTS, fetch });
    assert.equal(sbx.id, "sbx-1");
  }
  assert.equal(sent.filter((r) => r.method === "DELETE").length, 1);
});

test("fork hands back child handles; getUrl needs no request", async () => {
  const { fetch, sent } = mockFetch((req) => req.url.pathname.endsWith("/fork")
    ? json(201, { sandboxes: [{ ...SANDBOX, id: "c1" }, { ...SANDBOX, id: "c2" }, { ...SANDBOX, id: "c3" }] })
    : json(200, SANDBOX));
  const sbx = await Sandbox.connect("sbx-1", { ...OPTS, fetch });
  const kids = await sbx.fork({ count: 3 });
  assert.deepEqual(kids.map((k) => k.id), ["c1", "c2", "c3"]);
  assert.deepEqual(JSON.parse(sent[1]!.body!), { count: 3 });
  assert.equal(sbx.getUrl(8000), "http://api.test/v1/sandboxes/sbx-1/ports/8000/");
  assert.throws(() => sbx.getUrl(0), InvalidRequestError);
  assert.equal(sent.length, 2);
});

test("list filters and pages as the Python SDK does", async () => {
  const { fetch, sent } = mockFetch(() => json(200, { sandboxes: [SANDBOX, { ...SANDBOX, id: "old", state: "killed" }], next_token: "t2" }));
  const page = await Sandbox.list({ ...OPTS, fetch, metadata: { role: "a" }, limit: 2 });
  assert.deepEqual(page.map((s) => s.id), ["sbx-1"]);
  assert.equal(page.nextToken, "t2");
  const q = sent[0]!.url.searchParams;
  assert.equal(q.get("metadata.role"), "a");
  assert.equal(q.get("include_ended"), "false");
  assert.equal(q.get("limit"), "2");
});

test("getOrCreate PUTs the create by name; create sends the name", async () => {
  const { fetch, sent } = mockFetch(() => json(200, { ...SANDBOX, name: "agent-7" }));
  const sbx = await Sandbox.getOrCreate("agent-7", { ...OPTS, fetch, ttlSeconds: 60 });
  assert.equal(sbx.id, "sbx-1");
  assert.equal(sent[0]!.method, "PUT");
  assert.equal(sent[0]!.url.pathname, "/v1/sandboxes/by-name/agent-7");
  assert.deepEqual(JSON.parse(sent[0]!.body!), { template: "base", ttl_seconds: 60, persistent: false, name: "agent-7" });
  await Sandbox.create({ ...OPTS, fetch, name: "other" });
  assert.equal(sent[1]!.method, "POST");
  assert.equal(JSON.parse(sent[1]!.body!).name, "other");
});

test("hostId on create, getOrCreate and fork is sent as host_id; a team key's 403 is PermissionDeniedError", async () => {
  const { fetch, sent } = mockFetch((req) => {
    const body = req.body === undefined ? {} : JSON.parse(req.body);
    if (body.host_id === "host-team") return json(403, { error: { code: "forbidden", message: "only an admin key may choose the host (host_id)" } });
    if (req.url.pathname.endsWith("/fork")) return json(201, { parent: "sbx-1", sandboxes: [{ ...SANDBOX, id: "c1", host_id: body.host_id }] });
    return json(201, { ...SANDBOX, host_id: body.host_id });
  });
  const sbx = await Sandbox.create({ ...OPTS, fetch, hostId: "host-b" });
  assert.equal(JSON.parse(sent[0]!.body!).host_id, "host-b");
  assert.equal(sbx.info.hostId, "host-b");
  await Sandbox.getOrCreate("pinned", { ...OPTS, fetch, hostId: "host-a" });
  assert.equal(JSON.parse(sent[1]!.body!).host_id, "host-a");
  const [child] = await sbx.fork({ hostId: "host-a" });
  assert.deepEqual(JSON.parse(sent[2]!.body!), { count: 1, host_id: "host-a" });
  assert.equal(child!.info.hostId, "host-a");
  await sbx.fork();
  assert.deepEqual(JSON.parse(sent[3]!.body!), { count: 1 });
  await assert.rejects(Sandbox.create({ ...OPTS, fetch, hostId: "host-team" }), PermissionDeniedError);
  await assert.rejects(sbx.fork({ hostId: "host-team" }), PermissionDeniedError);
});

test("a listed handle has its info's fields as read-only properties; refresh updates them", async () => {
  let state = "running";
  const listed = { ...SANDBOX, host_id: "host-a", expires_at: 901, ttl_seconds: 900, name: "w1",
    volumes: [{ id: "vol-1", name: "data", mount_path: "/data", read_only: false }] };
  const { fetch } = mockFetch((req) => req.url.pathname === "/v1/sandboxes"
    ? json(200, { sandboxes: [listed] }) : json(200, { ...listed, state }));
  const [sbx] = await Sandbox.list({ ...OPTS, fetch });
  assert.equal(sbx!.state, "running");
  assert.equal(sbx!.template, "base");
  assert.equal(sbx!.name, "w1");
  assert.deepEqual(sbx!.metadata, { role_name: "worker" });
  assert.equal(sbx!.hostId, "host-a");
  assert.equal(sbx!.createdAt, 1);
  assert.equal(sbx!.expiresAt, 901);
  assert.equal(sbx!.ttlSeconds, 900);
  assert.equal(sbx!.persistent, false);
  assert.equal(sbx!.vcpus, 1);
  assert.equal(sbx!.memoryMb, 512);
  assert.equal(sbx!.diskMb, null);
  assert.deepEqual(sbx!.volumes, [{ id: "vol-1", name: "data", mountPath: "/data", readOnly: false }]);
  assert.equal(sbx!.endedAt, null);
  assert.equal(sbx!.endReason, null);
  assert.equal(sbx!.stopReason, null);
  assert.equal(sbx!.restoredFrom, null);
  assert.throws(() => { (sbx as unknown as { state: string }).state = "paused"; }, TypeError);
  sbx!.metadata["role_name"] = "changed"; // a copy: the handle's info is untouched
  assert.deepEqual(sbx!.info.metadata, { role_name: "worker" });
  state = "paused";
  assert.equal(sbx!.state, "running"); // as listed, until it asks again
  await sbx!.refresh();
  assert.equal(sbx!.state, "paused");
});

test("getMetrics takes its default and bounds from the API document's window_ms", async () => {
  const metrics = { cpu_percent: 1.5, cpu_count: 1, memory_used_bytes: 1, memory_total_bytes: 2,
    disk_used_bytes: 3, disk_total_bytes: 4, window_ms: 200, sampled_at: "2026-01-01T00:00:00Z" };
  const { fetch, sent } = mockFetch((req) => req.url.pathname.endsWith("/metrics")
    ? json(200, metrics) : json(200, SANDBOX));
  const sbx = await Sandbox.connect("sbx-1", { ...OPTS, fetch });
  assert.equal((await sbx.getMetrics()).windowMs, 200);
  assert.equal(sent[1]!.url.searchParams.get("window_ms"), "200");
  await sbx.getMetrics({ windowMs: 10 });
  await sbx.getMetrics({ windowMs: 2000 });
  assert.deepEqual(sent.slice(2).map((r) => r.url.searchParams.get("window_ms")), ["10", "2000"]);
  for (const windowMs of [9, 2001, 1.5]) {
    await assert.rejects(sbx.getMetrics({ windowMs }), (err: Error) =>
      err instanceof InvalidRequestError && /from 10 to 2000, not /.test(err.message));
  }
  assert.equal(sent.length, 4);
});
