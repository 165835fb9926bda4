/** The drain at a stop: running handlers, outcomes being recorded, outcomes being reported. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { drain, Recording } from "../src/drain.js";

/** A logger that keeps what was warned or said as an error, with each line's fields. */
function recorded() {
  const said: string[] = [];
  const fields: Record<string, unknown>[] = [];
  const note = (event: string, extra?: Record<string, unknown>) => void (said.push(event), fields.push(extra ?? {}));
  return { said, fields, log: { debug: () => undefined, info: () => undefined, warn: note, error: note } };
}

describe("drain", () => {
  it("counts a run reporting an outcome already recorded as neither running nor unrecorded", async () => {
    const recording = new Recording();
    const { said, fields, log } = recorded();
    let aborted = 0;
    const never = new Promise<void>(() => undefined); // a report the server never answers
    const reporting = recording.during("m-reporting", async (kept) => {
      kept();
      await never;
    });
    const unrecorded = recording.during("m-recording", () => never);
    const inFlight = new Set<Promise<void>>([reporting, unrecorded]);
    await drain({ inFlight, recording, abortAll: () => void (aborted += 1), drainTimeoutMs: 30, log });
    assert.equal(aborted, 0, said.join("\n")); // nothing ran a handler any more
    assert.ok(!said.some((event) => event.startsWith("handlers still running")), said.join("\n"));
    const given = said.findIndex((event) => event.startsWith("outcomes given up at the stop"));
    const unreported = said.findIndex((event) => event.startsWith("outcomes recorded but not reported"));
    assert.deepEqual(fields[given], { message_ids: ["m-recording"] });
    assert.deepEqual(fields[unreported], { message_ids: ["m-reporting"] });
  });

  it("aborts the handlers still running, and only those", async () => {
    const recording = new Recording();
    const { said, fields, log } = recorded();
    let abort: () => void = () => undefined;
    const handler = new Promise<void>((resolve) => (abort = resolve));
    const reporting = recording.during("m-reporting", (kept) => (kept(), handler));
    await drain({ inFlight: new Set([handler, reporting]), recording, abortAll: () => abort(), drainTimeoutMs: 30, log });
    const cut = said.findIndex((event) => event.startsWith("handlers still running"));
    assert.deepEqual(fields[cut], { running: 1 });
  });
});
