/**
 * File watching (`sbx.files.watch(path)`): the `files/watch` SSE route the Python SDK's
 * `AsyncWatch` follows (src/pandastack/sdk/watch.py). The watch is set up in the guest when
 * `watch()` resolves; iterate it (`for await`) for `FileEvent`s, `stop()` it when done (or
 * `await using`). It ends by itself after an `overflow` event or when its directory goes.
 */
import { camelize } from "./camel.js";
import { ProtocolError } from "./errors.js";
import { type Call, type Http, errorFromEvent } from "./http.js";
import { type ServerSentEvent, SSEDecoder } from "./sse.js";

const asyncDispose: typeof Symbol.asyncDispose = Symbol.asyncDispose ?? Symbol.for("Symbol.asyncDispose");
const WATCH_EVENTS = new Set(["create", "write", "remove", "rename", "chmod"]);

/** One event of a watch (wire.FileEvent; not in the committed OpenAPI document yet). */
export interface FileEvent {
  type: "create" | "write" | "remove" | "rename" | "chmod" | "overflow";
  path: string;
  /** rename: the path it had before. */
  oldPath?: string | null;
  isDir: boolean;
}

/** The watch stream: `started` once the `watching` event came; `done` after `overflow`
 * (handed out as the last event) or `end` (not handed out); an `error` event throws. */
export class WatchDecoder {
  private readonly sse = new SSEDecoder();
  started = false;
  done = false;

  feed(chunk: Uint8Array): FileEvent[] {
    return this.handle(this.sse.feed(chunk));
  }

  close(): FileEvent[] {
    return this.handle(this.sse.close());
  }

  private handle(events: ServerSentEvent[]): FileEvent[] {
    const out: FileEvent[] = [];
    for (const event of events) {
      if (this.done) break;
      if (event.event === "watching") {
        this.started = true;
      } else if (WATCH_EVENTS.has(event.event) || event.event === "overflow") {
        let payload: unknown;
        try {
          payload = JSON.parse(event.data);
        } catch {
          throw new ProtocolError(`file watch: ${event.event} event is not JSON`);
        }
        const e = camelize(payload) as FileEvent;
        out.push({ ...e, isDir: e.isDir ?? false });
        if (event.event === "overflow") this.done = true;
      } else if (event.event === "end") {
        this.done = true;
      } else if (event.event === "error") {
        this.done = true;
        throw errorFromEvent(event.data);
      }
    }
    return out;
  }
}

export class Watch implements AsyncIterable<FileEvent>, AsyncDisposable {
  private readonly abort = new AbortController();
  private readonly chunks: AsyncGenerator<Uint8Array, void, undefined>;
  private readonly decoder = new WatchDecoder();
  private pending: FileEvent[] = [];
  private ended = false;

  /** @internal Use `sbx.files.watch()`. */
  constructor(http: Http, call: Call) {
    this.chunks = http.stream({ ...call, signal: this.abort.signal });
  }

  /** @internal Open the stream and wait for the guest to have set the watch up. */
  async start(): Promise<this> {
    try {
      for (;;) {
        const next = await this.chunks.next();
        if (next.done) throw new ProtocolError("file watch: the stream ended before the watch started");
        this.pending.push(...this.decoder.feed(next.value));
        if (this.decoder.started) return this;
      }
    } catch (err) {
      await this.stop();
      throw err;
    }
  }

  /** Whether the watch has ended (stopped, overflowed, or its directory is gone). */
  get stopped(): boolean {
    return this.ended || this.decoder.done;
  }

  async *[Symbol.asyncIterator](): AsyncGenerator<FileEvent, void, undefined> {
    try {
      yield* this.take();
      while (!this.decoder.done && !this.ended) {
        let next: IteratorResult<Uint8Array, void>;
        try {
          next = await this.chunks.next();
        } catch (err) {
          if (this.ended) return;
          throw err;
        }
        if (this.ended) return;
        if (next.done) {
          this.pending.push(...this.decoder.close());
          yield* this.take();
          return;
        }
        this.pending.push(...this.decoder.feed(next.value));
        yield* this.take();
      }
    } finally {
      if (this.decoder.done) await this.stop();
    }
  }

  private take(): FileEvent[] {
    const out = this.pending;
    this.pending = [];
    return out;
  }

  /** End the watch: the guest drops it, iteration ends. */
  async stop(): Promise<void> {
    if (this.ended) return;
    this.ended = true;
    this.abort.abort();
    await this.chunks.return(undefined).catch(() => undefined);
  }

  async [asyncDispose](): Promise<void> {
    await this.stop();
  }
}
