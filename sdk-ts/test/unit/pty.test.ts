import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { WebSocketServer } from "ws";

import { NotFoundError, Sandbox } from "../../src/index.js";

// A stand-in of the server's terminal routes: POST .../pty answers a pid, the WebSocket
// echoes typed input as output, records resizes, and on "exit\n" sends the exit and closes.
async function fakeServer() {
  const seen: { auth?: string | undefined; resize?: unknown; body?: unknown } = {};
  const http = createServer((req, res) => {
    let body = "";
    req.on("data", (c) => { body += c; });
    req.on("end", () => {
      if (req.url === "/v1/sandboxes/sbx-1") {
        res.writeHead(200, { "content-type": "application/json" });
        res.end(JSON.stringify({ id: "sbx-1", state: "running", metadata: {} }));
      } else if (req.url === "/v1/sandboxes/sbx-1/pty" && req.method === "POST") {
        seen.body = JSON.parse(body);
        res.writeHead(201, { "content-type": "application/json" });
        res.end(JSON.stringify({ pid: 42 }));
      } else {
        res.writeHead(404).end();
      }
    });
  });
  const wss = new WebSocketServer({ noServer: true });
  http.on("upgrade", (req, socket, head) => {
    if (req.url !== "/v1/sandboxes/sbx-1/pty/42") {
      socket.end("HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n" +
        JSON.stringify({ error: { code: "not_found", message: "no terminal", request_id: "r-1" } }));
      return;
    }
    seen.auth = req.headers.authorization;
    wss.handleUpgrade(req, socket, head, (ws) => {
      ws.send(Buffer.from("recent> "), { binary: true });
      ws.on("message", (data, isBinary) => {
        if (!isBinary) {
          seen.resize = JSON.parse(data.toString());
          return;
        }
        ws.send(data, { binary: true });
        if (data.toString().includes("exit\n")) {
          ws.send(JSON.stringify({ type: "exit", exit_code: 3, signal: null }));
          ws.close(1000);
        }
      });
    });
  });
  await new Promise<void>((resolve) => http.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${(http.address() as AddressInfo).port}`;
  return { url, seen, close: () => { wss.close(); http.close(); } };
}

test("a terminal over the WebSocket: output, input, resize, exit code; a refused handshake", async () => {
  const server = await fakeServer();
  try {
    const sbx = await Sandbox.connect("sbx-1", { apiUrl: server.url, apiKey: "k-9" });
    const pty = await sbx.pty.create({ cmd: ["bash"], cols: 100, rows: 30 });
    assert.deepEqual(server.seen.body, { cols: 100, rows: 30, cmd: ["bash"] });
    assert.equal(server.seen.auth, "Bearer k-9");
    assert.equal(pty.pid, 42);
    await pty.resize(120, 40);
    await pty.sendStdin("ls\nexit\n");
    let out = "";
    for await (const data of pty) out += new TextDecoder().decode(data);
    assert.equal(out, "recent> ls\nexit\n");
    assert.deepEqual(server.seen.resize, { type: "resize", cols: 120, rows: 40 });
    assert.equal(pty.exitCode, 3);
    assert.equal(await pty.wait(), 3);
    await assert.rejects(sbx.pty.connect(7), (e: unknown) => e instanceof NotFoundError && e.requestId === "r-1");
    await assert.rejects(sbx.pty.create({ cols: 0 }), /cols and rows/);
  } finally {
    server.close();
  }
});

test("onData gets the output; wait() returns the exit code", async () => {
  const server = await fakeServer();
  try {
    const sbx = await Sandbox.connect("sbx-1", { apiUrl: server.url, apiKey: "k" });
    const pieces: string[] = [];
    const pty = await sbx.pty.connect(42, { onData: (d) => { pieces.push(new TextDecoder().decode(d)); } });
    await pty.sendStdin(new TextEncoder().encode("exit\n"));
    assert.equal(await pty.wait({ timeout: 30 }), 3);
    assert.deepEqual(pieces.join(""), "recent> exit\n");
    await assert.rejects((async () => { for await (const _ of pty) { /* owned by onData */ } })(), /onData/);
  } finally {
    server.close();
  }
});
