/**
 * Waiting for an invoked task's end: its replies as they come, and its recorded events when
 * the replies may have been lost (docs/caller.md §8.1, the policy of the Python ReachClient).
 *
 * Wait `ack_ms` for the first `ack` (else read the trace: an `accepted` event there means
 * the ack was lost, and the wait goes on), then `execute_ms` + 1 s from that first ack, then
 * the trace once more. After a reconnect, or once a reply is known lost, the trace is read
 * every second as well.
 */

import type { Connection } from "./connection.js";
import { COORDINATOR_SILENT, NO_COORDINATOR } from "./coordinatorstatus.js";
import { checkSameRequest, endingOf, OthersMessage } from "./endings.js";
import type { Ended, Traces } from "./endings.js";
import {
  DeadlineExceeded,
  InvokeAborted,
  InvokeError,
  NotAcknowledged,
  Rejected,
  REJECTION_TYPES,
  TaskFailed,
} from "./errors.js";
import type { MessageIds } from "./errors.js";
import type { ReplyBox } from "./replybox.js";
import type { Logger } from "./log.js";
import { sleep } from "./timing.js";
import type { Signal } from "./timing.js";
import type { Ack, ErrorInfo, Event, PayloadRef, Progress, Task } from "./types.js";

export const FIRST_PAUSE_MS = 50; // between two reads of an earlier message's events, doubling
export const LONGEST_PAUSE_MS = 1_000;
const RECHECK_MS = 1_000; // how often a wait looks for a reconnect, and then reads the events
const VERDICT_GRACE_MS = 1_000; // past the execute deadline, for the coordinator's verdict
const MIN_READ_MS = 1_000; // the least time a read of the events is given, at a deadline too

export type OnAck = (ack: Ack) => unknown; // awaited when it returns a promise
export type OnProgress = (progress: Progress) => unknown;

/** What the wait needs besides the task and its box. */
export interface Waiting {
  onAck?: OnAck | undefined;
  onProgress?: OnProgress | undefined;
  signal?: AbortSignal | undefined;
  /** Where a callback's own error is said (it is not thrown: see `callBack`). */
  log?: Logger | undefined;
}

/** A result, inline or where it is kept. */
export type Outcome = [result: unknown, ref: PayloadRef | null];

/** How a message ended, read from its events, for when its replies may have been lost. */
export class Ending {
  private readonly reconnectsAtStart: number;
  lost = false; // a reply is known lost (the events say what it would have said)
  graced = false; // the wait went past the execute deadline for a verdict
  events: Event[] = []; // as last read
  unread = ""; // why the last read of the events failed ("": it did not)

  constructor(
    private readonly conn: Connection,
    private readonly traces: Traces,
    private readonly messageId: string,
  ) {
    this.reconnectsAtStart = conn.reconnects;
  }

  /** Whether to read the events every second: since a reconnect, or a reply known lost. */
  polled(): boolean {
    return this.lost || this.conn.reconnects !== this.reconnectsAtStart;
  }

  /**
   * How it ended (null: not yet, or not read: `unread` says why), and whether an agent
   * accepted it. A read past `withinMs` is not read: with the server away each read waited
   * 5 s, and a wait ended 6 s past its deadline (a trial).
   */
  async read(withinMs?: number): Promise<[Ended | null, boolean]> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const late = new Promise<never>((_, reject) => {
      if (withinMs !== undefined) timer = setTimeout(() => reject(new Error(`no answer within ${withinMs} ms`)), withinMs);
    });
    try {
      const events = (this.events = await Promise.race([this.traces.of(this.messageId), late]));
      this.unread = "";
      return [endingOf(events), events.some((e) => e.event === "accepted")];
    } catch (err) {
      this.unread = err instanceof Error ? err.message : String(err);
      return [null, false]; // no answer, another caller's id: the replies decide
    } finally {
      clearTimeout(timer);
    }
  }

  /** Where the events last read leave a task no agent acknowledged, in words (`coordinatorAnswered`: just now). */
  whyUnacknowledged(coordinatorAnswered = true): string {
    const routed = this.events.filter((e) => e.event === "routed").at(-1);
    if (routed === undefined && !coordinatorAnswered) {
      // A stopped (SIGSTOP) or overloaded coordinator: the agents were blamed (a trial).
      return `not routed yet: ${COORDINATOR_SILENT}, or no agent serving it may take work now (\`reach agents\` says which)`;
    }
    if (routed === undefined) {
      return "not routed yet: no agent serving it may take work now (`reach agents` says which), or tasks stored before it wait first";
    }
    return `it waits in the queue of '${routed.agent_id}' (attempt ${routed.attempt}), which has not taken it: all its places are busy, it stopped taking work, or it is cut off from NATS`;
  }
}

export async function waitForResult(task: Task, box: ReplyBox, ending: Ending, waiting: Waiting): Promise<Outcome> {
  const ids = idsOf(task);
  const ackBy = performance.now() + task.budget.ack_ms;
  // Once accepted, the execute budget from the latest ack (a retry's) and at least the ttl:
  // a workflow is acknowledged at once and lives for its ttl.
  const livesUntil = performance.now() + task.ttl_ms;
  const executedBy = () => Math.max(performance.now() + task.budget.execute_ms, livesUntil);
  let doneBy: number | null = null;
  for (;;) {
    const deadline: number = doneBy ?? ackBy;
    // Woken every second, not only at the deadline: a reconnect during a wait (which may
    // last the whole ttl) must start the reads of the events within a second of it.
    const reply = await box.next(Math.min(deadline, performance.now() + RECHECK_MS), waiting.signal);
    if (reply === "aborted") throw aborted(task, waiting.signal);
    if (reply === "closed") throw new InvokeError(`the client was closed while '${task.topic}' ran`, ids);
    if (reply === "timeout") {
      if (performance.now() < deadline && !ending.polled()) continue; // the replies still tell it all
      const [ended, accepted] = await ending.read(Math.max(MIN_READ_MS, deadline - performance.now()));
      if (waiting.signal?.aborted) throw aborted(task, waiting.signal);
      if (ended !== null) return outcomeOf(ended, ids, accepted || doneBy !== null);
      if (accepted && doneBy === null) {
        // Its ack was lost: the execute budget runs.
        doneBy = executedBy();
        ending.lost = true;
        continue;
      }
      if (performance.now() < deadline) continue;
      if (doneBy !== null && !ending.graced) {
        // The coordinator's verdict at the same deadline (expired) is a moment behind.
        ending.graced = true;
        doneBy = deadline + VERDICT_GRACE_MS;
        continue;
      }
      if (doneBy === null) {
        throw new NotAcknowledged(`no agent acknowledged '${task.topic}' within ${task.budget.ack_ms} ms`, ids);
      }
      const unread = ending.unread ? ` (its events could not be read: ${ending.unread})` : "";
      throw new DeadlineExceeded(
        `'${task.topic}' did not complete within ${task.budget.execute_ms} ms nor its ttl of ${task.ttl_ms} ms${unread}; it may still complete: invoke again with messageId '${task.message_id}' to hear how it ends`,
        ids,
      );
    }
    switch (reply.kind) {
      case "ack":
        // Each attempt's budget runs from its own ack: a retry accepted just before the ttl
        // ends runs past it, and the coordinator's verdict comes after.
        if (doneBy === null || executedBy() > doneBy) [doneBy, ending.graced] = [executedBy(), false];
        await callBack(waiting.onAck, reply, waiting.log);
        break;
      case "progress":
        await callBack(waiting.onProgress, reply, waiting.log);
        break;
      case "result":
        return [reply.result, reply.result_ref];
      case "error": {
        // A workflow says whether it dispatched a step: its own ack (the instance was
        // created) tells nothing of that, and no agent accepts the workflow itself.
        const counted = { attempt: reply.attempt, attempts: reply.attempts };
        if (reply.ran !== null) throw failure(reply.error, reply.reason, ids, reply.ran, counted);
        let ran = doneBy !== null; // acknowledged: a handler took it
        if (!ran && afterAnAttempt(reply.error, reply.attempt)) ran = (await ending.read())[1]; // its ack may be lost
        throw failure(reply.error, reply.reason, ids, ran, counted);
      }
    }
  }
}

/**
 * The result `ended` holds, or its error thrown; `ran`: an agent accepted the task (what the
 * ending itself says of that, a workflow's, comes first).
 */
export function outcomeOf(ended: Ended, ids: MessageIds, ran: boolean): Outcome {
  if (ended.kind === "error") throw failure(ended.error, ended.reason, ids, ended.ran ?? ran, ended);
  return [ended.result, ended.resultRef];
}

/**
 * Rejected for a refusal before any agent accepted the task (nothing ran, so sending it
 * again is safe); TaskFailed for a handler's failure, and for a refusal that came after an
 * attempt ran (a retry refused by its breaker, a ttl out between retries).
 */
export function failure(
  error: ErrorInfo,
  reason: string | null,
  ids: MessageIds,
  ran: boolean,
  counted: { attempt: number | null; attempts: number | null } = { attempt: null, attempts: null },
): TaskFailed {
  const refused = REJECTION_TYPES.has(error.type) && !ran;
  return new (refused ? Rejected : TaskFailed)(error, reason, ids, counted.attempt, counted.attempts);
}

/** The end of a message the stream held already, for a resend under its id (§9). */
export function othersMessage(err: OthersMessage, ids: MessageIds): Rejected {
  const error = { type: "duplicate_id", message: `${err.message}: send it under an id of your own`, retryable: false, retry_after_ms: null };
  return new Rejected(error, "duplicate_id", ids);
}

export function aborted(task: Task, signal: AbortSignal | undefined, sent = true): InvokeAborted {
  const ids = idsOf(task);
  const what = sent ? "stopped waiting for" : "did not send";
  const then = sent ? "the task goes on" : "it was aborted before the call: nothing runs";
  return new InvokeAborted(`${what} '${task.topic}': the signal was aborted (${then})`, ids, {
    cause: signal?.reason,
  });
}

export function idsOf(task: Task): MessageIds {
  return { messageId: task.message_id, traceId: task.trace_id };
}

/**
 * Whether a refusal may follow an attempt that ran: a retry's (attempt 2 on), or an expiry,
 * which also ends a task whose failed attempt leaves no time for the next.
 */
function afterAnAttempt(error: ErrorInfo, attempt: number): boolean {
  return REJECTION_TYPES.has(error.type) && (attempt > 1 || error.type === "expired");
}

/**
 * The end of the message taken in already under `task`'s id (the publish was a duplicate:
 * nobody answers this call's reply box), read from its events until it ends (§9).
 */
export async function earlierOutcome(traces: Traces, task: Task, signal: AbortSignal | undefined, closed: Signal): Promise<Outcome> {
  const ids = idsOf(task);
  const withinMs = task.budget.ack_ms + task.budget.execute_ms;
  const until = performance.now() + withinMs;
  for (let pause = FIRST_PAUSE_MS; ; pause = Math.min(pause * 2, LONGEST_PAUSE_MS)) {
    let events: Event[] | null; // null: nobody answered (asked again until the deadline)
    try {
      events = await traces.ofIfAnswered(task.message_id);
      if (events !== null) checkSameRequest(events, task.topic);
    } catch (err) {
      if (err instanceof OthersMessage) throw othersMessage(err, ids);
      throw new InvokeError(`could not read how message '${task.message_id}' ended: ${String(err)}`, ids, { cause: err });
    }
    const ended = events === null ? null : endingOf(events);
    if (ended !== null) return outcomeOf(ended, ids, events?.some((e) => e.event === "accepted") ?? false);
    const leftMs = until - performance.now();
    if (leftMs <= 0) {
      if (events === null) throw new NotAcknowledged(`message '${task.message_id}' (sent before): ${NO_COORDINATOR}; it is not known to have ended`, ids);
      throw new DeadlineExceeded(`message '${task.message_id}' was sent before and did not end within ${withinMs} ms`, ids);
    }
    // Nothing to await: the events are polled.
    await Promise.race([sleep(Math.min(pause, leftMs), signal), closed.wait()]);
    if (signal?.aborted) throw aborted(task, signal);
    if (closed.isSet) throw new InvokeError(`the client was closed while '${task.topic}' ran`, ids);
  }
}

/**
 * The caller's `onAck` / `onProgress`; what it throws is logged, not thrown: it aborted the
 * invoke, whose task ran on and completed, its result then nowhere (and a resend under a new
 * id runs the work twice).
 */
async function callBack<M extends Ack | Progress>(callback: ((message: M) => unknown) | undefined, message: M, log: Logger | undefined): Promise<void> {
  if (callback === undefined) return;
  try {
    await callback(message);
  } catch (err) {
    log?.error(`the invoke's ${message.kind} callback threw; it goes on`, { message_id: message.message_id, error: String(err) });
  }
}
