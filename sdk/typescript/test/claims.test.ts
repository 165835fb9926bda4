/** The fences an agent reads in its record of a message before it runs a delivery. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { isReassignmentFence } from "../src/claims.js";
import type { Execution } from "../src/types.js";

const fence = (attempt: number): Execution =>
  ({
    message_id: "m",
    state: "failed",
    agent_id: "a",
    epoch: 1,
    attempt,
    error: { type: "reassigned", message: "its agent went OFFLINE", retryable: true },
  }) as Execution;

describe("isReassignmentFence", () => {
  it("fences off its attempt and every earlier one, not a later one", () => {
    // The one record keeps the last fence: that of attempt 3 replaced that of 2, and a process
    // that came back with attempt 2 in hand ran it beside attempt 3 (a cluster walkthrough).
    assert.equal(isReassignmentFence(fence(3), 2), true);
    assert.equal(isReassignmentFence(fence(3), 3), true);
    assert.equal(isReassignmentFence(fence(3), 4), false);
  });
});
