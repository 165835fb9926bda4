/**
 * W3C Trace Context (`traceparent`): `00-<trace-id: 32 hex>-<parent-id: 16 hex>-<flags>`.
 * A task carries the `traceparent` of its hop; a child task keeps the trace id and gets a
 * parent id of its own, derived from its message id (the same hop, the same id), so the
 * chain joins the caller's OpenTelemetry trace.
 */

import { createHash } from "node:crypto";

const PATTERN = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;
const INVALID_TRACE = "0".repeat(32);
const INVALID_PARENT = "0".repeat(16);

/** `[traceId, parentId, flags]` of a valid header, else null (an invalid one is ignored). */
export function parse(value: unknown): [string, string, string] | null {
  if (typeof value !== "string") return null;
  const match = PATTERN.exec(value.trim().toLowerCase());
  if (match === null) return null;
  const [, version, traceId, parentId, flags] = match as unknown as [string, string, string, string, string];
  if (version === "ff" || traceId === INVALID_TRACE || parentId === INVALID_PARENT) return null;
  return [traceId, parentId, flags];
}

/** `value` as it travels (trimmed, lower case) when it is valid; else null (W3C: ignore it). */
export function normalized(value: string | null | undefined): string | null {
  return parse(value) === null ? null : (value as string).trim().toLowerCase();
}

/** The `traceparent` of one hop below `traceparent`: same trace, a parent id of its own. */
export function child(traceparent: string | null | undefined, ...hop: Array<string | number>): string | null {
  const parts = parse(traceparent);
  if (parts === null) return null;
  const [traceId, , flags] = parts;
  let span = createHash("sha256").update(JSON.stringify([traceId, ...hop])).digest("hex").slice(0, 16);
  if (span === INVALID_PARENT) span = `${"0".repeat(15)}1`;
  return `00-${traceId}-${span}-${flags}`;
}
