// The runtime's own fetch, not a scripted one: a fake API on 127.0.0.1 (node:http, which Bun
// and Deno provide too) answers the SDK over real sockets. This is what tells whether a
// runtime's fetch does what the SDK asks of it: a streamed upload from an async iterable
// (duplex "half"), a streamed download, and an SSE response read as it arrives.
// tests/sdk/test_ts_runtimes.py runs the unit tests, this file among them, under Bun and Deno.
import assert from "node:assert/strict";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { after, before, test } from "node:test";

import { Sandbox } from "../../src/index.js";

const SANDBOX = { id: "sbx-1", state: "running", template: "base", vcpus: 1, memory_mb: 512, created_at: 1,
  persistent: false, metadata: {} };
const CHUNK = 64 * 1024;
const CHUNKS = 16;

let api = "";
const uploads: number[] = [];
const server = createServer((req: IncomingMessage, res: ServerResponse) => {
  const url = new URL(req.url ?? "/", "http://x");
  const reply = (status: number, body: unknown) => {
    res.writeHead(status, { "content-type": "application/json" });
    res.end(JSON.stringify(body));
  };
  if (req.headers.authorization !== "Bearer k-1") return reply(401, { error: { code: "unauthorized", message: "no key" } });
  if (url.pathname === "/v1/sandboxes/sbx-1") return reply(200, SANDBOX);
  if (url.pathname === "/v1/sandboxes/sbx-1/exec/stream") {
    res.writeHead(200, { "content-type": "text/event-stream" });
    // Written in pieces with pauses, split inside an event: the reader must not wait for the end.
    const pieces = ['event: stdout\ndata: {"data": "he', 'llo"}\n\n', 'event: exit\ndata: {"exit_code": 3, "stdout": "", ' +
      '"stderr": "", "timed_out": false, "duration_ms": 1, "truncated": false}\n\n'];
    const next = () => {
      const piece = pieces.shift();
      if (piece === undefined) return res.end();
      res.write(piece);
      setTimeout(next, 20);
    };
    return next();
  }
  if (url.pathname === "/v1/sandboxes/sbx-1/files" && req.method === "PUT") {
    let size = 0;
    req.on("data", (chunk: Buffer) => { size += chunk.length; });
    req.on("end", () => {
      uploads.push(size);
      reply(200, { path: url.searchParams.get("path"), size });
    });
    return;
  }
  if (url.pathname === "/v1/sandboxes/sbx-1/files" && req.method === "GET") {
    res.writeHead(200, { "content-type": "application/octet-stream" });
    for (let i = 0; i < CHUNKS; i++) res.write(Buffer.alloc(CHUNK, i));
    return res.end();
  }
  reply(404, { error: { code: "not_found", message: url.pathname } });
});

before(async () => {
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  api = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(async () => {
  server.closeAllConnections?.();
  await new Promise<void>((resolve) => server.close(() => resolve()));
});

test("the runtime's fetch: exec streamed over SSE as it comes", async () => {
  const sbx = await Sandbox.connect("sbx-1", { apiUrl: api, apiKey: "k-1" });
  const out: string[] = [];
  const run = await sbx.exec("echo hello", { onStdout: (t) => { out.push(t); } });
  assert.deepEqual(out, ["hello"]);
  assert.equal(run.exitCode, 3);
  assert.equal(run.stdout, "hello");
});

test("the runtime's fetch: an upload streamed from an async iterable, a download streamed", async () => {
  const sbx = await Sandbox.connect("sbx-1", { apiUrl: api, apiKey: "k-1" });
  async function* body() {
    for (let i = 0; i < CHUNKS; i++) yield new Uint8Array(CHUNK).fill(i);
  }
  const written = await sbx.files.write("/work/big.bin", body());
  assert.deepEqual(written, { path: "/work/big.bin", size: CHUNK * CHUNKS });
  assert.deepEqual(uploads, [CHUNK * CHUNKS]);
  let got = 0;
  let last = -1;
  for await (const chunk of await sbx.files.read("/work/big.bin", { format: "stream" })) {
    got += chunk.length;
    last = chunk[chunk.length - 1]!;
  }
  assert.equal(got, CHUNK * CHUNKS);
  assert.equal(last, CHUNKS - 1);
});
