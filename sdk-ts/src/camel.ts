/**
 * The wire speaks snake_case (spec/openapi.json); the SDK hands out camelCase. `Camel<T>` is the
 * generated wire type with its keys renamed, `camelize` does the same to a decoded value. Keys
 * of free-form maps (metadata labels, env, MIME bundles) are the user's and stay as they are.
 */

/** Fields whose value is a map of the user's (or the server's) own keys. */
const FREE_FORM = new Set(["metadata", "env", "data", "labels", "moved", "failed", "dropped"]);
type FreeForm = "metadata" | "env" | "data" | "labels" | "moved" | "failed" | "dropped";

export type CamelKey<S extends string> = S extends `${infer H}_${infer T}`
  ? `${H}${Capitalize<CamelKey<T>>}` : S;

export type Camel<T> = T extends readonly (infer U)[] ? Camel<U>[]
  : T extends object ? {
    [K in keyof T as K extends string ? CamelKey<K> : K]: K extends FreeForm ? T[K] : Camel<T[K]>
  } : T;

export function camelKey(key: string): string {
  return key.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase());
}

export function snakeKey(key: string): string {
  return key.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
}

export function camelize<T>(value: unknown): Camel<T> {
  return convert(value, camelKey) as Camel<T>;
}

/** A request body from camelCase options: keys renamed, `undefined` left out. */
export function snakeify(value: unknown): Record<string, unknown> {
  return convert(value, snakeKey) as Record<string, unknown>;
}

function convert(value: unknown, rename: (key: string) => string): unknown {
  if (Array.isArray(value)) return value.map((v) => convert(v, rename));
  if (value === null || typeof value !== "object" || value instanceof Uint8Array) return value;
  const out: Record<string, unknown> = {};
  for (const [key, item] of Object.entries(value)) {
    if (item === undefined) continue;
    out[rename(key)] = FREE_FORM.has(key) ? item : convert(item, rename);
  }
  return out;
}
