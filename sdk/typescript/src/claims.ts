/**
 * Run-once effect on top of at-least-once delivery: claim a message before running it.
 *
 * The claim is a conditional write of this agent's record of the message in
 * `reach_executions` (`<caller>.<message_id>.<agent_id>`), so two deliveries of one
 * message to this agent (a redelivery, a republish) cannot both run it; across agents
 * the coordinator reads every agent's record before dispatching again. A claim is a
 * lease: when its holder dies, the message runs again once the lease has passed; a
 * lease held by an earlier process of the same agent (a lower epoch) is taken over at once,
 * and so is one of this very process that no delivery of the message in hand holds (a claim
 * whose write landed though its answer was lost, in a server restart).
 */

import { decodeJson, encode, nowMs } from "./codec.js";
import { isValueTooLarge, isWrongLastSequence } from "./connection.js";
import { unrecordable } from "./failures.js";
import type { Keys } from "./keys.js";
import type { Logger } from "./log.js";
import { sleep } from "./timing.js";
import { Claimed } from "./claimresults.js";
import type { Busy, Claim } from "./claimresults.js";
import type { ErrorInfo, Execution, PayloadRef, Task } from "./types.js";

export { Claimed } from "./claimresults.js";
export type { AlreadyDone, AlreadyFailed, Busy, Claim, Expired, Moved } from "./claimresults.js";

const RECORD_TRIES = 6; // about 8 s of broker trouble before the delivery is handed back
const RECORD_BACKOFF_MS = 250;
const KEPT = 10_000; // outcomes waiting to be recorded, at most
export const BUSY_POLL_MS = 500; // how often a delivery that waits for another one claims again

/** The delivery this one waited for ran the message here, and its outcome is not recorded yet. */
export interface Kept {
  kind: "kept";
  outcome: Outcome;
}

/** What one run of a handler ended with: its result, or an error. */
export interface Outcome {
  claim: Claimed;
  result?: unknown;
  /** The result, claim-checked when it was large (then `result` is null). */
  resultRef?: PayloadRef | null;
  error?: ErrorInfo;
  durationMs: number;
  /** The handler, still running past its deadline: its place is kept until it ends. */
  running?: Promise<unknown>;
}

/** One delivery of a message in this process, from its claim to its recorded outcome. */
export class Hand {
  /** It won the claim (and runs the message, or records its outcome). */
  holds = false;

  constructor(readonly messageId: string) {}
}

/** This agent's claims and outcomes of messages, in a bucket shared by every agent. */
export class Claims {
  // Outcomes not yet recorded (the broker failing): a redelivery answers from these
  // instead of running the handler a second time.
  private readonly unrecordedOutcomes = new Map<string, Outcome>();
  // The deliveries of each message that hold its claim here now. A `running` record of this
  // process none holds is a claim whose write landed though its answer was lost (its delivery
  // gave up; its redelivery would wait out the lease). One a delivery holds is never taken
  // over, even past its lease (renewals failed while the server was away; the run goes on).
  private readonly holders = new Map<string, number>();

  constructor(
    private readonly kv: Keys,
    private readonly agentId: string,
    /** This process's epoch: its registration number for the agent id. */
    readonly epoch: number,
    private readonly log: Logger,
  ) {}

  /**
   * Run `work` with a delivery of `messageId` in hand, from its claim to its recorded outcome:
   * the claim it wins (passing `hand` to `claim`) no other delivery of this process takes over.
   */
  async holding<T>(messageId: string, work: (hand: Hand) => Promise<T>): Promise<T> {
    const hand = new Hand(messageId);
    try {
      return await work(hand);
    } finally {
      if (hand.holds) {
        const left = (this.holders.get(messageId) ?? 1) - 1;
        if (left > 0) this.holders.set(messageId, left);
        else this.holders.delete(messageId);
      }
    }
  }

  /**
   * `claim`, waiting while another delivery holds the message (said once per wait), and
   * calling `stillWorking` meanwhile. The wait is not a redelivery: a duplicate that came
   * back through nak would count towards max_deliver and could dead-letter a message that
   * completes.
   */
  async claimWhenFree(task: Task, leaseMs: number, seal: string | null, stillWorking: () => void, hand?: Hand): Promise<Exclude<Claim, Busy> | Kept> {
    for (let waited = false; ; waited = true) {
      const claim = await this.claim(task, leaseMs, seal, hand);
      if (claim.kind !== "busy") return claim;
      // Its outcome is the answer: the lease would lapse meanwhile, and it must not run twice.
      const kept = this.unrecordedOutcomes.get(task.message_id);
      if (kept !== undefined) return { kind: "kept", outcome: kept };
      if (!waited) this.log.info("another delivery holds this message", { message_id: task.message_id, retry_in_ms: claim.retryInMs });
      stillWorking();
      await sleep(Math.min(claim.retryInMs, BUSY_POLL_MS));
    }
  }

  /**
   * Take the right to run `task`, unless it ran already or runs elsewhere. `seal`: the
   * dispatch's `Reach-Seal`, kept in the record (a secured coordinator believes no other).
   */
  async claim(task: Task, leaseMs: number, seal: string | null = null, hand?: Hand): Promise<Claim> {
    const now = nowMs();
    const leaseUntil = now + leaseMs;
    const record = this.recordOf(task, "running", { lease_until_ms: leaseUntil, seal, started_ms: now });
    let claim: Claim;
    try {
      claim = new Claimed(await this.kv.create(this.key(task), encode(record)), leaseUntil, seal, now);
    } catch (err) {
      if (!isWrongLastSequence(err)) throw err;
      claim = await this.contend(task, record);
    }
    if (claim instanceof Claimed && hand !== undefined) {
      hand.holds = true;
      this.holders.set(task.message_id, (this.holders.get(task.message_id) ?? 0) + 1);
    }
    return claim;
  }

  /**
   * Extend the claim's lease to `leaseMs` from now (a handler that reports progress works
   * on). False when the claim was taken away meanwhile (fenced); a broker failure is
   * logged and the old lease stands.
   */
  renew(task: Task, claim: Claimed, leaseMs: number): Promise<boolean> {
    return claim.serially(async () => {
      const until = nowMs() + leaseMs;
      if (until <= claim.leaseUntilMs) return true;
      const record = this.recordOf(task, "running", { lease_until_ms: until, seal: claim.seal, started_ms: claim.startedMs });
      try {
        if (!(await this.writeOnClaim(task, claim, record))) return false;
        claim.leaseUntilMs = until;
        return true;
      } catch (err) {
        this.log.warn("lease not extended", { message_id: task.message_id, error: String(err) });
        return true;
      }
    });
  }

  /** This agent's record of `task` when it says the message ran to its result. */
  async done(task: Task): Promise<Execution | null> {
    const record = await this.read(this.key(task));
    return record?.state === "done" ? record : null;
  }

  /** Whether a delivery of `messageId` holds its claim in this process now (it runs here). */
  runsHere(messageId: string): boolean {
    return this.holders.has(messageId);
  }

  /** The outcome of a run of `messageId` that is still waiting to be recorded. */
  unrecorded(messageId: string): Outcome | undefined {
    return this.unrecordedOutcomes.get(messageId);
  }

  /**
   * Write the outcome into the claim's record (`done` with the result, or `failed`),
   * trying again while the broker fails; the outcome is kept meanwhile, so a redelivery
   * answers from it. After the last try the error is thrown. False when the claim was
   * taken away (the task was reassigned): a result must not be used. A result the record
   * cannot hold (10054) is replaced in `outcome` by a `result_too_large` error, recorded
   * instead: every run would end so.
   */
  async record(task: Task, outcome: Outcome, stillWorking: () => void): Promise<boolean> {
    this.unrecordedOutcomes.set(task.message_id, outcome);
    while (this.unrecordedOutcomes.size > KEPT) {
      this.unrecordedOutcomes.delete(this.unrecordedOutcomes.keys().next().value as string);
    }
    for (let attempt = 0; ; attempt++) {
      try {
        const written = await outcome.claim.serially(() => this.write(task, outcome));
        this.unrecordedOutcomes.delete(task.message_id);
        return written;
      } catch (err) {
        if (isValueTooLarge(err) && outcome.error === undefined) {
          Object.assign(outcome, { result: undefined, resultRef: null, error: unrecordable(outcome.result, err) });
          continue;
        }
        if (isWrongLastSequence(err) || attempt === RECORD_TRIES - 1) throw err;
        if (attempt === 0) this.log.warn("outcome not recorded yet; kept and retried", { message_id: task.message_id, error: String(err) });
        await sleep(RECORD_BACKOFF_MS * 2 ** attempt);
        stillWorking();
      }
    }
  }

  private async write(task: Task, outcome: Outcome): Promise<boolean> {
    const { seal, startedMs: started_ms } = outcome.claim;
    const record =
      outcome.error === undefined
        ? this.recordOf(task, "done", { result: outcome.result ?? null, result_ref: outcome.resultRef ?? null, seal, started_ms })
        : this.recordOf(task, "failed", { error: outcome.error, seal, started_ms });
    if (await this.writeOnClaim(task, outcome.claim, record)) return true;
    // Our lease lapsed or the task was reassigned, and that outcome stands; or an earlier
    // try of ours was written though its answer got lost.
    const held = await this.read(this.key(task), outcome.claim.revision);
    return held !== null && sameWrite(held, record);
  }

  /**
   * Write `record` at the claim's revision (a renewal, or the finish), the claim taking the
   * new one; false when refused because the claim was taken away. A refusal that met this
   * run's own claim written again since is no fence (protocol §13): a write of this run that
   * timed out while the server was away and landed after the reconnect, from the client's
   * reconnect buffer. The claim takes that revision and `record` is written again.
   */
  private async writeOnClaim(task: Task, claim: Claimed, record: Execution): Promise<boolean> {
    for (;;) {
      try {
        claim.revision = await this.kv.update(this.key(task), encode(record), claim.revision);
        return true;
      } catch (err) {
        if (!isWrongLastSequence(err)) throw err;
      }
      const entry = await this.kv.last(this.key(task), claim.revision); // past it: not a replica behind
      if (entry === null || entry.operation !== "PUT" || entry.revision <= claim.revision) return false;
      // Unreadable or the server's (an answer a caller aimed at the key): nobody's, the claim stands.
      const held = entry.nobodys ? null : parse(entry.value);
      if (held !== null && !sameWrite(held, this.recordOf(task, "running", {}))) return false;
      claim.revision = entry.revision; // strictly later each time: the loop ends
    }
  }

  private async contend(task: Task, record: Execution): Promise<Claim> {
    const entry = await this.kv.last(this.key(task));
    if (entry === null || entry.operation !== "PUT") {
      return { kind: "busy", retryInMs: 100 }; // vanished between create and get: try again
    }
    const current = entry.nobodys ? null : parse(entry.value); // unreadable, or the server's: no block
    if (current?.state === "done") return { kind: "done", record: current };
    if (current !== null && isExpiryFence(current, task.attempt)) return { kind: "expired", record: current };
    if (current !== null && isReassignmentFence(current, task.attempt)) return { kind: "moved", record: current };
    // This attempt ran here and failed (its report's ack was lost): not run again; a later one's: moved on.
    // A failure of another life of the message (sent again past the duplicate window) blocks nothing.
    if (current?.state === "failed" && (current.received_ms ?? 0) === (task.received_ms ?? 0) && current.attempt >= task.attempt) {
      return { kind: current.attempt === task.attempt ? "failed" : "moved", record: current };
    }
    if (current?.state === "running") {
      const leftMs = current.lease_until_ms - nowMs();
      if (current.agent_id === this.agentId && current.epoch === this.epoch) {
        if (!this.lostWrite(task.message_id)) return { kind: "busy", retryInMs: Math.max(leftMs, 100) };
        this.log.info("taking over this process's own claim: its write's answer was lost", { message_id: task.message_id });
      } else if (!this.outlived(current) && leftMs > 0) {
        return { kind: "busy", retryInMs: leftMs };
      }
    }
    const mine = resumed(current, record);
    try {
      const revision = await this.kv.update(this.key(task), encode(mine), entry.revision);
      return new Claimed(revision, mine.lease_until_ms, mine.seal ?? null, mine.started_ms, mine !== record);
    } catch (err) {
      if (isWrongLastSequence(err)) return { kind: "busy", retryInMs: 100 }; // lost the race
      throw err;
    }
  }

  /**
   * This agent's record of the task: `<caller>.<message_id>.<agent_id>` (`_` for a task sent
   * without a caller). Each agent writes only its own records; across agents the
   * coordinator reads them all before dispatching a message again.
   */
  private key(task: Task): string {
    return `${task.caller ?? "_"}.${task.message_id}.${this.agentId}`;
  }

  private async read(key: string, after = 0): Promise<Execution | null> {
    const entry = await this.kv.last(key, after);
    return entry === null || entry.operation !== "PUT" || entry.nobodys ? null : parse(entry.value);
  }

  /** The holder was an earlier process of this agent: it is gone, its lease with it. */
  private outlived(record: Execution): boolean {
    return record.agent_id === this.agentId && record.epoch < this.epoch;
  }

  /**
   * Whether a claim of this very process is one no delivery holds (its write landed though its
   * answer was lost), nor an outcome waiting to be recorded: taken over at once. One a delivery
   * holds is never, however long ago its lease ran out.
   */
  private lostWrite(messageId: string): boolean {
    return !this.holders.has(messageId) && !this.unrecordedOutcomes.has(messageId);
  }

  private recordOf(task: Task, state: Execution["state"], fields: Partial<Execution>): Execution {
    return {
      v: 1,
      message_id: task.message_id,
      state,
      agent_id: this.agentId,
      epoch: this.epoch,
      attempt: task.attempt,
      lease_until_ms: 0,
      started_ms: 0,
      result: null,
      result_ref: null,
      error: null,
      finished_at_ms: state === "running" ? 0 : nowMs(),
      caller: task.caller ?? null,
      seal: null,
      received_ms: task.received_ms ?? 0, // the life of the message (sent again past the window: another)
      ...fields,
    };
  }
}

/** The record, or null when the value is none (not JSON, or JSON that is no record: a server's answer). */
function parse(value: Uint8Array): Execution | null {
  try {
    const record = decodeJson(value) as Partial<Execution> | null;
    return typeof record?.state === "string" && typeof record.message_id === "string" ? (record as Execution) : null;
  } catch {
    return null;
  }
}

/**
 * Whether `record` says `attempt` was taken from its agent (judged gone, its queue moved to
 * another agent as a later attempt): no process of that agent may run it, not even one that
 * comes back and fetches it from its queue before it is deleted. A later attempt's fence too.
 */
export function isReassignmentFence(record: Execution, attempt: number): boolean {
  return record.state === "failed" && record.attempt >= attempt && record.error?.type === "reassigned";
}

/**
 * Whether `record` ends `attempt` as expired: the expiry fence that whoever ended the task (its
 * agent's report, or the coordinator's pass over the queues) wrote. No delivery of that
 * attempt is claimed over it (protocol §10.4).
 */
export function isExpiryFence(record: Execution, attempt: number): boolean {
  return record.state === "failed" && record.attempt === attempt && record.error?.type === "expired";
}

/** Whether `held` is a write of the same run as `written`, in the same state. */
function sameWrite(held: Execution, written: Execution): boolean {
  return held.agent_id === written.agent_id && held.epoch === written.epoch && held.attempt === written.attempt && held.state === written.state;
}

/** `mine`, taking over `held`: a crashed run of the same attempt keeps its start. */
function resumed(held: Execution | null, mine: Execution): Execution {
  if (held?.state !== "running" || held.attempt !== mine.attempt || !held.started_ms) return mine;
  return { ...mine, started_ms: Math.min(held.started_ms, mine.started_ms ?? held.started_ms) };
}
