/**
 * What claiming a message for a run can come to: claimed, or why not — it ran already (done
 * or failed), it was ended or moved by the coordinator, or another delivery holds it.
 */

import type { Execution } from "./types.js";

/** This delivery runs the message; `revision` guards the record's next write. */
export class Claimed {
  readonly kind = "claimed";
  private queue: Promise<unknown> = Promise.resolve();

  constructor(
    public revision: number,
    public leaseUntilMs: number,
    /** The dispatch's `Reach-Seal`, kept in every write of the record. */
    public readonly seal: string | null = null,
    /** When the attempt's run began (kept in every write): a takeover keeps a crashed run's. */
    public readonly startedMs = 0,
    /** Taken over from a run of the attempt that crashed: the budget counts from its start. */
    public readonly resumed = false,
  ) {}

  /** Run `write` after every write on this claim before it (a renewal and the outcome). */
  serially<T>(write: () => Promise<T>): Promise<T> {
    const next = this.queue.then(write, write);
    this.queue = next.catch(() => undefined);
    return next;
  }
}

/** The message ran before; here is its record (with the result). */
export interface AlreadyDone {
  kind: "done";
  record: Execution;
}

/**
 * This attempt ran here and failed (its redelivery, after the ack of its report was lost):
 * not to be run again; its failure is reported again.
 */
export interface AlreadyFailed {
  kind: "failed";
  record: Execution;
}

/** The attempt was ended as expired already (its expiry fence stands): not to be run. */
export interface Expired {
  kind: "expired";
  record: Execution;
}

/**
 * The attempt was taken from this agent while it waited in its queue (the agent was judged
 * gone; the next attempt runs elsewhere): not to be run.
 */
export interface Moved {
  kind: "moved";
  record: Execution;
}

/** Another delivery holds the lease; try again after `retryInMs`. */
export interface Busy {
  kind: "busy";
  retryInMs: number;
}

export type Claim = Claimed | AlreadyDone | AlreadyFailed | Expired | Moved | Busy;
