/**
 * Messages the NATS server sent in a party's stead.
 *
 * nats-server sends its answer to a request to whatever reply subject the request names,
 * checked against no permission. An agent may write its own keys with content it chooses,
 * then direct-get one with the reply aimed at another subject: the server sends the stored
 * message there, with the headers a direct get adds (`Nats-Stream`, `Nats-Subject`,
 * `Nats-Sequence`, `Nats-Time-Stamp`). Such a message is nobody's (one aimed at an agent's
 * queue ran as a task; a forged "done" record made an agent send a result of its choosing).
 */
import type { MsgHdrs } from "nats";

/** `Nats-Stream` comes first, written onto the stored block's last line, which can hide it. */
export const DIRECT_GET_HEADERS = ["Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp"];

const SERVER_JSON = ['{"type":"io.nats.', '{"stream":', '{"error":'];

/**
 * A direct get that asks for no headers (`no_hdr`) is answered with the stored body alone:
 * content its requester wrote under a key of its own, at any subject, with nothing to tell it
 * apart. Where every party's message carries headers (dispatches, replies), none means that.
 */
export const NO_HEADERS =
  "a message with no headers, where every party's carries some: what the NATS server sends of a stored message when a direct get asks for none (no_hdr)";

/**
 * What a message the server sent in someone's stead is, or null when a party sent it: a
 * direct get's answer (a stored message of its requester's choosing, with the headers the
 * server adds), or one of the server's JSON answers (an API response, a publish ack). Read
 * by a consumer or a core subscription; aimed at an agent's queue, it ran as a task.
 */
export function sentByServer(data: Uint8Array, headers: MsgHdrs | undefined | null, options: { headed?: boolean } = {}): string | null {
  if (headers === null) return "a message whose headers cannot be read (a stored message of someone's, sent again)";
  const names = headers ? [...headers.keys()] : [];
  if (options.headed === true && names.length === 0) return NO_HEADERS;
  if (names.some((name) => DIRECT_GET_HEADERS.includes(name) || name.endsWith("Nats-Stream"))) {
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
