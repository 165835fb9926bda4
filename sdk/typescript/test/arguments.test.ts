/** A caller's arguments checked before anything is sent, told in the caller's own words. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { budgetOf, taskOf } from "../src/arguments.js";
import { InvalidArgument } from "../src/index.js";

const fields = { v: 1, kind: "task", message_id: "m-1", trace_id: "m-1", topic: "echo", payload: null, priority: "P1", created_at: 1 };

describe("arguments", () => {
  it("says a fraction of a millisecond is not a whole number of ms, not that a float is no int", () => {
    assert.throws(() => taskOf({ ...fields, ttl_ms: 1.5 }), (err: unknown) => {
      assert.ok(err instanceof InvalidArgument, String(err));
      assert.equal(err.message, "ttlMs must be a whole number of ms, got 1.5");
      assert.equal(err.argument, "ttlMs");
      return true;
    });
    assert.throws(() => budgetOf(2_000, 0.5), { message: "executeDeadlineMs must be a whole number of ms, got 0.5" });
  });

  it("keeps the range in the message of a duration out of it", () => {
    assert.throws(() => taskOf({ ...fields, ttl_ms: 0 }), { message: /^ttlMs=0: Expected `int` >= 1 \(whole milliseconds from 1 to 86400000, a day\)$/ });
  });
});
