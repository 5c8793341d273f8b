/**
 * Reading local files into a template's copy step: a port of copy_step, CopyBudget and the
 * build context's rules in src/pandastack/templatespec/builder.py, plus the subset of
 * pathlib's Path.glob that the Dockerfile's COPY sources use. tests/sdk/test_ts_parity.py
 * gives both SDKs the same context and wants the same spec, or the same refusal.
 *
 * Paths are printed the way pathlib prints them (`.` and empty segments dropped, `..` kept),
 * so that messages name the same file in both SDKs. Files are read synchronously: the
 * builder's `copy()` returns the builder, and the files are read when it is called, as in
 * Python (later changes to them do not reach the spec).
 */
import { closeSync, openSync, readSync, readdirSync, realpathSync, statSync, type Dirent, type Stats } from "node:fs";
import { normalize, resolve } from "node:path";

import { invalid } from "./errors.js";

export const MAX_COPY_BYTES = 64 * 2 ** 20; // decoded bytes of every copied file of one spec together
export const MAX_COPY_FILES = 10_000;

export interface CopyFile { path: string; mode: number; content_b64: string }
export interface CopyStep { kind: "copy"; dst: string; files: CopyFile[] }

/** Python's str ordering (code points), which UTF-16's `<` is not past the BMP. */
export function comparePy(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a), Buffer.from(b));
}

function sortedPy(values: Iterable<string>): string[] {
  return [...values].sort(comparePy);
}

/** A path as str(PurePosixPath(p)) spells it. */
export function purePath(p: string): string {
  const parts = p.split("/").filter((s) => s !== "" && s !== ".");
  if (p.startsWith("/")) return "/" + parts.join("/");
  return parts.length ? parts.join("/") : ".";
}

/** PurePosixPath(a) / b. */
export function joinPure(a: string, b: string): string {
  return b.startsWith("/") ? purePath(b) : purePath(`${a}/${b}`);
}

/** PurePosixPath(p).name. */
function baseName(p: string): string {
  const parts = purePath(p).split("/");
  const last = parts[parts.length - 1]!;
  return last === "." ? "" : last;
}

/** os.path.normpath: `..` resolved lexically, no trailing slash. */
function normPath(p: string): string {
  const n = normalize(p);
  return n.length > 1 && n.endsWith("/") ? n.slice(0, -1) : n;
}

/** PurePath(a).is_relative_to(b), both already normalized. */
function isRelativeTo(a: string, b: string): boolean {
  if (b === ".") return !a.startsWith("/");
  if (b === "/") return a.startsWith("/");
  return a === b || a.startsWith(`${b}/`);
}

function statOrNull(p: string): Stats | undefined {
  try {
    return statSync(p);
  } catch {
    return undefined;
  }
}

/** What one spec may still copy: checked while reading, so that a huge tree fails early
 * instead of being read into memory first. */
export class CopyBudget {
  bytesLeft = MAX_COPY_BYTES;
  filesLeft = MAX_COPY_FILES;

  take(size: number, where: string): void {
    this.bytesLeft -= size;
    this.filesLeft -= 1;
    if (this.bytesLeft < 0) throw invalid(`copied files exceed ${MAX_COPY_BYTES / 2 ** 20} MiB together (at ${where})`);
    if (this.filesLeft < 0) throw invalid(`more than ${MAX_COPY_FILES} copied files (at ${where})`);
  }
}

/** Read `sources` into one copy step, with Dockerfile COPY semantics: a directory's contents
 * go under `dst`; a single file goes to `dst` itself unless `dst` ends with `/` (or is `.`);
 * several sources need a `dst` ending with `/`. With `root`, every source and every symlink
 * met must resolve inside it (a build context). */
export function copyStep(sources: string[], dst: string, options: { root?: string | undefined; budget?: CopyBudget | undefined } = {}): CopyStep {
  const budget = options.budget ?? new CopyBudget();
  const root = options.root;
  if (!sources.length) throw invalid("copy needs a source");
  const many = sources.length > 1;
  if (many && !dst.endsWith("/")) throw invalid(`copying several sources needs a destination ending with '/': ${dst}`);
  if (dst.includes("\0")) throw invalid("copy dst must not contain NUL bytes");
  if (!dst || dst.length > 4096) throw invalid("copy dst must be 1 to 4096 characters");
  const files = new Map<string, CopyFile>();
  let targetDir = dst;
  const last = dst.split("/").pop()!;
  const intoDir = many || dst.endsWith("/") || last === "." || last === "..";
  for (const source of sources) {
    const src = purePath(source);
    const real = resolveIn(src, root);
    const st = statOrNull(real);
    if (st?.isDirectory()) {
      for (const [rel, path] of walk(real, root)) files.set(rel, readFile(path, rel, budget));
    } else if (st?.isFile()) {
      if (intoDir) {
        files.set(baseName(src), readFile(real, baseName(src), budget));
      } else {
        // posixpath.split: the head keeps a root made only of slashes.
        const cut = dst.lastIndexOf("/") + 1;
        const head = /^\/*$/.test(dst.slice(0, cut)) ? dst.slice(0, cut) : dst.slice(0, cut).replace(/\/+$/, "");
        const name = dst.slice(cut);
        targetDir = head || ".";
        files.set(name, readFile(real, name, budget));
      }
    } else {
      throw invalid(`${src} is not a regular file or directory`);
    }
  }
  return { kind: "copy", dst: targetDir, files: sortedPy(files.keys()).map((k) => files.get(k)!) };
}

function resolveIn(path: string, root: string | undefined): string {
  // Lexically first: a path outside the context is refused without looking at it (its
  // existence is none of the Dockerfile's business).
  if (root !== undefined && !isRelativeTo(normPath(path), normPath(root))) {
    throw invalid(`${path} is outside the build context ${purePath(root)}`);
  }
  let real: string;
  try {
    real = realpathSync(path);
  } catch (err) {
    throw invalid(`cannot read ${path}: ${(err as Error).message}`);
  }
  if (root !== undefined) {
    let realRoot: string;
    try {
      realRoot = realpathSync(root);
    } catch {
      realRoot = resolve(root);
    }
    if (!isRelativeTo(real, realRoot)) throw invalid(`${path} is outside the build context ${purePath(root)}`);
  }
  return real;
}

/** os.walk's order (top-down, directories sorted), files as (path relative to `directory`,
 * the file to read). A directory that cannot be listed is skipped, as os.walk skips it. */
function walk(directory: string, root: string | undefined): [string, string][] {
  const found: [string, string][] = [];
  const visit = (dirpath: string, relDir: string) => {
    let entries: Dirent[];
    try {
      entries = readdirSync(dirpath, { withFileTypes: true });
    } catch {
      return;
    }
    const dirs: Dirent[] = [];
    const others: Dirent[] = [];
    for (const entry of entries) {
      const isDir = entry.isDirectory() || (entry.isSymbolicLink() && statOrNull(joinPure(dirpath, entry.name))?.isDirectory() === true);
      (isDir ? dirs : others).push(entry);
    }
    const byName = (a: Dirent, b: Dirent) => comparePy(a.name, b.name);
    dirs.sort(byName);
    others.sort(byName);
    for (const entry of dirs) {
      if (entry.isSymbolicLink()) {
        throw invalid(`${joinPure(dirpath, entry.name)}: symlinked directories are not supported in a copy`);
      }
    }
    for (const entry of others) {
      const path = joinPure(dirpath, entry.name);
      const real = entry.isSymbolicLink() ? resolveIn(path, root) : path;
      found.push([relDir ? `${relDir}/${entry.name}` : entry.name, real]);
    }
    for (const entry of dirs) visit(joinPure(dirpath, entry.name), relDir ? `${relDir}/${entry.name}` : entry.name);
  };
  visit(directory, "");
  return found;
}

function readFile(path: string, rel: string, budget: CopyBudget): CopyFile {
  let st: Stats;
  try {
    st = statSync(path);
  } catch (err) {
    throw invalid(`cannot read ${path}: ${(err as Error).message}`);
  }
  if (!st.isFile()) throw invalid(`${path} is not a regular file`);
  budget.take(st.size, path);
  // One byte more than stat said: a file that grew since stat must not slip past.
  const data = Buffer.alloc(st.size + 1);
  let got = 0;
  const fd = openSync(path, "r");
  try {
    for (let n = -1; n !== 0 && got < data.length;) {
      n = readSync(fd, data, got, data.length - got, null);
      got += n;
    }
  } finally {
    closeSync(fd);
  }
  if (got !== st.size) throw invalid(`${path} changed while it was read`);
  return { path: rel, mode: st.mode & 0o777, content_b64: data.subarray(0, got).toString("base64") };
}

/** fnmatch.translate's regular expression (case-sensitive, as on POSIX). */
function fnmatchRegex(pattern: string): RegExp {
  let out = "";
  for (let i = 0; i < pattern.length; i++) {
    const c = pattern[i]!;
    if (c === "*") out += ".*";
    else if (c === "?") out += ".";
    else if (c === "[") {
      let j = i + 1;
      if (pattern[j] === "!") j++;
      if (pattern[j] === "]") j++;
      while (j < pattern.length && pattern[j] !== "]") j++;
      if (j >= pattern.length) {
        out += "\\[";
        continue;
      }
      let stuff = pattern.slice(i + 1, j).replace(/\\/g, "\\\\").replace(/([&~|])/g, "\\$1");
      i = j;
      if (!stuff) out += "(?!)";
      else if (stuff === "!") out += ".";
      else {
        if (stuff[0] === "!") stuff = "^" + stuff.slice(1);
        else if (stuff[0] === "^" || stuff[0] === "[") stuff = "\\" + stuff;
        out += `[${stuff}]`;
      }
    } else out += c.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
  }
  return new RegExp(`^(?:${out})$`, "s");
}

function listDir(path: string): Dirent[] {
  try {
    return readdirSync(path, { withFileTypes: true });
  } catch {
    return [];
  }
}

function isDirPath(path: string): boolean {
  return statOrNull(path)?.isDirectory() === true;
}

/** Path(base).glob(pattern) of Python 3.11, sorted as Python sorts paths (by segment).
 * `**` matches the directory and all below it (not through symlinked directories); a
 * wildcard segment that is not the last matches directories only; a trailing `/` too. */
export function globPaths(base: string, pattern: string): string[] {
  const parts = pattern.split("/").filter((s) => s !== "" && s !== ".");
  if (pattern.endsWith("/")) parts.push("");
  const results = new Set<string>();
  const select = (parent: string, index: number): void => {
    const part = parts[index];
    if (part === undefined || part === "") {
      results.add(parent);
      return;
    }
    const dirOnly = index + 1 < parts.length;
    if (part === "**") {
      const dirs = (dir: string): string[] => [dir, ...listDir(dir)
        .filter((e) => e.isDirectory())
        .flatMap((e) => dirs(joinPure(dir, e.name)))];
      for (const dir of dirs(parent)) select(dir, index + 1);
    } else if (part.includes("**")) {
      throw invalid("Invalid pattern: '**' can only be an entire path component");
    } else if (/[*?[]/.test(part)) {
      const match = fnmatchRegex(part);
      for (const entry of listDir(parent)) {
        const path = joinPure(parent, entry.name);
        if (dirOnly && !isDirPath(path)) continue;
        if (match.test(entry.name)) select(path, index + 1);
      }
    } else {
      const path = joinPure(parent, part);
      if (dirOnly ? isDirPath(path) : statOrNull(path) !== undefined) select(path, index + 1);
    }
  };
  if (isDirPath(base)) select(purePath(base), 0);
  const key = (p: string) => p.split("/");
  return [...results].sort((a, b) => {
    const [x, y] = [key(a), key(b)];
    for (let i = 0; i < Math.min(x.length, y.length); i++) {
      const d = comparePy(x[i]!, y[i]!);
      if (d) return d;
    }
    return x.length - y.length;
  });
}
