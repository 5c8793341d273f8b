/**
 * `Sandbox`: one microVM sandbox. The twin of the Python SDK's `AsyncSandbox`
 * (src/pandastack/sdk/async_sandbox.py), in camelCase, with options objects for what Python
 * takes as keyword arguments.
 *
 *     await using sbx = await Sandbox.create({ ttlSeconds: 900 });
 *     await sbx.files.write("/work/step.py", source);
 *     const run = await sbx.exec("python3 /work/step.py", { timeoutSeconds: 600 });
 *     // leaving the block kills the sandbox, also when it threw
 */
import { camelize, snakeify } from "./camel.js";
import { CodeInterpreter, DEFAULT_CODE_TIMEOUT, type Execution, type RunCodeOptions } from "./code.js";
import { Commands, type ExecOptions } from "./commands.js";
import { type ConnectionOptions, resolveConfig } from "./config.js";
import { NotFoundError, TemplateBuildingError, invalid } from "./errors.js";
import { Filesystem } from "./files.js";
import { queryLimits } from "./generated/limits.js";
import { Http, pathSegment, sandboxPath } from "./http.js";
import { Terminals } from "./pty.js";
import type { AttachedVolume, ExecResult, ForkResult, Lifecycle, Logs, NetworkArg, NetworkSpec,
  SandboxInfo, SandboxMetrics, SandboxState, SnapshotInfo, VolumeArg } from "./types.js";

/** How long a create keeps waiting for a template that is still building (a built-in
 * template's first use on a fresh host builds its image: minutes under TCG). */
export const TEMPLATE_WAIT_SECONDS = 1800;
export const DEFAULT_TEMPLATE = "base";
const asyncDispose: typeof Symbol.asyncDispose = Symbol.asyncDispose ?? Symbol.for("Symbol.asyncDispose");

export interface CreateOptions extends ConnectionOptions {
  /** The template to boot (default `"base"`); ignored in favour of the snapshot's. */
  template?: string;
  /** Lifetime before the server kills it (server default when unset: always set one). */
  ttlSeconds?: number;
  /** Exempt from the idle reaper. */
  persistent?: boolean;
  vcpus?: number;
  memoryMb?: number;
  diskMb?: number;
  /** Environment of every command. */
  env?: Record<string, string>;
  /** Labels to filter `Sandbox.list` by. */
  metadata?: Record<string, string>;
  /** A snapshot id: resume its memory, processes and files. */
  snapshot?: string;
  /** The egress policy (default: internet on). */
  network?: NetworkArg;
  /** Team volumes to mount: `[{name, mountPath, readOnly}]`. */
  volumes?: VolumeArg[];
  /** A name of the team's, unique among its live sandboxes (`ConflictError` if taken; see
   * `getOrCreate`); `connect` takes it where it takes an id. */
  name?: string;
  /** The host to place it on: admin keys only, where the server drives many hosts (a team's
   * key gets `PermissionDeniedError`). */
  hostId?: string;
}

export interface ListOptions extends ConnectionOptions {
  /** Only sandboxes in this state (ended or not). */
  state?: string;
  /** Only those carrying every one of these labels. */
  metadata?: Record<string, string>;
  /** Ended sandboxes too (without `state`). */
  includeEnded?: boolean;
  template?: string;
  /** Created after this (Unix seconds or a Date). */
  startedAfter?: number | Date;
  /** One page of at most this many; pass its `nextToken` back for the next. */
  limit?: number;
  nextToken?: string;
}

/** A page of sandboxes: `nextToken` is undefined on the last page. */
export type SandboxPage = Sandbox[] & { nextToken: string | undefined };

const ENDED = new Set(["killed", "expired", "reaped", "failed"]); // wire.ENDED_STATES

function sleep(seconds: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, seconds * 1000));
}

function openHttp(options: ConnectionOptions): Http {
  const fetchImpl = options.fetch ?? globalThis.fetch;
  if (typeof fetchImpl !== "function") throw invalid("no fetch: use Node >= 18 or pass `fetch`");
  return new Http(resolveConfig(options), fetchImpl.bind(globalThis));
}

/** Send a create; while its template is still building (409 template_building), wait as the
 * server asks and send it again, for up to TEMPLATE_WAIT_SECONDS. */
export async function createWaiting(http: Http, body: Record<string, unknown>,
  byName?: string): Promise<SandboxInfo> {
  const deadline = Date.now() + TEMPLATE_WAIT_SECONDS * 1000;
  // By name, a PUT: the team's live sandbox of that name, or a new one (server/sandboxes/names.py).
  const call = byName === undefined ? { method: "POST", path: "/v1/sandboxes", json: body }
    : { method: "PUT", path: `/v1/sandboxes/by-name/${pathSegment(byName)}`, json: body };
  for (;;) {
    try {
      return camelize(await http.json(call)) as SandboxInfo;
    } catch (err) {
      if (!(err instanceof TemplateBuildingError) || Date.now() >= deadline) throw err;
      await sleep(Math.min(Math.max(err.retryAfter ?? 5, 1), 30));
    }
  }
}

/** The body of a create (also `client.sandboxes.create`). */
export function createBody(options: CreateOptions): Record<string, unknown> {
  // From a snapshot the template is the snapshot's: the default is then not sent (an
  // explicit other one is, and the server refuses it).
  let template: string | undefined = options.template ?? DEFAULT_TEMPLATE;
  if (options.snapshot !== undefined && template === DEFAULT_TEMPLATE) template = undefined;
  return snakeify({
    template, ttlSeconds: options.ttlSeconds, persistent: options.persistent ?? false,
    vcpus: options.vcpus, memoryMb: options.memoryMb, diskMb: options.diskMb,
    env: options.env, metadata: options.metadata, snapshot: options.snapshot,
    network: options.network, volumes: options.volumes, name: options.name,
    hostId: options.hostId,
  });
}

export function listQuery(options: ListOptions): Record<string, string | undefined> {
  const query: Record<string, string | undefined> = {};
  for (const [k, v] of Object.entries(options.metadata ?? {})) query[`metadata.${k}`] = v;
  if (options.state !== undefined) query["state"] = options.state;
  else if (!options.includeEnded) query["include_ended"] = "false";
  query["template"] = options.template;
  const after = options.startedAfter;
  if (after !== undefined) query["started_after"] = String(after instanceof Date ? after.getTime() / 1000 : after);
  if (options.limit !== undefined) query["limit"] = String(options.limit);
  query["next_token"] = options.nextToken;
  return query;
}

/** The sandboxes (as the server lists them) and the next page's token. */
export async function listInfos(http: Http, options: ListOptions): Promise<[SandboxInfo[], string | undefined]> {
  const body = await http.json<{ sandboxes: unknown[]; next_token?: string | null }>({
    method: "GET", path: "/v1/sandboxes", query: listQuery(options) });
  let infos = camelize(body.sandboxes) as SandboxInfo[];
  // A server older than include_ended lists every sandbox.
  if (options.state === undefined && !options.includeEnded) infos = infos.filter((i) => !ENDED.has(i.state));
  return [infos, body.next_token ?? undefined];
}

export class Sandbox implements AsyncDisposable {
  readonly commands: Commands;
  readonly code: CodeInterpreter;
  readonly filesystem: Filesystem;
  /** Terminals: `create` one (a shell by default), `connect` to one by its pid. */
  readonly pty: Terminals;
  private current: SandboxInfo;
  private killed = false;

  /** @internal Use `Sandbox.create` or `Sandbox.connect`. */
  constructor(info: SandboxInfo, private readonly http: Http) {
    this.current = info;
    this.commands = new Commands(info.id, http);
    this.code = new CodeInterpreter(info.id, http);
    this.filesystem = new Filesystem(info.id, http);
    this.pty = new Terminals(info.id, http);
  }

  /** The sandbox id. */
  get id(): string {
    return this.current.id;
  }

  /** The sandbox as last seen (at create/connect, or the last `refresh()`). */
  get info(): SandboxInfo {
    return this.current;
  }

  // The fields of `info` as read-only properties, as last seen (create, connect, list, or
  // the last `refresh()`): scripts written against the earlier list read `sbx.state` off its
  // items. `snapshot` stays `info.snapshot`: on the handle that name takes a snapshot.
  /** The state as last seen (`refresh()` asks again). */
  get state(): SandboxState {
    return this.current.state;
  }

  /** The template it was created from. */
  get template(): string {
    return this.current.template;
  }

  /** The team's name for it, if it was given one. */
  get name(): string | null {
    return this.current.name ?? null;
  }

  /** Its labels (a copy: changing it changes nothing on the server). */
  get metadata(): Record<string, string> {
    return { ...(this.current.metadata ?? {}) };
  }

  /** The host it runs on, where the server drives many. */
  get hostId(): string | null {
    return this.current.hostId ?? null;
  }

  /** When it was created (Unix seconds). */
  get createdAt(): number {
    return this.current.createdAt;
  }

  /** When its TTL ends it (Unix seconds), if it has one. */
  get expiresAt(): number | null {
    return this.current.expiresAt ?? null;
  }

  /** Its time to live, counted from `createdAt`. */
  get ttlSeconds(): number {
    return this.current.ttlSeconds;
  }

  /** Whether the idle reaper leaves it alone. */
  get persistent(): boolean {
    return this.current.persistent;
  }

  get vcpus(): number {
    return this.current.vcpus;
  }

  get memoryMb(): number {
    return this.current.memoryMb;
  }

  get diskMb(): number | null {
    return this.current.diskMb ?? null;
  }

  /** The volumes it has mounted (a copy of the list). */
  get volumes(): AttachedVolume[] {
    return [...(this.current.volumes ?? [])];
  }

  /** When it ended (Unix seconds); null while it has not. */
  get endedAt(): number | null {
    return this.current.endedAt ?? null;
  }

  get endReason(): string | null {
    return this.current.endReason ?? null;
  }

  /** State stopped: why its VM ended. */
  get stopReason(): string | null {
    return this.current.stopReason ?? null;
  }

  /** After a stopped sandbox was started again: what it came back from. */
  get restoredFrom(): SandboxInfo["restoredFrom"] | null {
    return this.current.restoredFrom ?? null;
  }

  /** The same as `filesystem` (the name other sandbox SDKs use). */
  get files(): Filesystem {
    return this.filesystem;
  }

  /** Create a sandbox from `template` (or `snapshot`); waits while the template builds. */
  static async create(options: CreateOptions = {}): Promise<Sandbox> {
    const body = createBody(options);
    const http = openHttp(options);
    return new Sandbox(await createWaiting(http, body), http);
  }

  /** The team's live sandbox named `name` (a hibernated one woken), or a new one made with
   * these options (those of `create`). Concurrent calls with one name get one sandbox; an
   * ended sandbox frees its name. */
  static async getOrCreate(name: string, options: Omit<CreateOptions, "name"> = {}): Promise<Sandbox> {
    const body = createBody({ ...options, name });
    const http = openHttp(options);
    return new Sandbox(await createWaiting(http, body, name), http);
  }

  /** A handle on the existing sandbox `sandboxId` (or the team's live one of that name;
   * `NotFoundError` if there is none). Note
   * that `await using` it kills the sandbox at the end of the block. */
  static async connect(sandboxId: string, options: ConnectionOptions = {}): Promise<Sandbox> {
    const http = openHttp(options);
    const info = camelize(await http.json({ method: "GET", path: sandboxPath(sandboxId) })) as SandboxInfo;
    return new Sandbox(info, http);
  }

  /** The team's sandboxes, oldest first: the live ones, every one (`includeEnded`), or those
   * in `state`; filtered by `metadata`, `template`, `startedAfter`; paged with `limit`. */
  static async list(options: ListOptions = {}): Promise<SandboxPage> {
    const http = openHttp(options);
    const [infos, token] = await listInfos(http, options);
    return Object.assign(infos.map((info) => new Sandbox(info, http)), { nextToken: token });
  }

  private async transition(action: "pause" | "resume" | "hibernate" | "wake"): Promise<SandboxInfo> {
    this.current = camelize(await this.http.json({ method: "POST", path: sandboxPath(this.id, action), json: {} })) as SandboxInfo;
    return this.current;
  }

  /** Fetch the current state; also updates `info`. */
  async refresh(): Promise<SandboxInfo> {
    this.current = camelize(await this.http.json({ method: "GET", path: sandboxPath(this.id) })) as SandboxInfo;
    return this.current;
  }

  /** Run `cmd` to completion; the same as `commands.run` (see there). */
  exec(cmd: string | string[], options: ExecOptions = {}): Promise<ExecResult> {
    return this.commands.run(cmd, options);
  }

  /** Run `code` in the sandbox's kernel; the same as `code.run` (state persists between runs). */
  runCode(code: string, options: RunCodeOptions = {}): Promise<Execution> {
    return this.code.run(code, { timeoutSeconds: DEFAULT_CODE_TIMEOUT, ...options });
  }

  /** Stop the vCPUs in place until `resume()`. */
  pause(): Promise<SandboxInfo> {
    return this.transition("pause");
  }

  resume(): Promise<SandboxInfo> {
    return this.transition("resume");
  }

  /** Write the whole state to disk and end the VM; any later request brings it back. */
  hibernate(): Promise<SandboxInfo> {
    return this.transition("hibernate");
  }

  /** Bring a hibernated sandbox back now, or start a stopped one (its VM died;
   * `restoredFrom` says what it came back from); a no-op if it is awake. */
  wake(): Promise<SandboxInfo> {
    return this.transition("wake");
  }

  /** Capture memory, processes and disk; the snapshot id (`Sandbox.create({snapshot})`). */
  async snapshot(options: { name?: string } = {}): Promise<string> {
    const info = camelize(await this.http.json({ method: "POST", path: sandboxPath(this.id, "snapshots"),
      json: options.name === undefined ? {} : { name: options.name } })) as SnapshotInfo;
    return info.id;
  }

  /** `count` (1 to 16, default 1) live copies, each with the parent's memory, processes and
   * files at the fork instant; the parent keeps running. Kill each child when done.
   * `hostId`: the host to place the children on (admin keys only). */
  async fork(options: { count?: number; durable?: boolean; hostId?: string } = {}): Promise<Sandbox[]> {
    const result = camelize(await this.http.json({ method: "POST", path: sandboxPath(this.id, "fork"),
      json: { count: options.count ?? 1, ...(options.durable ? { durable: true } : {}),
        ...(options.hostId !== undefined ? { host_id: options.hostId } : {}) } })) as ForkResult;
    return result.sandboxes.map((info) => new Sandbox(info, this.http));
  }

  /** TTL, persistence, expiry and last activity. */
  async lifecycle(): Promise<Lifecycle> {
    return camelize(await this.http.json({ method: "GET", path: sandboxPath(this.id, "lifecycle") })) as Lifecycle;
  }

  private async patchLifecycle(body: Record<string, unknown>): Promise<Lifecycle> {
    return camelize(await this.http.json({ method: "PATCH", path: sandboxPath(this.id, "lifecycle"), json: body })) as Lifecycle;
  }

  /** Set the time to live, counted from creation. */
  setTtl(seconds: number): Promise<Lifecycle> {
    return this.patchLifecycle({ ttl_seconds: seconds });
  }

  /** End the sandbox `seconds` from now, whatever its age. */
  setTimeout(seconds: number): Promise<Lifecycle> {
    return this.patchLifecycle({ timeout_seconds: seconds });
  }

  /** Exempt from the idle reaper (true) or not. */
  setPersistent(flag: boolean): Promise<Lifecycle> {
    return this.patchLifecycle({ persistent: flag });
  }

  /** Whether it is running now (one GET; also updates `info`). */
  async isRunning(): Promise<boolean> {
    try {
      return (await this.refresh()).state === "running";
    } catch (err) {
      if (err instanceof NotFoundError) return false;
      throw err;
    }
  }

  /** The egress policy. */
  async network(): Promise<NetworkSpec> {
    return camelize(await this.http.json({ method: "GET", path: sandboxPath(this.id, "network") })) as NetworkSpec;
  }

  /** Replace the egress policy (fields left out take their defaults). */
  async updateNetwork(network: NetworkArg): Promise<NetworkSpec> {
    return camelize(await this.http.json({ method: "PUT", path: sandboxPath(this.id, "network"),
      json: snakeify(network) })) as NetworkSpec;
  }

  /** The API address of TCP `port` inside the sandbox; requests need the API key. */
  getUrl(port: number): string {
    return this.http.config.apiUrl + sandboxPath(this.id, "ports", checkPort(port)) + "/";
  }

  /** A URL of `port` that works without an API key for `ttlSeconds` (default 3600). */
  async signedUrl(port: number, options: { ttlSeconds?: number } = {}): Promise<string> {
    const body = await this.http.json<{ url: string }>({ method: "POST",
      path: sandboxPath(this.id, "ports", checkPort(port), "signed-url"),
      json: { ttl_seconds: options.ttlSeconds ?? 3600 } });
    return body.url;
  }

  /** The guest console log and the guest agent's log. */
  async logs(): Promise<Logs> {
    return camelize(await this.http.json({ method: "GET", path: sandboxPath(this.id, "logs") })) as Logs;
  }

  /** CPU (over `windowMs`, 10-2000, default 200: the API's), memory and disk, measured now. */
  async getMetrics(options: { windowMs?: number } = {}): Promise<SandboxMetrics> {
    const bounds = queryLimits.getSandboxMetrics.window_ms;
    const windowMs = options.windowMs ?? bounds.default;
    if (!Number.isInteger(windowMs) || windowMs < bounds.minimum || windowMs > bounds.maximum) {
      throw invalid(`windowMs must be an integer from ${bounds.minimum} to ${bounds.maximum}, ` +
                    `not ${windowMs}`);
    }
    return camelize(await this.http.json({ method: "GET", path: sandboxPath(this.id, "metrics"),
      query: { window_ms: windowMs } })) as SandboxMetrics;
  }

  /** Kill the sandbox. Idempotent: one already gone counts as killed. */
  async kill(): Promise<void> {
    if (this.killed) return;
    try {
      await this.http.void({ method: "DELETE", path: sandboxPath(this.id) });
    } catch (err) {
      if (!(err instanceof NotFoundError)) throw err;
    }
    this.killed = true;
  }

  /** Drop the handle without killing the sandbox (fetch keeps no pool to close: a no-op,
   * kept so code reads as it does in Python). */
  async close(): Promise<void> {}

  /** `await using sbx = await Sandbox.create()` kills it at the end of the block. A kill
   * that fails is thrown; if the block threw too, JavaScript throws a `SuppressedError`
   * holding both (the block's as `suppressed`). */
  async [asyncDispose](): Promise<void> {
    await this.kill();
  }

  toString(): string {
    return `Sandbox(id=${this.id}, state=${this.current.state})`;
  }
}

function checkPort(port: number): number {
  if (!Number.isInteger(port) || port < 1 || port > 65535) {
    throw invalid(`port must be an integer between 1 and 65535, not ${port}`);
  }
  return port;
}
