/**
 * The team's credentials for image registries (`client.registries`), the twin of the Python
 * SDK's `AsyncRegistries`: template builds FROM an image of a registry the team logged in to
 * pull with them. The server keeps the password encrypted and never shows it again: `list()`
 * names registries and usernames only.
 */
import { camelize } from "./camel.js";
import { invalid } from "./errors.js";
import { type Http, pathSegment } from "./http.js";
import type { RegistryCredentials } from "./types.js";

const PATH = "/v1/registry-credentials";
// The Python SDK's templatespec/registry_host.py, the server's rule: host[:port], lowercased,
// Docker Hub under any of its names is docker.io.
const HOST_PORT = /^(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*|\[[0-9a-f:]+\])(?::([0-9]{1,5}))?$/;
const HUB_ALIASES = new Set(["docker.io", "index.docker.io", "registry-1.docker.io"]);

function registryPath(registry: string): string {
  const host = registry.trim().toLowerCase();
  const match = host.length <= 255 ? HOST_PORT.exec(host) : null;
  const port = match?.[1];
  if (!match || (port !== undefined && !(Number(port) > 0 && Number(port) < 65536))) {
    throw invalid("registry: a registry is host[:port], e.g. ghcr.io, docker.io or registry.example.com:5000");
  }
  return `${PATH}/${pathSegment(HUB_ALIASES.has(host) ? "docker.io" : host)}`;
}

export class Registries {
  /** @internal */
  constructor(private readonly http: Http) {}

  /** The server this namespace talks to. */
  get apiUrl(): string {
    return this.http.config.apiUrl;
  }

  /** Store the team's credentials for `registry` (host[:port]; `docker.io` for Docker Hub),
   * replacing any it had. */
  async login(registry: string, username: string, password: string): Promise<RegistryCredentials> {
    const path = registryPath(registry);
    // Checked here as the server checks it; the message never repeats the password.
    if (!username || username.length > 256 || /[:\x00-\x1f\x7f]/.test(username)) {
      throw invalid("username: 1 to 256 characters, no colon and no control characters");
    }
    if (!password || password.length > 8192 || /[\x00-\x1f\x7f]/.test(password)) {
      throw invalid("password: 1 to 8192 characters, no control characters (a trailing newline included)");
    }
    return camelize(await this.http.json({ method: "PUT", path, json: { username, password } })) as RegistryCredentials;
  }

  /** The registries the team has credentials for, with their usernames (never the passwords). */
  async list(): Promise<RegistryCredentials[]> {
    return (camelize(await this.http.json({ method: "GET", path: PATH })) as { credentials: RegistryCredentials[] }).credentials;
  }

  /** Delete the team's credentials for `registry` (`NotFoundError` if it has none). */
  async logout(registry: string): Promise<void> {
    await this.http.void({ method: "DELETE", path: registryPath(registry) });
  }
}
