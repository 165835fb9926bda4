/** Why a task was not stored: the server refused it (a full backlog, no stream), or did not answer. */

import { ErrorCode } from "nats";
import type { NatsError } from "nats";

import { BacklogFull, InvokeError, NotProvisioned, NotStored, ReachError } from "./errors.js";
import type { Task } from "./types.js";

const SUBJECT_FULL = 10077; // JetStream: maximum messages per subject (or bytes, messages) exceeded

/** A write that failed otherwise: typed, with the ids to send it again under. */
export function notStored(err: unknown, task: Task): Error {
  if (err instanceof ReachError) return err;
  const ids = { messageId: task.message_id, traceId: task.trace_id };
  const code = (err as NatsError | null)?.code;
  if (code === ErrorCode.Timeout || code === "503") {
    const why = "JetStream did not answer within 15 s (a server restart, a leader election, most of a cluster down)";
    const how = `send it again with messageId ${task.message_id}: the stream and the agents keep it one message`;
    return new NotStored(`'${task.topic}' may not have been stored: ${why}; ${how}`, ids, { cause: err });
  }
  return new InvokeError(`'${task.topic}' was not sent: ${String(err)}`, ids, { cause: err });
}

/** The SDK's own error for a task the server did not take, or null for any other failure. */
export function refusedPublish(err: unknown, task: Task, subject: string, caller: string): InvokeError | null {
  const failure = err as NatsError | null;
  const ids = { messageId: task.message_id, traceId: task.trace_id };
  if (failure?.api_error?.err_code === SUBJECT_FULL) {
    const said = failure.api_error.description ?? ""; // one code for a full subject and a full stream
    const why = said.includes("per subject")
      ? `the intake held as many of '${caller}''s tasks on it as it keeps (limits.tasks_per_subject)`
      : `the intake was full (${said}; limits.tasks_bytes): no coordinator took tasks from it`;
    return new BacklogFull(`'${task.topic}' was not sent: ${why} for the task's whole ttl of ${task.ttl_ms} ms`, ids, { cause: err });
  }
  if (failure?.code === "503" && !failure.api_error) {
    // No responders: no stream listens on the subject.
    const how = "provision it with `reach provision --nats-url URL` (or start a coordinator on it, `reach coordinator`), with the same --prefix";
    return new NotProvisioned(`'${task.topic}' was not sent: no stream on this server takes '${subject}'; ${how}`, ids, { cause: err });
  }
  return null;
}
