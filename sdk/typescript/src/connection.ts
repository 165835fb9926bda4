/** The NATS connection an agent owns, with JetStream, its KV buckets and the names. */

import { setMaxListeners } from "node:events";
import { connect, ErrorCode, headers as natsHeaders } from "nats";
import type {
  ConnectionOptions,
  JetStreamClient,
  JetStreamManager,
  MsgHdrs,
  NatsConnection,
  NatsError,
  PubAck,
} from "nats";

import { ConnectError, ReachError } from "./errors.js";
import { Keys } from "./keys.js";
import type { Logger } from "./log.js";
import { Names } from "./names.js";
import { DEFAULT_SERVER, redacted } from "./servers.js";
import { sleep } from "./timing.js";

/**
 * JetStream's error codes for a failed "expected last subject sequence" (a lost CAS): 10071,
 * and 10164 from a replicated (R>1) stream; the two mean the same.
 */
export const WRONG_LAST_SEQUENCE = [10071, 10164];
// The server is not there (yet): worth waiting for. A host name that does not resolve is one
// too (a container's DNS name comes with it), as the Python SDK's agents wait for it.
const WAITABLE = new Set<string>([ErrorCode.ConnectionRefused, ErrorCode.ConnectionTimeout, ErrorCode.Timeout, "ENOTFOUND", "EAI_AGAIN"]);
const WAIT_FIRST_MS = 1_000;
/** Above the slowest election seen (8.6 s), with room for a reconnect (as the Python SDK). */
export const ELECTION_BUDGET_MS = 15_000;
const RETRY_FIRST_MS = 100;
const RETRY_CAP_MS = 1_000;
const MSG_ID = "Nats-Msg-Id";
const DUPLICATE_IN_PROCESS = 10158; // an earlier try of the same Nats-Msg-Id is being stored
const WAIT_CAP_MS = 30_000;

/** 1, 2, 4 … s, capped at 30 s, ± 20 %: how long the n-th wait (from 0) lasts. */
function backoffMs(tries: number): number {
  return Math.min(WAIT_CAP_MS, WAIT_FIRST_MS * 2 ** tries) * (0.8 + Math.random() * 0.4);
}


export class Connection {
  private readonly buckets = new Map<string, Promise<Keys>>();
  private reconnected = 0;
  /** Told "reconnect" each time the connection comes back (see publish). */
  private readonly back = new EventTarget();

  private constructor(
    readonly nc: NatsConnection,
    readonly js: JetStreamClient,
    readonly jsm: JetStreamManager,
    readonly names: Names,
    readonly requestTimeoutMs: number,
  ) {}

  /**
   * Connect, waiting for the server while it is not there yet (1, 2, 4 … s, capped at 30 s,
   * one log line each time), until `signal` says stop.
   */
  static async open(
    options: ConnectionOptions,
    names: Names,
    requestTimeoutMs: number,
    log: Logger,
    signal: AbortSignal,
  ): Promise<Connection> {
    let nc: NatsConnection | null = null;
    for (let tries = 0; nc === null; tries++) {
      try {
        nc = await connect(options);
      } catch (err) {
        if (signal.aborted) throw new ReachError("stopped while waiting for NATS");
        const code = (err as NatsError).code;
        if (!WAITABLE.has(code)) throw cannotConnect(options, err); // credentials refused, say: no use waiting
        const waitMs = backoffMs(tries);
        log.warn("waiting for NATS", { servers: shownServers(options), error: String(err), retry_in_s: Math.round(waitMs / 100) / 10 });
        await sleep(waitMs, signal);
        if (signal.aborted) throw new ReachError("stopped while waiting for NATS");
      }
    }
    return Connection.over(nc, names, requestTimeoutMs);
  }

  /** Connect once: a server that is not there is an error at once (a caller's choice). */
  static async connect(options: ConnectionOptions, names: Names, requestTimeoutMs: number): Promise<Connection> {
    let nc: NatsConnection;
    try {
      nc = await connect(options);
    } catch (err) {
      throw cannotConnect(options, err);
    }
    return Connection.over(nc, names, requestTimeoutMs);
  }

  private static async over(nc: NatsConnection, names: Names, requestTimeoutMs: number): Promise<Connection> {
    try {
      // No account-info probe (checkAPI): the permissions of agents and callers do not
      // include $JS.API.INFO, and a secured caller may not ask the JetStream API anything.
      const jsm = await nc.jetstreamManager({ timeout: requestTimeoutMs, checkAPI: false });
      const js = nc.jetstream({ timeout: requestTimeoutMs, checkAPI: false });
      const conn = new Connection(nc, js, jsm, names, requestTimeoutMs);
      void conn.countReconnects();
      return conn;
    } catch (err) {
      await nc.close();
      throw err;
    }
  }

  /** How many times the connection came back since it was opened. */
  get reconnects(): number {
    return this.reconnected;
  }

  private async countReconnects(): Promise<void> {
    setMaxListeners(0, this.back); // a listener per write in flight: not a leak
    for await (const status of this.nc.status()) {
      if (status.type !== "reconnect") continue;
      this.reconnected += 1;
      this.back.dispatchEvent(new Event("reconnect"));
    }
  }

  /**
   * Until every stream and bucket an agent uses exists: an agent started before the
   * coordinator has provisioned a fresh server waits (and says what it waits for).
   */
  async waitProvisioned(log: Logger, signal: AbortSignal): Promise<void> {
    const n = this.names;
    const wanted = [
      n.dispatchStream("P0"),
      n.dispatchStream("P1"),
      n.dispatchStream("P2"),
      n.tasksStream,
      n.eventsStream,
      ...[n.agentsBucket, n.heartbeatsBucket, n.executionsBucket].map((b) => `KV_${b}`),
    ];
    for (let tries = 0; ; tries++) {
      // Stream names, not stream info: info lists every subject a stream holds, and a
      // secured deployment does not grant it to agents.
      const existing = new Set<string>();
      for await (const name of this.jsm.streams.names()) existing.add(name);
      const missing = wanted.filter((s) => !existing.has(s)).map((s) => s.replace(/^KV_/, ""));
      if (missing.length === 0) return;
      const waitMs = backoffMs(tries);
      log.warn("waiting for the streams and buckets: start the coordinator or run `reach provision`", {
        missing,
        retry_in_s: Math.round(waitMs / 100) / 10,
      });
      await sleep(waitMs, signal);
      if (signal.aborted) throw new ReachError("stopped while waiting for the streams and buckets");
    }
  }

  /** The largest message the server takes, in bytes. */
  get maxPayload(): number {
    return this.nc.info?.max_payload ?? 1024 * 1024;
  }

  /** A provisioned bucket's keys (bound, never created here: the coordinator provisions). */
  kv(bucket: string): Promise<Keys> {
    let keys = this.buckets.get(bucket);
    if (keys === undefined) {
      // Direct gets by key (the buckets are provisioned with them): the read an agent's
      // permissions allow is the subject-suffixed one, of its own keys only.
      keys = this.js.views
        .kv(bucket, { bindOnly: true, allow_direct: true })
        .then((kv) => new Keys(kv, this.js, this.nc, bucket, this.requestTimeoutMs));
      keys.catch(() => this.buckets.delete(bucket)); // try again next time
      this.buckets.set(bucket, keys);
    }
    return keys;
  }

  /**
   * JetStream publish; a `Nats-Msg-Id` header makes the stream drop duplicates (the
   * acknowledgement then says `duplicate`).
   */
  async publish(subject: string, data: Uint8Array, headers: Record<string, string> = {}, budgetMs = ELECTION_BUDGET_MS): Promise<PubAck> {
    // While a server restarts or the stream's leader is being elected, nobody answers: the
    // write is made again, for up to budgetMs. One that timed out may have been stored:
    // made again only with a Nats-Msg-Id, which makes the stream drop the copy.
    const giveUpAt = performance.now() + budgetMs;
    let tried = false;
    for (let pauseMs = RETRY_FIRST_MS; ; pauseMs = Math.min(pauseMs * 2, RETRY_CAP_MS)) {
      try {
        const ack = await this.publishOnce(subject, data, headers);
        // A try before this one may have been stored after all: a "duplicate" is its copy.
        return tried && ack.duplicate ? { ...ack, duplicate: false } : ack;
      } catch (err) {
        tried = true;
        const again = performance.now() + pauseMs < giveUpAt && (await this.unanswered(err, subject, MSG_ID in headers));
        if (!again) throw err;
      }
      await sleep(pauseMs * (0.5 + Math.random() / 2));
    }
  }

  /**
   * One try. With a Nats-Msg-Id it fails as timed out when the connection comes back first:
   * its ack went to the connection that broke, and it is made again at once (deduplicated),
   * instead of after its whole timeout (a trial's rolling restart: a write took 5 s).
   */
  private async publishOnce(subject: string, data: Uint8Array, headers: Record<string, string>): Promise<PubAck> {
    const sent = this.js.publish(subject, data, { headers: toHeaders(headers), timeout: this.requestTimeoutMs });
    if (!(MSG_ID in headers)) return await sent;
    let cut: () => void = () => undefined;
    const broke = new Promise<never>((_, reject) => {
      cut = () => reject(Object.assign(new Error("the connection broke before the write's ack came"), { code: ErrorCode.Timeout }));
      this.back.addEventListener("reconnect", cut, { once: true });
    });
    sent.catch(() => undefined); // once cut, its own end is nobody's
    try {
      return await Promise.race([sent, broke]);
    } finally {
      this.back.removeEventListener("reconnect", cut);
    }
  }

  /**
   * Whether a failed write is worth making again: a timeout (when the copy would be
   * dropped), or no responder while a stream does capture the subject (a leader election:
   * without a stream, the caller says "not provisioned" at once).
   */
  private async unanswered(err: unknown, subject: string, deduplicated: boolean): Promise<boolean> {
    const code = (err as NatsError | null)?.code;
    if (code === ErrorCode.Timeout) return deduplicated;
    // "duplicate message id is in process": an earlier try of this very write is being
    // stored (a write made again across an election); asked again, it is stored or a duplicate.
    if ((err as NatsError | null)?.api_error?.err_code === DUPLICATE_IN_PROCESS) return deduplicated;
    if (code !== "503" || (err as NatsError).api_error) return false;
    try {
      await this.jsm.streams.find(subject);
      return true;
    } catch (found) {
      return (found as NatsError | null)?.code === ErrorCode.Timeout; // nobody can tell yet
    }
  }

  /** Core NATS publish (replies to an inbox). */
  publishCore(subject: string, data: Uint8Array, headers: Record<string, string> = {}): void {
    this.nc.publish(subject, data, { headers: toHeaders(headers) });
  }

  async close(): Promise<void> {
    if (this.nc.isClosed()) return;
    try {
      await this.nc.flush();
    } catch {
      // disconnected: nothing left to flush
    }
    await this.nc.close();
  }
}

/** The ConnectError for a connect to `options.servers` that failed with `err`. */
function cannotConnect(options: ConnectionOptions, err: unknown): ConnectError {
  const why = err instanceof Error ? err.message : String(err);
  return new ConnectError(`cannot connect to NATS at ${shownServers(options)}: ${why}`, { cause: err });
}

function shownServers(options: ConnectionOptions): string {
  return [options.servers ?? DEFAULT_SERVER].flat().map(redacted).join(",");
}

export function toHeaders(values: Record<string, string>): MsgHdrs {
  const h = natsHeaders();
  for (const [name, value] of Object.entries(values)) h.set(name, value);
  return h;
}

export function fromHeaders(h: MsgHdrs | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  if (h === undefined) return out;
  for (const [name, values] of h) out[name] = values[0] ?? "";
  return out;
}

/**
 * Whether `err` is JetStream refusing a value over its bucket's limit (10054), or the client
 * one over the server's max payload: trying again cannot help.
 */
export function isValueTooLarge(err: unknown): boolean {
  const failure = err as NatsError | undefined;
  return failure?.api_error?.err_code === 10054 || failure?.code === ErrorCode.MaxPayloadExceeded;
}

/** Whether `err` is JetStream refusing a conditional write (someone wrote first). */
export function isWrongLastSequence(err: unknown): boolean {
  return WRONG_LAST_SEQUENCE.includes((err as NatsError | undefined)?.api_error?.err_code ?? 0);
}

/** Run `action`, ignoring a throw (a settle on a connection that is gone). */
export function quietly(action: () => void): void {
  try {
    action();
  } catch {
    // nothing more to do
  }
}

/** Whether `err` is the NATS client's own (a broker that is gone or refused), not a bug. */
export function isBrokerError(err: unknown): boolean {
  return typeof (err as NatsError)?.code === "string" && typeof (err as NatsError)?.isJetStreamError === "function";
}
