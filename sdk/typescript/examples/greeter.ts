/**
 * A TypeScript agent for the mixed demo: serves `greet`, and hands the name on to
 * the Python `echo` agent as a child task in the same trace.
 *
 *     node build/examples/greeter.js nats://127.0.0.1:4222
 */

import { Agent, PermanentError } from "../src/index.js";

const url = process.argv[2] ?? process.env.NATS_URL ?? "nats://127.0.0.1:4222";
const agent = new Agent({
  agentId: "ts-greeter-1",
  tags: { lang: "typescript" },
  startupDelayMs: 0,
  prefix: process.env.REACH_PREFIX ?? "reach",
});

agent.handler("greet", { version: "1.0.0", capacity: 4, deadlineMs: 5_000 }, async (ctx, payload: { name?: string }) => {
  if (!payload?.name) throw new PermanentError("payload needs a name");
  await ctx.progress("greeting");
  const child = await ctx.publish("echo", { text: `hello ${payload.name}` }); // same trace
  return { greeting: `Hello, ${payload.name}!`, echo_message_id: child.message_id, trace_id: ctx.traceId };
});

await agent.start(url);
process.stdout.write(`greeter serving on ${url}\n`);
for (const signal of ["SIGINT", "SIGTERM"] as const) {
  process.once(signal, () => {
    void agent.stop().then(() => process.exit(0));
  });
}
