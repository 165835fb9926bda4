/**
 * What an agent says about a task: replies to its `reply_to`, lifecycle events
 * on the events stream, and dead letters. Events and dead letters carry a
 * `Nats-Msg-Id`, so publishing one again after a crash is not recorded twice.
 */

import { encode, nowMs } from "./codec.js";
import type { Connection } from "./connection.js";
import type { AboutTask, DeadLetter, ErrorInfo, Event, Reply, Task } from "./types.js";

/** The fields every reply about `task` repeats; `from`/`to` are this agent and the sender. */
export function about(task: Task, agentId: string): AboutTask {
  return {
    v: 1,
    message_id: task.message_id,
    trace_id: task.trace_id,
    topic: task.topic,
    from_agent: agentId,
    to_agent: task.from_agent,
    attempt: task.attempt,
    created_at: nowMs(),
  };
}

/** An event about `task`; `detail` is free-form but its keys are fixed per event. */
export function eventFor(
  task: Task,
  event: string,
  agentId: string | null,
  detail: Record<string, unknown> = {},
  atMs: number = nowMs(),
): Event {
  return {
    kind: "event",
    v: 1,
    message_id: task.message_id,
    trace_id: task.trace_id,
    topic: task.topic,
    from_agent: null,
    to_agent: null,
    attempt: task.attempt,
    created_at: 0,
    event,
    agent_id: agentId,
    at_ms: atMs,
    detail,
  };
}

/** The dedup id of an event: one per (message, event, attempt); progress adds its time. */
export function eventMsgId(event: Event): string {
  const id = `${event.message_id}-${event.event}-${event.attempt}`;
  return event.event === "progress" ? `${id}-${event.at_ms}` : id;
}

/** Publish `event` to `<prefix>.event.<event>.<topic>.<trace_id>.<message_id>`. */
export async function emit(conn: Connection, event: Event): Promise<void> {
  const subject = conn.names.event(event.event, event.topic, event.trace_id, event.message_id);
  await conn.publish(subject, encode(event), { "Nats-Msg-Id": eventMsgId(event) });
}

/** Send an ack, progress, result or error to the task's `reply_to`, if it has one. */
export function reply(conn: Connection, task: Task, message: Reply): void {
  if (!task.reply_to) return;
  conn.publishCore(task.reply_to, encode(message), {
    "Reach-Trace-Id": task.trace_id,
    "Reach-Kind": message.kind,
  });
}

const HEADROOM = 4096; // for a dead letter's headers and framing under the max payload
const RAW_KEPT = 65_536; // characters of an oversized raw body a dead letter keeps

export interface DeadLetterFields {
  reason: string;
  messageId: string;
  traceId: string;
  topic: string;
  error: ErrorInfo;
  raw?: Uint8Array;
  headers?: Record<string, string>;
  task?: Task;
}

/**
 * Publish a dead letter to `<prefix>.dlq.<reason>.<topic>` and record a
 * `dead_lettered` event. The trace is left empty: an agent dead-letters only
 * what it could not decode, and such a message has no events of its own yet.
 */
export async function deadLetter(conn: Connection, fields: DeadLetterFields): Promise<DeadLetter> {
  let letter: DeadLetter = {
    kind: "dead_letter",
    v: 1,
    reason: fields.reason,
    message_id: fields.messageId,
    trace_id: fields.traceId,
    topic: fields.topic,
    attempts: fields.task?.attempt ?? 0,
    envelope: fields.task ?? null,
    raw: fields.raw === undefined ? null : printable(fields.raw),
    headers: fields.headers ?? {},
    error: fields.error,
    trace: [],
    at_ms: nowMs(),
    state: null,
    truncated: false,
  };
  let data = encode(letter);
  if (data.length > conn.maxPayload - HEADROOM) {
    // Too large to publish (a body near the limit, plus the letter around it): cut the raw
    // body, then the task's payload, and say so.
    const raw = letter.raw === null ? null : `${letter.raw.slice(0, RAW_KEPT)}…`;
    const envelope = letter.envelope === null ? null : { ...letter.envelope, payload: null };
    letter = { ...letter, raw, envelope, truncated: true };
    data = encode(letter);
  }
  await conn.publish(conn.names.dlq(fields.reason, fields.topic), data, {
    "Nats-Msg-Id": `dlq-${fields.messageId}`,
    "Reach-Trace-Id": fields.traceId,
  });
  const regarding = fields.task ?? ({
    message_id: fields.messageId,
    trace_id: fields.traceId,
    topic: fields.topic,
    attempt: 1,
  } as Task);
  const detail = { reason: fields.reason, error: fields.error };
  await emit(conn, eventFor(regarding, "dead_lettered", null, detail, letter.at_ms));
  return letter;
}

/** The body as text, or `base64:` + base64 when it is not UTF-8. */
function printable(raw: Uint8Array): string {
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(raw);
  } catch {
    return `base64:${Buffer.from(raw).toString("base64")}`;
  }
}
