/**
 * The caller's side, `ReachClient`, against a real nats-server, the real Python coordinator
 * and agents of this SDK. Each test uses its own topics and agent ids.
 */

import assert from "node:assert/strict";
import { after, before, describe, it } from "node:test";
import type { ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect, DiscardPolicy, headers } from "nats";
import type { Msg, Subscription } from "nats";

import { Agent, BacklogFull, ConnectError, DeadlineExceeded, InvalidArgument, InvokeAborted, InvokeError, NotAcknowledged, NotProvisioned, PermanentError, ReachClient, ReachError, Rejected, newId, subTaskId, TaskFailed, UnknownWorkflow, WorkflowActionRefused } from "../src/index.js";
import type { Ack, Progress, Task } from "../src/index.js";
import { freePort, Gate, provision, Relay, startSecuredStack, startServer, startStack, terminate, Watcher } from "./harness.js";
import { sleep } from "../src/timing.js";
import { Connection } from "../src/connection.js";
import { Names } from "../src/names.js";
import { ClaimCheck, PayloadUnavailable } from "../src/claimcheck.js";
import type { RestartableStack, SecuredStack, Stack } from "./harness.js";

const quiet = { debug() {}, info() {}, warn() {}, error() {} };
const TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
let counter = 0;

function unique(name: string): string {
  counter += 1;
  return `${name}-${process.pid}-${counter}`;
}

function newAgent(id: string, creds?: string): Agent {
  return new Agent({ agentId: id, startupDelayMs: 0, heartbeatIntervalMs: 1_000, logger: quiet, ...(creds ? { creds } : {}) });
}

/** The error `promise` rejects with (failing when it resolves). */
async function rejection(promise: Promise<unknown>): Promise<Error> {
  try {
    await promise;
  } catch (err) {
    return err as Error;
  }
  assert.fail("expected a rejection, got a result");
}

/** Tasks published on `subject`, watched from before the next publish (the subscription is flushed). */
async function watching(stack: Stack, subject: string): Promise<Watcher<Task>> {
  const watcher = new Watcher<Task>(stack.nc, subject);
  await stack.nc.flush();
  return watcher;
}

function headersOf(msg: Msg): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, values] of msg.headers ?? []) out[name] = values[0] ?? "";
  return out;
}

describe("ReachClient on an open server", () => {
  let stack: Stack;
  let client: ReachClient;
  const agents: Agent[] = [];

  async function serving(agent: Agent): Promise<Agent> {
    agents.push(agent);
    await agent.start(stack.url);
    return agent;
  }

  before(async () => {
    stack = await startStack();
    client = await ReachClient.connect(stack.url, { logger: quiet });
  });

  after(async () => {
    await client?.close();
    await Promise.allSettled(agents.map((a) => a.stop()));
    await stack?.stop();
  });

  it("goes on to the result when an onAck or onProgress callback throws (it aborted the invoke, the task ran on)", async () => {
    const topic = unique("noted");
    await serving(
      newAgent(unique("ts-noted")).handler(topic, async (ctx) => {
        await ctx.progress("half way");
        return "done";
      }),
    );
    const said: string[] = [];
    const logger = { ...quiet, error: (event: string) => void said.push(event) };
    const noisy = await ReachClient.connect(stack.url, { logger, name: "noisy" });
    const broken = () => {
      throw new Error("the caller's own bug");
    };
    try {
      assert.equal(await noisy.invoke(topic, {}, { onAck: broken, onProgress: broken }), "done");
    } finally {
      await noisy.close();
    }
    assert.deepEqual(said, ["the invoke's ack callback threw; it goes on", "the invoke's progress callback threw; it goes on"]);
  });

  it("invokes: a valid envelope with mirrored headers on the intake, acks and progress, the result", async () => {
    const topic = unique("echo");
    await serving(
      newAgent(unique("ts-echo")).handler(topic, async (ctx, p) => {
        await ctx.progress("half way");
        return { echoed: p, traceparent: ctx.traceparent !== null };
      }),
    );
    const intake = await watching(stack, `reach.task.${topic}.*`);
    const acks: Ack[] = [];
    const notes: Progress[] = [];
    const result = await client.invoke(topic, { text: "hi" }, {
      priority: "P0",
      traceId: "trace-echo-1",
      headers: { Tenant: "acme" },
      traceparent: TRACEPARENT,
      ackDeadlineMs: 5_000,
      executeDeadlineMs: 10_000,
      onAck: (a) => void acks.push(a),
      onProgress: (p) => void notes.push(p),
    });
    assert.deepEqual(result, { echoed: { text: "hi" }, traceparent: true });
    assert.ok(acks.length >= 1);
    assert.deepEqual(notes.map((n) => n.note), ["half way"]);
    const sent = await intake.next(() => true);
    const [seen] = intake.seen;
    assert.equal(seen!.subject, `reach.task.${topic}.client`);
    assert.equal(sent.kind, "task");
    assert.equal(sent.v, 1);
    assert.equal(sent.trace_id, "trace-echo-1");
    assert.equal(sent.priority, "P0");
    assert.deepEqual(sent.budget, { seek_ms: 1_000, ack_ms: 5_000, execute_ms: 10_000 });
    assert.equal(sent.ttl_ms, 15_000); // both deadlines together
    assert.deepEqual(sent.headers, { Tenant: "acme" });
    assert.equal(sent.traceparent, TRACEPARENT);
    assert.match(sent.reply_to!, /^reach\.reply\.client\.[A-Za-z0-9_-]+$/);
    assert.equal(sent.attempt, 1);
    assert.deepEqual(headersOf(seen!.msg), {
      "Nats-Msg-Id": sent.message_id,
      "Reach-Trace-Id": "trace-echo-1",
      "Reach-Priority": "P0",
      "Reach-TTL": "15000",
      "Reach-Kind": "task",
      "Reach-Reply-To": sent.reply_to!,
      traceparent: TRACEPARENT,
    });
    intake.close();
  });

  it("throws TaskFailed for a handler's failure, with its type, retryable and the reply's reason", async () => {
    const topic = unique("refuse");
    const flaky = unique("flaky");
    let flakyRuns = 0;
    await serving(
      newAgent(unique("ts-fail"))
        .handler(topic, () => {
          throw new PermanentError("no such order");
        })
        .handler(flaky, { maxAttempts: 2 }, () => {
          flakyRuns += 1;
          throw new Error("database down");
        }),
    );
    const permanent = await rejection(client.invoke(topic, { order: 1 }));
    assert.ok(permanent instanceof TaskFailed && !(permanent instanceof Rejected), String(permanent));
    assert.equal(permanent.type, "PermanentError");
    assert.equal(permanent.error.message, "no such order");
    assert.equal(permanent.retryable, false);
    assert.equal(permanent.ending, "rejected");
    assert.match(permanent.messageId, /^[0-9a-f-]{36}$/);

    const exhausted = await rejection(client.invoke(flaky, null));
    assert.ok(exhausted instanceof TaskFailed && !(exhausted instanceof Rejected), String(exhausted));
    assert.equal(exhausted.type, "Error");
    assert.equal(exhausted.retryable, true);
    assert.equal(exhausted.ending, "retries_exhausted");
    assert.equal(exhausted.attempt, 2); // the attempt it ended at, as the Python SDK says it
    assert.equal(exhausted.attempts, 2); // those that ran, from the error reply
    assert.equal(permanent.attempt, 1);
    assert.equal(flakyRuns, 2);
  });

  it("throws Rejected for no_route: nothing ran", async () => {
    const err = await rejection(client.invoke(unique("nobody"), null));
    assert.ok(err instanceof Rejected, String(err));
    assert.equal(err.type, "no_route");
    assert.equal(err.reason, "no_route");
    assert.equal(err.ending, "no_route");
    assert.equal(err.retryable, false);
  });

  it("throws Rejected expired when no agent accepts the task within its ttl", async () => {
    // The topic's only agent has stopped: the task waits for it, within its ttl.
    const topic = unique("stopped");
    const agent = await serving(newAgent(unique("ts-stopped")).handler(topic, () => "ran"));
    await agent.stop();
    const err = await rejection(client.invoke(topic, null, { ttlMs: 800, ackDeadlineMs: 20_000 }));
    assert.ok(err instanceof Rejected, String(err));
    assert.equal(err.type, "expired");
    assert.equal(err.reason, "expired");
    assert.equal(err.ending, "expired");
    assert.equal(err.retryable, false);
  });

  it("throws Rejected expired when the ttl runs out while the task waits for its handler's place", async () => {
    // The handler's one place is held: the second task, in hand (the agent pulls for both
    // its handlers' places), expires at its ttl, not when the place frees.
    const topic = unique("full");
    const release = new Gate();
    const running = new Gate();
    await serving(
      newAgent(unique("ts-full"))
        .handler(topic, { capacity: 1 }, async () => {
          running.open();
          await release.opened;
          return "held";
        })
        .handler(unique("other"), { capacity: 1 }, () => null),
    );
    const first = client.invoke(topic, null, { executeDeadlineMs: 20_000 });
    await running.opened;
    const err = await rejection(client.invoke(topic, null, { ttlMs: 800, ackDeadlineMs: 20_000 }));
    assert.ok(err instanceof Rejected, String(err));
    assert.equal(err.type, "expired");
    assert.equal(err.ending, "expired");
    release.open();
    assert.equal(await first, "held");
  });

  it("waits past the execute deadline, within the ttl, for the end; the end is heard again by id", async () => {
    const topic = unique("slow");
    let runs = 0;
    await serving(
      newAgent(unique("ts-slow")).handler(topic, { maxAttempts: 5 }, async (ctx) => {
        runs += 1;
        // Outlives every attempt's budget: the agent reports deadline_exceeded, the coordinator retries.
        await new Promise((resolve) => ctx.signal.addEventListener("abort", resolve));
      }),
    );
    // It used to give up at 500 ms + 1 s (DeadlineExceeded) while the retries went on.
    const first = await rejection(client.invoke(topic, null, { executeDeadlineMs: 500, ttlMs: 20_000 }));
    assert.ok(first instanceof TaskFailed && !(first instanceof Rejected), String(first));
    assert.equal(first.type, "deadline_exceeded");
    assert.equal(first.ending, "retries_exhausted");
    assert.equal(runs, 5);
    const again = await rejection(client.invoke(topic, null, { messageId: first.messageId }));
    assert.ok(again instanceof TaskFailed && !(again instanceof DeadlineExceeded), String(again));
    assert.equal(again.ending, "retries_exhausted");
    assert.equal(runs, 5);
  });

  it("keeps only genuine replies: a result from an agent the task was not routed to is dropped", async () => {
    const topic = unique("forged");
    const release = new Gate();
    const running = new Gate();
    await serving(
      newAgent(unique("ts-genuine")).handler(topic, async () => {
        running.open();
        await release.opened;
        return "genuine";
      }),
    );
    const intake = await watching(stack, `reach.task.${topic}.*`);
    const result = client.invoke(topic, null);
    const sent = await intake.next(() => true);
    await running.opened;
    const forged = { kind: "result", v: 1, message_id: sent.message_id, trace_id: sent.trace_id, topic, attempt: 1, result: "forged" };
    stack.nc.publish(`${sent.reply_to}.intruder`, JSON.stringify({ ...forged, from_agent: "intruder" }));
    stack.nc.publish(`${sent.reply_to}.intruder`, JSON.stringify({ ...forged, from_agent: "someone-else" }));
    await stack.nc.flush();
    release.open();
    assert.equal(await result, "genuine");
    intake.close();
  });

  it("rejects wrong arguments with InvalidArgument naming them, before anything is sent", async () => {
    const topic = unique("strict");
    const intake = await watching(stack, "reach.task.>");
    const cycle: Record<string, unknown> = {};
    cycle.self = cycle;
    const wrong: Array<[string, () => Promise<unknown>]> = [
      ["ttlMs", () => client.invoke(topic, null, { ttlMs: 0 })],
      ["ttlMs", () => client.publish(topic, null, { ttlMs: 86_400_001 })],
      ["topic", () => client.invoke("a.b", null)],
      ["messageId", () => client.invoke(topic, null, { messageId: "has space" })],
      ["priority", () => client.publish(topic, null, { priority: "P9" as "P0" })],
      ["ackDeadlineMs", () => client.invoke(topic, null, { ackDeadlineMs: -1 })],
      ["executeDeadlineMs", () => client.invoke(topic, null, { executeDeadlineMs: 1.5 })],
      ["headers", () => client.publish(topic, null, { headers: { n: 1 as unknown as string } })],
      ["payload", () => client.invoke(topic, { n: 10n })],
      ["payload", () => client.publish(topic, cycle)],
    ];
    for (const [argument, call] of wrong) {
      const err = await rejection(call());
      assert.ok(err instanceof InvalidArgument, `${argument}: ${String(err)}`);
      assert.equal(err.argument, argument);
      assert.match(err.message, argument === "payload" ? /^payload of/ : new RegExp(`^${argument}(=| must be a whole number of ms)`));
    }
    // The intake is watched: a valid publish is the first (and only) thing it sees.
    const { messageId } = await client.publish(topic, null);
    const first = await intake.next(() => true);
    assert.equal(first.message_id, messageId);
    assert.equal(intake.seen.length, 1);
    intake.close();
  });

  it("runs a request sent again under the same message id once, both calls getting its result; another topic's or another caller's gets duplicate_id", async () => {
    const topic = unique("once");
    const release = new Gate();
    const running = new Gate();
    let runs = 0;
    await serving(
      newAgent(unique("ts-once")).handler(topic, async (_ctx, p: { n: number }) => {
        runs += 1;
        running.open();
        await release.opened;
        return { n: p.n, runs };
      }),
    );
    const messageId = unique("order");
    const first = client.invoke(topic, { n: 1 }, { messageId });
    await running.opened;
    // Sent again while the first runs (a lost connection, a restarted caller): it attaches.
    const second = client.invoke(topic, { n: 2 }, { messageId });
    release.open();
    assert.deepEqual(await first, { n: 1, runs: 1 });
    assert.deepEqual(await second, { n: 1, runs: 1 });
    // And once more after the end: answered from the record, not run.
    assert.deepEqual(await client.invoke(topic, { n: 3 }, { messageId }), { n: 1, runs: 1 });
    assert.equal(runs, 1);
    const published = await client.publish(topic, { n: 4 }, { messageId });
    assert.equal(published.duplicate, true);
    // The id used for a request on another topic (an order id as two steps' ids): refused.
    const reused = await rejection(client.invoke(unique("ship"), { n: 1 }, { messageId }));
    assert.ok(reused instanceof Rejected, String(reused));
    assert.equal(reused.type, "duplicate_id");
    assert.match(reused.message, new RegExp(`which was sent on topic '${topic}', this one on 'ship`));
    // Another caller's request under that id hears nothing of it: duplicate_id.
    const other = await ReachClient.connect(stack.url, { logger: quiet, name: "other" });
    try {
      const err = await rejection(other.invoke(topic, { n: 5 }, { messageId }));
      assert.ok(err instanceof Rejected, String(err));
      assert.equal(err.type, "duplicate_id");
      assert.equal(err.reason, "duplicate_id");
    } finally {
      await other.close();
    }
    assert.equal(runs, 1);
  });

  it("refuses an invoke or a publish whose options hold a key nobody reads, before sending", async () => {
    const topic = unique("typo");
    const invoked = await rejection(client.invoke(topic, {}, { messageID: "order-9" } as never));
    assert.ok(invoked instanceof InvalidArgument, String(invoked));
    assert.match(invoked.message, /^invoke 'typo-\d+-\d+': unknown option 'messageID': did you mean 'messageId'\?/);
    // publish takes a budget and a reply address; invoke has deadlines of its own instead
    const published = await rejection(client.publish(topic, {}, { ackDeadlineMs: 5 } as never));
    assert.ok(published instanceof InvalidArgument, String(published));
    assert.match(published.message, /^task 'typo-\d+-\d+': unknown option 'ackDeadlineMs' \(known: priority, /);
  });

  it("refuses status, result, invokeTask, cancelWorkflow and signalWorkflow options nobody reads, naming the one meant", async () => {
    const id = newId();
    const refused = async (call: Promise<unknown>, message: RegExp) => {
      const err = await rejection(call);
      assert.ok(err instanceof InvalidArgument && err.argument === "options", String(err));
      assert.match(err.message, message);
    };
    await refused(client.status(id, { timeOut: 1 } as never), /^status\(\): unknown option 'timeOut': did you mean 'timeoutMs'\?/);
    // Read, `timeout` would have been ignored for the 30 s default; `timeoutMs: 1` ends it at once.
    await refused(client.result(id, { timeout: 60_000, timeoutMs: 1 } as never), /^result\(\): unknown option 'timeout': did you mean 'timeoutMs'\?/);
    await refused(client.invokeTask(client.task(unique("typo"), null), { onack: () => undefined } as never), /unknown option 'onack': did you mean 'onAck'\?/);
    await refused(client.cancelWorkflow(id, { reason: "typo" } as never), /^cancelWorkflow\(\): unknown option 'reason' \(known: why, waitMs\)$/);
    await refused(client.signalWorkflow(id, "go", { wait: 1 } as never), /^signalWorkflow\(\): unknown option 'wait': did you mean 'waitMs'\?/);
  });

  it("refuses a tls:// URL to a server that offers no TLS rather than go on in plain text", async () => {
    const url = stack.url.replace("nats://", "tls://");
    await assert.rejects(ReachClient.connect(url, { logger: quiet }), (err: unknown) => {
      assert.ok(err instanceof ConnectError, String(err));
      assert.match(String((err.cause as { code?: string })?.code ?? err.message), /SERVER_OPT_NA|tls/i);
      return true;
    });
  });

  it("throws NotAcknowledged while the agent is busy; invoking again with its message id hears the end", async () => {
    const topic = unique("queued");
    const release = new Gate();
    const running = new Gate();
    let runs = 0;
    await serving(
      newAgent(unique("ts-queued")).handler(topic, { capacity: 1 }, async (_ctx, p: string) => {
        runs += 1;
        running.open();
        await release.opened;
        return p;
      }),
    );
    const first = client.invoke(topic, "first");
    await running.opened;
    const err = await rejection(client.invoke(topic, "second", { ackDeadlineMs: 300, executeDeadlineMs: 20_000, ttlMs: 30_000 }));
    assert.ok(err instanceof NotAcknowledged, String(err));
    // Where it waits, said (it said only that no agent acknowledged in time).
    assert.match(err.message, /within 300 ms: it waits in the queue of 'ts-queued-[^']+' \(attempt 1\), which has not taken it: all its places are busy/);
    assert.match(err.message, /it stays queued and may still run within its ttl: invoke again with messageId '[^']+' to hear how it ends$/);
    release.open();
    assert.equal(await first, "first");
    assert.equal(await client.invoke(topic, "ignored", { messageId: err.messageId, executeDeadlineMs: 20_000 }), "second");
    assert.equal(runs, 2);
  });

  it("says NotAcknowledged past a ttl shorter than the ack deadline will not start, not that it may still run", async () => {
    const topic = unique("short-ttl");
    const release = new Gate();
    const running = new Gate();
    await serving(
      newAgent(unique("ts-short-ttl")).handler(topic, { capacity: 1 }, async () => {
        running.open();
        await release.opened;
        return null;
      }),
    );
    const first = client.invoke(topic, "first");
    await running.opened;
    try {
      const err = await rejection(client.invoke(topic, "second", { ackDeadlineMs: 1_500, ttlMs: 300 }));
      assert.ok(err instanceof NotAcknowledged, String(err));
      const hint = `its ttl (300 ms) has passed, so no agent will start it: invoke again with messageId '${err.messageId}' to hear how it ended`;
      assert.ok(err.message.endsWith(hint), err.message);
    } finally {
      release.open();
      await first;
    }
  });

  it("stops waiting when the signal is aborted (InvokeAborted), while the task goes on", async () => {
    const topic = unique("abort");
    const release = new Gate();
    await serving(
      newAgent(unique("ts-abort")).handler(topic, async (ctx) => {
        await ctx.progress("started");
        await release.opened;
        return "finished";
      }),
    );
    const controller = new AbortController();
    const err = await rejection(client.invoke(topic, null, { signal: controller.signal, onProgress: () => controller.abort("enough") }));
    assert.ok(err instanceof InvokeAborted, String(err));
    assert.equal(err.cause, "enough");
    release.open();
    assert.equal(await client.invoke(topic, null, { messageId: err.messageId }), "finished");
    const already = await rejection(client.invoke(topic, null, { signal: AbortSignal.abort() }));
    assert.ok(already instanceof InvokeAborted);
    assert.match(already.message, /did not send .*nothing runs/); // it said "the task goes on"
    assert.deepEqual(await client.status(already.messageId), []);
  });

  it("claim-checks a large payload into the Object Store and fetches a large result", async () => {
    const topic = unique("big");
    const big = "x".repeat(300_000);
    await serving(newAgent(unique("ts-big")).handler(topic, (_ctx, p: { text: string }) => ({ text: `${p.text}!` })));
    const intake = await watching(stack, `reach.task.${topic}.*`);
    const result = await client.invoke<{ text: string }>(topic, { text: big });
    assert.equal(result.text, `${big}!`);
    const sent = await intake.next(() => true);
    assert.equal(sent.payload, null);
    assert.equal(sent.payload_ref?.name, `${sent.message_id}/payload-${sent.payload_ref?.sha256.slice(0, 16)}`);
    intake.close();
  });

  it("publishes fire and forget: ids back, headers mirrored, a resend under the id a duplicate", async () => {
    const topic = unique("fire");
    const intake = await watching(stack, `reach.task.${topic}.*`);
    const published = await client.publish(topic, { a: 1 }, { priority: "P2", ttlMs: 5_000, replyTo: "reach.reply.client.mine" });
    assert.equal(published.traceId, published.messageId);
    assert.equal(published.duplicate, false);
    const sent = await intake.next(() => true);
    assert.equal(sent.message_id, published.messageId);
    assert.deepEqual(headersOf(intake.seen[0]!.msg), {
      "Nats-Msg-Id": published.messageId,
      "Reach-Trace-Id": published.messageId,
      "Reach-Priority": "P2",
      "Reach-TTL": "5000",
      "Reach-Kind": "task",
      "Reach-Reply-To": "reach.reply.client.mine",
    });
    const again = await client.publish(topic, { a: 2 }, { messageId: published.messageId });
    assert.equal(again.duplicate, true);
    const events = await client.status(published.messageId);
    assert.ok(events.every((e) => e.message_id === published.messageId));
    intake.close();
  });

  it("looks up a published message's result by its id, sending nothing: its failure thrown, one not ended said so", async () => {
    const topic = unique("lookup");
    const gate = new Gate();
    let runs = 0;
    await serving(
      newAgent(unique("ts-lookup")).handler(topic, async (_ctx, p: { mode: string }) => {
        runs += 1;
        if (p.mode === "refuse") throw new PermanentError("no such document");
        if (p.mode === "slow") await gate.opened;
        return { words: p.mode.length };
      }),
    );
    const done = await client.publish(topic, { mode: "four" });
    const failing = await client.publish(topic, { mode: "refuse" });
    const running = await client.publish(topic, { mode: "slow" });
    assert.deepEqual(await client.result(done.messageId), { words: 4 });
    assert.deepEqual(await client.result(done.messageId), { words: 4 }); // as often as asked
    const failed = await rejection(client.result(failing.messageId));
    assert.ok(failed instanceof TaskFailed && failed.error.message === "no such document", String(failed));
    const early = await rejection(client.result(running.messageId, { timeoutMs: 300 }));
    assert.ok(early instanceof DeadlineExceeded && early.message.includes("did not end within 300 ms"), String(early));
    gate.open();
    assert.deepEqual(await client.result(running.messageId), { words: 4 });
    const never = await rejection(client.result(unique("never-sent"), { timeoutMs: 300 }));
    assert.ok(never instanceof DeadlineExceeded && never.message.includes("has no recorded event"), String(never));
    const other = await ReachClient.connect(stack.url, { logger: quiet, name: "someone-else" });
    try {
      const theirs = await rejection(other.result(done.messageId, { timeoutMs: 1_000 }));
      assert.ok(theirs instanceof InvalidArgument && theirs.message.includes("another caller's message"), String(theirs));
    } finally {
      await other.close();
    }
    assert.equal(runs, 3); // nothing sent again
  });

  it("ends pending invokes with InvokeError on close, and refuses calls after it", async () => {
    const topic = unique("closing");
    const release = new Gate();
    const running = new Gate();
    await serving(
      newAgent(unique("ts-closing")).handler(topic, async () => {
        running.open();
        await release.opened;
      }),
    );
    const own = await ReachClient.connect(stack.url, { logger: quiet, name: "closer" });
    const pending = rejection(own.invoke(topic, null));
    await running.opened;
    await own.close();
    const err = await pending;
    assert.ok(err instanceof InvokeError && !(err instanceof TaskFailed), String(err));
    assert.match(err.message, /closed/);
    const after = await rejection(own.publish(topic, null));
    assert.ok(after instanceof ReachError);
    release.open();
  });
});

/** Until `check()` holds, looked at every 100 ms (for what has no event of its own), at most `ms`. */
async function until(check: () => boolean | Promise<boolean>, ms: number, what: string): Promise<void> {
  const by = performance.now() + ms;
  while (!(await check())) {
    if (performance.now() > by) assert.fail(`${what}: not within ${ms} ms`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

describe("sub-tasks from a handler", () => {
  let stack: Stack;

  before(async () => {
    stack = await startStack();
  });

  after(async () => {
    await stack?.stop();
  });

  it("ctx.invoke waits for a sub-task as the agent; a handler run again attaches to its sub-tasks, which run once", async () => {
    const plan = unique("plan");
    const research = unique("research");
    const runs: Record<string, number> = {};
    const seen: Task[] = [];
    const planner = newAgent(unique("planner")).handler(plan, { maxAttempts: 2 }, async (ctx) => {
      runs.plan = (runs.plan ?? 0) + 1;
      const found = await Promise.all([
        ctx.invoke<{ facts: number }>(research, { source: "web" }),
        ctx.invoke<{ facts: number }>(research, { source: "papers" }),
      ]);
      if (ctx.attempt === 1) throw new Error("crashed after asking");
      return { facts: found.reduce((sum, f) => sum + f.facts, 0) };
    });
    const researcher = newAgent(unique("researcher")).handler(research, { capacity: 4 }, (ctx, p) => {
      const source = (p as { source: string }).source;
      runs[source] = (runs[source] ?? 0) + 1;
      seen.push(ctx.envelope);
      return { facts: source.length };
    });
    await planner.start(stack.url);
    await researcher.start(stack.url);
    const client = await ReachClient.connect(stack.url, { logger: quiet });
    try {
      const result = await client.invoke(plan, {}, { priority: "P0", messageId: unique("plan-msg") });
      assert.deepEqual(result, { facts: 3 + 6 });
      assert.deepEqual(runs, { plan: 2, web: 1, papers: 1 });
      assert.deepEqual(new Set(seen.map((t) => t.priority)), new Set(["P0"]));
      assert.deepEqual(new Set(seen.map((t) => t.caller)), new Set([planner.agentId]));
    } finally {
      await client.close();
      await planner.stop();
      await researcher.stop();
    }
  });

  it("shares one AbortSignal among many calls without Node's MaxListenersExceededWarning", async () => {
    const topic = unique("shared-signal");
    const agent = newAgent(unique("shared")).handler(topic, { capacity: 16 }, (_ctx, p) => p);
    await agent.start(stack.url);
    const client = await ReachClient.connect(stack.url, { logger: quiet });
    const warnings: string[] = [];
    const onWarning = (w: Error) => void warnings.push(w.name);
    process.on("warning", onWarning);
    try {
      const signal = AbortSignal.timeout(30_000);
      const results = await Promise.all(Array.from({ length: 12 }, (_, n) => client.invoke(topic, { n }, { signal })));
      assert.equal(results.length, 12);
      await new Promise((resolve) => setImmediate(resolve)); // warnings are emitted on the next tick
      assert.deepEqual(warnings.filter((w) => w === "MaxListenersExceededWarning"), []);
    } finally {
      process.off("warning", onWarning);
      await client.close();
      await agent.stop();
    }
  });

  it("derives sub-task ids as the Python SDK does", () => {
    assert.equal(subTaskId("01a23cc1-9606-73c5-bdb2-bbc1070d3bb4", 1796315348000, "planner-1", "1"), "01a23cbc-fc20-7a84-bb7e-2ebf0316b02c");
    assert.equal(subTaskId("p-1", 0, "a", "web"), "00000000-0000-71ac-876a-5cd64ca64993");
  });
});

describe("ReachClient cancelling a workflow", () => {
  let stack: Stack;

  before(async () => {
    stack = await startStack();
  });

  after(async () => {
    await stack?.stop();
  });

  it("cancels a workflow it started and hears how it ended; another caller's, or none, is UnknownWorkflow", async () => {
    const held = new Gate();
    const started = new Gate();
    const agent = newAgent(unique("holder"));
    agent.handler("ts-hold", async () => {
      started.open();
      await held.opened;
      return {};
    });
    await agent.start(stack.url);
    const alice = await ReachClient.connect(stack.url, { name: "alice", logger: quiet });
    const bob = await ReachClient.connect(stack.url, { name: "bob", logger: quiet });
    try {
      const instance = unique("flow");
      const invoked = rejection(alice.invoke("ts-held", {}, { messageId: instance }));
      await started.opened;
      const notBobs = await rejection(bob.cancelWorkflow(instance));
      assert.ok(notBobs instanceof UnknownWorkflow, String(notBobs));
      assert.match(notBobs.message, new RegExp(`no workflow instance '${instance}' among bob's own messages`));
      const none = await rejection(alice.cancelWorkflow("nothing-1"));
      assert.ok(none instanceof UnknownWorkflow, String(none));

      const ended = await alice.cancelWorkflow(instance, { why: "changed my mind" });
      assert.deepEqual(ended, { instanceId: instance, status: "cancelled", atMs: ended.atMs, beforeCancel: false });
      const stopped = await invoked;
      assert.ok(stopped instanceof TaskFailed, String(stopped));
      assert.equal(stopped.message.includes("cancelled by its caller 'alice': changed my mind"), true, stopped.message);
      const again = await alice.cancelWorkflow(instance);
      assert.deepEqual(again, { ...ended, beforeCancel: true });
    } finally {
      held.open();
      await alice.close();
      await bob.close();
      await agent.stop();
    }
  });
});

describe("Connection.publish", () => {
  let stack: Stack;

  before(async () => {
    stack = await startStack();
  });

  after(async () => {
    await stack?.stop();
  });

  it("makes a write again whose earlier try is still being stored (10158), instead of throwing it", async () => {
    // Across an election nats-server answers "duplicate message id is in process" while an
    // earlier try of the same Nats-Msg-Id is being stored; a caller got it raw.
    const conn = await Connection.connect({ servers: stack.url }, new Names(), 5_000);
    const js = conn.js as { publish: (...args: unknown[]) => Promise<unknown> };
    const real = js.publish.bind(js);
    let tries = 0;
    js.publish = async (...args: unknown[]) => {
      tries += 1;
      if (tries === 1) throw Object.assign(new Error("duplicate message id is in process"), { code: "409", api_error: { code: 409, err_code: 10158, description: "duplicate message id is in process" } });
      return await real(...args);
    };
    try {
      const id = unique("in-process");
      const ack = await conn.publish(`reach.task.${unique("t")}`, new TextEncoder().encode("{}"), { "Nats-Msg-Id": id });
      assert.equal(tries, 2);
      assert.ok(ack.seq > 0);
      js.publish = async () => {
        // without a Nats-Msg-Id a write made again could be stored twice: thrown
        throw Object.assign(new Error("duplicate message id is in process"), { code: "409", api_error: { code: 409, err_code: 10158, description: "in process" } });
      };
      await assert.rejects(conn.publish(`reach.task.${unique("t")}`, new TextEncoder().encode("{}")), /in process/);
    } finally {
      await conn.close();
    }
  });
});

describe("ClaimCheck.get", () => {
  let stack: Stack;

  before(async () => {
    stack = await startStack();
  });

  after(async () => {
    await stack?.stop();
  });

  it("refuses a reference to another bucket than the claim checks' own, naming it", async () => {
    // A red team's payload_ref named the agents' KV bucket and was told "no longer stored".
    const checks = new ClaimCheck(stack.nc.jetstream(), "reach_payloads");
    const ref = { bucket: "KV_reach_agents", name: "good-1", size: 1, sha256: "0".repeat(64) };
    await assert.rejects(checks.get(ref), (err: Error) => {
      assert.ok(err instanceof PayloadUnavailable, String(err));
      assert.equal(err.message, "KV_reach_agents/good-1: claim checks are kept in the Object Store bucket reach_payloads, not KV_reach_agents");
      return true;
    });
  });
});

describe("ReachClient signalling a workflow", () => {
  let stack: Stack;

  before(async () => {
    stack = await startStack();
  });

  after(async () => {
    await stack?.stop();
  });

  it("signals a state machine it started and hears whether the event was taken; another caller's is UnknownWorkflow", async () => {
    const checked = new Gate();
    const agent = newAgent(unique("checker")).handler("ts-check", () => {
      checked.open();
      return "looks fine";
    });
    await agent.start(stack.url);
    const alice = await ReachClient.connect(stack.url, { name: "alice", logger: quiet });
    const bob = await ReachClient.connect(stack.url, { name: "bob", logger: quiet });
    try {
      const instance = unique("approval");
      const invoked = alice.invoke("ts-approval", {}, { messageId: instance });
      await checked.opened;
      const notBobs = await rejection(bob.signalWorkflow(instance, "approve"));
      assert.ok(notBobs instanceof UnknownWorkflow, String(notBobs));
      const badEvent = await rejection(alice.signalWorkflow(instance, "a.b"));
      assert.ok(badEvent instanceof InvalidArgument, String(badEvent));

      const ignored = await alice.signalWorkflow(instance, "nope");
      assert.deepEqual(ignored, { instanceId: instance, event: "nope", taken: false, state: "submitted", waitsFor: ["approve", "reject"], ended: null });
      const taken = await alice.signalWorkflow(instance, "approve");
      assert.deepEqual(taken, { instanceId: instance, event: "approve", taken: true, state: "submitted", waitsFor: [], ended: null });
      assert.deepEqual(await invoked, { ok: true });
      const after = await alice.signalWorkflow(instance, "reject");
      assert.equal(after.ended, "completed");
    } finally {
      await alice.close();
      await bob.close();
      await agent.stop();
    }
  });

  it("hears that its signal and cancel were not acted on over its quota; an operator's signal is not charged", async () => {
    const checked = new Gate();
    const agent = newAgent(unique("checker")).handler("ts-check", () => {
      checked.open();
      return "looks fine";
    });
    await agent.start(stack.url);
    const carol = await ReachClient.connect(stack.url, { name: "ts-carol", logger: quiet }); // 2 tokens, 1 per 20 s
    try {
      const instance = unique("approval");
      const invoked = carol.invoke("ts-approval", {}, { messageId: instance });
      await checked.opened;
      assert.equal((await carol.signalWorkflow(instance, "nope")).taken, false); // the second token
      const signalRefused = await rejection(carol.signalWorkflow(instance, "approve"));
      const cancelRefused = await rejection(carol.cancelWorkflow(instance));
      for (const [err, what] of [[signalRefused, "signal approve"], [cancelRefused, "cancel"]] as const) {
        assert.ok(err instanceof WorkflowActionRefused, String(err));
        assert.deepEqual([err.error.type, err.error.retryable, err.instanceId], ["rate_limited", true, instance]);
        assert.ok((err.error.retry_after_ms ?? 0) > 0, String(err.error.retry_after_ms));
        assert.ok(err.message.startsWith(`workflow '${instance}': ${what} not acted on: caller 'ts-carol' is over its quota`), err.message);
      }
      const bare = headers();
      bare.set("Reach-Kind", "signal");
      await stack.nc.jetstream().publish(`reach.wf.signal.${instance}.approve`, new Uint8Array(), { headers: bare });
      assert.deepEqual(await invoked, { ok: true }); // neither refusal acted; the operator's did
    } finally {
      await carol.close();
      await agent.stop();
    }
  });

  it("hears each signal a state takes, not an earlier one's answer (the second was dropped, or read the first's)", async () => {
    const alice = await ReachClient.connect(stack.url, { name: "alice", logger: quiet });
    try {
      const instance = unique("steps");
      const invoked = alice.invoke("ts-steps", {}, { messageId: instance });
      const first = await alice.signalWorkflow(instance, "go");
      const second = await alice.signalWorkflow(instance, "go");
      assert.deepEqual([first.taken, first.state, second.taken, second.state], [true, "first", true, "second"]);
      assert.deepEqual(await invoked, { went: 2 });
      // The instance's id used for a task of another topic: refused, not answered with its result.
      const reused = await rejection(alice.invoke(unique("ship"), {}, { messageId: instance }));
      assert.ok(reused instanceof Rejected && reused.type === "duplicate_id", String(reused));
      assert.match(reused.message, /which was sent on topic 'ts-steps', this one on 'ship/);
    } finally {
      await alice.close();
    }
  });

  it("hears that the instance failed when its signal outgrew the record (it heard DeadlineExceeded, as if it might still be taken)", async () => {
    // 250 KB outputs, each copied into the next state's input, with a 100 KB start input:
    // the third state's input does not fit in the record (1 MB at most).
    const agent = newAgent(unique("bulky")).handler("ts-bulk", () => ({ blob: "x".repeat(250_000) }));
    await agent.start(stack.url);
    const alice = await ReachClient.connect(stack.url, { name: "alice", logger: quiet });
    try {
      const instance = unique("growing");
      const failed = rejection(alice.invoke("ts-growing", { pad: "y".repeat(100_000) }, { messageId: instance }));
      await untilStateDone(stack, instance, "a");
      assert.equal((await alice.signalWorkflow(instance, "go")).taken, true);
      await untilStateDone(stack, instance, "b");
      const outgrown = await alice.signalWorkflow(instance, "go");
      assert.deepEqual(outgrown, { instanceId: instance, event: "go", taken: false, state: null, waitsFor: [], ended: "failed" });
      const error = await failed;
      assert.ok(error instanceof TaskFailed && error.error.type === "record_too_large", String(error));
    } finally {
      await alice.close();
      await agent.stop();
    }
  });
});

/** Until the instance's record (read from its bucket) is in `state`, that state's step completed. */
async function untilStateDone(stack: Stack, instance: string, state: string): Promise<void> {
  const records = await stack.nc.jetstream().views.kv("reach_workflows");
  for (let tries = 0; tries < 200; tries++) {
    const entry = await records.get(instance);
    const record = entry?.value.length ? (entry.json() as { current?: string; steps?: Record<string, { status: string }> }) : null;
    if (record?.current === state && record.steps?.[state]?.status === "completed") return;
    await sleep(50); // the record's write is the coordinator's: no event for it
  }
  throw new Error(`${instance}: state ${state} not completed within 10 s`);
}

describe("ReachClient across a server restart", () => {
  let stack: RestartableStack;
  let relay: Relay;
  const agents: Agent[] = [];

  before(async () => {
    stack = await startStack();
    relay = await Relay.to(stack.port);
  });

  after(async () => {
    await Promise.allSettled(agents.map((a) => a.stop()));
    await relay?.shut();
    await stack?.stop();
  });

  it("sends a task through a server away for longer than a request's timeout: written again, not a bare NatsError", async () => {
    const topic = unique("patient");
    const agent = newAgent(unique("ts-patient")).handler(topic, (_ctx, p: { n: number }) => ({ n: p.n }));
    agents.push(agent);
    await agent.start(stack.url);
    const client = await ReachClient.connect(relay.url, { logger: quiet, name: "patient", requestTimeoutMs: 500 });
    try {
      await relay.shut();
      const invokes = [0, 1, 2].map((n) => client.invoke(topic, { n }, { ackDeadlineMs: 20_000 }));
      await sleep(1_500); // the outage: three request timeouts long
      await relay.open();
      const results = (await Promise.all(invokes)) as Array<{ n: number }>;
      assert.deepEqual(results.map((r) => r.n).sort(), [0, 1, 2]);
    } finally {
      await client.close();
    }
  });

  it("sends a task through an outage past the election budget (15 s) while its ack deadline lasts (a lost majority: NotStored at 15 s)", async () => {
    const topic = unique("stored-late");
    let runs = 0;
    const agent = newAgent(unique("ts-stored-late")).handler(topic, (_ctx, p: { n: number }) => ((runs += 1), { n: p.n }));
    agents.push(agent);
    await agent.start(stack.url);
    const client = await ReachClient.connect(relay.url, { logger: quiet, name: "stored-late", requestTimeoutMs: 500 });
    try {
      await relay.shut();
      const invoked = client.invoke(topic, { n: 1 }, { ackDeadlineMs: 30_000 });
      await sleep(16_000); // the outage: past the election budget
      await relay.open();
      assert.deepEqual(await invoked, { n: 1 });
      assert.equal(runs, 1);
    } finally {
      await client.close();
    }
  });

  it("makes a write in flight as the connection breaks again once back, not after its timeout (a rolling restart's 5 s)", async () => {
    const conn = await Connection.connect({ servers: relay.url, reconnectTimeWait: 200 }, new Names(), 20_000);
    try {
      const subject = `reach.task.${unique("in-flight")}`;
      await stack.pauseServer(1_500); // takes the write, answers nothing
      const writing = conn.publish(subject, new TextEncoder().encode("{}"), { "Nats-Msg-Id": unique("in-flight") });
      await sleep(200); // the write leaves the process (no event says so)
      await relay.shut(); // its ack can only go to the connection that broke
      await relay.open();
      const cutAt = performance.now();
      const ack = await writing;
      assert.ok(performance.now() - cutAt < 10_000, "waited out the 20 s timeout");
      assert.ok(ack.seq > 0 && !ack.duplicate, "its own first copy was taken for an earlier message");
    } finally {
      await conn.close();
    }
  });

  it("waits in result() through a server away for longer than a request's timeout, until its own timeout", async () => {
    const topic = unique("looked-up");
    const release = new Gate();
    let calls = 0;
    const agent = newAgent(unique("ts-looked-up")).handler(topic, async (_ctx, p: { n: number }) => {
      calls += 1;
      await release.opened;
      return { n: p.n };
    });
    agents.push(agent);
    await agent.start(stack.url);
    const client = await ReachClient.connect(relay.url, { logger: quiet, name: "looking", requestTimeoutMs: 500 });
    try {
      const sent = await client.publish(topic, { n: 7 });
      await until(() => calls === 1, 20_000, "the task running");
      const waiting = client.result(sent.messageId, { timeoutMs: 30_000 });
      await relay.shut();
      await sleep(1_500); // the outage: three request timeouts long
      await relay.open();
      release.open();
      assert.deepEqual(await waiting, { n: 7 });
      assert.equal(calls, 1);
    } finally {
      await client.close();
    }
  });

  it("returns results sent while the caller was away within seconds of its return, not at the ttl or the ack deadline", async () => {
    const topic = unique("slow");
    const release = new Gate();
    const running = new Set<string>();
    let calls = 0;
    const agent = newAgent(unique("ts-slowpoke")).handler(topic, { capacity: 5 }, async (ctx, p: { n: number }) => {
      calls += 1;
      running.add(ctx.messageId);
      await release.opened;
      return { n: p.n };
    });
    agents.push(agent);
    await agent.start(stack.url);
    const client = await ReachClient.connect(relay.url, { logger: quiet, name: "away" });
    const direct = await ReachClient.connect(stack.url, { logger: quiet, name: "away" });
    try {
      const acked = new Set<number>();
      const options = { ackDeadlineMs: 30_000, executeDeadlineMs: 60_000, ttlMs: 120_000 };
      const invokes = [0, 1, 2, 3].map((n) => client.invoke(topic, { n }, { ...options, onAck: () => void acked.add(n) }));
      await until(() => acked.size === 4 && running.size === 4, 30_000, "four invokes acknowledged and running");
      await relay.shut(); // the caller is away from here until the results are sent
      await stack.restartServer();
      release.open();
      const completed = async (id: string) => (await direct.status(id).catch(() => [])).some((e) => e.event === "completed");
      await until(async () => (await Promise.all([...running].map(completed))).every(Boolean), 60_000, "every task completed");
      await relay.open();
      const back = performance.now();
      const results = (await Promise.all(invokes)) as Array<{ n: number }>;
      const waitedMs = performance.now() - back;
      assert.deepEqual(results.map((r) => r.n).sort(), [0, 1, 2, 3]);
      assert.ok(waitedMs < 8_000, `returned ${Math.round(waitedMs)} ms after the caller could reconnect`);
      assert.equal(calls, 4);
    } finally {
      await client.close();
      await direct.close();
    }
  });
});

describe("ReachClient on a secured server", () => {
  let stack: SecuredStack;
  const agents: Agent[] = [];

  before(async () => {
    stack = await startSecuredStack();
  });

  after(async () => {
    await Promise.allSettled(agents.map((a) => a.stop()));
    await stack?.stop();
  });

  it("calls as the user of its creds: own subjects and inbox, results and typed failures", async () => {
    const topic = unique("secure");
    const agentId = unique("ts-secure");
    const agent = newAgent(agentId, await stack.creds("agent", agentId)).handler(topic, (_ctx, p: { fail?: boolean }) => {
      if (p.fail) throw new PermanentError("refused");
      return { ok: true };
    });
    agents.push(agent);
    await agent.start(stack.url);
    const intake = await watching(stack, `reach.task.${topic}.*`);
    const client = await ReachClient.connect(stack.url, { logger: quiet, creds: await stack.creds("caller", "billing") });
    try {
      assert.equal(client.caller, "billing");
      assert.deepEqual(await client.invoke(topic, {}), { ok: true });
      await intake.next(() => true);
      assert.equal(intake.seen[0]!.subject, `reach.task.${topic}.billing`);
      const err = await rejection(client.invoke(topic, { fail: true }));
      assert.ok(err instanceof TaskFailed, String(err));
      assert.equal(err.type, "PermanentError");
      assert.equal(err.ending, "rejected");
      const events = await client.status(err.messageId);
      assert.ok(events.some((e) => e.event === "dead_lettered"), JSON.stringify(events.map((e) => e.event)));
    } finally {
      await client.close();
      intake.close();
    }
  });
  it("answers from no record without headers: a direct get's bare copy of someone's done record", async () => {
    // An agent copied {state: done, result: FORGED} onto another agent's record key with a
    // direct get asking for no headers (no_hdr): that agent answered with it, its handler idle.
    const topic = unique("bare");
    const agentId = unique("ts-bare");
    let runs = 0;
    const agent = newAgent(agentId, await stack.creds("agent", agentId)).handler(topic, (_ctx, p) => {
      runs += 1;
      return p;
    });
    agents.push(agent);
    await agent.start(stack.url);
    const client = await ReachClient.connect(stack.url, { logger: quiet, creds: await stack.creds("caller", "payer") });
    try {
      const forged = { v: 1, message_id: "bare-1", state: "done", agent_id: agentId, result: "FORGED" };
      await stack.nc.jetstream().publish(`$KV.reach_executions.payer.bare-1.${agentId}`, JSON.stringify(forged));
      assert.deepEqual(await client.invoke(topic, { n: 1 }, { messageId: "bare-1" }), { n: 1 });
      assert.equal(runs, 1);
    } finally {
      await client.close();
    }
  });
});

describe("ReachClient when the server does not take the task", () => {
  let server: ChildProcess;
  let url: string;
  let dir: string;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "reach-ts-refused-"));
    const port = await freePort();
    url = `nats://127.0.0.1:${port}`;
    server = await startServer(port, join(dir, "js"));
  });

  after(async () => {
    await terminate(server);
    rmSync(dir, { recursive: true, force: true });
  });

  it("raises NotProvisioned on a server with no task stream; past the caller's backlog waits for room, then BacklogFull", async () => {
    const client = await ReachClient.connect(url, { name: "refused-caller", logger: quiet });
    try {
      const unsent = await rejection(client.publish("summarize", { n: 1 }, { messageId: "unsent-1" }));
      assert.ok(unsent instanceof NotProvisioned && unsent instanceof InvokeError, String(unsent));
      assert.equal(unsent.messageId, "unsent-1");
      assert.match(unsent.message, /'summarize' was not sent.*reach provision/);
      // A task intake that keeps one task per caller and topic, as `limits.tasks_per_subject: 1`.
      const nc = await connect({ servers: url });
      const jsm = await nc.jetstreamManager();
      await jsm.streams.add({
        name: "REACH_TASKS",
        subjects: ["reach.task.>"],
        max_msgs_per_subject: 1,
        discard: DiscardPolicy.New,
        discard_new_per_subject: true,
      });
      await client.publish("summarize", { n: 1 });
      const full = await rejection(client.invoke("summarize", { n: 2 }, { messageId: "one-too-many", ttlMs: 300 }));
      assert.ok(full instanceof BacklogFull && full instanceof InvokeError, String(full));
      assert.equal(full.messageId, "one-too-many");
      assert.match(full.message, /'summarize' was not sent: .*'refused-caller'.*tasks_per_subject.*ttl of 300 ms/);
      // Room comes (the one task is taken): a publish that waited for it goes through.
      let sent = false;
      const waiting = client.publish("summarize", { n: 3 }).then(() => (sent = true));
      await new Promise((resolve) => setTimeout(resolve, 300));
      assert.equal(sent, false);
      const stored = await jsm.streams.getMessage("REACH_TASKS", { last_by_subj: "reach.task.summarize.refused-caller" });
      await jsm.streams.deleteMessage("REACH_TASKS", stored.seq);
      await waiting;
      // The whole intake full (its byte limit: no coordinator takes tasks): said so, not the
      // caller's own backlog (the server gives both the same err_code).
      await jsm.streams.purge("REACH_TASKS");
      await jsm.streams.update("REACH_TASKS", { max_msgs_per_subject: -1, discard_new_per_subject: false, max_bytes: 2_048 });
      let intakeFull: unknown = null;
      for (let n = 0; n < 20 && intakeFull === null; n++) {
        await client.publish(`topic${n}`, { text: "x".repeat(300) }, { ttlMs: 300 }).catch((err: unknown) => (intakeFull = err));
      }
      assert.ok(intakeFull instanceof BacklogFull, String(intakeFull));
      assert.match(intakeFull.message, /was not sent: the intake was full \(maximum bytes exceeded; limits\.tasks_bytes\)/);
      await nc.close();
    } finally {
      await client.close();
    }
  });
});

describe("ReachClient with no server", () => {
  it("throws ConnectError naming the server when nothing listens there", async () => {
    const url = `nats://127.0.0.1:${await freePort()}`; // free: nothing listens on it
    await assert.rejects(ReachClient.connect(url), (err: unknown) => {
      assert.ok(err instanceof ConnectError && err instanceof ReachError, String(err));
      assert.match(err.message, new RegExp(`^cannot connect to NATS at ${url}: `));
      assert.ok(err.cause !== undefined);
      return true;
    });
  });
});

describe("ReachClient with no coordinator", () => {
  let server: ChildProcess;
  let url: string;
  let dir: string;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), "reach-ts-alone-"));
    const port = await freePort();
    url = `nats://127.0.0.1:${port}`;
    server = await startServer(port, join(dir, "js"));
    await provision(url);
  });

  after(async () => {
    await terminate(server);
    rmSync(dir, { recursive: true, force: true });
  });

  it("says no coordinator is running only when none answers for 3 s: one back a second late is not called gone", async () => {
    const client = await ReachClient.connect(url, { logger: quiet });
    const nc = await connect({ servers: url });
    try {
      const alone = await rejection(client.invoke("nobody", {}, { ackDeadlineMs: 300 }));
      assert.ok(alone instanceof NotAcknowledged, String(alone));
      assert.match(alone.message, /within 300 ms: no coordinator is running \(none answered for 3 s; start one.*\); it stays queued and may still run/);
      // A coordinator back (reconnected after a server restart) a second after the deadline.
      let answering: Subscription | undefined;
      const late = setTimeout(() => (answering = nc.subscribe("reach.ctl.status", { callback: (_, msg) => msg.respond("{}") })), 1_300);
      const back = await rejection(client.invoke("nobody", {}, { ackDeadlineMs: 300 }));
      clearTimeout(late);
      answering?.unsubscribe();
      assert.ok(back instanceof NotAcknowledged, String(back));
      assert.equal(
        back.message,
        `no agent acknowledged 'nobody' within 300 ms: not routed yet: no agent serving it may take work now (\`reach agents\` says which), or tasks stored before it wait first; it stays queued and may still run within its ttl: invoke again with messageId '${back.messageId}' to hear how it ends`,
      );
      // A coordinator stopped (SIGSTOP) or overloaded listens and answers nothing: not the agents' fault.
      const silent = nc.subscribe("reach.ctl.status", { callback: () => undefined });
      const stopped = await rejection(client.invoke("nobody", {}, { ackDeadlineMs: 300 }));
      silent.unsubscribe();
      assert.ok(stopped instanceof NotAcknowledged, String(stopped));
      assert.match(stopped.message, /within 300 ms: not routed yet: no coordinator answered whether it runs within 0\.5 s \(one may be stopped, overloaded or cut off\)/);
      const unreadable = await rejection(client.status("nobody-1"));
      // A ReachError saying why (a raw NatsError 503 before).
      assert.ok(unreadable instanceof ReachError, String(unreadable));
      assert.match(unreadable.message, /cannot read the events of 'nobody-1': no coordinator is running/);
    } finally {
      await nc.close();
      await client.close();
    }
  });
});
