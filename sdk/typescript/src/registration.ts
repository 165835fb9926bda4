/** Registering: a rate-limited slot from a coordinator, then a card with the next epoch. */

import { hostname } from "node:os";
import { ErrorCode } from "nats";
import type { NatsError } from "nats";

import { decodeJson, encode, nowMs } from "./codec.js";
import { isWrongLastSequence } from "./connection.js";
import { coordinatorRuns } from "./coordinatorstatus.js";
import type { Connection } from "./connection.js";
import { AgentIdInUse, ReachError } from "./errors.js";
import type { Logger } from "./log.js";
import { sleep } from "./timing.js";
import type { AgentCard, RegisterReply } from "./types.js";

const SLOT_TIMEOUT_MS = 2_000;
const MAX_RETRY_MS = 10_000;

/**
 * Ask the coordinators for a registration slot until one is given. Returns the
 * heartbeat interval (seconds) a coordinator asks for, if any. With no
 * coordinator listening at all (nobody listens on `reach.ctl.status`), the agent registers on
 * its own (and says so). Nobody at the registrations' desk while a coordinator answers
 * `reach.ctl.status`, or while that goes unanswered, is a flooded desk, which does not listen
 * for a few seconds: asked again later, as a deferral is.
 */
export async function awaitSlot(
  conn: Connection,
  agentId: string,
  log: Logger,
  signal: AbortSignal,
): Promise<number | null> {
  const request = encode({ agent_id: agentId });
  for (let tries = 1; ; tries++) {
    let answer: RegisterReply | null = null;
    try {
      const msg = await conn.nc.request(conn.names.register(agentId), request, { timeout: SLOT_TIMEOUT_MS });
      answer = decodeJson(msg.data) as RegisterReply;
    } catch (err) {
      const code = (err as NatsError).code;
      if (code === ErrorCode.NoResponders) {
        const runs = await coordinatorRuns(conn, SLOT_TIMEOUT_MS, 0);
        if (runs === false) {
          log.warn("no coordinator answered the registration; registering directly");
          return null;
        }
        // A status desk slow to answer (a flood queued before it, a loaded host) is no proof
        // that nobody runs: asked again later.
        log.warn(
          runs
            ? "a coordinator runs but its registrations' desk does not listen now"
            : "the registrations' desk does not listen and reach.ctl.status did not answer in time; asking again",
        );
      } else if (code !== ErrorCode.Timeout) throw err;
    }
    if (answer?.ok) return answer.heartbeat_interval_s ?? null;
    if (answer?.error) throw new ReachError(`the coordinator refused the registration: ${answer.error}`);
    const baseMs = answer ? answer.retry_after_ms : Math.min(MAX_RETRY_MS, 500 * 2 ** tries);
    const delayMs = baseMs * (1 + Math.random() * 0.5); // a refused crowd must not return at once
    log.info("registration deferred, retrying", { retry_in_ms: Math.round(delayMs), tries });
    await sleep(delayMs, signal);
    if (signal.aborted) throw new ReachError("stopped while waiting for a registration slot");
  }
}

/**
 * Write `card` with the next epoch. The write is conditional on the revision
 * read, so two processes registering one id at once cannot both succeed.
 * Returns the card written and its revision.
 */
export async function writeCard(conn: Connection, card: AgentCard, log: Logger): Promise<[AgentCard, number]> {
  const kv = await conn.kv(conn.names.agentsBucket);
  const entry = await kv.last(card.agent_id);
  // A delete marker's revision is past every epoch the id had (each written at a revision of
  // its own): from 1, a restarted process waited out a crashed one's claims of a higher epoch.
  let epoch = entry?.revision ?? 1;
  let revision: number | null = null;
  if (entry !== null && entry.operation === "PUT") {
    revision = entry.revision;
    // A card none can read: its revision is past every epoch written before it (each had a
    // revision of its own), so an older process stays fenced off (it took over from 1).
    epoch = revision;
    if (entry.nobodys) log.warn("replacing a card nobody wrote (someone's request aimed at it)");
    else try {
      const previous = (decodeJson(entry.value) as AgentCard).epoch + 1;
      if (Number.isInteger(previous)) epoch = previous;
    } catch {
      log.warn("replacing an unreadable agent card");
    }
  }
  const written: AgentCard = { ...card, epoch, host: hostname(), pid: process.pid, started_at: nowMs() };
  try {
    const rev = revision === null ? await kv.create(card.agent_id, encode(written)) : await kv.update(card.agent_id, encode(written), revision);
    return [written, rev];
  } catch (err) {
    if (isWrongLastSequence(err)) {
      throw new AgentIdInUse(`agent_id '${card.agent_id}' was registered by another process at the same moment`);
    }
    throw err;
  }
}

/**
 * Write `card` again when the registry has no readable card of the agent (a server that came
 * back on an empty store, a card deleted or overwritten by hand): routing knows an agent by its
 * card. The revision written, or null when one was there, or was written meanwhile (a new
 * process of the agent: it stands). Throws while the registry is not there.
 */
export async function restoreCard(conn: Connection, card: AgentCard, log: Logger): Promise<number | null> {
  const kv = await conn.kv(conn.names.agentsBucket);
  const entry = await kv.last(card.agent_id);
  const there = entry !== null && entry.operation === "PUT";
  if (there && readable(entry.value, card.agent_id) && !entry.nobodys) return null;
  try {
    const revision = there ? await kv.update(card.agent_id, encode(card), entry.revision) : await kv.create(card.agent_id, encode(card));
    log.warn("the registry had no readable card of this agent (lost, deleted or overwritten); written again");
    return revision;
  } catch (err) {
    if (isWrongLastSequence(err)) return null;
    throw err;
  }
}

function readable(value: Uint8Array, agentId: string): boolean {
  try {
    const card = decodeJson(value) as Partial<AgentCard> | null;
    return card?.agent_id === agentId && Number.isInteger(card.epoch);
  } catch {
    return false;
  }
}
