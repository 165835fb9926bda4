/**
 * `ReachClient.result`: how a message this caller sent earlier ends (`publish`, an invoke that
 * gave up), read from its recorded events as the coordinator answers them; nothing is sent.
 */

import { NO_COORDINATOR } from "./coordinatorstatus.js";
import { endingOf, OthersMessage } from "./endings.js";
import type { Traces } from "./endings.js";
import { DeadlineExceeded, InvalidArgument, InvokeAborted, InvokeError, NotAcknowledged } from "./errors.js";
import { FIRST_PAUSE_MS, LONGEST_PAUSE_MS, outcomeOf } from "./invocation.js";
import type { Outcome } from "./invocation.js";
import { sleep } from "./timing.js";
import type { Signal } from "./timing.js";
import type { Event } from "./types.js";

/** What `ReachClient.status` takes. */
export interface StatusOptions {
  /** How long to wait for the coordinator's answer (default: the client's `requestTimeoutMs`). */
  timeoutMs?: number;
}

/** What `ReachClient.result` takes. */
export interface ResultOptions {
  /** How long to wait for the message to end (default 30 000). */
  timeoutMs?: number;
  /** Stop waiting (InvokeAborted); the message goes on. */
  signal?: AbortSignal;
}

/**
 * The outcome of `messageId`, read from its events until it ends, for up to `withinMs`
 * (asked again when nobody answers: a server or coordinator restarting); its failure thrown
 * as `invoke` throws it. DeadlineExceeded when it has not ended by then (or no event of it
 * is recorded), InvalidArgument for another caller's message, NotAcknowledged when still
 * nobody answered (no coordinator runs: the message is not known to have ended).
 */
export async function lookedUp(traces: Traces, messageId: string, withinMs: number, signal: AbortSignal | undefined, closed: Signal): Promise<Outcome> {
  const ids = { messageId, traceId: messageId };
  const until = performance.now() + withinMs;
  let seen = false;
  for (let pause = FIRST_PAUSE_MS; ; pause = Math.min(pause * 2, LONGEST_PAUSE_MS)) {
    const events = await eventsOf(traces, messageId);
    if (events !== null) {
      const ended = endingOf(events);
      if (ended !== null) return outcomeOf(ended, ids, events.some((e) => e.event === "accepted"));
      seen ||= events.length > 0;
    }
    const leftMs = until - performance.now();
    if (leftMs <= 0) {
      if (events === null) throw new NotAcknowledged(`message '${messageId}': ${NO_COORDINATOR}; it is not known to have ended`, ids);
      const why = seen
        ? `did not end within ${withinMs} ms (it may still: ask again)`
        : "has no recorded event (not sent by this caller, or before what REACH_EVENTS keeps)";
      throw new DeadlineExceeded(`message '${messageId}' ${why}`, ids);
    }
    // Nothing to await: the events are polled.
    await Promise.race([sleep(Math.min(pause, leftMs), signal), closed.wait()]);
    if (signal?.aborted) throw new InvokeAborted(`stopped waiting for message '${messageId}': the signal was aborted`, ids, { cause: signal.reason });
    if (closed.isSet) throw new InvokeError(`the client was closed while it waited for message '${messageId}'`, ids);
  }
}

/** Its events, or null when nobody answered. */
async function eventsOf(traces: Traces, messageId: string): Promise<Event[] | null> {
  const ids = { messageId, traceId: messageId };
  try {
    return await traces.ofIfAnswered(messageId);
  } catch (err) {
    if (err instanceof OthersMessage) throw new InvalidArgument(`messageId '${messageId}': ${err.message}`, "messageId");
    throw new InvokeError(`could not read how message '${messageId}' ended: ${String(err)}`, ids, { cause: err });
  }
}
