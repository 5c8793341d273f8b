import assert from "node:assert/strict";
import { test } from "node:test";

import { Client, InvalidRequestError } from "../../src/index.js";
import { OPTS, json, mockFetch } from "./mock.js";

test("registries: login PUTs to the normalised registry; list and logout; bad input stays local", async () => {
  const stored = { registry: "docker.io", username: "bot", created_at: 1, updated_at: 2 };
  const { fetch, sent } = mockFetch((req) => req.method === "PUT" ? json(200, stored)
    : req.method === "GET" ? json(200, { credentials: [stored] }) : new Response(null, { status: 204 }));
  const client = new Client({ ...OPTS, fetch });
  const made = await client.registries.login("Index.Docker.io", "bot", "t0ken");
  assert.equal(sent[0]!.url.pathname, "/v1/registry-credentials/docker.io");
  assert.deepEqual(JSON.parse(sent[0]!.body!), { username: "bot", password: "t0ken" });
  assert.deepEqual([made.registry, made.username, made.updatedAt], ["docker.io", "bot", 2]);
  assert.deepEqual((await client.registries.list()).map((c) => c.registry), ["docker.io"]);
  await client.registries.logout("127.0.0.1:5000");
  assert.equal(sent[2]!.url.pathname, "/v1/registry-credentials/127.0.0.1%3A5000");
  const count = sent.length;
  await assert.rejects(client.registries.login("https://ghcr.io", "a", "p"), InvalidRequestError);
  await assert.rejects(client.registries.login("ghcr.io", "a:b", "p"), InvalidRequestError);
  await assert.rejects(client.registries.login("ghcr.io", "a", "secret\n"), (e: unknown) =>
    e instanceof InvalidRequestError && !e.message.includes("secret"));
  assert.equal(sent.length, count);
});
