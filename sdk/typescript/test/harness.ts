/**
 * Real processes for the tests: a nats-server with JetStream on a free loopback
 * port, and the Python coordinator (`reach up --nats-url …`). Everything started
 * here is stopped by the returned `stop()`; every wait is bounded.
 */

import { spawn } from "node:child_process";
import type { ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, connect as netConnect } from "node:net";
import type { Server as NetServer, Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { connect, createInbox, credsAuthenticator, headers } from "nats";
import type { JetStreamManager, KV, Msg, NatsConnection, Subscription } from "nats";

import type { Event, Reply, Task } from "../src/index.js";
import { newId } from "../src/index.js";

/** The package root (tests run from build/test/). */
export const PACKAGE_ROOT = fileURLToPath(new URL("../../", import.meta.url));
const VENV_BIN = join(PACKAGE_ROOT, "..", "..", ".venv", "bin");

export function binary(envName: string, name: string): string {
  const path = process.env[envName] ?? join(VENV_BIN, name);
  if (!existsSync(path)) throw new Error(`${name} not found at ${path}; set ${envName}`);
  return path;
}

export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      server.close(() => (typeof address === "object" && address ? resolve(address.port) : reject(new Error("no port"))));
    });
  });
}

/** Resolve when `child` writes a line containing `marker` (stdout or stderr), else reject. */
function waitForOutput(child: ChildProcess, marker: string, timeoutMs: number, what: string): Promise<void> {
  return new Promise((resolve, reject) => {
    let seen = "";
    const timer = setTimeout(() => finish(new Error(`${what} not ready within ${timeoutMs} ms:\n${seen.slice(-2000)}`)), timeoutMs);
    const onData = (chunk: Buffer) => {
      seen += chunk.toString();
      if (seen.includes(marker)) finish();
    };
    const onExit = (code: number | null) => finish(new Error(`${what} exited (${code}) before ready:\n${seen.slice(-2000)}`));
    function finish(err?: Error): void {
      clearTimeout(timer);
      child.stdout?.off("data", onData);
      child.stderr?.off("data", onData);
      child.off("exit", onExit);
      if (err) reject(err);
      else resolve();
    }
    child.stdout?.on("data", onData);
    child.stderr?.on("data", onData);
    child.once("exit", onExit);
  });
}

/** A nats-server with JetStream on loopback `port`, its store in `storeDir`, once ready. */
export async function startServer(port: number, storeDir: string): Promise<ChildProcess> {
  const server = spawn(binary("NATS_SERVER_BIN", "nats-server"), ["-js", "-a", "127.0.0.1", "-p", String(port), "-sd", storeDir], {
    stdio: ["ignore", "pipe", "pipe"],
  });
  try {
    await waitForOutput(server, "Server is ready", 10_000, "nats-server");
  } catch (err) {
    await terminate(server);
    throw err;
  }
  return server;
}

/** `reach provision` against `url`: the streams and buckets an agent waits for. */
export async function provision(url: string): Promise<void> {
  const child = spawn(binary("REACH_BIN", "reach"), ["provision", "--nats-url", url], { stdio: "ignore" });
  const code = await new Promise((resolve) => child.once("exit", resolve));
  if (code !== 0) throw new Error(`reach provision exited ${String(code)}`);
}

/** SIGTERM, then SIGKILL if it has not exited within `graceMs`. */
export async function terminate(child: ChildProcess, graceMs = 5_000): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
  await exited;
  clearTimeout(timer);
}

export interface Stack {
  url: string;
  nc: NatsConnection;
  jsm: JetStreamManager;
  coordinatorLog: () => string;
  stop(): Promise<void>;
}

/** Test-speed coordinator settings: quick retries and liveness sweeps. */
const COORDINATOR_CONFIG = `
delivery: {base_s: 0.2, cap_s: 1.0}
liveness: {tick_s: 0.2}
rate_limits: {callers: {ts-carol: {rate: 0.05, burst: 2}}}
workflows:
  ts-held: {chain: [{name: a, intent: ts-hold}]}
  ts-approval:
    states:
      initial: submitted
      states:
        submitted:
          intent: ts-check
          next: [{event: approve, to: approved}, {event: reject, to: rejected}]
        approved: {terminal: true, input: {ok: true}}
        rejected: {terminal: true, input: {ok: false}}
  ts-steps:
    states:
      initial: first
      states:
        first: {next: [{event: go, to: second}]}
        second: {next: [{event: go, to: done}]}
        done: {terminal: true, input: {went: 2}}
  ts-growing:
    states:
      initial: a
      states:
        a: {intent: ts-bulk, next: [{event: go, to: b}]}
        b: {intent: ts-bulk, next: [{event: go, to: c}]}
        c: {intent: ts-bulk, next: [{event: go, to: done}]}
        done: {terminal: true}
`;

export interface RestartableStack extends Stack {
  port: number;
  /** Stop nats-server and start it again on the same port and store, as `reach up` restarted. */
  restartServer(): Promise<void>;
  /**
   * Make nats-server stop answering for `ms` (SIGSTOP, then SIGCONT): a server away. Resolves
   * once every thread of it is stopped (a signal is only queued when kill returns: on a busy
   * machine the server may still answer a request sent just after).
   */
  pauseServer(ms: number): Promise<void>;
}

/** A nats-server, the Python coordinator on it, and a client connection. */
export async function startStack(): Promise<RestartableStack> {
  const dir = mkdtempSync(join(tmpdir(), "reach-ts-"));
  const port = await freePort();
  const url = `nats://127.0.0.1:${port}`;
  const children: ChildProcess[] = [];
  let server: ChildProcess | null = null;
  let nc: NatsConnection | null = null;
  const stop = async () => {
    await nc?.close();
    for (const child of children.reverse()) await terminate(child);
    if (server !== null) await terminate(server);
    rmSync(dir, { recursive: true, force: true });
  };
  const restartServer = async () => {
    if (server !== null) await terminate(server);
    server = null;
    server = await startServer(port, join(dir, "js"));
  };
  try {
    await restartServer();
    const configPath = join(dir, "coordinator.yaml");
    writeFileSync(configPath, COORDINATOR_CONFIG);
    const coordinator = startCoordinator(["up", "--nats-url", url, "--config", configPath], dir);
    children.push(coordinator.child);
    await waitForOutput(coordinator.child, "coordinator serving on", 60_000, "reach up");
    nc = await connect({ servers: url, name: "test-client" });
    const jsm = await nc.jetstreamManager();
    const pauseServer = async (ms: number) => {
      const paused = server;
      paused?.kill("SIGSTOP");
      setTimeout(() => paused?.kill("SIGCONT"), ms);
      if (paused?.pid !== undefined) await allThreadsStopped(paused.pid);
    };
    return { url, port, nc, jsm, coordinatorLog: coordinator.log, restartServer, pauseServer, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** Until every thread of process `pid` is stopped (state T in /proc), for at most 10 s. */
async function allThreadsStopped(pid: number): Promise<void> {
  const stopped = () =>
    readdirSync(`/proc/${pid}/task`).every((tid) => {
      const stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, "utf8");
      return /^[tT]$/.test(stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3));
    });
  for (const until = Date.now() + 10_000; !stopped() && Date.now() < until; ) {
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

/**
 * A TCP relay to `targetPort` that a test shuts (the connections through it drop, new ones
 * are refused) and opens again: one party kept away while the others are back.
 */
export class Relay {
  private server: NetServer | null = null;
  private readonly sockets = new Set<Socket>();

  private constructor(
    readonly port: number,
    private readonly targetPort: number,
  ) {}

  static async to(targetPort: number): Promise<Relay> {
    const relay = new Relay(await freePort(), targetPort);
    await relay.open();
    return relay;
  }

  get url(): string {
    return `nats://127.0.0.1:${this.port}`;
  }

  async open(): Promise<void> {
    const server = createServer((down) => {
      const up = netConnect(this.targetPort, "127.0.0.1");
      for (const socket of [down, up]) {
        this.sockets.add(socket);
        socket.on("close", () => this.sockets.delete(socket));
        socket.on("error", () => undefined); // the other side's close ends both
      }
      down.pipe(up).on("close", () => down.destroy());
      up.pipe(down).on("close", () => up.destroy());
      up.on("close", () => down.destroy());
      down.on("close", () => up.destroy());
    });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(this.port, "127.0.0.1", () => resolve());
    });
    this.server = server;
  }

  async shut(): Promise<void> {
    const server = this.server;
    this.server = null;
    for (const socket of this.sockets) socket.destroy();
    if (server !== null) await new Promise<void>((resolve) => server.close(() => resolve()));
  }
}

function startCoordinator(args: string[], cwd: string): { child: ChildProcess; log: () => string } {
  const child = spawn(binary("REACH_BIN", "reach"), [...args, "--log-format", "json"], {
    stdio: ["ignore", "pipe", "pipe"],
    cwd,
  });
  let log = "";
  child.stderr?.on("data", (chunk: Buffer) => (log += chunk.toString()));
  return { child, log: () => log };
}

/** Run `reach ARGS…` to its end; rejects with its output when it fails. */
async function reach(args: string[]): Promise<void> {
  const child = spawn(binary("REACH_BIN", "reach"), args, { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout?.on("data", (chunk: Buffer) => (out += chunk.toString()));
  child.stderr?.on("data", (chunk: Buffer) => (out += chunk.toString()));
  const code = await new Promise((resolve) => child.once("exit", resolve));
  if (code !== 0) throw new Error(`reach ${args.join(" ")} exited ${String(code)}:\n${out}`);
}

export interface SecuredStack extends Stack {
  /** The creds file of a new party (`reach auth <role> <name>`): role agent, caller, … */
  creds(role: "agent" | "caller" | "worker" | "operator", name: string): Promise<string>;
}

/**
 * A secured deployment: `reach auth init`, a nats-server that admits only its users
 * (decentralized JWT auth, loopback), the streams provisioned by an operator, and the
 * coordinator with its own creds and the seal key. `nc` is an operator's (`admin`).
 */
export async function startSecuredStack(): Promise<SecuredStack> {
  const dir = mkdtempSync(join(tmpdir(), "reach-ts-secured-"));
  const auth = join(dir, "auth");
  const port = await freePort();
  const url = `nats://127.0.0.1:${port}`;
  const children: ChildProcess[] = [];
  let nc: NatsConnection | null = null;
  const stop = async () => {
    await nc?.close();
    for (const child of children.reverse()) await terminate(child);
    rmSync(dir, { recursive: true, force: true });
  };
  const creds = async (role: string, name: string) => {
    if (role === "agent") {
      // An agent serves only the intents its operator allows: any, here, applied by a push.
      await reach(["auth", role, name, "--dir", auth, "--intents", "*"]);
      await reach(["auth", "push", "--dir", auth, "--nats-url", url]);
    } else {
      await reach(["auth", role, name, "--dir", auth]);
    }
    return join(auth, "creds", role, `${name}.creds`);
  };
  try {
    await reach(["auth", "init", "--dir", auth]);
    const serverConfig = join(auth, "server", "nats-server.conf");
    writeFileSync(
      serverConfig,
      `listen: "127.0.0.1:${port}"\njetstream { store_dir: "${join(dir, "js")}" }\ninclude "auth.conf"\n`,
    );
    const server = spawn(binary("NATS_SERVER_BIN", "nats-server"), ["-c", serverConfig], { stdio: ["ignore", "pipe", "pipe"] });
    children.push(server);
    await waitForOutput(server, "Server is ready", 10_000, "nats-server (secured)");
    const admin = join(auth, "creds", "operator", "admin.creds");
    await reach(["provision", "--nats-url", url, "--creds", admin]);
    const configPath = join(dir, "coordinator.yaml");
    writeFileSync(configPath, `${COORDINATOR_CONFIG}security: {seal_key_file: "${join(auth, "coordinator.seal")}"}\n`);
    const coordinatorCreds = join(auth, "creds", "coordinator", "coordinator.creds");
    const coordinator = startCoordinator(["coordinator", "--nats-url", url, "--creds", coordinatorCreds, "--config", configPath], dir);
    children.push(coordinator.child);
    await waitForOutput(coordinator.child, "coordinator serving on", 60_000, "reach coordinator (secured)");
    nc = await connect({
      servers: url,
      name: "test-admin",
      authenticator: credsAuthenticator(new Uint8Array(readFileSync(admin))),
      inboxPrefix: "_INBOX_admin",
    });
    const jsm = await nc.jetstreamManager();
    return { url, nc, jsm, coordinatorLog: coordinator.log, stop, creds };
  } catch (err) {
    await stop();
    throw err;
  }
}

/** Messages on one subject (wildcards allowed), with a bounded wait for a matching one. */
export class Watcher<T = unknown> {
  readonly seen: Array<{ subject: string; body: T; msg: Msg }> = [];
  private readonly sub: Subscription;
  private waiters: Array<() => void> = [];

  constructor(nc: NatsConnection, subject: string) {
    this.sub = nc.subscribe(subject, {
      callback: (_err, msg) => {
        let body: T;
        try {
          body = msg.json<T>();
        } catch {
          body = msg.string() as T;
        }
        this.seen.push({ subject: msg.subject, body, msg });
        const waiters = this.waiters;
        this.waiters = [];
        for (const wake of waiters) wake();
      },
    });
  }

  /** The first message (seen before or arriving within `timeoutMs`) that `match` accepts. */
  async next(match: (body: T, subject: string) => boolean, timeoutMs = 10_000, what = "message"): Promise<T> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const found = this.seen.find((m) => match(m.body, m.subject));
      if (found) return found.body;
      const left = deadline - Date.now();
      if (left <= 0) {
        const seen = this.seen.map((m) => m.subject).join("\n  ");
        throw new Error(`no ${what} within ${timeoutMs} ms on ${this.sub.getSubject()}; seen:\n  ${seen}`);
      }
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  count(match: (body: T, subject: string) => boolean): number {
    return this.seen.filter((m) => match(m.body, m.subject)).length;
  }

  close(): void {
    this.sub.unsubscribe();
  }
}

/** A full task envelope, as a client would send it. */
export function task(topic: string, payload: unknown, fields: Partial<Task> = {}): Task {
  const messageId = fields.message_id ?? newId();
  return {
    kind: "task",
    v: 1,
    message_id: messageId,
    trace_id: messageId,
    topic,
    payload,
    from_agent: null,
    to_agent: null,
    attempt: 1,
    created_at: Date.now(),
    ttl_ms: 30_000,
    reply_to: null,
    priority: "P1",
    budget: { seek_ms: 1_000, ack_ms: 2_000, execute_ms: 20_000 },
    replay_of: null,
    replays: 0,
    requeued: 0,
    caller: null,
    headers: {},
    received_ms: 0,
    traceparent: null,
    payload_ref: null,
    resolution: null,
    ...fields,
  };
}

/** Publish `t` with its own reply inbox; `replies` collects what comes back. */
export async function send(
  stack: Stack,
  t: Task,
  options: { subject?: string; msgId?: string } = {},
): Promise<Watcher<Reply>> {
  const inbox = t.reply_to ?? createInbox();
  const replies = new Watcher<Reply>(stack.nc, inbox);
  await stack.nc.flush(); // the inbox subscription exists before any reply can come
  const withReply = { ...t, reply_to: inbox };
  const h = headers();
  h.set("Nats-Msg-Id", options.msgId ?? t.message_id);
  h.set("Reach-Trace-Id", t.trace_id);
  const js = stack.nc.jetstream();
  await js.publish(options.subject ?? `reach.task.${t.topic}`, JSON.stringify(withReply), { headers: h });
  return replies;
}

/**
 * The coordinator's `routed` event giving `t`'s attempt to `agentId`, for a test that puts a
 * task in an agent's queue itself: the coordinator counts an agent's outcome only of an
 * attempt routed to it.
 */
export async function routedTo(stack: Stack, t: Task, agentId: string): Promise<void> {
  const event = { v: 1, kind: "event", event: "routed", message_id: t.message_id, trace_id: t.trace_id, topic: t.topic, agent_id: agentId, attempt: t.attempt ?? 1, at_ms: Date.now(), detail: {} };
  const subject = `reach.event.routed.${t.topic}.${t.trace_id}.${t.message_id}._coordinator`;
  // With headers, as the coordinator's own: a stored event with none is taken for a server's answer.
  const h = headers();
  h.set("Nats-Msg-Id", `${t.message_id}-routed-${t.attempt ?? 1}-_coordinator-${agentId}`);
  await stack.nc.jetstream().publish(subject, JSON.stringify(event), { headers: h });
}

/** Events of one message, as they are published. */
export function eventsOf(stack: Stack, messageId: string): Watcher<Event> {
  return new Watcher<Event>(stack.nc, `reach.event.*.*.*.${messageId}.*`);
}

/** Wait until `kv[key]` satisfies `match` (null: the key is absent or deleted). */
export async function kvUntil<T>(kv: KV, key: string, match: (value: T | null) => boolean, timeoutMs = 10_000): Promise<T | null> {
  const watch = await kv.watch({ key });
  const timer = setTimeout(() => watch.stop(), timeoutMs);
  try {
    for await (const entry of watch) {
      const value = entry.operation === "PUT" ? (entry.json<T>() as T) : null;
      if (match(value)) return value;
    }
  } finally {
    clearTimeout(timer);
    watch.stop();
  }
  throw new Error(`${kv.constructor.name} key ${key}: no matching value within ${timeoutMs} ms`);
}

/** A promise that the test opens by hand (a handler waiting for the test's cue). */
export class Gate {
  readonly opened: Promise<void>;
  open!: () => void;

  constructor() {
    this.opened = new Promise((resolve) => {
      this.open = resolve;
    });
  }
}

/** What a dispatch carries at least: one with no headers is taken for a server's answer (no_hdr). */
export function dispatchHeaders(): ReturnType<typeof headers> {
  const h = headers();
  h.set("Reach-Kind", "task");
  return h;
}

/** What the coordinator's control message to an agent carries: one without headers is nobody's. */
export function controlHeaders(): ReturnType<typeof headers> {
  const h = headers();
  h.set("Reach-Kind", "control");
  return h;
}
