/** A handler's places: a hard limit shared by the priorities, one kept for P0. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { HandlerPlaces, Latencies, Room } from "../src/slots.js";
import type { Task } from "../src/types.js";

describe("HandlerPlaces", () => {
  it("never gives P1 or P2 a handler's last place", async () => {
    const places = new HandlerPlaces(2);
    const never = new AbortController().signal;
    assert.equal(await places.take("P2", never), true);
    let late = false;
    const waiting = places.take("P2", never).then((taken) => (late = taken));
    await Promise.resolve();
    assert.equal(late, false); // the last place is kept for P0
    assert.deepEqual([places.freeTo("P2"), places.freeTo("P1"), places.freeTo("P0")], [0, 0, 1]);
    assert.equal(await places.take("P0", never), true); // at once
    assert.equal(places.free, 0);
    places.give(); // the P0 ends: still the last place, still not for P2
    await Promise.resolve();
    assert.equal(late, false);
    places.give(); // the first P2 ends: now one may run
    await waiting;
    assert.equal(late, true);
    const single = new HandlerPlaces(1);
    assert.equal(await single.take("P2", never), true); // one place: nothing to keep
    assert.equal(single.free, 0);
  });
});

describe("Latencies", () => {
  it("keeps a moving average per topic, and one of every run for the heartbeat", () => {
    const latencies = new Latencies(0.5);
    for (const [topic, ms] of [["slow", 400], ["fast", 4], ["slow", 200], ["fast", 6]] as const) latencies.observe(topic, ms);
    assert.equal(latencies.of("slow"), 300);
    assert.equal(latencies.of("fast"), 5);
    assert.equal(latencies.of("never"), 0);
    assert.equal(latencies.estimateMs, 103); // 400, then halfway to 4 (202), to 200 (201), to 6
  });
});

describe("Room", () => {
  it("lets more than 10 tasks wait for a place without Node's MaxListenersExceededWarning (a trial's capacity-20 agent)", async () => {
    const warnings: string[] = [];
    const warned = (warning: Error) => void warnings.push(warning.name);
    process.on("warning", warned);
    const stopping = new AbortController();
    const room = new Room(new Map([["busy", 1]]), stopping.signal);
    const task = { topic: "busy", priority: "P1" } as Task;
    try {
      assert.equal(await room.enter(task, () => () => undefined, 60_000), "entered");
      const waiting = Array.from({ length: 15 }, () => room.enter(task, () => () => undefined, 60_000));
      await new Promise((resolve) => setImmediate(resolve)); // a warning is emitted on the next tick
      stopping.abort();
      assert.deepEqual(new Set(await Promise.all(waiting)), new Set(["stopping"]));
      await new Promise((resolve) => setImmediate(resolve));
    } finally {
      process.off("warning", warned);
    }
    assert.ok(!warnings.includes("MaxListenersExceededWarning"), warnings.join(", "));
  });
});
