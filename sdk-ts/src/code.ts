/**
 * `sbx.code`: the code interpreter (a Jupyter kernel per context). `run` returns an
 * `Execution` with stdout, stderr, rich `results` (text, html, png, json, ...) and `error`
 * (name, value, traceback) when the code raised: an error in the code is data, not an
 * exception of the SDK.
 */
import { camelize } from "./camel.js";
import { ProtocolError } from "./errors.js";
import { type Http, errorFromEvent, sandboxPath, withReadTimeout } from "./http.js";
import { SSEDecoder, type ServerSentEvent } from "./sse.js";
import type { CodeContext, CodeError, CodeResultWire } from "./types.js";

export type Language = "python" | "bash" | "javascript";
export const DEFAULT_CODE_TIMEOUT = 300;

/** One rich output. `data` maps MIME types to content; the getters read the common ones
 * (binary formats stay base64 text; `pngBytes()` decodes). */
export class Result {
  readonly data: Record<string, string>;
  readonly isMainResult: boolean;

  /** @internal */
  constructor(wire: CodeResultWire) {
    this.data = wire.data;
    this.isMainResult = wire.isMainResult ?? false;
  }

  get text(): string | undefined { return this.data["text/plain"]; }
  get html(): string | undefined { return this.data["text/html"]; }
  get markdown(): string | undefined { return this.data["text/markdown"]; }
  get svg(): string | undefined { return this.data["image/svg+xml"]; }
  /** The PNG image, base64 (as Jupyter sends it). */
  get png(): string | undefined { return this.data["image/png"]; }
  get jpeg(): string | undefined { return this.data["image/jpeg"]; }
  get latex(): string | undefined { return this.data["text/latex"]; }
  /** The application/json payload, decoded (undefined if there is none). */
  get json(): unknown {
    const raw = this.data["application/json"];
    if (raw === undefined) return undefined;
    try {
      return JSON.parse(raw);
    } catch {
      return raw;
    }
  }

  pngBytes(): Uint8Array | undefined {
    const raw = this.png;
    return raw === undefined ? undefined : new Uint8Array(Buffer.from(raw, "base64"));
  }

  /** The MIME types this result carries. */
  formats(): string[] {
    return Object.keys(this.data);
  }
}

/** What one run produced. */
export class Execution {
  /** @internal */
  constructor(readonly stdout: string, readonly stderr: string, readonly results: Result[],
    readonly error: CodeError | undefined, readonly executionCount: number | undefined) {}

  /** The text of the main result (the value of the last expression), if any. */
  get text(): string | undefined {
    return this.results.find((r) => r.isMainResult)?.text;
  }

  /** @internal */
  static fromWire(raw: unknown): Execution {
    const w = camelize(raw) as { stdout?: string; stderr?: string; results?: CodeResultWire[];
      error?: CodeError | null; executionCount?: number | null };
    return new Execution(w.stdout ?? "", w.stderr ?? "", (w.results ?? []).map((r) => new Result(r)),
      w.error ?? undefined, w.executionCount ?? undefined);
  }
}

/** One event of a streamed run; `end` is always last. */
export type CodeEvent =
  | { type: "stdout" | "stderr"; text: string }
  | { type: "result"; result: Result }
  | { type: "error"; error: CodeError }
  | { type: "end"; executionCount: number | undefined };

export class CodeStreamDecoder {
  private readonly sse = new SSEDecoder();
  private readonly stdout: string[] = [];
  private readonly stderr: string[] = [];
  private readonly results: Result[] = [];
  private error: CodeError | undefined;
  private end: { executionCount: number | undefined } | undefined;

  get done(): boolean {
    return this.end !== undefined;
  }

  feed(chunk: Uint8Array): CodeEvent[] {
    return this.handle(this.sse.feed(chunk));
  }

  close(): CodeEvent[] {
    return this.handle(this.sse.close());
  }

  private handle(events: ServerSentEvent[]): CodeEvent[] {
    const out: CodeEvent[] = [];
    for (const event of events) {
      if (this.end !== undefined) break;
      const decoded = this.decode(event);
      if (decoded !== undefined) out.push(decoded);
    }
    return out;
  }

  private decode(event: ServerSentEvent): CodeEvent | undefined {
    if (event.event === "failure") throw errorFromEvent(event.data);
    if (!["stdout", "stderr", "result", "error", "end"].includes(event.event)) return undefined;
    let payload: Record<string, unknown>;
    try {
      payload = JSON.parse(event.data) as Record<string, unknown>;
    } catch {
      throw new ProtocolError(`code stream: ${event.event} event is not JSON`);
    }
    if (event.event === "stdout" || event.event === "stderr") {
      const text = payload?.["data"];
      if (typeof text !== "string") throw new ProtocolError(`code stream: ${event.event} event lacks a string 'data'`);
      (event.event === "stdout" ? this.stdout : this.stderr).push(text);
      return { type: event.event, text };
    }
    if (event.event === "result") {
      const result = new Result(camelize(payload) as CodeResultWire);
      this.results.push(result);
      return { type: "result", result };
    }
    if (event.event === "error") {
      this.error = camelize(payload) as CodeError;
      return { type: "error", error: this.error };
    }
    const count = payload?.["execution_count"];
    this.end = { executionCount: typeof count === "number" ? count : undefined };
    return { type: "end", ...this.end };
  }

  result(): Execution {
    if (this.end === undefined) throw new ProtocolError("code stream ended before its end event");
    return new Execution(this.stdout.join(""), this.stderr.join(""), this.results, this.error,
      this.end.executionCount);
  }
}

export interface RunCodeOptions {
  language?: Language;
  /** A context id (or the context): its kernel's state is independent of the others. */
  context?: string | CodeContext;
  /** Interrupt the kernel after this long (error name "TimeoutError"); default 300. */
  timeoutSeconds?: number;
  env?: Record<string, string>;
  /** Gets every event as it arrives (may return a promise). */
  onEvent?: (event: CodeEvent) => unknown;
  /** Gets each chunk of stdout as it arrives. */
  onStdout?: (text: string) => unknown;
  onStderr?: (text: string) => unknown;
  /** Gets each rich result as it arrives. */
  onResult?: (result: Result) => unknown;
}

function contextId(context: string | CodeContext | undefined): string | undefined {
  return typeof context === "string" || context === undefined ? context : context.id;
}

export class CodeInterpreter {
  /** @internal */
  constructor(private readonly sandboxId: string, private readonly http: Http) {}

  private call(code: string, options: RunCodeOptions, stream: boolean) {
    const timeoutSeconds = options.timeoutSeconds ?? DEFAULT_CODE_TIMEOUT;
    return {
      method: "POST",
      path: sandboxPath(this.sandboxId, ...(stream ? ["code", "stream"] : ["code"])),
      json: { code, language: options.language ?? "python", context_id: contextId(options.context),
        timeout_seconds: timeoutSeconds, env: options.env },
      headers: stream ? { Accept: "text/event-stream" } : undefined,
      timeout: withReadTimeout(this.http.timeout, timeoutSeconds),
    };
  }

  /** Run `code`; its `Execution`. With any callback, the run streams and each event goes to
   * `onEvent` and to the callback of its kind. State persists between runs of a context. */
  async run(code: string, options: RunCodeOptions = {}): Promise<Execution> {
    const streaming = options.onEvent || options.onStdout || options.onStderr || options.onResult;
    if (!streaming) return Execution.fromWire(await this.http.json(this.call(code, options, false)));
    const decoder = new CodeStreamDecoder();
    for await (const event of this.events(decoder, code, options)) {
      if (options.onEvent) await options.onEvent(event);
      if (event.type === "stdout" && options.onStdout) await options.onStdout(event.text);
      if (event.type === "stderr" && options.onStderr) await options.onStderr(event.text);
      if (event.type === "result" && options.onResult) await options.onResult(event.result);
    }
    return decoder.result();
  }

  /** Run `code`, yielding its events as they arrive; the last is always `end`. */
  async *stream(code: string, options: Omit<RunCodeOptions, "onEvent" | "onStdout" | "onStderr" | "onResult"> = {}): AsyncGenerator<CodeEvent, void, undefined> {
    yield* this.events(new CodeStreamDecoder(), code, options);
  }

  private async *events(decoder: CodeStreamDecoder, code: string, options: RunCodeOptions): AsyncGenerator<CodeEvent, void, undefined> {
    for await (const chunk of this.http.stream(this.call(code, options, true))) {
      yield* decoder.feed(chunk);
      if (decoder.done) return;
    }
    yield* decoder.close();
    decoder.result();
  }

  /** A new context: its own kernel. */
  async createContext(options: { language?: Language; cwd?: string } = {}): Promise<CodeContext> {
    return camelize(await this.http.json({ method: "POST", path: sandboxPath(this.sandboxId, "code", "contexts"),
      json: { language: options.language ?? "python", cwd: options.cwd } })) as CodeContext;
  }

  /** The sandbox's code contexts. */
  async listContexts(): Promise<CodeContext[]> {
    const body = await this.http.json<{ contexts: unknown[] }>({ method: "GET",
      path: sandboxPath(this.sandboxId, "code", "contexts") });
    return camelize(body.contexts) as CodeContext[];
  }

  /** Restart the context's kernel: its state is lost, the context stays. */
  async restartContext(context: string | CodeContext): Promise<void> {
    await this.http.void({ method: "POST",
      path: sandboxPath(this.sandboxId, "code", "contexts", contextId(context) ?? "", "restart") });
  }

  /** Delete the context and stop its kernel. */
  async removeContext(context: string | CodeContext): Promise<void> {
    await this.http.void({ method: "DELETE",
      path: sandboxPath(this.sandboxId, "code", "contexts", contextId(context) ?? "") });
  }
}
