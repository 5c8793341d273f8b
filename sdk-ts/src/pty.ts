/**
 * `sbx.pty`: terminals, the twin of the Python SDK's `AsyncTerminals` / `AsyncPty`
 * (src/pandastack/sdk/async_pty.py). `create()` starts a process on a new pseudo-terminal and
 * attaches over the WebSocket `GET /v1/sandboxes/{id}/pty/{pid}` (wire_pty.PTY_WEBSOCKET):
 * binary messages are the terminal's bytes both ways, text messages JSON control (`resize`
 * from us, `exit` from the server). The WebSocket is the `ws` package's (Node 18 has no global
 * one, and the browser API cannot send the Authorization header), loaded on first use.
 */
import { APIConnectionError, WaitTimeoutError, invalid } from "./errors.js";
import { type Http, errorFromResponse, sandboxPath } from "./http.js";
import { readCaBundle } from "./tls.js";

const asyncDispose: typeof Symbol.asyncDispose = Symbol.asyncDispose ?? Symbol.for("Symbol.asyncDispose");
export const DEFAULT_COLS = 80;
export const DEFAULT_ROWS = 24;
const MAX_DIM = 1000;
/** Largest binary message the server takes: a paste is cut into these. */
const MAX_INPUT = 64 * 1024;
/** Largest message the server may send (output comes in pieces of at most 256 KiB). */
const MAX_MESSAGE = 1 << 20;
const SIGKILL = 9;

/** Gets each piece of the terminal's output: bytes, since a terminal's output is not always
 * whole UTF-8 characters. May return a promise (it is awaited before the next piece). */
export type PtyDataCallback = (data: Uint8Array) => unknown;

type Message = Uint8Array | string;
type WsSocket = import("ws").WebSocket;

function checkDims(cols: number, rows: number): void {
  if (!(Number.isInteger(cols) && Number.isInteger(rows) && cols >= 1 && rows >= 1 && cols <= MAX_DIM && rows <= MAX_DIM)) {
    throw invalid(`cols and rows must be integers in 1..${MAX_DIM}`);
  }
}

function wsUrl(apiUrl: string, sandboxId: string, pid: number): string {
  const url = new URL(apiUrl + sandboxPath(sandboxId, "pty", pid));
  url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
  return url.toString();
}

/** A socket and what it received. The listeners are attached before the handshake ends: the
 * server sends the recent output at once, often in the same read as its handshake answer, and
 * `ws` emits those messages before any promise continuation could attach them. */
class Channel {
  readonly queue: Message[] = [];
  closed: { code: number; reason: string } | undefined;
  private waiter: (() => void) | undefined;

  constructor(readonly ws: WsSocket) {
    ws.on("message", (data: Buffer, isBinary: boolean) => {
      this.queue.push(isBinary ? new Uint8Array(data.buffer, data.byteOffset, data.byteLength) : data.toString("utf8"));
      this.wake();
    });
    ws.on("close", (code: number, reason: Buffer) => {
      this.closed = { code, reason: reason.toString("utf8") };
      this.wake();
    });
    ws.on("error", () => this.wake());
  }

  private wake(): void {
    const w = this.waiter;
    this.waiter = undefined;
    w?.();
  }

  /** Until something more was received or the socket closed. */
  changed(): Promise<void> {
    return new Promise<void>((resolve) => { this.waiter = resolve; });
  }
}

async function open(http: Http, sandboxId: string, pid: number): Promise<Channel> {
  const { WebSocket } = await import("ws");
  const label = `pty ${pid} of ${sandboxId}`;
  const ws = new WebSocket(wsUrl(http.config.apiUrl, sandboxId, pid), {
    headers: { Authorization: `Bearer ${http.config.apiKey}` },
    maxPayload: MAX_MESSAGE, perMessageDeflate: false,
    handshakeTimeout: (http.timeout ?? 30) * 1000,
    ...(http.config.caBundle !== undefined ? { ca: readCaBundle(http.config.caBundle) } : {}),
  });
  const channel = new Channel(ws);
  return new Promise<Channel>((resolve, reject) => {
    ws.once("open", () => resolve(channel));
    ws.once("unexpected-response", (_req, res) => {
      // A refused handshake carries the API's error envelope.
      const parts: Buffer[] = [];
      res.on("data", (b: Buffer) => parts.push(b));
      res.on("end", () => {
        const headers = new Headers();
        for (const [k, v] of Object.entries(res.headers)) if (typeof v === "string") headers.set(k, v);
        reject(errorFromResponse(res.statusCode ?? 500, headers, Buffer.concat(parts).toString("utf8")));
      });
      res.on("error", (err: Error) => reject(new APIConnectionError(`${label}: ${err.message}`, { cause: err })));
    });
    ws.once("error", (err) => reject(new APIConnectionError(`${label}: ${err.message}`, { cause: err })));
  });
}

/** One attachment to a terminal (from `sbx.pty.create` or `sbx.pty.connect`). Its output goes
 * to `onData` or comes by iterating the handle (`for await`); `wait()` gives the exit code.
 * `disconnect()` (or `await using`) detaches and leaves the process running; `kill()` ends it. */
export class Pty implements AsyncIterable<Uint8Array>, AsyncDisposable {
  private readonly ws: WsSocket;
  private exit: number | undefined;
  private readonly reader: Promise<void> | undefined;

  /** @internal Use `sbx.pty.create()` or `sbx.pty.connect()`. */
  constructor(private readonly sandboxId: string, readonly pid: number, private readonly http: Http,
    private readonly channel: Channel, private readonly onData?: PtyDataCallback) {
    this.ws = channel.ws;
    if (onData) {
      this.reader = this.readAll();
      this.reader.catch(() => undefined); // surfaced by wait()
    }
  }

  /** The exit code once the process ended (128+N when killed by signal N), else undefined. */
  get exitCode(): number | undefined {
    return this.exit;
  }

  private label(): string {
    return `pty ${this.pid} of ${this.sandboxId}`;
  }

  /** The next piece of output; undefined once the process ended. */
  private async next(): Promise<Uint8Array | undefined> {
    while (this.exit === undefined) {
      const message = this.channel.queue.shift();
      if (message === undefined) {
        const closed = this.channel.closed;
        if (closed) {
          throw new APIConnectionError(`${this.label()}: the terminal's connection closed before its exit ` +
            `(code ${closed.code}${closed.reason ? ": " + closed.reason : ""})`);
        }
        await this.channel.changed();
        continue;
      }
      if (typeof message !== "string") return message;
      try {
        const msg = JSON.parse(message) as { type?: string; exit_code?: unknown };
        if (msg.type === "exit") this.exit = typeof msg.exit_code === "number" ? msg.exit_code : -1;
      } catch {
        // not a control message we know: skip it
      }
    }
    return undefined;
  }

  private async readAll(): Promise<void> {
    for (let data = await this.next(); data !== undefined; data = await this.next()) {
      await this.onData?.(data);
    }
  }

  /** The terminal's output as it comes (recent output first), until the process ends. */
  async *output(): AsyncGenerator<Uint8Array, void, undefined> {
    if (this.reader) throw invalid("this Pty delivers its output to onData");
    for (let data = await this.next(); data !== undefined; data = await this.next()) yield data;
  }

  [Symbol.asyncIterator](): AsyncGenerator<Uint8Array, void, undefined> {
    return this.output();
  }

  private send(data: Message): Promise<void> {
    return new Promise((resolve, reject) => {
      this.ws.send(data, { binary: typeof data !== "string" }, (err) => err
        ? reject(new APIConnectionError(`${this.label()}: the terminal's connection closed (${err.message})`, { cause: err }))
        : resolve());
    });
  }

  /** Type `data` into the terminal (`"\x03"` is Ctrl-C). */
  async sendStdin(data: string | Uint8Array): Promise<void> {
    const bytes = typeof data === "string" ? new TextEncoder().encode(data) : data;
    for (let i = 0; i < bytes.length; i += MAX_INPUT) await this.send(bytes.subarray(i, i + MAX_INPUT));
  }

  /** Set the terminal's size; its foreground program gets SIGWINCH. */
  async resize(cols: number, rows: number): Promise<void> {
    checkDims(cols, rows);
    await this.send(JSON.stringify({ type: "resize", cols, rows }));
  }

  /** Wait for the process to end; its exit code (output nobody reads meanwhile is dropped).
   * `WaitTimeoutError` after `timeout` seconds; the process keeps running. */
  async wait(options: { timeout?: number } = {}): Promise<number> {
    const drain = this.reader ?? (async () => { while (await this.next() !== undefined); })();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const limit = options.timeout === undefined ? undefined : new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new WaitTimeoutError(`${this.label()} still runs after ${options.timeout} s`,
        { status: 408, code: "timeout" })), (options.timeout ?? 0) * 1000);
    });
    try {
      await (limit ? Promise.race([drain, limit]) : drain);
    } finally {
      if (timer !== undefined) clearTimeout(timer);
    }
    return this.exit ?? -1;
  }

  /** End the process (SIGKILL to its whole tree); `wait()` then returns 137. */
  async kill(): Promise<void> {
    await this.http.void({ method: "POST", path: sandboxPath(this.sandboxId, "processes", this.pid, "signal"),
      json: { signal: SIGKILL } });
  }

  /** Detach: the process runs on (`sbx.pty.connect(pid)` attaches again). */
  async disconnect(): Promise<void> {
    if (this.ws.readyState === this.ws.CLOSED) return;
    await new Promise<void>((resolve) => {
      this.ws.once("close", () => resolve());
      this.ws.close(1000);
    });
  }

  async [asyncDispose](): Promise<void> {
    await this.disconnect();
  }
}

export interface PtyCreateOptions {
  cols?: number;
  rows?: number;
  /** A shell command line or an argv array; default: the user's login shell. */
  cmd?: string | string[];
  env?: Record<string, string>;
  cwd?: string;
  /** A user of the guest (default: the template's USER, else root). */
  user?: string;
  onData?: PtyDataCallback;
}

export class Terminals {
  /** @internal */
  constructor(private readonly sandboxId: string, private readonly http: Http) {}

  /** Start `cmd` on a new `cols` x `rows` terminal (80 x 24) and attach to it. */
  async create(options: PtyCreateOptions = {}): Promise<Pty> {
    const cols = options.cols ?? DEFAULT_COLS, rows = options.rows ?? DEFAULT_ROWS;
    checkDims(cols, rows);
    const info = await this.http.json<{ pid: number }>({ method: "POST", path: sandboxPath(this.sandboxId, "pty"),
      json: { cols, rows, cmd: options.cmd, env: options.env, cwd: options.cwd, user: options.user } });
    return this.connect(info.pid, { onData: options.onData });
  }

  /** Attach to terminal `pid` (also one another client started): its recent output first.
   * `NotFoundError` if the sandbox has no such terminal. */
  async connect(pid: number, options: { onData?: PtyDataCallback | undefined } = {}): Promise<Pty> {
    const channel = await open(this.http, this.sandboxId, pid);
    return new Pty(this.sandboxId, pid, this.http, channel, options.onData);
  }
}

