/**
 * The records of Agent-Reach agent protocol v1 as they travel on the wire (JSON).
 *
 * Generated into src/generated/wire.ts from the JSON Schemas under ../../schemas
 * (`npm run gen:types`); this module re-exports them with a few names of its own.
 * Field names are the wire names (snake_case) on purpose: these objects are
 * encoded and decoded as they are.
 */

import type { Ack, ErrorReply, Liveness, Progress, Result, Task } from "./generated/wire.js";

export type * from "./generated/wire.js";

/** Queue priority; P0 is the most urgent. */
export type Priority = Task["priority"];
export const PRIORITIES: readonly Priority[] = ["P0", "P1", "P2"];

/** Any JSON value (payloads and results are free-form). */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/** What goes to a task's `reply_to`. */
export type Reply = Ack | Progress | Result | ErrorReply;

/** Fields shared by a task and everything said about it (replies, events). */
export type AboutTask = Pick<
  Task,
  "v" | "message_id" | "trace_id" | "topic" | "from_agent" | "to_agent" | "attempt" | "created_at"
>;

/** The coordinator's judgement of an agent. */
export type LivenessState = Liveness["state"];
