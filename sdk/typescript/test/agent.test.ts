/**
 * The TypeScript agent against a real nats-server and the real Python coordinator.
 * Each test uses its own agent ids and topics, so tests cannot see each other's work.
 */

import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { spawn } from "node:child_process";
import { after, before, describe, it } from "node:test";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect, createInbox, headers } from "nats";
import type { KV } from "nats";
import { JsMsgImpl } from "nats/lib/jetstream/jsmsg.js";

import { Agent, AgentIdInUse, PermanentError, ReachError } from "../src/index.js";
import { Claimed, Claims } from "../src/claims.js";
import type { Kept } from "../src/claims.js";
import { Keys } from "../src/keys.js";
import type { StoredEntry } from "../src/keys.js";
import { Reports } from "../src/reports.js";
import { newId } from "../src/index.js";
import type { AgentCard, DeadLetter, Execution, Heartbeat, Liveness, PayloadRef, Reply, Result } from "../src/index.js";
import { binary, controlHeaders, dispatchHeaders, eventsOf, freePort, Gate, kvUntil, provision, routedTo, send, startServer, startStack, task, terminate, Watcher } from "./harness.js";
import type { RestartableStack, Stack } from "./harness.js";
import type { Logger } from "../src/log.js";

const quiet = { debug() {}, info() {}, warn() {}, error() {} };
let stack: Stack;
let agents: Agent[] = [];
let counter = 0;

/** A fresh id for this run, so tests never share agents or topics. */
function unique(name: string): string {
  counter += 1;
  return `${name}-${process.pid}-${counter}`;
}

async function started(agent: Agent): Promise<Agent> {
  agents.push(agent);
  await agent.start(stack.url);
  return agent;
}

/** `promise`, or a rejection naming `what` once `ms` have passed. */
async function within<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_resolve, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: not within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([promise, timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/** The next readable card of `id` (the value there now first), skipping what is not JSON. */
async function readableCard(cards: KV, id: string): Promise<AgentCard> {
  const watch = await cards.watch({ key: id });
  try {
    for await (const entry of watch) {
      if (entry.operation !== "PUT") continue;
      try {
        return entry.json<AgentCard>();
      } catch {
        continue; // the garbage written over it
      }
    }
  } finally {
    watch.stop();
  }
  throw new Error(`the watch of card ${id} ended`);
}

function newAgent(id: string, options: Partial<ConstructorParameters<typeof Agent>[0]> = {}): Agent {
  return new Agent({ agentId: id, startupDelayMs: 0, heartbeatIntervalMs: 1_000, logger: quiet, ...options });
}

async function kv(bucket: string): Promise<KV> {
  return stack.nc.jetstream().views.kv(bucket, { bindOnly: true });
}

/** Two processes of ``id`` in turn, each started and stopped: its card is at epoch 2. */
async function registeredTwice(id: string, cards: KV): Promise<void> {
  for (let i = 0; i < 2; i += 1) {
    const agent = newAgent(id).handler(unique("epochs"), () => null);
    await started(agent);
    await agent.stop();
  }
  assert.equal((await cards.get(id))!.json<AgentCard>().epoch, 2);
}

/** A bucket's keys as the agent reads them (nats.js's own reads die of a bad header block). */
async function keys(bucket: string): Promise<Keys> {
  return new Keys(await kv(bucket), stack.nc.jetstream(), stack.nc, bucket, 5_000);
}

before(async () => {
  stack = await startStack();
});

after(async () => {
  await Promise.allSettled(agents.map((a) => a.stop()));
  await stack?.stop();
});

describe("serving tasks", () => {
  it("completes a task routed by the coordinator, with ack, accepted and completed", async () => {
    const topic = unique("echo");
    const agent = await started(newAgent(unique("ts-echo")).handler(topic, { version: "1.0.0" }, (_ctx, p) => ({ echoed: p })));
    const t = task(topic, { text: "hi" });
    const events = eventsOf(stack, t.message_id);
    const replies = await send(stack, t);
    const result = (await replies.next((r) => r.kind === "result")) as Result;
    assert.deepEqual(result.result, { echoed: { text: "hi" } });
    assert.equal(result.from_agent, agent.agentId);
    const ack = await replies.next((r) => r.kind === "ack");
    assert.equal(ack.kind === "ack" && ack.capacity !== null, true);
    const completed = await events.next((e) => e.event === "completed");
    assert.equal(completed.agent_id, agent.agentId);
    assert.equal(typeof completed.detail.duration_ms, "number");
    assert.deepEqual(completed.detail.result, { echoed: { text: "hi" } });
    await events.next((e) => e.event === "accepted");
    await events.next((e) => e.event === "routed" && e.agent_id === agent.agentId);
    replies.close();
    events.close();
  });

  it("answers `reach publish --wait` from the CLI", async () => {
    const topic = unique("cli");
    await started(newAgent(unique("ts-cli")).handler(topic, (_ctx, p: { n: number }) => ({ doubled: p.n * 2 })));
    const child = spawn(binary("REACH_BIN", "reach"), ["publish", topic, '{"n": 21}', "--wait", "--nats-url", stack.url], {
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    child.stdout.on("data", (c: Buffer) => (out += c.toString()));
    child.stderr.on("data", (c: Buffer) => (out += c.toString()));
    const timer = setTimeout(() => void terminate(child), 30_000);
    const code = await new Promise<number | null>((resolve) => child.once("exit", resolve));
    clearTimeout(timer);
    assert.equal(code, 0, out);
    assert.deepEqual(JSON.parse(out.trim().split("\n").pop()!), { doubled: 42 });
  });

  it("sends progress to the sender before the result", async () => {
    const topic = unique("slow");
    await started(
      newAgent(unique("ts-progress")).handler(topic, async (ctx) => {
        await ctx.progress("half way");
        return "done";
      }),
    );
    const t = task(topic, null);
    const events = eventsOf(stack, t.message_id);
    const replies = await send(stack, t);
    await replies.next((r) => r.kind === "result");
    const kinds = replies.seen.map((m) => m.body.kind);
    assert.deepEqual(kinds, ["ack", "progress", "result"]);
    const progress = await events.next((e) => e.event === "progress");
    assert.equal(progress.detail.note, "half way");
    replies.close();
    events.close();
  });

  it("makes no progress report once the run ended (a promise the handler left behind)", async () => {
    const topic = unique("linger");
    const ended = new Gate();
    let late: Promise<void> | null = null;
    await started(
      newAgent(unique("ts-linger")).handler(topic, async (ctx) => {
        late = ended.opened.then(() => ctx.progress("after the end"));
        await ctx.progress("during the run");
        return "done";
      }),
    );
    const t = task(topic, null);
    const events = eventsOf(stack, t.message_id);
    const replies = await send(stack, t);
    await events.next((e) => e.event === "completed");
    ended.open();
    await late; // resolves: nothing to report, no error for the handler's author
    const barrier = task(topic, null); // its events are stored after any late one would be
    const after = eventsOf(stack, barrier.message_id);
    const more = await send(stack, barrier);
    await after.next((e) => e.event === "completed");
    const notes = events.seen.filter((e) => e.body.event === "progress").map((e) => e.body.detail.note);
    assert.deepEqual(notes, ["during the run"]);
    assert.deepEqual(replies.seen.map((m) => m.body.kind), ["ack", "progress", "result"]);
    for (const w of [replies, events, after, more]) w.close();
  });

  it("sends a workflow step's reply subject only the result", async () => {
    const topic = unique("step");
    const agent = await started(
      newAgent(unique("ts-step")).handler(topic, async (ctx) => {
        await ctx.progress("half way");
        return "done";
      }),
    );
    const replyTo = `reach.wf.reply.${newId()}`;
    const replies = new Watcher<Reply>(stack.nc, `${replyTo}.*`);
    await stack.nc.flush();
    const t = task(topic, null, { reply_to: replyTo });
    const events = eventsOf(stack, t.message_id);
    (await send(stack, t)).close();
    await events.next((e) => e.event === "completed");
    await replies.next((r) => r.kind === "result");
    assert.deepEqual(
      replies.seen.map((m) => [m.subject, m.body.kind]),
      [[`${replyTo}.${agent.agentId}`, "result"]],
    );
    replies.close();
    events.close();
  });

  it("retries a retryable failure; the next attempt completes", async () => {
    const topic = unique("flaky");
    const attempts: number[] = [];
    await started(
      newAgent(unique("ts-flaky")).handler(topic, (ctx) => {
        attempts.push(ctx.attempt);
        if (ctx.attempt === 1) throw new Error("upstream hiccup");
        return { attempt: ctx.attempt };
      }),
    );
    const t = task(topic, null);
    const events = eventsOf(stack, t.message_id);
    const replies = await send(stack, t);
    const result = (await replies.next((r) => r.kind === "result", 15_000)) as Result;
    assert.deepEqual(result.result, { attempt: 2 });
    assert.deepEqual(attempts, [1, 2]);
    const failed = await events.next((e) => e.event === "failed");
    assert.deepEqual(failed.detail.error, { type: "Error", message: "upstream hiccup", retryable: true, retry_after_ms: null });
    assert.equal((failed.detail.task as { message_id: string }).message_id, t.message_id);
    assert.equal(typeof failed.detail.dispatched_at_ms, "number");
    await events.next((e) => e.event === "retry_scheduled");
    replies.close();
    events.close();
  });

  it("dead-letters a PermanentError as rejected, without retrying or a warning with a stack", async () => {
    const topic = unique("refuse");
    let calls = 0;
    const warned: string[] = [];
    const logger = { ...quiet, warn: (event: string) => void warned.push(event) };
    await started(
      newAgent(unique("ts-refuse"), { logger }).handler(topic, () => {
        calls += 1;
        throw new PermanentError("order 7 does not exist");
      }),
    );
    const dlq = new Watcher<DeadLetter>(stack.nc, `reach.dlq.rejected.${topic}`);
    const t = task(topic, { order: 7 });
    const replies = await send(stack, t);
    const letter = await dlq.next((d) => d.message_id === t.message_id, 15_000);
    assert.equal(letter.reason, "rejected");
    assert.deepEqual(letter.error, { type: "PermanentError", message: "order 7 does not exist", retryable: false, retry_after_ms: null });
    const stored = await stack.jsm.streams.getMessage("REACH_DLQ", { last_by_subj: `reach.dlq.rejected.${topic}` });
    assert.equal(stored.json<DeadLetter>().message_id, t.message_id);
    const error = await replies.next((r) => r.kind === "error");
    assert.equal(error.kind === "error" && error.error.type, "PermanentError");
    assert.equal(calls, 1);
    assert.deepEqual(warned, []); // a refusal on purpose: "handler failed" at info says it
    dlq.close();
    replies.close();
  });
});

describe("payloads", () => {
  it("fails a payload its check refuses, and a null one the handler cannot use, once as invalid_payload", async () => {
    const checked = unique("checked");
    const unchecked = unique("unchecked");
    const runs: unknown[] = [];
    const order = (p: unknown): { id: number } => {
      if (typeof (p as { id?: unknown })?.id !== "number") throw new Error("id must be a number");
      return p as { id: number };
    };
    await started(
      newAgent(unique("ts-payload"))
        .handler(checked, { payload: order }, (_ctx, p) => runs.push(p.id))
        .handler(unchecked, (_ctx, p: { text: string }) => runs.push(p.text.length)),
    );
    const dlq = new Watcher<DeadLetter>(stack.nc, "reach.dlq.rejected.>");
    const cases = [
      [checked, { id: "7" }, `the payload does not fit the handler of '${checked}': id must be a number`],
      [unchecked, null, `the task has no payload (null), and the handler of '${unchecked}' raised TypeError: `],
    ] as const;
    for (const [topic, payload, why] of cases) {
      const t = task(topic, payload);
      const events = eventsOf(stack, t.message_id);
      const replies = await send(stack, t);
      const letter = await dlq.next((d) => d.message_id === t.message_id, 15_000);
      const failed = await events.next((e) => e.event === "failed");
      const error = failed.detail.error as { type: string; message: string; retryable: boolean };
      assert.equal(error.type, "invalid_payload");
      assert.equal(error.retryable, false);
      assert.ok(error.message.startsWith(why), error.message);
      assert.equal(letter.attempts, 1);
      replies.close();
      events.close();
    }
    const fine = task(checked, { id: 7 });
    const replies = await send(stack, fine);
    const result = await replies.next((r) => r.kind === "result");
    assert.equal(result.kind === "result" && result.result, 1);
    assert.deepEqual(runs, [7]); // the refused ones never reached their handlers' bodies
    dlq.close();
    replies.close();
  });
});

describe("results", () => {
  it("logs a thrown value that is no Error in its JSON form, not as [object Object]", async () => {
    const topic = unique("thrown");
    const warned: Array<Record<string, unknown>> = [];
    const logger = { ...quiet, warn: (event: string, fields: Record<string, unknown> = {}) => void (event === "handler raised" && warned.push(fields)) };
    await started(
      newAgent(unique("ts-thrown"), { logger }).handler(topic, () => {
        throw { code: 42 };
      }),
    );
    const replies = await send(stack, task(topic, null));
    await replies.next((r) => r.kind === "error", 20_000);
    assert.equal(warned[0]?.stack, '{"code":42}');
    replies.close();
  });

  it("fails a result JSON cannot carry (a BigInt, a cycle) once, not retried, as invalid_result", async () => {
    const topic = unique("unsendable");
    let calls = 0;
    await started(
      newAgent(unique("ts-unsendable")).handler(topic, (_ctx, p: { kind: string }) => {
        calls += 1;
        if (p.kind === "bigint") return { total: 10n };
        const cycle: Record<string, unknown> = {};
        cycle.self = cycle;
        return cycle;
      }),
    );
    const dlq = new Watcher<DeadLetter>(stack.nc, `reach.dlq.rejected.${topic}`);
    for (const [kind, why] of [["bigint", "BigInt"], ["cycle", "circular"]] as const) {
      const t = task(topic, { kind });
      const events = eventsOf(stack, t.message_id);
      const replies = await send(stack, t);
      const letter = await dlq.next((d) => d.message_id === t.message_id, 15_000);
      const failed = await events.next((e) => e.event === "failed");
      const error = failed.detail.error as { type: string; message: string; retryable: boolean };
      assert.equal(error.type, "invalid_result");
      assert.equal(error.retryable, false);
      assert.match(error.message, /^the handler's result could not be sent: it cannot be encoded as JSON/);
      assert.ok(error.message.includes(why), error.message);
      assert.equal(letter.attempts, 1);
      replies.close();
      events.close();
    }
    assert.equal(calls, 2); // once each
    dlq.close();
  });

  for (const size of [400_000, 1_100_000]) {
    // 400 KB is over the record's 320 KiB (10054); 1.1 MB over what the server takes in one
    // message, which was tried again as if the server were away (the Python agent did so).
    it(`fails a result of ${size} bytes its execution record cannot hold once, as result_too_large`, async () => {
      const topic = unique("huge");
      let calls = 0;
      // Claim-checks nothing, as on a secured server.
      await started(
        newAgent(unique("ts-huge"), { claimCheckBytes: 2_000_000 }).handler(topic, () => {
          calls += 1;
          return "x".repeat(size);
        }),
      );
      const dlq = new Watcher<DeadLetter>(stack.nc, `reach.dlq.rejected.${topic}`);
      const t = task(topic, {});
      const events = eventsOf(stack, t.message_id);
      const replies = await send(stack, t);
      const letter = await dlq.next((d) => d.message_id === t.message_id, 15_000);
      const failed = await events.next((e) => e.event === "failed");
      const error = failed.detail.error as { type: string; message: string; retryable: boolean };
      assert.equal(error.type, "result_too_large");
      assert.equal(error.retryable, false);
      assert.match(error.message, new RegExp(`^the result \\(${size + 2} bytes of JSON\\) does not fit its execution record`));
      assert.equal(letter.attempts, 1);
      assert.equal(calls, 1);
      replies.close();
      events.close();
      dlq.close();
    });
  }
});

describe("claim check and trace context", () => {
  const BIG = "x".repeat(300_000); // over the 256 KiB threshold, under NATS's 1 MiB
  const TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

  async function stowed(name: string, value: unknown): Promise<PayloadRef> {
    const data = new TextEncoder().encode(JSON.stringify(value));
    const store = await stack.nc.jetstream().views.os("reach_payloads");
    await store.putBlob({ name }, data);
    const sha256 = createHash("sha256").update(data).digest("hex");
    return { bucket: "reach_payloads", name, size: data.length, sha256 };
  }

  async function fetched(ref: PayloadRef): Promise<unknown> {
    const store = await stack.nc.jetstream().views.os(ref.bucket);
    return JSON.parse(new TextDecoder().decode((await store.getBlob(ref.name))!));
  }

  it("reads a payload_ref, stows a large result, passes the traceparent on, stamps accepted", async () => {
    const topic = unique("mirror");
    let seenTraceparent: string | null = null;
    let childTraceparent: string | null = null;
    const agent = await started(
      newAgent(unique("ts-mirror")).handler(topic, (ctx, p: { text: string }) => {
        seenTraceparent = ctx.traceparent;
        childTraceparent = ctx.childTask("elsewhere", null).traceparent;
        return { length: p.text.length, text: p.text };
      }),
    );
    const messageId = newId();
    const ref = await stowed(`${messageId}/payload`, { text: BIG });
    const t = task(topic, null, { message_id: messageId, payload_ref: ref, traceparent: TRACEPARENT });
    const events = eventsOf(stack, t.message_id);
    const sentAt = Date.now();
    const replies = await send(stack, t);
    const result = (await replies.next((r) => r.kind === "result", 15_000)) as Result;
    assert.equal(result.result, null);
    assert.equal(result.result_ref!.name, `${messageId}/1/result`);
    assert.deepEqual(await fetched(result.result_ref!), { length: BIG.length, text: BIG });
    const completed = await events.next((e) => e.event === "completed");
    assert.equal("result" in completed.detail, false);
    assert.deepEqual(completed.detail.result_ref, result.result_ref);
    const accepted = await events.next((e) => e.event === "accepted");
    const dispatchedAt = accepted.detail.dispatched_at_ms as number;
    assert.ok(dispatchedAt >= sentAt - 1_000 && dispatchedAt <= accepted.at_ms, `dispatched_at_ms ${dispatchedAt}`);
    assert.equal(accepted.priority, "P1");
    assert.ok(accepted.received_ms > 0, "events carry the task's intake time");
    // The coordinator gives the dispatch a hop of its own in the caller's trace; the child another.
    const [, traceId] = TRACEPARENT.split("-");
    assert.match(seenTraceparent!, new RegExp(`^00-${traceId}-[0-9a-f]{16}-01$`));
    assert.match(childTraceparent!, new RegExp(`^00-${traceId}-[0-9a-f]{16}-01$`));
    assert.notEqual(childTraceparent, seenTraceparent);
    const record = await kvUntil<Execution>(await kv("reach_executions"), `_.${messageId}.${agent.agentId}`, (r) => r?.state === "done");
    assert.deepEqual(record!.result_ref, result.result_ref);
    assert.equal(record!.result, null);
    assert.ok(record!.started_ms > 0 && record!.started_ms <= record!.finished_at_ms, "the outcome says when its run began");
    replies.close();
    events.close();
  });

  it("fails a task whose payload_ref is gone as payload_unavailable, not retryable", async () => {
    const topic = unique("gone");
    let calls = 0;
    await started(newAgent(unique("ts-gone")).handler(topic, () => (calls += 1)));
    const ref = { bucket: "reach_payloads", name: `${newId()}/payload`, size: 10, sha256: "0".repeat(64) };
    const t = task(topic, null, { payload_ref: ref });
    const events = eventsOf(stack, t.message_id);
    const replies = await send(stack, t);
    const failed = await events.next((e) => e.event === "failed", 15_000);
    const error = failed.detail.error as { type: string; retryable: boolean; message: string };
    assert.equal(error.type, "payload_unavailable");
    assert.equal(error.retryable, false);
    assert.match(error.message, /no longer stored/);
    await replies.next((r) => r.kind === "error", 15_000);
    assert.equal(calls, 0);
    replies.close();
    events.close();
  });
});

describe("capacity", () => {
  it("runs a handler's tasks at most `capacity` at once across priorities; one waiting is kept, unaccepted, and P0 goes next", async () => {
    const gpu = unique("gpu");
    const light = unique("light");
    const id = unique("ts-capacity");
    const release = new Gate();
    const startedOrder: string[] = [];
    let running = 0;
    let most = 0;
    await started(
      newAgent(id, { ackWaitMs: 1_000, heartbeatIntervalMs: 200 })
        .handler(gpu, { capacity: 1 }, async (_ctx, p: { n: string }) => {
          startedOrder.push(p.n);
          most = Math.max(most, ++running);
          if (p.n === "first") await release.opened;
          running -= 1;
          return p;
        })
        .handler(light, { capacity: 5 }, (_ctx, p) => p),
    );
    const gpuTask = (n: string, priority: "P0" | "P1" | "P2") => task(gpu, { n }, { priority });
    const inHand = async (priority: string, count: number) => {
      for (let i = 0; i < 100; i++) {
        const info = await stack.jsm.consumers.info(`REACH_DISPATCH_${priority}`, `agent-${id}-${priority.toLowerCase()}`);
        if (info.num_ack_pending === count) return;
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      throw new Error(`${priority}: not ${count} in hand`);
    };
    const first = await send(stack, gpuTask("first", "P2"));
    const ack = await first.next((r) => r.kind === "ack");
    assert.equal(ack.kind === "ack" && ack.capacity?.free_slots, 0); // gpu's one place is taken
    const beat = await kvUntil<Heartbeat>(await kv("reach_heartbeats"), id, (b) => b?.in_flight === 1);
    assert.equal(beat?.free_slots, 5); // light's five places
    const later = await send(stack, gpuTask("later", "P2"));
    await inHand("P2", 2);
    const urgent = await send(stack, gpuTask("urgent", "P0"));
    await inHand("P0", 1);
    const beside = await send(stack, task(light, { n: "beside" }));
    await beside.next((r) => r.kind === "result"); // light is not held up by gpu's queue
    await new Promise((resolve) => setTimeout(resolve, 2_000)); // past the ack wait: the point
    assert.deepEqual(startedOrder, ["first"]);
    assert.equal(later.count((r) => r.kind === "ack") + urgent.count((r) => r.kind === "ack"), 0);
    await inHand("P2", 2); // kept: neither came again
    release.open();
    for (const replies of [first, later, urgent]) await replies.next((r) => r.kind === "result");
    assert.deepEqual(startedOrder, ["first", "urgent", "later"]);
    assert.equal(most, 1);
    for (const replies of [first, later, urgent]) {
      assert.equal(replies.count((r) => r.kind === "ack"), 1);
      replies.close();
    }
    beside.close();
  });
});

describe("latency estimates", () => {
  it("acks a fast and a slow topic of one agent each with its own topic's moving average", async () => {
    const slow = unique("slow-report");
    const fast = unique("quick-lookup");
    const slowMs = 300;
    await started(
      newAgent(unique("ts-latency"))
        .handler(slow, async () => {
          await new Promise((resolve) => setTimeout(resolve, slowMs)); // the work being measured
          return {};
        })
        .handler(fast, () => ({})),
    );
    const slowAcks: number[] = [];
    const fastAcks: number[] = [];
    // In turn, each after the one before has ended: a mix of the two said ~240 and ~190.
    for (const topic of [slow, fast, fast, slow]) {
      const replies = await send(stack, task(topic, {}));
      const ack = await replies.next((r) => r.kind === "ack");
      await replies.next((r) => r.kind === "result");
      replies.close();
      (topic === slow ? slowAcks : fastAcks).push(ack.kind === "ack" ? (ack.capacity?.est_latency_ms ?? -1) : -1);
    }
    const [slowFirst, slowLater] = slowAcks;
    assert.equal(slowFirst, 0); // before its first run
    assert.ok(fastAcks.length === 2 && fastAcks.every((ms) => ms >= 0 && ms < 50), `fast: ${fastAcks}`);
    // Node's timers may fire a millisecond before their time as performance.now() sees it.
    assert.ok(slowLater !== undefined && slowLater >= slowMs - 10, `slow: ${slowAcks}`);
  });
});

describe("deadlines and progress", () => {
  it("is not held by a progress report the server does not take (a 3 s job took 24 s)", async () => {
    const topic = unique("chatty");
    const reported: string[] = [];
    let take!: () => void;
    const taken = new Promise<void>((resolve) => (take = resolve));
    const progress = Reports.prototype.progress;
    Reports.prototype.progress = async (_msg, _task, note) => {
      reported.push(note);
      await taken; // the server away: never taken while the handler runs
    };
    try {
      const agent = await started(newAgent(unique("ts-chatty")).handler(topic, async (ctx) => {
        for (let step = 0; step < 3; step += 1) await ctx.progress(`step ${step}`);
        return "done";
      }));
      const replies = await send(stack, task(topic, null));
      const ending = await replies.next((r) => r.kind === "result" || r.kind === "error", 15_000);
      assert.equal(ending.kind === "result" && ending.result, "done", JSON.stringify(ending));
      assert.deepEqual(reported, ["step 0"]); // the next ones came while it was on its way
      replies.close();
      take();
      await agent.stop();
    } finally {
      Reports.prototype.progress = progress;
      take();
    }
  });

  it("gives a handler that reports progress its deadline again, within the execute budget", async () => {
    const topic = unique("marathon");
    await started(
      newAgent(unique("ts-marathon")).handler(topic, { deadlineMs: 300 }, async (ctx) => {
        for (let i = 0; i < 4; i++) {
          await new Promise((resolve) => setTimeout(resolve, 150));
          await ctx.progress("still going");
        }
        return { deadline_ms: ctx.deadlineMs };
      }),
    );
    const t = task(topic, null);
    const replies = await send(stack, t);
    const result = (await replies.next((r) => r.kind === "result")) as Result;
    assert.ok((result.result as { deadline_ms: number }).deadline_ms > 600);
    replies.close();
  });

  it("does not fail a handler whose progress report waits on a server away for a moment", async () => {
    const topic = unique("reporter");
    const attempts: number[] = [];
    await started(
      newAgent(unique("ts-reporter")).handler(topic, { deadlineMs: 400 }, async (ctx) => {
        attempts.push(ctx.attempt);
        for (let step = 0; step < 3; step++) {
          await new Promise((resolve) => setTimeout(resolve, 100));
          if (step === 1) await (stack as RestartableStack).pauseServer(1_000);
          await ctx.progress(`step ${step}`);
        }
        return { steps: 3 };
      }),
    );
    const t = task(topic, null);
    const replies = await send(stack, t);
    const result = (await replies.next((r) => r.kind === "result")) as Result;
    assert.deepEqual(result.result, { steps: 3 });
    assert.deepEqual(attempts, [1]); // it was failed as deadline_exceeded, and run again
    replies.close();
  });

  it("keeps a handler's place until a handler past its deadline ends: capacity holds", async () => {
    // A handler that ignores its abort signal runs on; its place was given back at the
    // deadline, and a trial saw 4 runs at once of a capacity-1 handler.
    const topic = unique("stubborn");
    let running = 0;
    let most = 0;
    let ended = 0;
    let bothEnded!: () => void;
    const done = new Promise<void>((resolve) => (bothEnded = resolve));
    await started(
      newAgent(unique("ts-stubborn")).handler(topic, { capacity: 1, deadlineMs: 200, maxAttempts: 1 }, async () => {
        running += 1;
        most = Math.max(most, running);
        await new Promise((resolve) => setTimeout(resolve, 800)); // ignores ctx.signal
        running -= 1;
        if ((ended += 1) === 2) bothEnded();
      }),
    );
    const sent = [task(topic, { n: 1 }), task(topic, { n: 2 })];
    const replies = await Promise.all(sent.map((t) => send(stack, t)));
    for (const box of replies) {
      const ending = await box.next((r) => r.kind === "error", 15_000);
      assert.equal(ending.kind === "error" && ending.error.type, "deadline_exceeded");
      box.close();
    }
    await within(done, 10_000, "both handlers ended");
    assert.equal(most, 1);
  });

  it("stops a handler at the execute budget however often it reports progress", async () => {
    const topic = unique("endless");
    await started(
      newAgent(unique("ts-endless")).handler(topic, { deadlineMs: 200, maxAttempts: 1 }, async (ctx) => {
        while (!ctx.signal.aborted) {
          await new Promise((resolve) => setTimeout(resolve, 50));
          await ctx.progress("more");
        }
      }),
    );
    const t = task(topic, null, { budget: { seek_ms: 1_000, ack_ms: 2_000, execute_ms: 600 } });
    const events = eventsOf(stack, t.message_id);
    const replies = await send(stack, t);
    const failed = await events.next((e) => e.event === "failed");
    assert.deepEqual(failed.detail.error, { type: "deadline_exceeded", message: "handler ran past 600 ms", retryable: true, retry_after_ms: null });
    replies.close();
    events.close();
  });
});

describe("run-once", () => {
  it("runs a message delivered twice once; the duplicate gets the stored result", async () => {
    const topic = unique("once");
    const id = unique("ts-once");
    let calls = 0;
    await started(
      newAgent(id).handler(topic, async () => {
        calls += 1;
        await new Promise((resolve) => setTimeout(resolve, 200)); // work: the duplicate arrives meanwhile
        return { calls };
      }),
    );
    const t = task(topic, { x: 1 }, { to_agent: id });
    const subject = `reach.agent.${id}.p1`;
    const first = await send(stack, t, { subject, msgId: `${t.message_id}-a` });
    const second = await send(stack, { ...t, reply_to: null }, { subject, msgId: `${t.message_id}-b` });
    const a = (await first.next((r) => r.kind === "result")) as Result;
    const b = (await second.next((r) => r.kind === "result")) as Result;
    assert.deepEqual(a.result, { calls: 1 });
    assert.deepEqual(b.result, { calls: 1 });
    assert.equal(calls, 1);
    const record = await (await kv("reach_executions")).get(`_.${t.message_id}.${id}`);
    assert.equal(record?.json<Execution>().state, "done");
    first.close();
    second.close();
  });

  it("answers a republished task (same message_id, next attempt) without running it again", async () => {
    const topic = unique("again");
    let calls = 0;
    await started(newAgent(unique("ts-again")).handler(topic, () => ({ calls: ++calls })));
    const t = task(topic, null);
    const first = await send(stack, t);
    await first.next((r) => r.kind === "result");
    // Attempt 2 gets past the intake and dispatch dedup windows, as a retry would.
    const again = await send(stack, { ...t, attempt: 2, reply_to: null }, { msgId: `${t.message_id}-again` });
    const result = (await again.next((r) => r.kind === "result")) as Result;
    assert.deepEqual(result.result, { calls: 1 });
    assert.equal(calls, 1);
    first.close();
    again.close();
  });

  it("runs an attempt delivered again after it failed no more: its failure is reported again", async () => {
    // The ack of the failure's report lost, the server delivers the same attempt again.
    const topic = unique("failed-once");
    const id = unique("ts-failed-once");
    let calls = 0;
    await started(
      newAgent(id).handler(topic, () => {
        calls += 1;
        throw new PermanentError("no, once and for all");
      }),
    );
    const t = task(topic, null, { to_agent: id });
    const events = eventsOf(stack, t.message_id);
    const subject = `reach.agent.${id}.p1`;
    (await send(stack, t, { subject, msgId: `${t.message_id}-a` })).close();
    await events.next((e) => e.event === "failed");
    (await send(stack, t, { subject, msgId: `${t.message_id}-b` })).close();
    for (let i = 0; ; i++) {
      const info = await stack.jsm.consumers.info("REACH_DISPATCH_P1", `agent-${id}-p1`);
      if (info.delivered.consumer_seq >= 2 && info.num_ack_pending === 0 && info.num_pending === 0) break;
      assert.ok(i < 100, "the second delivery was not acknowledged");
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    const record = await (await kv("reach_executions")).get(`_.${t.message_id}.${id}`);
    assert.equal(record?.json<Execution>().state, "failed");
    assert.equal(calls, 1);
    events.close();
  });

  it("rejects a late result once the execution record was fenced", async () => {
    const topic = unique("fenced");
    const entered = new Gate();
    const release = new Gate();
    const agent = await started(
      newAgent(unique("ts-fenced")).handler(topic, async () => {
        entered.open();
        await release.opened;
        return "too late";
      }),
    );
    const t = task(topic, null);
    const events = eventsOf(stack, t.message_id);
    const replies = await send(stack, t);
    await entered.opened;
    // What the coordinator does when the agent goes OFFLINE: the running claim becomes failed.
    const executions = await kv("reach_executions");
    const key = `_.${t.message_id}.${agent.agentId}`; // this agent's record (no caller)
    const entry = await executions.get(key);
    const record = entry!.json<Execution>();
    assert.equal(record.state, "running");
    assert.equal(record.epoch, agent.epoch);
    const fenced = { ...record, state: "failed", error: { type: "reassigned", message: "test", retryable: true } };
    await executions.update(key, JSON.stringify(fenced), entry!.revision);
    release.open();
    const rejected = await events.next((e) => e.event === "late_result_rejected");
    assert.equal(rejected.agent_id, agent.agentId);
    await stack.nc.flush();
    assert.equal(replies.count((r) => r.kind === "result"), 0);
    assert.equal(events.count((e) => e.event === "completed"), 0);
    replies.close();
    events.close();
  });
});

describe("run-once: claims of this very process", () => {
  /** A logger that keeps the events it is given, for counting lines. */
  function kept(): { logger: Logger; said: string[] } {
    const said: string[] = [];
    const keep = (event: string) => void said.push(event);
    return { logger: { debug: keep, info: keep, warn: keep, error: keep }, said };
  }
  const HOLDS = "another delivery holds this message";

  it("answers a delivery that waited from the outcome another delivery could not record, not running it twice", async () => {
    // Delivery B waits while A runs; A's outcome cannot be written (the broker failing) and is
    // kept: B answers from it instead of waiting out A's lease and running the message again.
    const real = await keys("reach_executions");
    const failing = new Proxy(real, {
      get: (target, name) =>
        name === "update" ? () => Promise.reject(new Error("the server is restarting")) : Reflect.get(target, name),
    });
    const claims = new Claims(failing, unique("ts-kept"), 1, quiet);
    const t = task(unique("kept"), null);
    const answer = await claims.holding(t.message_id, async (first) => {
      const a = await claims.claim(t, 60_000, null, first);
      assert.ok(a instanceof Claimed);
      return claims.holding(t.message_id, async (second) => {
        const b = claims.claimWhenFree(t, 60_000, null, () => undefined, second);
        const outcome = { claim: a, result: { ran: "once" }, durationMs: 1 };
        const recording = claims.record(t, outcome, () => undefined).catch(() => "not recorded");
        const waited = await b;
        assert.equal(await recording, "not recorded");
        return { waited, outcome };
      });
    });
    assert.equal(answer.waited.kind, "kept");
    assert.equal((answer.waited as Kept).outcome, answer.outcome);
  });

  it("takes over at once its own process's claim that no delivery holds (a claim write whose answer was lost)", async () => {
    const topic = unique("lost");
    const id = unique("ts-lost");
    const { logger, said } = kept();
    let calls = 0;
    const agent = await started(newAgent(id, { logger }).handler(topic, () => ({ calls: ++calls })));
    const t = task(topic, null, { to_agent: id, ttl_ms: 120_000 });
    const running = { v: 1, message_id: t.message_id, state: "running", agent_id: id, epoch: agent.epoch, attempt: 1, lease_until_ms: Date.now() + 60_000 };
    await (await kv("reach_executions")).create(`_.${t.message_id}.${id}`, JSON.stringify(running));
    const replies = await send(stack, t, { subject: `reach.agent.${id}.p1` });
    const result = (await within(replies.next((r) => r.kind === "result"), 10_000, "the result, before the minute's lease")) as Result;
    assert.deepEqual(result.result, { calls: 1 });
    assert.equal(calls, 1);
    assert.ok(said.includes("taking over this process's own claim: its write's answer was lost"));
    assert.ok(!said.includes(HOLDS));
    replies.close();
  });

  it("runs a delivery taken over from a crashed earlier process for what is left of its budget, or not at all, telling it it resumes", async () => {
    const topic = unique("crashed");
    const id = unique("ts-crashed");
    const deadlines = new Map<string, number>();
    const resumed = new Map<string, boolean>();
    const agent = await started(
      newAgent(id).handler(topic, (ctx) => (deadlines.set(ctx.messageId, ctx.deadlineMs), resumed.set(ctx.messageId, ctx.resumed), {})),
    );
    const executions = await kv("reach_executions");
    const failedOne = task(topic, null, { to_agent: id, ttl_ms: 120_000, budget: { seek_ms: 1_000, ack_ms: 2_000, execute_ms: 2_000 } });
    const halfOne = task(topic, null, { to_agent: id, ttl_ms: 120_000, budget: { seek_ms: 1_000, ack_ms: 2_000, execute_ms: 2_000 } });
    const events = eventsOf(stack, failedOne.message_id);
    for (const [t, agoMs] of [[halfOne, 800], [failedOne, 5_000]] as const) {
      const crashed = { v: 1, message_id: t.message_id, state: "running", agent_id: id, epoch: agent.epoch - 1, attempt: 1, lease_until_ms: Date.now() + 60_000, started_ms: Date.now() - agoMs };
      await executions.create(`_.${t.message_id}.${id}`, JSON.stringify(crashed));
    }
    const replies = await send(stack, halfOne, { subject: `reach.agent.${id}.p1` });
    await within(replies.next((r) => r.kind === "result"), 10_000, "the result of the half-spent one");
    const fresh = task(topic, null, { to_agent: id });
    const freshReplies = await send(stack, fresh, { subject: `reach.agent.${id}.p1` });
    await within(freshReplies.next((r) => r.kind === "result"), 10_000, "the result of a first run");
    assert.deepEqual([resumed.get(halfOne.message_id), resumed.get(fresh.message_id)], [true, false]);
    freshReplies.close();
    await send(stack, failedOne, { subject: `reach.agent.${id}.p1` });
    const failed = await events.next((e) => e.event === "failed");
    const deadline = deadlines.get(halfOne.message_id)!;
    assert.ok(deadline >= 1_000 && deadline <= 1_200, `deadline ${deadline}`);
    assert.ok(!deadlines.has(failedOne.message_id));
    const error = failed.detail.error as { type: string; message: string; retryable: boolean };
    assert.equal(error.type, "deadline_exceeded");
    assert.ok(error.retryable && error.message.includes("execute budget 2000 ms of attempt 1 spent"), error.message);
    events.close();
    replies.close();
  });

  it("keeps a claim a delivery holds from its redelivery even past its lease (a server away: renewals failed)", async () => {
    const claims = new Claims(await keys("reach_executions"), unique("ts-lapsed"), 1, quiet);
    const t = task(unique("lapsed"), null);
    await claims.holding(t.message_id, async (running) => {
      assert.ok((await claims.claim(t, 0, null, running)) instanceof Claimed); // its lease ran out at once
      await claims.holding(t.message_id, async (redelivered) => {
        assert.equal((await claims.claim(t, 5_000, null, redelivered)).kind, "busy");
      });
      const other = new Claims(await keys("reach_executions"), claims["agentId"], 2, quiet); // a newer process
      assert.ok((await other.claim(t, 5_000)) instanceof Claimed);
    });
  });

  it("leaves the claim this run's when a renewal of it landed late (a reconnect buffer): the next renewal and the outcome are written", async () => {
    // A renewal that timed out while the server was away lands after the reconnect, moving the
    // record's revision: the outcome was refused as fenced, the result dropped, and the
    // redelivery ran the handler a second time. A record of another process's stays a fence.
    const executions = await kv("reach_executions");
    const claims = new Claims(await keys("reach_executions"), unique("ts-landed"), 1, quiet);
    const t = task(unique("landed"), null);
    const key = `_.${t.message_id}.${claims["agentId"]}`;
    const claim = await claims.claim(t, 5_000);
    assert.ok(claim instanceof Claimed);
    const landed = JSON.stringify({ ...(await executions.get(key))!.json<Execution>(), lease_until_ms: 1 });
    await executions.put(key, landed);
    assert.ok(await claims.renew(t, claim, 20_000), "the renewal after the late one was taken for a fence");
    await executions.put(key, landed);
    assert.ok(await claims.record(t, { claim, result: { n: 1 }, durationMs: 1 }, () => undefined), "the outcome was taken for fenced");
    assert.equal((await executions.get(key))!.json<Execution>().state, "done");

    const other = new Claims(await keys("reach_executions"), unique("ts-landed"), 1, quiet);
    const taken = task(unique("landed"), null);
    const takeover = `_.${taken.message_id}.${other["agentId"]}`;
    const held = await other.claim(taken, 5_000);
    assert.ok(held instanceof Claimed);
    await executions.put(takeover, JSON.stringify({ ...(await executions.get(takeover))!.json<Execution>(), epoch: 2 }));
    assert.equal(await other.renew(taken, held, 20_000), false);
    assert.equal(await other.record(taken, { claim: held, result: 2, durationMs: 1 }, () => undefined), false);
  });

  it("still makes two deliveries in hand at once wait for each other, saying so once per wait", async () => {
    const topic = unique("twice");
    const id = unique("ts-twice");
    const { logger, said } = kept();
    const entered = new Gate();
    const release = new Gate();
    let calls = 0;
    await started(
      newAgent(id, { logger }).handler(topic, { capacity: 3 }, async () => {
        calls += 1;
        entered.open();
        await release.opened;
        return { calls };
      }),
    );
    const t = task(topic, null, { to_agent: id, ttl_ms: 120_000 });
    const subject = `reach.agent.${id}.p1`;
    const first = await send(stack, t, { subject, msgId: `${t.message_id}-a` });
    await entered.opened;
    const second = await send(stack, { ...t, reply_to: null }, { subject, msgId: `${t.message_id}-b` });
    for (let i = 0; !said.includes(HOLDS); i++) {
      assert.ok(i < 100, "the second delivery never waited");
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    await new Promise((resolve) => setTimeout(resolve, 1_200)); // more than two of its polls: nothing more is said
    release.open();
    const a = (await first.next((r) => r.kind === "result")) as Result;
    const b = (await second.next((r) => r.kind === "result")) as Result;
    assert.deepEqual([a.result, b.result], [{ calls: 1 }, { calls: 1 }]);
    assert.equal(calls, 1);
    assert.equal(said.filter((e) => e === HOLDS).length, 1);
    first.close();
    second.close();
  });
});

describe("the agent's queue", () => {
  it("sends the stored result again for a redelivery past its ttl of a task it ran", async () => {
    // A server failing over can lose the acknowledgement of a task the agent ran: it comes
    // back after the ack wait, past its ttl, and must not be dead-lettered as expired.
    const topic = unique("late");
    const id = unique("ts-late");
    let calls = 0;
    const t = task(topic, null, { ttl_ms: 1, to_agent: id });
    const done = { v: 1, message_id: t.message_id, state: "done", agent_id: id, epoch: 1, attempt: 1, result: { ran: "before" } };
    await (await kv("reach_executions")).create(`_.${t.message_id}.${id}`, JSON.stringify(done));
    const events = eventsOf(stack, t.message_id);
    const replies = await send(stack, t, { subject: `reach.agent.${id}.p1` });
    await started(newAgent(id).handler(topic, () => ++calls));
    const result = (await replies.next((r) => r.kind === "result")) as Result;
    assert.deepEqual(result.result, { ran: "before" });
    await events.next((e) => e.event === "completed");
    assert.equal(events.count((e) => e.event === "expired"), 0);
    assert.equal(calls, 0);
    events.close();
    replies.close();
  });

  for (const places of [4, 1]) {
    it(`waits for the run it holds when that task comes again past its ttl (keep-alives lost; ${places} place(s))`, async () => {
      // The server away, the run's keep-alives did not arrive: the task came again past its ttl
      // while the handler still ran here, and was reported `expired`, "no run of it finished".
      // With one place, taken by that run, the redelivery's ttl ran out while it waited for it.
      const topic = unique("unheard");
      const id = unique("ts-unheard");
      const working = JsMsgImpl.prototype.working;
      JsMsgImpl.prototype.working = () => undefined;
      try {
        const t = task(topic, null, { ttl_ms: 1_000, to_agent: id });
        const events = eventsOf(stack, t.message_id);
        await routedTo(stack, t, id);
        const agent = newAgent(id, { ackWaitMs: 500 })
          .handler(topic, { capacity: places }, async () => {
            await new Promise((resolve) => setTimeout(resolve, 2_000)); // past its ttl, and ack waits
            return { napped: true };
          })
          .handler(unique("other"), { capacity: 3 }, () => null); // slots to fetch it again
        const replies = await send(stack, t, { subject: `reach.agent.${id}.p1` });
        await started(agent);
        const result = (await replies.next((r) => r.kind === "result", 10_000)) as Result;
        assert.deepEqual(result.result, { napped: true });
        await events.next((e) => e.event === "completed");
        assert.equal(events.count((e) => e.event === "expired"), 0);
        events.close();
        replies.close();
        await agent.stop();
      } finally {
        JsMsgImpl.prototype.working = working;
      }
    });
  }

  it("does not run a task whose ttl passed in its queue: expired dead letter", async () => {
    const topic = unique("stale");
    const id = unique("ts-stale");
    let calls = 0;
    const dlq = new Watcher<DeadLetter>(stack.nc, `reach.dlq.expired.${topic}`);
    // Queued before the agent starts, with a ttl shorter than any start-up.
    // Routed late: taken in 5 s before its dispatch, so 1 ms is what was left of its ttl.
    const t = task(topic, null, { ttl_ms: 1, to_agent: id, received_ms: Date.now() - 5_000 });
    const events = eventsOf(stack, t.message_id);
    await routedTo(stack, t, id);
    const replies = await send(stack, t, { subject: `reach.agent.${id}.p1` });
    await started(newAgent(id).handler(topic, () => ++calls));
    const expired = await events.next((e) => e.event === "expired");
    assert.equal(expired.agent_id, id);
    const error = expired.detail.error as { type: string; message: string };
    assert.equal(error.type, "expired");
    assert.match(error.message, new RegExp(`^its ttl passed in the queue of ${id} \\(1 ms of it were left when it was dispatched there, 5\\.\\d s after it was taken in\\)$`));
    const letter = await dlq.next((d) => d.message_id === t.message_id);
    assert.equal(letter.reason, "expired");
    assert.equal(calls, 0);
    dlq.close();
    events.close();
    replies.close();
  });

  it("does not run a task ended as expired already, though by its clock the ttl is left", async () => {
    // The coordinator's pass over the queues ended it (its expiry fence is in the agent's
    // record): an agent whose clock runs behind must not run it anyway.
    const topic = unique("fenced");
    const id = unique("ts-fenced");
    let calls = 0;
    const t = task(topic, null, { ttl_ms: 60_000, to_agent: id });
    const error = { type: "expired", message: `ttl 60000 ms passed in the queue of ${id}, which did not take it`, retryable: false };
    const fence = { v: 1, message_id: t.message_id, state: "failed", agent_id: id, attempt: 1, error, finished_at_ms: 1 };
    await (await kv("reach_executions")).create(`_.${t.message_id}.${id}`, JSON.stringify(fence));
    const events = eventsOf(stack, t.message_id);
    const replies = await send(stack, t, { subject: `reach.agent.${id}.p1` });
    await started(newAgent(id).handler(topic, () => ++calls));
    const expired = await events.next((e) => e.event === "expired");
    assert.equal(expired.agent_id, id);
    assert.equal(calls, 0);
    assert.equal(events.count((e) => e.event === "completed"), 0);
    events.close();
    replies.close();
  });

  it("does not run an attempt moved to another agent while it waited here, and reports it (a reassignment fence)", async () => {
    // The agent was judged gone and came back: it fetched the attempt from its durable queue,
    // fenced by a move of the coordinator's. It reports the attempt (failed, the fence's
    // error) instead of running it. Here the move was cut short after its fence (nothing
    // shows attempt 2): the coordinator sends it on from the report, and it runs once.
    const topic = unique("moved");
    const id = unique("ts-moved");
    let calls = 0;
    const t = task(topic, null, { ttl_ms: 60_000, to_agent: id });
    const error = { type: "reassigned", message: "its agent went OFFLINE", retryable: true };
    const fence = { v: 1, message_id: t.message_id, state: "failed", agent_id: id, attempt: 1, error, finished_at_ms: 1 };
    await (await kv("reach_executions")).create(`_.${t.message_id}.${id}`, JSON.stringify(fence));
    const events = eventsOf(stack, t.message_id);
    await routedTo(stack, t, id);
    const replies = await send(stack, t, { subject: `reach.agent.${id}.p1` });
    await started(newAgent(id).handler(topic, () => ++calls));
    const reported = await events.next((e) => e.event === "failed");
    assert.equal(reported.attempt, 1);
    assert.equal((reported.detail.error as { type: string }).type, "reassigned");
    const completed = await events.next((e) => e.event === "completed");
    assert.equal(completed.attempt, 2);
    assert.equal(calls, 1);
    events.close();
    replies.close();
  });

  it("reports an undecodable dispatch, which the coordinator dead-letters as invalid_envelope", async () => {
    const id = unique("ts-garbage");
    await started(newAgent(id).handler(unique("any"), () => null));
    const dlq = new Watcher<DeadLetter>(stack.nc, "reach.dlq.invalid_envelope._invalid");
    const marker = `not json ${id}`;
    const h = headers();
    h.set("Nats-Msg-Id", `garbage-${id}`);
    await stack.nc.jetstream().publish(`reach.agent.${id}.p1`, marker, { headers: h });
    const letter = await dlq.next((d) => d.raw === marker);
    assert.equal(letter.error?.type, "invalid_envelope");
    assert.match(letter.error?.message ?? "", /at `\$`/);
    assert.equal(letter.headers["Nats-Msg-Id"], `garbage-${id}`);
    assert.equal(letter.headers["Reach-Reported-By"], id);
    dlq.close();
  });

  it("reports an undecodable dispatch too large to report whole cut, and its dead letter says so", async () => {
    const id = unique("ts-huge");
    await started(newAgent(id).handler(unique("any"), () => null));
    const dlq = new Watcher<DeadLetter>(stack.nc, "reach.dlq.invalid_envelope._invalid");
    const body = `${id}${'"'.repeat(600_000)}`; // JSON-escaped, each quote doubles: past 1 MB
    await stack.nc.jetstream().publish(`reach.agent.${id}.p1`, body);
    const letter = await dlq.next((d) => d.headers["Reach-Reported-By"] === id);
    assert.equal(letter.truncated, true);
    assert.equal(letter.raw, `${body.slice(0, 65_536)}…`);
    dlq.close();
  });
});

describe("registration and liveness", () => {
  it("registers a card, beats, answers probes and is listed as a micro service", async () => {
    const id = unique("ts-card");
    const topic = unique("carded");
    const agent = await started(newAgent(id, { tags: { lang: "ts" } }).handler(topic, { version: "2.1.0", capacity: 3, deadlineMs: 5_000, description: "Refunds for paid orders", examples: ["I want my money back"] }, () => null));
    const card = (await (await kv("reach_agents")).get(id))!.json<AgentCard>();
    assert.equal(card.status, "running");
    assert.equal(card.epoch, agent.epoch);
    assert.deepEqual(card.intents[topic], {
      version: "2.1.0",
      capacity: 3,
      deadline_ms: 5_000,
      max_attempts: null,
      description: "Refunds for paid orders",
      examples: ["I want my money back"],
    });
    assert.deepEqual(card.tags, { lang: "ts" });
    const beat = await kvUntil<Heartbeat>(await kv("reach_heartbeats"), id, (b) => b !== null && b.seq >= 2);
    assert.equal(beat!.epoch, agent.epoch);
    assert.equal(beat!.interval_s, 1);
    assert.equal(beat!.free_slots, 3); // the handler's places, shared by the three priorities
    await kvUntil<Liveness>(await kv("reach_liveness"), id, (l) => l?.state === "ONLINE");
    assert.equal((await stack.nc.request(`reach.presence.${id}`, "", { timeout: 2_000 })).string(), "here");
    assert.equal((await stack.nc.request(`reach.ping.${id}`, "", { timeout: 2_000 })).string(), "pong");
    const infos = await stack.nc.services.client().info("reach-agent");
    const mine = [];
    for await (const info of infos) if (info.metadata?.agent_id === id) mine.push(info);
    assert.equal(mine.length, 1);
    assert.equal(mine[0]!.version, "2.1.0");
    assert.equal(mine[0]!.endpoints[0]!.subject, `reach.ping.${id}`);
  });

  it("raises the epoch on restart and refuses a second live process with the same id", async () => {
    const id = unique("ts-epoch");
    const topic = unique("epoch");
    const first = await started(newAgent(id).handler(topic, () => null));
    const twin = newAgent(id).handler(topic, () => null);
    await assert.rejects(twin.start(stack.url), AgentIdInUse);
    await first.stop();
    const second = await started(newAgent(id).handler(topic, () => null));
    assert.equal(second.epoch, first.epoch + 1);
  });

  it("does not record a failure its own stop caused: the task is delivered again and runs to its end", async () => {
    const id = unique("ts-stopping");
    const topic = unique("watchful");
    const running = new Gate();
    // maxAttempts 1: a failure recorded now would dead-letter the task.
    const first = newAgent(id, { drainTimeoutMs: 200, ackWaitMs: 1_000 }).handler(topic, { maxAttempts: 1 }, async (ctx) => {
      running.open();
      await new Promise((_resolve, reject) => ctx.signal.addEventListener("abort", () => reject(ctx.signal.reason)));
    });
    await started(first);
    const t = task(topic, null);
    const events = eventsOf(stack, t.message_id);
    const replies = await send(stack, t);
    await running.opened;
    await first.stop(); // the handler watches ctx.signal, as advised, and rejects
    await started(newAgent(id).handler(topic, { maxAttempts: 1 }, () => ({ done: true })));
    const ending = await replies.next((r) => r.kind === "result" || r.kind === "error", 15_000);
    assert.deepEqual(ending.kind === "result" && ending.result, { done: true }, JSON.stringify(ending));
    const said = events.seen.map((m) => `${m.body.event} ${JSON.stringify(m.body.detail).slice(0, 300)}`);
    assert.equal(events.count((e) => e.event === "failed" || e.event === "dead_lettered"), 0, said.join("\n"));
    replies.close();
    events.close();
  });

  it("waits at its stop for an outcome the server keeps it from recording, past the drain timeout (it was thrown away with the running handlers)", async () => {
    const id = unique("ts-recording");
    const topic = unique("recording");
    const running = new Gate();
    const release = new Gate();
    const draining = new Gate();
    const said: string[] = [];
    const logger = {
      ...quiet,
      info: (event: string) => (event.startsWith("stopping: waiting for running handlers") ? draining.open() : undefined),
      warn: (event: string) => void said.push(event),
      error: (event: string) => void said.push(event),
    };
    let runs = 0;
    const agent = newAgent(id, { drainTimeoutMs: 2_000, logger }).handler(topic, async () => {
      runs += 1;
      running.open();
      await release.opened;
      return { done: true };
    });
    await started(agent);
    const t = task(topic, null);
    const replies = await send(stack, t);
    await running.opened;
    const stopping = agent.stop();
    await draining.opened; // the drain began: the server stops answering for 3 s as the run ends
    await (stack as RestartableStack).pauseServer(3_000); // stopped before the run ends
    release.open();
    await within(stopping, 15_000, "the stop");
    const records = await kv("reach_executions");
    const record = await kvUntil<Execution>(records, `_.${t.message_id}.${id}`, (r) => r?.state === "done");
    assert.equal(record?.state, "done");
    assert.equal(runs, 1);
    assert.ok(!said.some((event) => event.startsWith("handlers still running")), said.join("\n"));
    assert.ok(said.some((event) => event.startsWith("runs that ended are still recording")), said.join("\n"));
    replies.close();
  });

  it("takes no record the NATS server wrote for its own (a forged 'done' record sent its result)", async () => {
    const id = unique("ts-forged");
    const topic = unique("forged");
    const agent = newAgent(id).handler(topic, () => ({ real: true }));
    await started(agent);
    const t = task(topic, { n: 1 });
    const key = `_.${t.message_id}.${id}`;
    // Staged under another key, then copied by the server onto this task's record.
    const own = `$KV.reach_executions.x.y.${id}`;
    const forged = { message_id: t.message_id, state: "done", agent_id: id, epoch: 1, attempt: 1, result: { FORGED: true } };
    await stack.nc.jetstream().publish(own, JSON.stringify(forged));
    stack.nc.publish(`$JS.API.DIRECT.GET.KV_reach_executions.${own}`, "", { reply: `$KV.reach_executions.${key}` });
    const records = await kv("reach_executions");
    await kvUntil<{ result?: unknown }>(records, key, (r) => r?.result !== undefined);
    const replies = await send(stack, t);
    const ending = await replies.next((r) => r.kind === "result" || r.kind === "error", 15_000);
    assert.deepEqual(ending.kind === "result" && ending.result, { real: true }, JSON.stringify(ending));
    replies.close();
  });

  it("records its outcome over a server's answer aimed at its running claim (the task was lost)", async () => {
    const id = unique("ts-claimed");
    const topic = unique("claimed");
    const running = new Gate();
    const release = new Gate();
    const agent = newAgent(id).handler(topic, async () => {
      running.open();
      await release.opened;
      return { done: true };
    });
    await started(agent);
    const t = task(topic, null);
    const key = `_.${t.message_id}.${id}`;
    const replies = await send(stack, t);
    await running.opened;
    stack.nc.publish("$JS.API.STREAM.NAMES", "", { reply: `$KV.reach_executions.${key}` });
    const records = await kv("reach_executions");
    await kvUntil<{ type?: string }>(records, key, (r) => r?.type !== undefined);
    release.open();
    const ending = await replies.next((r) => r.kind === "result" || r.kind === "error", 15_000);
    assert.deepEqual(ending.kind === "result" && ending.result, { done: true }, JSON.stringify(ending));
    assert.equal((await records.get(key))!.json<{ state: string }>().state, "done");
    replies.close();
  });

  it("takes no epoch back when its card was overwritten by a server's answer", async () => {
    const id = unique("ts-epochal");
    const cards = await kv("reach_agents");
    await registeredTwice(id, cards);
    stack.nc.publish("$JS.API.STREAM.NAMES", "", { reply: `$KV.reach_agents.${id}` });
    await kvUntil<{ type?: string }>(cards, id, (c) => c?.type !== undefined);
    const again = newAgent(id).handler(unique("epochal"), () => null);
    await started(again);
    const epoch = (await cards.get(id))!.json<AgentCard>().epoch;
    assert.ok(epoch > 2, `epoch ${epoch}: a stalled process of epoch 2 would fence this one off`);
    await again.stop();
  });

  it("takes no epoch back when its card was deleted (reach agents forget, nats kv del)", async () => {
    // From 1, a restarted process waited out a crashed one's claims of a higher epoch.
    const id = unique("ts-forgotten");
    const cards = await kv("reach_agents");
    await registeredTwice(id, cards);
    await cards.delete(id);
    const again = await started(newAgent(id).handler(unique("forgotten"), () => null));
    const epoch = (await cards.get(id))!.json<AgentCard>().epoch;
    assert.ok(epoch > 2 && again.epoch === epoch, `epoch ${epoch}: below the epochs the id had`);
    await again.stop();
  });

  it("beats and claims past a heartbeat and a claim whose headers nats.js cannot read", async () => {
    // nats.js's kv.get decodes a direct get's headers inside its reader: `Bad Key: x` at the
    // heartbeat key closed the agent's connection on every beat. Such an entry is nobody's.
    const id = unique("ts-badbeat");
    const topic = unique("badbeat");
    const agent = newAgent(id, { heartbeatIntervalMs: 200 }).handler(topic, (_ctx, payload) => payload);
    await started(agent);
    const beats = await keys("reach_heartbeats");
    const bad = "NATS/1.0\r\nBad Key: x\r\n\r\n";
    await rawPublish(stack.url, `$KV.reach_heartbeats.${id}`, bad, "{}");
    const poisoned = (await beats.last(id))!;
    assert.ok(poisoned.nobodys);
    const real = task(topic, { real: true });
    await rawPublish(stack.url, `$KV.reach_executions._.${real.message_id}.${id}`, bad, "{}");
    const replies = await send(stack, real);
    const ending = await replies.next((r) => r.kind === "result" || r.kind === "error", 15_000);
    assert.deepEqual(ending.kind === "result" && ending.result, { real: true }, JSON.stringify(ending));
    replies.close();
    for (let tries = 0; ; tries += 1) {
      const entry = (await beats.last(id))!;
      if (entry.revision > poisoned.revision && !entry.nobodys) break;
      assert.ok(tries < 50, "no heartbeat written over the poisoned one");
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    await agent.stop();
  });

  it("reads a key again past a refused write when a replica answers from behind", async () => {
    // A cluster catching up after a lost majority: a direct get answered by a replica behind
    // the leader read an agent's landed outcome as still `running`, and it was thrown away.
    const k = await keys("reach_executions");
    const key = `_.${unique("behind")}.ts`;
    const first = await k.put(key, new TextEncoder().encode('{"n":1}'));
    const stale = (await k.last(key))!;
    const second = await k.put(key, new TextEncoder().encode('{"n":2}'));
    const lagging = [stale, stale];
    const replica = k as unknown as { lastRead(key: string): Promise<StoredEntry | null> };
    const read = replica.lastRead.bind(k);
    replica.lastRead = async (at: string) => lagging.pop() ?? read(at);
    assert.equal((await k.last(key, first))!.revision, second);
    lagging.push(stale);
    assert.equal((await k.last(key))!.revision, first); // nothing proved: what was read
  });

  it("starts past a card whose headers nats.js cannot read (it exited at start)", async () => {
    const id = unique("ts-badcard");
    const bad = "NATS/1.0\r\nBad Key: x\r\n\r\n";
    await rawPublish(stack.url, `$KV.reach_agents.${id}`, bad, JSON.stringify({ agent_id: id, epoch: 7 }));
    const cards = await keys("reach_agents");
    const poisoned = (await cards.last(id))!;
    assert.ok(poisoned.nobodys);
    const agent = await started(newAgent(id).handler(unique("badcard"), () => null));
    const card = (await cards.last(id))!;
    assert.ok(!card.nobodys && card.revision > poisoned.revision);
    assert.equal(JSON.parse(new TextDecoder().decode(card.value)).epoch, poisoned.revision);
    await agent.stop();
  });

  it("serves on past a stored message whose headers nats.js cannot read, copied into its queue", async () => {
    // nats.js throws BAD_HEADER on reading `Bad Key: x`: settle rethrew, five such messages
    // held every slot of the consumer, and one aimed at the control subject closed the connection.
    const id = unique("ts-badhdr");
    const topic = unique("badhdr");
    const agent = newAgent(id).handler(topic, (_ctx, payload) => payload);
    await started(agent);
    const own = `$KV.reach_executions.x.y.${unique("evil")}`;
    await rawPublish(stack.url, own, "NATS/1.0\r\nBad Key: x\r\n\r\n", JSON.stringify(task(topic, { FORGED: true })));
    for (const subject of [`reach.agent.${id}.p1`, `reach.ctl.agent.${id}`]) {
      for (let i = 0; i < 5; i += 1) stack.nc.publish(`$JS.API.DIRECT.GET.KV_reach_executions.${own}`, "", { reply: subject });
    }
    const replies = await send(stack, task(topic, { real: true }));
    const ending = await replies.next((r) => r.kind === "result" || r.kind === "error", 15_000);
    assert.deepEqual(ending.kind === "result" && ending.result, { real: true }, JSON.stringify(ending));
    replies.close();
  });

  it("runs no task the NATS server copied into its queue (a staged task ran as alice's)", async () => {
    const id = unique("ts-queue");
    const topic = unique("queued");
    const seen: unknown[] = [];
    const agent = newAgent(id).handler(topic, (_ctx, payload) => {
      seen.push(payload);
      return payload;
    });
    await started(agent);
    const forged = task(topic, { FORGED: true });
    const own = `$KV.reach_executions.x.y.${unique("evil")}`;
    await stack.nc.jetstream().publish(own, JSON.stringify({ ...forged, caller: "alice" }));
    stack.nc.publish(`$JS.API.DIRECT.GET.KV_reach_executions.${own}`, "", { reply: `reach.agent.${id}.p1` });
    // Asked for no headers (no_hdr), the server copies the stored body alone: nothing tells it apart but that.
    stack.nc.publish(`$JS.API.DIRECT.GET.KV_reach_executions.${own}`, '{"no_hdr": true}', { reply: `reach.agent.${id}.p1` });
    const events = eventsOf(stack, forged.message_id);
    const real = task(topic, { real: true });
    const replies = await send(stack, real); // after the copy in the same queue
    const ending = await replies.next((r) => r.kind === "result" || r.kind === "error", 15_000);
    assert.deepEqual(ending.kind === "result" && ending.result, { real: true }, JSON.stringify(ending));
    assert.deepEqual(seen, [{ real: true }]);
    assert.equal(events.count((e) => e.event === "accepted" || e.event === "completed"), 0);
    replies.close();
    events.close();
  });

  it("marks its card draining while running handlers finish, then stopped", async () => {
    const id = unique("ts-draining");
    const topic = unique("drained");
    const running = new Gate();
    const release = new Gate();
    const agent = newAgent(id, { drainTimeoutMs: 10_000 }).handler(topic, async () => {
      running.open();
      await release.opened;
      return { done: true };
    });
    await started(agent);
    const replies = await send(stack, task(topic, null));
    await running.opened;
    const stopping = agent.stop();
    const cards = await kv("reach_agents");
    await kvUntil<AgentCard>(cards, id, (c) => c?.status === "draining");
    release.open();
    await within(stopping, 5_000, "stop() after the handler ended");
    const ending = await replies.next((r) => r.kind === "result" || r.kind === "error", 5_000);
    assert.deepEqual(ending.kind === "result" && ending.result, { done: true }, JSON.stringify(ending));
    assert.equal((await cards.get(id))!.json<AgentCard>().status, "stopped");
    replies.close();
  });

  it("gives up a start that is stopped during its startup delay, registering nothing", async () => {
    const id = unique("ts-early");
    const agent = newAgent(id, { startupDelayMs: 60_000 }).handler(unique("early"), () => null);
    const starting = agent.start(stack.url);
    await agent.stop();
    await assert.rejects(starting, ReachError);
    assert.equal(await (await kv("reach_agents")).get(id), null);
  });

  it("resolves run() when stopped during its start (Ctrl-C while it connects is a clean stop)", async () => {
    const agent = newAgent(unique("ts-early-run"), { startupDelayMs: 60_000 }).handler(unique("early"), () => null);
    const running = agent.run(stack.url);
    await agent.stop();
    await running; // rejected with "the agent was stopped while starting": an unhandled stack
  });

  it("starts although a silent subscriber listens on its presence subject", async () => {
    const id = unique("ts-tapped");
    const tap = stack.nc.subscribe(`reach.presence.${id}`, { callback: () => undefined }); // answers nothing
    await stack.nc.flush();
    try {
      const agent = await started(newAgent(id).handler(unique("tapped"), () => null));
      assert.ok(agent.epoch >= 1);
    } finally {
      tap.unsubscribe();
    }
  });

  it("leaves the card and heartbeat of a newer process of its id when it stops", async () => {
    const id = unique("ts-replaced");
    const said: string[] = [];
    const logger = { ...quiet, warn: (event: string) => void said.push(event) };
    const topic = unique("replaced");
    const running = new Gate();
    const release = new Gate();
    const agent = await started(
      newAgent(id, { heartbeatIntervalMs: 30_000, logger }).handler(topic, async () => {
        running.open();
        await release.opened;
        return null;
      }),
    );
    const replies = await send(stack, task(topic, null)); // running at the stop: draining is marked too
    await running.opened;
    const cards = await kv("reach_agents");
    const beats = await kv("reach_heartbeats");
    const card = (await cards.get(id))!.json<AgentCard>();
    const newer = { ...card, epoch: card.epoch + 1, pid: 1 };
    await cards.put(id, JSON.stringify(newer));
    await beats.put(id, JSON.stringify({ v: 1, agent_id: id, epoch: newer.epoch, seq: 1, interval_s: 30 }));
    const stopping = agent.stop();
    release.open();
    await stopping;
    replies.close();
    const after = (await cards.get(id))!.json<AgentCard>();
    assert.deepEqual([after.status, after.epoch], ["running", newer.epoch]);
    assert.equal((await beats.get(id))!.json<Heartbeat>().epoch, newer.epoch);
    // Said once (it was at draining and again at stopped, a trial).
    assert.equal(said.filter((event) => event.startsWith("a newer process registered this agent id")).length, 1, said.join("\n"));
  });

  it("stops, its run rejecting, once a newer process of its id heartbeats (a stalled one that resumed)", async () => {
    const id = unique("ts-fenced");
    const errors: string[] = [];
    const logger = { ...quiet, error: (event: string) => void errors.push(event) };
    const agent = newAgent(id, { heartbeatIntervalMs: 200, logger }).handler(unique("fenced"), () => null);
    agents.push(agent);
    const running = agent.run(stack.url);
    const cards = await kv("reach_agents");
    const beats = await kv("reach_heartbeats");
    const card = (await kvUntil<AgentCard>(cards, id, (c) => c?.status === "running"))!;
    await kvUntil<Heartbeat>(beats, id, (b) => b?.epoch === card.epoch); // its first beat is in
    // What a newer process of the id writes when it registers past this one, then beats.
    const newer = { ...card, epoch: card.epoch + 1, pid: 1 };
    await cards.put(id, JSON.stringify(newer));
    const newerBeat = new TextEncoder().encode(JSON.stringify({ v: 1, agent_id: id, epoch: newer.epoch, seq: 1, interval_s: 30 }));
    // Without headers first: what the server copies of someone's stored message (a direct get's
    // no_hdr) onto the key. It fenced the agent out; every process's beat carries headers.
    await beats.put(id, newerBeat);
    await kvUntil<Heartbeat>(beats, id, (b) => b?.epoch === card.epoch); // beaten over, not obeyed
    // With headers but naming another agent: written with its creds by no process of its id.
    const elsewhere = { v: 1, agent_id: "someone-else", epoch: newer.epoch, seq: 1, interval_s: 30 };
    await (await keys("reach_heartbeats")).put(id, new TextEncoder().encode(JSON.stringify(elsewhere)));
    await kvUntil<Heartbeat>(beats, id, (b) => b?.agent_id === id && b?.epoch === card.epoch);
    await (await keys("reach_heartbeats")).put(id, newerBeat);
    await assert.rejects(within(running, 10_000, "the fenced agent's stop"), (err: unknown) => {
      assert.ok(err instanceof AgentIdInUse);
      assert.equal(
        err.message,
        `agent_id '${id}' was registered again by a newer process (epoch ${newer.epoch}; this one's ${card.epoch}): this process stopped`,
      );
      return true;
    });
    assert.ok(errors.includes("a newer process of this agent id heartbeats; this one stops"), errors.join("\n"));
    await assert.rejects(stack.nc.request(`reach.presence.${id}`, "", { timeout: 2_000 })); // no longer answers
    const after = (await cards.get(id))!.json<AgentCard>();
    assert.deepEqual([after.status, after.epoch, after.pid], ["running", newer.epoch, 1]);
    const beat = await beats.get(id);
    assert.equal(beat?.operation, "PUT");
    assert.deepEqual([beat!.json<Heartbeat>().epoch, beat!.json<Heartbeat>().seq], [newer.epoch, 1]);
  });

  it("waits for the streams and buckets of its prefix, and starts once they are provisioned", async () => {
    const prefix = `fresh${process.pid}`;
    const waiting = new Gate();
    const warn = (event: string) => void (event.startsWith("waiting for the streams") && waiting.open());
    const logger = { debug() {}, info() {}, warn, error() {} };
    const agent = newAgent(unique("ts-early-bird"), { prefix, logger }).handler(unique("early"), () => null);
    agents.push(agent);
    const starting = agent.start(stack.url);
    await waiting.opened; // it says so, instead of failing
    const provision = spawn(binary("REACH_BIN", "reach"), ["provision", "--prefix", prefix, "--nats-url", stack.url], { stdio: "ignore" });
    assert.equal(await new Promise((resolve) => provision.once("exit", resolve)), 0);
    await starting;
    assert.equal(agent.epoch, 1);
  });

  it("writes its card again when it is deleted or overwritten by hand, and is routed to again", async () => {
    const id = unique("ts-scribbled");
    const topic = unique("scribbled");
    const agent = await started(newAgent(id, { heartbeatIntervalMs: 250 }).handler(topic, (_ctx, p) => p));
    const cards = await kv("reach_agents");
    for (const damage of [() => cards.put(id, "garbage-card"), () => cards.delete(id)]) {
      await damage();
      const card = await within(readableCard(cards, id), 10_000, "the card written again");
      assert.equal(card.epoch, agent.epoch);
      assert.equal(card.status, "running");
      const replies = await send(stack, task(topic, { n: 1 }));
      const result = (await replies.next((r) => r.kind === "result")) as Result;
      assert.deepEqual(result.result, { n: 1 });
      replies.close();
    }
  });

  it("follows the coordinator's control message to change the heartbeat interval", async () => {
    const id = unique("ts-ctl");
    await started(newAgent(id).handler(unique("ctl"), () => null));
    const beats = await kv("reach_heartbeats");
    await kvUntil<Heartbeat>(beats, id, (b) => b !== null);
    const first = await kvUntil<Heartbeat>(beats, id, (b) => b !== null);
    const control = { headers: controlHeaders() }; // as the coordinator sends it: one without is nobody's
    stack.nc.publish(`reach.ctl.agent.${id}`, JSON.stringify({ heartbeat_interval_s: 3_600 }), control);
    // Ignored (over 300: the coordinator would ignore such beats); adopted, it beats at once with it.
    const next = await kvUntil<Heartbeat>(beats, id, (b) => (b?.seq ?? 0) > first!.seq);
    assert.notEqual(next!.interval_s, 3_600);
    stack.nc.publish(`reach.ctl.agent.${id}`, JSON.stringify({ heartbeat_interval_s: 0.5 }), control);
    const beat = await kvUntil<Heartbeat>(beats, id, (b) => b?.interval_s === 0.5);
    assert.equal(beat!.interval_s, 0.5);
  });

  it("says when its event loop stood still longer than its heartbeat interval", async () => {
    // A 20 s busy loop left no line in the agent's log; only the coordinator saw it (a trial).
    let lagged!: (fields: Record<string, unknown>) => void;
    const lag = new Promise<Record<string, unknown>>((resolve) => (lagged = resolve));
    const keep = (event: string, fields?: Record<string, unknown>) => {
      if (event.startsWith("heartbeat lag detected")) lagged(fields ?? {});
    };
    const logger = { debug: keep, info: keep, warn: keep, error: keep };
    const topic = unique("busy");
    await started(newAgent(unique("ts-busy"), { logger }).handler(topic, () => {
      const until = performance.now() + 1_600; // heartbeatIntervalMs is 1 s here
      while (performance.now() < until); // blocks the loop
      return "done";
    }));
    const replies = await send(stack, task(topic, null));
    await replies.next((r) => r.kind === "result", 15_000);
    replies.close();
    const fields = await within(lag, 5_000, "heartbeat lag detected");
    assert.ok((fields.lag_s as number) > 1, JSON.stringify(fields));
  });

  it("says once which of its intents the coordinator routes it no task of, and why", async () => {
    const id = unique("ts-refused");
    const said: Array<[string, Record<string, unknown>]> = [];
    const keep = (event: string, fields?: Record<string, unknown>) => void said.push([event, fields ?? {}]);
    const logger = { debug: keep, info: keep, warn: keep, error: keep };
    await started(newAgent(id, { logger }).handler(unique("refused"), () => null));
    const beats = await kv("reach_heartbeats");
    await kvUntil<Heartbeat>(beats, id, (b) => b !== null);
    const refused = { summarize: "not allowed by its credentials (it may serve: translate)" };
    const body = JSON.stringify({ refused, refused_count: 3 });
    for (let i = 0; i < 2; i += 1) stack.nc.publish(`reach.ctl.agent.${id}`, body, { headers: controlHeaders() });
    const other = headers(); // headers, but not the coordinator's: ignored
    other.set("Nats-Msg-Id", "x");
    stack.nc.publish(`reach.ctl.agent.${id}`, JSON.stringify({ refused: { x: "forged" } }), { headers: other });
    // A third, read after them (one subscription, in order): its interval shows in a beat.
    const after = JSON.stringify({ heartbeat_interval_s: 0.5 });
    stack.nc.publish(`reach.ctl.agent.${id}`, after, { headers: controlHeaders() });
    await kvUntil<Heartbeat>(beats, id, (b) => b?.interval_s === 0.5);
    const told = said.filter(([event]) => event.startsWith("the coordinator routes this agent"));
    assert.equal(told.length, 1); // the same refusals again are not said again, a forged one not at all
    assert.ok(said.some(([event]) => event === "ignoring a control message without the header Reach-Kind: control"));
    assert.deepEqual(told[0]![1], { agent_id: id, refused, count: 3 });
  });

  it("stops gracefully: run ends, card stopped, heartbeat deleted, coordinator says OFFLINE stopped", async () => {
    const id = unique("ts-stop");
    const agent = newAgent(id).handler(unique("stop"), () => null);
    agents.push(agent);
    const running = agent.run(stack.url);
    const liveness = await kv("reach_liveness");
    await kvUntil<Liveness>(liveness, id, (l) => l?.state === "ONLINE");
    await agent.stop();
    await within(running, 5_000, "run() after stop()"); // ends with the stop, without an error
    const card = (await (await kv("reach_agents")).get(id))!.json<AgentCard>();
    assert.equal(card.status, "stopped");
    const beat = await (await kv("reach_heartbeats")).get(id);
    assert.notEqual(beat?.operation, "PUT");
    const judged = await kvUntil<Liveness>(liveness, id, (l) => l?.state === "OFFLINE");
    assert.equal(judged!.reason, "stopped");
  });

  it("has its unfinished tasks reassigned to another agent after it dies", async () => {
    const topic = unique("orphan");
    const deadId = unique("ts-dies");
    const fixture = new URL("./fixtures/blocking-agent.js", import.meta.url).pathname;
    const child = spawn(process.execPath, [fixture, stack.url, deadId, topic], { stdio: ["ignore", "pipe", "pipe"] });
    try {
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error("blocking agent did not start")), 20_000);
        child.stdout.on("data", (c: Buffer) => {
          if (c.toString().includes("ready")) {
            clearTimeout(timer);
            resolve();
          }
        });
        child.once("exit", (code) => reject(new Error(`blocking agent exited with ${code}`)));
      });
      const running = task(topic, "first");
      const queued = task(topic, "second");
      const runningEvents = eventsOf(stack, running.message_id);
      const queuedEvents = eventsOf(stack, queued.message_id);
      const r1 = await send(stack, running);
      await runningEvents.next((e) => e.event === "accepted" && e.agent_id === deadId);
      const r2 = await send(stack, queued);
      await queuedEvents.next((e) => e.event === "routed" && e.agent_id === deadId);
      child.kill("SIGKILL"); // a crash: no stop, no card update, the heartbeat stays
      const rescuer = await started(newAgent(unique("ts-rescuer")).handler(topic, (ctx, p) => ({ p, attempt: ctx.attempt })));
      const a = (await r1.next((r) => r.kind === "result", 20_000)) as Result;
      const b = (await r2.next((r) => r.kind === "result", 20_000)) as Result;
      assert.deepEqual(a.result, { p: "first", attempt: 2 });
      assert.deepEqual(b.result, { p: "second", attempt: 2 });
      assert.equal(a.from_agent, rescuer.agentId);
      const liveness = (await (await kv("reach_liveness")).get(deadId))!.json<Liveness>();
      assert.equal(liveness.state, "OFFLINE");
      for (const w of [runningEvents, queuedEvents, r1, r2]) w.close();
    } finally {
      await terminate(child);
    }
  });
});

describe("dispatch consumers that are gone", () => {
  it("makes its deleted consumers again with their settings, says so once each, and serves the next task", async () => {
    const topic = unique("regone");
    const id = unique("ts-regone");
    const warnings: Array<[string, Record<string, unknown>]> = [];
    const backAt = new Map<unknown, Gate>(["P0", "P1", "P2"].map((p) => [p, new Gate()]));
    const logger = {
      debug() {},
      info(event: string, fields: Record<string, unknown> = {}) {
        if (event === "consuming again" && fields.consumer_made_again === true) backAt.get(fields.priority)?.open();
      },
      warn(event: string, fields: Record<string, unknown> = {}) {
        warnings.push([event, fields]);
      },
      error() {},
    };
    await started(newAgent(id, { logger, ackWaitMs: 7_000, maxDeliver: 3 }).handler(topic, { capacity: 2 }, (_ctx, p) => ({ echoed: p })));
    const consumers = (["P0", "P1", "P2"] as const).map((p) => [`REACH_DISPATCH_${p}`, `agent-${id}-${p.toLowerCase()}`] as const);
    const settings = async () =>
      Promise.all(
        consumers.map(async ([stream, name]) => {
          const c = (await stack.jsm.consumers.info(stream, name)).config;
          return [c.durable_name, c.filter_subject, c.ack_policy, c.deliver_policy, c.ack_wait, c.max_ack_pending, c.max_deliver, c.inactive_threshold];
        }),
      );
    const made = await settings();
    assert.deepEqual(made[1]!.slice(0, 2), [`agent-${id}-p1`, `reach.agent.${id}.p1`]);
    assert.deepEqual(made[1]!.slice(4, 7), [7_000_000_000, 2, 3]);
    for (const [stream, name] of consumers) assert.equal(await stack.jsm.consumers.delete(stream, name), true);
    const t = task(topic, { after: "delete" });
    const replies = await send(stack, t);
    const result = (await replies.next((r) => r.kind === "result", 20_000, "result after the consumers were deleted")) as Result;
    assert.deepEqual(result.result, { echoed: { after: "delete" } });
    await within(Promise.all([...backAt.values()].map((g) => g.opened)), 20_000, "every priority consuming again");
    assert.deepEqual(await settings(), made); // the same settings, made again
    const gone = warnings.filter(([event]) => event === "dispatch consumer gone; making it again");
    assert.deepEqual(gone.map(([, f]) => f.priority).sort(), ["P0", "P1", "P2"], JSON.stringify(warnings)); // once per outage
    assert.equal(warnings.length, 3, JSON.stringify(warnings));
    replies.close();
  });
});

describe("a dispatch stream that is gone", () => {
  it("waits for it with a growing pause, makes the consumer again once it is back, and stops at once meanwhile", async () => {
    const prefix = `streamless${process.pid}`;
    const provisioned = async () => {
      const child = spawn(binary("REACH_BIN", "reach"), ["provision", "--prefix", prefix, "--nats-url", stack.url], { stdio: "ignore" });
      assert.equal(await new Promise((resolve) => child.once("exit", resolve)), 0);
    };
    await provisioned();
    const topic = unique("streamless");
    const id = unique("ts-streamless");
    let gone = new Gate();
    const thirdTry = new Gate();
    const back = new Gate();
    const paused: string[] = [];
    let tries = 0;
    const logger = {
      debug(event: string, fields: Record<string, unknown> = {}) {
        if (event === "dispatch consumer not made again yet" && fields.priority === "P1" && ++tries === 3) thirdTry.open();
      },
      info(event: string, fields: Record<string, unknown> = {}) {
        if (event === "consuming again" && fields.priority === "P1") back.open();
      },
      warn(event: string, fields: Record<string, unknown> = {}) {
        if (fields.priority !== "P1") return;
        paused.push(event);
        gone.open();
      },
      error() {},
    };
    const agent = await started(newAgent(id, { prefix, logger }).handler(topic, (_ctx, p) => ({ echoed: p })));
    const stream = `${prefix.toUpperCase()}_DISPATCH_P1`;
    assert.equal(await stack.jsm.streams.delete(stream), true); // its consumer goes with it
    await gone.opened;
    const since = Date.now();
    await within(thirdTry.opened, 15_000, "three tries to make the consumer");
    // 0.5 + 1 + 2 s of pauses before the third try: no busy loop.
    assert.ok(Date.now() - since >= 3_000, `third try after ${Date.now() - since} ms`);
    await provisioned();
    await within(back.opened, 15_000, "consuming again once the stream is back");
    const t = task(topic, { after: "stream" }, { to_agent: id, reply_to: createInbox() });
    const replies = new Watcher<Reply>(stack.nc, t.reply_to!);
    await stack.nc.flush();
    await stack.nc.jetstream().publish(`${prefix}.agent.${id}.p1`, JSON.stringify(t), { headers: dispatchHeaders() }); // with headers, as a dispatch has
    const result = (await replies.next((r) => r.kind === "result", 15_000, "result once the stream is back")) as Result;
    assert.deepEqual(result.result, { echoed: { after: "stream" } });
    replies.close();
    assert.deepEqual(paused, ["dispatch consumer gone; making it again"]); // once for the whole outage
    // Gone again: a stop meanwhile ends the wait at once.
    gone = new Gate();
    assert.equal(await stack.jsm.streams.delete(stream), true);
    await gone.opened;
    await within(agent.stop(), 3_000, "stop while the stream is gone");
  });
});

describe("a stop while the server is away", () => {
  it("waits a second for the connection, not each write's timeout, and says why it leaves its card (a trial: 31 s)", async () => {
    const dir = mkdtempSync(join(tmpdir(), "reach-ts-away-"));
    const port = await freePort();
    const url = `nats://127.0.0.1:${port}`;
    const server = await startServer(port, join(dir, "store"));
    const gone = new Gate();
    const said: string[] = [];
    const logger = {
      ...quiet,
      warn: (event: string) => {
        said.push(event);
        if (event.startsWith("nats disconnected")) gone.open();
      },
    };
    const agent = newAgent(unique("ts-away"), { logger }).handler(unique("away"), () => null);
    try {
      await provision(url);
      await agent.start(url);
      await terminate(server);
      await gone.opened;
      // It left the card without writing (each write waited out its timeout: 6.8 s here);
      // the bound is for a hang, not a measure.
      await within(agent.stop(), 10_000, "the stop");
      assert.ok(said.some((e) => e.startsWith("NATS is unreachable: stopping without marking the card stopped")), said.join("\n"));
    } finally {
      await agent.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe("a server that comes back with an empty store", () => {
  it("has the agent's card written again, with the epoch it serves under, and its consumers made again", async () => {
    const dir = mkdtempSync(join(tmpdir(), "reach-ts-empty-"));
    const port = await freePort();
    const url = `nats://127.0.0.1:${port}`;
    let server = await startServer(port, join(dir, "a"));
    const topic = unique("rehomed");
    const agent = newAgent(unique("ts-rehomed")).handler(topic, (_ctx, p) => ({ echoed: p }));
    try {
      await provision(url);
      await agent.start(url);
      const epoch = agent.epoch;
      await terminate(server);
      server = await startServer(port, join(dir, "b"));
      await provision(url);
      const nc = await connect({ servers: url, name: "test-empty-store" });
      try {
        const cards = await nc.jetstream().views.kv("reach_agents", { bindOnly: true });
        const card = await kvUntil<AgentCard>(cards, agent.agentId, (c) => c !== null, 30_000);
        assert.equal(card?.epoch, epoch);
        assert.equal(card?.status, "running");
        // Its dispatch consumers were lost with the store: it makes them again and serves
        // what is dispatched to it (as the coordinator would, once it routes to the card).
        const t = task(topic, { after: "restart" }, { to_agent: agent.agentId, reply_to: createInbox() });
        const replies = new Watcher<Reply>(nc, t.reply_to!);
        await nc.flush();
        const h = headers();
        h.set("Nats-Msg-Id", t.message_id);
        await nc.jetstream().publish(`reach.agent.${agent.agentId}.p1`, JSON.stringify(t), { headers: h });
        const result = (await replies.next((r) => r.kind === "result", 30_000, "result after the restart")) as Result;
        assert.deepEqual(result.result, { echoed: { after: "restart" } });
        replies.close();
      } finally {
        await nc.close();
      }
    } finally {
      await agent.stop();
      await terminate(server);
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

/** A publish nats.js would refuse to make: a raw HPUB with the header block as given. */
async function rawPublish(url: string, subject: string, block: string, body: string): Promise<void> {
  const { createConnection } = await import("node:net");
  const { hostname, port } = new URL(url);
  const socket = createConnection(Number(port), hostname);
  const size = (text: string) => Buffer.byteLength(text);
  const hpub = `HPUB ${subject} ${size(block)} ${size(block) + size(body)}\r\n${block}${body}\r\n`;
  await new Promise<void>((resolve, reject) => {
    socket.once("error", reject);
    socket.once("data", () => socket.write(`CONNECT {"verbose":false,"headers":true}\r\n${hpub}PING\r\n`));
    socket.on("data", (data) => {
      if (data.toString().includes("PONG")) resolve();
    });
  });
  socket.destroy();
}

// Last in the file: the flood keeps the coordinator's desks busy for a while.
describe("a flooded registrations' desk", () => {
  it("waits for a flooded registrations' desk while a coordinator runs, rather than register alone", async () => {
    // A flood trips the desk's guard: it stops listening for 5 s, and "no responders" there
    // meant "no coordinator: register on your own". The status desk answers: it waits.
    for (let i = 0; i < 8_000; i++) stack.nc.publish("reach.ctl.register.ts-flooder", "", { reply: "_INBOX.flood" });
    await stack.nc.flush();
    for (let i = 0; ; i++) {
      const asked = stack.nc.request("reach.ctl.register.ts-flooder", "", { timeout: 1_000 });
      const deaf = await asked.then(() => false, (err: { code?: string }) => err.code === "503");
      if (deaf) break;
      assert.ok(i < 50, "the registrations' desk never stopped listening");
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    const said: string[] = [];
    const logger = { ...quiet, warn: (event: string) => void said.push(event) };
    const id = unique("ts-latecomer");
    await started(newAgent(id, { logger }).handler(unique("late"), () => null));
    // Under load the status desk may answer too late (the flood queued before it): it waits too.
    const waited = [
      "a coordinator runs but its registrations' desk does not listen now",
      "the registrations' desk does not listen and reach.ctl.status did not answer in time; asking again",
    ];
    assert.ok(said.some((line) => waited.includes(line)), said.join("; "));
    assert.ok(!said.includes("no coordinator answered the registration; registering directly"), said.join("; "));
    assert.equal((await (await kv("reach_agents")).get(id))!.json<AgentCard>().status, "running");
  });
});
