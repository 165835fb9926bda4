/**
 * Options objects checked for keys nobody reads: in plain JavaScript (and TypeScript given a
 * variable, not a literal) `{ capcity: 2 }` or `{ messageID: id }` would otherwise be ignored
 * without a word, and the default taken (a resend without its id runs the work again).
 */

import type { AgentOptions, HandlerOptions } from "./agent.js";
import type { InvokeOptions, InvokeTaskOptions, ReachClientOptions, TaskOptions } from "./client.js";
import type { SubInvokeOptions, SubTaskOptions } from "./context.js";
import type { ResultOptions, StatusOptions } from "./lookup.js";
import type { CancelWorkflowOptions, SignalWorkflowOptions } from "./workflowcontrol.js";

/** Every key of `T`, so that a key added to the interface must be added here too. */
export type Keys<T> = Record<keyof Required<T>, true>;

export const AGENT_OPTIONS: Keys<AgentOptions> = {
  agentId: true, identityFile: true, tags: true, heartbeatIntervalMs: true, startupDelayMs: true,
  ackWaitMs: true, maxDeliver: true, drainTimeoutMs: true, rateLimit: true, prefix: true,
  logger: true, requestTimeoutMs: true, claimCheckBytes: true, creds: true,
};
export const HANDLER_OPTIONS: Keys<HandlerOptions> = {
  version: true, payload: true, capacity: true, deadlineMs: true, maxAttempts: true, description: true, examples: true,
};
export const CLIENT_OPTIONS: Keys<ReachClientOptions> = {
  name: true, creds: true, prefix: true, logger: true, requestTimeoutMs: true, claimCheckBytes: true,
};
export const TASK_OPTIONS: Keys<TaskOptions> = {
  priority: true, ttlMs: true, traceId: true, messageId: true, replyTo: true, budget: true,
  headers: true, traceparent: true,
};
export const INVOKE_OPTIONS: Keys<InvokeOptions> = {
  priority: true, ttlMs: true, traceId: true, messageId: true, headers: true, traceparent: true,
  ackDeadlineMs: true, executeDeadlineMs: true, onAck: true, onProgress: true, signal: true,
};
export const INVOKE_TASK_OPTIONS: Keys<InvokeTaskOptions> = { onAck: true, onProgress: true, signal: true };
export const SUB_TASK_OPTIONS: Keys<SubTaskOptions> = { priority: true, key: true };
export const SUB_INVOKE_OPTIONS: Keys<SubInvokeOptions> = { priority: true, key: true, ackDeadlineMs: true };
export const STATUS_OPTIONS: Keys<StatusOptions> = { timeoutMs: true };
export const RESULT_OPTIONS: Keys<ResultOptions> = { timeoutMs: true, signal: true };
export const CANCEL_WORKFLOW_OPTIONS: Keys<CancelWorkflowOptions> = { why: true, waitMs: true };
export const SIGNAL_WORKFLOW_OPTIONS: Keys<SignalWorkflowOptions> = { waitMs: true };

/**
 * Throws `error(message)` when `options` holds a key that is not in `known`, naming it, the
 * nearest known key when one is close, and the known ones.
 */
export function onlyKnown(what: string, options: object | null | undefined, known: object, error: (message: string) => Error): void {
  if (options === null || options === undefined) return;
  const names = Object.keys(known);
  const unknown = Object.keys(options).filter((key) => !Object.hasOwn(known, key));
  if (unknown.length === 0) return;
  const said = unknown.map((key) => `'${key}'${nearest(key, names)}`).join(", ");
  throw error(`${what}: unknown option${unknown.length > 1 ? "s" : ""} ${said} (known: ${names.join(", ")})`);
}

function nearest(key: string, names: string[]): string {
  const lower = key.toLowerCase();
  const close = names.find((name) => name.toLowerCase() === lower || distance(name.toLowerCase(), lower) <= 2);
  return close === undefined ? "" : `: did you mean '${close}'?`;
}

/** Levenshtein distance, for option names (a few dozen characters). */
function distance(a: string, b: string): number {
  let row = Array.from({ length: b.length + 1 }, (_, i) => i);
  for (let i = 1; i <= a.length; i++) {
    const next = [i];
    for (let j = 1; j <= b.length; j++) {
      next.push(Math.min(row[j]! + 1, next[j - 1]! + 1, row[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1)));
    }
    row = next;
  }
  return row[b.length]!;
}
