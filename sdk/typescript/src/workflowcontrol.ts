/**
 * Acting on a workflow instance a caller started: cancelling it (`ReachClient.cancelWorkflow`)
 * and signalling it an event (`ReachClient.signalWorkflow`). A caller may not read the workflow
 * records, so it learns how its instance stands from the instance's events, before and after
 * it acts; the coordinator acts only on an instance that caller started (caller.md §8.3, §8.4).
 */

import { TOKEN } from "./codec.js";
import type { Connection } from "./connection.js";
import { DeadlineExceeded, InvalidArgument, UnknownWorkflow, WorkflowActionRefused } from "./errors.js";
import { sleep } from "./timing.js";
import type { ErrorInfo, Event } from "./types.js";

const ENDINGS: Record<string, WorkflowEnded["status"]> = {
  workflow_completed: "completed",
  workflow_failed: "failed",
  workflow_cancelled: "cancelled",
};
const POLL_MS = 200; // a caller's creds read events only through the coordinator: asked again
const CLOCKS_APART_MS = 1_000; // the coordinator's clock may be behind the caller's
/** How long a just-published instance may take to start (its task still in the intake). */
const START_GRACE_MS = 2_000;

type EventsOf = (messageId: string) => Promise<Event[]>;

/** What `ReachClient.cancelWorkflow` takes. */
export interface CancelWorkflowOptions {
  /** Added to the instance's error message (`cancelled by its caller '<you>': <why>`). */
  why?: string;
  /** How long to wait for the instance to end (default 10 000). */
  waitMs?: number;
}

/** What `ReachClient.signalWorkflow` takes. */
export interface SignalWorkflowOptions {
  /** How long to wait for the coordinator to say what became of the signal (default 10 000). */
  waitMs?: number;
}

/** How a workflow instance ended. */
export interface WorkflowEnded {
  instanceId: string;
  /** `cancelled`, or `completed` / `failed` when it ended otherwise first. */
  status: "cancelled" | "completed" | "failed";
  /** When, on the coordinator's clock. */
  atMs: number;
  /** It had ended before the cancel was sent (none was). */
  beforeCancel: boolean;
}

/**
 * What a state machine instance did with a signalled `event`: `taken` by its state `state`,
 * or not — then `waitsFor` names the events its state takes (empty: it waits for none), and
 * `ended` how the instance had ended, when it had (no signal was sent), or ended instead of
 * taking it (`failed`: the change outgrew its record, say).
 */
export interface SignalOutcome {
  instanceId: string;
  event: string;
  taken: boolean;
  state: string | null;
  waitsFor: string[];
  ended: WorkflowEnded["status"] | null;
}

async function ownInstance(caller: string, eventsOf: EventsOf, instanceId: string, waitMs: number) {
  const eventsNow = async () => (await eventsOf(instanceId)).filter((e) => e.message_id === instanceId);
  // A caller may act at once after its publish: its instance may not have started yet.
  const until = performance.now() + Math.min(waitMs, START_GRACE_MS);
  let events = await eventsNow();
  while (!events.some((e) => e.event === "workflow_started") && performance.now() < until) {
    await sleep(POLL_MS);
    events = await eventsNow();
  }
  const started = events.find((e) => e.event === "workflow_started");
  // Where the events of every caller's instances can be read (an open server), another's is
  // refused here as the coordinator would (it logs that and says nothing).
  if (started === undefined || (started.caller != null && started.caller !== caller)) {
    throw new UnknownWorkflow(
      `no workflow instance '${instanceId}' among ${caller}'s own messages (a caller cancels and signals only the instances it started)`,
    );
  }
  return { started, events, eventsNow };
}

export async function cancelWorkflow(
  conn: Connection,
  caller: string,
  eventsOf: EventsOf,
  instanceId: string,
  why: string,
  waitMs: number,
): Promise<WorkflowEnded> {
  const instance = await ownInstance(caller, eventsOf, instanceId, waitMs);
  const { started } = instance;
  let { events } = instance;
  const already = ended(instanceId, events, true);
  if (already !== null) return already;
  const sent = await conn.publish(conn.names.workflowCancel(instanceId, caller), new TextEncoder().encode(why), controlHeaders("cancel"));
  const until = performance.now() + waitMs;
  for (;;) {
    const end = ended(instanceId, events, false);
    if (end !== null) return end;
    const refusal = events.find((e) => e.event === "cancel_refused" && e.detail?.by === caller && e.detail?.cancel_seq === sent.seq);
    if (refusal !== undefined) throw refused(instanceId, "cancel", refusal);
    if (performance.now() >= until) {
      throw new DeadlineExceeded(
        `workflow '${instanceId}': cancel sent; not ended within ${waitMs} ms (its steps' undoing may still run)`,
        { messageId: instanceId, traceId: started.trace_id },
      );
    }
    await sleep(POLL_MS);
    events = await instance.eventsNow();
  }
}

export async function signalWorkflow(
  conn: Connection,
  caller: string,
  eventsOf: EventsOf,
  instanceId: string,
  event: string,
  waitMs: number,
): Promise<SignalOutcome> {
  if (!TOKEN.test(event)) {
    throw new InvalidArgument(`event='${event}': an event is one subject token (letters, digits, '-', '_'; no dots, spaces or wildcards)`, "event");
  }
  const instance = await ownInstance(caller, eventsOf, instanceId, waitMs);
  let { events } = instance;
  const already = ended(instanceId, events, true);
  if (already !== null) return { instanceId, event, taken: false, state: null, waitsFor: [], ended: already.status };
  const sentMs = Date.now();
  // An event seen before the signal was sent answers an earlier one (the same event sent again within a second).
  const before = new Set(events.map(said));
  const sent = await conn.publish(conn.names.workflowSignal(instanceId, event, caller), new Uint8Array(), controlHeaders("signal"));
  const until = performance.now() + waitMs;
  for (;;) {
    const answer = answerIn(instanceId, event, caller, events.filter((e) => !before.has(said(e))), sentMs, sent.seq);
    if (answer !== null) return answer;
    if (performance.now() >= until) {
      throw new DeadlineExceeded(
        `workflow '${instanceId}': ${event} signalled; the coordinator has not said within ${waitMs} ms whether a state took it (it counts from when the server stored it: it may still be taken)`,
        { messageId: instanceId, traceId: instance.started.trace_id },
      );
    }
    await sleep(POLL_MS);
    events = await instance.eventsNow();
  }
}

function said(event: Event): string {
  return JSON.stringify([event.event, event.at_ms, event.detail ?? {}]);
}

/**
 * The answer to the signal stored at sequence `seq`, from the events that name it; from a
 * coordinator that names none (before revision 31), the first about the event by `caller` after it.
 */
function answerIn(instanceId: string, event: string, caller: string, events: Event[], sentMs: number, seq: number): SignalOutcome | null {
  for (const seen of events) {
    const detail = (seen.detail ?? {}) as Record<string, unknown>;
    if (detail.by !== caller || seen.at_ms < sentMs - CLOCKS_APART_MS) continue;
    if (typeof detail.signal_seq === "number" && detail.signal_seq !== seq) continue; // another signal's, sent at once
    if (seen.event === "signal_taken" && detail.event === event) {
      return { instanceId, event, taken: true, state: (detail.state as string | undefined) ?? null, waitsFor: [], ended: null };
    }
    if (seen.event === "signal_ignored" && detail.signal === event) {
      if (detail.error != null && detail.ended == null) throw refused(instanceId, `signal ${event}`, seen);
      const waitsFor = Array.isArray(detail.waits_for) ? (detail.waits_for as string[]) : [];
      const failed = detail.ended === "failed" ? "failed" : null; // the instance failed instead of taking it
      const state = (detail.state as string | undefined) ?? null; // the one it is in, which did not take it
      return { instanceId, event, taken: false, state, waitsFor, ended: failed };
    }
  }
  // Ended with no word on the signal (an answer lost in a crash): it is taken no more.
  const ending = ended(instanceId, events, false);
  return ending === null ? null : { instanceId, event, taken: false, state: null, waitsFor: [], ended: ending.status };
}

/** The coordinator's word that it did not act on a cancel or signal (a caller over its quota). */
function refused(instanceId: string, action: string, answer: Event): WorkflowActionRefused {
  const error = (answer.detail as { error: ErrorInfo }).error;
  return new WorkflowActionRefused(`workflow '${instanceId}': ${action} not acted on: ${error.message}`, error, instanceId);
}

function ended(instanceId: string, events: Event[], beforeCancel: boolean): WorkflowEnded | null {
  const ending = events.find((e) => e.event in ENDINGS);
  if (ending === undefined) return null;
  return { instanceId, status: ENDINGS[ending.event]!, atMs: ending.at_ms, beforeCancel };
}

/**
 * Headers of a cancel or a signal, saying what it is: an empty message without headers is
 * what a stream keeps of a NATS status message someone aimed at the subject, and is refused.
 */
function controlHeaders(kind: "cancel" | "signal"): Record<string, string> {
  return { "Reach-Kind": kind };
}
