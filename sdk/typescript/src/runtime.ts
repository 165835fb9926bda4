/**
 * A running agent: registration, then one consumer and pool of deliveries per priority
 * (each handler's capacity shared by the three), heartbeats and probes, until a drained
 * stop. Each message is handed to the Executor.
 */

import { AckPolicy, DeliverPolicy, nanos } from "nats";
import type { Consumer, ConsumerConfig, JsMsg, NatsError } from "nats";

import { encode } from "./codec.js";
import { isWrongLastSequence, quietly } from "./connection.js";
import type { Connection } from "./connection.js";
import { AgentIdInUse, ReachError } from "./errors.js";
import { drain, settleWithin } from "./drain.js";
import { ClaimCheck } from "./claimcheck.js";
import { Executor } from "./execution.js";
import type { HandlerSpec } from "./execution.js";
import { Claims } from "./claims.js";
import { Heartbeats, Presence } from "./liveness.js";
import { Room } from "./slots.js";
import type { WorkerPool } from "./slots.js";
import type { Load } from "./liveness.js";
import { bound } from "./log.js";
import type { Logger } from "./log.js";
import { awaitSlot, restoreCard, writeCard } from "./registration.js";
import { sleep } from "./timing.js";
import { PRIORITIES } from "./types.js";
import type { AgentCard, Priority } from "./types.js";

const FETCH_EXPIRES_MS = 1_000; // the client's minimum for a pull request
const STOP_RECONNECT_MS = 1_000; // a stop in an outage waits this long for the connection
const PRESENCE_CHECK_MS = 500;
const CONSUMER_EXISTS = 10148; // JetStream: a consumer of that name exists with other settings
const CONSUMER_NOT_FOUND = 10014;
const STREAM_NOT_FOUND = 10059;
// A failing fetch is tried again after 0.5, 1, 2 … s, capped at 2 s (as the Python SDK): a
// consumer paused by a leader election resumes within 2 s of the new leader.
const RETRY_FIRST_MS = 500;
const RETRY_CAP_MS = 2_000;
const CARD_CHECK_MS = 1_000; // while the registry is not provisioned again after a reconnect
const CARD_LOOK_BEATS = 4; // the card is looked at every this many heartbeat intervals

/** What the runtime needs from an Agent's configuration. */
export interface RuntimeConfig {
  agentId: string;
  tags: Record<string, string>;
  heartbeatIntervalMs: number;
  startupDelayMs: number;
  ackWaitMs: number;
  maxDeliver: number;
  drainTimeoutMs: number;
  handlers: Map<string, HandlerSpec>;
  card: () => AgentCard;
  capacity: number;
  /** Results larger than this (bytes of JSON) go to the Object Store. */
  claimCheckBytes: number;
  /** Told once a newer process of the id fenced this one out: the owner then stops it. */
  onReplaced: () => void;
}

export class AgentRuntime {
  card: AgentCard | null = null;
  heartbeats: Heartbeats | null = null;
  /** The epoch of a newer process of the id found heartbeating (0: none yet). */
  replacedBy = 0;
  private cardRevision = 0;
  private readonly stopping = new AbortController();
  private readonly loops: Promise<void>[] = [];
  private readonly inFlight = new Set<Promise<void>>();
  private disconnected = false; // the connection is down (its status, followed by keepCard)
  private connectedAgain: (() => void)[] = [];
  private readonly room: Room;
  private readonly presence: Presence;
  private executor: Executor | null = null;
  private readonly log: Logger;

  constructor(
    private readonly config: RuntimeConfig,
    private readonly conn: Connection,
    log: Logger,
  ) {
    this.log = bound(log, { agent_id: config.agentId });
    const capacities = new Map([...config.handlers].map(([topic, spec]) => [topic, spec.capacity]));
    this.room = new Room(capacities, this.stopping.signal);
    this.presence = new Presence(conn, config.agentId, serviceVersion(config.handlers), config.tags);
  }

  get stopped(): boolean {
    return this.stopping.signal.aborted;
  }

  /** Make a start under way give up at its next step (stop() then cleans up). */
  interrupt(): void {
    this.stopping.abort();
  }

  async start(): Promise<void> {
    const { config, conn } = this;
    if (config.startupDelayMs > 0) {
      // Spread the registrations of a fleet that starts at once.
      const delayMs = Math.random() * config.startupDelayMs;
      this.log.info("registering after a random start-up delay", {
        delay_ms: Math.round(delayMs),
        startup_delay_ms: config.startupDelayMs,
        hint: "startupDelayMs: 0 registers at once",
      });
      await sleep(delayMs, this.stopping.signal);
    }
    this.checkNotStopped();
    await conn.waitProvisioned(this.log, this.stopping.signal);
    this.checkNotStopped();
    await this.presence.checkFree(PRESENCE_CHECK_MS, this.log);
    await this.presence.start();
    const askedS = await awaitSlot(conn, config.agentId, this.log, this.stopping.signal);
    this.checkNotStopped();
    [this.card, this.cardRevision] = await writeCard(conn, config.card(), this.log);
    const kv = await conn.kv(conn.names.executionsBucket);
    this.executor = new Executor(conn, {
      agentId: config.agentId,
      handlers: config.handlers,
      ackWaitMs: config.ackWaitMs,
      records: new Claims(kv, config.agentId, this.card.epoch, this.log),
      claimCheck: new ClaimCheck(conn.js, conn.names.payloadsBucket, config.claimCheckBytes),
      room: this.room,
      log: this.log,
    });
    const consumers = await Promise.all(PRIORITIES.map((p) => this.bind(p)));
    this.checkNotStopped();
    const intervalS = askedS ?? config.heartbeatIntervalMs / 1000;
    const onReplaced = (epoch: number) => this.onReplaced(epoch);
    this.heartbeats = new Heartbeats(conn, config.agentId, this.card.epoch, intervalS, () => this.load(), this.log, onReplaced);
    this.heartbeats.start();
    void this.keepCard().catch((err) => this.log.warn("card keeper stopped", { error: String(err) }));
    void this.lookAtCard();
    const executor = this.executor;
    PRIORITIES.forEach((p, i) => this.loops.push(this.consume(p, consumers[i]!, executor)));
    this.log.info("agent serving", { epoch: this.card.epoch, topics: [...config.handlers.keys()].sort() });
  }

  /**
   * Say when the connection drops and comes back (as the coordinator does), and after each
   * reconnect write the card again if the server lost it (restarted on an empty store, then
   * provisioned): routing knows an agent by its card, and heartbeats alone do not make one.
   * Ends when the connection closes.
   */
  private async keepCard(): Promise<void> {
    for await (const status of this.conn.nc.status()) {
      if (status.type === "disconnect") this.disconnected = true;
      if (status.type === "reconnect") {
        this.disconnected = false;
        for (const back of this.connectedAgain.splice(0)) back();
      }
      if (this.stopped) continue; // still following the connection, for stop()
      if (status.type === "disconnect") this.log.warn("nats disconnected; reconnecting", { server: String(status.data) });
      if (status.type === "reconnect") {
        this.log.info("nats reconnected", { server: String(status.data) });
        await this.restoreCard();
      }
    }
  }

  private async restoreCard(): Promise<void> {
    const signal = this.stopping.signal;
    while (!signal.aborted && this.card !== null) {
      try {
        this.cardRevision = (await restoreCard(this.conn, this.card, this.log)) ?? this.cardRevision;
        return;
      } catch {
        await sleep(CARD_CHECK_MS, signal); // the registry is not there (yet)
      }
    }
  }

  /** Every few heartbeat intervals (as they are now: a control message may change them), for a card deleted or overwritten by hand. */
  private async lookAtCard(): Promise<void> {
    for (let lookedAt = performance.now(); !this.stopped; ) {
      await sleep(CARD_CHECK_MS, this.stopping.signal);
      if (this.stopped || performance.now() - lookedAt < (this.heartbeats?.intervalS ?? 15) * 1000 * CARD_LOOK_BEATS) continue;
      lookedAt = performance.now();
      await this.restoreCard();
    }
  }

  /**
   * A newer process serves this id (this one was stalled, or cut off, meanwhile): it must take
   * no more work and stop (§3.4). Its card and heartbeat stand, as the conditional retire leaves them.
   */
  private onReplaced(epoch: number): void {
    this.replacedBy = epoch;
    this.config.onReplaced();
  }

  /** What `Agent.run` throws once a newer process fenced this one out; null before. */
  replacedError(): AgentIdInUse | null {
    if (this.replacedBy === 0) return null;
    return new AgentIdInUse(
      `agent_id '${this.config.agentId}' was registered again by a newer process` +
        ` (epoch ${this.replacedBy}; this one's ${this.card?.epoch ?? 0}): this process stopped`,
    );
  }

  private checkNotStopped(): void {
    if (this.stopped) throw new ReachError("the agent was stopped while starting");
  }

  /** Stop taking work, let running handlers finish, mark the card stopped. */
  async stop(): Promise<void> {
    this.stopping.abort();
    // Routed nothing more, and what waits in its queues moves now (a fence keeps a fetch from running it).
    const draining = this.inFlight.size > 0 && !this.disconnected ? this.markCard("draining") : null;
    // Let each loop finish its current fetch: a pull request cut short would leave the
    // server delivering into a dead inbox, and that message would wait out the ack wait.
    await Promise.all([settleWithin(this.loops, FETCH_EXPIRES_MS * 2), draining]);
    this.executor?.fetchesOver(); // what it kept from its handlers goes back, now no pull is open
    const executor = this.executor;
    const abortAll = () => executor?.abortAll(new ReachError("the agent is stopping"));
    await drain({ inFlight: this.inFlight, recording: executor?.recording, abortAll, drainTimeoutMs: this.config.drainTimeoutMs, log: this.log });
    await this.heartbeats?.stop();
    if (this.card !== null && (await this.connectedWithin(STOP_RECONNECT_MS))) await this.retire();
    else if (this.card !== null) {
      // Each write would wait for the connection: a stop in an outage took 31 s (a trial).
      this.log.warn("NATS is unreachable: stopping without marking the card stopped; the coordinator will judge this agent gone by its missing heartbeats");
    }
    await this.presence.stop();
    this.log.info(this.card !== null ? "agent stopped" : "agent stopped before it registered");
  }

  /** Whether the connection is up, or comes back within `ms`. */
  private async connectedWithin(ms: number): Promise<boolean> {
    if (!this.disconnected) return true;
    return settleWithin([new Promise<void>((resolve) => this.connectedAgain.push(resolve))], ms);
  }

  /**
   * Card stopped and heartbeat deleted: the coordinator knows at once that this process
   * stopped rather than got lost. Neither is touched when a newer process of the id has
   * registered meanwhile (this one was cut off, say): what it wrote stands.
   */
  private async retire(): Promise<void> {
    if (!(await this.markCard("stopped"))) return;
    try {
      await this.heartbeats?.retire();
    } catch (err) {
      this.log.warn("heartbeat not deleted", { error: String(err) });
    }
  }

  private async markCard(status: "draining" | "stopped"): Promise<boolean> {
    if (this.card === null || this.cardRevision < 0) return false; // < 0: a newer process's card
    const card: AgentCard = { ...this.card, status };
    try {
      const kv = await this.conn.kv(this.conn.names.agentsBucket);
      // Conditional: a newer process of this id may have registered since; its card stands.
      this.cardRevision = await kv.update(this.config.agentId, encode(card), this.cardRevision);
      this.card = card;
      return true;
    } catch (err) {
      if (isWrongLastSequence(err)) {
        this.cardRevision = -1; // not written again (said once, not at draining and at stopped)
        this.log.warn("a newer process registered this agent id; its card stands");
      } else {
        this.log.warn(`card not marked ${status}`, { error: String(err) });
      }
      return false;
    }
  }

  // -- consuming --------------------------------------------------------------
  private async bind(priority: Priority): Promise<Consumer> {
    const { conn, config } = this;
    const stream = conn.names.dispatchStream(priority);
    const durable = conn.names.agentConsumer(config.agentId, priority);
    const settings = {
      ack_wait: nanos(config.ackWaitMs),
      max_ack_pending: config.capacity,
      max_deliver: config.maxDeliver,
      filter_subject: conn.names.dispatch(config.agentId, priority),
    };
    const wanted: Partial<ConsumerConfig> = {
      name: durable,
      durable_name: durable,
      ack_policy: AckPolicy.Explicit,
      deliver_policy: DeliverPolicy.All,
      ...settings,
    };
    try {
      await conn.jsm.consumers.add(stream, wanted);
    } catch (err) {
      if ((err as NatsError).api_error?.err_code !== CONSUMER_EXISTS) throw err;
      await conn.jsm.consumers.update(stream, durable, settings); // created by an earlier run
    }
    return conn.js.consumers.get(stream, durable);
  }

  /**
   * Fetch from the priority's consumer while the agent runs. A fetch that fails pauses the
   * loop (0.5, 1, 2 … s, capped at 5 s; one log line when it begins, one when it ends); when
   * the consumer or its stream is gone (a server that came back on an empty store, an
   * operator's delete), the consumer is made again with the same settings after each pause,
   * until its stream is there again (§6: the coordinator never makes it).
   */
  private async consume(priority: Priority, bound: Consumer, executor: Executor): Promise<void> {
    const pool = this.room.pools[priority];
    const signal = this.stopping.signal;
    const durable = this.conn.names.agentConsumer(this.config.agentId, priority);
    let consumer = bound;
    let pausedAt: number | null = null; // when fetching began to fail
    let remade = false; // the consumer was made again during this pause
    let retryMs = RETRY_FIRST_MS;
    while (!signal.aborted) {
      await pool.waitFree(signal);
      if (signal.aborted) break;
      try {
        const messages = await consumer.fetch({ max_messages: pool.free, expires: FETCH_EXPIRES_MS });
        for await (const msg of messages) {
          pool.take();
          this.spawn(this.handle(msg, pool, executor));
        }
      } catch (err) {
        const gone = consumerGone(err);
        if (pausedAt === null) {
          pausedAt = Date.now();
          const what = gone ? "dispatch consumer gone; making it again" : "fetch failed; retrying";
          this.log.warn(what, { priority, consumer: durable, error: String(err) });
        }
        await sleep(retryMs, signal); // a broken connection or a missing stream: do not spin
        retryMs = Math.min(RETRY_CAP_MS, retryMs * 2);
        if (gone && !signal.aborted) {
          const made = await this.remake(priority);
          if (made !== null) [consumer, remade] = [made, true];
        }
        continue;
      }
      if (pausedAt !== null) {
        const pausedS = Math.round((Date.now() - pausedAt) / 100) / 10;
        this.log.info("consuming again", { priority, consumer: durable, paused_s: pausedS, consumer_made_again: remade });
        [pausedAt, remade, retryMs] = [null, false, RETRY_FIRST_MS];
      }
    }
  }

  /** The consumer made again (create-or-update, the same settings), or null while it cannot be. */
  private async remake(priority: Priority): Promise<Consumer | null> {
    try {
      return await this.bind(priority);
    } catch (err) {
      // Its stream is not provisioned again yet, or the server is not there: the next
      // fetch fails too, and brings the loop back here after a longer pause.
      this.log.debug("dispatch consumer not made again yet", { priority, error: String(err) });
      return null;
    }
  }

  private spawn(work: Promise<void>): void {
    this.inFlight.add(work);
    void work.finally(() => this.inFlight.delete(work));
  }

  private async handle(msg: JsMsg, pool: WorkerPool, executor: Executor): Promise<void> {
    try {
      await executor.settle(msg);
    } catch (err) {
      // A bug here must not lose the message: it comes back later.
      this.log.error("task handling crashed; the message will be redelivered", { error: String(err) });
      quietly(() => msg.nak(5_000)); // the connection may be gone: then it is redelivered anyway
    } finally {
      pool.give();
    }
  }

  private load(): Load {
    return {
      in_flight: this.room.running,
      free_slots: this.room.free,
      latency_ms: this.executor?.latency.estimateMs ?? 0,
    };
  }
}

/**
 * Whether a fetch failed because its consumer, or the consumer's stream, is gone: an open
 * pull ended by `409 Consumer Deleted`, a pull request nobody answers (503, no responders:
 * no consumer of that name listens), or a look-up answered *consumer not found* (10014) or
 * *stream not found* (10059).
 */
export function consumerGone(err: unknown): boolean {
  const e = err as Partial<NatsError> | null | undefined;
  const apiCode = e?.api_error?.err_code;
  if (apiCode === CONSUMER_NOT_FOUND || apiCode === STREAM_NOT_FOUND) return true;
  if (e?.code === "503") return true;
  const message = String(e?.message ?? "").toLowerCase();
  if (e?.code === "409") return message.includes("consumer deleted");
  return message === "consumer not found" || message === "stream not found";
}

/** The micro service version: the handlers' one semver version, else 0.0.0. */
function serviceVersion(handlers: Map<string, HandlerSpec>): string {
  const versions = [...new Set([...handlers.values()].map((h) => h.version))];
  return versions.length === 1 && /^\d+\.\d+\.\d+$/.test(versions[0]!) ? versions[0]! : "0.0.0";
}
