/**
 * ARG scopes and multi-stage helpers of the Dockerfile reader: a port of
 * src/pandastack/templatespec/stages.py (tests/sdk/test_ts_parity.py compares the specs).
 */
import { type StageSpec, type TemplateStep, pyRepr } from "./template.js";

const ENV_NAME_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;
const ARG_REF = /\\\$|\$(?:([A-Za-z_][A-Za-z0-9_]*)|\{([A-Za-z_][A-Za-z0-9_]*)(?::([-+])([^}]*))?\})/g;

/** ARG values as Docker scopes them: those before the first FROM serve FROM lines only; a
 * stage sees the ones it declares (a bare `ARG NAME` takes the global default). A build arg
 * overrides a default; an ENV of the same name hides the ARG for the rest of the stage. */
export class ArgScope {
  readonly buildArgs: Map<string, string>;
  globals = new Map<string, string | undefined>();
  stage = new Map<string, string | undefined>();
  shadowed = new Set<string>();

  constructor(buildArgs: Record<string, string>) {
    this.buildArgs = new Map(Object.entries(buildArgs));
  }

  newStage(): void {
    this.stage = new Map();
    this.shadowed = new Set();
  }

  declare(word: string, globalScope: boolean): void {
    const eq = word.indexOf("=");
    const name = eq < 0 ? word : word.slice(0, eq);
    if (!ENV_NAME_RE.test(name) || name.length > 256) throw new Error(`ARG: invalid name ${pyRepr(name)}`);
    let value: string | undefined;
    if (this.buildArgs.has(name)) value = this.buildArgs.get(name);
    else if (eq >= 0) value = this.substitute(word.slice(eq + 1), globalScope);
    else value = globalScope ? undefined : this.globals.get(name);
    if ((value ?? "").includes("\0")) throw new Error(`ARG ${name}: NUL byte in its value`);
    (globalScope ? this.globals : this.stage).set(name, value);
  }

  shadow(env: Record<string, string>): void {
    for (const name of Object.keys(env)) this.shadowed.add(name);
  }

  private visible(inFrom: boolean): Map<string, string | undefined> {
    if (inFrom) return this.globals;
    return new Map([...this.stage].filter(([k]) => !this.shadowed.has(k)));
  }

  /** Declared ARGs' `$NAME`, `${NAME}`, `${NAME:-word}`, `${NAME:+word}` replaced; other
   * `$...` and `\$` left for the build's ENV expansion. */
  substitute(text: string, inFrom = false): string {
    const known = this.visible(inFrom);
    return text.replace(ARG_REF, (all: string, bare?: string, braced?: string, op?: string, word?: string) => {
      const name = bare ?? braced;
      if (name === undefined || !known.has(name)) return all;
      const current = known.get(name) ?? "";
      if (op === "-") return current || (word ?? "");
      if (op === "+") return current ? (word ?? "") : "";
      return current;
    });
  }

  /** A RUN command with the stage's set ARGs in its environment, as Docker gives them. */
  runEnv(command: string | string[]): string | string[] {
    const env = [...this.visible(false)].filter((kv): kv is [string, string] => kv[1] !== undefined);
    if (!env.length) return command;
    if (Array.isArray(command)) return ["env", ...env.map(([k, v]) => `${k}=${v}`), ...command];
    return `export ${env.map(([k, v]) => `${k}=${shellQuote(v)}`).join(" ")}; ${command}`;
  }
}

/** Python's shlex.quote. */
function shellQuote(value: string): string {
  return value === "" ? "''" : /^[\w@%+=:,./-]+$/.test(value) ? value : `'${value.replace(/'/g, `'"'"'`)}'`;
}

function refs(steps: TemplateStep[]): Set<number> {
  return new Set(steps.flatMap((s) => s.kind === "copy_from" ? [s.stage] : []));
}

/** Only the stages the last one copies from (directly or through others), renumbered. */
export function pruneStages(stages: StageSpec[], steps: TemplateStep[]): [StageSpec[], TemplateStep[]] {
  const needed = refs(steps);
  for (let index = stages.length - 1; index >= 0; index--) {
    if (needed.has(index)) for (const r of refs(stages[index]!.steps ?? [])) needed.add(r);
  }
  const order = [...needed].sort((a, b) => a - b);
  const renumber = new Map(order.map((old, i) => [old, i]));
  const moved = (items: TemplateStep[]) => items.map((s) =>
    s.kind === "copy_from" ? { ...s, stage: renumber.get(s.stage)! } : s);
  const kept = stages.flatMap((stage, index) => needed.has(index) ? [{ ...stage, steps: moved(stage.steps ?? []) }] : []);
  return [kept, moved(steps)];
}
