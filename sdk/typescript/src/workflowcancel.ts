/**
 * Cancelling a workflow instance a caller started (`ReachClient.cancelWorkflow`). A caller may
 * not read the workflow records, so it learns how its instance stands from the instance's
 * events, before and after the cancel; the coordinator cancels only an instance that caller
 * started (caller.md §8.3).
 */

import type { Connection } from "./connection.js";
import { DeadlineExceeded, UnknownWorkflow } from "./errors.js";
import { sleep } from "./timing.js";
import type { Event } from "./types.js";

const ENDINGS: Record<string, WorkflowEnded["status"]> = {
  workflow_completed: "completed",
  workflow_failed: "failed",
  workflow_cancelled: "cancelled",
};
const POLL_MS = 200; // a caller's creds read events only through the coordinator: asked again

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

export async function cancelWorkflow(
  conn: Connection,
  caller: string,
  eventsOf: (messageId: string) => Promise<Event[]>,
  instanceId: string,
  why: string,
  waitMs: number,
): Promise<WorkflowEnded> {
  const ownEvents = async () => (await eventsOf(instanceId)).filter((e) => e.message_id === instanceId);
  let events = await ownEvents();
  const started = events.find((e) => e.event === "workflow_started");
  // Where the events of every caller's instances can be read (an open server), another's is
  // refused here as the coordinator would (it logs that and says nothing).
  if (started === undefined || (started.caller != null && started.caller !== caller)) {
    throw new UnknownWorkflow(
      `no workflow instance '${instanceId}' among ${caller}'s own messages (a caller cancels only the instances it started)`,
    );
  }
  const already = ended(instanceId, events, true);
  if (already !== null) return already;
  await conn.publish(conn.names.workflowCancel(instanceId, caller), new TextEncoder().encode(why));
  const until = performance.now() + waitMs;
  for (;;) {
    const end = ended(instanceId, events, false);
    if (end !== null) return end;
    if (performance.now() >= until) {
      throw new DeadlineExceeded(
        `workflow '${instanceId}': cancel sent; not ended within ${waitMs} ms (its steps' undoing may still run)`,
        { messageId: instanceId, traceId: started.trace_id },
      );
    }
    await sleep(POLL_MS);
    events = await ownEvents();
  }
}

function ended(instanceId: string, events: Event[], beforeCancel: boolean): WorkflowEnded | null {
  const ending = events.find((e) => e.event in ENDINGS);
  if (ending === undefined) return null;
  return { instanceId, status: ENDINGS[ending.event]!, atMs: ending.at_ms, beforeCancel };
}
