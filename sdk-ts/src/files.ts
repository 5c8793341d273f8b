/**
 * `sbx.files` (also `sbx.filesystem`): read, write, list and move files inside the sandbox.
 * Reads and writes stream: `read(path, {format: "stream"})` and `write(path, stream)` never
 * hold the whole file in memory, nor do `upload` / `download` (local files, Node only).
 */
import { createReadStream, createWriteStream } from "node:fs";
import { rename, stat as localStat, unlink } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { randomBytes } from "node:crypto";

import { camelize } from "./camel.js";
import { NotFoundError, invalid } from "./errors.js";
import { type Http, type UploadBody, sandboxPath } from "./http.js";
import type { FileEntry, GlobMatches, GrepMatches, WriteResult } from "./types.js";
import { Watch } from "./watch.js";

export type ReadFormat = "bytes" | "text" | "stream";
/** Told the bytes moved so far after each chunk of an upload or a download. */
export type Progress = (bytes: number) => unknown;

function modeParam(mode: number | undefined): string | undefined {
  return mode === undefined ? undefined : mode.toString(8); // the server reads octal, as chmod does
}

function toBase64(data: Uint8Array): string {
  return Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString("base64");
}

export class Filesystem {
  /** @internal */
  constructor(private readonly sandboxId: string, private readonly http: Http) {}

  private readCall(path: string) {
    return { method: "GET", path: sandboxPath(this.sandboxId, "files"), query: { path },
      headers: { Accept: "application/octet-stream" } };
  }

  /** The file at `path`: bytes (default), `text` (UTF-8, bad bytes as U+FFFD), or `stream`:
   * an async iterable of chunks as they arrive (iterate it to the end, or break out). */
  read(path: string, options?: { format?: "bytes" }): Promise<Uint8Array>;
  read(path: string, options: { format: "text" }): Promise<string>;
  read(path: string, options: { format: "stream" }): Promise<AsyncIterable<Uint8Array>>;
  async read(path: string, options: { format?: ReadFormat } = {}): Promise<Uint8Array | string | AsyncIterable<Uint8Array>> {
    const format = options.format ?? "bytes";
    if (format === "stream") return this.http.stream(this.readCall(path));
    if (format !== "bytes" && format !== "text") {
      throw invalid(`format must be "bytes", "text" or "stream", not ${JSON.stringify(format)}`);
    }
    const data = await this.http.bytes(this.readCall(path));
    return format === "text" ? new TextDecoder().decode(data) : data;
  }

  /** Create or replace the file at `path` (text as UTF-8; parents are created) from text,
   * bytes, a `ReadableStream` or an async iterable of chunks. `mode`: permission bits,
   * e.g. `0o755`. */
  async write(path: string, data: UploadBody, options: { mode?: number } = {}): Promise<WriteResult> {
    return camelize(await this.http.json({
      method: "PUT", path: sandboxPath(this.sandboxId, "files"),
      query: { path, mode: modeParam(options.mode) }, body: data,
      headers: { "Content-Type": "application/octet-stream" },
    })) as WriteResult;
  }

  /** Write several small files in one request, in order (bounded by the server's JSON body
   * limit; use `write` or `upload` for big ones). */
  async writeMany(files: [string, string | Uint8Array][]): Promise<WriteResult[]> {
    const items = files.map(([path, data]) => typeof data === "string" ? { path, data }
      : { path, data: toBase64(data), encoding: "base64" });
    const body = await this.http.json<{ files: unknown[] }>({
      method: "POST", path: sandboxPath(this.sandboxId, "files", "batch"), json: { files: items } });
    return camelize(body.files) as WriteResult[];
  }

  /** Watch the directory `path` (and, with `recursive`, default true, everything under it):
   * iterate the `Watch` for `FileEvent`s, `stop()` it when done. Set up when this resolves. */
  async watch(path: string, options: { recursive?: boolean } = {}): Promise<Watch> {
    // No read timeout: a quiet directory sends only keep-alives, and may send nothing for long.
    return new Watch(this.http, { method: "GET", path: sandboxPath(this.sandboxId, "files", "watch"),
      query: { path, recursive: (options.recursive ?? true) ? "true" : "false" },
      headers: { Accept: "text/event-stream" }, timeout: null }).start();
  }

  /** Stream the local file `localPath` to `remotePath` in the sandbox (`onProgress`: told
   * the bytes sent so far after each chunk). */
  async upload(localPath: string, remotePath: string,
    options: { mode?: number; onProgress?: Progress } = {}): Promise<WriteResult> {
    const size = (await localStat(localPath)).size;
    const onProgress = options.onProgress;
    async function* chunks(): AsyncGenerator<Uint8Array> {
      let sent = 0;
      for await (const chunk of createReadStream(localPath, { highWaterMark: 256 * 1024 })) {
        yield chunk as Uint8Array;
        sent += (chunk as Uint8Array).length;
        if (onProgress) await onProgress(sent);
      }
    }
    return camelize(await this.http.json({
      method: "PUT", path: sandboxPath(this.sandboxId, "files"),
      query: { path: remotePath, mode: modeParam(options.mode) },
      body: chunks(),
      headers: { "Content-Type": "application/octet-stream", "Content-Length": String(size) },
    })) as WriteResult;
  }

  /** Stream the sandbox file `remotePath` to `localPath`; the bytes written (`onProgress`:
   * told the bytes received so far after each chunk). The local file appears only once
   * complete; a failed download leaves nothing. */
  async download(remotePath: string, localPath: string, options: { onProgress?: Progress } = {}): Promise<number> {
    const tmp = join(dirname(localPath), `.${basename(localPath)}.${randomBytes(4).toString("hex")}.part`);
    const out = createWriteStream(tmp, { flags: "wx" });
    let written = 0;
    try {
      for await (const chunk of this.http.stream(this.readCall(remotePath))) {
        if (!out.write(chunk)) await new Promise((resolve) => out.once("drain", resolve));
        written += chunk.length;
        if (options.onProgress) await options.onProgress(written);
      }
      await new Promise<void>((resolve, reject) => out.end((err?: Error | null) => (err ? reject(err) : resolve())));
      await rename(tmp, localPath);
    } catch (err) {
      out.destroy();
      await unlink(tmp).catch(() => undefined);
      throw err;
    }
    return written;
  }

  /** The entries of the directory `path`. */
  async list(path: string): Promise<FileEntry[]> {
    const body = await this.http.json<{ entries: unknown[] }>({
      method: "GET", path: sandboxPath(this.sandboxId, "files", "list"), query: { path } });
    return camelize(body.entries) as FileEntry[];
  }

  /** Type, size, mode and mtime of `path` (`NotFoundError` if it does not exist). */
  async stat(path: string): Promise<FileEntry> {
    return camelize(await this.http.json({
      method: "GET", path: sandboxPath(this.sandboxId, "files", "stat"), query: { path } })) as FileEntry;
  }

  /** Whether `path` exists (any 404 counts as no, a vanished sandbox included). */
  async exists(path: string): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (err) {
      if (err instanceof NotFoundError) return false;
      throw err;
    }
  }

  /** Create the directory `path` (and, with `parents`, default true, its missing parents). */
  async mkdir(path: string, options: { parents?: boolean } = {}): Promise<void> {
    await this.http.void({ method: "POST", path: sandboxPath(this.sandboxId, "files", "mkdir"),
      json: { path, parents: options.parents ?? true } });
  }

  /** Remove a file, or a directory (a non-empty one only with `recursive: true`). */
  async remove(path: string, options: { recursive?: boolean } = {}): Promise<void> {
    await this.http.void({ method: "DELETE", path: sandboxPath(this.sandboxId, "files"),
      query: { path, recursive: options.recursive ? "true" : "false" } });
  }

  /** Rename (move) `src` to `dst`. */
  async rename(src: string, dst: string): Promise<void> {
    await this.http.void({ method: "POST", path: sandboxPath(this.sandboxId, "files", "rename"),
      json: { src, dst } });
  }

  /** The lines holding the literal substring `pattern` (no regular expression) in the files
   * under `path` (or in the file `path`), searched in the sandbox; binary files are skipped.
   * Past the guest's bounds the result says `truncated`. */
  async grep(path: string, pattern: string, options: { ignoreCase?: boolean } = {}): Promise<GrepMatches> {
    return camelize(await this.http.json({ method: "POST", path: sandboxPath(this.sandboxId, "files", "grep"),
      json: { path, pattern, ignore_case: options.ignoreCase ?? false } })) as GrepMatches;
  }

  /** The paths under the directory `path` that `pattern` matches (relative to `path`: `*`
   * and `?` within one name, `**` any number of directories), sorted. */
  async glob(path: string, pattern: string): Promise<GlobMatches> {
    return camelize(await this.http.json({ method: "POST", path: sandboxPath(this.sandboxId, "files", "glob"),
      json: { path, pattern } })) as GlobMatches;
  }
}
