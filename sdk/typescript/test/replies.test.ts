/** What a caller reads back: replies in its box, and how a message's recorded events end it. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { endingOf } from "../src/endings.js";
import { DeadlineExceeded, Rejected, TaskFailed } from "../src/errors.js";
import type { Connection } from "../src/connection.js";
import type { Traces } from "../src/endings.js";
import { Ending, outcomeOf, waitForResult } from "../src/invocation.js";
import { ReplyBox, decodeReply } from "../src/replybox.js";
import type { ErrorReply, Event, Task } from "../src/index.js";

const enc = (value: unknown) => new TextEncoder().encode(typeof value === "string" ? value : JSON.stringify(value));
const quiet = { debug() {}, info() {}, warn() {}, error() {} };
const about = { v: 1, message_id: "m-1", trace_id: "t-1", topic: "echo" };

function event(name: string, detail: Record<string, unknown>): Event {
  return { kind: "event", ...about, event: name, detail } as unknown as Event;
}

describe("decodeReply", () => {
  it("fills in the defaults of an error reply, and keeps its reason", () => {
    const reply = decodeReply(enc({ kind: "error", ...about, error: { type: "no_route", message: "nobody" }, reason: "no_route", extra: 1 }));
    assert.deepEqual(reply, {
      kind: "error",
      ...about,
      from_agent: null,
      to_agent: null,
      attempt: 1,
      created_at: 0,
      error: { type: "no_route", message: "nobody", retryable: true, retry_after_ms: null },
      reason: "no_route",
      ran: null,
      attempts: null,
    });
    const exhausted = { kind: "error", ...about, attempt: 3, error: { type: "E", message: "m" }, attempts: 2 };
    assert.equal((decodeReply(enc(exhausted)) as ErrorReply).attempts, 2); // one attempt moved unrun
  });

  it("refuses what is no reply: not JSON, an unknown kind, an error without its type", () => {
    assert.equal(decodeReply(enc("{not json")), null);
    assert.equal(decodeReply(enc({ kind: "task", ...about })), null);
    assert.equal(decodeReply(enc({ kind: "error", ...about, error: { message: "?" } })), null);
    assert.equal(decodeReply(enc({ kind: "result", ...about, result_ref: { bucket: "b" } })), null);
  });
});

describe("ReplyBox", () => {
  it("counts an agent's reply once the routed notice names it; drops another sender's and another message's", async () => {
    const box = new ReplyBox("reach.reply.client.b", "m-1", quiet);
    const result = { kind: "result", ...about, from_agent: "a-1", attempt: 1, result: "ok" };
    box.collect("reach.reply.client.b.a-1", enc({ kind: "ack", ...about, from_agent: "a-1", attempt: 1 })); // before its notice
    box.collect("reach.reply.client.b.a-2", enc({ ...result, from_agent: "a-2", result: "not routed to a-2" }));
    box.collect("reach.reply.client.b.a-2", enc({ ...result, result: "claims to be a-1" }));
    box.collect("reach.reply.client.b.a-1", enc({ ...result, message_id: "m-2", result: "another message" }));
    assert.equal(await box.next(performance.now()), "timeout"); // nothing counts yet
    box.collect("reach.reply.client.b._coordinator", enc({ kind: "routed", ...about, attempt: 1, agent_id: "a-1" }));
    box.collect("reach.reply.client.b.a-1", enc(result));
    const first = await box.next(performance.now() + 1_000);
    const second = await box.next(performance.now() + 1_000);
    assert.equal(typeof first === "object" && first.kind, "ack");
    assert.equal(typeof second === "object" && second.kind === "result" && second.result, "ok");
    assert.equal(await box.next(performance.now()), "timeout");
  });

  it("ends a wait when the client closes or the signal is aborted", async () => {
    const box = new ReplyBox("reach.reply.client.b", "m-1", quiet);
    const controller = new AbortController();
    const waiting = box.next(performance.now() + 60_000, controller.signal);
    controller.abort();
    assert.equal(await waiting, "aborted");
    const closing = box.next(performance.now() + 60_000);
    box.close();
    assert.equal(await closing, "closed");
  });
});

describe("endingOf", () => {
  it("ends with the first ending event: a result, or the error with how the message ended", () => {
    const ref = { bucket: "reach_payloads", name: "m-1/1/result", size: 3, sha256: "ab" };
    const error = { type: "Error", message: "boom", retryable: true, retry_after_ms: null };
    assert.equal(endingOf([event("routed", {}), event("accepted", {})]), null);
    assert.deepEqual(endingOf([event("completed", { result: null, result_ref: ref }), event("dead_lettered", { error })]), {
      kind: "result",
      result: null,
      resultRef: ref,
    });
    assert.deepEqual(endingOf([event("failed", { error }), event("dead_lettered", { reason: "retries_exhausted", error, attempts: 2 })]), {
      kind: "error",
      error,
      reason: "retries_exhausted",
      ran: null,
      attempt: null, // the attempt it ended at: these events carry none
      attempts: 2, // those that ran, as the dead letter says
    });
    const quota = { ...error, type: "rate_limited", retry_after_ms: 500 };
    assert.deepEqual(endingOf([event("rejected", { error: quota })]), { kind: "error", error: quota, reason: "refused", ran: null, attempt: null, attempts: null });
    assert.deepEqual(endingOf([event("workflow_cancelled", { error: { ...error, type: "cancelled" } })])?.kind, "error");
  });

  it("makes an error of an ending that has none, from its reason", () => {
    assert.deepEqual(endingOf([event("dead_lettered", { reason: "poison" })]), {
      kind: "error",
      error: { type: "poison", message: "the message ended as poison", retryable: false, retry_after_ms: null },
      reason: "poison",
      ran: null,
      attempt: null,
      attempts: null,
    });
  });

  it("keeps what a workflow's ending says of its steps, which decides Rejected or TaskFailed", () => {
    const expired = { type: "expired", message: "the ttl passed", retryable: false, retry_after_ms: null };
    const ids = { messageId: "m-1", traceId: "t-1" };
    const ran = endingOf([event("workflow_started", {}), event("dead_lettered", { reason: "expired", error: expired, ran: true })]);
    assert.equal(ran?.kind === "error" && ran.ran, true);
    // A step ran though no agent accepted the workflow itself: TaskFailed, not Rejected.
    assert.throws(() => outcomeOf(ran!, ids, false), (err: Error) => err instanceof TaskFailed && !(err instanceof Rejected));
    const none = endingOf([event("dead_lettered", { reason: "expired", error: expired, ran: false })]);
    assert.throws(() => outcomeOf(none!, ids, true), Rejected);
    const reply = decodeReply(enc({ kind: "error", ...about, error: expired, reason: "expired", ran: true }));
    assert.equal(reply?.kind === "error" && reply.ran, true);
  });
});

describe("waitForResult", () => {
  for (const acked of [true, false]) {
    it(`reads the end within seconds of a reconnect mid-wait, not at the ${acked ? "ttl" : "ack deadline"}: its result reply was lost`, async () => {
      const conn = { reconnects: 0 };
      const slow = { ...about, message_id: "m-1", ttl_ms: 120_000, budget: { ack_ms: 30_000, execute_ms: 60_000 } } as unknown as Task;
      const done = [event("accepted", {}), event("completed", { result: { n: 8 } })];
      const traces = { of: async () => (conn.reconnects > 0 ? done : []) } as unknown as Traces;
      const box = new ReplyBox("reach.reply.client.b", "m-1", quiet);
      const ending = new Ending(conn as unknown as Connection, traces, "m-1");
      box.collect("reach.reply.client.b._coordinator", enc({ kind: "routed", ...about, attempt: 1, agent_id: "a-1" }));
      if (acked) box.collect("reach.reply.client.b.a-1", enc({ kind: "ack", ...about, from_agent: "a-1", attempt: 1 }));
      setTimeout(() => (conn.reconnects = 1), 300); // the server came back
      const started = performance.now();
      const outcome = await waitForResult(slow, box, ending, { signal: AbortSignal.timeout(10_000) });
      assert.deepEqual(outcome, [{ n: 8 }, null]);
      assert.ok(performance.now() - started < 2_500, `took ${Math.round(performance.now() - started)} ms`);
    });
  }

  it("ends near its deadline when the events cannot be read (the server away), and says so", async () => {
    // Each read waited 5 s: a wait whose deadline was 9 s ended at 15 s (a trial).
    const task = { ...about, ttl_ms: 1_000, budget: { ack_ms: 500, execute_ms: 800 } } as unknown as Task;
    const away = () => new Promise<Event[]>((_, reject) => setTimeout(() => reject(new Error("TIMEOUT")), 5_000));
    const traces = { of: away } as unknown as Traces;
    const box = new ReplyBox("reach.reply.client.d", "m-1", quiet);
    const ending = new Ending({ reconnects: 1 } as unknown as Connection, traces, "m-1");
    (ending as unknown as { reconnectsAtStart: number }).reconnectsAtStart = 0; // it broke: read every second
    box.collect("reach.reply.client.d._coordinator", enc({ kind: "routed", ...about, attempt: 1, agent_id: "a-1" }));
    box.collect("reach.reply.client.d.a-1", enc({ kind: "ack", ...about, from_agent: "a-1", attempt: 1 }));
    const started = performance.now();
    await assert.rejects(waitForResult(task, box, ending, { signal: AbortSignal.timeout(20_000) }), (err: unknown) => {
      assert.ok(err instanceof DeadlineExceeded && err.message.includes("its events could not be read"), String(err));
      return true;
    });
    const took = performance.now() - started;
    assert.ok(took < 4_500, `took ${Math.round(took)} ms`); // the deadline, the verdict's grace, a last read
  });

  it("waits for a retry accepted late in the ttl its whole budget, and hears the verdict after it", async () => {
    // It counted only from the first ack and gave up (DeadlineExceeded) before the verdict.
    const late = { ...about, ttl_ms: 1_300, budget: { ack_ms: 1_000, execute_ms: 1_200 } } as unknown as Task;
    const traces = { of: async () => [] } as unknown as Traces;
    const box = new ReplyBox("reach.reply.client.c", "m-1", quiet);
    const ending = new Ending({ reconnects: 0 } as unknown as Connection, traces, "m-1");
    const acked = (attempt: number) => {
      box.collect("reach.reply.client.c._coordinator", enc({ kind: "routed", ...about, attempt, agent_id: "a-1" }));
      box.collect("reach.reply.client.c.a-1", enc({ kind: "ack", ...about, from_agent: "a-1", attempt }));
    };
    acked(1);
    setTimeout(() => acked(2), 1_200); // the retry, before the ttl ends
    const expired = { type: "expired", message: "its ttl runs out before attempt 3" };
    const verdict = { kind: "error", ...about, attempt: 2, error: expired, reason: "expired", ran: true };
    setTimeout(() => box.collect("reach.reply.client.c._coordinator", enc(verdict)), 2_450);
    const waited = waitForResult(late, box, ending, { signal: AbortSignal.timeout(10_000) });
    await assert.rejects(waited, (err: unknown) => err instanceof TaskFailed && err.ending === "expired" && err.attempt === 2);
  });
});
