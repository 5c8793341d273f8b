/**
 * The fluent builder of a template spec, the twin of the Python SDK's `Template`
 * (src/pandastack/templatespec/builder.py), and the checks of templatespec/models.py that a
 * step gets where it is written: a bad package name fails at `pipInstall(...)`, not on the
 * server. The messages are Python's.
 *
 *     const spec = new Template("base")
 *       .pipInstall("requests==2.32.3")
 *       .copy("./app", "/srv/app/")
 *       .workdir("/srv/app")
 *       .start("python -m http.server 8000", waitForPort(8000))
 *       .toSpec();
 *
 * `copy` reads the local files when it is called (src/copy.ts); the spec stays in the wire's
 * spelling (`from_template`, `timeout_seconds`), as a spec passed to `templates.build` does.
 */
import { CopyBudget, MAX_COPY_BYTES, MAX_COPY_FILES, copyStep } from "./copy.js";
import { invalid } from "./errors.js";
import type { components } from "./generated/openapi.js";
import { MAX_EXPOSED_PORTS, exposePorts, exposedPort, unique } from "./ports.js";
import type { TemplateSpec } from "./types.js";

export type ReadyCheck = components["schemas"]["ReadyCheck"];
export type TemplateStep = NonNullable<TemplateSpec["steps"]>[number];
export type StageSpec = components["schemas"]["StageSpec"];

export const MAX_STEPS = 64;
/** Most stages of a multi-stage build, the last included (rules.py's MAX_TEMPLATE_STAGES). */
export const MAX_TEMPLATE_STAGES = 8;
const MAX_PACKAGES = 256;
const MAX_COMMAND_CHARS = 64 * 1024;
const MAX_PATH_CHARS = 4096;
const MAX_ENV_ITEMS = 256;
const MAX_READY_TIMEOUT_SECONDS = 3600;
export const DEFAULT_READY_TIMEOUT_SECONDS = 120;

const PACKAGE_RE = {
  apt: /^[a-z0-9][a-z0-9+.-]*(:[a-z0-9]+)?(=[A-Za-z0-9.+~:-]+)?$/,
  pip: new RegExp("^(?:[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?(?:\\[[A-Za-z0-9._,-]+\\])?" +
    "(?:(?:===|==|!=|~=|<=|>=|<|>)[A-Za-z0-9.*+!_-]+" +
    "(?:,(?:===|==|!=|~=|<=|>=|<|>)[A-Za-z0-9.*+!_-]+)*)?" +
    "|/[A-Za-z0-9._+/-]+)$"),
  npm: /^(?:@[a-z0-9][a-z0-9._-]*\/)?[a-z0-9][a-z0-9._-]*(?:@[A-Za-z0-9.^~<>=*|+_-]+)?$/,
};
const ENV_NAME_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;
const USER_NAME_RE = /^[a-z_][a-z0-9_-]{0,31}$/;
// A uid or gid: decimal without leading zeros, at most MAX_ID (as templatespec/models.py).
const ID_RE = /^(?:0|[1-9][0-9]{0,9})$/;
const MAX_ID = 2 ** 31 - 2;
const MAX_USER_CHARS = 64;
// A template name, snapshot:<id>, or an OCI image reference (as templatespec/models.py).
const FROM_RE = /^(?:snapshot:[A-Za-z0-9._-]{1,64}|[A-Za-z0-9][A-Za-z0-9._-]{0,127}|[A-Za-z0-9[][A-Za-z0-9._:/@[\]-]{0,127})$/;

/** Python's repr() of a str, for messages that quote a value the way Python's do. */
export function pyRepr(value: string): string {
  const quote = value.includes("'") && !value.includes('"') ? '"' : "'";
  const body = value.replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/\r/g, "\\r").replace(/\t/g, "\\t");
  return quote + (quote === "'" ? body.replace(/'/g, "\\'") : body) + quote;
}

// Where Python's limits are pydantic field constraints, these are pydantic's messages.
const tooMany = (kind: "List" | "Dictionary", max: number, n: number) =>
  invalid(`${kind} should have at most ${max} items after validation, not ${n}`);
const stringLength = (value: string, min: number, max: number) => {
  if (value.length < min) throw invalid(`String should have at least ${min} character${min === 1 ? "" : "s"}`);
  if (value.length > max) throw invalid(`String should have at most ${max} characters`);
};

function noNul(value: string, what: string): string {
  if (value.includes("\0")) throw invalid(`${what} must not contain NUL bytes`);
  return value;
}

function guestPath(value: string, what: string): string {
  noNul(value, what);
  if (!value || value.length > MAX_PATH_CHARS) throw invalid(`${what} must be 1 to ${MAX_PATH_CHARS} characters`);
  return value;
}

export function packagesStep(kind: "apt" | "pip" | "npm", packages: string[]): TemplateStep {
  if (!packages.length) throw invalid(`${kind} needs at least one package`);
  if (packages.length > MAX_PACKAGES) throw tooMany("List", MAX_PACKAGES, packages.length);
  for (const name of packages) {
    if (!PACKAGE_RE[kind].test(name) || name.length > 256) throw invalid(`invalid ${kind} package name ${pyRepr(name)}`);
  }
  return { kind, packages: [...packages] };
}

export function runStep(command: string | string[]): TemplateStep {
  const parts = typeof command === "string" ? [command] : command;
  if (!parts.length || !parts[0]!.trim()) throw invalid("run needs a non-empty command");
  if (parts.reduce((n, p) => n + p.length, 0) > MAX_COMMAND_CHARS) {
    throw invalid(`run command is longer than ${MAX_COMMAND_CHARS} characters`);
  }
  for (const part of parts) noNul(part, "run command");
  return { kind: "run", command: typeof command === "string" ? command : [...command] };
}

/** `COPY --from=<stage>` (templatespec/models.py's CopyFromStep). */
export function copyFromStep(stage: number, sources: string[], dst: string): TemplateStep {
  if (!sources.length) throw invalid("List should have at least 1 item after validation, not 0");
  if (sources.length > MAX_PACKAGES) throw tooMany("List", MAX_PACKAGES, sources.length);
  for (const src of sources) {
    guestPath(src, "copy --from source");
    if (/[*?[]/.test(src)) throw invalid(`copy --from source ${pyRepr(src)}: wildcards are not supported`);
  }
  guestPath(dst, "copy dst");
  if (sources.length > 1 && !dst.endsWith("/")) {
    throw invalid(`copying several sources needs a destination ending with '/': ${dst}`);
  }
  return { kind: "copy_from", stage, sources: [...sources], dst };
}

function checkedBase(fromTemplate: string): void {
  stringLength(fromTemplate, 0, 128);
  if (!FROM_RE.test(fromTemplate)) {
    throw invalid(`invalid base template ${pyRepr(fromTemplate)}: a template name, snapshot:<id> or an image reference`);
  }
}

/** An earlier stage's own checks (StageSpec in models.py). */
export function checkedStage(name: string | undefined, fromTemplate: string, steps: TemplateStep[]): StageSpec {
  checkedBase(fromTemplate);
  if (steps.length > MAX_STEPS) throw tooMany("List", MAX_STEPS, steps.length);
  return { name: name ?? null, from_template: fromTemplate, steps };
}

export function envStep(values: Record<string, string>): TemplateStep {
  const names = Object.keys(values);
  if (!names.length) throw invalid("Dictionary should have at least 1 item after validation, not 0");
  if (names.length > MAX_ENV_ITEMS) throw tooMany("Dictionary", MAX_ENV_ITEMS, names.length);
  for (const name of names) {
    if (!ENV_NAME_RE.test(name) || name.length > 256) throw invalid(`invalid environment variable name ${pyRepr(name)}`);
    noNul(values[name]!, `value of ${name}`);
    if (values[name]!.length > MAX_COMMAND_CHARS) throw invalid(`value of ${name} is too long`);
  }
  return { kind: "env", env: { ...values } };
}

export function workdirStep(path: string): TemplateStep {
  return { kind: "workdir", path: guestPath(path, "workdir") };
}

const userPart = (part: string) => USER_NAME_RE.test(part) || (ID_RE.test(part) && Number(part) <= MAX_ID);

/** Docker's USER forms: `name`, `uid`, `name:group`, `uid:gid`, `name:gid`, `uid:group`. */
export function userStep(name: string): TemplateStep {
  const parts = name.split(":");
  if (name.length > MAX_USER_CHARS || parts.length > 2 || !parts.every(userPart)) {
    throw invalid(`invalid user ${pyRepr(name)}: a user name or uid (0 to ${MAX_ID}), optionally :group name or :gid`);
  }
  return { kind: "user", name };
}

export function readyCheck(kind: ReadyCheck["kind"], value: string, timeoutSeconds: number): ReadyCheck {
  stringLength(value, 1, MAX_COMMAND_CHARS);
  if (!(timeoutSeconds > 0)) throw invalid("Input should be greater than 0");
  if (!(timeoutSeconds <= MAX_READY_TIMEOUT_SECONDS)) {
    throw invalid(`Input should be less than or equal to ${MAX_READY_TIMEOUT_SECONDS}`);
  }
  noNul(value, "ready value");
  if (kind === "port" && !(/^[0-9]+$/.test(value) && Number(value) >= 1 && Number(value) <= 65535)) {
    throw invalid(`ready port must be 1-65535, not ${pyRepr(value)}`);
  }
  return { kind, value, timeout_seconds: timeoutSeconds };
}

/** The spec's own checks (TemplateSpec in models.py): its base, its start command, and the
 * copied files of all its steps together. */
export function checkedSpec(fromTemplate: string, steps: TemplateStep[], start: string | undefined,
  ready: ReadyCheck | undefined, stages: StageSpec[] = [], startFromImage = false,
  exposedPorts: string[] = []): TemplateSpec {
  checkedBase(fromTemplate);
  if (steps.length > MAX_STEPS) throw tooMany("List", MAX_STEPS, steps.length);
  if (stages.length > MAX_TEMPLATE_STAGES - 1) throw tooMany("List", MAX_TEMPLATE_STAGES - 1, stages.length);
  if (exposedPorts.length > MAX_EXPOSED_PORTS) throw tooMany("List", MAX_EXPOSED_PORTS, exposedPorts.length);
  let ports: string[];
  try {
    ports = unique(exposedPorts.map(exposedPort));
  } catch (err) {
    throw invalid((err as Error).message);
  }
  if (start !== undefined) {
    stringLength(start, 1, MAX_COMMAND_CHARS);
    noNul(start, "start command");
  }
  if (startFromImage) {
    if (start !== undefined) throw invalid("a start command or the image's (start from image), not both");
    // templatespec/base.py: a name with `:`, `@` or `/` is an image, snapshot:<id> is ours.
    if (fromTemplate.startsWith("snapshot:") || !/[:@/]/.test(fromTemplate)) {
      throw invalid(`start from image needs FROM an image, not the template ${pyRepr(fromTemplate)}`);
    }
  }
  if (ready !== undefined && start === undefined && !startFromImage) throw invalid("a ready check needs a start command");
  const every = [...stages.map((stage) => stage.steps ?? []), steps];
  every.forEach((items, index) => {
    for (const s of items) {
      if (s.kind === "copy_from" && s.stage >= index) {
        throw invalid(`copy --from stage ${s.stage}: a stage copies only from an earlier one`);
      }
    }
  });
  const files = every.flat().flatMap((s) => s.kind === "copy" ? s.files : []);
  if (files.length > MAX_COPY_FILES) throw invalid(`more than ${MAX_COPY_FILES} copied files`);
  const size = files.reduce((n, f) => n + Buffer.byteLength(f.content_b64, "base64"), 0);
  if (size > MAX_COPY_BYTES) throw invalid(`copied files exceed ${MAX_COPY_BYTES / 2 ** 20} MiB together`);
  const spec: TemplateSpec = { from_template: fromTemplate, steps };
  if (start !== undefined) spec.start = start;
  if (ready !== undefined) spec.ready = ready;
  if (stages.length) spec.stages = stages;
  if (startFromImage) spec.start_from_image = true;
  if (ports.length) spec.exposed_ports = ports;
  return spec;
}

/** Ready once something accepts TCP connections on 127.0.0.1:`port` in the guest. */
export function waitForPort(port: number, timeoutSeconds: number = DEFAULT_READY_TIMEOUT_SECONDS): ReadyCheck {
  return readyCheck("port", String(port), timeoutSeconds);
}

/** Ready once `path` exists in the guest (relative: to the working directory). */
export function waitForFile(path: string, timeoutSeconds: number = DEFAULT_READY_TIMEOUT_SECONDS): ReadyCheck {
  return readyCheck("file", path, timeoutSeconds);
}

/** Ready once `command` (run with `sh -c`, as the template's user) exits 0. */
export function waitForCommand(command: string, timeoutSeconds: number = DEFAULT_READY_TIMEOUT_SECONDS): ReadyCheck {
  return readyCheck("command", command, timeoutSeconds);
}

/** Builds a template spec step by step; every method returns the builder. */
export class Template {
  readonly #from: string;
  readonly #steps: TemplateStep[] = [];
  #start: string | undefined;
  #startFromImage = false;
  #ready: ReadyCheck | undefined;
  readonly #exposed: string[] = [];
  readonly #budget = new CopyBudget();

  constructor(fromTemplate: string = "base") {
    this.#from = fromTemplate;
  }

  #add(step: TemplateStep): this {
    this.#steps.push(step);
    return this;
  }

  aptInstall(...packages: string[]): this {
    return this.#add(packagesStep("apt", packages));
  }

  pipInstall(...packages: string[]): this {
    return this.#add(packagesStep("pip", packages));
  }

  npmInstall(...packages: string[]): this {
    return this.#add(packagesStep("npm", packages));
  }

  /** A shell command (`sh -c`), or an argv list (run without a shell). */
  run(command: string | string[]): this {
    return this.#add(runStep(command));
  }

  /** Copy a local file or directory (its contents) to `dst` in the guest, read now. */
  copy(src: string, dst: string): this {
    return this.#add(copyStep([src], dst, { budget: this.#budget }));
  }

  env(values: Record<string, string>): this {
    return this.#add(envStep(values));
  }

  workdir(path: string): this {
    return this.#add(workdirStep(path));
  }

  /** Who later steps and the start command run as: `name`, `uid`, `name:group`, `uid:gid`
   * (and the mixed forms), as a Dockerfile's USER. */
  user(name: string): this {
    return this.#add(userStep(name));
  }

  /** The command started (in the background) at the end of the build, before the template
   * is saved: every sandbox made from the template has it running already. */
  start(command: string, ready?: ReadyCheck): this {
    this.#start = command;
    this.#ready = ready;
    this.#startFromImage = false;
    return this;
  }

  /** Like `start`, with the image's own Entrypoint and Cmd (a template FROM an image). */
  startImage(ready?: ReadyCheck): this {
    this.#start = undefined;
    this.#ready = ready;
    this.#startFromImage = true;
    return this;
  }

  /** Ports the template declares, as a Dockerfile's EXPOSE does (8080, "53/udp",
   * "8000-8010"): listed in its info with its image's, published by nothing. */
  expose(...ports: (number | string)[]): this {
    for (const port of ports) {
      try {
        this.#exposed.push(...exposePorts(port));
      } catch (err) {
        throw invalid((err as Error).message);
      }
    }
    return this;
  }

  toSpec(): TemplateSpec {
    return checkedSpec(this.#from, [...this.#steps], this.#start, this.#ready, [], this.#startFromImage,
      unique(this.#exposed));
  }
}
