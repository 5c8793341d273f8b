// The Template builder and the reading of a build context (src/template.ts, src/copy.ts).
// tests/sdk/test_ts_parity.py compares both with Python's on a bigger tree; these pin the
// SDK's own behaviour: what is sent, when files are read, and what is refused.
import assert from "node:assert/strict";
import { chmodSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";

import { Client, InvalidRequestError, Template, fromDockerfile, waitForCommand, waitForPort } from "../../src/index.js";
import { OPTS, json, mockFetch } from "./mock.js";

const dir = mkdtempSync(join(tmpdir(), "psts-ctx-"));
after(() => rmSync(dir, { recursive: true, force: true }));

const ctx = join(dir, "ctx");
mkdirSync(join(ctx, "app", "lib"), { recursive: true });
writeFileSync(join(ctx, "app", "main.py"), "print('hi')\n");
writeFileSync(join(ctx, "app", "lib", "run.sh"), "#!/bin/sh\n");
chmodSync(join(ctx, "app", "lib", "run.sh"), 0o755);
writeFileSync(join(dir, "secret"), "outside\n");
mkdirSync(join(ctx, "out"));
symlinkSync("../../secret", join(ctx, "out", "leak"));

const b64 = (text: string) => Buffer.from(text).toString("base64");
const isInvalid = (pattern: RegExp) => (e: unknown) => e instanceof InvalidRequestError && pattern.test(e.message);

test("Template: each method adds its step; start and ready end the spec", () => {
  const spec = new Template("python").aptInstall("curl").pipInstall("flask==3.0.0").npmInstall("left-pad")
    .run(["echo", "hi"]).env({ A: "1" }).workdir("/srv").user("app")
    .start("python -m http.server 8000", waitForPort(8000, 30)).toSpec();
  assert.deepEqual(spec, {
    from_template: "python",
    steps: [{ kind: "apt", packages: ["curl"] }, { kind: "pip", packages: ["flask==3.0.0"] },
      { kind: "npm", packages: ["left-pad"] }, { kind: "run", command: ["echo", "hi"] },
      { kind: "env", env: { A: "1" } }, { kind: "workdir", path: "/srv" }, { kind: "user", name: "app" }],
    start: "python -m http.server 8000",
    ready: { kind: "port", value: "8000", timeout_seconds: 30 },
  });
  assert.deepEqual(new Template().toSpec(), { from_template: "base", steps: [] });
});

test("Template: a bad step fails where it is written", () => {
  assert.throws(() => new Template().pipInstall("bad name"), isInvalid(/invalid pip package name 'bad name'/));
  assert.throws(() => new Template().aptInstall(), isInvalid(/apt needs at least one package/));
  assert.throws(() => new Template().user("root:root:root"), isInvalid(/invalid user 'root:root:root'/));
  for (const bad of ["1000:", ":staff", "App", "007", "2147483647", "app:Staff"]) {
    assert.throws(() => new Template().user(bad), isInvalid(/invalid user/), bad);
  }
  for (const good of ["app", "1000", "1000:1000", "app:staff", "app:1000", "1000:staff", "2147483646"]) {
    assert.deepEqual(new Template().user(good).toSpec().steps, [{ kind: "user", name: good }]);
  }
  assert.throws(() => waitForPort(70000), isInvalid(/ready port must be 1-65535/));
  assert.throws(() => new Template("no spaces").toSpec(), isInvalid(/invalid base template/));
  assert.deepEqual(waitForCommand("true"), { kind: "command", value: "true", timeout_seconds: 120 });
  assert.throws(() => new Template().start("").toSpec(), isInvalid(/String should have at least 1 character/));
});

test("Template.copy reads the files when it is called, with their modes", () => {
  const file = join(dir, "later.txt");
  writeFileSync(file, "before");
  const template = new Template().copy(join(ctx, "app"), "/srv/app/").copy(file, "/etc/later");
  writeFileSync(file, "after"); // not in the spec: it was read already
  assert.deepEqual(template.toSpec().steps, [
    { kind: "copy", dst: "/srv/app/", files: [
      { path: "lib/run.sh", mode: 0o755, content_b64: b64("#!/bin/sh\n") },
      { path: "main.py", mode: 0o644, content_b64: b64("print('hi')\n") }] },
    { kind: "copy", dst: "/etc", files: [{ path: "later", mode: 0o644, content_b64: b64("before") }] },
  ]);
});

test("COPY reads the context directory; without one, or out of it, it is refused", async () => {
  const spec = fromDockerfile("FROM base\nCOPY app/*.py /srv/\nCOPY /app/lib lib\n", ctx);
  assert.deepEqual(spec.steps, [
    { kind: "copy", dst: "/srv/", files: [{ path: "main.py", mode: 0o644, content_b64: b64("print('hi')\n") }] },
    { kind: "copy", dst: "lib", files: [{ path: "run.sh", mode: 0o755, content_b64: b64("#!/bin/sh\n") }] },
  ]);
  assert.throws(() => fromDockerfile("FROM base\nCOPY app /x\n"), isInvalid(/^Dockerfile line 2: COPY needs a build context directory$/));
  assert.throws(() => fromDockerfile("FROM base\nRUN true\nCOPY out /x/\n", ctx),
    isInvalid(/^Dockerfile line 3: .*out\/leak is outside the build context/));
  assert.throws(() => fromDockerfile("FROM base\nCOPY ../secret /x\n", ctx), isInvalid(/outside the build context/));

  const { fetch, sent } = mockFetch(() => json(202, { build_id: "b1", name: "app", version: 1, status: "building", created_at: 1 }));
  const client = new Client({ ...OPTS, fetch });
  await client.templates.build("FROM base\nCOPY app /srv/app/\n", "app", { contextDir: ctx, wait: false });
  const sentSpec = JSON.parse(sent[0]!.body!).spec;
  assert.deepEqual(sentSpec.steps[0].files.map((f: { path: string }) => f.path), ["lib/run.sh", "main.py"]);
  await client.templates.build(new Template().copy(join(ctx, "app", "main.py"), "/srv/"), "app", { wait: false });
  assert.deepEqual(JSON.parse(sent[1]!.body!).spec.steps[0].dst, "/srv/");
});
