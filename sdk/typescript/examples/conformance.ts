/**
 * The agent `reach conformance` drives: the conformance topic's handler, as
 * docs/protocol.md (§18) specifies it, written with this SDK.
 *
 *     REACH_AGENT_ID=conformance-ts node build/examples/conformance.js nats://127.0.0.1:4222
 *     reach conformance conformance-ts
 *
 * Settings come from the environment, so the kit can start (and restart) it as a command:
 * REACH_AGENT_ID (default conformance-ts), REACH_CONFORMANCE_TOPIC (default conformance),
 * REACH_ACK_WAIT_S (default 5: a crashed run comes back that soon), REACH_PREFIX, NATS_URL.
 * SIGINT or SIGTERM stop it (exit 0); a second copy, refused, or a copy fenced out by a
 * newer one of its id, says why and exits 1.
 */

import { Agent, PermanentError } from "../src/index.js";
import type { TaskContext } from "../src/index.js";
import { announcing, serveUntilSignal } from "./service.js";

const url = process.argv[2] ?? process.env.NATS_URL ?? "nats://127.0.0.1:4222";
const topic = process.env.REACH_CONFORMANCE_TOPIC ?? "conformance";
const agent = new Agent({
  agentId: process.env.REACH_AGENT_ID ?? "conformance-ts",
  tags: { role: "conformance", lang: "typescript" },
  startupDelayMs: 0,
  ackWaitMs: Number(process.env.REACH_ACK_WAIT_S ?? "5") * 1000,
  prefix: process.env.REACH_PREFIX ?? "reach",
  logger: announcing(`conformance agent ${process.env.REACH_AGENT_ID ?? "conformance-ts"} serving '${topic}' on ${url}`),
});

interface Op {
  op?: string;
  value?: unknown;
  notes?: string[];
  message?: string;
  until_attempt?: number | null;
  ms?: number;
}

agent.handler(topic, { version: "1.0.0", capacity: 8 }, async (ctx: TaskContext, payload: Op) => {
  switch (payload?.op) {
    case "echo":
      return { value: payload.value ?? null, attempt: ctx.attempt };
    case "progress":
      for (const note of payload.notes ?? []) await ctx.progress(note);
      return { notes: (payload.notes ?? []).length };
    case "fail":
      if (payload.until_attempt == null || ctx.attempt < payload.until_attempt) {
        throw new Error(payload.message ?? "failing on purpose");
      }
      return { attempt: ctx.attempt };
    case "reject":
      throw new PermanentError(payload.message ?? "refused on purpose");
    case "sleep": {
      await ctx.progress("started"); // one per run: the kit counts runs by these
      const ms = payload.ms ?? 0;
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, ms);
        ctx.signal.addEventListener("abort", () => {
          clearTimeout(timer);
          resolve();
        });
      });
      return { slept_ms: ms };
    }
    default:
      throw new PermanentError(`unknown op ${JSON.stringify(payload?.op)}`);
  }
});

await serveUntilSignal(agent, url);
