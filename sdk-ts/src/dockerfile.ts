/**
 * The Dockerfile subset of pandastack templates, read into a template spec: a port of
 * src/pandastack/templatespec/dockerfile.py (tests/sdk/test_ts_parity.py feeds both the same
 * Dockerfiles and compares the specs). Supported: `FROM <base> [AS <name>]` (several: a
 * multi-stage build, `COPY --from=<name|index|image>`); `ARG` (values from `buildArgs`);
 * `RUN` (shell or JSON form); `ENV` (`k=v ...` and `k v`); `WORKDIR`; `USER <user>[:<group>]`; `CMD` / `ENTRYPOINT`
 * (the template's start command); `# pandastack: ready port 8000` / `ready-timeout 60` /
 * `start image` (a FROM image's Entrypoint and Cmd) directives; `COPY` / `ADD <src>... <dst>` (sources from the build context directory, globs
 * allowed; `ADD` only for plain local files: src/copy.ts reads them); `EXPOSE <port>[/<protocol>]...` (ranges too,
 * the last stage's: the spec's `exposed_ports`). `LABEL`, `MAINTAINER` are ignored. Steps are checked as Python's
 * models check them (src/template.ts).
 */
import { CopyBudget, copyStep, globPaths, joinPure, purePath } from "./copy.js";
import { invalid } from "./errors.js";
import { MAX_EXPOSED_PORTS, exposePorts, unique } from "./ports.js";
import { ArgScope, pruneStages } from "./stages.js";
import { type StageSpec, type TemplateStep, DEFAULT_READY_TIMEOUT_SECONDS, MAX_TEMPLATE_STAGES, checkedSpec, checkedStage,
  copyFromStep, envStep, pyRepr, readyCheck, runStep, userStep, workdirStep } from "./template.js";
import type { TemplateSpec } from "./types.js";

const IGNORED = new Set(["LABEL", "MAINTAINER"]);
const UNSUPPORTED = new Set(["SHELL", "HEALTHCHECK", "VOLUME", "STOPSIGNAL", "ONBUILD"]);
const ARCHIVES = [".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst"];
const DIRECTIVE = /^#\s*pandastack\s*:\s*(.*)$/i;
const PARSER_DIRECTIVE = /^#\s*([a-zA-Z]+)\s*=\s*(.*?)\s*$/;
const INSTRUCTION = /^\s*([A-Za-z]+)(?:\s+([\s\S]*))?$/;
const HEREDOC = /^<<-?\s*["']?[A-Za-z_]/;

/** Python's str.split() with no argument: runs of whitespace, none at the ends. */
function words(text: string, max = Infinity): string[] {
  const out: string[] = [];
  let rest = text.replace(/^\s+/, "");
  while (rest && out.length < max - 1) {
    const m = /^(\S+)\s*/.exec(rest)!;
    out.push(m[1]!);
    rest = rest.slice(m[0].length);
  }
  if (rest) out.push(max === Infinity ? rest.trimEnd() : rest);
  return out.filter((w) => w !== "");
}

/** POSIX shell-like splitting (Python's shlex.split). */
export function shlexSplit(text: string): string[] {
  const out: string[] = [];
  let word: string | undefined;
  for (let i = 0; i < text.length; i++) {
    const c = text[i]!;
    if (/\s/.test(c)) {
      if (word !== undefined) out.push(word);
      word = undefined;
    } else if (c === "'") {
      const end = text.indexOf("'", i + 1);
      if (end < 0) throw new Error("No closing quotation");
      word = (word ?? "") + text.slice(i + 1, end);
      i = end;
    } else if (c === '"') {
      let j = i + 1;
      let part = "";
      for (; j < text.length && text[j] !== '"'; j++) {
        if (text[j] === "\\" && j + 1 < text.length && '\\"$`\n'.includes(text[j + 1]!)) j++;
        part += text[j];
      }
      if (j >= text.length) throw new Error("No closing quotation");
      word = (word ?? "") + part;
      i = j;
    } else if (c === "\\") {
      if (i + 1 >= text.length) throw new Error("No escaped character");
      word = (word ?? "") + text[++i];
    } else {
      word = (word ?? "") + c;
    }
  }
  if (word !== undefined) out.push(word);
  return out;
}

/** Python's shlex.join. */
export function shlexJoin(argv: string[]): string {
  return argv.map((a) => a === "" ? "''" : /^[\w@%+=:,./-]+$/.test(a) ? a : `'${a.replace(/'/g, `'"'"'`)}'`).join(" ");
}

function jsonList(args: string): string[] | undefined {
  if (!args.startsWith("[")) return undefined;
  try {
    const value: unknown = JSON.parse(args);
    return Array.isArray(value) && value.every((v) => typeof v === "string") ? value as string[] : undefined;
  } catch {
    return undefined;
  }
}

/** Python's `_json_list(args) or fallback`: an empty list is not the exec form either. */
function jsonOr<T>(args: string, fallback: T): string[] | T {
  const list = jsonList(args);
  return list !== undefined && list.length ? list : fallback;
}

class Parser {
  readonly context: string | undefined;
  readonly budget = new CopyBudget();
  fromTemplate: string | undefined;
  steps: TemplateStep[] = [];
  stages: StageSpec[] = []; // the earlier stages, finished
  stageNames = new Map<string, number>();
  stageName: string | undefined;
  readonly args: ArgScope;
  cmd: string | string[] | undefined;
  entrypoint: string | string[] | undefined;
  ready: [string, string] | undefined;
  readyTimeout = DEFAULT_READY_TIMEOUT_SECONDS;
  startImage = false;
  exposed: string[] = [];

  constructor(contextDir: string | undefined, buildArgs: Record<string, string>) {
    this.args = new ArgScope(buildArgs);
    // Path.absolute(): made absolute, not resolved (`..` stays, symlinks are not followed).
    this.context = contextDir === undefined ? undefined
      : contextDir.startsWith("/") ? purePath(contextDir) : joinPure(process.cwd(), contextDir);
  }

  directive(lineno: number, text: string): void {
    const w = words(text, 3);
    const bad = (why: string) => invalid(`Dockerfile line ${lineno}: bad pandastack directive: ${why}`);
    if (w.length === 3 && w[0]!.toLowerCase() === "ready") {
      if (!["port", "file", "command"].includes(w[1]!)) throw bad(`unknown ready check ${pyRepr(w[1]!)}`);
      this.ready = [w[1]!, w[2]!.trim()];
      try {
        readyCheck(w[1] as "port", this.ready[1], DEFAULT_READY_TIMEOUT_SECONDS);
      } catch (err) {
        throw bad((err as Error).message);
      }
    } else if (w.length === 2 && w[0]!.toLowerCase() === "start" && w[1]!.toLowerCase() === "image") {
      this.startImage = true;
    } else if (w.length === 2 && w[0]!.toLowerCase() === "ready-timeout") {
      const seconds = Number(w[1]);
      if (Number.isNaN(seconds) || !w[1]!.trim()) throw bad(`could not convert string to float: ${pyRepr(w[1]!)}`);
      try {
        readyCheck("file", "-", seconds);
      } catch (err) {
        throw bad((err as Error).message);
      }
      this.readyTimeout = seconds;
    } else {
      throw bad("expected 'ready port|file|command <value>', 'ready-timeout <seconds>' or 'start image'");
    }
  }

  instruction(line: string): void {
    const m = INSTRUCTION.exec(line);
    if (m === null) throw new Error(`cannot parse ${JSON.stringify(line.trim().slice(0, 80))}`);
    const name = m[1]!.toUpperCase();
    const args = (m[2] ?? "").trim();
    if (name === "FROM") return this.from(args);
    if (name === "ARG") return this.arg(args);
    if (this.fromTemplate === undefined) throw new Error("the first instruction must be FROM <template> (or ARG)");
    if (IGNORED.has(name)) return;
    if (UNSUPPORTED.has(name)) throw new Error(`${name} is not supported`);
    const handlers: Record<string, (a: string) => void> = {
      RUN: (a) => this.run(a), COPY: (a) => this.copy(a, "COPY"), ADD: (a) => this.add(a),
      ENV: (a) => this.env(a), WORKDIR: (a) => this.steps.push(workdirStep(this.args.substitute(a))),
      USER: (a) => this.user(a), CMD: (a) => { this.cmd = jsonOr(a, a); },
      ENTRYPOINT: (a) => { this.entrypoint = jsonOr(a, a); }, EXPOSE: (a) => this.expose(a),
    };
    const handler = handlers[name];
    if (handler === undefined) throw new Error(`unknown instruction ${name}`);
    if (!args) throw new Error(`${name} needs arguments`);
    handler(args);
  }

  private from(args: string): void {
    const w = words(args);
    if (w[0]?.startsWith("--")) throw new Error(`FROM flags are not supported: ${w[0]}`);
    let name: string | undefined;
    if (w.length === 3 && w[1]!.toLowerCase() === "as") name = w[2]!.toLowerCase();
    else if (w.length !== 1) throw new Error("FROM takes a template name or image reference, and AS <name>");
    const base = this.args.substitute(w[0]!, true);
    if (!base) throw new Error(`FROM ${w[0]}: empty after ARG substitution`);
    if (this.fromTemplate !== undefined) this.endStage();
    if (this.stageNames.has(base.toLowerCase())) {
      throw new Error(`FROM an earlier stage (${base}) is not supported; COPY --from=${base} what you need`);
    }
    if (name !== undefined && (this.stageNames.has(name) || /^[0-9]+$/.test(name))) {
      throw new Error(`stage name ${pyRepr(name)} is used twice or is a number`);
    }
    if (this.stages.length + 1 > MAX_TEMPLATE_STAGES) throw new Error(`more than ${MAX_TEMPLATE_STAGES} stages`);
    this.fromTemplate = base;
    this.stageName = name;
    this.args.newStage();
  }

  private endStage(): void {
    this.stages.push(checkedStage(this.stageName, this.fromTemplate!, this.steps));
    if (this.stageName !== undefined) this.stageNames.set(this.stageName, this.stages.length - 1);
    this.steps = [];
    // A stage's CMD, ENTRYPOINT and EXPOSE are its image's; only the last stage's count.
    this.cmd = this.entrypoint = undefined;
    this.exposed = [];
  }

  private arg(args: string): void {
    if (args.startsWith("--")) throw new Error(`ARG flags are not supported: ${words(args)[0]}`);
    let parts: string[];
    try {
      parts = shlexSplit(args);
    } catch (err) {
      throw new Error(`ARG: ${(err as Error).message}`);
    }
    if (!parts.length) throw new Error("ARG needs a name");
    for (const word of parts) this.args.declare(word, this.fromTemplate === undefined);
  }

  private run(args: string): void {
    if (args.startsWith("--")) throw new Error(`RUN flags are not supported: ${words(args)[0]}`);
    if (HEREDOC.test(args)) throw new Error("heredocs are not supported");
    this.steps.push(runStep(this.args.runEnv(jsonOr(args, args))));
  }

  private copyFrom(source: string, tokens: string[]): void {
    if (tokens.length < 2) throw new Error("COPY needs a source and a destination");
    if (tokens[0]!.startsWith("--")) throw new Error(`COPY flags are not supported: ${tokens[0]}`);
    const key = this.args.substitute(source).toLowerCase();
    let stage: number;
    if (this.stageNames.has(key)) {
      stage = this.stageNames.get(key)!;
    } else if (/^[0-9]+$/.test(key)) {
      stage = Number(key);
      if (stage >= this.stages.length) throw new Error(`COPY --from=${source}: there is no earlier stage ${stage}`);
    } else { // an image or template of its own: a stage without steps
      if (this.stages.length + 2 > MAX_TEMPLATE_STAGES) {
        throw new Error(`more than ${MAX_TEMPLATE_STAGES} stages (COPY --from an image is one)`);
      }
      this.stages.push(checkedStage(undefined, this.args.substitute(source), []));
      stage = this.stages.length - 1;
    }
    const subst = tokens.map((t) => this.args.substitute(t));
    this.steps.push(copyFromStep(stage, subst.slice(0, -1), subst[subst.length - 1]!));
  }

  private copy(args: string, instruction: string): void {
    let tokens = jsonOr(args, words(args));
    if (instruction === "COPY" && tokens[0]!.startsWith("--from=")) {
      return this.copyFrom(tokens[0]!.slice("--from=".length), tokens.slice(1));
    }
    tokens = tokens.map((t) => this.args.substitute(t));
    if (tokens[0]!.startsWith("--")) throw new Error(`${instruction} flags are not supported: ${tokens[0]}`);
    if (tokens.length < 2) throw new Error(`${instruction} needs a source and a destination`);
    if (this.context === undefined) throw new Error(`${instruction} needs a build context directory`);
    const sources = tokens.slice(0, -1);
    const dst = tokens[tokens.length - 1]!;
    const paths: string[] = [];
    for (const src of sources) {
      if (src.includes("://")) throw new Error(`${instruction} from a URL is not supported: ${src}`);
      const rel = src.replace(/^\/+/, "") || ".";
      if (/[*?[]/.test(rel)) {
        const matches = globPaths(this.context, rel);
        if (!matches.length) throw new Error(`no file in the build context matches ${src}`);
        paths.push(...matches);
      } else {
        paths.push(joinPure(this.context, rel));
      }
    }
    this.steps.push(copyStep(paths, dst, { root: this.context, budget: this.budget }));
  }

  private add(args: string): void {
    const tokens = jsonOr(args, words(args));
    for (const raw of tokens.slice(0, -1)) {
      const src = this.args.substitute(raw);
      if (src.includes("://")) throw new Error(`ADD from a URL is not supported: ${src}`);
      if (ARCHIVES.some((ext) => src.toLowerCase().endsWith(ext))) {
        throw new Error("ADD of an archive (which Docker unpacks) is not supported; COPY it and RUN tar");
      }
    }
    this.copy(args, "ADD");
  }

  private env(args: string): void {
    const values: Record<string, string> = {};
    if (words(args)[0]!.includes("=")) {
      let parts: string[];
      try {
        // shlex would turn `\$` into `$`; keep it escaped for the build's expansion.
        parts = shlexSplit(args.replace(/\\\$/g, "\\\\$"));
      } catch (err) {
        throw new Error(`ENV: ${(err as Error).message}`);
      }
      for (const word of parts) {
        const eq = word.indexOf("=");
        if (eq < 0) throw new Error(`ENV: expected NAME=VALUE, got ${pyRepr(word)}`);
        values[word.slice(0, eq)] = this.args.substitute(word.slice(eq + 1));
      }
    } else {
      const parts = words(args, 2);
      if (parts.length !== 2) throw new Error("ENV: expected NAME VALUE or NAME=VALUE ...");
      values[parts[0]!] = this.args.substitute(parts[1]!);
    }
    this.args.shadow(values);
    this.steps.push(envStep(values));
  }

  private user(raw: string): void {
    this.steps.push(userStep(this.args.substitute(raw)));
  }

  private expose(args: string): void {
    for (const word of words(args)) {
      const value = this.args.substitute(word);
      try {
        this.exposed = unique([...this.exposed, ...exposePorts(value)]);
      } catch (err) {
        // The ENV of earlier steps may expand against the guest's, so only ARGs here.
        const hint = value.includes("$") ? " (ARGs are substituted in EXPOSE, ENV values are not)" : "";
        throw new Error(`EXPOSE ${(err as Error).message}${hint}`);
      }
    }
    if (this.exposed.length > MAX_EXPOSED_PORTS) throw new Error(`EXPOSE: more than ${MAX_EXPOSED_PORTS} ports in all`);
  }

  private start(): string | undefined {
    let entry = this.entrypoint;
    const cmd = this.cmd;
    if (entry === undefined) return Array.isArray(cmd) ? shlexJoin(cmd) : cmd;
    if (typeof entry === "string") return entry; // shell form ENTRYPOINT ignores CMD, as in Docker
    if (typeof cmd === "string") entry = [...entry, "/bin/sh", "-c", cmd];
    else if (cmd !== undefined) entry = [...entry, ...cmd];
    return shlexJoin(entry);
  }

  finish(): TemplateSpec {
    if (this.fromTemplate === undefined) throw invalid("Dockerfile has no FROM");
    try {
      const ready = this.ready === undefined ? undefined
        : readyCheck(this.ready[0] as "port", this.ready[1], this.readyTimeout);
      const [stages, steps] = pruneStages(this.stages, this.steps);
      return checkedSpec(this.fromTemplate, steps, this.start() || undefined, ready, stages, this.startImage,
        this.exposed);
    } catch (err) {
      throw invalid(`Dockerfile: ${(err as Error).message}`);
    }
  }
}

/** Lines of text as Python's str.splitlines() cuts them. */
function splitlines(text: string): string[] {
  const lines = text.split(/\r\n|[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]/);
  if (lines.length && lines[lines.length - 1] === "") lines.pop();
  return lines;
}

/** Read the Dockerfile subset into a template spec (`InvalidRequestError` naming the line);
 * `contextDir` is where COPY sources are read from, `buildArgs` the values of its ARGs
 * (`docker build --build-arg`; names it does not declare are ignored). */
export function fromDockerfile(text: string, contextDir?: string, buildArgs: Record<string, string> = {}): TemplateSpec {
  const parser = new Parser(contextDir, buildArgs);
  let parts: string[] = [];
  let start = 0;
  let leading = true; // parser directives (`# escape=`) are only valid before anything else
  const run = (lineno: number, line: string) => {
    try {
      parser.instruction(line);
    } catch (err) {
      throw invalid(`Dockerfile line ${lineno}: ${(err as Error).message}`);
    }
  };
  splitlines(text).forEach((raw, index) => {
    const lineno = index + 1;
    if (raw.includes("\0")) throw invalid(`Dockerfile line ${lineno}: NUL byte`);
    const stripped = raw.trim();
    if (stripped.startsWith("#")) {
      const m = PARSER_DIRECTIVE.exec(stripped);
      if (leading && m && m[1]!.toLowerCase() === "escape" && m[2] !== "\\") {
        throw invalid(`Dockerfile line ${lineno}: only the default escape character (backslash) is supported`);
      }
      const found = DIRECTIVE.exec(stripped);
      if (found) parser.directive(lineno, found[1]!);
      return;
    }
    leading = false;
    if (!stripped) return;
    if (!parts.length) start = lineno;
    const body = raw.trimEnd();
    if (body.endsWith("\\")) {
      parts.push(body.slice(0, -1));
      return;
    }
    parts.push(raw);
    run(start, parts.join(""));
    parts = [];
  });
  if (parts.length) run(start, parts.join(""));
  return parser.finish();
}
