/** Options objects: a key nobody reads is an error that names it, not a default taken. */

import assert from "node:assert/strict";
import { describe, it } from "node:test";

import { Agent, AgentConfigError, InvalidArgument, ReachClient } from "../src/index.js";
import { onlyKnown } from "../src/options.js";

describe("options", () => {
  it("names an unknown key of new Agent() and of a handler's options, with the one meant", () => {
    const typo = { agentId: "opts-1", startupDelay: 0 } as never;
    assert.throws(() => new Agent(typo), (err: unknown) => {
      assert.ok(err instanceof AgentConfigError, String(err));
      assert.match(err.message, /^new Agent\(\): unknown option 'startupDelay': did you mean 'startupDelayMs'\? \(known: agentId, /);
      return true;
    });
    const agent = new Agent({ agentId: "opts-1", startupDelayMs: 0 });
    assert.throws(() => agent.handler("echo", { capcity: 2 } as never, async () => null), /handler 'echo': unknown option 'capcity': did you mean 'capacity'\?/);
  });

  it("refuses ReachClient.connect() options it does not read before connecting", async () => {
    const options = { name: "opts", requestTimeout: 100 } as never;
    await assert.rejects(ReachClient.connect("nats://127.0.0.1:1", options), (err: unknown) => {
      assert.ok(err instanceof InvalidArgument, String(err));
      assert.equal(err.argument, "options");
      assert.match(err.message, /unknown option 'requestTimeout': did you mean 'requestTimeoutMs'\?/);
      return true;
    });
  });

  it("says a duration given as text is not a number, rather than not positive", () => {
    assert.throws(() => new Agent({ agentId: "opts-2", drainTimeoutMs: "10s" as never }), {
      message: 'drainTimeoutMs must be a number, got "10s"',
    });
    assert.throws(() => new Agent({ agentId: "opts-2", drainTimeoutMs: -1 }), { message: "drainTimeoutMs must be positive, got -1" });
    const agent = new Agent({ agentId: "opts-2", startupDelayMs: 0 });
    assert.throws(() => agent.handler("echo", { payload: "a schema" } as never, async () => null), /payload of 'echo' must be a function/);
  });

  it("refuses a prefix that is not one name token, before connecting", async () => {
    const said = /prefix "a\.b" is not one name token: 1 to 32 letters, digits, '_' or '-'/;
    assert.throws(() => new Agent({ agentId: "opts-3", prefix: "a.b" }), (err: unknown) => {
      assert.ok(err instanceof AgentConfigError, String(err));
      assert.match(err.message, said);
      return true;
    });
    await assert.rejects(ReachClient.connect("nats://127.0.0.1:1", { prefix: "a.b" }), (err: unknown) => {
      assert.ok(err instanceof InvalidArgument, String(err));
      assert.equal(err.argument, "prefix");
      assert.match(err.message, said);
      return true;
    });
  });

  it("lists every unknown key, and suggests only a close one", () => {
    const error = (m: string) => new Error(m);
    assert.throws(() => onlyKnown("f()", { messageID: "x", colour: 1 }, { messageId: true }, error), {
      message: "f(): unknown options 'messageID': did you mean 'messageId'?, 'colour' (known: messageId)",
    });
    onlyKnown("f()", undefined, { a: true }, error);
    onlyKnown("f()", { a: 1 }, { a: true }, error);
  });
});
