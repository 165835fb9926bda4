/**
 * The agent's side of liveness: one live process per id, probes, heartbeats.
 *
 * Heartbeats go to `reach_heartbeats/<agent_id>` every interval ± 20 %. The
 * coordinator judges them on its own receive time; the agent's clock travels
 * along only as information (a jump in it is reported as `clock_drift`).
 */

import { randomBytes } from "node:crypto";
import { performance } from "node:perf_hooks";
import { ErrorCode } from "nats";
import type { NatsError, Service, Subscription } from "nats";

import { decodeJson, encode, newId, nowMs } from "./codec.js";
import { isWrongLastSequence } from "./connection.js";
import type { Connection } from "./connection.js";
import { AgentIdInUse, ReachError } from "./errors.js";
import type { Keys } from "./keys.js";
import { emit, eventFor } from "./lifecycle.js";
import type { Logger } from "./log.js";
import { headersOf, sentByServer } from "./serveranswers.js";
import { jittered, Signal } from "./timing.js";
import { watchLag } from "./watchdog.js";
import type { AgentControl, Heartbeat, Task } from "./types.js";

const CLOCK_DRIFT_MS = 5_000;
const HERE = new TextEncoder().encode("here");
const PONG = new TextEncoder().encode("pong");

/**
 * Answers the coordinator's probes while the process lives. `presence` is a
 * plain subscription: once the process is gone the server answers "no
 * responders" at once. `ping` is an endpoint of the NATS micro service
 * `reach-agent`, so `nats micro ls` lists live agents.
 */
export class Presence {
  private sub: Subscription | null = null;
  private service: Service | null = null;

  constructor(
    private readonly conn: Connection,
    private readonly agentId: string,
    private readonly version: string,
    private readonly tags: Record<string, string>,
  ) {}

  /**
   * Refuse to start when another live process answers for this id. Only an answer counts:
   * a subscriber that answers nothing (`nats sub '>'`, a process whose loop is stuck) must
   * not keep the agent from starting; the new process's higher epoch fences a stuck one.
   */
  async checkFree(timeoutMs: number, log: Logger): Promise<void> {
    const { names, nc } = this.conn;
    const subject = names.presence(this.agentId);
    // The answer comes where an agent may publish (protocol §9), under a token nobody guesses.
    const reply = `${names.probeReplies(this.agentId)}.${randomBytes(16).toString("hex")}`;
    try {
      await nc.request(subject, new Uint8Array(), { timeout: timeoutMs, noMux: true, reply });
    } catch (err) {
      const code = (err as NatsError).code;
      if (code === ErrorCode.NoResponders) return;
      if (code !== ErrorCode.Timeout) throw err;
      log.warn("a subscriber on the presence subject did not answer; starting anyway", { subject });
      return;
    }
    throw new AgentIdInUse(
      `agent_id '${this.agentId}' is in use by another live process; stop it or start this one with another id`,
    );
  }

  async start(): Promise<void> {
    const { nc, names } = this.conn;
    this.sub = nc.subscribe(names.presence(this.agentId), {
      callback: (_err, msg) => answer(msg, HERE),
    });
    this.service = await nc.services.add({
      name: "reach-agent",
      version: this.version,
      description: `Agent-Reach agent ${this.agentId}`,
      metadata: { ...this.tags, agent_id: this.agentId },
    });
    this.service.addEndpoint("ping", {
      subject: names.ping(this.agentId),
      handler: (_err, msg) => answer(msg, PONG),
    });
  }

  /** Stop answering; safe to call twice. */
  async stop(): Promise<void> {
    const { service, sub } = this;
    this.service = null;
    this.sub = null;
    try {
      await service?.stop();
    } catch {
      // the connection may be gone already
    }
    sub?.unsubscribe();
  }
}

/** What the heartbeat reports about the agent's load. */
export interface Load {
  in_flight: number;
  free_slots: number;
  latency_ms: number;
}

/** A newer process of this agent id heartbeats: this one is fenced out. */
class Replaced extends ReachError {
  override name = "Replaced";

  constructor(readonly epoch: number) {
    super(`a newer process of this agent id heartbeats (epoch ${epoch})`);
  }
}

/** Writes a heartbeat every interval ± 20 % and applies the coordinator's instructions. */
export class Heartbeats {
  intervalS: number;
  /** Of this process's last heartbeat written (0: none yet). */
  revision = 0;
  private seq = 0;
  private readonly wake = new Signal();
  private stopping = false;
  private last: [number, number] | null = null; // (wall ms, monotonic ms) at the last beat
  private running: Promise<void> | null = null;
  private control: Subscription | null = null;
  private stopWatching: () => void = () => undefined;
  private refused = ""; // the refusals last told (as JSON): each set is logged once

  constructor(
    private readonly conn: Connection,
    private readonly agentId: string,
    private readonly epoch: number,
    intervalS: number,
    private readonly load: () => Load,
    private readonly log: Logger,
    /**
     * Told the epoch of a newer process of the id once one is found heartbeating (this
     * process was stalled or cut off meanwhile); beating then stops.
     */
    private readonly onReplaced: (epoch: number) => void = () => undefined,
  ) {
    this.intervalS = intervalS;
  }

  start(): void {
    this.control = this.conn.nc.subscribe(this.conn.names.agentControl(this.agentId), {
      callback: (_err, msg) => {
        const headers = headersOf(msg);
        if (sentByServer(msg.data, headers, { headed: true }) !== null) return; // nobody's
        if (headers?.get("Reach-Kind") !== "control") {
          this.log.warn("ignoring a control message without the header Reach-Kind: control");
          return;
        }
        this.onControl(msg.data);
      },
    });
    this.running = this.run().catch((err: unknown) => {
      this.log.error("heartbeats stopped", { error: String(err) });
    });
    this.stopWatching = watchLag(this.log, this.intervalS * 1000);
  }

  async stop(): Promise<void> {
    this.stopping = true;
    this.stopWatching();
    this.wake.set();
    this.control?.unsubscribe();
    await this.running;
  }

  /**
   * Delete the heartbeat (the coordinator then knows at once that the agent stopped),
   * unless another process wrote one since this process's last: that one is live.
   */
  async retire(): Promise<void> {
    const kv = await this.conn.kv(this.conn.names.heartbeatsBucket);
    try {
      await kv.delete(this.agentId, this.revision ? { previousSeq: this.revision } : {});
    } catch (err) {
      if (!isWrongLastSequence(err)) throw err;
      this.log.warn("another process heartbeats for this agent id; its heartbeat stands");
    }
  }

  private async run(): Promise<void> {
    const kv = await this.conn.kv(this.conn.names.heartbeatsBucket);
    while (!this.stopping) {
      // Cleared before the beat: a new interval that arrives while the beat is being
      // written must still wake the wait below, or its "beat at once" is lost.
      this.wake.clear();
      try {
        await this.beat(kv);
      } catch (err) {
        if (!(err instanceof Replaced)) throw err;
        this.log.error("a newer process of this agent id heartbeats; this one stops", {
          epoch: this.epoch,
          newer_epoch: err.epoch,
        });
        this.onReplaced(err.epoch);
        return;
      }
      await delay(jittered(this.intervalS * 1000), this.wake);
    }
  }

  private async beat(kv: Keys): Promise<void> {
    this.seq += 1;
    const wall = nowMs();
    const mono = performance.now();
    const beat: Heartbeat = {
      v: 1,
      agent_id: this.agentId,
      epoch: this.epoch,
      seq: this.seq,
      interval_s: this.intervalS,
      ...this.load(),
      agent_time_ms: wall,
    };
    try {
      this.revision = await this.write(kv, encode(beat));
    } catch (err) {
      if (err instanceof Replaced) throw err;
      this.log.warn("heartbeat not written", { error: String(err) });
    }
    await this.checkClock(wall, mono);
  }

  /**
   * Write `beat` on this process's last one: a write in between was another process's, and
   * one of a higher epoch fences this process out (throws Replaced). Anything else in between
   * (a store that came back empty) is written over.
   */
  private async write(kv: Keys, beat: Uint8Array): Promise<number> {
    if (this.revision) {
      try {
        return await kv.update(this.agentId, beat, this.revision);
      } catch (err) {
        if (!isWrongLastSequence(err)) throw err;
        const epoch = await this.currentEpoch(kv);
        if (epoch > this.epoch) throw new Replaced(epoch);
      }
    }
    return kv.put(this.agentId, beat);
  }

  /**
   * The epoch of the heartbeat the key holds; 0 when it holds none, or none readable, or one
   * without headers (every process's carry some: a no_hdr copy fenced an agent out), or one
   * naming another agent (written with this agent's creds, by no process of this id).
   */
  private async currentEpoch(kv: Keys): Promise<number> {
    const entry = await kv.last(this.agentId);
    if (entry === null || entry.operation !== "PUT" || entry.nobodys || !entry.headed) return 0;
    try {
      const beat = decodeJson(entry.value) as Partial<Heartbeat> | null;
      if (beat?.agent_id !== this.agentId) {
        this.log.warn("a heartbeat on this agent's key names another agent; written over", { named: beat?.agent_id });
        return 0;
      }
      return Number.isInteger(beat.epoch) ? (beat.epoch as number) : 0;
    } catch {
      return 0;
    }
  }

  private async checkClock(wall: number, mono: number): Promise<void> {
    const last = this.last;
    this.last = [wall, mono];
    if (last === null) return;
    const driftMs = wall - last[0] - (mono - last[1]);
    if (Math.abs(driftMs) <= CLOCK_DRIFT_MS) return;
    const driftS = Math.round(driftMs) / 1000;
    this.log.warn("clock drift", { drift_s: driftS });
    try {
      await emit(this.conn, agentEvent(this.agentId, "clock_drift", { drift_s: driftS }), this.agentId);
    } catch {
      // informational only
    }
  }

  private sayRefused(control: AgentControl): void {
    const refused = refusalsTold(control);
    if (refused === null || JSON.stringify(refused) === this.refused) return;
    this.refused = JSON.stringify(refused);
    const count = control.refused_count ?? Object.keys(refused).length;
    const said = Object.fromEntries(Object.entries(refused).slice(0, 10)); // a line, not a flood
    this.log.warn("the coordinator routes this agent no task of these intents", { agent_id: this.agentId, refused: said, count });
  }

  private onControl(data: Uint8Array): void {
    let control: AgentControl;
    try {
      control = decodeJson(data) as AgentControl;
    } catch (err) {
      this.log.warn("ignoring unreadable control message", { error: String(err) });
      return;
    }
    this.sayRefused(control);
    const interval = control?.heartbeat_interval_s;
    if (typeof interval === "number" && interval > 300) {
      // Beats of a longer interval are ignored by the coordinator (protocol §7): the agent would
      // look silent. No coordinator asks for one; someone else did.
      this.log.warn("ignoring a heartbeat interval over 300 s", { interval_s: interval });
      return;
    }
    if (typeof interval === "number" && interval > 0) {
      this.log.info("heartbeat interval changed", { interval_s: interval });
      this.intervalS = interval;
      this.wake.set(); // beat now, so the coordinator sees the new interval at once
    }
  }
}

/** The intents of the card the coordinator routes no task of, with why (protocol §8). */
function refusalsTold(control: AgentControl): Record<string, string> | null {
  const refused = control?.refused;
  return refused && typeof refused === "object" && Object.keys(refused).length > 0 ? refused : null;
}

/** An event about an agent rather than a task: topic `_agent`, trace = the agent id. */
export function agentEvent(agentId: string, event: string, detail: Record<string, unknown>) {
  const about = { message_id: newId(), trace_id: agentId, topic: "_agent", attempt: 1, from_agent: null } as Task;
  return eventFor(about, event, agentId, detail);
}

/** Resolves after `ms` or when `cancel` is set, whichever comes first; never leaks a timer. */
function delay(ms: number, cancel: Signal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    void cancel.wait().then(() => {
      clearTimeout(timer);
      resolve();
    });
  });
}

/** Whether `subject` is a requester's inbox (`_INBOX.…`, or a party's `_INBOX_<name>.…`): an
 * answer to any other subject would be this agent's own write there (its heartbeat's key). */
export function isInbox(subject: string | undefined): boolean {
  const head = (subject ?? "").split(".", 1)[0] ?? "";
  return head === "_INBOX" || head.startsWith("_INBOX_");
}

function answer(msg: { reply?: string; respond(data: Uint8Array): boolean }, data: Uint8Array): void {
  if (isInbox(msg.reply)) msg.respond(data);
}
