/**
 * Where the SDK finds its server and key. Each setting is resolved on its own, first match wins
 * (as in the Python SDK, src/pandastack/sdk/config.py):
 *
 * 1. the option (`apiUrl`, `apiKey`, `caBundle`),
 * 2. the environment (`PANDASTACK_API`, `PANDASTACK_API_KEY`, `PANDASTACK_CA_BUNDLE`),
 * 3. the config file `~/.config/pandastack/config.json` (`$XDG_CONFIG_HOME/pandastack/...` when
 *    that is set): `{"api_url": "...", "api_key": "...", "ca_bundle": "..."}`.
 *
 * Empty strings count as unset. A URL or key missing everywhere throws `ConfigError`; without
 * a CA bundle an https:// server is verified against the runtime's CAs. The file is read only
 * when it must give the URL or the key (its CA bundle goes with its server).
 */
import { readFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";

import { ConfigError } from "./errors.js";
import { readCaBundle } from "./tls.js";

export const ENV_API_URL = "PANDASTACK_API";
export const ENV_API_KEY = "PANDASTACK_API_KEY";
export const ENV_CA_BUNDLE = "PANDASTACK_CA_BUNDLE";
/** Seconds an ordinary request may take. Exec and wait raise it above the command's own
 * timeout, so long commands are never cut by it. */
export const DEFAULT_TIMEOUT = 60;

/** What every entry point (`Sandbox.create`, `new Client`, ...) accepts to reach the server. */
export interface ConnectionOptions {
  /** The server, e.g. `http://127.0.0.1:8080` (default: env, then the config file). */
  apiUrl?: string;
  /** The API key (default: env, then the config file). */
  apiKey?: string;
  /** Seconds an ordinary request may take, or `null` for no limit. */
  timeout?: number | null;
  /** A `fetch` to use instead of the global one (tests, proxies, Bun/Deno variants). */
  fetch?: typeof globalThis.fetch;
  /** The PEM file of the CA that issued an https:// server's certificate (default: env, then
   * the config file, else the runtime's CAs). */
  caBundle?: string;
}

export interface ClientConfig {
  apiUrl: string;
  apiKey: string;
  timeout: number | null;
  caBundle?: string | undefined;
}

type Env = Record<string, string | undefined>;

export function defaultConfigPath(env: Env = process.env): string {
  const base = env["XDG_CONFIG_HOME"] || join(homedir(), ".config");
  return join(base, "pandastack", "config.json");
}

function readConfigFile(path: string): Record<string, unknown> {
  let raw: string;
  try {
    raw = readFileSync(path, "utf8");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return {};
    throw new ConfigError(`cannot read the pandastack config file ${path}: ${String(err)}`);
  }
  let data: unknown;
  try {
    data = JSON.parse(raw);
  } catch (err) {
    throw new ConfigError(`the pandastack config file ${path} is not valid JSON: ${String(err)}`);
  }
  if (typeof data !== "object" || data === null || Array.isArray(data)) {
    throw new ConfigError(`the pandastack config file ${path} must hold a JSON object`);
  }
  return data as Record<string, unknown>;
}

function fileValue(data: Record<string, unknown>, key: string, path: string): string | undefined {
  const value = data[key];
  if (value === undefined || value === null || value === "") return undefined;
  if (typeof value !== "string") throw new ConfigError(`"${key}" in ${path} must be a string`);
  return value;
}

function normalizeUrl(url: string): string {
  const clean = url.trim().replace(/\/+$/, "");
  if (!/^https?:\/\//.test(clean)) {
    throw new ConfigError(`the pandastack API URL must start with http:// or https://, got ${JSON.stringify(url)}`);
  }
  return clean;
}

/** Resolve URL and key (option > environment > config file). `env` and `configPath` exist
 * for tests. */
export function resolveConfig(options: ConnectionOptions = {}, env: Env = process.env,
  configPath?: string): ClientConfig {
  let url = options.apiUrl || env[ENV_API_URL] || undefined;
  let key = options.apiKey || env[ENV_API_KEY] || undefined;
  let caBundle = options.caBundle || env[ENV_CA_BUNDLE] || undefined;
  const path = configPath ?? defaultConfigPath(env);
  if (url === undefined || key === undefined) {
    const data = readConfigFile(path);
    url ??= fileValue(data, "api_url", path);
    key ??= fileValue(data, "api_key", path);
    caBundle ??= fileValue(data, "ca_bundle", path);
  }
  if (url === undefined) {
    throw new ConfigError(`no pandastack API URL configured: pass apiUrl, set ${ENV_API_URL}, or put "api_url" in ${path}`);
  }
  if (key === undefined) {
    throw new ConfigError(`no pandastack API key configured: pass apiKey, set ${ENV_API_KEY}, or put "api_key" in ${path}`);
  }
  const timeout = options.timeout === undefined ? DEFAULT_TIMEOUT : options.timeout;
  if (caBundle !== undefined) readCaBundle(caBundle); // a wrong path fails here, not at a call
  return { apiUrl: normalizeUrl(url), apiKey: key, timeout, ...(caBundle !== undefined ? { caBundle } : {}) };
}
