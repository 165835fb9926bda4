/**
 * A KV bucket's keys: written through nats.js's KV, read by a direct get of our own.
 *
 * Any party may have the server copy a stored message of its choosing onto a key (a direct
 * get with its reply aimed there, protocol §6). nats.js's `kv.get` decodes the answer's
 * headers inside its protocol reader: a header line it refuses (`Bad Key: x`) threw there and
 * closed the connection, on every heartbeat of an agent whose key held one, and a fresh
 * agent with such a card exited at start. Read here, such an entry is nobody's record.
 */

import { createInbox, Empty, headers } from "nats";
import type { JetStreamClient, JetStreamPublishOptions, KV, Msg, NatsConnection, Subscription } from "nats";

import { isWrongLastSequence } from "./connection.js";
import { ReachError } from "./errors.js";
import { DIRECT_GET_HEADERS, headersOf } from "./serveranswers.js";
import { sleep } from "./timing.js";

const STALE_READS = 10; // reads of a key a replica answers from behind a refused write, at most
const STALE_PAUSE_MS = 100;

const NOT_FOUND = "404";
// What the server's answer to a direct get adds to a stored message's own headers.
const ANSWER_HEADERS = new Set([...DIRECT_GET_HEADERS, "Nats-Num-Pending", "Nats-Last-Sequence", "Nats-UpTo-Sequence"]);
const NO_RESPONDERS = "503";

/** A key's last entry. */
export interface StoredEntry {
  readonly revision: number;
  readonly operation: "PUT" | "DEL" | "PURGE";
  readonly value: Uint8Array;
  /**
   * Nobody's record: the server wrote it (a direct get's answer someone aimed at the key: its
   * added headers come twice, the stored copy's, then the server's own), or its headers are
   * ones nats.js cannot decode.
   */
  readonly nobodys: boolean;
  /**
   * Whether the stored message had headers of its own. Every party writes its records with
   * `Reach-Kind: record` (RECORD_HEADERS); a value with none is what the server copies of a
   * stored message when a direct get asks for no headers (`no_hdr`), to any key.
   */
  readonly headed: boolean;
}

/** What every record written here carries (see StoredEntry.headed). */
export const RECORD_HEADERS: Readonly<Record<string, string>> = { "Reach-Kind": "record" };

export class Keys {
  constructor(
    private readonly kv: KV,
    private readonly js: JetStreamClient,
    private readonly nc: NatsConnection,
    readonly bucket: string,
    private readonly timeoutMs: number,
  ) {}

  /** Write `key` when it holds no value (none, or a delete marker); else the write is refused. */
  async create(key: string, value: Uint8Array): Promise<number> {
    // Not nats.js's kv.create: on a refusal it reads the key with its own kv.get.
    try {
      return await this.put(key, value, 0);
    } catch (err) {
      if (!isWrongLastSequence(err)) throw err;
      const entry = await this.last(key);
      if (entry === null || entry.operation === "PUT") throw err;
      return this.put(key, value, entry.revision);
    }
  }

  update(key: string, value: Uint8Array, revision: number): Promise<number> {
    return this.put(key, value, revision);
  }

  /** Write `key` (when it is still at `revision`, if given); nats.js's kv.put sends no headers. */
  async put(key: string, value: Uint8Array, revision?: number): Promise<number> {
    const h = headers();
    for (const [name, said] of Object.entries(RECORD_HEADERS)) h.set(name, said);
    const options: Partial<JetStreamPublishOptions> = { headers: h };
    if (revision !== undefined) options.expect = { lastSubjectSequence: revision };
    return (await this.js.publish(`$KV.${this.bucket}.${key}`, value, options)).seq;
  }

  delete(key: string, opts: { previousSeq?: number } = {}): Promise<void> {
    return this.kv.delete(key, opts);
  }

  /**
   * The key's last entry (a delete or purge marker too); null when it has none. `after`: a
   * revision a refused write proved the key is past; an answer from a replica behind it (a
   * cluster catching up after a lost majority) is read again, a moment at most.
   */
  async last(key: string, after = 0): Promise<StoredEntry | null> {
    let entry = await this.lastRead(key);
    for (let tries = 0; after > 0 && (entry?.revision ?? 0) <= after && tries < STALE_READS; tries++) {
      await sleep(STALE_PAUSE_MS);
      entry = await this.lastRead(key);
    }
    return entry;
  }

  private async lastRead(key: string): Promise<StoredEntry | null> {
    const answer = await this.directGet(`$JS.API.DIRECT.GET.KV_${this.bucket}.$KV.${this.bucket}.${key}`);
    const [status, fields] = parseHeaders(rawHeaders(answer) ?? "");
    const sequence = fields.get("Nats-Sequence")?.at(-1); // the server's own comes last
    if (sequence === undefined) {
      // The server's own status: it answers with no stored message.
      if (status === NOT_FOUND) return null;
      if (status === NO_RESPONDERS) throw new ReachError(`the ${this.bucket} bucket did not answer (no responders)`);
      throw new ReachError(`reading ${key} in ${this.bucket}: the server answered ${status || "with no sequence"}`);
    }
    const revision = Number(sequence);
    if (!Number.isSafeInteger(revision) || revision <= 0) {
      throw new ReachError(`reading ${key} in ${this.bucket}: the answer's sequence is ${sequence}`);
    }
    const operation = fields.get("KV-Operation")?.at(-1);
    const headed = [...fields.keys()].some((name) => !ANSWER_HEADERS.has(name));
    return {
      revision,
      operation: operation === "DEL" || operation === "PURGE" ? operation : "PUT",
      value: answer.data,
      nobodys:
        headersOf(answer) === null ||
        DIRECT_GET_HEADERS.some((name) => (fields.get(name)?.length ?? 0) > 1) ||
        (!headed && this.secured()),
      headed,
    };
  }

  /**
   * Whether this connection is a party's on a secured deployment (its creds name it: its
   * inbox prefix is `_INBOX_<name>`). There every writer writes headers, so a value with none
   * is a direct get's bare copy (no_hdr): a `done` record answered for this agent with
   * another's result, a card saying `stopped` took its traffic.
   */
  private secured(): boolean {
    return ((this.nc as { options?: { inboxPrefix?: string } }).options?.inboxPrefix ?? "").startsWith("_INBOX_");
  }

  /** A request whose answer is never decoded inside nats.js's reader (its own requests do). */
  private directGet(subject: string): Promise<Msg> {
    return new Promise((resolve, reject) => {
      const inbox = createInbox((this.nc as { options?: { inboxPrefix?: string } }).options?.inboxPrefix);
      const sub: Subscription = this.nc.subscribe(inbox, {
        max: 1,
        timeout: this.timeoutMs,
        callback: (err, msg) => (err ? reject(err) : resolve(msg)),
      });
      try {
        this.nc.publish(subject, Empty, { reply: inbox });
      } catch (err) {
        sub.unsubscribe();
        reject(err);
      }
    });
  }
}

/** A message's header block as it came (nats.js keeps it in the message's raw data). */
function rawHeaders(msg: Msg): string | null {
  const raw = msg as unknown as { _rdata?: Uint8Array; _msg?: { hdr?: number } };
  const size = raw._msg?.hdr ?? -1;
  if (raw._rdata === undefined || size < 0) return null;
  return new TextDecoder().decode(raw._rdata.subarray(0, size));
}

/**
 * A header block's status code ("" for none) and fields, every value of each in order. Lenient
 * where nats.js is strict: a line without a colon is skipped, a name is taken as written.
 */
export function parseHeaders(block: string): [string, Map<string, string[]>] {
  const [first = "", ...lines] = block.split("\r\n");
  const status = /^NATS\/1\.0 (\d{3})/.exec(first)?.[1] ?? "";
  const fields = new Map<string, string[]>();
  for (const line of lines) {
    const colon = line.indexOf(":");
    if (colon <= 0) continue;
    const name = line.slice(0, colon).trim();
    fields.set(name, [...(fields.get(name) ?? []), line.slice(colon + 1).trim()]);
  }
  return [status, fields];
}
