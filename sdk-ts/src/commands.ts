/**
 * `sbx.commands`: run commands to completion (`run`, also `sbx.exec`), or start them in the
 * background and drive them (`start` / `connect` give a `Process`: `stream`, `wait`,
 * `sendStdin`, `sendSignal`, `kill`). Output streams over server-sent events, the routes the
 * Python SDK uses (`exec/stream`, `processes/{pid}/stream`).
 */
import { constants } from "node:os";

import { camelize, snakeify } from "./camel.js";
import { NotFoundError, ProtocolError, TransportTimeoutError, WaitTimeoutError, invalid } from "./errors.js";
import { type Http, errorFromEvent, sandboxPath, withReadTimeout } from "./http.js";
import { type ServerSentEvent, SSEDecoder } from "./sse.js";
import type { ExecResult, OutputCallback, ProcessInfo } from "./types.js";

type StreamName = "stdout" | "stderr";

/** What the process stream keeps of each output for its exit's result (the guest's ring). */
export const KEPT_CHARS = 1 << 20;

export interface ExecOptions {
  /** Kill the command after this long (then `timedOut` is true). Default 60. */
  timeoutSeconds?: number;
  env?: Record<string, string>;
  cwd?: string;
  stdin?: string;
  /** Bytes of each of stdout and stderr the result keeps (streamed: sent); past it
   * `truncated` is true. Default, and the most allowed: the server's
   * PANDASTACK_MAX_EXEC_OUTPUT_MB (64 MiB unless set). */
  maxOutputBytes?: number;
  /** Streams the output: each chunk of stdout as it arrives. */
  onStdout?: OutputCallback;
  onStderr?: OutputCallback;
}

export interface StartOptions {
  env?: Record<string, string>;
  cwd?: string;
  /** Kill the process (its whole cgroup) after this long; its result then has `timedOut`. */
  timeoutSeconds?: number;
  onStdout?: OutputCallback;
  onStderr?: OutputCallback;
}

export interface ConnectOptions {
  onStdout?: OutputCallback;
  onStderr?: OutputCallback;
}

/** One event of `Process.stream()`; see the Python SDK's `ProcessEvent`. */
export type ProcessEvent =
  | { type: "stdout" | "stderr"; data: string }
  | { type: "dropped"; dropped: { stdout?: number; stderr?: number } }
  | { type: "exit"; result: ExecResult };

function eventJson(event: ServerSentEvent, where: string): unknown {
  try {
    return JSON.parse(event.data);
  } catch {
    throw new ProtocolError(`${where}: ${event.event} event is not JSON`);
  }
}

function chunkText(event: ServerSentEvent, where: string): string {
  const payload = eventJson(event, where) as { data?: unknown } | null;
  const text = payload?.data;
  if (typeof text !== "string") throw new ProtocolError(`${where}: ${event.event} event lacks a string 'data'`);
  return text;
}

/** The `exec/stream` events: output chunks, then one `exit` (or an `error`, thrown). */
export class ExecStreamDecoder {
  private readonly sse = new SSEDecoder();
  private readonly chunks: Record<StreamName, string[]> = { stdout: [], stderr: [] };
  private exit: ExecResult | undefined;

  get done(): boolean {
    return this.exit !== undefined;
  }

  feed(chunk: Uint8Array): [StreamName, string][] {
    return this.handle(this.sse.feed(chunk));
  }

  close(): [StreamName, string][] {
    return this.handle(this.sse.close());
  }

  private handle(events: ServerSentEvent[]): [StreamName, string][] {
    const out: [StreamName, string][] = [];
    for (const event of events) {
      if (this.exit !== undefined) break;
      if (event.event === "stdout" || event.event === "stderr") {
        const text = chunkText(event, "exec stream");
        this.chunks[event.event].push(text);
        out.push([event.event, text]);
      } else if (event.event === "exit") {
        this.exit = camelize(eventJson(event, "exec stream")) as ExecResult;
      } else if (event.event === "error") {
        throw errorFromEvent(event.data);
      }
      // anything else: an event this SDK does not know yet
    }
    return out;
  }

  result(): ExecResult {
    if (this.exit === undefined) throw new ProtocolError("exec stream ended before its exit event");
    return { ...this.exit, stdout: this.chunks.stdout.join("") || this.exit.stdout,
      stderr: this.chunks.stderr.join("") || this.exit.stderr };
  }
}

/** The `processes/{pid}/stream` events: maybe `dropped`, output chunks, one `exit`. */
export class ProcessStreamDecoder {
  private readonly sse = new SSEDecoder();
  private readonly chunks: Record<StreamName, string[]> = { stdout: [], stderr: [] };
  private readonly kept: Record<StreamName, number> = { stdout: 0, stderr: 0 };
  private exit: ExecResult | undefined;

  get done(): boolean {
    return this.exit !== undefined;
  }

  feed(chunk: Uint8Array): ProcessEvent[] {
    return this.handle(this.sse.feed(chunk));
  }

  close(): ProcessEvent[] {
    return this.handle(this.sse.close());
  }

  private handle(events: ServerSentEvent[]): ProcessEvent[] {
    const out: ProcessEvent[] = [];
    for (const event of events) {
      if (this.exit !== undefined) break;
      if (event.event === "stdout" || event.event === "stderr") {
        const text = chunkText(event, "process stream");
        this.keep(event.event, text);
        out.push({ type: event.event, data: text });
      } else if (event.event === "dropped") {
        const payload = eventJson(event, "process stream") as Record<string, unknown>;
        const dropped: { stdout?: number; stderr?: number } = {};
        for (const name of ["stdout", "stderr"] as const) {
          if (typeof payload?.[name] === "number") dropped[name] = payload[name] as number;
        }
        out.push({ type: "dropped", dropped });
      } else if (event.event === "exit") {
        this.exit = camelize(eventJson(event, "process stream")) as ExecResult;
        out.push({ type: "exit", result: this.result() });
      } else if (event.event === "error") {
        throw errorFromEvent(event.data);
      }
    }
    return out;
  }

  private keep(name: StreamName, text: string): void {
    const chunks = this.chunks[name];
    chunks.push(text);
    this.kept[name] += text.length;
    if (this.kept[name] > 2 * KEPT_CHARS) { // compact now and then: amortised O(1)
      const tail = chunks.join("").slice(-KEPT_CHARS);
      chunks.splice(0, chunks.length, tail);
      this.kept[name] = tail.length;
    }
  }

  result(): ExecResult {
    if (this.exit === undefined) throw new ProtocolError("process stream ended before its exit event");
    return { ...this.exit, stdout: this.chunks.stdout.join("").slice(-KEPT_CHARS),
      stderr: this.chunks.stderr.join("").slice(-KEPT_CHARS) };
  }
}

async function deliver(chunks: [StreamName, string][], onStdout?: OutputCallback,
  onStderr?: OutputCallback): Promise<void> {
  for (const [name, text] of chunks) {
    const callback = name === "stdout" ? onStdout : onStderr;
    if (callback) await callback(text);
  }
}

export class Commands {
  /** @internal */
  constructor(private readonly sandboxId: string, private readonly http: Http) {}

  /**
   * Run `cmd` (a shell command line, or an argv array) to completion. The command is killed
   * after `timeoutSeconds` (then `timedOut` is true); the client waits 30 s longer than that.
   * With `onStdout`/`onStderr` the output streams to them as it comes, and the result still
   * holds all of it.
   */
  async run(cmd: string | string[], options: ExecOptions = {}): Promise<ExecResult> {
    const timeoutSeconds = options.timeoutSeconds ?? 60;
    const streaming = options.onStdout !== undefined || options.onStderr !== undefined;
    const call = {
      method: "POST",
      path: sandboxPath(this.sandboxId, ...(streaming ? ["exec", "stream"] : ["exec"])),
      json: snakeify({
        cmd, timeoutSeconds, env: options.env, cwd: options.cwd, stdin: options.stdin,
        maxOutputBytes: options.maxOutputBytes,
      }),
      headers: streaming ? { Accept: "text/event-stream" } : undefined,
      timeout: withReadTimeout(this.http.timeout, timeoutSeconds),
    };
    if (!streaming) return camelize(await this.http.json(call)) as ExecResult;
    const decoder = new ExecStreamDecoder();
    for await (const chunk of this.http.stream(call)) {
      await deliver(decoder.feed(chunk), options.onStdout, options.onStderr);
      if (decoder.done) return decoder.result();
    }
    await deliver(decoder.close(), options.onStdout, options.onStderr);
    return decoder.result();
  }

  /** Start `cmd` in the background; a `Process` to drive it. Its output is kept in the
   * sandbox (the last 1 MiB of each stream) until read: `Process.stream()` replays it. */
  async start(cmd: string | string[], options: StartOptions = {}): Promise<Process> {
    const info = await this.http.json({
      method: "POST", path: sandboxPath(this.sandboxId, "processes"),
      json: snakeify({ cmd, env: options.env, cwd: options.cwd, timeoutSeconds: options.timeoutSeconds }),
    });
    return new Process(this.sandboxId, camelize(info) as ProcessInfo, this.http, options);
  }

  /** A handle on background process `pid` (e.g. one another client started);
   * `NotFoundError` if the sandbox knows none (running, or among the last 64 that ended). */
  async connect(pid: number, options: ConnectOptions = {}): Promise<Process> {
    const info = (await this.list()).find((p) => p.pid === pid);
    if (info === undefined) {
      throw new NotFoundError(`no process ${pid} in this sandbox (running, or among the last 64 that ended)`,
        { status: 404, code: "not_found" });
    }
    return new Process(this.sandboxId, info, this.http, options);
  }

  /** The processes started with `start()` that the sandbox still knows about. */
  async list(): Promise<ProcessInfo[]> {
    const body = await this.http.json<{ processes: unknown[] }>({
      method: "GET", path: sandboxPath(this.sandboxId, "processes") });
    return camelize(body.processes) as ProcessInfo[];
  }
}

function signalNumber(sig: number | NodeJS.Signals): number {
  if (typeof sig === "number") return sig;
  const n = constants.signals[sig];
  if (n === undefined) throw invalid(`unknown signal ${JSON.stringify(sig)}`);
  return n;
}

function waitTimedOut(pid: number, seconds: number): WaitTimeoutError {
  return new WaitTimeoutError(`process ${pid} still running after ${seconds} s`, { status: 408, code: "timeout" });
}

export class Process {
  /** @internal */
  constructor(private readonly sandboxId: string, readonly info: ProcessInfo,
    private readonly http: Http, private readonly callbacks: ConnectOptions = {}) {}

  /** The process id inside the sandbox. */
  get pid(): number {
    return this.info.pid;
  }

  /**
   * The process's output as events: `dropped` first if the sandbox's buffer lost the start,
   * the buffered output, then live chunks, then one `exit` (its result). Each chunk also goes
   * to the `onStdout`/`onStderr` callbacks. Leaving the loop early detaches (the process
   * keeps running). With `timeoutSeconds`, stop with `WaitTimeoutError` after about that long.
   */
  async *stream(options: { timeoutSeconds?: number } = {}): AsyncGenerator<ProcessEvent, void, undefined> {
    const seconds = options.timeoutSeconds;
    const decoder = new ProcessStreamDecoder();
    const deadline = seconds === undefined ? undefined : Date.now() + seconds * 1000;
    const call = { method: "GET", path: sandboxPath(this.sandboxId, "processes", this.pid, "stream"),
      headers: { Accept: "text/event-stream" }, timeout: seconds ?? null };
    try {
      for await (const chunk of this.http.stream(call)) {
        for (const event of decoder.feed(chunk)) {
          await this.handOut(event);
          yield event;
        }
        if (decoder.done) return;
        if (deadline !== undefined && Date.now() > deadline) throw waitTimedOut(this.pid, seconds ?? 0);
      }
      for (const event of decoder.close()) {
        await this.handOut(event);
        yield event;
      }
    } catch (err) {
      // A read that outlasts the wait asked for is the wait's end, not the network's.
      if (err instanceof TransportTimeoutError && seconds !== undefined) throw waitTimedOut(this.pid, seconds);
      throw err;
    }
    decoder.result();
  }

  private async handOut(event: ProcessEvent): Promise<void> {
    if (event.type === "stdout" && this.callbacks.onStdout) await this.callbacks.onStdout(event.data);
    if (event.type === "stderr" && this.callbacks.onStderr) await this.callbacks.onStderr(event.data);
  }

  /** Wait for the exit and return the result (`WaitTimeoutError` after `timeoutSeconds`).
   * With callbacks, the output streams to them meanwhile. */
  async wait(options: { timeoutSeconds?: number } = {}): Promise<ExecResult> {
    if (this.callbacks.onStdout || this.callbacks.onStderr) {
      let result: ExecResult | undefined;
      for await (const event of this.stream(options)) {
        if (event.type === "exit") result = event.result;
      }
      if (result === undefined) throw new ProtocolError("process stream ended before its exit event");
      return result;
    }
    const seconds = options.timeoutSeconds;
    return camelize(await this.http.json({
      method: "POST", path: sandboxPath(this.sandboxId, "processes", this.pid, "wait"),
      query: { timeout_seconds: seconds }, timeout: withReadTimeout(this.http.timeout, seconds ?? null),
    })) as ExecResult;
  }

  /** Send a signal (a number or a name such as `"SIGTERM"`). */
  async sendSignal(sig: number | NodeJS.Signals): Promise<void> {
    await this.http.void({ method: "POST", path: sandboxPath(this.sandboxId, "processes", this.pid, "signal"),
      json: { signal: signalNumber(sig) } });
  }

  /** Kill the process (SIGKILL). */
  async kill(): Promise<void> {
    await this.sendSignal("SIGKILL");
  }

  /** Write `data` (text is sent as UTF-8) to its stdin; `eof: true` closes stdin after. */
  async sendStdin(data: string | Uint8Array, options: { eof?: boolean } = {}): Promise<void> {
    await this.http.void({ method: "POST", path: sandboxPath(this.sandboxId, "processes", this.pid, "stdin"),
      query: options.eof ? { eof: "true" } : undefined, body: data,
      headers: { "Content-Type": "application/octet-stream" } });
  }
}
