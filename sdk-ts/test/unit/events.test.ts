import assert from "node:assert/strict";
import { test } from "node:test";

import { Client, InvalidRequestError, InvalidSignature, verifySignature } from "../../src/index.js";
import { OPTS, json, mockFetch, sse } from "./mock.js";

const BODY = '{"id":1,"type":"sandbox.created","sandbox_id":"sbx-1"}';
// What the Python SDK's sign() makes of BODY at t=1700000000 under "whsec_test".
const V1 = "c8d2ce5e941887d126c87a13f5a377678d39d4b67b1c03d433bb48da4163a208";

test("events: ready, then camelCase events with their extras; Last-Event-ID from after", async () => {
  const { fetch, sent } = mockFetch(() => sse([
    'event: ready\ndata: {"after":4}\n\n',
    'id: 5\nevent: sandbox.forked\ndata: {"id":5,"type":"sandbox.forked","time":1,"team":"t","actor":"key_1",',
    '"sandbox_id":"sbx-1","template":"base","children":["sbx-2"]}\n\n: keep-alive\n\n',
  ]));
  const client = new Client({ ...OPTS, fetch });
  const stream = await client.events.stream(["sandbox.*"], { after: 4, reconnects: 0 });
  const got = [];
  for await (const e of stream) {
    got.push(e);
    if (got.length === 1) break;
  }
  await stream.stop();
  assert.equal(sent[0]!.url.pathname, "/v1/events");
  assert.equal(sent[0]!.url.searchParams.get("types"), "sandbox.*");
  assert.equal(sent[0]!.headers.get("last-event-id"), "4");
  assert.deepEqual(got.map((e) => [e.id, e.type, e.sandboxId, e.children]), [[5, "sandbox.forked", "sbx-1", ["sbx-2"]]]);
  assert.equal(stream.lastId, 5);
  await assert.rejects(client.events.stream("sandbox.nope"), InvalidRequestError);
});

test("webhooks: create sends url and events; deliveries come back camelCase", async () => {
  const { fetch, sent } = mockFetch((req) => req.method === "POST"
    ? json(201, { id: "wh_1", url: "https://x/", events: ["*"], created_at: 1, secret: "whsec_s" })
    : json(200, { deliveries: [{ id: 2, webhook_id: "wh_1", event_id: 9, event_type: "sandbox.killed",
      status: "delivered", attempts: 1, created_at: 1, response_status: 204 }] }));
  const client = new Client({ ...OPTS, fetch });
  const made = await client.webhooks.create("https://x/", ["*"]);
  assert.equal(made.secret, "whsec_s");
  assert.deepEqual(JSON.parse(sent[0]!.body!), { url: "https://x/", events: ["*"] });
  const [d] = await client.webhooks.deliveries("wh_1", { limit: 5 });
  assert.equal(sent[1]!.url.search, "?limit=5");
  assert.deepEqual([d!.webhookId, d!.responseStatus], ["wh_1", 204]);
});

test("verifySignature: the Python SDK's signature verifies; tampering, age and other secrets do not", () => {
  const headers = { "x-pandastack-signature": `t=1700000000,v1=${V1}` };
  assert.equal(verifySignature("whsec_test", headers, BODY, 300, { now: 1700000100 }).sandbox_id, "sbx-1");
  assert.throws(() => verifySignature("whsec_other", headers, BODY, 300, { now: 1700000100 }), InvalidSignature);
  assert.throws(() => verifySignature("whsec_test", headers, BODY + " ", 300, { now: 1700000100 }), InvalidSignature);
  assert.throws(() => verifySignature("whsec_test", headers, BODY, 300, { now: 1700009999 }), /off/);
  assert.throws(() => verifySignature("whsec_test", {}, BODY), /no X-Pandastack-Signature/);
});
