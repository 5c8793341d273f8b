/**
 * The pandastack TypeScript SDK: `Sandbox` (one microVM) and `Client` (the team's
 * resources), over the REST API. The twin of the Python SDK's async surface, in camelCase;
 * tests/sdk/test_ts_parity.py holds the two to each other.
 *
 * Configure with `PANDASTACK_API` / `PANDASTACK_API_KEY`, `~/.config/pandastack/config.json`,
 * or `apiUrl` / `apiKey` options.
 */
export { Sandbox, type CreateOptions, type ListOptions, type SandboxPage } from "./sandbox.js";
export { Client, Sandboxes, Snapshots, Templates, Volumes, Keys, Hosts, Teams,
  type BuildOptions, type QuotaOptions, type TimeArg, type UsageGroupBy, type VolumeSnapshotInfo } from "./client.js";
export { Commands, Process, type ExecOptions, type StartOptions, type ConnectOptions,
  type ProcessEvent } from "./commands.js";
export { fromDockerfile } from "./dockerfile.js";
export { Template, waitForCommand, waitForFile, waitForPort, type ReadyCheck, type TemplateStep } from "./template.js";
export { MAX_COPY_BYTES, MAX_COPY_FILES } from "./copy.js";
export { Filesystem, type ReadFormat, type Progress } from "./files.js";
export { Watch, type FileEvent } from "./watch.js";
export { Events, EventStream, EVENT_TYPES, type Event, type EventStreamOptions } from "./events.js";
export { Webhooks, verifySignature, InvalidSignature, SIGNATURE_HEADER, type Webhook, type WebhookCreated,
  type WebhookDelivery } from "./webhooks.js";
export { Registries } from "./registries.js";
export { Pty, Terminals, type PtyCreateOptions, type PtyDataCallback } from "./pty.js";
export { CodeInterpreter, Execution, Result, type CodeEvent, type Language,
  type RunCodeOptions } from "./code.js";
export { resolveConfig, defaultConfigPath, DEFAULT_TIMEOUT, type ClientConfig,
  type ConnectionOptions } from "./config.js";
export {
  APIConnectionError, APIError, AuthError, AuthenticationError, ConfigError, ConflictError,
  HostLostError, HostUnavailableError, InsufficientStorageError, InvalidRequestError,
  NotFoundError, PandastackError, PandastackTimeoutError, PayloadTooLargeError,
  PermissionDeniedError, ProtocolError, QuotaExceededError, RateLimitError, SandboxError,
  ServerError, TemplateBuildError, TemplateBuildingError, TransportError, TransportTimeoutError,
  ValidationError, VolumeInUseError, WaitTimeoutError,
} from "./errors.js";
export type * from "./types.js";
export type { components as wire } from "./generated/openapi.js";
