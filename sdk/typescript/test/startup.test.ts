/**
 * An agent that cannot start says so: run() and start() reject with a ConnectError naming what
 * is wrong, rather than resolving as if stopped (a process that exited 0, having served nothing).
 * No server is needed: each start fails, or waits, before one would be asked anything.
 */

import assert from "node:assert/strict";
import { describe, it } from "node:test";
import { createServer } from "node:net";
import type { Socket } from "node:net";

import { Agent, ConnectError, ReachClient } from "../src/index.js";
import type { Fields, Logger } from "../src/log.js";
import { DEFAULT_SERVER, defaultServers } from "../src/servers.js";
import { freePort } from "./harness.js";

const quiet: Logger = { debug() {}, info() {}, warn() {}, error() {} };

/** A logger that keeps every line, and says when one with `event` comes. */
class Lines implements Logger {
  readonly seen: Array<{ event: string; fields: Fields; atMs: number }> = [];
  private waiters: Array<() => void> = [];
  debug = (event: string, fields: Fields = {}) => this.keep(event, fields);
  info = (event: string, fields: Fields = {}) => this.keep(event, fields);
  warn = (event: string, fields: Fields = {}) => this.keep(event, fields);
  error = (event: string, fields: Fields = {}) => this.keep(event, fields);

  private keep(event: string, fields: Fields): void {
    this.seen.push({ event, fields, atMs: performance.now() });
    for (const wake of this.waiters.splice(0)) wake();
  }

  async next(event: string, timeoutMs = 10_000): Promise<Fields> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const found = this.seen.find((line) => line.event === event);
      if (found) return found.fields;
      if (performance.now() > deadline) throw new Error(`no '${event}' line within ${timeoutMs} ms`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, 100);
        this.waiters.push(() => (clearTimeout(timer), resolve()));
      });
    }
  }
}

function newAgent(options: ConstructorParameters<typeof Agent>[0] = {}): Agent {
  return new Agent({ agentId: "ts-start-1", startupDelayMs: 0, logger: quiet, ...options }).handler("echo", (_ctx, p) => p);
}

async function rejectsWith(running: Promise<void>, message: RegExp): Promise<void> {
  await assert.rejects(running, (err: unknown) => {
    assert.ok(err instanceof ConnectError, `${String(err)}: not a ConnectError`);
    assert.match(err.message, message);
    return true;
  });
}

describe("an agent that cannot start", () => {
  it("rejects run() with ConnectError naming a malformed URL, an http:// one, an empty one", async () => {
    await rejectsWith(newAgent().run("nats//127.0.0.1:35200"), /^'nats\/\/127\.0\.0\.1:35200' is not a NATS server URL: '\/\/127\.0\.0\.1:35200' follows the host/);
    await rejectsWith(newAgent().run("http://127.0.0.1:35201"), /^'http:\/\/127\.0\.0\.1:35201' is not a NATS server URL: the scheme 'http' is not nats or tls/);
    await rejectsWith(newAgent().run(""), /^no NATS server URL given \(""\)/);
    await rejectsWith(newAgent().run("nats://127.0.0.1:1, nats://127.0.0.1:99999"), /^'nats:\/\/127\.0\.0\.1:99999' is not a NATS server URL/);
    await rejectsWith(newAgent().start("nats://user:secret@127.0.0.1:1/x"), /^'nats:\/\/\*\*\*@127\.0\.0\.1:1\/x' is not/);
  });

  it("refuses ReachClient.connect() to a malformed URL the same way, naming it", async () => {
    await assert.rejects(ReachClient.connect("http://127.0.0.1:35202"), (err: unknown) => {
      assert.ok(err instanceof ConnectError, String(err));
      assert.match(err.message, /the scheme 'http' is not nats or tls/);
      return true;
    });
  });

  it("rejects run() with ConnectError naming a creds file that is missing", async () => {
    await rejectsWith(newAgent({ creds: "/missing.creds" }).run("nats://127.0.0.1:35203"), /^cannot read creds file \/missing\.creds: /);
  });

  it("takes $NATS_URL set but empty as unset, as the Python SDK does", () => {
    const kept = process.env.NATS_URL;
    process.env.NATS_URL = "";
    try {
      assert.equal(defaultServers(), DEFAULT_SERVER);
    } finally {
      if (kept === undefined) delete process.env.NATS_URL;
      else process.env.NATS_URL = kept;
    }
  });

  it("waits for a host that does not resolve, saying so, as for a server not up yet", async () => {
    const lines = new Lines();
    const agent = newAgent({ logger: lines });
    const running = agent.run("nats://no-such-host.invalid:4222");
    const waiting = await lines.next("waiting for NATS");
    assert.equal(waiting.servers, "nats://no-such-host.invalid:4222");
    assert.match(String(waiting.error), /no-such-host\.invalid/);
    await agent.stop();
    await running; // a stop while it waits is a clean stop
  });

  it("says nothing more once stopped while a connect is under way", async () => {
    // A server that accepts and never speaks: each connect takes its whole timeout (2 s).
    const sockets = new Set<Socket>();
    const silent = createServer((socket) => sockets.add(socket));
    const port = await freePort();
    await new Promise<void>((resolve) => silent.listen(port, "127.0.0.1", resolve));
    try {
      const lines = new Lines();
      const agent = newAgent({ logger: lines });
      const running = agent.run(`nats://127.0.0.1:${port}`);
      await new Promise((resolve) => setTimeout(resolve, 200)); // the connect is under way
      const stoppedAt = performance.now();
      await agent.stop();
      await running;
      const after = lines.seen.filter((line) => line.event === "waiting for NATS" && line.atMs > stoppedAt);
      assert.deepEqual(after, [], "a 'waiting for NATS' line after stop()");
    } finally {
      for (const socket of sockets) socket.destroy();
      await new Promise((resolve) => silent.close(resolve));
    }
  });
});
