/**
 * Executing one dispatched message, from receipt to acknowledgement: decode, check
 * the ttl, claim it (run once), accept it, run the handler within its deadline,
 * record and report the outcome. The coordinator hears `completed`, `failed` or
 * `expired` and decides between a retry and a dead letter; the sender gets its `ack`,
 * `progress` and `result` on its `reply_to`. */

import { performance } from "node:perf_hooks";
import type { JsMsg } from "nats";

import { decodeTask, encode, nowMs, taskHeaders } from "./codec.js";
import { isBrokerError, quietly } from "./connection.js";
import type { Connection } from "./connection.js";
import { TaskContext } from "./context.js";
import { DecodeError, PermanentError } from "./errors.js";
import { BUSY_POLL_MS, type Claimed, type Claims, type Hand, type Outcome } from "./claims.js";
import { PayloadUnavailable, type ClaimCheck } from "./claimcheck.js";
import { Deadline, LEASE_GRACE_MS } from "./deadline.js";
import { Recording } from "./drain.js";
import { DeadlineExceeded, errorInfo, failure, sendable, thrown, ttlPassedInQueue } from "./failures.js";
import type { Logger } from "./log.js";
import { ReachClient } from "./client.js";
import { Latencies } from "./slots.js";
import type { Room } from "./slots.js";
import { Progressing, Reports } from "./reports.js";
import { sleep } from "./timing.js";
import { headersOf, sentByServer } from "./serveranswers.js";
import type { Capacity, Task } from "./types.js";

const SEAL_HEADER = "Reach-Seal"; // copied into this agent's execution record of the attempt
const MOVED_ON = { type: "reassigned", message: "a later attempt ran here", retryable: true, retry_after_ms: null };
const FAILED_BEFORE = { type: "Error", message: "failed (its record says no more)", retryable: true, retry_after_ms: null };
/** Neither ack nor nak this delivery: another delivery of the message holds its claim and
 * runs it, or this process stopped before the handler ended (the task is delivered again). */
const LEAVE = Symbol("leave");

/** A handler: `(ctx, payload) => result`, sync or async. */
export type Handler<P = any, R = unknown> = (ctx: TaskContext, payload: P) => R | Promise<R>;

export interface HandlerSpec {
  topic: string;
  fn: Handler;
  version: string;
  capacity: number;
  deadlineMs: number | null;
  maxAttempts: number | null;
  description: string;
  examples: string[];
}

export interface ExecutorOptions {
  agentId: string;
  handlers: Map<string, HandlerSpec>;
  ackWaitMs: number;
  records: Claims;
  /** Reads claim-checked payloads, stows large results. */
  claimCheck: ClaimCheck;
  /** Where tasks run: a place of their handler, from acceptance to the handler's end. */
  room: Room;
  log: Logger;
}

export class Executor {
  readonly latency = new Latencies();
  private readonly agentId: string;
  private readonly handlers: Map<string, HandlerSpec>;
  private readonly ackWaitMs: number;
  private readonly records: Claims;
  private readonly claimCheck: ClaimCheck;
  private readonly room: Room;
  private readonly log: Logger;
  private readonly subTasks: ReachClient;
  private readonly aborts = new Set<AbortController>();
  readonly recording = new Recording(); // a stop waits for these outcomes (drain.ts)
  /** Set once the agent stops with handlers still running (their `ctx.signal` aborted). */
  private stoppedWith: Error | null = null;
  /** Deliveries a stop kept from their handlers, nak'd once no fetch is open (fetchesOver). */
  private readonly giveBack: JsMsg[] = [];
  private fetchesEnded = false;
  private readonly reports: Reports;

  constructor(
    private readonly conn: Connection,
    options: ExecutorOptions,
  ) {
    this.agentId = options.agentId;
    this.handlers = options.handlers;
    this.ackWaitMs = options.ackWaitMs;
    this.records = options.records;
    this.claimCheck = options.claimCheck;
    this.room = options.room;
    this.log = options.log;
    this.reports = new Reports(conn, options.agentId, options.log);
    this.subTasks = ReachClient.over(conn, options.agentId, options.log); // ctx.invoke, as this agent
  }

  /**
   * The fetches of a stopping agent have ended: the deliveries it kept from its handlers go
   * back to the queue now. A nak while a pull is still open is delivered straight back into
   * it (§16 step 1): five such turns dead-lettered a task that never ran.
   */
  fetchesOver(): void {
    this.fetchesEnded = true;
    for (const msg of this.giveBack.splice(0)) msg.nak(0);
  }

  /**
   * The agent stops: tell every running handler (through `ctx.signal`). A handler that fails
   * from now on failed for the stop, not for its task: that is not recorded, and its task is
   * delivered again (one that returns a result still has it recorded).
   */
  abortAll(reason: Error): void {
    this.stoppedWith = reason;
    for (const abort of this.aborts) abort.abort(reason);
  }

  /** Execute one dispatched message, then acknowledge it or hand it back for later. */
  async settle(msg: JsMsg): Promise<void> {
    let task: Task;
    try {
      const forged = sentByServer(msg.data, headersOf(msg), { headed: true }); // a stored message of someone's: no dispatch
      if (forged !== null) throw new DecodeError(`not a message of anyone's: ${forged}`);
      task = decodeTask(msg.data);
    } catch (err) {
      if (!(err instanceof DecodeError)) throw err;
      await this.reports.undecodable(msg, err);
      msg.ack();
      return;
    }
    let retryInMs: number | null | typeof LEAVE;
    try {
      retryInMs = await this.execute(msg, task);
    } catch (err) {
      if (!isBrokerError(err)) throw err;
      this.log.warn("task not settled (the server away?): it comes back", { message_id: task.message_id, error: String(err) });
      retryInMs = 1_000;
    }
    if (retryInMs === LEAVE) return; // another delivery settles it, or a later process
    if (retryInMs === null) msg.ack();
    else msg.nak(retryInMs);
  }

  /** Run `task` at most once; returns when to see it again, null when done, or LEAVE (see LEAVE). */
  private async execute(msg: JsMsg, task: Task): Promise<number | null | typeof LEAVE> {
    const agentId = this.agentId;
    const dispatchedMs = Math.floor(msg.info.timestampNanos / 1e6);
    const kept = this.records.unrecorded(task.message_id);
    if (kept !== undefined) {
      this.log.info("answering a redelivery from an outcome not yet recorded", { message_id: task.message_id });
      await this.conclude(msg, task, kept, dispatchedMs, true);
      return null;
    }
    const spec = this.handlers.get(task.topic);
    if (spec === undefined) {
      const error = failure("no_handler", `${agentId} does not serve '${task.topic}'`, false);
      await this.reports.report(msg, task, "failed", error, dispatchedMs);
      return null;
    }
    const leftMs = task.ttl_ms - (nowMs() - dispatchedMs);
    const entry = await this.room.enter(task, () => this.keepAlive(msg), leftMs);
    if (entry === "stopping") {
      this.log.info("stopping: a task that had not started goes back to the queue", { message_id: task.message_id });
      if (this.fetchesEnded) return 0;
      this.giveBack.push(msg);
      return LEAVE;
    }
    if (entry === "expired") {
      await this.expire(msg, task, dispatchedMs); // its ttl ran out waiting for its handler's place
      return null;
    }
    let inside = true;
    const leave = (running?: Promise<unknown>) => {
      if (inside) this.room.leaveAfter(task, running); // recording and reporting hold no place
      inside = false;
    };
    try {
      // In hand from before its claim until its outcome is recorded.
      return await this.records.holding(task.message_id, (hand) => this.executeInside(msg, task, spec, dispatchedMs, leave, hand));
    } finally {
      leave();
    }
  }

  /** The rest of `execute`, with a place of the task's handler taken (`leave` gives it back). */
  private async executeInside(
    msg: JsMsg,
    task: Task,
    spec: HandlerSpec,
    dispatchedMs: number,
    leave: (running?: Promise<unknown>) => void,
    hand: Hand,
  ): Promise<number | null | typeof LEAVE> {
    const kept = this.records.unrecorded(task.message_id); // another delivery may have run it meanwhile
    if (kept !== undefined) {
      leave();
      this.log.info("answering a redelivery from an outcome not yet recorded", { message_id: task.message_id });
      await this.conclude(msg, task, kept, dispatchedMs, true);
      return null;
    }
    // Looked at once in: a task that waited for its handler past its ttl is not run, unless it
    // runs here (a redelivery after an outage waits for that run: it said "no run finished").
    if (nowMs() - dispatchedMs >= task.ttl_ms && !this.records.runsHere(task.message_id)) {
      leave();
      await this.expire(msg, task, dispatchedMs);
      return null;
    }
    const windowMs = Math.min(spec.deadlineMs ?? task.budget.execute_ms, task.budget.execute_ms);
    // Acked while claiming (a round trip fewer); a duplicate done already answers from its record.
    const [claim] = await Promise.all([
      this.records.claimWhenFree(task, windowMs + LEASE_GRACE_MS, msg.headers?.get(SEAL_HEADER) || null, () => msg.working(), hand),
      this.reports.accept(msg, task, dispatchedMs, this.capacityFor(task), this.records.epoch),
    ]);
    if (claim.kind === "kept") {
      leave(); // the delivery it waited for ran it here; its outcome is not recorded yet
      this.log.info("answering from an outcome not yet recorded", { message_id: task.message_id });
      await this.conclude(msg, task, claim.outcome, dispatchedMs, true);
      return null;
    }
    if (claim.kind === "done") {
      leave();
      this.log.info("already executed; sending the stored result again", { message_id: task.message_id });
      await this.reports.complete(msg, task, claim.record.result, 0, claim.record.result_ref ?? null);
      return null;
    }
    if (claim.kind === "failed") {
      leave(); // this attempt ran here and failed (its report's ack was lost): said again, not run
      await this.reports.report(msg, task, "failed", claim.record.error ?? FAILED_BEFORE, dispatchedMs);
      return null;
    }
    if (claim.kind === "moved") {
      leave(); // reported: a move cut short after its fence is sent on from there (protocol §13)
      this.log.info("not run: liveness moved this attempt away while it waited here", { message_id: task.message_id });
      await this.reports.report(msg, task, "failed", claim.record.error ?? MOVED_ON, dispatchedMs);
      return null;
    }
    if (claim.kind === "expired") {
      leave(); // past its ttl by the coordinator's clock though not by ours: ours runs behind
      this.log.warn("not run: ended as expired already (is this host's clock behind?)", { message_id: task.message_id });
      await this.expire(msg, task, dispatchedMs);
      return null;
    }
    if (!(await this.leaseHolds(task, claim, windowMs + LEASE_GRACE_MS))) {
      this.log.warn("claim taken over while this delivery was accepted; the other one runs", { message_id: task.message_id });
      return LEAVE;
    }
    const outcome = await this.run(msg, task, spec, claim);
    leave(outcome.running);
    if (this.stoppedWith !== null && outcome.error !== undefined) {
      this.log.warn("the agent stopped before the handler ended: nothing recorded, the task is delivered again", {
        message_id: task.message_id,
        error: outcome.error.message,
      });
      return LEAVE;
    }
    await this.conclude(msg, task, outcome, dispatchedMs);
    return null;
  }

  /** How full this agent is for `task`'s topic, told to its sender with the ack. */
  private capacityFor(task: Task): Capacity {
    return { free_slots: this.room.freeFor(task), est_latency_ms: this.latency.of(task.topic) };
  }

  /** Say *in progress* on the delivery every half ack wait, until the returned function is called. */
  private keepAlive(msg: JsMsg): () => void {
    const keepalive = setInterval(() => quietly(() => msg.working()), Math.max(100, this.ackWaitMs / 2));
    return () => clearInterval(keepalive);
  }

  /**
   * Report the task expired, unless it ran here: a run of it in this process answers (one still
   * going is waited for: a redelivery after keep-alives lost to an outage; one whose outcome is
   * not recorded yet), as does its stored result (a redelivery of a message whose
   * acknowledgement was lost in a failover comes back after the ack wait, often past the ttl,
   * and the work it stands for is done; protocol §10.4).
   */
  private async expire(msg: JsMsg, task: Task, dispatchedMs: number): Promise<void> {
    while (this.records.runsHere(task.message_id)) {
      quietly(() => msg.working());
      await sleep(BUSY_POLL_MS);
    }
    const kept = this.records.unrecorded(task.message_id);
    if (kept !== undefined) {
      this.log.info("answering a redelivery from an outcome not yet recorded", { message_id: task.message_id });
      await this.conclude(msg, task, kept, dispatchedMs, true);
      return;
    }
    const done = await this.records.done(task);
    if (done !== null) {
      this.log.info("expired redelivery of a message done here; sending its stored result", { message_id: task.message_id });
      await this.reports.complete(msg, task, done.result, 0, done.result_ref ?? null);
      return;
    }
    const why = ttlPassedInQueue(task.ttl_ms, this.agentId, dispatchedMs, task.received_ms ?? 0, msg.info.deliveryCount);
    const error = failure("expired", why, false);
    await this.reports.report(msg, task, "expired", error, dispatchedMs);
  }

  /**
   * Claiming and accepting can wait out a leader election; if the lease ran down meanwhile, a
   * redelivery may have taken the message over (and runs it). Renew a lease that lost more
   * than half its grace; false when it was taken (protocol §10.6).
   */
  private async leaseHolds(task: Task, claim: Claimed, leaseMs: number): Promise<boolean> {
    if (claim.leaseUntilMs - nowMs() > leaseMs - LEASE_GRACE_MS / 2) return true;
    return this.records.renew(task, claim, leaseMs);
  }

  /** Record the outcome (it survives a broker outage meanwhile), then report it. */
  private async conclude(msg: JsMsg, task: Task, outcome: Outcome, dispatchedMs: number, again = false): Promise<void> {
    await this.recording.during(task.message_id, async (kept) => {
      const recorded = await this.records.record(task, outcome, () => quietly(() => msg.working()));
      kept();
      if (outcome.error !== undefined) {
        const { type, message } = outcome.error;
        if (!again) this.log.info("handler failed", { message_id: task.message_id, error_type: type, error: message }); // said once
        return this.reports.report(msg, task, "failed", outcome.error, dispatchedMs);
      }
      if (!recorded) {
        // Fenced: the task was reassigned while this ran; the new attempt answers.
        this.log.warn("late result rejected: the task was reassigned or ended meanwhile", { message_id: task.message_id });
        return this.reports.say(msg, task, "late_result_rejected");
      }
      await this.reports.complete(msg, task, outcome.result, outcome.durationMs, outcome.resultRef ?? null);
    });
  }

  /** Call the handler under its deadline, keeping the message from redelivery meanwhile. */
  private async run(msg: JsMsg, task: Task, spec: HandlerSpec, claim: Claimed): Promise<Outcome> {
    // A crashed run of this attempt spent part of the budget already (protocol §13).
    const budgetMs = task.budget.execute_ms - (claim.resumed ? Math.max(0, nowMs() - claim.startedMs) : 0);
    if (budgetMs <= 0) {
      const spent = `execute budget ${task.budget.execute_ms} ms of attempt ${task.attempt} spent: a run of it began at ${claim.startedMs} (epoch ms) and did not finish`;
      return { claim, error: failure("deadline_exceeded", spent, true), durationMs: 0 };
    }
    const abort = new AbortController();
    this.aborts.add(abort);
    const deadline = new Deadline(budgetMs, spec.deadlineMs);
    const progressing = new Progressing(async (note) => {
      await this.reports.progress(msg, task, note);
      if (await this.records.renew(task, claim, deadline.leaseMs())) return;
      this.log.warn("claim lost while running: this run's result will be refused", { message_id: task.message_id });
      progressing.end();
    }, this.log, task.message_id);
    const ctx = new TaskContext(task, this.agentId, deadline, abort.signal, {
      progress: async (note) => {
        const release = deadline.hold(); // the window starts again (at each end of the hold)
        try {
          await progressing.say(note);
        } finally {
          release();
        }
      },
      submit: (child) => this.submit(child),
      invoke: (child, signal) => this.subTasks.invokeTask(child, { signal }),
    }, claim.resumed);
    // A handler longer than the ack wait would be redelivered (and count towards max_deliver).
    const stopKeeping = this.keepAlive(msg);
    const started = performance.now();
    let handled: Promise<unknown> | undefined;
    try {
      const passed = new Promise<never>((_, reject) => {
        deadline.enforce(() => reject(new DeadlineExceeded(deadline.totalMs)));
      });
      // A claim-checked payload is fetched first, within the deadline (and inside the race,
      // so that a deadline passing meanwhile is never a rejection nobody handles).
      handled = Promise.resolve()
        .then(() => this.claimCheck.payloadOf(task))
        .then((payload) => spec.fn(ctx, payload));
      const returned = sendable(await Promise.race([handled, passed]));
      // Stowed before it is recorded: the record and the reply stay small.
      const [result, resultRef] = await this.claimCheck.stowResult(task, returned);
      const durationMs = Math.floor(performance.now() - started);
      this.latency.observe(task.topic, durationMs);
      return { claim, result, resultRef, durationMs };
    } catch (err) {
      if (err instanceof DeadlineExceeded) abort.abort(err); // a promise cannot be cancelled: tell it
      if (err instanceof PayloadUnavailable) {
        return { claim, error: failure("payload_unavailable", err.message, false), durationMs: 0 };
      }
      if (!(err instanceof DeadlineExceeded || err instanceof PermanentError)) {
        // Where it raised, for its author (a deadline's stack says nothing; a PermanentError is meant).
        this.log.warn("handler raised", { message_id: task.message_id, stack: err instanceof Error ? err.stack : thrown(err) });
      }
      return { claim, error: errorInfo(err), durationMs: 0, running: err instanceof DeadlineExceeded ? handled : undefined };
    } finally {
      deadline.clear();
      stopKeeping();
      progressing.end();
      this.aborts.delete(abort);
      this.reports.forget(task.message_id);
    }
  }

  /** A sub-task this agent sends, as itself (`reach.task.<topic>.<agent_id>`). */
  private async submit(task: Task): Promise<void> {
    await this.conn.publish(this.conn.names.task(task.topic, this.agentId), encode(task), taskHeaders(task));
  }
}
