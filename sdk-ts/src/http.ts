/**
 * The only code that touches the network: `Http` sends a `Call` with `fetch`, turns transport
 * failures into `APIConnectionError` / `TransportTimeoutError`, error answers into the
 * `APIError` of their code, and hands back JSON, bytes, or the body as a stream of chunks.
 *
 * `fetch` has one abort signal, not per-phase timeouts: a request gets a timer of its read
 * timeout that every chunk of a streamed body restarts, so a stream may run for hours while
 * each silence is bounded (the Python SDK's httpx read timeout).
 */
import { APIConnectionError, ProtocolError, TransportTimeoutError, apiError, ERROR_STATUS,
  invalid } from "./errors.js";
import type { APIError } from "./errors.js";
import type { ClientConfig } from "./config.js";
import { certificateHint, fetchTlsInit } from "./tls.js";

export const VERSION = "0.1.0";
/** How much longer than a server-side wait the client waits for its answer. */
export const EXEC_TIMEOUT_MARGIN = 30;

export type Query = Record<string, string | number | boolean | undefined>;
export type UploadBody = Uint8Array | string | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>;

export interface Call {
  method: string;
  path: string;
  query?: Query | undefined;
  json?: unknown;
  body?: UploadBody | undefined;
  headers?: Record<string, string> | undefined;
  /** Seconds of silence allowed (null: none); undefined: the client's timeout. */
  timeout?: number | null | undefined;
  /** Aborts the request, or the stream of its body (a watch's `stop()`). */
  signal?: AbortSignal | undefined;
}

export function pathSegment(value: string | number): string {
  const text = String(value);
  if (!text) throw invalid("an id in the URL must not be empty");
  return encodeURIComponent(text);
}

/** `/v1/sandboxes/{id}/{parts...}`, every segment percent-encoded. */
export function sandboxPath(sandboxId: string, ...parts: (string | number)[]): string {
  return ["/v1/sandboxes", pathSegment(sandboxId), ...parts.map(pathSegment)].join("/");
}

/** A read timeout that outlasts a server-side wait of `seconds` (null: wait without limit). */
export function withReadTimeout(base: number | null, seconds: number | null | undefined): number | null {
  if (seconds === null || seconds === undefined || base === null) return null;
  return Math.max(base, seconds + EXEC_TIMEOUT_MARGIN);
}

/** The chunks of a streamed body, as an async iterable: Node's fetch takes one as a body and
 * pulls it as the socket drains. Given a ReadableStream (the standard body), Node 20's fetch
 * keeps every chunk until the request ends: counted in tests/e2e/test_sdk_ts.py's 50 MB
 * upload, 50 of its 50 chunks alive at once, against at most 7 this way. */
async function* chunksOf(body: ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>): AsyncGenerator<Uint8Array> {
  if (!(body instanceof ReadableStream)) {
    yield* body;
    return;
  }
  const reader = body.getReader();
  try {
    for (;;) {
      const next = await reader.read();
      if (next.done) return;
      yield next.value;
    }
  } finally {
    reader.releaseLock();
  }
}

class Timer {
  private handle: ReturnType<typeof setTimeout> | undefined;
  timedOut = false;
  constructor(private readonly seconds: number | null, private readonly controller: AbortController) {
    this.restart();
  }
  restart(): void {
    this.clear();
    if (this.seconds === null) return;
    this.handle = setTimeout(() => {
      this.timedOut = true;
      this.controller.abort();
    }, this.seconds * 1000);
  }
  clear(): void {
    if (this.handle !== undefined) clearTimeout(this.handle);
    this.handle = undefined;
  }
}

function envelope(data: unknown): { code?: string; message?: string; requestId?: string; body?: unknown } {
  const body = typeof data === "object" && data !== null ? (data as Record<string, unknown>)["error"] : undefined;
  if (typeof body === "string") return { message: body };
  if (typeof body !== "object" || body === null) return {};
  const fields = body as Record<string, unknown>;
  const text = (key: string) => (typeof fields[key] === "string" && fields[key] ? fields[key] as string : undefined);
  const out: { code?: string; message?: string; requestId?: string; body?: unknown } = { body };
  const code = text("code"), message = text("message"), requestId = text("request_id");
  if (code !== undefined) out.code = code;
  if (message !== undefined) out.message = message;
  if (requestId !== undefined) out.requestId = requestId;
  return out;
}

function retryAfter(value: string | null): number | undefined {
  if (value === null) return undefined;
  const n = Number(value);
  return Number.isFinite(n) ? Math.max(0, n) : undefined;
}

/** The `APIError` of a non-2xx answer whose body is `text`. */
export function errorFromResponse(status: number, headers: Headers, text: string): APIError {
  let data: unknown;
  try {
    data = JSON.parse(text);
  } catch {
    data = undefined;
  }
  const env = envelope(data);
  let message = env.message;
  if (message === undefined) {
    const snippet = text.trim().slice(0, 200);
    message = `HTTP ${status}` + (snippet ? `: ${snippet}` : "");
  }
  return apiError(status, env.code, message, env.requestId ?? headers.get("x-request-id") ?? undefined,
    retryAfter(headers.get("retry-after")), env.body);
}

/** The `APIError` of an `error` event inside a stream (an envelope without an HTTP status). */
export function errorFromEvent(data: string): APIError {
  let payload: unknown;
  try {
    payload = JSON.parse(data);
  } catch {
    payload = undefined;
  }
  const env = envelope(payload);
  const message = env.message ?? (data.trim().slice(0, 200) || "the server reported an error in the stream");
  return apiError(ERROR_STATUS[env.code ?? ""] ?? 500, env.code, message, env.requestId);
}

export class Http {
  constructor(readonly config: ClientConfig, private readonly fetchImpl: typeof globalThis.fetch) {}

  get timeout(): number | null {
    return this.config.timeout;
  }

  /** Send `call`; the 2xx response (body unread) and the timer guarding its reads. */
  private async send(call: Call): Promise<{ response: Response; timer: Timer; label: string }> {
    const url = new URL(this.config.apiUrl + call.path);
    for (const [key, value] of Object.entries(call.query ?? {})) {
      if (value !== undefined) url.searchParams.set(key, String(value));
    }
    const headers: Record<string, string> = {
      Authorization: `Bearer ${this.config.apiKey}`,
      "User-Agent": `pandastack-typescript/${VERSION}`,
      Accept: "application/json",
      ...call.headers,
    };
    const init: RequestInit & { duplex?: "half" } = { method: call.method, headers, redirect: "manual" };
    if (call.json !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(call.json);
    } else if (call.body !== undefined) {
      const body = call.body;
      if (typeof body === "string" || body instanceof Uint8Array) {
        init.body = body as BodyInit;
      } else {
        init.body = chunksOf(body) as unknown as BodyInit; // not in DOM's BodyInit; Node takes it
        init.duplex = "half"; // a streamed request body (Node's fetch requires saying so)
      }
    }
    if (this.config.caBundle !== undefined && url.protocol === "https:") {
      Object.assign(init, await fetchTlsInit(this.config.caBundle));
    }
    const controller = new AbortController();
    init.signal = controller.signal;
    if (call.signal) {
      if (call.signal.aborted) controller.abort();
      else call.signal.addEventListener("abort", () => controller.abort(), { once: true });
    }
    const label = `${call.method} ${call.path}`;
    const timer = new Timer(call.timeout === undefined ? this.timeout : call.timeout, controller);
    let response: Response;
    try {
      response = await this.fetchImpl(url, init);
    } catch (err) {
      timer.clear();
      throw transportError(label, err, timer.timedOut);
    }
    if (!response.ok) {
      let text = "";
      try {
        text = await response.text();
      } catch (err) {
        throw transportError(label, err, timer.timedOut);
      } finally {
        timer.clear();
      }
      throw errorFromResponse(response.status, response.headers, text);
    }
    return { response, timer, label };
  }

  /** The decoded JSON body (as the server spelled it). */
  async json<T = unknown>(call: Call): Promise<T> {
    const text = new TextDecoder().decode(await this.bytes(call));
    try {
      return JSON.parse(text) as T;
    } catch {
      throw new ProtocolError(`${call.method} ${call.path}: the reply is not JSON`);
    }
  }

  /** Send `call` and drop the body (204s and acks). */
  async void(call: Call): Promise<void> {
    await this.bytes(call);
  }

  /** The whole body. */
  async bytes(call: Call): Promise<Uint8Array> {
    const parts: Uint8Array[] = [];
    let size = 0;
    for await (const chunk of this.stream(call)) {
      parts.push(chunk);
      size += chunk.length;
    }
    const out = new Uint8Array(size);
    let at = 0;
    for (const part of parts) {
      out.set(part, at);
      at += part.length;
    }
    return out;
  }

  /** The body chunk by chunk; leaving the loop early closes the connection. */
  async *stream(call: Call): AsyncGenerator<Uint8Array, void, undefined> {
    const { response, timer, label } = await this.send(call);
    const body = response.body;
    if (body === null) {
      timer.clear();
      return;
    }
    const reader = body.getReader();
    try {
      for (;;) {
        let next: ReadableStreamReadResult<Uint8Array>;
        try {
          next = await reader.read();
        } catch (err) {
          throw transportError(label, err, timer.timedOut);
        }
        if (next.done) return;
        timer.restart();
        yield next.value;
      }
    } finally {
      timer.clear();
      reader.cancel().catch(() => undefined);
    }
  }
}

function transportError(label: string, err: unknown, timedOut: boolean): Error {
  if (timedOut) return new TransportTimeoutError(`${label}: timed out`, { cause: err });
  const detail = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
  const cause = err instanceof Error && err.cause instanceof Error ? ` (${err.cause.message})` : "";
  return new APIConnectionError(`${label}: ${detail}${cause}${certificateHint(err)}`, { cause: err });
}
