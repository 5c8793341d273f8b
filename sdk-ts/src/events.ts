/**
 * The team's event log, live (`client.events.stream()`): the `GET /v1/events` SSE route the
 * Python SDK's `AsyncEventStream` follows (src/pandastack/sdk/events.py). The stream is open,
 * and its start fixed, when `stream()` resolves; iterate it (`for await`) for `Event`s. A
 * dropped connection is reopened from the last event seen (`Last-Event-ID`), up to
 * `reconnects` times in a row; `after` resumes from an event id kept earlier (`lastId`). If
 * that point was pruned from the server's log, `truncated` holds the server's notice.
 */
import { camelize } from "./camel.js";
import { PandastackError, ProtocolError, invalid } from "./errors.js";
import type { Http } from "./http.js";
import { SSEDecoder } from "./sse.js";

const asyncDispose: typeof Symbol.asyncDispose = Symbol.asyncDispose ?? Symbol.for("Symbol.asyncDispose");
/** Milliseconds between reconnects of a dropped stream. */
const RECONNECT_DELAY_MS = 1000;

export const EVENT_TYPES = [
  "sandbox.created", "sandbox.paused", "sandbox.resumed", "sandbox.hibernated",
  "sandbox.woken", "sandbox.forked", "sandbox.snapshotted", "sandbox.killed",
  "sandbox.expired", "sandbox.reaped", "sandbox.failed", "sandbox.host_lost",
  "sandbox.stopped", "template.build.started", "template.build.succeeded",
  "template.build.failed", "quota.exceeded",
] as const;

/** One event (wire_events.Event; not in the committed OpenAPI document: it is SSE). The
 * named fields every event has; the rest depend on the type (`reason`, `children`, ...). */
export interface Event {
  id: number;
  type: string;
  time: number;
  team: string;
  /** The API key id behind it, or "system" (reaper, TTL, reconciliation). */
  actor: string;
  sandboxId: string | null;
  template: string | null;
  [field: string]: unknown;
}

export interface EventStreamOptions {
  /** Resume after this event id (default: from now). */
  after?: number;
  /** Another team's events (admin keys). */
  team?: string;
  /** Reconnects of a dropped stream in a row before its error is thrown (default 5). */
  reconnects?: number;
}

function typesParam(types: string[] | string | undefined): string | undefined {
  if (types === undefined) return undefined;
  const items = typeof types === "string" ? [types] : types;
  const bad = items.filter((t) => !(t === "*" || (t.endsWith(".*") && EVENT_TYPES.some((e) => e.startsWith(t.slice(0, -1))))
    || (EVENT_TYPES as readonly string[]).includes(t)));
  if (bad.length) throw invalid(`unknown event types: ${bad.join(", ")}`);
  return items.join(",");
}

class EventDecoder {
  private readonly sse = new SSEDecoder();
  ready = false;
  after: number | undefined;
  truncated: Record<string, unknown> | undefined;

  feed(chunk: Uint8Array): Event[] {
    const out: Event[] = [];
    for (const item of this.sse.feed(chunk)) {
      let data: Record<string, unknown>;
      try {
        data = JSON.parse(item.data) as Record<string, unknown>;
      } catch {
        throw new ProtocolError(`GET /v1/events: ${item.event} event is not JSON`);
      }
      if (item.event === "ready") {
        this.ready = true;
        this.after = Number(data.after ?? 0);
      } else if (item.event === "events.truncated") {
        this.truncated = camelize(data) as Record<string, unknown>;
      } else if (item.id !== undefined) {
        out.push(camelize(data) as Event);
      }
    }
    return out;
  }
}

export class EventStream implements AsyncIterable<Event>, AsyncDisposable {
  private abort = new AbortController();
  private chunks: AsyncGenerator<Uint8Array, void, undefined> | undefined;
  private decoder = new EventDecoder();
  private pending: Event[] = [];
  private ended = false;
  private last: number | undefined;
  private notice: Record<string, unknown> | undefined;

  /** @internal Use `client.events.stream()`. */
  constructor(private readonly http: Http, private readonly types: string | undefined,
              private readonly options: EventStreamOptions) {
    this.last = options.after;
  }

  /** The id to resume from later. */
  get lastId(): number | undefined {
    return this.last;
  }

  /** The server's notice that the resume point was pruned (events up to `prunedThrough`). */
  get truncated(): Record<string, unknown> | undefined {
    return this.notice;
  }

  /** @internal Open the stream and wait for the server to say where it starts. */
  async open(): Promise<this> {
    this.abort.abort();
    this.abort = new AbortController();
    this.decoder = new EventDecoder();
    const headers: Record<string, string> = { Accept: "text/event-stream" };
    if (this.last !== undefined) headers["Last-Event-ID"] = String(this.last);
    this.chunks = this.http.stream({ method: "GET", path: "/v1/events",
      query: { types: this.types, team: this.options.team }, headers, timeout: null,
      signal: this.abort.signal });
    for (;;) {
      const next = await this.chunks.next();
      if (next.done) throw new ProtocolError("GET /v1/events: the stream ended before it was ready");
      this.pending.push(...this.decoder.feed(next.value));
      if (this.decoder.ready) {
        if (this.decoder.truncated !== undefined) this.notice = this.decoder.truncated;
        if (this.last === undefined || this.decoder.truncated !== undefined) this.last = this.decoder.after;
        return this;
      }
    }
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<Event, void, undefined> {
    let failures = 0;
    while (!this.ended) {
      yield* this.take();
      try {
        const next = await this.chunks!.next();
        if (next.done) throw new ProtocolError("GET /v1/events: the server ended the stream");
        this.pending.push(...this.decoder.feed(next.value));
        failures = 0;
      } catch (err) {
        if (this.ended) return;
        if (!(err instanceof PandastackError)) throw err;
        failures += 1;
        if (failures > (this.options.reconnects ?? 5)) throw err;
        await new Promise((resolve) => setTimeout(resolve, RECONNECT_DELAY_MS));
        await this.open().catch(() => undefined);
      }
    }
  }

  private take(): Event[] {
    const out = this.pending;
    this.pending = [];
    if (out.length) this.last = out[out.length - 1]!.id;
    return out;
  }

  /** End the stream; iteration ends. */
  async stop(): Promise<void> {
    if (this.ended) return;
    this.ended = true;
    this.abort.abort();
    await this.chunks?.return(undefined).catch(() => undefined);
  }

  async [asyncDispose](): Promise<void> {
    await this.stop();
  }
}

export class Events {
  /** @internal */
  constructor(private readonly http: Http) {}

  /** The server this namespace talks to. */
  get apiUrl(): string {
    return this.http.config.apiUrl;
  }

  /** Open the live stream (filtered by `types`: types or `sandbox.*`-style prefixes), from
   * now or after event id `after`; it is ready when this resolves. */
  async stream(types?: string[] | string, options: EventStreamOptions = {}): Promise<EventStream> {
    return new EventStream(this.http, typesParam(types), options).open();
  }
}
