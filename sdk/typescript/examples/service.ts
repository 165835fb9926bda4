/**
 * How the examples run an agent as a process: `agent.run()` until SIGINT or SIGTERM stops it
 * cleanly (exit 0), or until it ends on its own — fenced out by a newer process of its agent
 * id, refused at start because another live process serves the id, misconfigured — which
 * is one line on stderr and exit 1.
 */

import { AgentIdInUse, jsonLogger } from "../src/index.js";
import type { Agent, Logger } from "../src/index.js";

/**
 * The SDK's JSON log lines on stderr, and `line` on stdout once the agent serves, for
 * a script or a test that waits for it (`run()` itself resolves only at the end).
 */
export function announcing(line: string, log: Logger = jsonLogger("info")): Logger {
  return {
    ...log,
    info(event, fields) {
      log.info(event, fields);
      if (event === "agent serving") process.stdout.write(`${line}\n`);
    },
  };
}

/** Serve until a signal or a fence, then exit with 0 (a signal) or 1 (anything else). */
export async function serveUntilSignal(agent: Agent, servers: string): Promise<never> {
  let signalled = false;
  for (const signal of ["SIGINT", "SIGTERM"] as const) {
    // `on`: a second signal during the drain is the same stop (with `once` it killed the process).
    process.on(signal, () => {
      signalled = true;
      void agent.stop().catch(() => undefined); // its outcome reaches run() below
    });
  }
  let code = 0;
  try {
    await agent.run(servers);
  } catch (err) {
    process.stderr.write(`${agent.agentId}: ${err instanceof Error ? `${err.name}: ${err.message}` : String(err)}\n`);
    // run() resolves on a signal, even during the start; being fenced out is never clean.
    if (!signalled || err instanceof AgentIdInUse) code = 1;
  }
  // Exit rather than wait for the event loop to empty: a handler that ignores its abort
  // signal would otherwise keep a stopped agent's process alive.
  process.exit(code);
}
