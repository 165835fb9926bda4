/**
 * A TypeScript caller: invokes a topic (default: the mixed demo's workflow `greeting`) with
 * `ReachClient` and prints the result on stdout, or the typed error on stderr (exit 1).
 *
 *     node build/examples/caller.js nats://127.0.0.1:4222 greeting '{"name": "Ada"}'
 *
 * With `NATS_CREDS` set (a secured deployment), it calls as the user of those creds.
 */

import { InvokeError, ReachClient, TaskFailed } from "../src/index.js";

const [url = process.env.NATS_URL ?? "nats://127.0.0.1:4222", topic = "greeting", json = '{"name": "Ada"}'] = process.argv.slice(2);
const client = await ReachClient.connect(url, { name: "ts-caller", prefix: process.env.REACH_PREFIX ?? "reach" });
try {
  const result = await client.invoke(topic, JSON.parse(json), {
    executeDeadlineMs: 10_000,
    onProgress: (p) => process.stderr.write(`progress from ${p.from_agent ?? "the coordinator"}: ${p.note}\n`),
  });
  process.stdout.write(`${JSON.stringify(result)}\n`);
} catch (err) {
  if (err instanceof TaskFailed) {
    // Rejected (nothing ran) or TaskFailed (a handler ran): act on type, ending and retryable.
    process.stderr.write(`${err.name}: ${err.type} (ended as ${err.ending}; retryable: ${err.retryable}): ${err.error.message}\n`);
  } else if (err instanceof InvokeError) {
    // NotAcknowledged, DeadlineExceeded: the task may still run; invoke again under its id.
    process.stderr.write(`${err.name}: ${err.message} (message id ${err.messageId})\n`);
  } else {
    process.stderr.write(`${String(err)}\n`);
  }
  process.exitCode = 1;
} finally {
  await client.close();
}
