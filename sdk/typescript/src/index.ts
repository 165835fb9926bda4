/** @agentreach/agent — write Agent-Reach agents in TypeScript (agent protocol v1). */

export { Agent, DEFAULT_IDENTITY_FILE } from "./agent.js";
export type { AgentOptions, HandlerOptions, Servers } from "./agent.js";
export { DEFAULT_CLAIM_CHECK_BYTES, PayloadUnavailable } from "./claimcheck.js";
export { decodeTask, newId } from "./codec.js";
export { TaskContext } from "./context.js";
export { AgentConfigError, AgentIdInUse, DecodeError, PermanentError, ReachError } from "./errors.js";
export { jsonLogger } from "./log.js";
export type { Logger, LogLevel } from "./log.js";
export { DEFAULT_PREFIX, Names } from "./names.js";
export type { Handler } from "./execution.js";
export { PRIORITIES } from "./types.js";
export type * from "./types.js";

/** The version of the agent protocol this SDK speaks. */
export const PROTOCOL_VERSION = 1;
