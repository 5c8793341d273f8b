/**
 * The team's webhooks (`client.webhooks`), the twin of the Python SDK's `AsyncWebhooks`, and
 * `verifySignature`, the twin of `pandastack.webhooks.verify_signature`: the server signs
 * `timestamp + "." + body` with HMAC-SHA256 under the webhook's secret and sends
 * `X-Pandastack-Signature: t=<unix seconds>,v1=<hex>`.
 */
import { createHmac, timingSafeEqual } from "node:crypto";

import { camelize } from "./camel.js";
import { type Http, pathSegment } from "./http.js";

export const SIGNATURE_HEADER = "X-Pandastack-Signature";

/** wire_events.Webhook (hand-written until the committed OpenAPI document has it). */
export interface Webhook {
  id: string;
  url: string;
  events: string[];
  description?: string | null;
  createdAt: number;
}

export interface WebhookCreated extends Webhook {
  /** The signing secret: shown once, here. */
  secret: string;
}

export interface WebhookDelivery {
  id: number;
  webhookId: string;
  eventId: number | null;
  eventType: string;
  status: "pending" | "delivered" | "failed";
  attempts: number;
  createdAt: number;
  nextAttemptAt?: number | null;
  finishedAt?: number | null;
  responseStatus?: number | null;
  error?: string | null;
}

/** The request is not one the server signed with this secret (or it is too old). */
export class InvalidSignature extends Error {
  override name = "InvalidSignature";
}

function hookPath(webhookId: string, ...rest: string[]): string {
  return ["/v1/webhooks", pathSegment(webhookId), ...rest].join("/");
}

export class Webhooks {
  /** @internal */
  constructor(private readonly http: Http) {}

  /** The server this namespace talks to. */
  get apiUrl(): string {
    return this.http.config.apiUrl;
  }

  /** A webhook POSTing these event types to `url`; `.secret` is shown only this once. */
  async create(url: string, events: string[], options: { description?: string } = {}): Promise<WebhookCreated> {
    return camelize(await this.http.json({ method: "POST", path: "/v1/webhooks",
      json: { url, events, ...(options.description !== undefined ? { description: options.description } : {}) } })) as WebhookCreated;
  }

  async list(): Promise<Webhook[]> {
    return (camelize(await this.http.json({ method: "GET", path: "/v1/webhooks" })) as { webhooks: Webhook[] }).webhooks;
  }

  async get(webhookId: string): Promise<Webhook> {
    return camelize(await this.http.json({ method: "GET", path: hookPath(webhookId) })) as Webhook;
  }

  /** Delete the webhook with its pending deliveries and its log. */
  async delete(webhookId: string): Promise<void> {
    await this.http.void({ method: "DELETE", path: hookPath(webhookId) });
  }

  /** POST a `webhook.test` event now, once; the delivery as recorded. */
  async test(webhookId: string): Promise<WebhookDelivery> {
    return camelize(await this.http.json({ method: "POST", path: hookPath(webhookId, "test") })) as WebhookDelivery;
  }

  /** The webhook's deliveries, newest first (`before`: ids below it, the next page). Ids are
   * the team's own delivery numbers, as `X-Pandastack-Delivery` tells them. */
  async deliveries(webhookId: string, options: { limit?: number; before?: number } = {}): Promise<WebhookDelivery[]> {
    const got = camelize(await this.http.json({ method: "GET", path: hookPath(webhookId, "deliveries"),
      query: { limit: options.limit, before: options.before } })) as { deliveries: WebhookDelivery[] };
    return got.deliveries;
  }
}

function header(headers: Record<string, string> | Headers | string): string {
  if (typeof headers === "string") return headers;
  if (typeof (headers as Headers).get === "function") {
    const value = (headers as Headers).get(SIGNATURE_HEADER);
    if (value !== null) return value;
  } else {
    for (const [name, value] of Object.entries(headers)) {
      if (name.toLowerCase() === SIGNATURE_HEADER.toLowerCase()) return value;
    }
  }
  throw new InvalidSignature(`no ${SIGNATURE_HEADER} header`);
}

/** The event the request carries, if `headers` (or the header's value) sign `body` (the raw
 * request body, as received) under `secret` within `toleranceSeconds` of now; throws
 * `InvalidSignature` otherwise. */
export function verifySignature(secret: string, headers: Record<string, string> | Headers | string,
                                body: Uint8Array | string, toleranceSeconds = 300,
                                options: { now?: number } = {}): Record<string, unknown> {
  const raw = typeof body === "string" ? new TextEncoder().encode(body) : body;
  let timestamp: number | undefined;
  const given: string[] = [];
  for (const part of header(headers).split(",")) {
    const [key, value = ""] = part.trim().split("=", 2) as [string, string?];
    if (key === "t" && /^\d+$/.test(value)) timestamp = Number(value);
    else if (key === "v1" && value) given.push(value.trim());
  }
  if (timestamp === undefined || !given.length) {
    throw new InvalidSignature(`malformed ${SIGNATURE_HEADER} (want t=<unix>,v1=<hex>)`);
  }
  const now = options.now ?? Date.now() / 1000;
  if (Math.abs(now - timestamp) > toleranceSeconds) {
    throw new InvalidSignature(`the signature's time is ${Math.round(now - timestamp)} s off (tolerance ${toleranceSeconds} s)`);
  }
  const expected = Buffer.from(createHmac("sha256", secret).update(`${timestamp}.`).update(raw).digest("hex"));
  if (!given.some((v) => v.length === expected.length && timingSafeEqual(Buffer.from(v), expected))) {
    throw new InvalidSignature("the signature does not match");
  }
  try {
    return JSON.parse(new TextDecoder().decode(raw)) as Record<string, unknown>;
  } catch {
    throw new InvalidSignature("the body is not JSON");
  }
}
