/**
 * Every error the SDK throws; catch `PandastackError` to catch them all. The same tree as the
 * Python SDK's (src/pandastack/sdk/errors.py), one class per leaf:
 *
 *     PandastackError                  status / code / requestId: undefined unless the server said
 *     ├── ConfigError                  no API URL / key configured, or an unreadable config file
 *     ├── ProtocolError                the reply is not in the shape the wire types promise
 *     ├── APIConnectionError           no HTTP answer: cannot connect, connection dropped
 *     │   └── TransportTimeoutError    the client gave up waiting (also a PandastackTimeoutError)
 *     ├── TemplateBuildError           a template build ended failed (`build`: its status)
 *     └── APIError                     the server answered with an error envelope
 *         ├── AuthError                401/403 (AuthenticationError, PermissionDeniedError)
 *         ├── NotFoundError            404
 *         ├── InvalidRequestError      400, 422 (also thrown before sending), 413 PayloadTooLarge
 *         ├── RateLimitError           429 (`retryAfter` seconds), QuotaExceededError
 *         ├── SandboxError             409 ConflictError (TemplateBuilding, HostLost, VolumeInUse),
 *         │                            507 InsufficientStorageError
 *         ├── ServerError              other 5xx, HostUnavailableError (503)
 *         └── WaitTimeoutError         408: the server stopped waiting
 *
 * JavaScript has single inheritance, so Python's `TimeoutError` (a second parent of
 * `TransportTimeoutError` and `WaitTimeoutError`) is `PandastackTimeoutError` here, named so it
 * does not shadow the global, and `instanceof PandastackTimeoutError` holds for both through
 * `Symbol.hasInstance`. A command that runs longer than its `timeoutSeconds` is not an error:
 * its result has `timedOut: true`.
 */

export interface ErrorFields {
  status?: number | undefined;
  code?: string | undefined;
  requestId?: string | undefined;
  cause?: unknown;
}

export class PandastackError extends Error {
  /** The HTTP status, when the server answered. */
  readonly status: number | undefined;
  /** The machine-readable code of the error envelope, e.g. `"not_found"`. */
  readonly code: string | undefined;
  /** The server's id of the request: quote it when reporting a problem. */
  readonly requestId: string | undefined;

  constructor(message: string, fields: ErrorFields = {}) {
    super(message, fields.cause === undefined ? undefined : { cause: fields.cause });
    this.name = new.target.name;
    this.status = fields.status;
    this.code = fields.code;
    this.requestId = fields.requestId;
  }
}

export class ConfigError extends PandastackError {}
export class ProtocolError extends PandastackError {}
export class APIConnectionError extends PandastackError {}
export class TransportTimeoutError extends APIConnectionError {}

export class TemplateBuildError extends PandastackError {
  /** The build's final status. */
  readonly build: unknown;
  constructor(message: string, build?: unknown) {
    super(message);
    this.build = build;
  }
}

export interface APIErrorFields {
  status: number;
  code: string;
  requestId?: string | undefined;
  retryAfter?: number | undefined;
  details?: unknown;
}

/** The server answered with an error; `message` is the envelope's human-readable one. */
export class APIError extends PandastackError {
  declare readonly status: number;
  declare readonly code: string;

  override toString(): string {
    const rid = this.requestId ? `, requestId=${this.requestId}` : "";
    return `${this.name}: ${this.message} (status=${this.status}, code=${this.code}${rid})`;
  }
}

export class AuthError extends APIError {}
export class AuthenticationError extends AuthError {}
export class PermissionDeniedError extends AuthError {}
export class NotFoundError extends APIError {}
export class InvalidRequestError extends APIError {}
export class PayloadTooLargeError extends InvalidRequestError {}

export class RateLimitError extends APIError {
  /** The server's hint, in seconds, if it gave one. */
  readonly retryAfter: number | undefined;
  constructor(message: string, fields: APIErrorFields) {
    super(message, fields);
    this.retryAfter = fields.retryAfter;
  }
}

export class QuotaExceededError extends RateLimitError {
  /** The quota reached, e.g. `"max_sandboxes"`. */
  readonly limit: string | undefined;
  readonly value: number | undefined;
  readonly current: number | undefined;
  constructor(message: string, fields: APIErrorFields) {
    super(message, fields);
    const body = (fields.details ?? {}) as Record<string, unknown>;
    const num = (v: unknown) => (typeof v === "number" ? v : undefined);
    this.limit = typeof body["limit"] === "string" ? body["limit"] : undefined;
    this.value = num(body["value"]);
    this.current = num(body["current"]);
  }
}

export class SandboxError extends APIError {}
export class ConflictError extends SandboxError {}

export class TemplateBuildingError extends ConflictError {
  readonly retryAfter: number | undefined;
  constructor(message: string, fields: APIErrorFields) {
    super(message, fields);
    this.retryAfter = fields.retryAfter;
  }
}

export class HostLostError extends ConflictError {}
export class VolumeInUseError extends ConflictError {}
export class InsufficientStorageError extends SandboxError {}
export class ServerError extends APIError {}
export class HostUnavailableError extends ServerError {}
export class WaitTimeoutError extends APIError {}

/** Any timeout: `TransportTimeoutError` (the client gave up) or `WaitTimeoutError` (408).
 * Never thrown itself; `err instanceof PandastackTimeoutError` matches either. */
export class PandastackTimeoutError extends PandastackError {
  static override [Symbol.hasInstance](value: unknown): boolean {
    return value instanceof TransportTimeoutError || value instanceof WaitTimeoutError ||
      Function.prototype[Symbol.hasInstance].call(this, value);
  }
}

/** The older names, as in Python. */
export const ValidationError = InvalidRequestError;
export const TransportError = APIConnectionError;

type APIErrorClass = new (message: string, fields: APIErrorFields) => APIError;

/** The class each server error code throws (the Python SDK's CODE_EXCEPTIONS). */
export const CODE_EXCEPTIONS: Record<string, APIErrorClass> = {
  bad_request: InvalidRequestError, validation_error: InvalidRequestError,
  unauthorized: AuthenticationError, forbidden: PermissionDeniedError,
  not_found: NotFoundError, timeout: WaitTimeoutError, conflict: ConflictError,
  template_building: TemplateBuildingError, payload_too_large: PayloadTooLargeError,
  rate_limited: RateLimitError, insufficient_storage: InsufficientStorageError,
  quota_exceeded: QuotaExceededError,
  internal: ServerError, bad_gateway: ServerError, unavailable: ServerError,
  host_unavailable: HostUnavailableError, host_lost: HostLostError,
  volume_in_use: VolumeInUseError,
};

/** The status each code goes with (pandastack.rules.ERROR_STATUS). */
export const ERROR_STATUS: Record<string, number> = {
  bad_request: 400, unauthorized: 401, forbidden: 403, not_found: 404, timeout: 408,
  conflict: 409, template_building: 409, host_lost: 409, volume_in_use: 409,
  quota_exceeded: 429, payload_too_large: 413, validation_error: 422, rate_limited: 429,
  internal: 500, bad_gateway: 502, unavailable: 503, host_unavailable: 503,
  insufficient_storage: 507,
};

const SPECIFIC = new Set(["template_building", "host_unavailable", "host_lost",
  "volume_in_use", "quota_exceeded"]);
/** The code a bare status stands for (pandastack.rules.STATUS_ERROR_CODE). */
const STATUS_ERROR_CODE: Record<number, string> = {};
for (const [code, status] of Object.entries(ERROR_STATUS)) {
  if (!SPECIFIC.has(code)) STATUS_ERROR_CODE[status] = code;
}
// A bare 502/504 (no envelope) comes from a proxy in front of the server.
const STATUS_CODE: Record<number, string> = { ...STATUS_ERROR_CODE, 502: "unavailable",
  504: "unavailable" };

function errorClass(status: number, code: string): APIErrorClass {
  const byCode = CODE_EXCEPTIONS[code];
  if (byCode !== undefined && ERROR_STATUS[code] === status) return byCode;
  const bare = STATUS_ERROR_CODE[status];
  return (bare !== undefined ? CODE_EXCEPTIONS[bare] : undefined) ??
    (status >= 500 ? ServerError : APIError);
}

/** The error of an answer: its code's class when the code goes with this status, else its
 * status's (an unknown 5xx: `ServerError`; anything else: `APIError`). */
export function apiError(status: number, code: string | undefined, message: string | undefined,
  requestId?: string, retryAfter?: number, details?: unknown): APIError {
  const known = code || STATUS_CODE[status] || (status >= 500 ? "internal" : "error");
  const cls = errorClass(status, known);
  return new cls(message || `HTTP ${status}`, { status, code: known, requestId, retryAfter,
    details });
}

/** A locally rejected request (nothing was sent; no requestId). */
export function invalid(message: string): InvalidRequestError {
  return new InvalidRequestError(message, { status: 422, code: "validation_error" });
}
