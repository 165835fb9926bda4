/** JSON on the wire: encoding, strict task decoding with the JSON path of a fault, ids. */

import { createHash, randomBytes } from "node:crypto";

import { DecodeError } from "./errors.js";
import { PRIORITIES } from "./types.js";
import type { Budget, Candidate, PayloadRef, Priority, Resolution, Task } from "./types.js";

/** Ids and topics become subject tokens, so they may not hold dots, wildcards or spaces. */
export const TOKEN = /^[A-Za-z0-9_-]{1,128}$/;
/** Where replies may go: one literal NATS subject, not a system one (`$JS…`, `$SYS…`). */
export const REPLY_SUBJECT = /^[^.\s*>$][^.\s*>]*(\.[^.\s*>]+)*$/;
/** A ttl or budget: a day at most (past that, a task is history, not work). */
export const MAX_MS = 86_400_000;
export const DEFAULT_TTL_MS = 30_000;
export const DEFAULT_BUDGET: Budget = { seek_ms: 1_000, ack_ms: 2_000, execute_ms: 30_000 };

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

export function encode(value: unknown): Uint8Array {
  return encoder.encode(JSON.stringify(value));
}

/** Plain JSON; a DecodeError for malformed input or bytes that are not UTF-8. */
export function decodeJson(data: Uint8Array): unknown {
  let text: string;
  try {
    text = decoder.decode(data);
  } catch {
    throw new DecodeError("Input is not valid UTF-8 - at `$`");
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new DecodeError(`JSON is malformed: ${(err as Error).message} - at \`$\``);
  }
}

/**
 * A task envelope, validated as the Python coordinator validates it: unknown
 * fields are ignored, a missing required field, a wrong type or an unsupported
 * `v` is a DecodeError naming the field. Absent optional fields get their defaults.
 */
export function decodeTask(data: Uint8Array): Task {
  const doc = decodeJson(data);
  const r = new Reader(doc, "$");
  r.object();
  r.optional("kind", "task", (v, at) => literal(v, at, ["task"]));
  return {
    kind: "task",
    v: r.required("v", version),
    message_id: r.required("message_id", token),
    trace_id: r.required("trace_id", token),
    topic: r.required("topic", token),
    from_agent: r.optional("from_agent", null, nullableString),
    to_agent: r.optional("to_agent", null, nullableString),
    attempt: r.optional("attempt", 1, (v, at) => int(v, at, { ge: 1 })),
    created_at: r.optional("created_at", 0, (v, at) => int(v, at, {})),
    payload: r.optional("payload", null, (v) => v),
    ttl_ms: r.optional("ttl_ms", DEFAULT_TTL_MS, (v, at) => int(v, at, { gt: 0, le: MAX_MS })),
    reply_to: r.optional("reply_to", null, replySubject),
    priority: r.optional("priority", "P1", (v, at) => literal(v, at, PRIORITIES)) as Priority,
    budget: r.optional("budget", { ...DEFAULT_BUDGET }, budget),
    replay_of: r.optional("replay_of", null, nullableString),
    replays: r.optional("replays", 0, (v, at) => int(v, at, { ge: 0 })),
    requeued: r.optional("requeued", 0, (v, at) => int(v, at, { ge: 0 })),
    caller: r.optional("caller", null, nullableToken),
    headers: r.optional("headers", {}, stringMap),
    received_ms: r.optional("received_ms", 0, (v, at) => int(v, at, {})),
    traceparent: r.optional("traceparent", null, nullableString),
    payload_ref: r.optional("payload_ref", null, nullablePayloadRef),
    resolution: r.optional("resolution", null, nullableResolution),
  };
}

/** A task's budget alone (`$` is the budget object), validated as in a task. */
export function decodeBudget(data: Uint8Array): Budget {
  return budget(decodeJson(data), "$");
}

type Check<T> = (value: unknown, at: string) => T;

class Reader {
  constructor(
    private readonly doc: unknown,
    private readonly at: string,
  ) {}

  object(): Record<string, unknown> {
    if (typeof this.doc !== "object" || this.doc === null || Array.isArray(this.doc)) {
      throw new DecodeError(`Expected \`object\`, got \`${typeName(this.doc)}\` - at \`${this.at}\``);
    }
    return this.doc as Record<string, unknown>;
  }

  required<T>(field: string, check: Check<T>): T {
    const obj = this.object();
    if (!(field in obj)) {
      throw new DecodeError(`Object missing required field \`${field}\` - at \`${this.at}\``);
    }
    return check(obj[field], `${this.at}.${field}`);
  }

  optional<T>(field: string, fallback: T, check: Check<T>): T {
    const obj = this.object();
    return field in obj ? check(obj[field], `${this.at}.${field}`) : fallback;
  }
}

function typeName(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "array";
  if (typeof value === "number") return Number.isInteger(value) ? "int" : "float";
  if (typeof value === "boolean") return "bool";
  if (typeof value === "string") return "str";
  return typeof value;
}

function literal<T>(value: unknown, at: string, allowed: readonly T[]): T {
  if (!allowed.includes(value as T)) {
    throw new DecodeError(`Invalid enum value ${JSON.stringify(value)} - at \`${at}\``);
  }
  return value as T;
}

/** The envelope's `v`: 1, the only version spoken here (the Python SDK's words for another). */
function version(value: unknown, at: string): 1 {
  if (typeof value === "number" && Number.isInteger(value) && value !== 1) {
    throw new DecodeError(`envelope version ${value} is not spoken here: this is protocol v1, whose envelopes carry "v": 1 - at \`${at}\``);
  }
  return literal(value, at, [1]);
}

function token(value: unknown, at: string): string {
  if (typeof value !== "string") {
    throw new DecodeError(`Expected \`str\`, got \`${typeName(value)}\` - at \`${at}\``);
  }
  if (!TOKEN.test(value)) {
    throw new DecodeError(`Expected \`str\` matching regex '${TOKEN.source}' - at \`${at}\``);
  }
  return value;
}

function nullableToken(value: unknown, at: string): string | null {
  return value === null ? null : token(value, at);
}

function nullableString(value: unknown, at: string): string | null {
  if (value !== null && typeof value !== "string") {
    throw new DecodeError(`Expected \`str | null\`, got \`${typeName(value)}\` - at \`${at}\``);
  }
  return value;
}

function replySubject(value: unknown, at: string): string | null {
  const subject = nullableString(value, at);
  if (subject !== null && subject.length > 256) {
    throw new DecodeError(`Expected \`str\` of length <= 256 - at \`${at}\``);
  }
  if (subject !== null && !REPLY_SUBJECT.test(subject)) {
    throw new DecodeError(`Expected \`str\` matching regex '${REPLY_SUBJECT.source}' - at \`${at}\``);
  }
  return subject;
}

function int(value: unknown, at: string, bound: { ge?: number; gt?: number; le?: number }): number {
  if (typeof value !== "number" || !Number.isInteger(value)) {
    throw new DecodeError(`Expected \`int\`, got \`${typeName(value)}\` - at \`${at}\``);
  }
  if (bound.ge !== undefined && value < bound.ge) {
    throw new DecodeError(`Expected \`int\` >= ${bound.ge} - at \`${at}\``);
  }
  if (bound.gt !== undefined && value <= bound.gt) {
    throw new DecodeError(`Expected \`int\` >= ${bound.gt + 1} - at \`${at}\``);
  }
  if (bound.le !== undefined && value > bound.le) {
    throw new DecodeError(`Expected \`int\` <= ${bound.le} - at \`${at}\``);
  }
  return value;
}

function budget(value: unknown, at: string): Budget {
  const r = new Reader(value, at);
  r.object();
  const positive = (v: unknown, where: string) => int(v, where, { gt: 0, le: MAX_MS });
  return {
    seek_ms: r.optional("seek_ms", DEFAULT_BUDGET.seek_ms, positive),
    ack_ms: r.optional("ack_ms", DEFAULT_BUDGET.ack_ms, positive),
    execute_ms: r.optional("execute_ms", DEFAULT_BUDGET.execute_ms, positive),
  };
}

/** A claim check: where a payload too large to travel inline is kept. */
function nullablePayloadRef(value: unknown, at: string): PayloadRef | null {
  if (value === null) return null;
  const r = new Reader(value, at);
  r.object();
  return {
    bucket: r.required("bucket", string),
    name: r.required("name", string),
    size: r.required("size", (v, where) => int(v, where, {})),
    sha256: r.required("sha256", string),
  };
}

/** How the coordinator found a task's intent from its text; agents pass it on untouched. */
function nullableResolution(value: unknown, at: string): Resolution | null {
  if (value === null) return null;
  const r = new Reader(value, at);
  r.object();
  return {
    topic: r.required("topic", string),
    scorer: r.required("scorer", string),
    best: r.optional("best", null, nullableCandidate),
    runner_up: r.optional("runner_up", null, nullableCandidate),
    note: r.optional("note", "", string),
  };
}

function nullableCandidate(value: unknown, at: string): Candidate | null {
  if (value === null) return null;
  const r = new Reader(value, at);
  r.object();
  return {
    intent: r.required("intent", string),
    confidence: r.required("confidence", number),
    evidence: r.optional("evidence", 0, number),
  };
}

function number(value: unknown, at: string): number {
  if (typeof value !== "number") {
    throw new DecodeError(`Expected \`float\`, got \`${typeName(value)}\` - at \`${at}\``);
  }
  return value;
}

function string(value: unknown, at: string): string {
  if (typeof value !== "string") {
    throw new DecodeError(`Expected \`str\`, got \`${typeName(value)}\` - at \`${at}\``);
  }
  return value;
}

function stringMap(value: unknown, at: string): Record<string, string> {
  const obj = new Reader(value, at).object();
  for (const [key, item] of Object.entries(obj)) {
    if (typeof item !== "string") {
      throw new DecodeError(`Expected \`str\`, got \`${typeName(item)}\` - at \`${at}[...]\` (${key})`);
    }
  }
  return { ...(obj as Record<string, string>) };
}

/**
 * The headers a task is published with: the envelope mirrored for tools that read only
 * headers, and `Nats-Msg-Id` = `message_id`, so that the stream drops a resend.
 */
export function taskHeaders(task: Task): Record<string, string> {
  const headers: Record<string, string> = {
    "Nats-Msg-Id": task.message_id,
    "Reach-Trace-Id": task.trace_id,
    "Reach-Priority": task.priority,
    "Reach-TTL": String(task.ttl_ms),
    "Reach-Kind": "task",
  };
  if (task.reply_to) headers["Reach-Reply-To"] = task.reply_to;
  if (task.traceparent) headers.traceparent = task.traceparent;
  return headers;
}

/** A fresh UUIDv7 (RFC 9562): sorts by creation time, unique without coordination. */
export function newId(): string {
  return uuid7(Date.now(), randomBytes(10));
}

/**
 * A UUIDv7 with time `timestampMs` whose random bits come from `parts`: the same
 * broker message gets the same id on every redelivery, so dedup downstream holds.
 */
export function stableId(timestampMs: number, ...parts: Array<string | number>): string {
  const digest = createHash("sha256").update(JSON.stringify(parts)).digest();
  return uuid7(timestampMs, digest.subarray(0, 10));
}

/**
 * The message id of the sub-task `key` that `sender` (an agent) sends for message `parentId`
 * (created at `createdAtMs`, the parent envelope's `created_at`): a UUIDv7 with that time whose
 * random bits are the first 80 of the SHA-256 of `reach-sub-task`, `parentId`, `sender` and
 * `key`, NUL-separated, laid out as the Python SDK's `envelopes.sub_task_id` (the 12 bits after
 * the version are the digest's first 12, the 62 after the variant its last 62). The handler run
 * again by the same agent sends its sub-tasks under the same ids, so each runs once; another
 * agent the parent moves to sends its own.
 */
export function subTaskId(parentId: string, createdAtMs: number, sender: string, key: string): string {
  const digest = createHash("sha256").update(["reach-sub-task", parentId, sender, key].join("\u0000")).digest();
  const rand = BigInt(`0x${digest.subarray(0, 10).toString("hex")}`);
  const ms = BigInt(Math.max(0, Math.floor(createdAtMs))) & ((1n << 48n) - 1n);
  const value =
    (ms << 80n) | (0x7n << 76n) | (((rand >> 68n) & 0xfffn) << 64n) | (0b10n << 62n) | (rand & ((1n << 62n) - 1n));
  const hex = value.toString(16).padStart(32, "0");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

function uuid7(unixMs: number, rand: Uint8Array): string {
  const bytes = new Uint8Array(16);
  let ms = BigInt(Math.max(0, Math.floor(unixMs)));
  for (let i = 5; i >= 0; i--) {
    bytes[i] = Number(ms & 0xffn);
    ms >>= 8n;
  }
  bytes.set(rand.subarray(0, 10), 6);
  bytes[6] = 0x70 | (bytes[6]! & 0x0f); // version 7
  bytes[8] = 0x80 | (bytes[8]! & 0x3f); // variant 10
  const hex = Buffer.from(bytes).toString("hex");
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20)}`;
}

/** Milliseconds since the epoch on this process's clock. */
export function nowMs(): number {
  return Date.now();
}
