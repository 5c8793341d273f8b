/**
 * The values the SDK hands out: the generated wire types (src/generated/openapi.ts, from
 * spec/openapi.json) with camelCase keys. Nothing here is written by hand but the names.
 */
import type { Camel } from "./camel.js";
import type { components } from "./generated/openapi.js";

type S = components["schemas"];

export type SandboxInfo = Camel<S["SandboxInfo"]>;
export type SandboxState = SandboxInfo["state"];
export type ExecResult = Camel<S["ExecResult"]>;
export type ProcessInfo = Camel<S["ProcessInfo"]>;
export type FileEntry = Camel<S["FileEntry"]>;
export type WriteResult = Camel<S["WriteResult"]>;
export type GrepMatches = Camel<S["GrepMatches"]>;
export type TextMatch = Camel<S["TextMatch"]>;
export type GlobMatches = Camel<S["GlobMatches"]>;
export type SnapshotInfo = Camel<S["SnapshotInfo"]>;
export type ForkResult = Camel<S["ForkResult"]>;
export type Lifecycle = Camel<S["Lifecycle"]>;
export type Logs = Camel<S["Logs"]>;
export type NetworkSpec = Camel<S["NetworkSpec"]>;
export type SandboxMetrics = Camel<S["SandboxMetrics"]>;
export type CodeContext = Camel<S["CodeContext"]>;
export type CodeError = Camel<S["CodeError"]>;
export type CodeResultWire = Camel<S["CodeResult"]>;
export type TemplateBuildInfo = Camel<S["TemplateBuildInfo"]>;
export type TemplateInfo = Camel<S["TemplateInfo"]>;
export type BuiltinTemplateInfo = Camel<S["BuiltinTemplateInfo"]>;
export type TemplateSpec = S["TemplateSpec"];
export type VolumeInfo = Camel<S["VolumeInfo"]>;
export type VolumeMount = Camel<S["VolumeMount"]>;
export type AttachedVolume = Camel<S["AttachedVolume"]>;
export type UsageReport = Camel<S["UsageReport"]>;
export type UsageRow = Camel<S["UsageRow"]>;
export type KeyInfo = Camel<S["KeyInfo"]>;
export type CreatedKey = Camel<S["CreatedKey"]>;
export type HostInfo = Camel<S["HostInfo"]>;
export type DrainResult = Camel<S["DrainResult"]>;
export type QuotaInfo = Camel<S["QuotaInfo"]>;

/** The egress policy as the SDK takes it: `{internet, allowOut, denyOut}`, each optional. */
export type NetworkArg = Partial<NetworkSpec>;
/** A volume to mount in a new sandbox. */
export type VolumeArg = { name: string; mountPath: string; readOnly?: boolean };

/** Gets each chunk of output text as it arrives; may return a promise (it is awaited). */
export type OutputCallback = (text: string) => unknown;
