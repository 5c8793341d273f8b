// The CA bundle option against a real TLS server: certificates made here with openssl (a CA
// and a certificate for 127.0.0.1 it issued), a fake API on node:https, and the runtime's own
// fetch. With the CA (`caBundle`, or PANDASTACK_CA_BUNDLE) the SDK talks to it; without, or
// with another CA, it fails at once with a certificate error that says what to do.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:https";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { APIConnectionError, ConfigError, Sandbox } from "../../src/index.js";

const SANDBOX = { id: "sbx-1", state: "running", template: "base", vcpus: 1, memory_mb: 512, created_at: 1,
  persistent: false, metadata: {} };

const dir = mkdtempSync(join(tmpdir(), "psts-tls-"));
const file = (name: string) => join(dir, name);
let api = "";
let server: Server;

function openssl(...args: string[]): void {
  execFileSync("openssl", args, { cwd: dir, stdio: "ignore" });
}

function makeCa(name: string): void {
  openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
    "-subj", `/CN=${name}`, "-addext", "basicConstraints=critical,CA:TRUE",
    "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-keyout", `${name}.key`, "-out", `${name}.pem`);
}

before(async () => {
  makeCa("ca");
  makeCa("other");
  writeFileSync(file("server.ext"), "basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n" +
    "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
  openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
    "-subj", "/CN=localhost", "-keyout", "server.key", "-out", "server.csr");
  openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
    "-days", "2", "-extfile", "server.ext", "-out", "server.pem");
  server = createServer({ cert: readFileSync(file("server.pem")), key: readFileSync(file("server.key")) },
    (req, res) => {
      const ok = req.url === "/v1/sandboxes/sbx-1" && req.headers.authorization === "Bearer k-1";
      res.writeHead(ok ? 200 : 404, { "content-type": "application/json" });
      res.end(JSON.stringify(ok ? SANDBOX : { error: { code: "not_found", message: String(req.url) } }));
    });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  api = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

after(async () => {
  server.closeAllConnections?.();
  await new Promise<void>((resolve) => server.close(() => resolve()));
  rmSync(dir, { recursive: true, force: true });
});

test("caBundle: the SDK trusts a server the CA issued, by option or PANDASTACK_CA_BUNDLE", async () => {
  const sbx = await Sandbox.connect("sbx-1", { apiUrl: api, apiKey: "k-1", caBundle: file("ca.pem") });
  assert.equal(sbx.id, "sbx-1");
  process.env["PANDASTACK_CA_BUNDLE"] = file("ca.pem");
  try {
    const again = await Sandbox.connect("sbx-1", { apiUrl: api, apiKey: "k-1" });
    assert.equal(again.id, "sbx-1");
  } finally {
    delete process.env["PANDASTACK_CA_BUNDLE"];
  }
});

test("caBundle: without the CA, a certificate error that names the option, at once", async () => {
  const started = Date.now();
  for (const caBundle of [undefined, file("other.pem")]) {
    await assert.rejects(Sandbox.connect("sbx-1", { apiUrl: api, apiKey: "k-1", timeout: 10, caBundle }),
      (err: unknown) => err instanceof APIConnectionError && /caBundle or PANDASTACK_CA_BUNDLE/.test(err.message));
  }
  assert.ok(Date.now() - started < 8000, "refused at the handshake, not timed out");
  await assert.rejects(Sandbox.connect("sbx-1", { apiUrl: api, apiKey: "k-1", caBundle: file("nope.pem") }),
    (err: unknown) => err instanceof ConfigError && /nope\.pem/.test(err.message));
});
