// Against a live server booting real VMs: run by tests/e2e/test_sdk_ts.py with PANDASTACK_API
// and PANDASTACK_API_KEY in the environment (the SDK's own config path, as a user would).
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import v8 from "node:v8";
import vm from "node:vm";

import { Client, InvalidRequestError, NotFoundError, Sandbox } from "../../src/index.js";

const STEP_BROKEN = "import sys\nprint('working')\nprint(1 / 0)\n";
const STEP_FIXED = "print('working')\nopen('/work/out.bin', 'wb').write(bytes(range(256)))\nprint('done')\n";

let sbx: Sandbox;

before(async () => {
  sbx = await Sandbox.create({ ttlSeconds: 900, metadata: { test: "sdk-ts" } });
});

after(async () => {
  await sbx?.kill();
});

test("the seed's agent loop: write, exec, read the traceback, fix, exec again, read bytes", async () => {
  await sbx.files.write("/work/step.py", STEP_BROKEN);
  const failed = await sbx.exec("python3 /work/step.py", { timeoutSeconds: 120 });
  assert.notEqual(failed.exitCode, 0);
  assert.equal(failed.stdout, "working\n");
  assert.match(failed.stderr, /Traceback \(most recent call last\)/);
  assert.match(failed.stderr, /ZeroDivisionError/);

  await sbx.files.write("/work/step.py", STEP_FIXED);
  const fixed = await sbx.exec("python3 /work/step.py", { timeoutSeconds: 120 });
  assert.equal(fixed.exitCode, 0, fixed.stderr);
  assert.equal(fixed.stdout, "working\ndone\n");
  const out = await sbx.files.read("/work/out.bin");
  assert.ok(out instanceof Uint8Array);
  assert.deepEqual(Array.from(out), Array.from({ length: 256 }, (_, i) => i));
  assert.equal(await sbx.files.read("/work/step.py", { format: "text" }), STEP_FIXED);
  assert.equal((await sbx.files.stat("/work/out.bin")).size, 256);
  assert.ok(await sbx.files.exists("/work/out.bin"));
  assert.ok(!(await sbx.files.exists("/work/nope")));
});

test("a listed handle carries its info's fields: state, template, metadata, createdAt", async () => {
  const listed = (await Sandbox.list({ metadata: { test: "sdk-ts" } })).find((s) => s.id === sbx.id);
  assert.ok(listed);
  assert.equal(listed.state, "running");
  assert.equal(listed.template, "base");
  assert.deepEqual(listed.metadata, { test: "sdk-ts" });
  assert.equal(listed.createdAt, sbx.createdAt);
  assert.equal(listed.expiresAt, sbx.info.expiresAt);
});

test("streaming exec hands each chunk over as the command writes it", async () => {
  const seen: { text: string; at: number }[] = [];
  const errors: string[] = [];
  const run = await sbx.exec(
    ["python3", "-u", "-c", "import sys, time\nfor i in range(3):\n    print(f'tick {i}')\n    time.sleep(0.5)\nprint('oops', file=sys.stderr)"],
    { timeoutSeconds: 120, onStdout: (text) => { seen.push({ text, at: Date.now() }); },
      onStderr: (text) => { errors.push(text); } });
  assert.equal(run.exitCode, 0);
  assert.equal(seen.map((s) => s.text).join(""), "tick 0\ntick 1\ntick 2\n");
  assert.ok(seen.length >= 2, `the output came in one piece: ${JSON.stringify(seen)}`);
  assert.equal(errors.join(""), "oops\n");
  assert.equal(run.stdout, "tick 0\ntick 1\ntick 2\n");
});

test("a background process: stdin in, output streamed, exit result", async () => {
  const proc = await sbx.commands.start(["python3", "-u", "-c", "import sys\nfor line in sys.stdin:\n    print('got', line.strip())"]);
  await proc.sendStdin("a\nb\n", { eof: true });
  const chunks: string[] = [];
  let exitCode: number | undefined;
  for await (const event of proc.stream({ timeoutSeconds: 120 })) {
    if (event.type === "stdout") chunks.push(event.data);
    if (event.type === "exit") exitCode = event.result.exitCode;
  }
  assert.equal(chunks.join(""), "got a\ngot b\n");
  assert.equal(exitCode, 0);
  assert.ok((await sbx.commands.list()).some((p) => p.pid === proc.pid));
});

test("files: mkdir, list, rename, remove; a streamed write", async () => {
  await sbx.files.mkdir("/work/d/e");
  async function* parts() {
    for (let i = 0; i < 4; i++) yield new TextEncoder().encode(`part ${i}\n`);
  }
  await sbx.files.write("/work/d/e/streamed.txt", parts());
  assert.deepEqual((await sbx.files.list("/work/d/e")).map((e) => e.name), ["streamed.txt"]);
  await sbx.files.rename("/work/d/e/streamed.txt", "/work/d/moved.txt");
  assert.equal(await sbx.files.read("/work/d/moved.txt", { format: "text" }), "part 0\npart 1\npart 2\npart 3\n");
  await sbx.files.remove("/work/d", { recursive: true });
  await assert.rejects(sbx.files.stat("/work/d"), NotFoundError);
});

test("files: grep and glob, walked in the guest; a pattern too long is a 422", async () => {
  await sbx.files.write("/work/g/a.txt", "one\nTwo two\n");
  await sbx.files.write("/work/g/sub/b.py", "two = 2\n");
  const found = await sbx.files.grep("/work/g", "two", { ignoreCase: true });
  assert.deepEqual(found, { matches: [{ path: "/work/g/a.txt", line: 2, text: "Two two" },
    { path: "/work/g/sub/b.py", line: 1, text: "two = 2" }], truncated: false });
  assert.deepEqual(await sbx.files.glob("/work/g", "**/*.py"), { paths: ["/work/g/sub/b.py"], truncated: false });
  await assert.rejects(sbx.files.grep("/work/g", "x".repeat(1025)),
    (err: unknown) => err instanceof InvalidRequestError && err.status === 422);
  await assert.rejects(sbx.files.glob("/work/nope", "*"), NotFoundError);
});

test("fork with three children: each has the parent's files, and its own id", async () => {
  await sbx.files.write("/work/parent.txt", "from the parent");
  const children = await sbx.fork({ count: 3 });
  try {
    assert.equal(children.length, 3);
    assert.equal(new Set(children.map((c) => c.id).concat(sbx.id)).size, 4);
    const reads = await Promise.all(children.map((c) => c.files.read("/work/parent.txt", { format: "text" })));
    assert.deepEqual(reads, ["from the parent", "from the parent", "from the parent"]);
    await children[0]!.files.write("/work/parent.txt", "changed in a child");
    assert.equal(await sbx.files.read("/work/parent.txt", { format: "text" }), "from the parent");
  } finally {
    await Promise.all(children.map((c) => c.kill()));
  }
  const client = new Client();
  for (const child of children) {
    const state = await client.sandboxes.get(child.id).then((i) => i.state, () => "killed");
    assert.ok(["killed", "expired", "reaped", "failed"].includes(state), `${child.id}: ${state}`);
  }
});

test("a 50 MB file streamed up and down, never held in the client's memory", async () => {
  const MiB = 1 << 20;
  // Counted, not measured: how many of the 1 MiB chunks are still reachable, sampled after
  // forced collections (heap figures count backing stores V8 has not swept yet, and read
  // 50 MB for a stream that holds 5 chunks). Holding the file would keep all 50.
  v8.setFlagsFromString("--expose-gc");
  const gc = vm.runInNewContext("gc") as () => void;
  let made = 0;
  let freed = 0;
  let peak = 0;
  let sampling = true;
  const registry = new FinalizationRegistry(() => { freed++; });
  const track = (chunk: Uint8Array) => { registry.register(chunk, null); made++; return chunk; };
  const sampler = (async () => {
    while (sampling) {
      gc();
      await new Promise((resolve) => setTimeout(resolve, 30));
      peak = Math.max(peak, made - freed);
    }
  })();
  const sent = createHash("sha256");
  async function* fifty() {
    for (let i = 0; i < 50; i++) {
      const block = track(new Uint8Array(MiB));
      for (let j = 0; j < MiB; j += 4096) block[j] = (i + j) & 0xff; // each MiB differs
      sent.update(block);
      yield block;
    }
  }
  let upPeak: number;
  const got = createHash("sha256");
  let size = 0;
  try {
    await sbx.files.write("/work/big.bin", fifty());
    upPeak = peak;
    peak = 0;
    made = freed = 0;
    for await (const chunk of await sbx.files.read("/work/big.bin", { format: "stream" })) {
      got.update(track(chunk));
      size += chunk.length;
    }
  } finally {
    sampling = false;
    await sampler;
  }
  assert.equal(size, 50 * MiB);
  assert.equal(got.digest("hex"), sent.digest("hex"));
  assert.ok(upPeak < 25, `${upPeak} of the 50 uploaded chunks were alive at once`);
  const downChunks = made; // the server's chunks are smaller than a MiB: bound by bytes
  assert.ok(peak < downChunks / 2, `${peak} of the ${downChunks} downloaded chunks were alive at once`);
  await sbx.files.remove("/work/big.bin");
});

test("a terminal: typed input, its output, its exit code", async () => {
  const pty = await sbx.pty.create({ cmd: ["sh", "-c", "read x; echo got-$x; exit 3"], cols: 100, rows: 30 });
  await pty.resize(120, 40);
  await pty.sendStdin("hi\n");
  let seen = "";
  for await (const data of pty) seen += new TextDecoder().decode(data);
  assert.match(seen, /got-hi/);
  assert.equal(pty.exitCode, 3);
  assert.equal(await pty.wait(), 3);
  await pty.disconnect();
});

test("a file watch sees a file created and written", async () => {
  await sbx.files.mkdir("/work/watched");
  const watch = await sbx.files.watch("/work/watched");
  try {
    await sbx.files.write("/work/watched/a.txt", "x");
    const types: string[] = [];
    for await (const event of watch) {
      assert.equal(event.path, "/work/watched/a.txt");
      types.push(event.type);
      if (event.type === "write") break;
    }
    assert.ok(types.includes("write"), JSON.stringify(types));
  } finally {
    await watch.stop();
  }
  assert.ok(watch.stopped);
  await sbx.files.remove("/work/watched", { recursive: true });
});

test("runCode: rich results (a PNG), state kept, the error with its traceback", async () => {
  await using ci = await Sandbox.create({ template: "code-interpreter", ttlSeconds: 600, metadata: { test: "sdk-ts" } });
  const results: string[] = [];
  const plot = await ci.runCode(
    "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()\nx = 41",
    { onResult: (r) => { results.push(...r.formats()); } });
  assert.equal(plot.error, undefined, JSON.stringify(plot.error));
  const png = plot.results.find((r) => r.png !== undefined);
  assert.ok(png, `no PNG among ${JSON.stringify(plot.results.map((r) => r.formats()))}`);
  assert.deepEqual(Array.from(png.pngBytes()!.slice(0, 4)), [0x89, 0x50, 0x4e, 0x47]);
  assert.ok(results.includes("image/png"));
  assert.equal((await ci.runCode("x + 1")).text, "42");
  const failed = await ci.runCode("1 / 0");
  assert.equal(failed.error?.name, "ZeroDivisionError");
  assert.match(failed.error?.traceback ?? "", /ZeroDivisionError/);
});

test("a template built from Dockerfile text with a COPY of its context, its log followed; a sandbox of it", async () => {
  const client = new Client();
  const name = `sdk-ts-${process.pid}`;
  const lines: string[] = [];
  const context = mkdtempSync(join(tmpdir(), "psts-ctx-"));
  try {
    mkdirSync(join(context, "app", "conf"), { recursive: true });
    writeFileSync(join(context, "app", "conf", "hello.txt"), "copied-by-ts\n");
    writeFileSync(join(context, "app", "run.sh"), "#!/bin/sh\necho ran\n", { mode: 0o755 });
    const built = await client.templates.build(
      "FROM base\nRUN echo built-by-ts > /etc/sdk-ts-mark\nCOPY app /srv/app/\nENV MARK=ts\n", name,
      { contextDir: context, onLog: (line) => { lines.push(line); }, timeoutSeconds: 900 });
    try {
      assert.equal(built.status, "ready");
      assert.ok(lines.length > 0, "no log line came");
      await using made = await Sandbox.create({ template: name, ttlSeconds: 300, metadata: { test: "sdk-ts" } });
      const run = await made.exec("cat /etc/sdk-ts-mark; echo $MARK; cat /srv/app/conf/hello.txt; /srv/app/run.sh");
      assert.equal(run.stdout, "built-by-ts\nts\ncopied-by-ts\nran\n", run.stderr);
    } finally {
      await client.templates.delete(name);
    }
  } finally {
    rmSync(context, { recursive: true, force: true });
  }
  assert.ok(!existsSync(context));
  await assert.rejects(client.templates.get(name), NotFoundError);
});
