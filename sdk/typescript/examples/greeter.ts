/**
 * A TypeScript agent for the mixed demo: serves `greet`, and hands the name on to
 * the Python `echo` agent as a child task in the same trace. SIGINT or SIGTERM stop it
 * (exit 0); fenced out by a newer process of its id, it says so and exits 1.
 *
 *     node build/examples/greeter.js nats://127.0.0.1:4222
 */

import { Agent, PermanentError } from "../src/index.js";
import { announcing, serveUntilSignal } from "./service.js";

const url = process.argv[2] ?? process.env.NATS_URL ?? "nats://127.0.0.1:4222";
const agent = new Agent({
  agentId: "ts-greeter-1",
  tags: { lang: "typescript" },
  startupDelayMs: 0,
  prefix: process.env.REACH_PREFIX ?? "reach",
  logger: announcing(`greeter serving on ${url}`),
});

agent.handler("greet", { version: "1.0.0", capacity: 4, deadlineMs: 5_000 }, async (ctx, payload: { name?: string }) => {
  if (!payload?.name) throw new PermanentError("payload needs a name");
  await ctx.progress("greeting");
  const child = await ctx.publish("echo", { text: `hello ${payload.name}` }); // same trace
  return { greeting: `Hello, ${payload.name}!`, echo_message_id: child.message_id, trace_id: ctx.traceId };
});

await serveUntilSignal(agent, url);
