/** What a handler gets besides its payload: the envelope, the clock, a way to report. */

import { performance } from "node:perf_hooks";

import { nowMs, subTaskId } from "./codec.js";
import type { Deadline } from "./deadline.js";
import { InvalidArgument } from "./errors.js";
import { onlyKnown, SUB_INVOKE_OPTIONS, SUB_TASK_OPTIONS } from "./options.js";
import { child } from "./tracecontext.js";
import type { Priority, Task } from "./types.js";

export interface ContextHooks {
  progress(note: string): Promise<void>;
  submit(task: Task): Promise<void>;
  /** Send a sub-task as this agent and wait for its result (its budget holds the deadlines). */
  invoke?(task: Task, signal: AbortSignal): Promise<unknown>;
}

/** What a sub-task carries besides its topic and payload. */
export interface SubTaskOptions {
  /** Its priority (default: this task's). */
  priority?: Priority;
  /**
   * What its id is derived from with this task's (default: its place among the sub-tasks this
   * run made, "1", "2", …): a handler run again sends it under the same id, and it runs once.
   */
  key?: string;
}

/** What `ctx.invoke` takes: a sub-task's options, and how long it may wait to be accepted. */
export interface SubInvokeOptions extends SubTaskOptions {
  /** Default: all the time this handler has left. */
  ackDeadlineMs?: number;
}

/**
 * The task being handled, its remaining time, progress reporting, and
 * `signal`, aborted when the deadline passes (a promise cannot be cancelled
 * from outside, so a handler that does long work should pass it on or check it).
 * The deadline is the intent's `deadlineMs`, restarted by each `progress()`, never
 * past the task's execute budget.
 */
export class TaskContext {
  readonly envelope: Task;
  readonly agentId: string;
  readonly signal: AbortSignal;
  private children = 0; // sub-tasks made so far: the next one's default key

  constructor(
    envelope: Task,
    agentId: string,
    private readonly deadline: Deadline,
    signal: AbortSignal,
    private readonly hooks: ContextHooks,
    /**
     * A run of this very attempt began before and did not finish (its process was
     * killed, or it stalled past its lease): what it did may have happened already.
     */
    readonly resumed = false,
  ) {
    this.envelope = envelope;
    this.agentId = agentId;
    this.signal = signal;
  }

  /** The handler's deadline in ms after its start (progress may move it later). */
  get deadlineMs(): number {
    return this.deadline.totalMs;
  }

  get messageId(): string {
    return this.envelope.message_id;
  }

  get traceId(): string {
    return this.envelope.trace_id;
  }

  get topic(): string {
    return this.envelope.topic;
  }

  get attempt(): number {
    return this.envelope.attempt;
  }

  /** The W3C `traceparent` of this hop (null when the caller sent none), to join its trace. */
  get traceparent(): string | null {
    return this.envelope.traceparent ?? null;
  }

  /** Milliseconds since the handler started. */
  elapsedMs(): number {
    return Math.floor(performance.now() - this.deadline.started);
  }

  /** Milliseconds left before this handler's deadline (never negative). */
  remainingMs(): number {
    return this.deadline.leftMs();
  }

  /**
   * Tell the sender the task is still being worked on: this keeps the message from
   * redelivery, and gives the handler its intent's deadline again (within the task's
   * execute budget), its claim extended to match.
   */
  progress(note = ""): Promise<void> {
    return this.hooks.progress(note);
  }

  /**
   * Send a task to another agent in the same trace, passing on the budget that is left; nobody
   * waits for its result. Its id is derived from this task's and `key` (see `childTask`).
   */
  async publish(topic: string, payload: unknown, options: SubTaskOptions = {}): Promise<Task> {
    const task = this.childTask(topic, payload, options);
    await this.hooks.submit(task);
    return task;
  }

  /**
   * Send a sub-task and wait for its result within the time this handler has left, as this
   * agent: `ReachClient.invoke` (its errors), in the same trace, at this task's priority unless
   * given, its ttl and execute budget what is left of this handler's deadline. Its id is derived
   * from this task's and `key`: this handler run again (redelivered after a crash, retried)
   * attaches to the sub-task sent before and hears how it ended instead of running it twice; one
   * that failed fails the same way again (put `ctx.attempt` in `key` to try it anew). Stops
   * waiting when `ctx.signal` aborts (InvokeAborted). `ackDeadlineMs`: how long it may wait to
   * be accepted (default: all the time left). A handler that lets such an error through fails as
   * `sub_task_failed`, which does not count against this agent's health.
   */
  async invoke<R = unknown>(topic: string, payload: unknown, options: SubInvokeOptions = {}): Promise<R> {
    if (this.hooks.invoke === undefined) throw new Error("this TaskContext cannot invoke (made outside an agent)");
    onlyKnown(`sub-task '${topic}'`, options, SUB_INVOKE_OPTIONS, (m) => new InvalidArgument(m, "options"));
    const { ackDeadlineMs, ...subTaskOptions } = options;
    const task = this.childTask(topic, payload, subTaskOptions);
    // By default it may wait to be accepted all the time left: a busy agent's queue is no
    // failure while there is time.
    const ackMs = Math.max(1, Math.min(ackDeadlineMs ?? task.ttl_ms, task.ttl_ms));
    return (await this.hooks.invoke({ ...task, budget: { ...task.budget, ack_ms: ackMs } }, this.signal)) as R;
  }

  /**
   * A task for another agent in the same trace, with the budget that is left. Its id is
   * `subTaskId` of this task's id, this agent's and `key`, by default its place among the
   * sub-tasks this run made ("1", "2", …): the same in every run of a handler that makes them in
   * the same order, in this agent (another agent the task moves to sends its own).
   */
  childTask(topic: string, payload: unknown, options: SubTaskOptions = {}): Task {
    onlyKnown(`sub-task '${topic}'`, options, SUB_TASK_OPTIONS, (m) => new InvalidArgument(m, "options"));
    this.children += 1;
    const remaining = Math.max(1, this.remainingMs());
    const parent = this.envelope;
    const messageId = subTaskId(parent.message_id, parent.created_at ?? 0, this.agentId, options.key ?? String(this.children));
    return {
      kind: "task",
      v: 1,
      message_id: messageId,
      trace_id: this.traceId,
      topic,
      payload,
      from_agent: this.agentId,
      to_agent: null,
      attempt: 1,
      created_at: nowMs(),
      ttl_ms: remaining,
      reply_to: null,
      priority: options.priority ?? this.envelope.priority,
      budget: { ...this.envelope.budget, execute_ms: Math.min(this.envelope.budget.execute_ms, remaining) },
      replay_of: null,
      replays: 0, // a sub-task is a first sending, whatever led to its parent
      requeued: 0,
      caller: null, // the coordinator sets it from the subject: this agent
      headers: {},
      received_ms: 0, // the coordinator's intake sets it
      traceparent: child(this.envelope.traceparent, messageId),
      payload_ref: null,
      resolution: null,
    };
  }
}
