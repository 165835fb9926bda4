/** Decoding tasks as strictly as the coordinator does, ids, and how failures are reported. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { errorInfo } from "../src/failures.js";
import { decodeTask, DecodeError, newId, NotAcknowledged, TaskFailed } from "../src/index.js";
import { RAW_KEPT, reportedRaw } from "../src/lifecycle.js";

const enc = (value: unknown) => new TextEncoder().encode(typeof value === "string" ? value : JSON.stringify(value));
const minimal = { v: 1, message_id: "m-1", trace_id: "t-1", topic: "echo" };

describe("decodeTask", () => {
  it("fills in the defaults of a minimal envelope", () => {
    const task = decodeTask(enc(minimal));
    assert.equal(task.kind, "task");
    assert.equal(task.attempt, 1);
    assert.equal(task.ttl_ms, 30_000);
    assert.equal(task.priority, "P1");
    assert.deepEqual(task.budget, { seek_ms: 1_000, ack_ms: 2_000, execute_ms: 30_000 });
    assert.equal(task.reply_to, null);
    assert.deepEqual(task.headers, {});
    assert.equal(task.received_ms, 0);
    assert.equal(task.traceparent, null);
    assert.equal(task.payload_ref, null);
  });

  it("reads a claim check and a traceparent", () => {
    const ref = { bucket: "reach_payloads", name: "m-1/payload", size: 3, sha256: "ab" };
    const traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    const task = decodeTask(enc({ ...minimal, payload_ref: ref, traceparent, received_ms: 5 }));
    assert.deepEqual(task.payload_ref, ref);
    assert.equal(task.traceparent, traceparent);
    assert.equal(task.received_ms, 5);
  });

  it("ignores unknown fields", () => {
    const task = decodeTask(enc({ ...minimal, kind: "task", shiny_new_field: [1, 2] }));
    assert.equal("shiny_new_field" in task, false);
  });

  const bad: Array<[string, unknown, RegExp]> = [
    ["malformed JSON", "not json", /JSON is malformed.* - at `\$`/],
    ["not an object", [1], /Expected `object`, got `array` - at `\$`/],
    ["an unsupported version", { ...minimal, v: 2 }, /^envelope version 2 is not spoken here: this is protocol v1, whose envelopes carry "v": 1 - at `\$.v`$/],
    ["a missing field", { v: 1, trace_id: "t", topic: "x" }, /missing required field `message_id`/],
    ["a dotted id", { ...minimal, message_id: "a.b" }, /matching regex .* - at `\$.message_id`/],
    ["another kind", { ...minimal, kind: "ack" }, /at `\$.kind`/],
    ["attempt 0", { ...minimal, attempt: 0 }, /Expected `int` >= 1 - at `\$.attempt`/],
    ["a zero budget", { ...minimal, budget: { ack_ms: 0 } }, /at `\$.budget.ack_ms`/],
    ["a bad priority", { ...minimal, priority: "P9" }, /at `\$.priority`/],
    ["a fractional ttl", { ...minimal, ttl_ms: 1.5 }, /Expected `int`, got `float` - at `\$.ttl_ms`/],
    ["a ttl over a day", { ...minimal, ttl_ms: 86_400_001 }, /Expected `int` <= 86400000 - at `\$.ttl_ms`/],
    ["a budget over a day", { ...minimal, budget: { execute_ms: 86_400_001 } }, /at `\$.budget.execute_ms`/],
    ["a system reply subject", { ...minimal, reply_to: "$JS.API.x" }, /matching regex .* - at `\$.reply_to`/],
    ["a wildcard reply subject", { ...minimal, reply_to: "a.>" }, /matching regex .* - at `\$.reply_to`/],
    ["a claim check without its digest", { ...minimal, payload_ref: { bucket: "b", name: "n", size: 1 } }, /missing required field `sha256` - at `\$.payload_ref`/],
    ["a claim check of a fractional size", { ...minimal, payload_ref: { bucket: "b", name: "n", size: 1.5, sha256: "x" } }, /at `\$.payload_ref.size`/],
  ];
  for (const [what, input, message] of bad) {
    it(`rejects ${what}, naming the field`, () => {
      assert.throws(() => decodeTask(enc(input)), (err: unknown) => err instanceof DecodeError && message.test(err.message));
    });
  }
});

describe("newId", () => {
  it("is a UUIDv7 that sorts by time", () => {
    const id = newId();
    assert.match(id, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  });
});

describe("handler failures", () => {
  it("reports a thrown value that is no Error by its JSON, not [object Object]", () => {
    assert.deepEqual(errorInfo({ code: 42 }), {
      type: "Error",
      message: 'the handler threw {"code":42}, not an Error',
      retryable: true,
      retry_after_ms: null,
    });
    assert.equal(errorInfo("boom").message, 'the handler threw "boom", not an Error');
    assert.equal(errorInfo(undefined).message, "the handler threw undefined, not an Error");
    assert.equal(errorInfo(new TypeError("bad")).type, "TypeError");
  });

  it("reports a sub-task's failure let through as sub_task_failed, retryable while the sub-task may still end well", () => {
    const ids = { messageId: "child-1", traceId: "t" };
    const declined = { type: "Error", message: "card declined", retryable: false, retry_after_ms: null };
    const ended = errorInfo(new TaskFailed(declined, "retries_exhausted", ids));
    assert.equal(ended.type, "sub_task_failed");
    assert.equal(ended.retryable, false); // a run again would hear the same end
    assert.match(ended.message, /^sub-task child-1 failed: TaskFailed: /);
    const waiting = errorInfo(new NotAcknowledged("no agent acknowledged 'stock' within 50 ms", ids));
    assert.deepEqual([waiting.type, waiting.retryable], ["sub_task_failed", true]);
  });
});

describe("reportedRaw", () => {
  it("cuts an undecodable body by code points, never inside a surrogate pair (the coordinator refused half an emoji)", () => {
    const encode = (text: string) => new TextEncoder().encode(text);
    const cut = reportedRaw(encode(`${"a".repeat(RAW_KEPT - 1)}😀😀`));
    assert.deepEqual(cut, { raw: `${"a".repeat(RAW_KEPT - 1)}😀…`, truncated: true });
    // Past RAW_KEPT UTF-16 units but within RAW_KEPT code points: kept whole, as Python keeps it.
    const emoji = "😀".repeat(40_000);
    assert.deepEqual(reportedRaw(encode(emoji)), { raw: emoji });
  });
});
