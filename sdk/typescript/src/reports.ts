/**
 * What an agent says about a task it executes: the ack, progress and result to the sender's
 * `reply_to`, and the lifecycle events (`accepted`, `progress`, `completed`, `failed`,
 * `expired`…) to the coordinator, each carrying back the grant of its dispatch. */

import type { JsMsg } from "nats";

import { nowMs, stableId } from "./codec.js";
import { fromHeaders, isBrokerError } from "./connection.js";
import type { Connection } from "./connection.js";
import type { DecodeError } from "./errors.js";
import { failure } from "./failures.js";
import { headersOf } from "./serveranswers.js";
import { about, emit, eventFor, reply, reportedRaw } from "./lifecycle.js";
import type { Logger } from "./log.js";
import type { Capacity, ErrorInfo, PayloadRef, Result, Task } from "./types.js";

/** The coordinator's proof, on a dispatch, that the attempt was given to this agent. */
const GRANT_HEADER = "Reach-Grant";

export class Reports {
  private readonly lastProgressAt = new Map<string, number>(); // message_id → at_ms of its last progress

  constructor(
    private readonly conn: Connection,
    private readonly agentId: string,
    private readonly log: Logger,
  ) {}

  /** The ack to the sender and `accepted` (with the broker time of the dispatch and this process's epoch) to all. */
  async accept(msg: JsMsg, task: Task, dispatchedMs: number, capacity: Capacity, epoch: number): Promise<void> {
    await reply(this.conn, task, { kind: "ack", ...about(task, this.agentId), capacity }, this.agentId);
    await this.say(msg, task, "accepted", { dispatched_at_ms: dispatchedMs, epoch });
  }

  /**
   * A report is news, not work: a server away for a moment must not fail the handler (its
   * work would be done again), which goes on and records its outcome when it can.
   */
  async progress(msg: JsMsg, task: Task, note: string): Promise<void> {
    // Progress events keep a rising at_ms per message: the order a reader sees.
    const last = this.lastProgressAt.get(task.message_id) ?? 0;
    const atMs = Math.max(nowMs(), last + 1);
    this.lastProgressAt.set(task.message_id, atMs);
    try {
      msg.working();
      await reply(this.conn, task, { kind: "progress", ...about(task, this.agentId), note }, this.agentId);
      await this.say(msg, task, "progress", { note }, atMs);
    } catch (err) {
      if (!isBrokerError(err)) throw err;
      this.log.warn("progress not reported", { message_id: task.message_id, error: String(err) });
    }
  }

  /** The task's run ended: its progress order is kept no longer. */
  forget(messageId: string): void {
    this.lastProgressAt.delete(messageId);
  }

  /**
   * Answer the sender, then tell the coordinator (the result is already recorded). A
   * claim-checked result travels as its reference: `result_ref` instead of `result`.
   */
  async complete(msg: JsMsg, task: Task, result: unknown, durationMs: number, ref: PayloadRef | null): Promise<void> {
    const answer: Result = { kind: "result", ...about(task, this.agentId), result: ref ? null : (result ?? null), result_ref: ref };
    await reply(this.conn, task, answer, this.agentId);
    const shown = ref ? { result_ref: ref } : { result: result ?? null };
    await this.say(msg, task, "completed", { ...shown, duration_ms: durationMs });
  }

  /** Tell the coordinator, which decides between retry and dead letter. */
  async report(msg: JsMsg, task: Task, event: "failed" | "expired", error: ErrorInfo, dispatchedMs: number): Promise<void> {
    await this.say(msg, task, event, { task, error, dispatched_at_ms: dispatchedMs });
  }

  /** An event about the task, as this agent, carrying the coordinator's grant back. */
  async say(msg: JsMsg, task: Task, event: string, detail: Record<string, unknown> = {}, atMs?: number): Promise<void> {
    const grant = msg.headers?.get(GRANT_HEADER);
    const withGrant = grant ? { ...detail, grant } : detail;
    await emit(this.conn, eventFor(task, event, this.agentId, withGrant, atMs), this.agentId);
  }

  /** A dispatch that is not a task: reported (its bytes, headers, why); the coordinator dead-letters it. */
  async undecodable(msg: JsMsg, err: DecodeError): Promise<void> {
    const info = msg.info;
    const messageId = stableId(Math.floor(info.timestampNanos / 1e6), info.stream, info.streamSequence);
    this.log.warn("undecodable dispatch", { subject: msg.subject, error: err.message });
    const stub = { message_id: messageId, trace_id: messageId, topic: "_invalid", attempt: 1 } as Task;
    const detail = {
      error: failure("invalid_envelope", err.message, false),
      ...reportedRaw(msg.data),
      headers: fromHeaders(headersOf(msg) ?? undefined),
    };
    await emit(this.conn, eventFor(stub, "failed", this.agentId, detail), this.agentId);
  }
}

/** How long a handler waits on one progress report: a server away must not hold it (each
 * report waited out the publish's retries: a 3 s job took 24 s, another ran past its budget). */
export const PROGRESS_WAIT_MS = 1_000;

/**
 * One run's progress reports (`report`: publish it, renew the claim): each waited for at most
 * PROGRESS_WAIT_MS, then left to finish on its way, one at a time (a report made while the one
 * before is still on its way is not made); none once the run ended or lost its claim (`end`):
 * a trace showed progress after the end (a promise left running by the handler, a paused
 * process that came back after a newer one had completed its task).
 */
export class Progressing {
  private onItsWay: Promise<unknown> | null = null;
  private ended = false;

  /** Make no report from now on. */
  end(): void {
    this.ended = true;
  }

  constructor(
    private readonly report: (note: string) => Promise<void>,
    private readonly log: Logger,
    private readonly messageId: string,
  ) {}

  async say(note: string): Promise<void> {
    if (this.ended || this.onItsWay !== null) return; // the server is slow or away: the one before is not there yet
    const failed = this.report(note).then(() => null, (err: unknown) => err ?? new Error("report failed"));
    this.onItsWay = failed;
    void failed.then(() => (this.onItsWay = null));
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<"late">((resolve) => (timer = setTimeout(() => resolve("late"), PROGRESS_WAIT_MS)));
    const first = await Promise.race([failed, late]);
    clearTimeout(timer);
    if (first === "late") {
      const ids = { message_id: this.messageId };
      this.log.warn("progress not reported yet; the handler goes on", { ...ids, wait_ms: PROGRESS_WAIT_MS });
      void failed.then((err) => err && this.log.warn("progress not reported", { ...ids, error: String(err) }));
    } else if (first !== null) {
      throw first; // a failure of its own (not the broker's) is the handler's
    }
  }
}
