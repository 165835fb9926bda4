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

const SERVER_JSON = ['{"type":"io.nats.', '{"stream":', '{"error":'];

/**
 * What a message the server sent in someone's stead is, or null when a party sent it: a
 * direct get's answer (a stored message of its requester's choosing, with the headers the
 * server adds), or one of the server's JSON answers (an API response, a publish ack). Read
 * by a consumer or a core subscription; aimed at an agent's queue, it ran as a task.
 */
export function sentByServer(data: Uint8Array, headers: MsgHdrs | undefined | null): string | null {
  if (headers === null) return "a message whose headers cannot be read (a stored message of someone's, sent again)";
  const names = headers ? [...headers.keys()] : [];
  if (names.some((name) => ADDED.includes(name) || name.endsWith("Nats-Stream"))) {
    return "a JetStream direct get's answer (a stored message, sent again by the server)";
  }
  const head = new TextDecoder().decode(data.subarray(0, 20));
  if (!SERVER_JSON.some((opening) => head.startsWith(opening))) return null;
  return "a NATS server's answer to a request";
}

/**
 * A message's headers; null when nats.js cannot decode them. It throws BAD_HEADER on reading
 * a line it refuses (`Bad Key: x`), which only a stored message of someone's choosing, sent
 * again by the server, carries: thrown in a subscription's callback, it closed the connection.
 */
export function headersOf(msg: { readonly headers?: MsgHdrs }): MsgHdrs | undefined | null {
  try {
    return msg.headers;
  } catch {
    return null;
  }
}
