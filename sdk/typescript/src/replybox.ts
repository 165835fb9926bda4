/**
 * A caller's reply box: the replies to one task, kept only when they come from whom they
 * should (docs/caller.md §6.3).
 *
 * Each reply arrives on `<box>.<sender>`; the sender token is unforgeable under permissions.
 * The coordinator (`_coordinator`) announces which agent has each attempt with a `routed`
 * notice, and may answer itself (a refusal, a stored result); an agent's reply counts only
 * when that agent has the attempt and its body says it is that agent. Anything else is
 * dropped (and logged), so a forged result never reaches the caller.
 */

import { decodeJson } from "./codec.js";
import type { Logger } from "./log.js";
import { COORDINATOR } from "./names.js";
import type { Ack, ErrorReply, PayloadRef, Progress, Reply, Result, Routed } from "./types.js";

/** What waiting for the next reply ended with, besides a reply. */
export type Wake = "timeout" | "aborted" | "closed";

export class ReplyBox {
  private readonly routed = new Map<number, string>(); // attempt → the agent that has it
  private early: Array<[string, Reply]> = []; // agent replies before their notice
  private readonly kept: Reply[] = [];
  private closed = false;
  private wake: (() => void) | null = null;

  constructor(
    readonly subject: string,
    private readonly messageId: string,
    private readonly log: Logger,
  ) {}

  get wildcard(): string {
    return `${this.subject}.*`;
  }

  /** One message that arrived on `<box>.<sender>`. */
  collect(subject: string, data: Uint8Array): void {
    const sender = subject.slice(subject.lastIndexOf(".") + 1);
    const reply = decodeReply(data);
    if (reply === null) {
      this.log.warn("unreadable reply dropped", { sender, subject });
      return;
    }
    if (reply.message_id !== this.messageId) return; // not about this task
    if (sender === COORDINATOR) {
      if (reply.kind === "routed") {
        this.routed.set(reply.attempt, reply.agent_id);
        this.release(reply.agent_id);
      } else {
        this.keep(reply);
      }
      return;
    }
    if (reply.kind === "routed" || reply.from_agent !== sender) {
      this.log.warn("reply claiming another sender dropped", { sender, subject });
      return;
    }
    if (this.routed.get(reply.attempt) === sender) this.keep(reply);
    else this.early.push([sender, reply]);
  }

  /** The client closed: the wait ends now, not at its deadline. */
  close(): void {
    this.closed = true;
    this.wake?.();
  }

  /**
   * The next reply that counts; or why none came: `untilMs` (on `performance.now()`) passed,
   * `signal` was aborted, or the client closed.
   */
  async next(untilMs: number, signal?: AbortSignal): Promise<Reply | Wake> {
    for (;;) {
      const reply = this.kept.shift();
      if (reply !== undefined) return reply;
      if (this.closed) return "closed";
      if (signal?.aborted) return "aborted";
      const leftMs = untilMs - performance.now();
      if (leftMs <= 0) return "timeout";
      await new Promise<void>((resolve) => {
        const timer = setTimeout(done, leftMs);
        signal?.addEventListener("abort", done, { once: true });
        this.wake = done;
        function done(): void {
          clearTimeout(timer);
          signal?.removeEventListener("abort", done);
          resolve();
        }
      });
      this.wake = null;
    }
  }

  private keep(reply: Reply | Routed): void {
    if (reply.kind === "routed") return;
    this.kept.push(reply);
    this.wake?.();
  }

  /** Replies that came before the notice naming their agent count now. */
  private release(agentId: string): void {
    const waiting: Array<[string, Reply]> = [];
    for (const [sender, reply] of this.early) {
      if (sender === agentId && this.routed.get(reply.attempt) === sender) this.keep(reply);
      else waiting.push([sender, reply]);
    }
    this.early = waiting;
  }
}

/**
 * A reply or routed notice, with the defaults of absent fields filled in; null when it is
 * not one (unknown fields are ignored, as everywhere in the protocol).
 */
export function decodeReply(data: Uint8Array): Reply | Routed | null {
  let doc: unknown;
  try {
    doc = decodeJson(data);
  } catch {
    return null;
  }
  if (!isObject(doc) || typeof doc.message_id !== "string" || typeof doc.trace_id !== "string") return null;
  const attempt = doc.attempt ?? 1;
  if (typeof attempt !== "number" || !Number.isInteger(attempt) || attempt < 1) return null;
  const about = {
    v: 1 as const,
    message_id: doc.message_id,
    trace_id: doc.trace_id,
    topic: typeof doc.topic === "string" ? doc.topic : "",
    from_agent: typeof doc.from_agent === "string" ? doc.from_agent : null,
    to_agent: typeof doc.to_agent === "string" ? doc.to_agent : null,
    attempt,
    created_at: typeof doc.created_at === "number" ? doc.created_at : 0,
  };
  switch (doc.kind) {
    case "routed":
      return typeof doc.agent_id === "string" ? ({ kind: "routed", ...about, agent_id: doc.agent_id } satisfies Routed) : null;
    case "ack":
      return { kind: "ack", ...about, capacity: isObject(doc.capacity) ? (doc.capacity as unknown as Ack["capacity"]) : null } satisfies Ack;
    case "progress":
      return { kind: "progress", ...about, note: typeof doc.note === "string" ? doc.note : "" } satisfies Progress;
    case "result": {
      const ref = doc.result_ref ?? null;
      if (ref !== null && !isPayloadRef(ref)) return null;
      return { kind: "result", ...about, result: doc.result ?? null, result_ref: ref } satisfies Result;
    }
    case "error": {
      const error = doc.error;
      if (!isObject(error) || typeof error.type !== "string" || typeof error.message !== "string") return null;
      return {
        kind: "error",
        ...about,
        error: {
          type: error.type,
          message: error.message,
          retryable: typeof error.retryable === "boolean" ? error.retryable : true,
          retry_after_ms: typeof error.retry_after_ms === "number" ? error.retry_after_ms : null,
        },
        reason: typeof doc.reason === "string" ? doc.reason : null,
        ran: typeof doc.ran === "boolean" ? doc.ran : null,
        attempts: Number.isInteger(doc.attempts) ? (doc.attempts as number) : null,
      } satisfies ErrorReply;
    }
    default:
      return null;
  }
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

export function isPayloadRef(value: unknown): value is PayloadRef {
  return (
    isObject(value) &&
    typeof value.bucket === "string" &&
    typeof value.name === "string" &&
    typeof value.size === "number" &&
    typeof value.sha256 === "string"
  );
}
