/**
 * The drain at a stop: running handlers get `drainTimeoutMs` to finish, then their
 * `ctx.signal` is aborted and they get a second more; runs that ended but whose outcomes are
 * not recorded yet (the NATS server away) get `drainTimeoutMs` again, for the server to come
 * back (an outside trial of the Python agent: such an outcome was thrown away with the
 * running handlers, and its task ran again). Runs reporting an outcome already recorded wait
 * with them, and are not counted among the running handlers.
 */

import { LEASE_GRACE_MS } from "./deadline.js";
import type { Logger } from "./log.js";

/** The runs whose handler ended: their message ids, and whether each outcome is recorded yet
 * (it is being reported then). */
export class Recording {
  readonly ids = new Map<string, boolean>();
  private waiters: (() => void)[] = [];

  /** `conclude(recorded)` for `messageId`, which calls `recorded()` once its outcome is kept. */
  async during<T>(messageId: string, conclude: (recorded: () => void) => Promise<T>): Promise<T> {
    this.ids.set(messageId, false);
    try {
      return await conclude(() => this.ids.set(messageId, true));
    } finally {
      this.ids.delete(messageId);
      if (this.ids.size === 0) for (const resolve of this.waiters.splice(0)) resolve();
    }
  }

  /** Until no run is recording or reporting an outcome. */
  async settled(): Promise<void> {
    if (this.ids.size > 0) await new Promise<void>((resolve) => this.waiters.push(resolve));
  }

  /** The message ids whose outcomes are (`recorded`) or are not recorded yet, sorted. */
  which(recorded: boolean): string[] {
    return [...this.ids].filter(([, kept]) => kept === recorded).map(([id]) => id).sort();
  }
}

export interface Draining {
  inFlight: Set<Promise<void>>;
  recording: Recording | undefined;
  abortAll: () => void;
  drainTimeoutMs: number;
  log: Logger;
}

/** Wait for the running handlers and the outcomes being recorded, as the module says. */
export async function drain({ inFlight, recording, abortAll, drainTimeoutMs, log }: Draining): Promise<void> {
  if (inFlight.size > 0) log.info("stopping: waiting for running handlers", { running: inFlight.size, drain_timeout_ms: drainTimeoutMs });
  if (await settleWithin([...inFlight], drainTimeoutMs)) return;
  const running = inFlight.size - (recording?.ids.size ?? 0);
  if (running > 0) {
    log.warn("handlers still running after the drain timeout: their signals aborted", { running });
    abortAll();
    await settleWithin([...inFlight], LEASE_GRACE_MS);
  }
  if (recording === undefined || recording.ids.size === 0) return;
  log.warn("runs that ended are still recording their outcomes (is NATS reachable?): waiting up to drain_timeout more for them", {
    recording: recording.ids.size,
    drain_timeout_ms: drainTimeoutMs,
  });
  if (await settleWithin([recording.settled()], drainTimeoutMs)) return;
  const [unrecorded, unreported] = [recording.which(false), recording.which(true)];
  if (unrecorded.length > 0) {
    log.error("outcomes given up at the stop, never recorded: NATS was unreachable; these tasks run again when delivered again", {
      message_ids: unrecorded,
    });
  }
  if (unreported.length > 0) {
    log.warn("outcomes recorded but not reported at the stop: NATS was unreachable; their tasks, delivered again, are answered from the records", {
      message_ids: unreported,
    });
  }
}

/** Whether every one of `promises` settled within `ms`. */
export async function settleWithin(promises: Promise<unknown>[], ms: number): Promise<boolean> {
  if (promises.length === 0) return true;
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<false>((resolve) => {
    timer = setTimeout(() => resolve(false), ms);
  });
  const all = Promise.allSettled(promises).then(() => true);
  try {
    return await Promise.race([all, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
