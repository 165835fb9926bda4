"""``reach agents forget ID``: retire an agent that is gone for good.

A killed agent's card, its last heartbeat (with the load it had) and the coordinator's
OFFLINE verdict stay in KV: they are what an operator needs to see that it died and why.
Nothing removes them by itself, on purpose: the coordinator cannot tell an agent retired
for good from one that crashed and must be started again, and deleting the records of the
second after some hours would hide it. An operator who knows says so with this command.

Forgetting takes everything the system keeps of the agent: its card, heartbeat and
liveness verdict, its circuit breakers and isolation (``reach_breakers``) and its durable
consumers on the dispatch streams. The card goes first: the running coordinators watch
it, drop what they hold of the agent, and send any task still queued for it back through
intake, to another agent or to a dead letter with its reason (a coordinator started later
does the same). The queued tasks stay in their stream until then: deleting a consumer of
a work-queue stream drops none of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentreach.broker import Broker, WrongLastSequence, consumer_state
from agentreach.broker.consume import delete_consumer
from agentreach.broker.presence import present
from agentreach.broker.streams import subject_counts
from agentreach.cli.options import UsageError
from agentreach.envelopes import PRIORITIES, AgentCard, BreakerRecord, Heartbeat, Liveness

PRESENCE_S = 3.0  # the coordinator's own probe timeout for a connection


@dataclass(frozen=True, slots=True)
class Leftovers:
    """What the system still keeps of an agent besides its registry records."""

    breakers: tuple[str, ...]  # keys in reach_breakers: the agent's, and agent.intent
    consumers: tuple[tuple[str, str], ...]  # (stream, durable) of its dispatch consumers

    def __bool__(self) -> bool:
        return bool(self.breakers or self.consumers)


async def forget(broker: Broker, agent_id: str) -> str:
    """Forget an OFFLINE or stopped agent whose connection is gone: its records, breakers
    and dispatch consumers are deleted; refuse (UsageError) anything that may still run.
    Returns what was forgotten, for the operator."""
    names = broker.names
    cards = await broker.bucket(names.agents_bucket, AgentCard)
    beats = await broker.bucket(names.heartbeats_bucket, Heartbeat)
    verdicts = await broker.bucket(names.liveness_bucket, Liveness)
    card, beat = await cards.get(agent_id), await beats.get(agent_id)
    judged = await verdicts.get(agent_id)
    if card is None and beat is None and judged is None:
        if not (left := await leftovers(broker, agent_id)):
            raise UsageError(f"{agent_id}: unknown agent")
        # A forget cut short after the card went: what it had not deleted yet, deleted now.
        return f"{agent_id}: forgotten before; {await _delete(broker, agent_id, left)}"
    stopped = card is not None and card.value.status == "stopped"  # not draining: still live
    state = "STOPPED" if stopped else judged.value.state if judged else "UNKNOWN"
    newer = card is not None and judged is not None and card.value.epoch > judged.value.epoch
    if state not in ("STOPPED", "OFFLINE") or (newer and not stopped):
        raise UsageError(
            f"{agent_id} is {'a new process, not judged yet' if newer else state}: only an"
            " OFFLINE or STOPPED agent can be forgotten (stop it first, or wait until the"
            " coordinator judges it OFFLINE)"
        )
    if await present(broker, agent_id, timeout_s=PRESENCE_S) is not False:
        raise UsageError(
            f"{agent_id} is {state}, but a connection of it is on the server still: stop its"
            " process first"
        )
    if card is not None:
        try:  # only the card read above: a process that registered since keeps its own
            await cards.delete(agent_id, last=card.revision)
        except WrongLastSequence:
            raise UsageError(f"{agent_id} registered again just now; not forgotten") from None
    await beats.delete(agent_id)
    await verdicts.delete(agent_id)
    # Read after the card went: no coordinator writes a breaker of an unregistered agent.
    deleted = await _delete(broker, agent_id, await leftovers(broker, agent_id))
    return f"{agent_id}: forgotten (was {state}): its card, heartbeat and liveness, {deleted}"


async def leftovers(broker: Broker, agent_id: str) -> Leftovers:
    """The agent's breaker records and dispatch consumers, as they are now."""
    names = broker.names
    bucket = await broker.bucket(names.breakers_bucket, BreakerRecord)
    found = await bucket.matching(f"{agent_id}.*") | await bucket.current([agent_id])
    consumers = []
    for priority, stream in names.dispatch_streams.items():
        durable = names.agent_consumer(agent_id, priority)
        if await consumer_state(broker, stream, durable) is not None:
            consumers.append((stream, durable))
    return Leftovers(tuple(sorted(found)), tuple(consumers))


async def queued(broker: Broker, agent_id: str) -> int:
    """Tasks still in the agent's dispatch queues (the coordinator moves them)."""
    names, total = broker.names, 0
    for priority in PRIORITIES:
        subject = names.dispatch(agent_id, priority)
        counts = await subject_counts(broker, names.dispatch_stream(priority), subject)
        total += sum(counts.values())
    return total


async def _delete(broker: Broker, agent_id: str, left: Leftovers) -> str:
    """Delete ``left``; say what went, and what happens to the tasks still queued."""
    bucket = await broker.bucket(broker.names.breakers_bucket, BreakerRecord)
    for key in left.breakers:
        await bucket.delete(key)
    for stream, durable in left.consumers:
        await delete_consumer(broker, stream, durable)
    said = (
        f"{len(left.breakers)} breaker record(s) and {len(left.consumers)} dispatch"
        " consumer(s) are deleted"
    )
    if waiting := await queued(broker, agent_id):
        said += (
            f"; {waiting} task(s) queued for it go back through intake at the coordinator's"
            " next liveness sweep (to another agent, or to a dead letter that says why)"
        )
    return said
