/**
 * A caller's arguments checked by the envelope's own rules, before anything is sent: a task,
 * or an invoke's deadlines. A wrong one is named as the caller wrote it (`ackDeadlineMs`),
 * since the envelope's path (`$.budget.ack_ms`) is not what the caller typed.
 */

import { decodeBudget, decodeTask, encode, MAX_MS } from "./codec.js";
import { DecodeError, InvalidArgument } from "./errors.js";
import type { Budget, Task } from "./types.js";

const TOKEN_RULE = "use 1-128 letters, digits, '_' or '-': it becomes part of NATS subjects";
const MS_RULE = `whole milliseconds from 1 to ${MAX_MS}, a day`;
// What each field may hold, where the decoder's own words (a regular expression) say it badly.
const RULES: Record<string, string> = {
  message_id: TOKEN_RULE,
  trace_id: TOKEN_RULE,
  topic: TOKEN_RULE,
  priority: "use P0, P1 or P2",
  reply_to: "use a literal NATS subject, not a system one ($JS…, $SYS…)",
  headers: "names and values are strings",
  ttl_ms: MS_RULE,
  budget: MS_RULE,
  ack_ms: MS_RULE,
  execute_ms: MS_RULE,
  seek_ms: MS_RULE,
};

/** The wire names of a task's fields and the names a caller gives them. */
export const TASK_ARGUMENTS: Record<string, string> = {
  message_id: "messageId",
  trace_id: "traceId",
  ttl_ms: "ttlMs",
  reply_to: "replyTo",
};

/** The task `fields` make, validated as the coordinator will validate it. */
export function taskOf(fields: Record<string, unknown>, named: Record<string, string> = TASK_ARGUMENTS): Task {
  return checked(fields, named, decodeTask);
}

/** An invoke's deadlines as the task's budget. */
export function budgetOf(ackDeadlineMs: number, executeDeadlineMs: number): Budget {
  const fields = { ack_ms: ackDeadlineMs, execute_ms: executeDeadlineMs };
  return checked(fields, { ack_ms: "ackDeadlineMs", execute_ms: "executeDeadlineMs" }, decodeBudget);
}

function checked<T>(fields: Record<string, unknown>, named: Record<string, string>, decode: (data: Uint8Array) => T): T {
  const said = (field: string) => named[field] ?? field;
  for (const [field, value] of Object.entries(fields)) {
    const why = unencodable(value);
    if (why !== null) {
      const what = field === "payload" ? `payload of '${String(fields.topic)}'` : `${said(field)}=${shown(value)}`;
      throw new InvalidArgument(`${what} cannot be encoded as JSON: ${why}`, said(field));
    }
  }
  try {
    return decode(encode(fields));
  } catch (err) {
    if (!(err instanceof DecodeError)) throw err;
    throw wrong(fields, err, said);
  }
}

/** Why `value` has no JSON form (a BigInt, a cycle, a function), or null when it has one. */
function unencodable(value: unknown): string | null {
  if (value === undefined) return null; // left out: the field's default
  try {
    if (JSON.stringify(value) === undefined) return `a ${typeof value} has no JSON form`;
  } catch (err) {
    return String((err as Error)?.message ?? err);
  }
  return null;
}

/** `err` (about `$.budget.ack_ms`) told as the argument it came from. */
function wrong(fields: Record<string, unknown>, err: DecodeError, said: (field: string) => string): InvalidArgument {
  const match = / - at `\$\.?([^`]*)`/.exec(err.message);
  const field = (match?.[1] ?? "").split("[", 1)[0] ?? ""; // `headers[...]`: the field itself
  const argument = said(field);
  let reason = match === null ? err.message : err.message.slice(0, match.index);
  const rule = RULES[field.split(".").pop() ?? ""] ?? RULES[field.split(".", 1)[0] ?? ""];
  const given = shown(at(fields, field.split(".")));
  // The decoder's words for a fraction of a millisecond name types a caller never wrote.
  if (rule === MS_RULE && reason.startsWith("Expected `int`, got `float`")) {
    return new InvalidArgument(`${argument} must be a whole number of ms, got ${given}`, argument);
  }
  if (rule && reason.includes("matching regex")) reason = rule;
  else if (rule) reason = `${reason} (${rule})`;
  return new InvalidArgument(`${argument}=${given}: ${reason}`, argument);
}

function at(value: unknown, path: string[]): unknown {
  for (const part of path) {
    if (part === "") continue;
    value = typeof value === "object" && value !== null ? (value as Record<string, unknown>)[part] : undefined;
  }
  return value;
}

function shown(value: unknown): string {
  if (typeof value === "string") return `'${value}'`;
  if (typeof value === "bigint") return `${value}n`;
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}
