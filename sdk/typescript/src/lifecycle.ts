/**
 * What an agent says about a task: replies to its `reply_to` and lifecycle events on the
 * events stream, always as itself (its id is the last token of every subject it publishes
 * to, which permissions make unforgeable). Events carry a `Nats-Msg-Id`, so publishing one
 * again after a crash is not recorded twice (progress, which comes many times, carries none).
 */

import { encode, nowMs } from "./codec.js";
import type { Connection } from "./connection.js";
import type { AboutTask, Event, Reply, Task } from "./types.js";

/** Events that come many times per attempt, each one counting: no dedup id. */
const REPEATABLE = new Set(["progress"]);

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
    caller: task.caller ?? null, // who sent the task: a caller reads its own traces by it
    priority: task.priority ?? "P1",
    received_ms: task.received_ms ?? 0, // the task's intake time on the broker's clock
  };
}

/**
 * The dedup id of an event: one per (message, event, attempt, sender), plus the epoch of an
 * `accepted` (one per process that takes the attempt), plus `-r<received_ms>` (one life of
 * the message id: sent again past the intake's duplicate window, its events are not copies of
 * the earlier life's), plus the first 16 characters of the dispatch's grant when it had one
 * (only the coordinator and this agent know it, so nobody can publish the id first); none for
 * progress.
 */
export function eventMsgId(event: Event, sender: string): string | null {
  if (REPEATABLE.has(event.event)) return null;
  let id = `${event.message_id}-${event.event}-${event.attempt}-${sender}`;
  const epoch = event.detail.epoch;
  if (event.event === "accepted" && typeof epoch === "number" && epoch > 0) id += `-${epoch}`; // each process taking the attempt is seen
  if ((event.received_ms ?? 0) > 0) id += `-r${event.received_ms}`;
  const grant = event.detail.grant;
  return typeof grant === "string" ? `${id}-${grant.slice(0, 16)}` : id;
}

/** Publish `event` as `sender` to `<prefix>.event.<event>.<topic>.<trace_id>.<message_id>.<sender>`. */
export async function emit(conn: Connection, event: Event, sender: string): Promise<void> {
  const subject = conn.names.event(event.event, event.topic, event.trace_id, event.message_id, sender);
  const msgId = eventMsgId(event, sender);
  await conn.publish(subject, encode(event), msgId === null ? {} : { "Nats-Msg-Id": msgId });
}

/**
 * Send an ack, progress or result to the task's `reply_to` (as `sender`), if it has one; a
 * workflow is sent only the result (protocol §11).
 */
export async function reply(conn: Connection, task: Task, message: Reply, sender: string): Promise<void> {
  if (!task.reply_to) return;
  const toWorkflow = conn.names.workflowReplies(task.reply_to);
  if (message.kind !== "result" && toWorkflow) return;
  const subject = conn.names.replySubject(task.reply_to, sender);
  const headers: Record<string, string> = { "Reach-Trace-Id": task.trace_id, "Reach-Kind": message.kind };
  if (toWorkflow) {
    // REACH_WORKFLOWS stores it: a JetStream publish, made again through a leader election
    // (a core publish was lost in one, and the instance waited for its deadline). No
    // Nats-Msg-Id: another agent of the workflow could store a predictable one first.
    await conn.publish(subject, encode(message), headers);
    return;
  }
  conn.publishCore(subject, encode(message), headers);
}

/** Characters of an undecodable body an agent's report keeps (the report must fit a message). */
export const RAW_KEPT = 65_536;

/** `raw` (and `truncated`) of a report of an undecodable dispatch: at most RAW_KEPT characters and "…". */
export function reportedRaw(data: Uint8Array): { raw: string; truncated?: true } {
  const raw = printable(data);
  if (raw.length <= RAW_KEPT) return { raw }; // UTF-16 units: no more code points than that
  // Cut by code points, as the Python SDK does: a cut inside a surrogate pair left half an
  // emoji, and the coordinator then refused the whole event as undecodable.
  const points = Array.from(raw);
  return points.length <= RAW_KEPT ? { raw } : { raw: `${points.slice(0, RAW_KEPT).join("")}…`, truncated: true };
}

/** The body as text, or `base64:` + base64 when it is not UTF-8. */
export function printable(raw: Uint8Array): string {
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(raw);
  } catch {
    return `base64:${Buffer.from(raw).toString("base64")}`;
  }
}
