/**
 * Errors of the SDK.
 *
 * ReachError                root of everything this package throws
 * ├── AgentConfigError      an Agent or handler was declared wrongly (thrown at once)
 * ├── AgentIdInUse          another live process already serves this agent_id
 * ├── PermanentError        thrown by a handler: do not retry this task
 * ├── DecodeError           a record on the wire is not what the protocol says
 * ├── PayloadUnavailable    a claim-checked payload is gone or does not match its SHA-256
 * │                         (in claimcheck.ts)
 * ├── InvalidArgument       a ReachClient call got a wrong argument; nothing was sent
 * ├── ConnectError          no NATS server reached, or none named rightly (`cause`: why)
 * ├── UnknownWorkflow       cancelWorkflow()/signalWorkflow(): no instance of the caller's
 * ├── WorkflowActionRefused the coordinator did not act on a cancel or signal (`error`)
 * └── InvokeError           ReachClient.invoke() did not get a result (`messageId`, `traceId`)
 *     ├── NotProvisioned    no stream takes tasks on this server: nothing was sent
 *     ├── BacklogFull       the intake kept no room for the task for its whole ttl: not sent
 *     ├── NotStored         JetStream did not answer (a restart, an election): maybe stored
 *     ├── NotAcknowledged   no agent accepted the task within the ack deadline (it stays queued)
 *     ├── DeadlineExceeded  accepted, but no result within the execute deadline
 *     ├── InvokeAborted     the caller's AbortSignal fired (the task goes on)
 *     └── TaskFailed        it failed after an agent took it (`error`, `reason`)
 *         └── Rejected      refused before any agent took it: nothing ran
 */

import type { ErrorInfo } from "./types.js";

export class ReachError extends Error {
  override name = "ReachError";
}

/** An Agent, handler or option is wrong; the message names it. */
export class AgentConfigError extends ReachError {
  override name = "AgentConfigError";
}

/** Another live process answers for this agent_id, or registered it at the same moment. */
export class AgentIdInUse extends ReachError {
  override name = "AgentIdInUse";
}

/** Throw from a handler when trying again cannot help (bad input, business refusal). */
export class PermanentError extends ReachError {
  override name = "PermanentError";
}

/**
 * ReachClient.connect() reached no server, or an agent cannot start (a malformed server URL,
 * creds that cannot be read or are refused); the message names the servers or the file,
 * `cause` the client's error.
 */
export class ConnectError extends ReachError {
  override name = "ConnectError";
}

/** A record could not be decoded; the message ends with the JSON path at fault. */
export class DecodeError extends ReachError {
  override name = "DecodeError";
}

/**
 * An argument of a ReachClient call breaks the envelope's rules, or its payload has no JSON
 * form; `argument` is its name as the caller wrote it, and the message starts with it
 * (`ttlMs=0: …`). Thrown before anything is sent.
 */
export class InvalidArgument extends ReachError {
  override name = "InvalidArgument";
  constructor(
    message: string,
    readonly argument: string,
  ) {
    super(message);
  }
}

/** cancelWorkflow(): no workflow instance of that id among the caller's own messages. */
export class UnknownWorkflow extends ReachError {
  override name = "UnknownWorkflow";
}

/**
 * cancelWorkflow() / signalWorkflow(): the coordinator did not act on it; `error` says why
 * (`rate_limited`: the caller is over its quota, which signals and cancels are charged to as
 * tasks are). Sending it again after `error.retry_after_ms` is safe: this one changed nothing.
 */
export class WorkflowActionRefused extends ReachError {
  override name = "WorkflowActionRefused";
  readonly error: ErrorInfo;
  readonly instanceId: string;

  constructor(message: string, error: ErrorInfo, instanceId: string) {
    super(message);
    this.error = error;
    this.instanceId = instanceId;
  }
}

/**
 * How a message ended without a result (an error reply's `reason`): the dead-letter reasons,
 * `refused` (no dead letter), `cancelled` (a workflow), `duplicate_id`; a routing rule's `dlq:`
 * may name another, hence the open string.
 */
export type TaskEnding =
  | "retries_exhausted"
  | "expired"
  | "rejected"
  | "no_route"
  | "invalid_envelope"
  | "workflow_failed"
  | "poison"
  | "refused"
  | "cancelled"
  | "duplicate_id"
  | (string & {});

/** The ids of the message an invocation is about: invoke again with `messageId` to re-attach. */
export interface MessageIds {
  messageId: string;
  traceId: string;
}

/** An invocation ended without a result. */
export class InvokeError extends ReachError {
  override name = "InvokeError";
  readonly messageId: string;
  readonly traceId: string;

  constructor(message: string, ids: MessageIds, options?: { cause?: unknown }) {
    super(message, options);
    this.messageId = ids.messageId;
    this.traceId = ids.traceId;
  }
}

/**
 * The task was not sent: the server has no stream that takes tasks (it is new, or was wiped,
 * and nobody ran `reach provision` or started a coordinator on it), or it has them under
 * another prefix. Nothing runs; once provisioned, sending again is safe.
 */
export class NotProvisioned extends InvokeError {
  override name = "NotProvisioned";
}

/**
 * The task was not sent: for its whole ttl the intake held as many of this caller's tasks on
 * the topic as it keeps (`limits.tasks_per_subject`, 1,000 by default) that the coordinator
 * had not taken (publish and invoke wait for room until then: a flood goes at the pace its
 * tasks are taken). Nothing runs.
 */
export class BacklogFull extends InvokeError {
  override name = "BacklogFull";
}

/**
 * JetStream did not take the task within its election budget (15 s): the server restarts, the
 * stream's leader is being elected, most of a cluster's nodes are down. It may have been
 * stored (a write whose answer was lost): send it again with this error's `messageId`, which
 * the stream and the agents' run-once records keep one message, never under a new id.
 */
export class NotStored extends InvokeError {
  override name = "NotStored";
}

/**
 * No agent acknowledged the task within the ack deadline. The task is not withdrawn: it
 * stays queued and may still run, until its ttl runs out (the message says when no
 * coordinator runs to route it). To try again safely, invoke again with this error's
 * `messageId`: the new call attaches to the first message and answers with how it ends.
 * Never send a task that is not idempotent again under a new id: both could run.
 */
export class NotAcknowledged extends InvokeError {
  override name = "NotAcknowledged";
}

/**
 * The task was accepted but did not complete within the execute deadline. It may still
 * complete: invoke again with the same `messageId` to hear how it ends.
 */
export class DeadlineExceeded extends InvokeError {
  override name = "DeadlineExceeded";
}

/**
 * The `signal` given to invoke() was aborted (`cause` is its reason). Only the waiting
 * stopped: a task already sent goes on, and invoking again with `messageId` hears its end.
 */
export class InvokeAborted extends InvokeError {
  override name = "InvokeAborted";
}

/**
 * The task failed after an agent took it: `error` is what the agent reported or, when a
 * later attempt was refused (its breaker open, the ttl out between retries), that refusal.
 * `ending` is how the message ended, from the coordinator's error reply: the dead letter's
 * reason (`retries_exhausted`, `rejected`, `expired`, `no_route`, `invalid_envelope`, …),
 * `refused` for a refusal without a dead letter (a caller over its quota), `cancelled`,
 * `duplicate_id`; null from a coordinator too old to say. `attempt` is the attempt the
 * ending came at (3 for a task dead-lettered after its third failure); null when not known.
 * `attempts` is how many attempts ran, for an ending after attempts (a task moved off a gone
 * agent before it ran one is on a later `attempt` than it ran); null when not said.
 * A handler ran, so sending the task again under a new id may run it twice.
 */
export class TaskFailed extends InvokeError {
  override name = "TaskFailed";
  readonly error: ErrorInfo;
  readonly ending: TaskEnding | null;
  readonly attempt: number | null;
  readonly attempts: number | null;

  constructor(
    error: ErrorInfo,
    ending: TaskEnding | null,
    ids: MessageIds,
    attempt: number | null = null,
    attempts: number | null = null,
  ) {
    super(`${error.type}: ${error.message}`, ids);
    this.error = error;
    this.ending = ending;
    this.attempt = attempt;
    this.attempts = attempts;
  }

  /** The error's type: a handler's class name, or the coordinator's (`expired`, `no_route`, …). */
  get type(): string {
    return this.error.type;
  }

  /** Whether the same request, sent again as a new message, may succeed. */
  get retryable(): boolean {
    return this.error.retryable;
  }

  /** How long to wait before sending again, when the coordinator says (a caller quota). */
  get retryAfterMs(): number | null {
    return this.error.retry_after_ms ?? null;
  }
}

/**
 * The task was refused before any agent accepted it, so no handler ran (`type`: no_route,
 * expired, invalid_envelope, backpressure, rate_limited, circuit_open, too_large,
 * duplicate_id, priority_not_allowed). Sending it again is safe (after `retryAfterMs`, when
 * given). A refusal after an attempt ran is a TaskFailed instead. `reason` is the refusal's kind (`type`), as in
 * the Python SDK; `ending` says whether it left a dead letter (`refused` when it did not).
 */
export class Rejected extends TaskFailed {
  override name = "Rejected";

  /** Why it was refused: the error's type (`no_route`, `rate_limited`, …). */
  get reason(): string {
    return this.error.type;
  }
}

/** The error types that, before any agent accepted the task, mean that nothing ran. */
export const REJECTION_TYPES: ReadonlySet<string> = new Set([
  "no_route",
  "expired",
  "invalid_envelope",
  "backpressure",
  "rate_limited",
  "circuit_open",
  "too_large",
  "duplicate_id", // the message id is another caller's message
  "priority_not_allowed", // the caller may not send tasks of that priority
  "record_too_large", // a workflow's record: too large to start (when ran is false)
]);
