/**
 * `Client`: the team's resources beyond one sandbox. The twin of the Python SDK's
 * `AsyncClient` (src/pandastack/sdk/client.py): `sandboxes`, `snapshots`, `templates`,
 * `volumes`, `keys`, `hosts`, `teams`, `events`, `webhooks`, `registries`, and `usage()`.
 */
import { camelize, snakeify } from "./camel.js";
import { type ConnectionOptions, resolveConfig } from "./config.js";
import { ProtocolError, TemplateBuildError, invalid } from "./errors.js";
import { Http, pathSegment, sandboxPath, withReadTimeout } from "./http.js";
import { type CreateOptions, type ListOptions, type SandboxPage, Sandbox, createBody, createWaiting,
  listInfos } from "./sandbox.js";
import { fromDockerfile } from "./dockerfile.js";
import { Template } from "./template.js";
import { SSEDecoder } from "./sse.js";
import { Events } from "./events.js";
import { Webhooks } from "./webhooks.js";
import { Registries } from "./registries.js";
import type { BuiltinTemplateInfo, CreatedKey, DrainResult, HostInfo, KeyInfo, NetworkArg, QuotaInfo,
  SandboxInfo, SnapshotInfo, TemplateBuildInfo, TemplateInfo, TemplateSpec, UsageReport,
  VolumeInfo } from "./types.js";

/** What every namespace shares: the connection of its client. */
class Namespace {
  /** @internal */
  constructor(protected readonly http: Http) {}

  /** The server this namespace talks to. */
  get apiUrl(): string {
    return this.http.config.apiUrl;
  }
}

/** How long `templates.build` follows a build by default (builds under TCG are slow). */
export const DEFAULT_BUILD_TIMEOUT = 3600;
/** A drain moves the host's sandboxes one after another. */
const DRAIN_TIMEOUT_SECONDS = 3600;

export class Sandboxes extends Namespace {

  /** As `Sandbox.list`; each item uses this client's connection settings. */
  async list(options: Omit<ListOptions, keyof ConnectionOptions> = {}): Promise<SandboxPage> {
    const [infos, token] = await listInfos(this.http, options);
    return Object.assign(infos.map((info) => new Sandbox(info, this.http)), { nextToken: token });
  }

  /** The current state of sandbox `sandboxId`. */
  async get(sandboxId: string): Promise<SandboxInfo> {
    return camelize(await this.http.json({ method: "GET", path: sandboxPath(sandboxId) })) as SandboxInfo;
  }

  /** Create a sandbox (options as `Sandbox.create`). */
  async create(options: Omit<CreateOptions, keyof ConnectionOptions> = {}): Promise<Sandbox> {
    return new Sandbox(await createWaiting(this.http, createBody(options)), this.http);
  }

  /** The team's live sandbox named `name`, or a new one (as `Sandbox.getOrCreate`). */
  async getOrCreate(name: string, options: Omit<CreateOptions, keyof ConnectionOptions | "name"> = {}): Promise<Sandbox> {
    return new Sandbox(await createWaiting(this.http, createBody({ ...options, name }), name), this.http);
  }

  /** A handle on the existing sandbox `sandboxId` (or the live one of that name). */
  async connect(sandboxId: string): Promise<Sandbox> {
    return new Sandbox(await this.get(sandboxId), this.http);
  }

  /** Kill sandbox `sandboxId` (`NotFoundError` if there is none). */
  async kill(sandboxId: string): Promise<void> {
    await this.http.void({ method: "DELETE", path: sandboxPath(sandboxId) });
  }
}

export class Snapshots extends Namespace {

  async list(): Promise<SnapshotInfo[]> {
    const body = await this.http.json<{ snapshots: unknown[] }>({ method: "GET", path: "/v1/snapshots" });
    return camelize(body.snapshots) as SnapshotInfo[];
  }

  async get(snapshotId: string): Promise<SnapshotInfo> {
    return camelize(await this.http.json({ method: "GET", path: `/v1/snapshots/${pathSegment(snapshotId)}` })) as SnapshotInfo;
  }

  async delete(snapshotId: string): Promise<void> {
    await this.http.void({ method: "DELETE", path: `/v1/snapshots/${pathSegment(snapshotId)}` });
  }
}

export interface BuildOptions {
  /** Where a Dockerfile's COPY/ADD sources are read from (Dockerfile text only). */
  contextDir?: string;
  /** Values of the Dockerfile's ARGs (`docker build --build-arg`; Dockerfile text only). */
  buildArgs?: Record<string, string>;
  vcpus?: number;
  memoryMb?: number;
  /** The build VM's egress policy. */
  network?: NetworkArg;
  /** Gets each log line as the build writes it. */
  onLog?: (line: string) => unknown;
  /** Follow the build to its end (default true); false returns at once ("building"). */
  wait?: boolean;
  timeoutSeconds?: number;
}

export class Templates extends Namespace {

  /** Build a new version of template `name` from `template`: a `Template` builder, Dockerfile
   * text (COPY sources from `contextDir`) or a template spec (the wire `TemplateSpec`:
   * `{from_template, steps: [{kind: "apt", packages: [...]}, ...], start, ready}`) and, with
   * `wait`, follow its log to the end. A failed build throws `TemplateBuildError`. */
  async build(template: Template | TemplateSpec | string, name: string, options: BuildOptions = {}): Promise<TemplateBuildInfo> {
    const spec = template instanceof Template ? template.toSpec()
      : typeof template === "string" ? fromDockerfile(template, options.contextDir, options.buildArgs)
        : template;
    const body: Record<string, unknown> = { name, spec, vcpus: options.vcpus ?? 1,
      memory_mb: options.memoryMb ?? 512 };
    if (options.network !== undefined) body["network"] = snakeify(options.network);
    const info = camelize(await this.http.json({ method: "POST", path: "/v1/templates", json: body })) as TemplateBuildInfo;
    if (options.wait === false) return info;
    for await (const line of this.logs(info.buildId, { timeoutSeconds: options.timeoutSeconds })) {
      if (options.onLog) await options.onLog(line);
    }
    const final = await this.getBuild(info.buildId);
    if (final.status === "failed") {
      throw new TemplateBuildError(`template ${final.name}:${final.version} failed to build: ${final.error}`, final);
    }
    return final;
  }

  /** The build's log lines: those so far, then new ones until the build ends. */
  async *logs(buildId: string, options: { timeoutSeconds?: number | undefined } = {}): AsyncGenerator<string, void, undefined> {
    const sse = new SSEDecoder();
    let ended = false;
    const call = { method: "GET", path: `/v1/templates/builds/${pathSegment(buildId)}/logs`,
      headers: { Accept: "text/event-stream" },
      timeout: withReadTimeout(this.http.timeout, options.timeoutSeconds ?? DEFAULT_BUILD_TIMEOUT) };
    for await (const chunk of this.http.stream(call)) {
      for (const event of sse.feed(chunk)) {
        let payload: Record<string, unknown>;
        try {
          payload = JSON.parse(event.data) as Record<string, unknown>;
        } catch {
          throw new ProtocolError("build log: an event is not JSON");
        }
        if (event.event === "log") yield String(payload["line"] ?? "");
        else if (event.event === "status") ended = true;
        if (ended) return;
      }
    }
    if (!ended) throw new ProtocolError("the build log ended before the build's status");
  }

  async getBuild(buildId: string): Promise<TemplateBuildInfo> {
    return camelize(await this.http.json({ method: "GET", path: `/v1/templates/builds/${pathSegment(buildId)}` })) as TemplateBuildInfo;
  }

  /** The team's templates: the newest version of each name. */
  async list(): Promise<TemplateBuildInfo[]> {
    const body = await this.http.json<{ templates: unknown[] }>({ method: "GET", path: "/v1/templates" });
    return camelize(body.templates) as TemplateBuildInfo[];
  }

  /** The built-in templates (`base`, `python`, ...): every team may create sandboxes from
   * them; the default one is marked. */
  async builtin(): Promise<BuiltinTemplateInfo[]> {
    const body = await this.http.json<{ builtin?: unknown[] }>({ method: "GET", path: "/v1/templates" });
    return camelize(body.builtin ?? []) as BuiltinTemplateInfo[];
  }

  /** Template `name` with all its versions. */
  async get(name: string): Promise<TemplateInfo> {
    return camelize(await this.http.json({ method: "GET", path: `/v1/templates/${pathSegment(name)}` })) as TemplateInfo;
  }

  /** Delete template `name` (or one `version`). */
  async delete(name: string, options: { version?: number } = {}): Promise<void> {
    await this.http.void({ method: "DELETE", path: `/v1/templates/${pathSegment(name)}`,
      query: { version: options.version } });
  }
}

/** A volume snapshot (not in the committed OpenAPI document yet). */
export interface VolumeSnapshotInfo {
  id: string;
  volume: string;
  sizeMb: number;
  createdAt: number;
  [key: string]: unknown;
}

export class Volumes extends Namespace {

  private path(name: string, ...rest: string[]): string {
    return ["/v1/volumes", pathSegment(name), ...rest].join("/");
  }

  /** A new volume of `sizeMb` MiB (default 1024), empty or from volume snapshot `fromSnapshot`. */
  async create(name: string, options: { sizeMb?: number; hostId?: string; fromSnapshot?: string } = {}): Promise<VolumeInfo> {
    return camelize(await this.http.json({ method: "POST", path: "/v1/volumes",
      json: snakeify({ name, ...options }) })) as VolumeInfo;
  }

  async list(): Promise<VolumeInfo[]> {
    const body = await this.http.json<{ volumes: unknown[] }>({ method: "GET", path: "/v1/volumes" });
    return camelize(body.volumes) as VolumeInfo[];
  }

  async get(name: string): Promise<VolumeInfo> {
    return camelize(await this.http.json({ method: "GET", path: this.path(name) })) as VolumeInfo;
  }

  async delete(name: string): Promise<void> {
    await this.http.void({ method: "DELETE", path: this.path(name) });
  }

  async resize(name: string, sizeMb: number): Promise<VolumeInfo> {
    return camelize(await this.http.json({ method: "POST", path: this.path(name, "resize"),
      json: { size_mb: sizeMb } })) as VolumeInfo;
  }

  /** A snapshot of the volume, in the object store the hosts share. */
  async snapshot(name: string): Promise<VolumeSnapshotInfo> {
    return camelize(await this.http.json({ method: "POST", path: this.path(name, "snapshots") })) as VolumeSnapshotInfo;
  }

  /** The team's volume snapshots (of volume `name` only, if given). */
  async snapshots(options: { name?: string } = {}): Promise<VolumeSnapshotInfo[]> {
    const body = await this.http.json<{ snapshots: unknown[] }>({ method: "GET", path: "/v1/volume-snapshots",
      query: { volume: options.name } });
    return camelize(body.snapshots) as VolumeSnapshotInfo[];
  }

  async getSnapshot(snapshotId: string): Promise<VolumeSnapshotInfo> {
    return camelize(await this.http.json({ method: "GET", path: `/v1/volume-snapshots/${pathSegment(snapshotId)}` })) as VolumeSnapshotInfo;
  }

  async deleteSnapshot(snapshotId: string): Promise<void> {
    await this.http.void({ method: "DELETE", path: `/v1/volume-snapshots/${pathSegment(snapshotId)}` });
  }

  /** Move the volume to host `hostId` (admin keys). */
  async move(name: string, hostId: string, options: { team?: string } = {}): Promise<VolumeInfo> {
    return camelize(await this.http.json({ method: "POST", path: this.path(name, "move"),
      json: { host_id: hostId, team: options.team } })) as VolumeInfo;
  }
}

export class Keys extends Namespace {

  /** A new API key (its secret is in the answer only). `team`: admin keys only. */
  async create(name: string, options: { team?: string } = {}): Promise<CreatedKey> {
    return camelize(await this.http.json({ method: "POST", path: "/v1/keys", json: { name, team: options.team } })) as CreatedKey;
  }

  async list(): Promise<KeyInfo[]> {
    const body = await this.http.json<{ keys: unknown[] }>({ method: "GET", path: "/v1/keys" });
    return camelize(body.keys) as KeyInfo[];
  }

  async revoke(keyId: string): Promise<void> {
    await this.http.void({ method: "DELETE", path: `/v1/keys/${pathSegment(keyId)}` });
  }
}

export class Hosts extends Namespace {

  async list(): Promise<HostInfo[]> {
    const body = await this.http.json<{ hosts: unknown[] }>({ method: "GET", path: "/v1/hosts" });
    return camelize(body.hosts) as HostInfo[];
  }

  async get(hostId: string): Promise<HostInfo> {
    return camelize(await this.http.json({ method: "GET", path: `/v1/hosts/${pathSegment(hostId)}` })) as HostInfo;
  }

  /** Move the host's sandboxes elsewhere and let it take no new one. */
  async drain(hostId: string): Promise<DrainResult> {
    return camelize(await this.http.json({ method: "POST", path: `/v1/hosts/${pathSegment(hostId)}/drain`, json: {},
      timeout: withReadTimeout(this.http.timeout, DRAIN_TIMEOUT_SECONDS) })) as DrainResult;
  }

  async undrain(hostId: string): Promise<HostInfo> {
    return camelize(await this.http.json({ method: "POST", path: `/v1/hosts/${pathSegment(hostId)}/undrain`, json: {} })) as HostInfo;
  }
}

const QUOTA_LIMITS = ["max_sandboxes", "max_vcpus", "max_memory_mb", "max_volume_gb", "monthly_budget_usd",
  "max_hibernated", "max_snapshot_gb", "max_template_gb"];

export interface QuotaOptions {
  maxSandboxes?: number;
  maxVcpus?: number;
  maxMemoryMb?: number;
  maxVolumeGb?: number;
  monthlyBudgetUsd?: number;
  maxHibernated?: number;
  maxSnapshotGb?: number;
  /** GiB the team's template versions may store (disk image and snapshot of each). */
  maxTemplateGb?: number;
  /** Limits (snake_case names, as the server spells them) back to the server's default. */
  clear?: string[];
}

export class Teams extends Namespace {

  async getQuota(team: string): Promise<QuotaInfo> {
    return camelize(await this.http.json({ method: "GET", path: `/v1/teams/${pathSegment(team)}/quota` })) as QuotaInfo;
  }

  /** Set the given limits of `team` (the others keep theirs); those in `clear` go back to the default. */
  async setQuota(team: string, options: QuotaOptions = {}): Promise<QuotaInfo> {
    const { clear = [], ...limits } = options;
    const unknown = clear.filter((c) => !QUOTA_LIMITS.includes(c));
    if (unknown.length) throw invalid(`clear: unknown limits ${unknown.join(", ")} (limits: ${QUOTA_LIMITS.join(", ")})`);
    const body: Record<string, unknown> = snakeify(limits);
    for (const name of clear) body[name] = null;
    return camelize(await this.http.json({ method: "PUT", path: `/v1/teams/${pathSegment(team)}/quota`, json: body })) as QuotaInfo;
  }
}

export type TimeArg = number | Date | string;
export type UsageGroupBy = "sandbox" | "day" | "template";

function timeParam(value: TimeArg | undefined): string | undefined {
  if (value === undefined) return undefined;
  if (value instanceof Date) return value.toISOString();
  return String(value);
}

export class Client {
  readonly apiUrl: string;
  readonly sandboxes: Sandboxes;
  readonly snapshots: Snapshots;
  readonly templates: Templates;
  readonly volumes: Volumes;
  readonly keys: Keys;
  readonly hosts: Hosts;
  readonly teams: Teams;
  readonly events: Events;
  readonly webhooks: Webhooks;
  readonly registries: Registries;
  private readonly http: Http;

  /** `apiUrl`/`apiKey` override the environment and config file; `fetch` replaces the global. */
  constructor(options: ConnectionOptions = {}) {
    const fetchImpl = options.fetch ?? globalThis.fetch;
    this.http = new Http(resolveConfig(options), fetchImpl.bind(globalThis));
    this.apiUrl = this.http.config.apiUrl;
    this.sandboxes = new Sandboxes(this.http);
    this.snapshots = new Snapshots(this.http);
    this.templates = new Templates(this.http);
    this.volumes = new Volumes(this.http);
    this.keys = new Keys(this.http);
    this.hosts = new Hosts(this.http);
    this.teams = new Teams(this.http);
    this.events = new Events(this.http);
    this.webhooks = new Webhooks(this.http);
    this.registries = new Registries(this.http);
  }

  /** What this key's team held in [start, end) and what it cost, per sandbox, day or
   * template (default: this month so far). An admin key sees every team, or `team`. */
  async usage(options: { start?: TimeArg; end?: TimeArg; groupBy?: UsageGroupBy; team?: string } = {}): Promise<UsageReport> {
    const groupBy = options.groupBy ?? "sandbox";
    if (!["sandbox", "day", "template"].includes(groupBy)) throw invalid("groupBy: one of sandbox, day, template");
    return camelize(await this.http.json({ method: "GET", path: "/v1/usage", query: {
      start: timeParam(options.start), end: timeParam(options.end), group_by: groupBy, team: options.team } })) as UsageReport;
  }

  /** Nothing to release (fetch keeps no pool of its own); kept for the Python shape. */
  async close(): Promise<void> {}
}
