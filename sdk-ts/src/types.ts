/**
 * The values the SDK hands out: the generated wire types (src/generated/openapi.ts, from
 * spec/openapi.json) with camelCase keys. Every model the API answers with is re-exported
 * from src/generated/models.ts (`npm run gen`), so a new result type is not named here; what
 * is written here are the few names that are not an answer's model as it is.
 */
import type { Camel } from "./camel.js";
import type { components } from "./generated/openapi.js";
import type { CodeResult, NetworkSpec, SandboxInfo } from "./generated/models.js";

export type * from "./generated/models.js";

type S = components["schemas"];

export type SandboxState = SandboxInfo["state"];
export type CodeResultWire = CodeResult;
export type TemplateSpec = S["TemplateSpec"];
export type VolumeMount = Camel<S["VolumeMount"]>;

/** The egress policy as the SDK takes it: `{internet, allowOut, denyOut}`, each optional. */
export type NetworkArg = Partial<NetworkSpec>;
/** A volume to mount in a new sandbox. */
export type VolumeArg = { name: string; mountPath: string; readOnly?: boolean };

/** Gets each chunk of output text as it arrives; may return a promise (it is awaited). */
export type OutputCallback = (text: string) => unknown;
