/**
 * How a message ended, as its recorded lifecycle events say (docs/caller.md §7): for when
 * its replies may have been lost (replies are core NATS messages: one sent while the
 * connection was down is gone), and for a resend under an id the stream holds already,
 * which nobody answers.
 */

import { ErrorCode } from "nats";
import type { NatsError } from "nats";

import { decodeJson, encode } from "./codec.js";
import type { Connection } from "./connection.js";
import { isPayloadRef } from "./replybox.js";
import type { ErrorInfo, Event, PayloadRef, TraceReply, TraceRequest } from "./types.js";

// A trace request nobody answered: none subscribed ("503"), or no answer in time.
const UNANSWERED = new Set<string>([ErrorCode.NoResponders, ErrorCode.Timeout, ErrorCode.Disconnect]);

/** A result (inline, or where it is kept), or the error and how the message ended. */
export type Ended =
  | { kind: "result"; result: unknown; resultRef: PayloadRef | null }
  // `ran`: whether its work began, when the ending says (a workflow's: it dispatched a step)
  // `attempts`: how many ran, as a dead letter's error reply says
  | { kind: "error"; error: ErrorInfo; reason: string | null; ran: boolean | null; attempt: number | null; attempts: number | null };

/** The first ending among `events` (one message's, oldest first), or null: not ended yet. */
export function endingOf(events: Event[]): Ended | null {
  for (const { event, detail = {}, attempt } of events) {
    const ran = typeof detail.ran === "boolean" ? detail.ran : null;
    const attempts = Number.isInteger(detail.attempts) ? (detail.attempts as number) : null;
    switch (event) {
      case "completed":
      case "workflow_completed": {
        const ref = detail.result_ref;
        return { kind: "result", result: detail.result ?? null, resultRef: isPayloadRef(ref) ? ref : null };
      }
      case "dead_lettered":
        return { kind: "error", error: errorOf(detail), reason: stringOr(detail.reason, null), ran, attempt: attempt ?? null, attempts };
      case "rejected": // a refusal that leaves no dead letter (a caller over its quota)
        return { kind: "error", error: errorOf(detail), reason: "refused", ran, attempt: attempt ?? null, attempts: null };
      case "workflow_failed":
        return { kind: "error", error: errorOf(detail), reason: stringOr(detail.reason, "workflow_failed"), ran, attempt: attempt ?? null, attempts: null };
      case "workflow_cancelled":
        return { kind: "error", error: errorOf(detail), reason: "cancelled", ran, attempt: attempt ?? null, attempts: null };
    }
  }
  return null;
}

/** The id is another caller's message: its end is not this caller's to hear. */
export class OthersMessage extends Error {
  override name = "OthersMessage";
}

/**
 * The id is this caller's earlier message of another request: the first attempt's `routed`
 * event says it was sent on another topic (`sent_topic`).
 */
export class ReusedId extends OthersMessage {
  override name = "ReusedId";
}

/**
 * Throws ReusedId when `events` (a message's, oldest first) are of a request sent on
 * another topic than `topic`; before its first `routed` event (a workflow's: its
 * `workflow_started`, whose topic is the workflow), and from a coordinator that does not
 * record the topic, nothing is compared. (The Python SDK also compares the payload's
 * SHA-256, `input.sha256`: it encodes JSON as the coordinator does, byte for byte.)
 */
export function checkSameRequest(events: Event[], topic: string): void {
  const first = events.find((e) => (e.event === "routed" && (e.attempt ?? 1) === 1) || e.event === "workflow_started");
  const sentTopic = first?.event === "workflow_started" ? first.topic : first?.detail?.sent_topic;
  // The topic it was routed on (a rule's, the resolution's) is the same request too.
  if (first === undefined || typeof sentTopic !== "string" || sentTopic === topic || first.topic === topic) return;
  throw new ReusedId(
    `message id '${first.message_id}' is of an earlier request of yours, which was sent on topic` +
      ` '${sentTopic}', this one on '${topic}': under this id it would only hear that request's outcome` +
      " (the stream drops a message id it has seen within its duplicate window)",
  );
}

/** The recorded events of a caller's own messages, asked of the coordinator. */
export class Traces {
  constructor(
    private readonly conn: Connection,
    private readonly caller: string,
  ) {}

  /**
   * The events of `messageId`, oldest first (an id that is no message of this caller's may
   * name a trace: only the events of that very message are kept). Throws OthersMessage when
   * the id is another caller's message.
   */
  async of(messageId: string, timeoutMs = this.conn.requestTimeoutMs): Promise<Event[]> {
    const reply = await this.ask(messageId, timeoutMs);
    if (reply.others) throw new OthersMessage(`message id '${messageId}' is another caller's message`);
    return reply.events.filter((e) => e.message_id === messageId);
  }

  /**
   * `of`, or null when nobody answered (no coordinator yet, a server restarting, the
   * connection away): for a loop that asks again until its own deadline.
   */
  async ofIfAnswered(messageId: string, timeoutMs = this.conn.requestTimeoutMs): Promise<Event[] | null> {
    try {
      return await this.of(messageId, timeoutMs);
    } catch (err) {
      if (UNANSWERED.has((err as NatsError | null)?.code ?? "")) return null;
      throw err;
    }
  }

  /** The coordinator's answer as it is: the events of the message, or else of the trace `id`. */
  async ask(id: string, timeoutMs = this.conn.requestTimeoutMs): Promise<TraceReply> {
    const subject = this.conn.names.traceRequest(this.caller);
    const request: TraceRequest = { message_id: id };
    const answer = await this.conn.nc.request(subject, encode(request), { timeout: timeoutMs });
    const reply = decodeJson(answer.data) as Partial<TraceReply>;
    return {
      events: reply.events ?? [],
      truncated: reply.truncated === true,
      others: reply.others === true,
      unrouted: reply.unrouted ?? [],
    };
  }
}

function errorOf(detail: Record<string, unknown>): ErrorInfo {
  const error = detail.error as Partial<ErrorInfo> | undefined;
  if (typeof error?.type === "string" && typeof error.message === "string") {
    return {
      type: error.type,
      message: error.message,
      retryable: typeof error.retryable === "boolean" ? error.retryable : true,
      retry_after_ms: typeof error.retry_after_ms === "number" ? error.retry_after_ms : null,
    };
  }
  const reason = stringOr(detail.reason, "failed");
  return { type: reason, message: `the message ended as ${reason}`, retryable: false, retry_after_ms: null };
}

function stringOr<T>(value: unknown, fallback: T): string | T {
  return typeof value === "string" ? value : fallback;
}
