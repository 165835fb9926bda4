/**
 * Errors of the agent SDK.
 *
 * ReachError              root of everything this package throws
 * ├── AgentConfigError    an Agent or handler was declared wrongly (thrown at once)
 * ├── AgentIdInUse        another live process already serves this agent_id
 * ├── PermanentError      thrown by a handler: do not retry this task
 * ├── DecodeError         a record on the wire is not what the protocol says
 * └── PayloadUnavailable  a claim-checked payload is gone or does not match its SHA-256
 *                         (in claimcheck.ts)
 */

export class ReachError extends Error {
  override name = "ReachError";
}

/** An Agent, handler or option is wrong; the message names it. */
export class AgentConfigError extends ReachError {
  override name = "AgentConfigError";
}

/** Another live process answers for this agent_id, or registered it at the same moment. */
export class AgentIdInUse extends ReachError {
  override name = "AgentIdInUse";
}

/** Throw from a handler when trying again cannot help (bad input, business refusal). */
export class PermanentError extends ReachError {
  override name = "PermanentError";
}

/** A record could not be decoded; the message ends with the JSON path at fault. */
export class DecodeError extends ReachError {
  override name = "DecodeError";
}
