/**
 * The CA bundle option (`caBundle`, `PANDASTACK_CA_BUNDLE`): an https:// server whose
 * certificate a private CA issued (ADR 0048). `fetch` has no standard way to trust a CA, so
 * each runtime's own is used: Node's bundled undici (an `Agent` as the request's
 * `dispatcher`), Bun's `tls.ca`, Deno's `createHttpClient`. The PTY's WebSocket (`ws`) takes
 * the CA as its `ca` option.
 */
import { readFileSync } from "node:fs";

import { ConfigError } from "./errors.js";

type Extra = Record<string, unknown>;

const extras = new Map<string, Promise<Extra>>();

/** Read the bundle (a PEM file); ConfigError when it cannot be. */
export function readCaBundle(path: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch (err) {
    throw new ConfigError(`the CA bundle ${JSON.stringify(path)} (caBundle or PANDASTACK_CA_BUNDLE) ` +
      `cannot be read: ${String(err)}`);
  }
}

/** What a request's `RequestInit` gains so that this runtime's fetch trusts `caBundle`; made
 * once per bundle. */
export function fetchTlsInit(caBundle: string): Promise<Extra> {
  let extra = extras.get(caBundle);
  if (extra === undefined) {
    extra = make(caBundle);
    extras.set(caBundle, extra);
    extra.catch(() => extras.delete(caBundle));
  }
  return extra;
}

async function make(caBundle: string): Promise<Extra> {
  const ca = readCaBundle(caBundle);
  const g = globalThis as unknown as Record<string | symbol, unknown>;
  if (g["Bun"] !== undefined) return { tls: { ca } };
  const deno = g["Deno"] as { createHttpClient?: (o: { caCerts: string[] }) => unknown } | undefined;
  if (deno?.createHttpClient) return { client: deno.createHttpClient({ caCerts: [ca] }) };
  // Node: its fetch is undici, which keeps its global dispatcher (an Agent) under this
  // symbol once it has loaded; a fetch of a data: URL loads it without any connection.
  const key = Symbol.for("undici.globalDispatcher.1");
  if (g[key] === undefined) await globalThis.fetch("data:,");
  const Agent = (g[key] as { constructor?: new (options: object) => unknown } | undefined)?.constructor;
  if (typeof Agent !== "function") {
    throw new ConfigError("caBundle: this runtime's fetch takes no CA; pass a `fetch` that trusts it, " +
      "or start Node with NODE_EXTRA_CA_CERTS");
  }
  return { dispatcher: new Agent({ connect: { ca } }) };
}

/** A hint for a transport error that is an untrusted certificate, else "". */
export function certificateHint(err: unknown): string {
  const seen = [err, err instanceof Error ? err.cause : undefined]
    .map((e) => (e instanceof Error ? `${(e as { code?: string }).code ?? ""} ${e.message}` : ""))
    .join(" ");
  return /CERT|certificate|self[- ]signed|UNABLE_TO_(GET|VERIFY)/i.test(seen)
    ? " (the server's TLS certificate is not one a trusted CA issued: give its CA with caBundle or PANDASTACK_CA_BUNDLE)"
    : "";
}
