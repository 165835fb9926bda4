/**
 * KV entries the NATS server wrote, not a party.
 *
 * nats-server sends its answer to a request to whatever reply subject the request names,
 * checked against no permission. An agent may write its own keys with content it chooses,
 * then direct-get one with the reply aimed at another key: the server stores its answer
 * there, with the headers a direct get adds (`Nats-Stream`, `Nats-Subject`, `Nats-Sequence`,
 * `Nats-Time-Stamp`). Read by a direct get (as KV reads are), those headers come twice: the
 * stored copy's, then the server's own. Such an entry is nobody's record (a forged "done"
 * execution record made an agent send a result of the attacker's choosing).
 */
import type { KvEntry, MsgHdrs } from "nats";

/** `Nats-Stream` comes first, written onto the stored block's last line, which can hide it. */
const ADDED = ["Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp"];

/** Whether the server wrote `entry` (a direct get's answer someone aimed at its key). */
export function byServer(entry: KvEntry | null): boolean {
  // nats.js keeps the direct get's message on the entries it reads (KvStoredEntryImpl.sm).
  const header = (entry as { sm?: { header?: MsgHdrs } } | null)?.sm?.header;
  return header !== undefined && ADDED.some((name) => header.values(name).length > 1);
}
