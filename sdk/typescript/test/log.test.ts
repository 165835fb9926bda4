/** The SDK's JSON log lines: what a terminal would obey is escaped, and the line is the same JSON. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { jsonLogger } from "../src/log.js";

describe("jsonLogger", () => {
  it("escapes C1 controls and bidi overrides that JSON.stringify leaves raw", () => {
    const evil = "err \u009b31m \u202e \u001b]52;c;x\u0007 é";
    const written: string[] = [];
    const write = process.stderr.write;
    process.stderr.write = ((chunk: string) => {
      written.push(chunk);
      return true;
    }) as typeof process.stderr.write;
    try {
      jsonLogger("info").error("handler failed", { error: evil });
    } finally {
      process.stderr.write = write;
    }
    const line = written.join("");
    assert.doesNotMatch(line, /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u202e]/);
    assert.equal(JSON.parse(line).error, evil);
  });
});
