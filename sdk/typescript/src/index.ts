/**
 * @agentreach/agent — Agent-Reach in TypeScript (protocol v1): write agents (`Agent`), and
 * call them (`ReachClient`).
 */

export { Agent, DEFAULT_IDENTITY_FILE } from "./agent.js";
export type { AgentOptions, HandlerOptions } from "./agent.js";
export { DEFAULT_CLAIM_CHECK_BYTES, PayloadUnavailable } from "./claimcheck.js";
export { ReachClient } from "./client.js";
export type { InvokeOptions, InvokeTaskOptions, Published, PublishOptions, ReachClientOptions, TaskOptions } from "./client.js";
export { decodeTask, newId, subTaskId } from "./codec.js";
export { TaskContext } from "./context.js";
export type { SubInvokeOptions, SubTaskOptions } from "./context.js";
export {
  AgentConfigError,
  AgentIdInUse,
  ConnectError,
  BacklogFull,
  DeadlineExceeded,
  DecodeError,
  InvalidArgument,
  InvokeAborted,
  InvokeError,
  NotAcknowledged,
  NotStored,
  NotProvisioned,
  PermanentError,
  ReachError,
  Rejected,
  TaskFailed,
  UnknownWorkflow,
  WorkflowActionRefused,
} from "./errors.js";
export type { MessageIds, TaskEnding } from "./errors.js";
export type { OnAck, OnProgress } from "./invocation.js";
export { jsonLogger } from "./log.js";
export type { Logger, LogLevel } from "./log.js";
export type { ResultOptions, StatusOptions } from "./lookup.js";
export { DEFAULT_PREFIX, Names } from "./names.js";
export type { Handler } from "./execution.js";
export { InvalidPayload } from "./failures.js";
export type { Servers } from "./servers.js";
export { PRIORITIES } from "./types.js";
export type { CancelWorkflowOptions, SignalOutcome, SignalWorkflowOptions, WorkflowEnded } from "./workflowcontrol.js";
export type * from "./types.js";

/** The version of the agent protocol this SDK speaks. */
export const PROTOCOL_VERSION = 1;
