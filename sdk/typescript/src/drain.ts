/**
 * The drain at a stop: running handlers get `drainTimeoutMs` to finish, then their
 * `ctx.signal` is aborted and they get a second more; runs that ended but whose outcomes are
 * not recorded yet (the NATS server away) get `drainTimeoutMs` again, for the server to come
 * back (an outside trial of the Python agent: such an outcome was thrown away with the
 * running handlers, and its task ran again).
 */

import { LEASE_GRACE_MS } from "./deadline.js";
import type { Logger } from "./log.js";

/** The runs whose handler ended, recording their outcomes: their message ids. */
export class Recording {
  readonly ids = new Set<string>();
  private waiters: (() => void)[] = [];

  /** `record()` for `messageId`, counted among the outcomes being recorded meanwhile. */
  async during<T>(messageId: string, record: () => Promise<T>): Promise<T> {
    this.ids.add(messageId);
    try {
      return await record();
    } finally {
      this.ids.delete(messageId);
      if (this.ids.size === 0) for (const resolve of this.waiters.splice(0)) resolve();
    }
  }

  /** Until no outcome is being recorded. */
  async settled(): Promise<void> {
    if (this.ids.size > 0) await new Promise<void>((resolve) => this.waiters.push(resolve));
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
  if (!(await settleWithin([recording.settled()], drainTimeoutMs))) {
    log.error("outcomes given up at the stop, never recorded: NATS was unreachable; these tasks run again when delivered again", {
      message_ids: [...recording.ids].sort(),
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
