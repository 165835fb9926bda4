/**
 * What a handler's failure is reported as (protocol §10.8): its class name, message, and
 * whether to retry; the deadline passing, a result that cannot be sent, and one its
 * execution record cannot hold, have types of their own.
 */

import { DeadlineExceeded as NoResultInTime, InvokeAborted, InvokeError, NotAcknowledged, NotStored, PermanentError, ReachError } from "./errors.js";
import type { Handler } from "./execution.js";
import type { ErrorInfo } from "./types.js";

/** The handler's deadline passed (it is told through `ctx.signal`). */
export class DeadlineExceeded extends ReachError {
  override name = "DeadlineExceeded";
  constructor(readonly deadlineMs: number) {
    super(`handler ran past ${deadlineMs} ms`);
  }
}

/**
 * The handler returned a value that cannot be sent as JSON (a BigInt, a cycle, a function).
 * Running it again would repeat its work, and its side effects, for the same result: it is
 * not retried.
 */
export class InvalidResult extends ReachError {
  override name = "InvalidResult";
}

/**
 * The task's payload is not what the handler takes: its `payload` check threw, or the handler
 * threw a TypeError on a task with no payload (`null`). The same payload fails every run:
 * `invalid_payload`, not retried, and not counted against the agent's health (a caller's bad
 * input would otherwise isolate the agent for every caller). A handler may throw it too.
 */
export class InvalidPayload extends ReachError {
  override name = "InvalidPayload";
}

/**
 * `fn`, given the payload as `check` returns it (a schema's `parse`, say); what `check`
 * throws fails the task as InvalidPayload, naming the topic and why, without calling `fn`.
 * With no check, a TypeError on a null payload (`payload.text` of nothing) is one too.
 */
export function checkingPayload<P, R>(topic: string, fn: Handler<P, R>, check?: (payload: unknown) => P): Handler<unknown, R> {
  if (check === undefined) {
    return async (ctx, payload) => {
      try {
        return await fn(ctx, payload as P);
      } catch (err) {
        if (payload != null || !(err instanceof TypeError)) throw err;
        throw new InvalidPayload(`the task has no payload (null), and the handler of '${topic}' raised TypeError: ${err.message}`);
      }
    };
  }
  return (ctx, payload) => {
    let checked: P;
    try {
      checked = check(payload);
    } catch (err) {
      throw new InvalidPayload(`the payload does not fit the handler of '${topic}': ${err instanceof Error ? err.message : thrown(err)}`);
    }
    return fn(ctx, checked);
  };
}

/** `result`, when it can be encoded as JSON; else an InvalidResult saying why. */
export function sendable(result: unknown): unknown {
  let json: string | undefined;
  try {
    json = JSON.stringify(result ?? null);
  } catch (err) {
    throw new InvalidResult(`the handler's result could not be sent: it cannot be encoded as JSON (${String((err as Error)?.message ?? err)})`);
  }
  if (json === undefined) {
    throw new InvalidResult(`the handler's result could not be sent: it cannot be encoded as JSON (a ${typeof result} has no JSON form)`);
  }
  return result;
}

/**
 * The failure to record instead of `result`, which its execution record cannot hold (10054):
 * `result_too_large`, not retryable (every run would end so), saying what to do.
 */
export function unrecordable(result: unknown, err: unknown): ErrorInfo {
  const size = Buffer.byteLength(JSON.stringify(result ?? null));
  const message =
    `the result (${size} bytes of JSON) does not fit its execution record (${String(err)}): return less, ` +
    "or let it travel by claim check (an agent's claimCheckBytes below the coordinator's limits.record_bytes, on an open server)";
  return failure("result_too_large", message, false);
}

/** An ErrorInfo, every field written (no `retry_after_ms`: that is the coordinator's). */
export function failure(type: string, message: string, retryable: boolean): ErrorInfo {
  return { type, message, retryable, retry_after_ms: null };
}

/**
 * Why a queued dispatch expired (the coordinator's wording). A dispatch's ttl is what was
 * left of it when it was routed: one routed late says so; one delivered before did not
 * only wait (its earlier deliveries' processes died or stalled).
 */
export function ttlPassedInQueue(ttlMs: number, agentId: string, dispatchedMs: number, receivedMs: number, delivered = 1): string {
  if (delivered > 1) {
    return `ttl ${ttlMs} ms ran out with ${agentId}: delivered ${delivered} times, and no run of it finished (each process that took it died or stalled)`;
  }
  const waitedMs = dispatchedMs - receivedMs;
  if (receivedMs && waitedMs >= 1000) {
    return (
      `its ttl passed in the queue of ${agentId} (${ttlMs} ms of it were left when it` +
      ` was dispatched there, ${(waitedMs / 1000).toFixed(1)} s after it was taken in)`
    );
  }
  return `ttl ${ttlMs} ms passed in the queue of ${agentId}`;
}

/** How a handler failure is reported: its class name, message, and whether to retry. */
export function errorInfo(err: unknown): ErrorInfo {
  if (err instanceof DeadlineExceeded) return failure("deadline_exceeded", err.message, true);
  if (err instanceof InvalidResult) return failure("invalid_result", err.message, false);
  if (err instanceof InvalidPayload) return failure("invalid_payload", err.message, false);
  if (err instanceof InvokeError) return subTaskFailed(err);
  if (err instanceof Error) {
    const type = err.constructor?.name || err.name || "Error";
    return failure(type, err.message || type, !(err instanceof PermanentError));
  }
  return failure("Error", `the handler threw ${thrown(err)}, not an Error`, true);
}

/**
 * A handler failed because a task it sent (`ctx.invoke`, a client of its own) did:
 * `sub_task_failed`, which the coordinator does not count against this agent's health (a
 * dependency's failure must not isolate the agent that called it). Retryable while the sub-task
 * may still end well (not accepted yet, no result yet, not stored, the wait aborted): a run
 * again attaches to it. Not when it ended: a run again hears the same end.
 */
function subTaskFailed(err: InvokeError): ErrorInfo {
  const openEnded =
    err instanceof NotAcknowledged || err instanceof NoResultInTime || err instanceof NotStored || err instanceof InvokeAborted || err.constructor === InvokeError;
  return failure("sub_task_failed", `sub-task ${err.messageId} failed: ${err.name}: ${err.message}`, openEnded);
}

/** A thrown value that is no Error, in words: `{"code":42}` rather than `[object Object]`. */
export function thrown(value: unknown): string {
  if (typeof value === "object" && value !== null) {
    try {
      const json = JSON.stringify(value);
      if (json !== undefined) return json.length > 500 ? `${json.slice(0, 500)}…` : json;
    } catch {
      // a cycle or a BigInt inside: its string form will do
    }
  }
  return typeof value === "string" ? JSON.stringify(value) : String(value);
}
