/**
 * Whether a coordinator runs, asked the way `reach` asks (`reach.ctl.status`, which every
 * replica answers): so that a caller whose tasks nothing routes hears why, instead of a wait
 * that blames the agents.
 */

import { ErrorCode } from "nats";
import type { NatsError } from "nats";

import type { Connection } from "./connection.js";
import type { Logger } from "./log.js";

export const NO_COORDINATOR =
  "no coordinator is running (none answered for 3 s; start one: reach up / reach coordinator)";
export const COORDINATOR_SILENT =
  "no coordinator answered whether it runs within 0.5 s (one may be stopped, overloaded or cut off), or this client's connection is down";
const ASK_MS = 500; // a replica answers in milliseconds; "nobody listens" comes back at once
// Just after a server restart the coordinators are still reconnecting while this client may be
// back already: "nobody listens" is said only when it lasts this long.
const NONE_FOR_MS = 3_000;
const ASK_AGAIN_MS = 500;
const WARN_EVERY_MS = 60_000; // a publisher asks at most this often

/**
 * True when a coordinator answers; false when none listens (the server says so at once) for
 * `noneForMs`; null when it cannot be told: no answer in time, no connection, or no right to ask.
 */
export async function coordinatorRuns(
  conn: Connection,
  timeoutMs = ASK_MS,
  noneForMs = NONE_FOR_MS,
): Promise<boolean | null> {
  const deadline = performance.now() + noneForMs;
  for (;;) {
    try {
      await conn.nc.request(conn.names.status, new Uint8Array(0), { timeout: timeoutMs });
      return true;
    } catch (err) {
      if ((err as NatsError).code !== ErrorCode.NoResponders) return null;
      if (performance.now() >= deadline) return false;
    }
    // unref: a program that publishes and closes is not kept alive by this asking.
    await new Promise((resolve) => setTimeout(resolve, ASK_AGAIN_MS).unref());
  }
}

/**
 * After a publish, asks in the background whether a coordinator runs, at most once a minute,
 * and logs a warning when none does: the task is queued all the same, and waits in the task
 * stream until one starts, within its ttl. The publish never waits for it.
 */
export class PublishWarnings {
  private askedAt: number | null = null;
  private closed = false;

  constructor(
    private readonly conn: Connection,
    private readonly log: Logger,
  ) {}

  published(topic: string, messageId: string): void {
    const now = performance.now();
    if (this.askedAt !== null && now - this.askedAt < WARN_EVERY_MS) return;
    this.askedAt = now;
    void coordinatorRuns(this.conn).then((runs) => {
      // Not told after close: a program that publishes and closes at once is not warned.
      if (runs === false && !this.closed) {
        this.log.warn(`${NO_COORDINATOR}: the task waits in the task stream until one starts, within its ttl`, {
          topic,
          message_id: messageId,
        });
      }
    });
  }

  close(): void {
    this.closed = true;
  }
}
