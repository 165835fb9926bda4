/** The `Agent`: an identity, tags and handlers for topics, served over NATS. */

import { randomBytes } from "node:crypto";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";

import { TOKEN } from "./codec.js";
import { Connection } from "./connection.js";
import { DEFAULT_CLAIM_CHECK_BYTES } from "./claimcheck.js";
import { AgentConfigError, AgentIdInUse, ConnectError, ReachError } from "./errors.js";
import { checkingPayload } from "./failures.js";
import { jsonLogger } from "./log.js";
import type { Logger } from "./log.js";
import { Names, prefixProblem } from "./names.js";
import { AgentRuntime } from "./runtime.js";
import { connectionOptions, defaultServers, readCreds } from "./servers.js";
import type { Servers } from "./servers.js";
import { AGENT_OPTIONS, HANDLER_OPTIONS, onlyKnown } from "./options.js";
import { Signal } from "./timing.js";
import type { Handler, HandlerSpec } from "./execution.js";
import type { AgentCard, Intent, RateLimit } from "./types.js";

export const DEFAULT_IDENTITY_FILE = ".reach/agent-id";

export interface AgentOptions {
  /** 1-128 letters, digits, `_` or `-`; default: kept in `identityFile`, created on first use. */
  agentId?: string;
  identityFile?: string;
  tags?: Record<string, string>;
  /** Heartbeat every this many ms, ± 20 % jitter (default 15 000). */
  heartbeatIntervalMs?: number;
  /** Upper bound of the random delay before registering (default 60 000; 0 = none). */
  startupDelayMs?: number;
  /** The dispatch consumers' ack wait (default 10 000: a crashed run comes back well inside the default ttl). */
  ackWaitMs?: number;
  /** The dispatch consumers' max deliveries (default 5). */
  maxDeliver?: number;
  /**
   * How long `stop()` lets running handlers finish (default 10 000) before it aborts their
   * `ctx.signal`: keep it under the container's grace period.
   */
  drainTimeoutMs?: number;
  /** How fast the coordinator may send work, written on the card. */
  rateLimit?: RateLimit | null;
  /** Subject prefix (default `reach`). */
  prefix?: string;
  /** Where log lines go (default JSON lines on stderr from info up). */
  logger?: Logger;
  /** Timeout of each JetStream request (default 5 000). */
  requestTimeoutMs?: number;
  /**
   * Results whose JSON is larger than this many bytes go to the Object Store, the reply
   * carrying a reference (default 262 144: 256 KiB).
   */
  claimCheckBytes?: number;
  /**
   * A `.creds` file (a secured deployment): default `$NATS_CREDS`. Replies then come under
   * the inbox prefix `_INBOX_<name>` of the creds' user, which nobody else may read.
   */
  creds?: string;
}

export interface HandlerOptions<P = any> {
  version?: string;
  /**
   * Checks and converts the payload before the handler runs (a schema's `parse`, say): what
   * it throws fails the task at once as `invalid_payload`, not retried.
   */
  payload?: (payload: unknown) => P;
  /** Tasks of this topic run at once (default 10); the agent's capacity is the sum. */
  capacity?: number;
  /** The handler's own deadline; the task's execute budget still caps it. */
  deadlineMs?: number;
  /** Attempts the coordinator gives a task of this topic (default: the coordinator's). */
  maxAttempts?: number;
  /** What this intent is for, in words: the coordinator resolves free-text tasks by it. */
  description?: string;
  /** Requests this intent serves, as callers would write them (for the resolution too). */
  examples?: string[];
}

export type { Servers } from "./servers.js";

/**
 * An agent.
 *
 *     const agent = new Agent({ agentId: "summarizer-1", startupDelayMs: 0 });
 *     agent.handler("summarize", { version: "1.0.0", capacity: 4 }, async (ctx, payload) => {
 *       await ctx.progress("reading");
 *       return { summary: "..." };
 *     });
 *     await agent.start("nats://127.0.0.1:4222");   // registered and consuming
 *     ...
 *     await agent.stop();                            // drained, card stopped
 */
export class Agent {
  readonly agentId: string;
  readonly tags: Record<string, string>;
  readonly heartbeatIntervalMs: number;
  readonly startupDelayMs: number;
  readonly ackWaitMs: number;
  readonly maxDeliver: number;
  readonly drainTimeoutMs: number;
  readonly claimCheckBytes: number;
  readonly rateLimit: RateLimit | null;
  readonly names: Names;
  readonly creds: string | null;
  readonly handlers = new Map<string, HandlerSpec>();
  private readonly log: Logger;
  private readonly requestTimeoutMs: number;
  private conn: Connection | null = null;
  private runtime: AgentRuntime | null = null;
  private state: "new" | "starting" | "running" | "stopped" = "new";
  private startup: Promise<void> | null = null;
  private closing: Promise<void> | null = null;
  private readonly stopAsked = new Signal();
  private readonly aborted = new AbortController(); // a stop during start
  private registeredEpoch = 0;

  constructor(options: AgentOptions = {}) {
    onlyKnown("new Agent()", options, AGENT_OPTIONS, (m) => new AgentConfigError(m));
    this.agentId = resolveAgentId(options.agentId, options.identityFile ?? DEFAULT_IDENTITY_FILE);
    if (!TOKEN.test(this.agentId)) {
      throw new AgentConfigError(
        `agentId '${this.agentId}': use 1-128 letters, digits, '_' or '-' (it becomes part of NATS subjects)`,
      );
    }
    this.tags = { ...(options.tags ?? {}) };
    this.heartbeatIntervalMs = positive("heartbeatIntervalMs", options.heartbeatIntervalMs ?? 15_000);
    if (this.heartbeatIntervalMs > 300_000) {
      throw new AgentConfigError(`heartbeatIntervalMs must be at most 300000 (5 min), got ${this.heartbeatIntervalMs}`);
    }
    this.startupDelayMs = options.startupDelayMs ?? 60_000;
    if (!(this.startupDelayMs >= 0)) {
      throw new AgentConfigError(`startupDelayMs must be 0 or more, got ${this.startupDelayMs}`);
    }
    this.ackWaitMs = positive("ackWaitMs", options.ackWaitMs ?? 10_000);
    this.maxDeliver = options.maxDeliver ?? 5;
    this.drainTimeoutMs = positive("drainTimeoutMs", options.drainTimeoutMs ?? 10_000);
    if (!Number.isInteger(this.maxDeliver) || this.maxDeliver < 1) {
      throw new AgentConfigError(`maxDeliver must be a whole number of at least 1, got ${this.maxDeliver}`);
    }
    this.rateLimit = options.rateLimit ?? null;
    const prefixSaid = options.prefix === undefined ? null : prefixProblem(options.prefix);
    if (prefixSaid !== null) throw new AgentConfigError(prefixSaid);
    this.names = new Names(options.prefix);
    this.creds = options.creds ?? process.env.NATS_CREDS ?? null;
    this.log = options.logger ?? jsonLogger("info");
    this.requestTimeoutMs = positive("requestTimeoutMs", options.requestTimeoutMs ?? 5_000);
    this.claimCheckBytes = positive("claimCheckBytes", options.claimCheckBytes ?? DEFAULT_CLAIM_CHECK_BYTES);
  }

  /** Register `fn` as the handler of `topic`. */
  handler<P = any, R = unknown>(topic: string, fn: Handler<P, R>): this;
  handler<P = any, R = unknown>(topic: string, options: HandlerOptions<P>, fn: Handler<P, R>): this;
  handler(topic: string, optionsOrFn: HandlerOptions | Handler, maybeFn?: Handler): this {
    const [options, fn] = typeof optionsOrFn === "function" ? [{}, optionsOrFn] : [optionsOrFn, maybeFn];
    if (this.state !== "new") throw new AgentConfigError(`handler '${topic}': add handlers before start()`);
    onlyKnown(`handler '${topic}'`, options, HANDLER_OPTIONS, (m) => new AgentConfigError(m));
    if (!TOKEN.test(topic)) throw new AgentConfigError(`topic '${topic}': use 1-128 letters, digits, '_' or '-'`);
    if (this.handlers.has(topic)) throw new AgentConfigError(`topic '${topic}' already has a handler on ${this.agentId}`);
    if (typeof fn !== "function") throw new AgentConfigError(`handler for '${topic}' must be a function (ctx, payload)`);
    if (options.payload !== undefined && typeof options.payload !== "function") {
      throw new AgentConfigError(`payload of '${topic}' must be a function (payload) => checked payload`);
    }
    const capacity = options.capacity ?? 10;
    atLeastOne(topic, { capacity, deadlineMs: options.deadlineMs, maxAttempts: options.maxAttempts });
    const description = options.description ?? "";
    const examples = options.examples ?? [];
    if (typeof description !== "string") throw new AgentConfigError(`description of '${topic}' must be a string`);
    if (!Array.isArray(examples) || !examples.every((example) => typeof example === "string")) {
      throw new AgentConfigError(`examples of '${topic}' must be a list of strings`);
    }
    this.handlers.set(topic, {
      topic,
      fn: checkingPayload(topic, fn, options.payload),
      version: options.version ?? "1",
      capacity,
      deadlineMs: options.deadlineMs ?? null,
      maxAttempts: options.maxAttempts ?? null,
      description,
      examples: [...examples],
    });
    return this;
  }

  /** How many tasks this agent runs at once: the sum of its handlers' capacities. */
  get capacity(): number {
    let total = 0;
    for (const spec of this.handlers.values()) total += spec.capacity;
    return total;
  }

  /** The card this agent registers (host, pid, epoch and start time are filled in then). */
  card(): AgentCard {
    const intents: Record<string, Intent> = {};
    for (const [topic, spec] of this.handlers) {
      intents[topic] = {
        version: spec.version,
        capacity: spec.capacity,
        deadline_ms: spec.deadlineMs,
        max_attempts: spec.maxAttempts,
        description: spec.description,
        examples: spec.examples,
      };
    }
    return {
      v: 1,
      agent_id: this.agentId,
      intents,
      tags: this.tags,
      host: "",
      pid: 0,
      started_at: 0,
      epoch: 1,
      status: "running",
      rate_limit: this.rateLimit,
    };
  }

  /** This process's epoch: its registration number for the id (0 before it registered). */
  get epoch(): number {
    return this.registeredEpoch;
  }

  /** Connect, register and start consuming; resolves once the agent serves. */
  async start(servers: Servers = defaultServers()): Promise<void> {
    if (this.state !== "new") throw new ReachError("an Agent starts once; create a new one");
    if (this.handlers.size === 0) throw new AgentConfigError(`agent ${this.agentId} has no handlers`);
    this.state = "starting";
    this.startup = this.open(servers);
    try {
      await this.startup;
    } catch (err) {
      await this.shutDown(); // not stop(): run() must tell this failure from a stop asked for
      throw err;
    }
    this.registeredEpoch = this.runtime?.card?.epoch ?? 0;
    if (this.state === "starting") this.state = "running";
  }

  /**
   * Start, then serve until stop(). Rejects as start() does when the agent cannot start (a
   * ConnectError for a malformed URL, unusable creds, a server refusing them), and with
   * AgentIdInUse once a newer process of the id fenced this one out (it was stalled or cut
   * off meanwhile): this one then stopped on its own. A stop() during the start (Ctrl-C while
   * it connects) is a clean stop: it resolves.
   */
  async run(servers?: Servers): Promise<void> {
    try {
      await this.start(servers);
    } catch (err) {
      if (!this.stopAsked.isSet || err instanceof AgentIdInUse) throw err;
    }
    await this.stopAsked.wait();
    await this.closing;
    const replaced = this.runtime?.replacedError();
    if (replaced) throw replaced;
  }

  /**
   * Stop taking work, let running handlers finish, mark the card stopped, disconnect.
   * Safe to call at any time and more than once; a start under way gives up first.
   */
  stop(): Promise<void> {
    const closing = this.shutDown();
    this.stopAsked.set();
    return closing;
  }

  private shutDown(): Promise<void> {
    this.closing ??= this.close();
    return this.closing;
  }

  private async open(servers: Servers): Promise<void> {
    const creds = this.creds === null ? null : readCreds(this.creds, (m) => new ConnectError(m));
    const options = connectionOptions(servers, `agent:${this.agentId}`, creds);
    const conn = await Connection.open(options, this.names, this.requestTimeoutMs, this.log, this.aborted.signal);
    this.conn = conn;
    if (this.state !== "starting") throw new ReachError("the agent was stopped while starting");
    this.runtime = new AgentRuntime(
      {
        agentId: this.agentId,
        tags: this.tags,
        heartbeatIntervalMs: this.heartbeatIntervalMs,
        startupDelayMs: this.startupDelayMs,
        ackWaitMs: this.ackWaitMs,
        maxDeliver: this.maxDeliver,
        drainTimeoutMs: this.drainTimeoutMs,
        handlers: this.handlers,
        card: () => this.card(),
        capacity: this.capacity,
        claimCheckBytes: this.claimCheckBytes,
        // The stop's outcome reaches run() through `closing`.
        onReplaced: () => void this.stop().catch(() => undefined),
      },
      conn,
      this.log,
    );
    await this.runtime.start();
  }

  private async close(): Promise<void> {
    const was = this.state;
    this.state = "stopped";
    if (was === "new") return;
    this.aborted.abort();
    this.runtime?.interrupt();
    await this.startup?.catch(() => undefined); // let a start under way reach a stopping point
    try {
      await this.runtime?.stop();
    } finally {
      await this.conn?.close();
    }
  }
}

/** `agentId` if given; else the id kept in `identityFile`, created on first use. */
function resolveAgentId(agentId: string | undefined, identityFile: string): string {
  if (agentId) return agentId;
  try {
    const kept = readFileSync(identityFile, "utf8").trim();
    if (kept) return kept;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") {
      throw new AgentConfigError(`cannot read identity file ${identityFile}: ${(err as Error).message}`);
    }
  }
  const generated = `agent-${randomBytes(6).toString("hex")}`;
  try {
    mkdirSync(dirname(identityFile), { recursive: true });
    writeFileSync(identityFile, `${generated}\n`);
  } catch (err) {
    throw new AgentConfigError(`cannot write identity file ${identityFile}: ${(err as Error).message}`);
  }
  return generated;
}

function positive(name: string, value: number): number {
  if (typeof value !== "number") throw new AgentConfigError(`${name} must be a number, got ${JSON.stringify(value)}`);
  if (!(value > 0)) throw new AgentConfigError(`${name} must be positive, got ${value}`);
  return value;
}

function atLeastOne(topic: string, options: Record<string, number | undefined>): void {
  for (const [name, value] of Object.entries(options)) {
    if (value !== undefined && !(Number.isInteger(value) && value >= 1)) {
      throw new AgentConfigError(`${name} of '${topic}' must be a whole number of at least 1, got ${value}`);
    }
  }
}
